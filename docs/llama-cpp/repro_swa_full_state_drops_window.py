"""llama.cpp (llama-cpp-python 0.3.36): with swa_full, a saved and loaded sequence loses its windowed layers' history.

swa_full (llama_context_params) makes the windowed layers' store as large as the global one, so that nothing is
evicted: a removal at the end of a sequence can then be followed by tokens that see the kept cells through the
window, as in the context the sequence was made in. But llama_state_seq_get_data writes, for the windowed
layers, only the cells the next token can see (the last W positions), whatever swa_full: loaded into another
swa_full context, a 10-token sequence (W 4) has seq_pos_min 6. Remove its end from position 5 in both contexts
and decode position 5: the source computes with positions 2..4 in its windowed layers, the loaded copy with none
of them, and the logits differ by far more than rounding. seq_pos_min does report the loss (6), so a caller that
checks it can recompute; the state's loss is documented nowhere in llama.h.

    python docs/llama-cpp/repro_swa_full_state_drops_window.py      # exit 1: the behaviour; 0: a state keeps them
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
    p.swa_full = True  # the windowed layers' store as large as the global one: nothing evicted
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
loaded = context()
assert L.llama_state_seq_set_data(loaded, data, size, 0) == size
for name, ctx in (("source", source), ("loaded", loaded)):
    mem = L.llama_get_memory(ctx)
    print(f"{name}: seq_pos_min {L.llama_memory_seq_pos_min(mem, 0)}, seq_pos_max {L.llama_memory_seq_pos_max(mem, 0)}")
    assert L.llama_memory_seq_rm(mem, 0, 5, -1)
expected, got = decode(source, TOKENS[5:6], 5), decode(loaded, TOKENS[5:6], 5)
difference = np.abs(got - expected).max()
print(f"after removing positions 5.. in both, position 5's logits: max |loaded - source| = {difference:.3e}")
sys.exit(1 if difference > 1e-3 else 0)
