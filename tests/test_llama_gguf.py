"""The GGUF writer (adapters/llama_gguf.py): what llama.cpp reads back is the suite's model, in float32.

Needs the ``llamacpp`` extra's ``gguf`` (skipped without it); llama.cpp itself is not needed here.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvcache_conformance.oracle.model import full_model
from kvcache_conformance.oracle.model_config import ModelConfig, random_model_weights

pytest.importorskip("gguf")

from adapters.llama_gguf import UnsupportedModel, read_gguf, rotary_permutation, write_gguf

GQA = ModelConfig(vocab=12, model_width=8, layers=2, heads=4, kv_heads=2, head_width=6, ffn_width=10,
                  rope_base=500000.0, max_positions=32)


def as_float32(weights):  # what the file holds, widened again
    def f32(a):
        return None if a is None else a.astype(np.float32).astype(np.float64)

    layers = tuple(type(layer)(**{k: f32(getattr(layer, k)) for k in layer.__dataclass_fields__})
                   for layer in weights.layers)
    return type(weights)(embedding=f32(weights.embedding), layers=layers, output_norm=f32(weights.output_norm),
                         output=f32(weights.output))


@pytest.mark.parametrize("config", [GQA, replace(GQA, tied_output=True), replace(GQA, kv_heads=1, head_width=4)],
                         ids=["gqa-untied", "tied", "mqa-dh4"])
def test_an_interleaved_model_reads_back_as_itself_in_float32(config: ModelConfig, tmp_path: Path) -> None:
    weights = random_model_weights(config, seed=3)
    read_config, read_weights = read_gguf(write_gguf(tmp_path / "m.gguf", config, weights))
    assert replace(read_config, norm_eps=config.norm_eps) == config  # eps is stored as a float32
    assert read_config.norm_eps == float(np.float32(config.norm_eps))
    expected = as_float32(weights)
    assert (read_weights.output is None) == config.tied_output
    np.testing.assert_array_equal(read_weights.embedding, expected.embedding)
    for got, want in zip(read_weights.layers, expected.layers):
        for name in want.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name), err_msg=name)


def test_a_half_split_model_is_written_as_its_interleaved_twin_with_the_same_logits(tmp_path: Path) -> None:
    config = replace(GQA, rope_style="half_split")
    weights = random_model_weights(config, seed=4)
    read_config, read_weights = read_gguf(write_gguf(tmp_path / "m.gguf", config, weights))
    assert read_config.rope_style == "interleaved"
    tokens = [3, 7, 1, 11, 5]
    twin = full_model(tokens, read_config, read_weights)  # what llama.cpp computes, in float64
    original = full_model(tokens, replace(config, norm_eps=read_config.norm_eps), as_float32(weights))
    np.testing.assert_allclose(twin, original, rtol=0, atol=1e-12)
    # and the permutation is not a no-op: the unpermuted rows under interleaved differ
    unpermuted = full_model(tokens, read_config, replace(read_weights, layers=tuple(
        replace(layer, wq=w.wq, wk=w.wk) for layer, w in zip(read_weights.layers, as_float32(weights).layers))))
    assert np.max(np.abs(unpermuted - original)) > 1e-6


def test_the_permutation_pairs_i_with_i_plus_half() -> None:
    assert rotary_permutation(6).tolist() == [0, 3, 1, 4, 2, 5]


def test_what_arch_llama_cannot_express_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModel, match="sliding window"):
        write_gguf(tmp_path / "m.gguf", replace(GQA, window=3), random_model_weights(replace(GQA, window=3), 0))
    small = ModelConfig(vocab=2)
    with pytest.raises(UnsupportedModel, match="at least 3"):
        write_gguf(tmp_path / "m.gguf", small, random_model_weights(small, 0))
