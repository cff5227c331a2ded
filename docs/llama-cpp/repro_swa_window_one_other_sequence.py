"""llama.cpp (llama-cpp-python 0.3.36): with a window of 1, a decode of one sequence takes another's last cell.

With a sliding-window model (arch gemma3: a windowed and a global layer, two stores, llama_kv_cache_iswa) of
window W = 1, a cell of the windowed store is reusable once its position is masked for its own sequence's next
token (llama_kv_cache::find_slot: is_masked_swa(pos, seq_pos_max + 1)). With W = 1 that is true of every
sequence's *last* cell too. In a unified context, sequence 1 decodes positions 0..3 and its first three are
removed (the store's head goes back to cell 0); sequence 0 then decodes 4 tokens, and the slot search reuses
sequence 1's cell at position 3. Sequence 1 is now reported empty (llama_memory_seq_pos_min / seq_pos_max -1,
"the sequence is empty" in llama.h) though the global layer still holds its position 3 and its next token attends
to it: R1 of docs/llama-cpp/windows.md, reached by decoding another sequence. A caller trusting -1 loses where
sequence 1 runs on from.

    python docs/llama-cpp/repro_swa_window_one_other_sequence.py      # exit 1: the bug; 0: fixed
Needs llama-cpp-python==0.3.36, gguf==0.19.0 and numpy only (a random-weight model is written, nothing downloaded).
"""

import ctypes
import sys
import tempfile

import gguf
import llama_cpp as L
import numpy as np

V, D, H, DH, F, LAYERS, W = 32, 32, 2, 16, 48, 2, 1  # layer 0 windowed (W 1), layer 1 global
rng = np.random.default_rng(0)
path = tempfile.mkdtemp() + "/m.gguf"
w = gguf.GGUFWriter(path, "gemma3")
for add, value in [(w.add_context_length, 1024), (w.add_embedding_length, D), (w.add_block_count, LAYERS),
                   (w.add_feed_forward_length, F), (w.add_head_count, H), (w.add_head_count_kv, 1),
                   (w.add_key_length, DH), (w.add_value_length, DH), (w.add_rope_freq_base, 1e6),
                   (w.add_layer_norm_rms_eps, 1e-6), (w.add_sliding_window, W)]:
    add(value)
w.add_array("gemma3.attention.sliding_window_pattern", [True, False])
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
    p.n_ctx, p.n_batch, p.n_seq_max, p.n_threads, p.n_threads_batch = 64, 64, 2, 1, 1
    p.kv_unified = True
    p.type_k = p.type_v = L.GGML_TYPE_F32
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return L.llama_init_from_model(model, p)


def decode(ctx, seq, tokens, start):
    """``tokens`` of sequence ``seq`` at positions start.. ; the last token's logits."""
    b = L.llama_batch_init(len(tokens), 0, 1)
    b.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, int(i == len(tokens) - 1)
        b.seq_id[i][0] = seq
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(V,)).copy()


ctx = context()
mem = L.llama_get_memory(ctx)
decode(ctx, 1, [3, 7, 11, 4], 0)
assert L.llama_memory_seq_rm(mem, 1, 0, 3)  # sequence 1 keeps position 3 (its last cell)
print(f"sequence 1 before: seq_pos_min {L.llama_memory_seq_pos_min(mem, 1)}, "
      f"seq_pos_max {L.llama_memory_seq_pos_max(mem, 1)}")
decode(ctx, 0, [9, 15, 20, 5], 0)
reported = (L.llama_memory_seq_pos_min(mem, 1), L.llama_memory_seq_pos_max(mem, 1))
print(f"after 4 tokens of sequence 0: sequence 1 reports seq_pos_min {reported[0]}, seq_pos_max {reported[1]}")
held = decode(ctx, 1, [8], 4)
alone = context()  # sequence 1 as it should be: position 3 held, nothing of sequence 0
decode(alone, 1, [3, 7, 11, 4], 0)
assert L.llama_memory_seq_rm(L.llama_get_memory(alone), 1, 0, 3)
expected = decode(alone, 1, [8], 4)
empty = decode(context(), 1, [8], 4)
print(f"sequence 1's next token: max |logit - with position 3 held| = {np.abs(held - expected).max():.3e}, "
      f"max |logit - in an empty sequence| = {np.abs(held - empty).max():.3e}")
sys.exit(1 if reported == (-1, -1) and np.abs(held - empty).max() > 1e-3 else 0)
