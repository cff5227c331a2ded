"""The suite's whole-model weights as a GGUF file llama.cpp loads (arch ``llama``, or ``gemma3`` for a windowed
model), written with ``gguf==0.19.0``.

Nothing is downloaded: the file holds the ``ModelWeights`` the suite drew, in float32 (llama.cpp computes in
float32; the rounding of the weights is part of the declared float32 precision), and an SPM vocabulary of
made-up tokens (the suite feeds token ids directly, so the tokenizer only has to load).

Conventions, as llama.cpp's arch ``llama`` reads them (measured, docs/llama-cpp/NOTES.md):

- a matrix ``(out, in)`` in numpy is a GGUF tensor of ``ne = {in, out}``: written as is;
- RoPE rotates adjacent pairs (the suite's ``interleaved``) over the whole head (``rope.dimension_count`` =
  head width). A ``half_split`` model is written as the same model with the features of every query and key
  head permuted so that pair ``(i, i + dh/2)`` becomes ``(2i, 2i+1)``: the scores ``q . k`` are unchanged
  (docs/spec.md §2.3: the pairings are one rotation seen through a permutation), and so are the logits;
- the head width is ``attention.key_length`` / ``value_length``, independent of the model width;
- a tied head is written as no ``output.weight``: llama.cpp then uses ``token_embd`` for the logits.

Arch ``gemma3`` (measured, docs/llama-cpp/windows.md), for a model with Gemma 3's switches (issue 37's
``embedding_scale``, ``qk_norm``, ``post_norms``, ``activation`` "gelu_tanh"): RoPE pairs ``(i, i + dh/2)``
(NEOX: an ``interleaved`` model is written as its permuted twin, the per-head norms permuted alike); norms
multiply by their weights as written; ``attention.sliding_window`` is W, ``attention.sliding_window_pattern``
one bool per layer, ``rope.freq_base_swa`` the windowed layers' base. Its GELU is a float16 table (llama.cpp's
CPU backend), not the tanh formula in float32: a precision the model must declare.

What neither arch can express (a window in a llama model, part of Gemma 3's switches) is refused with
``UnsupportedModel``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvcache_conformance.protocol.model import ModelConfig, ModelWeights

GGUF_VERSION = "0.19.0"  # the pin of the llamacpp extra
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0, 1, 2: what llama.cpp's SPM loader expects to find


class UnsupportedModel(ValueError):
    """A model configuration llama.cpp's arch ``llama`` cannot express."""


def rotary_permutation(head_width: int) -> np.ndarray:
    """``perm`` with ``interleaved(x[perm]) == half_split(x)[perm]``: feature ``perm[2i] = i``, ``perm[2i+1] = i +
    dh/2`` (oracle/config.py's ``RopeConfig``)."""
    half = head_width // 2
    perm = np.empty(head_width, dtype=np.intp)
    perm[0::2], perm[1::2] = np.arange(half), np.arange(half) + half
    return perm


def _rows_for_interleaved(matrix: np.ndarray, heads: int, head_width: int, style: str) -> np.ndarray:
    """A query or key projection ``[heads*dh, D]`` whose output features llama.cpp rotates as adjacent pairs."""
    if style == "interleaved":
        return matrix
    perm = rotary_permutation(head_width)
    return matrix.reshape(heads, head_width, -1)[:, perm, :].reshape(heads * head_width, -1)


GEMMA3_SWITCHES = ("embedding_scale", "qk_norm", "post_norms")  # and activation "gelu_tanh"


def architecture(config: ModelConfig) -> str:
    """``llama`` for today's model (no window); ``gemma3`` for a model with Gemma 3's switches all on
    (``embedding_scale``, ``qk_norm``, ``post_norms``, ``activation`` "gelu_tanh"): llama.cpp's gemma3 builds
    every one of them unconditionally, so a model with some but not all has no arch here."""
    names = (*GEMMA3_SWITCHES, "gelu_tanh")
    gemma = [bool(getattr(config, name)) for name in GEMMA3_SWITCHES] + [config.activation == "gelu_tanh"]
    if all(gemma):
        return "gemma3"
    if any(gemma):
        raise UnsupportedModel("llama.cpp's gemma3 builds embedding_scale, qk_norm, post_norms and gelu_tanh "
                               f"together; the model has only {[n for n, on in zip(names, gemma) if on]}")
    if config.window is not None or config.local_rope_base is not None:
        raise UnsupportedModel(f"llama.cpp's arch llama has no sliding window; the model declares window "
                               f"{config.window} (a windowed model is written as gemma3, with its switches)")
    return "llama"


def layer_windowed(config: ModelConfig) -> list[bool]:
    """Whether each layer is windowed (the model's ``layer_window``)."""
    return [config.layer_window(i) is not None for i in range(config.layers)]


def check_supported(config: ModelConfig) -> None:
    architecture(config)
    if config.vocab < len(SPECIAL_TOKENS):
        raise UnsupportedModel(f"a vocabulary of {config.vocab} tokens: llama.cpp's SPM vocabulary needs at least "
                               f"{len(SPECIAL_TOKENS)} (unknown, begin, end)")


def _rows_for_half_split(matrix: np.ndarray, heads: int, head_width: int, style: str) -> np.ndarray:
    """A query or key projection (or a per-head norm's weights, ``heads`` 1) whose output features llama.cpp
    rotates as pairs ``(i, i + dh/2)`` (gemma3's NEOX RoPE): an ``interleaved`` model's features are put back
    by the inverse of ``rotary_permutation``; the scores are unchanged."""
    if style == "half_split":
        return matrix
    inverse = np.argsort(rotary_permutation(head_width))
    return matrix.reshape(heads, head_width, -1)[:, inverse, :].reshape(matrix.shape)


def write_gguf(path: str | Path, config: ModelConfig, weights: ModelWeights, *, name: str = "kvcache-random") -> Path:
    """Write ``weights`` (checked against ``config``) as a GGUF file at ``path``; return the path."""
    import gguf  # the llamacpp extra: only this adapter needs it

    check_supported(config)
    weights.check(config)
    arch = architecture(config)
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.max_positions)
    writer.add_embedding_length(config.model_width)
    writer.add_block_count(config.layers)
    writer.add_feed_forward_length(config.ffn_width)
    writer.add_head_count(config.heads)
    writer.add_head_count_kv(config.kv_heads)
    writer.add_key_length(config.head_width)
    writer.add_value_length(config.head_width)
    writer.add_rope_dimension_count(config.head_width)
    writer.add_rope_freq_base(config.rope_base)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_vocab_size(config.vocab)
    if arch == "gemma3":
        # gemma3 reads: attention.sliding_window W (required), the pattern as one bool per layer (True:
        # windowed; its default, a scalar 6, is Gemma 3's), rope.freq_base_swa for windowed layers (default
        # 10000). Hard-coded: the embedding scale sqrt(D), GELU (a float16 table), NEOX RoPE, an attention scale of
        # 1/sqrt(dh) except for 62 layers (Gemma 3 27B: 1/sqrt(D/H)).
        if config.layers == 62:
            raise UnsupportedModel("llama.cpp's gemma3 takes 62 layers for Gemma 3 27B: attention scale "
                                   "1/sqrt(D/H), not 1/sqrt(dh)")
        windowed = layer_windowed(config)
        if any(windowed):
            writer.add_sliding_window(config.window)
            writer.add_array(f"{arch}.attention.sliding_window_pattern", windowed)
        else:  # a window with no layer windowed aborts the context (repro_swa_pattern_all_global_aborts.py)
            writer.add_sliding_window(0)  # 0: no window, one plain store
        local = config.local_rope_base
        writer.add_rope_freq_base_swa(float(local if local is not None else config.rope_base))

    tokens = list(SPECIAL_TOKENS) + [f"tok{i}" for i in range(len(SPECIAL_TOKENS), config.vocab)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [
        gguf.TokenType.NORMAL] * (config.vocab - len(SPECIAL_TOKENS))
    writer.add_tokenizer_model("llama")  # SPM
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * config.vocab)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    def tensor(tensor_name: str, array: np.ndarray) -> None:
        writer.add_tensor(tensor_name, np.ascontiguousarray(array, dtype=np.float32))

    dh, style = config.head_width, config.rope_style
    rows = _rows_for_half_split if arch == "gemma3" else _rows_for_interleaved
    tensor("token_embd.weight", weights.embedding)  # [V, D]
    for index, layer in enumerate(weights.layers):
        block = f"blk.{index}"
        tensor(f"{block}.attn_norm.weight", layer.attention_norm)
        tensor(f"{block}.attn_q.weight", rows(layer.wq, config.heads, dh, style))  # [H*dh, D]
        tensor(f"{block}.attn_k.weight", rows(layer.wk, config.kv_heads, dh, style))  # [KV*dh, D]
        tensor(f"{block}.attn_v.weight", layer.wv)  # [KV*dh, D]
        tensor(f"{block}.attn_output.weight", layer.wo)  # [D, H*dh]
        tensor(f"{block}.ffn_norm.weight", layer.ffn_norm)
        tensor(f"{block}.ffn_gate.weight", layer.w_gate)  # [F, D]
        tensor(f"{block}.ffn_up.weight", layer.w_up)  # [F, D]
        tensor(f"{block}.ffn_down.weight", layer.w_down)  # [D, F]
        if arch == "gemma3":  # norms multiply by w: GGUF's convention (HF Gemma stores w - 1)
            tensor(f"{block}.attn_q_norm.weight", rows(layer.q_norm[None, :, None], 1, dh, style).ravel())  # [dh]
            tensor(f"{block}.attn_k_norm.weight", rows(layer.k_norm[None, :, None], 1, dh, style).ravel())
            tensor(f"{block}.post_attention_norm.weight", layer.post_attention_norm)  # [D]
            tensor(f"{block}.post_ffw_norm.weight", layer.post_ffn_norm)  # [D]
    tensor("output_norm.weight", weights.output_norm)
    if weights.output is not None:  # tied: none, and llama.cpp reads token_embd
        tensor("output.weight", weights.output)  # [V, D]

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_gguf(path: str | Path) -> tuple[ModelConfig, ModelWeights]:
    """What llama.cpp will read from a file ``write_gguf`` wrote: its model as the suite states models (always
    ``interleaved``, weights widened from float32). A ``half_split`` model reads back as its permuted twin."""
    import gguf

    from kvcache_conformance.protocol.model import LayerWeights

    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    if fields.get("general.architecture") != "llama":
        raise UnsupportedModel(f"{path}: architecture {fields.get('general.architecture')!r}, not llama")
    arrays = {t.name: np.asarray(t.data, dtype=np.float64).reshape(tuple(int(n) for n in reversed(t.shape)))
              for t in reader.tensors}

    def meta(key: str) -> Any:
        return fields[f"llama.{key}"]

    config = ModelConfig(vocab=len(fields["tokenizer.ggml.tokens"]), model_width=int(meta("embedding_length")),
                         layers=int(meta("block_count")), heads=int(meta("attention.head_count")),
                         kv_heads=int(meta("attention.head_count_kv")), head_width=int(meta("attention.key_length")),
                         ffn_width=int(meta("feed_forward_length")), rope_style="interleaved",
                         rope_base=float(meta("rope.freq_base")),
                         norm_eps=float(meta("attention.layer_norm_rms_epsilon")),
                         tied_output="output.weight" not in arrays, max_positions=int(meta("context_length")))
    names = {"attention_norm": "attn_norm", "wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
             "ffn_norm": "ffn_norm", "w_gate": "ffn_gate", "w_up": "ffn_up", "w_down": "ffn_down"}
    layers = tuple(LayerWeights(**{ours: arrays[f"blk.{i}.{theirs}.weight"] for ours, theirs in names.items()})
                   for i in range(config.layers))
    weights = ModelWeights(embedding=arrays["token_embd.weight"], layers=layers,
                           output_norm=arrays["output_norm.weight"], output=arrays.get("output.weight"))
    weights.check(config)
    return config, weights
