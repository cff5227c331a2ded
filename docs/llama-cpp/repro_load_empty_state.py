"""llama.cpp (llama-cpp-python 0.3.36): loading a saved empty sequence leaves the destination's cells.

llama.h: llama_state_seq_set_data "Copy the sequence data (originally copied with `llama_state_seq_get_data`)
into the specified sequence". A sequence saved while it held nothing, loaded into a sequence that now holds
cells, returns success and leaves those cells: the destination does not hold what was saved. A state of one or
more cells replaces the destination's cells (its own are removed first); only the empty state does not.

    python docs/llama-cpp/repro_load_empty_state.py      # exit 1: the bug; 0: fixed
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


def decode(ctx, tokens):
    b = L.llama_batch_init(len(tokens), 0, 1)
    b.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)


ctx = context()
memory = L.llama_get_memory(ctx)
size = L.llama_state_seq_get_size(ctx, 0)
saved = (ctypes.c_uint8 * size)()
written = L.llama_state_seq_get_data(ctx, saved, size, 0)  # sequence 0 holds nothing yet
decode(ctx, [3, 4, 5])
loaded = L.llama_state_seq_set_data(ctx, saved, written, 0)
held = (L.llama_memory_seq_pos_min(memory, 0), L.llama_memory_seq_pos_max(memory, 0))
print(f"saved {written} bytes of an empty sequence; set_data returned {loaded}; sequence 0 now holds positions "
      f"{held[0]}..{held[1]} (-1..-1: none)")
if loaded and held != (-1, -1):
    print("BUG: the load succeeded but the sequence keeps the cells it had, not the (empty) saved ones")
    sys.exit(1)
print("ok: the sequence holds what was saved (or the load failed)")
