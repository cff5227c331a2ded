"""The widened whole model (docs/spec.md §15.1): per-layer windows, a local RoPE base, Gemma 3's switches."""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np
import pytest

from kvcache_conformance.oracle import (
    FLOAT64,
    MODEL_PRESETS,
    ContextConfig,
    ModelBatch,
    ModelConfig,
    ModelWeights,
    OracleInputError,
    gemma3_config,
    mpmath_precision,
    numpy_precision,
    random_model_weights,
    rounding_errors,
)
from kvcache_conformance.oracle.model import CellContext, Model, full_model

TOKENS = [3, 1, 4, 1, 5, 9, 2, 6]
SWITCHES = {"embedding_scale": True, "qk_norm": True, "post_norms": True, "activation": "gelu_tanh"}


# -- by hand: numpy, one sequence, every layer's mask and rotation spelled out -----------------------------------

def rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotated(x: np.ndarray, base: float, style: str) -> np.ndarray:
    """``x [T, heads, dh]`` at positions 0..T-1."""
    dh = x.shape[-1]
    theta = np.arange(len(x))[:, None] * base ** (-np.arange(0, dh, 2) / dh)  # [T, dh/2]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a_index, b_index = (slice(0, dh, 2), slice(1, dh, 2)) if style == "interleaved" else (
        slice(0, dh // 2), slice(dh // 2, dh))
    out = x.copy()
    a, b = x[..., a_index], x[..., b_index]
    out[..., a_index], out[..., b_index] = a * cos - b * sin, a * sin + b * cos
    return out


def by_hand(config: ModelConfig, weights: ModelWeights, tokens: list[int], windows: list[int | None],
            bases: list[float]) -> np.ndarray:
    """Every position's logits, with layer ``l``'s window ``windows[l]`` and RoPE base ``bases[l]`` given."""
    c, n, dh = config, len(tokens), config.head_width
    h = weights.embedding[tokens] * (math.sqrt(c.model_width) if c.embedding_scale else 1.0)
    positions = np.arange(n)
    for layer, w in enumerate(weights.layers):
        x = rms(h, w.attention_norm, c.norm_eps)
        q = (x @ w.wq.T).reshape(n, c.heads, dh)
        k = (x @ w.wk.T).reshape(n, c.kv_heads, dh)
        v = (x @ w.wv.T).reshape(n, c.kv_heads, dh)
        if c.qk_norm:
            q, k = rms(q, w.q_norm, c.norm_eps), rms(k, w.k_norm, c.norm_eps)
        q, k = rotated(q, bases[layer], c.rope_style), rotated(k, bases[layer], c.rope_style)
        k, v = np.repeat(k, c.group_size, axis=1), np.repeat(v, c.group_size, axis=1)
        mask = positions[None, :] <= positions[:, None]
        if windows[layer] is not None:
            mask &= positions[:, None] - positions[None, :] < windows[layer]
        scores = np.where(mask[:, None, :], np.einsum("ihd,jhd->hij", q, k).transpose(1, 0, 2) / math.sqrt(dh),
                          -np.inf)
        a = np.exp(scores - scores.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        out = np.einsum("ihj,jhd->ihd", a, v).reshape(n, -1) @ w.wo.T
        h = h + (rms(out, w.post_attention_norm, c.norm_eps) if c.post_norms else out)
        x = rms(h, w.ffn_norm, c.norm_eps)
        g = x @ w.w_gate.T
        act = (0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))) if c.activation == "gelu_tanh"
               else g / (1 + np.exp(-g)))
        out = (act * (x @ w.w_up.T)) @ w.w_down.T
        h = h + (rms(out, w.post_ffn_norm, c.norm_eps) if c.post_norms else out)
    head = weights.embedding if weights.output is None else weights.output
    result: np.ndarray = rms(h, weights.output_norm, c.norm_eps) @ head.T
    return result


@pytest.mark.parametrize("config, windows, bases", [
    (ModelConfig(layers=2, window=2, window_pattern=(True, False), local_rope_base=100.0), [2, None],
     [100.0, 10000.0]),
    (ModelConfig(layers=3, window=2, window_pattern=(False, True, False)), [None, 2, None], [10000.0] * 3),
    (ModelConfig(layers=3, window=3, window_pattern=3, local_rope_base=50.0), [3, 3, None], [50.0, 50.0, 10000.0]),
    (gemma3_config(), [3, None], [10000.0, 1e6]),
    (gemma3_config(heads=4, kv_heads=2, window_pattern="all", tied_output=False), [3, 3], [10000.0, 10000.0]),
], ids=["window-then-global-local-base", "explicit-tuple", "every-third-global", "gemma3", "gemma3-all-windowed"])
def test_each_layer_sees_its_own_window_with_its_own_base_as_computed_by_hand(config, windows, bases) -> None:
    assert [config.layer_window(i) for i in range(config.layers)] == windows
    assert [config.layer_rope(i).base for i in range(config.layers)] == bases
    weights = random_model_weights(config, 11)
    np.testing.assert_allclose(full_model(TOKENS, config, weights), by_hand(config, weights, TOKENS, windows, bases),
                               rtol=0, atol=1e-12)


def test_a_global_layer_sees_past_the_window_a_windowed_one_does_not() -> None:
    """Two layers of window 2: the last token reaches positions p-2..p through windowed layers, all of them through
    a global one; so the first token changes its logits only where a layer is global."""
    changed = [0, *TOKENS[1:]]
    for pattern, reaches_first in (("all", False), ((True, False), True), ((False, True), True), (2, True)):
        config = ModelConfig(layers=2, window=2, window_pattern=pattern)
        weights = random_model_weights(config, 3)
        moved = np.abs(full_model(TOKENS, config, weights)[-1] - full_model(changed, config, weights)[-1]).max()
        assert (moved > 1e-9) == reaches_first, (pattern, moved)


def test_the_local_base_turns_only_the_windowed_layers() -> None:
    """One windowed layer with a local base of 100 is the model of base 100; a global layer keeps ``rope_base``."""
    local = ModelConfig(layers=1, window=3, local_rope_base=100.0)
    weights = random_model_weights(local, 4)
    np.testing.assert_array_equal(full_model(TOKENS, local, weights),
                                  full_model(TOKENS, ModelConfig(layers=1, window=3, rope_base=100.0), weights))
    global_only = ModelConfig(layers=1, window=3, window_pattern=(False,), local_rope_base=100.0)
    np.testing.assert_array_equal(full_model(TOKENS, global_only, weights),
                                  full_model(TOKENS, ModelConfig(layers=1), weights))


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_every_switch_changes_the_logits(switch: str) -> None:
    config = MODEL_PRESETS["tiny-half-split"]
    on = dataclasses.replace(config, **{switch: SWITCHES[switch]})
    weights = random_model_weights(on, 2)
    plain = dataclasses.replace(weights, layers=tuple(
        dataclasses.replace(layer, q_norm=None, k_norm=None, post_attention_norm=None, post_ffn_norm=None)
        for layer in weights.layers))
    assert np.abs(full_model(TOKENS, on, weights) - full_model(TOKENS, config, plain)).max() > 1e-6


# -- float64 and mpmath from the same code -----------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-interleaved"])
def test_float64_and_mpmath_agree(preset: str) -> None:
    config = MODEL_PRESETS[preset]
    weights = random_model_weights(config, 5)
    exact = full_model(TOKENS, config, weights, numbers=mpmath_precision(40))
    np.testing.assert_allclose(full_model(TOKENS, config, weights), exact, rtol=0, atol=1e-12)


@pytest.mark.parametrize("preset", ["tiny-gemma3", "tiny-interleaved"])
def test_float64_and_mpmath_agree_through_the_operations(preset: str) -> None:
    config = MODEL_PRESETS[preset]
    results = []
    for numbers in (FLOAT64, mpmath_precision(40)):
        ctx = CellContext(Model(config, random_model_weights(config, 9), numbers=numbers), ContextConfig(32, 3))
        logits = [ctx.decode(ModelBatch.of_sequence(0, TOKENS[:6], 0))]
        ctx.copy(0, 1, 1, 5)
        ctx.shift(1, 3, -1, 4)
        ctx.divide(0, 2, -1, 2)
        ctx.remove(0, 0, 1)
        ctx.load(2, ctx.save(1))
        logits += [ctx.decode(ModelBatch.of_sequence(seq, [7, 8], ctx.pos_max(seq) + 1)) for seq in (0, 1, 2)]
        results.append(np.vstack(logits))
    np.testing.assert_allclose(results[0], results[1], rtol=0, atol=1e-12)


def test_the_rounding_estimate_covers_gemma3_and_bounds_the_naive_float32_error() -> None:
    """The precision rule's errors run through the new operations (tanh, the extra norms, the scale) and bound
    what a naive float32 evaluation errs by."""
    config = MODEL_PRESETS["tiny-gemma3"]
    weights = random_model_weights(config, 3)
    exact = full_model(TOKENS, config, weights)
    naive = np.abs(full_model(TOKENS, config, weights, numbers=numpy_precision("float32")) - exact)
    estimated = full_model(TOKENS, config, weights, numbers=rounding_errors("float32"))
    assert np.all(np.isfinite(estimated)) and np.all(naive <= estimated)
    assert 0 < naive.max() and estimated.max() < 1e-3


# -- configurations and weights ----------------------------------------------------------------------------------

def test_architectures() -> None:
    assert MODEL_PRESETS["tiny"].architecture == "llama"
    assert MODEL_PRESETS["tiny-gemma3"].architecture == "gemma3"
    assert gemma3_config(rope_style="interleaved").architecture is None  # llama.cpp's gemma3 is NEOX only
    assert ModelConfig(qk_norm=True).architecture is None
    assert MODEL_PRESETS["tiny-interleaved"].interleaved and not MODEL_PRESETS["tiny-window3"].interleaved


@pytest.mark.parametrize("bad", [
    dict(window_pattern=2),  # a pattern without a window
    dict(window=2, window_pattern=1), dict(window=2, window_pattern=True), dict(window=2, window_pattern="odd"),
    dict(window=2, window_pattern=(True,)), dict(window=2, window_pattern=(True, 1)),
    dict(local_rope_base=100.0), dict(window=2, local_rope_base=0.0), dict(window=2, local_rope_base=100),
    dict(embedding_scale=1), dict(qk_norm="yes"), dict(post_norms=None), dict(activation="gelu"),
])
def test_bad_configurations_are_oracle_input_errors(bad) -> None:
    with pytest.raises(OracleInputError):
        ModelConfig(**bad)


def test_weights_carry_the_switched_norms_exactly_when_switched_on() -> None:
    config = MODEL_PRESETS["tiny-gemma3"]
    weights = random_model_weights(config, 1)
    layer = weights.layers[0]
    assert layer.q_norm.shape == layer.k_norm.shape == (config.head_width,)
    assert layer.post_attention_norm.shape == layer.post_ffn_norm.shape == (config.model_width,)
    without = dataclasses.replace(weights, layers=(dataclasses.replace(layer, k_norm=None), *weights.layers[1:]))
    with pytest.raises(OracleInputError, match="k_norm"):
        without.check(config)
    llama = random_model_weights(MODEL_PRESETS["tiny"], 1)
    extra = dataclasses.replace(llama, layers=(dataclasses.replace(llama.layers[0], post_ffn_norm=np.ones(8)),
                                               *llama.layers[1:]))
    with pytest.raises(OracleInputError, match="post_ffn_norm"):
        extra.check(MODEL_PRESETS["tiny"])
    with pytest.raises(OracleInputError):
        MODEL_PRESETS["tiny"].layer_window(2)


# sha256 (first 16 hex digits) of random_model_weights(preset, 7)'s arrays before the model was widened
LLAMA_WEIGHTS = {"tiny": "8f3a8be305307028", "tiny-mha": "785d453222dc53e3", "tiny-half-split": "8401d8532dd55c96",
                 "tiny-tied": "88cc411f2403e8da", "tiny-window3": "8f3a8be305307028"}


@pytest.mark.parametrize("preset", sorted(LLAMA_WEIGHTS))
def test_a_llama_configuration_draws_the_same_weights_from_the_same_seed(preset: str) -> None:
    weights = random_model_weights(MODEL_PRESETS[preset], 7)
    digest = hashlib.sha256()
    arrays = [weights.embedding, weights.output_norm, *([] if weights.output is None else [weights.output])]
    for layer in weights.layers:
        assert layer.q_norm is layer.k_norm is layer.post_attention_norm is layer.post_ffn_norm is None
        arrays += [layer.attention_norm, layer.wq, layer.wk, layer.wv, layer.wo, layer.ffn_norm, layer.w_gate,
                   layer.w_up, layer.w_down]
    for array in arrays:
        digest.update(array.tobytes())
    assert digest.hexdigest()[:16] == LLAMA_WEIGHTS[preset]
