"""llama.cpp (llama-cpp-python 0.3.36): llama_memory_seq_div re-rotates the cached keys the wrong way.

llama.h: "Integer division of the positions by factor of `d > 1`". llama_kv_cells::pos_div records the pending
K shift as ``p_old - p_new`` (pos_add records ``p_new - p_old``), so on the next decode each key is rotated to
``2*p_old - p_new`` instead of ``p_new``. The reference here is llama.cpp itself: the same new positions reached
with llama_memory_seq_add one position at a time (seq_add is right: its logits match a float64 forward to 1e-6).

    python docs/llama-cpp/repro_seq_div_sign.py      # exit 1: the bug; 0: fixed
Needs llama-cpp-python==0.3.36, gguf==0.19.0 and numpy only (a random-weight model is written, nothing downloaded).
"""

import ctypes
import sys
import tempfile

import gguf
import llama_cpp as L
import numpy as np

V, D, H, DH, F, N = 32, 32, 4, 8, 48, 8
rng = np.random.default_rng(0)
path = tempfile.mkdtemp() + "/m.gguf"
w = gguf.GGUFWriter(path, "llama")
for add, value in [(w.add_context_length, 128), (w.add_embedding_length, D), (w.add_block_count, 1),
                   (w.add_feed_forward_length, F), (w.add_head_count, H), (w.add_head_count_kv, H),
                   (w.add_key_length, DH), (w.add_value_length, DH), (w.add_rope_dimension_count, DH),
                   (w.add_rope_freq_base, 10000.0), (w.add_layer_norm_rms_eps, 1e-5)]:
    add(value)
w.add_tokenizer_model("llama")
w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, V)])
w.add_token_scores([0.0] * V)
w.add_token_types([2, 3, 3] + [1] * (V - 3))


def m(*shape):
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


w.add_tensor("token_embd.weight", rng.standard_normal((V, D)).astype(np.float32))
for name, shape in [("attn_q", (H * DH, D)), ("attn_k", (H * DH, D)), ("attn_v", (H * DH, D)),
                    ("attn_output", (D, H * DH)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)), ("ffn_down", (D, F))]:
    w.add_tensor(f"blk.0.{name}.weight", m(*shape))
for name in ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"):
    w.add_tensor(f"{name}.weight", np.ones(D, dtype=np.float32))
w.add_tensor("output.weight", m(V, D))
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
    b = L.llama_batch_init(len(tokens), 0, 1)
    b.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, 1
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, len(tokens) - 1), shape=(V,)).copy()


prompt = [3 + (7 * i) % (V - 3) for i in range(N)]
divided, shifted = context(), context()
for ctx in (divided, shifted):
    decode(ctx, prompt, 0)
L.llama_memory_seq_div(L.llama_get_memory(divided), 0, -1, -1, 2)  # positions 0..7 -> 0,0,1,1,2,2,3,3
for p in range(1, N):  # the same positions, one seq_add per position (increasing p: moved cells are not revisited)
    L.llama_memory_seq_add(L.llama_get_memory(shifted), 0, p, p + 1, p // 2 - p)
for ctx in (divided, shifted):
    assert (L.llama_memory_seq_pos_min(L.llama_get_memory(ctx), 0), L.llama_memory_seq_pos_max(
        L.llama_get_memory(ctx), 0)) == (0, 3)
a, b = decode(divided, [9], 4), decode(shifted, [9], 4)
error = float(np.max(np.abs(a - b)))
print(f"max |logits(seq_div) - logits(seq_add to the same positions)| = {error:.3e}")
if error > 1e-4:
    print("BUG: seq_div rotates cached keys by p_old - p_new instead of p_new - p_old")
    sys.exit(1)
print("ok: seq_div and seq_add agree")
