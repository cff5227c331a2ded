"""llama.cpp (llama-cpp-python 0.3.36): a shift of a quantized (q8_0 / q4_0) cache kills the next decode.

llama.h says of llama_memory_seq_add: "Adds relative position 'delta' to all tokens that belong to the specified
sequence and have positions in [p0, p1)", and "the KV data is updated accordingly" on the next decode. With K and
V stored as q8_0 or q4_0 (flash attention on, which a quantized V needs), the decode after a shift (the K shift
re-rotates the quantized keys) dies of SIGSEGV, although llama_memory_can_shift ("Check if the memory supports
shifting") returns true; with an f32 or f16 cache the same calls succeed. (llama.cpp issues #5652 and #9383
reported shifts of quantized caches failing in 2024; here the CPU backend segfaults instead of refusing.)

    python docs/llama-cpp/repro_quantized_shift_crash.py      # exit 1: the bug (a child died of a signal); 0: fixed
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

V, D, H, DH, F = 8, 32, 1, 32, 32  # head width 32: blocks of 32, and no Walsh-Hadamard rotation (that is for 64)


def write_model() -> str:
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
                        ("attn_output", (D, H * DH)), ("ffn_gate", (F, D)), ("ffn_up", (F, D)),
                        ("ffn_down", (D, F))]:
        w.add_tensor(f"blk.0.{name}.weight", m(*shape))
    for name in ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"):
        w.add_tensor(f"{name}.weight", np.ones(D, dtype=np.float32))
    w.add_tensor("output.weight", m(V, D))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def child(path: str, cache_type: str) -> None:
    """Decode 4 tokens, shift them by 2, decode one more: the process dies here if the bug is present."""
    L.llama_backend_init()
    quiet = L.llama_log_callback(lambda *a: None)  # kept referenced: C holds it
    L.llama_log_set(quiet, ctypes.c_void_p(0))
    model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
    p = L.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max, p.n_threads, p.n_threads_batch = 16, 32, 32, 1, 1, 1
    p.type_k = p.type_v = getattr(L, f"GGML_TYPE_{cache_type.upper()}")
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = L.llama_init_from_model(model, p)

    def decode(tokens, start):
        b = L.llama_batch_init(len(tokens), 0, 1)
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, int(i == len(tokens) - 1)
            b.seq_id[i][0] = 0
        assert L.llama_decode(ctx, b) == 0
        L.llama_batch_free(b)

    decode([3, 4, 5, 6], 0)
    print(f"can_shift {bool(L.llama_memory_can_shift(L.llama_get_memory(ctx)))}", flush=True)
    L.llama_memory_seq_add(L.llama_get_memory(ctx), 0, 0, -1, 2)  # positions 0..3 -> 2..5
    decode([7], 6)
    print("decoded after the shift")


if __name__ == "__main__":
    if os.environ.get("REPRO_CHILD"):
        child(*os.environ["REPRO_CHILD"].split(","))
        sys.exit(0)
    path = write_model()
    died = []
    for cache_type in ("f32", "f16", "q8_0", "q4_0"):
        done = subprocess.run([sys.executable, __file__], env={**os.environ, "REPRO_CHILD": f"{path},{cache_type}"},
                              capture_output=True, text=True)
        ended = ("ok" if done.returncode == 0 else f"killed by signal {-done.returncode}" if done.returncode < 0
                 else f"exit {done.returncode}: {done.stderr.strip()[-300:]}")
        said = f"{done.stdout.splitlines()[0] if done.stdout else ''}: {ended}"
        print(f"{cache_type:5} cache, flash attention: shift, then decode: {said}")
        if done.returncode != 0:
            died.append(cache_type)
    if died:
        print(f"BUG: the decode after a shift kills the process with a {', '.join(died)} cache")
        sys.exit(1)
    print("ok: every cache type decodes after a shift")
