"""llama.cpp (llama-cpp-python 0.3.36): a gemma3 file whose window pattern marks no layer windowed kills the process.

A GGUF of arch gemma3 with attention.sliding_window > 0 and attention.sliding_window_pattern all false (every
layer global) loads (llama_model_load_from_file succeeds), but llama_init_from_model then fails
GGML_ASSERT(hparams.is_swa_any()) in llama-model.cpp and aborts the process, where a file llama.cpp cannot run
should make the load or the context creation return NULL. (With attention.sliding_window 0 the same model runs
as a plain, unwindowed cache.)

    python docs/llama-cpp/repro_swa_pattern_all_global_aborts.py      # exit 1: the bug; 0: fixed
Needs llama-cpp-python==0.3.36, gguf==0.19.0 and numpy only (a random-weight model is written, nothing downloaded).
"""

import subprocess
import sys
import tempfile

CHILD = r'''
import ctypes, sys
import llama_cpp as L
L.llama_backend_init()
quiet = L.llama_log_callback(lambda *a: None)
L.llama_log_set(quiet, ctypes.c_void_p(0))
model = L.llama_model_load_from_file(sys.argv[1].encode(), L.llama_model_default_params())
print("model loaded:", bool(model), flush=True)
p = L.llama_context_default_params()
p.n_ctx, p.n_threads, p.n_threads_batch = 64, 1, 1
ctx = L.llama_init_from_model(model, p) if model else None
print("context:", "NULL" if not ctx else "made", flush=True)
'''


def write_model(path: str) -> None:
    import gguf
    import numpy as np

    V, D, H, DH, F, LAYERS = 32, 32, 2, 16, 48, 6
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "gemma3")
    for add, value in [(w.add_context_length, 128), (w.add_embedding_length, D), (w.add_block_count, LAYERS),
                       (w.add_feed_forward_length, F), (w.add_head_count, H), (w.add_head_count_kv, 1),
                       (w.add_key_length, DH), (w.add_value_length, DH), (w.add_rope_freq_base, 1e6),
                       (w.add_layer_norm_rms_eps, 1e-6), (w.add_sliding_window, 4)]:
        add(value)
    w.add_array("gemma3.attention.sliding_window_pattern", [False] * LAYERS)  # no layer windowed
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [1] * (V - 3))
    w.add_tensor("token_embd.weight", rng.standard_normal((V, D)).astype(np.float32))
    for i in range(LAYERS):
        for name, shape in [("attn_q", (H * DH, D)), ("attn_k", (DH, D)), ("attn_v", (DH, D)),
                            ("attn_output", (D, H * DH)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)),
                            ("ffn_down", (D, F))]:
            w.add_tensor(f"blk.{i}.{name}.weight", (rng.standard_normal(shape) / 8).astype(np.float32))
        for name, width in [("attn_norm", D), ("attn_q_norm", DH), ("attn_k_norm", DH),
                            ("post_attention_norm", D), ("ffn_norm", D), ("post_ffw_norm", D)]:
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(width, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(D, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


path = tempfile.mkdtemp() + "/all-global.gguf"
write_model(path)
child = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True)  # ggml prints a backtrace
print("\n".join(line for line in child.stdout.splitlines() if line.startswith(("model", "context"))))
assertion = [line for line in child.stderr.splitlines() if "GGML_ASSERT" in line]
print(f"child exit status {child.returncode}" + (f": {assertion[0].split('/')[-1]}" if assertion else ""))
sys.exit(1 if child.returncode < 0 else 0)
