"""llama.cpp (llama-cpp-python 0.3.36): a batch the context has room for aborts the process.

A context asked for a few cells (n_ctx 6, two sequences, kv_unified false) with n_batch 512 is given more cells
than asked (llama_n_ctx_seq reports 256 per sequence), but its n_batch is cut to the cells asked for
(llama_n_batch reports it). A batch of 8 tokens of one sequence -- within the cells the context reports, within
the n_batch it was created with -- then fails GGML_ASSERT(n_tokens_all <= cparams.n_batch) in llama_decode and
kills the process, where llama_decode returns an error for every other batch it cannot take.

    python docs/llama-cpp/repro_batch_past_n_batch_aborts.py      # exit 1: the bug (the child died); 0: fixed
Needs llama-cpp-python==0.3.36, gguf==0.19.0 and numpy only (a random-weight model is written, nothing downloaded).
"""

import ctypes
import subprocess
import sys
import tempfile

import gguf
import llama_cpp as L
import numpy as np

if len(sys.argv) == 1:  # the parent: runs the decode in a child, which the assertion kills
    child = subprocess.run([sys.executable, __file__, "child"], capture_output=True, text=True)
    print(child.stdout.splitlines()[0] if child.stdout else '')  # (the rest: ggml's backtrace)
    died = child.returncode < 0
    print(f"llama_decode of 8 tokens: {'the process died, signal ' + str(-child.returncode) if died else 'returned'}"
          + (f" ({[line for line in child.stderr.splitlines() if 'GGML_ASSERT' in line][:1]})" if died else ""))
    sys.exit(1 if died else 0)


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



p = L.llama_context_default_params()
p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.n_threads, p.n_threads_batch = 6, 512, 512, 2, 1, 1
p.kv_unified = False
p.type_k = p.type_v = L.GGML_TYPE_F32
p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
ctx = L.llama_init_from_model(model, p)
print(f"cells per sequence (llama_n_ctx_seq): {L.llama_n_ctx_seq(ctx)}; "
      f"n_batch (llama_n_batch): {L.llama_n_batch(ctx)}", flush=True)
b = L.llama_batch_init(8, 0, 1)
b.n_tokens = 8
for i in range(8):
    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = 3 + i, i, 1, 0
    b.seq_id[i][0] = 0
b.logits[7] = 1
print(f"llama_decode returned {L.llama_decode(ctx, b)}", flush=True)
