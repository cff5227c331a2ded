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


def gemma3(**fields):  # Gemma 3's switches on, a window of 3 in every second layer
    gemma = {"rope_style": "half_split", "rope_base": 1e6, "local_rope_base": 10000.0, "window": 3,
             "window_pattern": 2, "embedding_scale": True, "qk_norm": True, "post_norms": True,
             "activation": "gelu_tanh", "tied_output": True, "norm_eps": 1e-6, "layers": 4}
    return ModelConfig(**{**gemma, **fields})


@pytest.mark.parametrize("style", ["half_split", "interleaved"])
def test_a_gemma3_model_writes_its_window_pattern_bases_and_norms(style: str, tmp_path: Path) -> None:
    import gguf

    config = gemma3(rope_style=style, window_pattern=(True, True, False, True))
    weights = random_model_weights(config, seed=6)
    reader = gguf.GGUFReader(str(write_gguf(tmp_path / "m.gguf", config, weights)))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "gemma3"
    assert fields["gemma3.attention.sliding_window"] == 3
    assert fields["gemma3.attention.sliding_window_pattern"] == [True, True, False, True]
    assert (fields["gemma3.rope.freq_base"], fields["gemma3.rope.freq_base_swa"]) == (1e6, 10000.0)
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in reader.tensors}
    # llama.cpp's NEOX pairs (i, i + dh/2): an interleaved model's per-head features are put back in that order
    order = np.arange(config.head_width) if style == "half_split" else np.argsort(rotary_permutation(
        config.head_width))
    np.testing.assert_array_equal(tensors["blk.2.attn_q_norm.weight"], as_float32(weights).layers[2].q_norm[order])
    np.testing.assert_array_equal(tensors["blk.0.post_ffw_norm.weight"], as_float32(weights).layers[0].post_ffn_norm)
    assert "output.weight" not in tensors  # tied


def test_a_gemma3_model_without_a_windowed_layer_is_written_without_a_window(tmp_path: Path) -> None:
    import gguf  # a window over an all-false pattern aborts llama.cpp (repro_swa_pattern_all_global_aborts.py)

    config = gemma3(window=None, window_pattern="all", local_rope_base=None)
    reader = gguf.GGUFReader(str(write_gguf(tmp_path / "m.gguf", config, random_model_weights(config, seed=6))))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["gemma3.attention.sliding_window"] == 0
    assert "gemma3.attention.sliding_window_pattern" not in fields


def test_part_of_gemma3s_switches_has_no_arch(tmp_path: Path) -> None:
    config = gemma3(post_norms=False)
    with pytest.raises(UnsupportedModel, match="together"):
        write_gguf(tmp_path / "m.gguf", config, random_model_weights(config, seed=6))
