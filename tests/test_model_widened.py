"""The widened whole model (docs/spec.md §15.1): per-layer windows, a local RoPE base, Gemma 3's switches."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from impl.model_conformance import (
    ModelReferenceAdapter,
    make_gelu_table_model_adapter,
    make_gemma3_model_adapter,
    make_swa_pattern_6_model_adapter,
)
from kvcache_conformance.generate.models import model_configs, model_requirements
from kvcache_conformance.judge.tolerance import Judge
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
from kvcache_conformance.oracle.model import CellContext, Model, full_model, kv_storage_of
from kvcache_conformance.oracle.numbers import with_activation_table
from kvcache_conformance.protocol.declarations import declaration_problems
from kvcache_conformance.protocol.kinds import declared
from kvcache_conformance.protocol.model import ModelLimits, ModelPolicyError, declared_activation_table

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


# -- declarations and what the suite draws within them -----------------------------------------------------------

def drawn(capabilities: frozenset[str], limits: Any, examples: int = 200) -> list[ModelConfig]:
    seen: list[ModelConfig] = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True)
    @given(model_configs(capabilities, limits))
    def draw(config: ModelConfig) -> None:
        seen.append(config)

    draw()
    return seen


def test_interleaved_and_gemma3_models_are_drawn_where_declared() -> None:
    adapter = make_gemma3_model_adapter()
    capabilities, limits = declared(adapter.capabilities), ModelLimits.of(adapter)
    configs = drawn(capabilities, limits)
    assert all(limits.model_problem(c) is None and model_requirements(c) <= capabilities for c in configs)
    met = Counter()
    for c in configs:
        met[c.architecture] += 1
        met[c.window_pattern if not isinstance(c.window_pattern, tuple) else "tuple"] += 1
        met["local base" if c.local_rope_base is not None else "no local base"] += 1
        windows = {c.layer_window(i) for i in range(c.layers)}
        if None in windows and len(windows) > 1:
            met["a local and a global layer"] += 1
            met[f"{c.architecture} with a local and a global layer"] += 1
    wanted = {"llama", "gemma3", "all", 2, 3, "tuple", "local base", "no local base", "a local and a global layer",
              "gemma3 with a local and a global layer", "llama with a local and a global layer"}
    assert wanted <= set(met), met
    assert all(c.rope_style == "half_split" for c in configs if c.architecture == "gemma3")


def test_a_llama_only_adapter_is_handed_the_model_it_was() -> None:
    """The default reference declares neither: every drawn model is a Llama with every layer alike."""
    adapter = ModelReferenceAdapter()
    configs = drawn(declared(adapter.capabilities), ModelLimits.of(adapter), 100)
    assert all(c.architecture == "llama" and not c.interleaved and c.layers <= 2 for c in configs)
    assert any(c.window is not None for c in configs)


def test_llama_cpp_s_pattern_and_local_base_are_drawn_as_declared() -> None:
    """window_pattern 6 and local_rope_base 10000 (llama.cpp's gemma3): every windowed model has six or seven
    layers, the sixth global, and the local base 10000; gemma3 alone."""
    adapter = make_swa_pattern_6_model_adapter()
    configs = drawn(declared(adapter.capabilities), ModelLimits.of(adapter), 60)
    windowed = [c for c in configs if c.window is not None]
    assert windowed and all(c.architecture == "gemma3" for c in configs)
    assert {c.layers for c in windowed} == {6, 7}
    for c in windowed:
        assert [c.layer_window(i) is None for i in range(c.layers)] == [i == 5 for i in range(c.layers)]
        assert {c.layer_rope(i).base for i in range(5)} == {10000.0}
    other = ModelLimits.of(adapter)
    assert "window_pattern 6" in str(other.model_problem(gemma3_config(layers=6, window_pattern="all")))
    assert "local_rope_base" in str(other.model_problem(gemma3_config(layers=6, window_pattern=6,
                                                                       local_rope_base=100.0)))


def test_a_widened_model_is_outside_a_llama_only_declaration() -> None:
    """Replay gates on it: a trace of a gemma3 or an interleaved model is not applicable to a Llama-only adapter."""
    assert "architecture gemma3" in str(ModelLimits().model_problem(MODEL_PRESETS["tiny-gemma3"]))
    assert "architecture none" in str(ModelLimits().model_problem(ModelConfig(qk_norm=True)))
    assert "interleaved_windows" in model_requirements(MODEL_PRESETS["tiny-interleaved"])
    assert "interleaved_windows" not in model_requirements(MODEL_PRESETS["tiny-window3"])


class Declaring:
    def __init__(self, capabilities: set[str], **attributes: Any) -> None:
        self.capabilities = frozenset(capabilities)
        self.__dict__.update(attributes)


@pytest.mark.parametrize("limits", [{"architectures": "gemma3"}, {"architectures": []}, {"architectures": ["gemma2"]},
                                    {"window_pattern": 1}, {"window_pattern": True}, {"local_rope_base": 10000},
                                    {"local_rope_base": -1.0}])
def test_bad_architecture_limits_are_usage_errors(limits: dict[str, Any]) -> None:
    with pytest.raises(ModelPolicyError):
        ModelLimits.of(Declaring(set(), model_limits=limits))


MODEL = {"whole_model", "rope_half_split", "rope_interleaved"}


@pytest.mark.parametrize("capabilities, limits, problem", [
    (MODEL | {"interleaved_windows"}, {}, "interleaved_windows without whole_model and sliding_window"),
    ({"rope_interleaved", "interleaved_windows", "sliding_window"}, {}, "interleaved_windows without whole_model"),
    (MODEL - {"rope_half_split"}, {"architectures": ["gemma3"]}, "gemma3 without rope_half_split"),
    (MODEL | {"sliding_window"}, {"window_pattern": 6}, "without interleaved_windows"),
])
def test_contradicting_declarations_are_refused(capabilities: set[str], limits: dict[str, Any], problem: str) -> None:
    problems = declaration_problems(Declaring(capabilities, model_limits=limits))
    assert any(problem in p for p in problems), problems
    assert not declaration_problems(make_gemma3_model_adapter())
    assert not declaration_problems(make_swa_pattern_6_model_adapter())


def test_a_widened_model_and_its_weights_survive_a_trace() -> None:
    """Traces keep every field (a pattern of bools as a tuple); a trace from before the fields reads as a Llama."""
    from kvcache_conformance.traces import codec

    for config in (MODEL_PRESETS["tiny-gemma3"], ModelConfig(layers=2, window=2, window_pattern=(False, True))):
        weights = random_model_weights(config, 3)
        assert codec.decode(codec.encode(config)) == config
        back = codec.decode(codec.encode(weights))
        np.testing.assert_array_equal(back.layers[0].wq, weights.layers[0].wq)
        assert (back.layers[0].q_norm is None) == (not config.qk_norm)
    old = codec.encode(MODEL_PRESETS["tiny"])
    for name in ("window_pattern", "local_rope_base", "embedding_scale", "qk_norm", "post_norms", "activation"):
        del old["$ModelConfig"][name]
    assert codec.decode(old) == MODEL_PRESETS["tiny"]


# -- a gate activation read from a table (docs/spec.md §15.6) ----------------------------------------------------

def test_the_table_rounds_the_gate_s_argument_and_value_to_float16() -> None:
    """The oracle with a float16 activation table is the float64 model whose gate values and activations are
    rounded to float16, written here by hand for one token at position 0 (it sees only itself)."""
    config = dataclasses.replace(MODEL_PRESETS["tiny-gemma3"], layers=1)
    weights = random_model_weights(config, 5)
    layer, eps = weights.layers[0], config.norm_eps
    h = weights.embedding[3] * math.sqrt(config.model_width)
    v = layer.wv @ rms(h, layer.attention_norm, eps)
    merged = np.concatenate([v[(q // config.group_size) * 4:(q // config.group_size + 1) * 4]
                             for q in range(config.heads)])
    h = h + rms(layer.wo @ merged, layer.post_attention_norm, eps)
    x = rms(h, layer.ffn_norm, eps)
    g = (layer.w_gate @ x).astype(np.float16).astype(np.float64)
    act = (0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))).astype(np.float16)
    h = h + rms(layer.w_down @ (act.astype(np.float64) * (layer.w_up @ x)), layer.post_ffn_norm, eps)
    expected = weights.embedding @ rms(h, weights.output_norm, eps)
    tabled = full_model([3], config, weights, numbers=with_activation_table(FLOAT64, "float16"))
    np.testing.assert_allclose(tabled[0], expected, rtol=0, atol=1e-12)
    assert np.abs(tabled - full_model([3], config, weights)).max() > 1e-6


def table_ratio(adapter: Any, kv: str, seed: int) -> float:
    config = dataclasses.replace(MODEL_PRESETS["tiny-gemma3"], heads=4, kv_heads=2, ffn_width=8)
    weights = random_model_weights(config, seed)
    exact = full_model(TOKENS, config, weights)
    adapter.kv_storage = kv
    judge = Judge.for_model(adapter, FLOAT64)
    naive = full_model(TOKENS, config, weights, numbers=judge.naive, kv_storage=None if judge.storage is None
                       else kv_storage_of(judge.storage, judge.naive))
    context = adapter.create_context(adapter.create_model(config, weights), ContextConfig(16, 1))
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, TOKENS, 0))
    return float(np.max(np.abs(got - exact) / judge.tolerance(exact, naive)))  # per token under a narrower cache


@pytest.mark.parametrize("kv", ["float16", "float32"])
def test_a_declared_table_is_judged_through_it_and_an_undeclared_one_fails(kv: str) -> None:
    declared_ratios = [table_ratio(make_gelu_table_model_adapter(), kv, seed) for seed in range(6)]
    assert max(declared_ratios) < 1.0, declared_ratios
    undeclared = make_gelu_table_model_adapter()
    undeclared.activation_table = None  # the same engine, its table undeclared
    engine = make_gelu_table_model_adapter()
    undeclared.create_model = engine.create_model  # still computes through it
    ratios = [table_ratio(undeclared, kv, seed) for seed in range(6)]
    if kv == "float32":  # over a float16 cache the machine finds the excess (the lattice's twin); here, at once
        assert max(ratios) > 1.0, ratios


@pytest.mark.parametrize("dtype, table", [("float64", "float16"), ("float16", "float16"), ("float32", "bfloat16"),
                                          ("float32", True)])
def test_an_activation_table_is_declared_by_a_float32_model_of_float16_only(dtype: str, table: Any) -> None:
    with pytest.raises(ValueError, match="activation_table"):
        declared_activation_table(Declaring(set(), dtype=dtype, activation_table=table))
    assert declared_activation_table(make_gelu_table_model_adapter()) == "float16"
    assert declared_activation_table(ModelReferenceAdapter()) is None
    assert any("activation_table without whole_model" in p for p in declaration_problems(
        Declaring({"rope_interleaved"}, dtype="float32", activation_table="float16")))
