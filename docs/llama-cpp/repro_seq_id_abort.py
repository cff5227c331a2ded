"""llama.cpp (llama-cpp-python 0.3.36): a sequence operation on caller input it cannot serve kills the process.

- llama.h documents no range and no error for llama_memory_seq_keep's (or seq_add's, seq_div's) sequence id;
  given id n_seq_max, llama.cpp fails a GGML_ASSERT (seq_to_stream's bounds) and calls abort().
- llama_memory_seq_div's d must be > 1 (llama.h); given d = 0, it divides by zero: SIGFPE.
The caller's process dies, where a refusal (the functions return void; seq_rm returns bool) or an ignored call was
possible.

    python docs/llama-cpp/repro_seq_id_abort.py      # exit 1: the bug (a child died of a signal); 0: fixed
Needs llama-cpp-python==0.3.36, gguf==0.19.0 and numpy only (a random-weight model is written, nothing downloaded).
"""

import ctypes
import os
import subprocess
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


def context(unified):
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_seq_max, p.n_threads, p.n_threads_batch = 64, 64, 2, 1, 1
    p.type_k = p.type_v = L.GGML_TYPE_F32
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    p.kv_unified = unified
    return L.llama_init_from_model(model, p)


CASES = {"seq_keep(2) with n_seq_max 2": lambda memory: L.llama_memory_seq_keep(memory, 2),
         "seq_div(0, -1, -1, d=0)": lambda memory: L.llama_memory_seq_div(memory, 0, -1, -1, 0)}
if os.environ.get("REPRO_CHILD"):
    ctx = context(False)
    b = L.llama_batch_init(4, 0, 1)  # sequence 0 holds 4 cells: seq_div divides each one's position
    b.n_tokens = 4
    for i in range(4):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = 3 + i, i, 1, 1
        b.seq_id[i][0] = 0
    assert L.llama_decode(ctx, b) == 0
    CASES[os.environ["REPRO_CHILD"]](L.llama_get_memory(ctx))
    sys.exit(0)
died = 0
for case in CASES:
    child = subprocess.run([sys.executable, __file__], env={**os.environ, "REPRO_CHILD": case}, capture_output=True,
                           text=True)
    assert_line = next((line for line in child.stderr.splitlines() if "GGML_ASSERT" in line), "")
    print(f"{case}: the child exited with {child.returncode}" + (f" ({assert_line.strip()})" if assert_line else ""))
    died += child.returncode < 0
if died:
    print(f"BUG: {died} of {len(CASES)} calls killed the process")
    sys.exit(1)
print("ok: no such call kills the process")
