"""llama.cpp (llama-cpp-python 0.3.36): a sequence saved while a shift is pending loads with its keys unshifted.

llama.h: llama_memory_seq_add shifts a sequence's positions; the keys are re-rotated lazily, at the next decode
(the K-shift). llama_state_seq_get_data saves the cells' new positions but, if no decode ran since the shift, the
keys as they were rotated at the old positions. Loaded into a fresh context, where no shift is pending, the
sequence attends with keys rotated for positions it no longer holds: the next token's logits differ from those of
the context it was saved from (which applies the shift first) by far more than rounding, where a state saved
after a decode (the shift applied) loads exactly.

    python docs/llama-cpp/repro_save_with_shift_pending.py      # exit 1: the bug; 0: fixed
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
    """``tokens`` of sequence 0 at positions start.. ; the last token's logits."""
    b = L.llama_batch_init(len(tokens), 0, 1)
    b.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, int(i == len(tokens) - 1)
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)
    return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(V,)).copy()


def save(ctx):
    size = L.llama_state_seq_get_size(ctx, 0)
    data = (ctypes.c_uint8 * size)()
    assert L.llama_state_seq_get_data(ctx, data, size, 0) == size
    return data, size


def load(data, size):
    fresh = context()
    assert L.llama_state_seq_set_data(fresh, data, size, 0) == size
    return fresh


PROMPT, SHIFT, NEXT = [3, 4, 5, 6, 7], 3, 8  # positions 0..4, shifted to 3..7; the next token at 8
source = context()
decode(source, PROMPT, 0)
L.llama_memory_seq_add(L.llama_get_memory(source), 0, -1, -1, SHIFT)
pending = load(*save(source))  # saved before any decode: the shift still pending
expected = decode(source, [NEXT], len(PROMPT) + SHIFT)  # the source applies the shift, then decodes

applied = context()  # the same, with a decode between the shift and the save (the shift applied)
decode(applied, PROMPT[:-1], 0)
L.llama_memory_seq_add(L.llama_get_memory(applied), 0, -1, -1, SHIFT)
decode(applied, PROMPT[-1:], len(PROMPT) - 1 + SHIFT)
after = load(*save(applied))

got = decode(pending, [NEXT], len(PROMPT) + SHIFT)
control = decode(after, [NEXT], len(PROMPT) + SHIFT) - decode(applied, [NEXT], len(PROMPT) + SHIFT)
print(f"saved with the shift pending, loaded: max |logit - source's| = {np.abs(got - expected).max():.3e}")
print(f"saved after a decode applied it:     max |logit - source's| = {np.abs(control).max():.3e}")
sys.exit(1 if np.abs(got - expected).max() > 1e-3 else 0)
