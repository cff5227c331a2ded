"""The suite's whole-model weights as a GGUF file llama.cpp loads (arch ``llama``), written with ``gguf==0.19.0``.

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

What arch ``llama`` cannot express (a sliding window) is refused with ``UnsupportedModel``.
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


def check_supported(config: ModelConfig) -> None:
    if config.window is not None:
        raise UnsupportedModel(f"llama.cpp's arch llama has no sliding window; the model declares window "
                               f"{config.window}")
    if config.vocab < len(SPECIAL_TOKENS):
        raise UnsupportedModel(f"a vocabulary of {config.vocab} tokens: llama.cpp's SPM vocabulary needs at least "
                               f"{len(SPECIAL_TOKENS)} (unknown, begin, end)")


def write_gguf(path: str | Path, config: ModelConfig, weights: ModelWeights, *, name: str = "kvcache-random") -> Path:
    """Write ``weights`` (checked against ``config``) as a GGUF file at ``path``; return the path."""
    import gguf  # the llamacpp extra: only this adapter needs it

    check_supported(config)
    weights.check(config)
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
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
    tensor("token_embd.weight", weights.embedding)  # [V, D]
    for index, layer in enumerate(weights.layers):
        block = f"blk.{index}"
        tensor(f"{block}.attn_norm.weight", layer.attention_norm)
        tensor(f"{block}.attn_q.weight", _rows_for_interleaved(layer.wq, config.heads, dh, style))  # [H*dh, D]
        tensor(f"{block}.attn_k.weight", _rows_for_interleaved(layer.wk, config.kv_heads, dh, style))  # [KV*dh, D]
        tensor(f"{block}.attn_v.weight", layer.wv)  # [KV*dh, D]
        tensor(f"{block}.attn_output.weight", layer.wo)  # [D, H*dh]
        tensor(f"{block}.ffn_norm.weight", layer.ffn_norm)
        tensor(f"{block}.ffn_gate.weight", layer.w_gate)  # [F, D]
        tensor(f"{block}.ffn_up.weight", layer.w_up)  # [F, D]
        tensor(f"{block}.ffn_down.weight", layer.w_down)  # [D, F]
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
