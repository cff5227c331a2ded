"""llama.cpp (llama-cpp-python 0.3.36): a windowed model's sequence reported empty while its global layers hold it.

With a sliding-window model (arch gemma3: windowed and global layers, two stores, llama_kv_cache_iswa), the
windowed layers' store may hold fewer of a sequence's cells than the global layers' store: a saved sequence
keeps, for the windowed layers, only the cells the next token can see (the last W positions), and a full
windowed store evicts its oldest cells (swa_full off, past 256 cells). llama_memory_seq_pos_min / seq_pos_max
report the windowed store's positions only. Load a 10-token sequence (positions 0..9; W 4: the windowed store
gets 6..9) and remove its end from position 3: the global layers still hold positions 0..2, yet seq_pos_max
returns -1, which llama.h defines as "the sequence is empty". It is not: the next token attends to the 3 cells
the global layers kept (its logits differ from those of the same token in a really empty sequence), and a
caller that trusts -1 and starts again at position 0 is accepted and puts a second position 0 beside the kept one.

    python docs/llama-cpp/repro_swa_pos_max_empty.py      # exit 1: the bug; 0: fixed
Needs llama-cpp-python==0.3.36, gguf==0.19.0 and numpy only (a random-weight model is written, nothing downloaded).
"""

import ctypes
import sys
import tempfile

import gguf
import llama_cpp as L
import numpy as np

V, D, H, DH, F, LAYERS, W = 32, 32, 2, 16, 48, 6, 4  # layers 0-4 windowed (W 4), layer 5 global: gemma3's 6
rng = np.random.default_rng(0)
path = tempfile.mkdtemp() + "/m.gguf"
w = gguf.GGUFWriter(path, "gemma3")
for add, value in [(w.add_context_length, 1024), (w.add_embedding_length, D), (w.add_block_count, LAYERS),
                   (w.add_feed_forward_length, F), (w.add_head_count, H), (w.add_head_count_kv, 1),
                   (w.add_key_length, DH), (w.add_value_length, DH), (w.add_rope_freq_base, 1e6),
                   (w.add_layer_norm_rms_eps, 1e-6), (w.add_sliding_window, W)]:
    add(value)
w.add_tokenizer_model("llama")
w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, V)])
w.add_token_scores([0.0] * V)
w.add_token_types([2, 3, 3] + [1] * (V - 3))


def m(*shape):
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


w.add_tensor("token_embd.weight", (rng.standard_normal((V, D)) / np.sqrt(D)).astype(np.float32))
for i in range(LAYERS):
    for name, shape in [("attn_q", (H * DH, D)), ("attn_k", (DH, D)), ("attn_v", (DH, D)),
                        ("attn_output", (D, H * DH)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)),
                        ("ffn_down", (D, F))]:
        w.add_tensor(f"blk.{i}.{name}.weight", m(*shape))
    for name, width in [("attn_norm", D), ("attn_q_norm", DH), ("attn_k_norm", DH), ("post_attention_norm", D),
                        ("ffn_norm", D), ("post_ffw_norm", D)]:
        w.add_tensor(f"blk.{i}.{name}.weight", np.ones(width, dtype=np.float32))
w.add_tensor("output_norm.weight", np.ones(D, dtype=np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

L.llama_backend_init()
quiet = L.llama_log_callback(lambda *a: None)  # kept referenced: C holds it
L.llama_log_set(quiet, ctypes.c_void_p(0))
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())


def context():
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_seq_max, p.n_threads, p.n_threads_batch = 64, 64, 1, 1, 1
    p.type_k = p.type_v = L.GGML_TYPE_F32
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return L.llama_init_from_model(model, p)


def decode(ctx, tokens, start):
    """``tokens`` of sequence 0 at positions start.. ; the last token's logits."""
    b = L.llama_batch_init(len(tokens), 0, 1)
    b.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, int(i == len(tokens) - 1)
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(V,)).copy()


TOKENS = [3, 7, 11, 4, 9, 15, 20, 5, 8, 13, 6]
source = context()
decode(source, TOKENS[:10], 0)
size = L.llama_state_seq_get_size(source, 0)
data = (ctypes.c_uint8 * size)()
assert L.llama_state_seq_get_data(source, data, size, 0) == size
ctx = context()
assert L.llama_state_seq_set_data(ctx, data, size, 0) == size
mem = L.llama_get_memory(ctx)
print(f"loaded 10 tokens: seq_pos_min {L.llama_memory_seq_pos_min(mem, 0)}, "
      f"seq_pos_max {L.llama_memory_seq_pos_max(mem, 0)}")
assert L.llama_memory_seq_rm(mem, 0, 3, -1)  # keep positions 0..2: the global layer holds them
reported = L.llama_memory_seq_pos_max(mem, 0)
print(f"after llama_memory_seq_rm(0, 3, -1): seq_pos_min {L.llama_memory_seq_pos_min(mem, 0)}, "
      f"seq_pos_max {reported}")
held = decode(ctx, TOKENS[3:4], 3)
empty = decode(context(), TOKENS[3:4], 3)  # the same token in a sequence that is really empty
difference = np.abs(held - empty).max()
print(f"next token's logits vs the same token in an empty sequence: max |difference| = {difference:.3e}")
sys.exit(1 if reported == -1 and difference > 1e-3 else 0)
