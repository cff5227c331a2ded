"""The per-dtype rules: float64 never loosens; the low-precision rule passes an honest float32
implementation and fails one that quietly loses precision; the mixed-precision rule passes a float64
cache with a declared float32 RoPE table or softmax, and fails one whose table is coarser than declared."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from examples.minimal_adapter import (
    Float32Adapter,
    Float32RopeAdapter,
    Float32SoftmaxAdapter,
    Float32TranscendentalsAdapter,
    MinimalAdapter,
)
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.judge.tolerance import ABSOLUTE, FACTOR, FLOOR_ULPS, Judge
from kvcache_conformance.oracle import (
    FLOAT64,
    AttentionWeights,
    RopeConfig,
    full_decoder,
    full_prefix_attention,
    mixed_precision,
    numpy_precision,
    random_decoder_weights,
    rope_rotate,
)
from kvcache_conformance.oracle.decoder import PRESETS
from kvcache_conformance.protocol.declarations import declared_precision
from kvcache_conformance.run import profiles, selection
from kvcache_conformance.run.runner import RunResult, run_machine

CI = profiles.settings_for("ci", database=None, report_multiple_bugs=False)
MHA = {"style": "interleaved", "grouped": False}


class StoresKeysInFloat16(Float32Adapter):
    name = "float32-with-float16-keys"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        output = super().step(layer, cache, x)
        cache.keys[-1] = cache.keys[-1].astype(np.float16).astype(np.float32)
        return output


class Float32ClaimingFloat64(Float32Adapter):
    """Keeps its weights in float32 but hands back float64 arrays and claims float64."""

    name = "float32-claiming-float64"
    dtype = "float64"
    capabilities = frozenset({"float64", "rope_interleaved"})

    def create_layer(self, weights: Any, rope: Any) -> Any:
        layer = super().create_layer(weights, rope)
        layer.weights = {name: w.astype(np.float32) for name, w in layer.weights.items()}
        return layer

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        return super().step(layer, cache, x.astype(np.float32)).astype(np.float64)

    def snapshot(self, cache: Any) -> Any:
        snapshot = super().snapshot(cache)
        snapshot.keys, snapshot.values = snapshot.keys.astype(np.float64), snapshot.values.astype(np.float64)
        return snapshot


def test_the_float32_rule_is_the_documented_formula() -> None:
    """The baseline of a dtype computed throughout is the rounding error any evaluation may have (its readout
    is the errors themselves, not values): the budget is the largest of them."""
    truth, errors = np.array([3.0, -0.5]), np.array([1e-6, 4e-7])
    judge = Judge("float32", FLOAT64)
    assert judge.naive is not None and judge.naive.reads_errors
    assert judge.tolerance(truth, errors) == pytest.approx(FACTOR * 1e-6 + FLOOR_ULPS * 2.0**-23 * 3.0, rel=1e-9)
    assert Judge("float64", FLOAT64).tolerance(truth, errors) == ABSOLUTE
    assert "2 x the rounding error any float32 evaluation" in judge.rule and "1e-12" in Judge("float64", FLOAT64).rule


def test_the_naive_baseline_rounds_every_operation_to_its_dtype() -> None:
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (4, 4))
    weights, rope = AttentionWeights(w, w.T.copy(), w, w, heads=1, kv_heads=1), RopeConfig("interleaved", 1e4, 4, 16)
    x = rng.uniform(-1, 1, (1, 6, 4))
    exact = full_prefix_attention(x, weights, rope).outputs
    errors = {d: float(np.abs(full_prefix_attention(x, weights, rope, numbers=numpy_precision(d)).outputs
                              - exact).max()) for d in ("float32", "float16", "bfloat16")}
    assert 0 < errors["float32"] < 1e-5 < errors["float16"] < errors["bfloat16"] < 0.5


@pytest.mark.slow
def test_an_honest_float32_implementation_passes() -> None:
    result = run_machine("layer_cache", Float32Adapter(), property_id="float32", parameters=MHA, settings=CI)
    assert result.failure is None, result.failure
    error, tolerance = result.worst
    assert 0 < error <= tolerance and "float32" in result.rule


@pytest.mark.slow
def test_float16_storage_in_a_float32_implementation_fails() -> None:
    result = run_machine("layer_cache", StoresKeysInFloat16(), property_id="f16 keys", parameters=MHA, settings=CI)
    assert isinstance(result.failure, NonConformance)
    # The keys it holds, or an output computed from them, whichever a program judges first: by the failure's check,
    # never its message.
    assert result.failure.check in ("cached keys", "output"), result.failure


@pytest.mark.slow
def test_float64_is_never_loosened_for_a_float32_computation() -> None:
    result = run_machine("layer_cache", Float32ClaimingFloat64(), property_id="claims float64", parameters=MHA,
                         settings=CI)
    assert isinstance(result.failure, NonConformance)
    assert "exceeds tolerance 1e-12" in str(result.failure)


# -- mixed precision: a float64 model with a float32 RoPE table or softmax, declared -----------------------


class Float32RopeUndeclared(Float32RopeAdapter):
    """The example's float32 RoPE table without the declaration: a plain float64 claim."""

    name = "float32-rope-undeclared"
    capabilities = frozenset({"float64", "rope_interleaved"})
    mixed_precision: dict[str, str] = {}  # noqa: RUF012


class Float16RopeClaimingFloat32(Float32RopeAdapter):
    """Declares a float32 RoPE table, computes it in float16."""

    name = "float16-rope-claiming-float32"
    rope_table = "float16"


class Float16TranscendentalsClaimingFloat32(Float32TranscendentalsAdapter):
    """Declares exp, cos and sin of float32 accuracy, has float16's."""

    name = "float16-transcendentals-claiming-float32"
    transcendental_dtype = "float16"


class Declared(MinimalAdapter):
    """For the declaration checks: set ``dtype`` and ``mixed_precision`` per instance."""

    capabilities = frozenset({"rope_interleaved"})

    def __init__(self, dtype: str = "float64", mixed: Any = None) -> None:
        self.dtype, self.mixed_precision = dtype, mixed


def run_declared(adapter: Any, property_id: str) -> RunResult:
    return run_machine("layer_cache", adapter, property_id=property_id, parameters=MHA, settings=CI)


def test_the_mixed_precision_rule_is_the_documented_formula() -> None:
    truth, naive = np.array([3.0, -0.5]), np.array([3.0 + 1e-6, -0.5])
    judge = Judge.for_adapter(Float32RopeAdapter(), FLOAT64)
    assert judge.naive is not None
    assert (judge.dtype, judge.components, judge.naive.name) == ("float64", {"rope": "float32"},
                                                                  "float64 with rope in float32")
    assert judge.tolerance(truth, naive) == pytest.approx(FACTOR * 1e-6 + FLOOR_ULPS * 2.0**-23 * 3.0 + ABSOLUTE,
                                                          rel=1e-9)
    assert judge.tolerance(truth, None) == ABSOLUTE
    assert "with rope in float32" in judge.rule and "8 float32 ulps" in judge.rule and "1e-12" in judge.rule
    coarsest = Judge("float64", FLOAT64, components={"softmax": "float32", "rope": "bfloat16"})
    assert coarsest.tolerance(truth, truth) == pytest.approx(FLOOR_ULPS * 2.0**-7 * 3.0 + ABSOLUTE)
    assert Judge.for_adapter(MinimalAdapter(), FLOAT64).rule == Judge("float64", FLOAT64).rule
    assert Judge.for_adapter(Float32Adapter(), FLOAT64).rule == Judge("float32", FLOAT64).rule


@pytest.mark.parametrize(("dtype", "mixed", "complaint"), [
    ("float32", {"rope": "float32"}, "for float64 adapters only"),
    ("float64", {"rotary": "float32"},
     "components must be among ('rope', 'softmax', 'rotation', 'transcendentals', 'norm')"),
    ("float64", {"softmax": "float64"}, "dtype must be one of ('float32', 'float16', 'bfloat16')"),
    ("float64", "float32", "must map components to dtypes"),
])
def test_a_mixed_precision_declaration_is_checked_at_selection(dtype: str, mixed: Any, complaint: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="mixed_precision") as failure:
        declared_precision(Declared(dtype, mixed))
    assert complaint in str(failure.value)
    monkeypatch.setitem(globals(), "make_declared", lambda: Declared(dtype, mixed))
    with pytest.raises(selection.AdapterLoadError, match="mixed_precision"):
        selection.load_adapter(f"{__name__}:make_declared")


def test_mixed_precision_and_the_float64_capability_are_refused_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "make_both", lambda: type("Both", (Float32RopeAdapter,), {
        "capabilities": frozenset({"float64", "rope_interleaved"})})())
    with pytest.raises(selection.AdapterLoadError, match="float64 capability"):
        selection.load_adapter(f"{__name__}:make_both")
    assert selection.load_adapter("examples.minimal_adapter:make_float32_rope_adapter").name.endswith("rope")


def test_the_oracle_runs_just_the_declared_components_in_their_dtype() -> None:
    rng = np.random.default_rng(5)
    w = rng.uniform(-1, 1, (4, 4))
    weights, rope = AttentionWeights(w, w.T.copy(), w, w, heads=1, kv_heads=1), RopeConfig("interleaved", 1e4, 4, 16)
    x = rng.uniform(-1, 1, (1, 8, 4))
    exact = full_prefix_attention(x, weights, rope)
    assert mixed_precision({}) is FLOAT64
    rope32 = full_prefix_attention(x, weights, rope, numbers=mixed_precision({"rope": "float32"}))
    softmax32 = full_prefix_attention(x, weights, rope, numbers=mixed_precision({"softmax": "float32"}))
    rope16 = full_prefix_attention(x, weights, rope, numbers=mixed_precision({"rope": "float16"}))
    error = lambda a, b: float(np.abs(a - b).max())  # noqa: E731
    assert 1e-10 < error(rope32.keys, exact.keys) < 1e-6 < error(rope16.keys, exact.keys) < 1e-2
    assert error(rope32.values, exact.values) == error(softmax32.keys, exact.keys) == 0.0  # float64 elsewhere
    assert 1e-10 < error(softmax32.outputs, exact.outputs) < 1e-6
    assert error(rope32.outputs, exact.outputs) < 1e-6
    config = PRESETS["seed-rope"]
    decoder = random_decoder_weights(config, 3)
    logits = [full_decoder([1, 2, 3, 4, 5], config, decoder, numbers=n).logits
              for n in (FLOAT64, mixed_precision({"rope": "float32"}))]
    assert 1e-10 < error(*logits) < 1e-5


@pytest.mark.slow
def test_a_declared_float32_rope_table_passes() -> None:
    result = run_declared(Float32RopeAdapter(), "float32 rope")
    assert result.failure is None, result.failure
    error, tolerance = result.worst
    assert ABSOLUTE < error <= tolerance and "with rope in float32" in result.rule


@pytest.mark.slow
def test_the_same_table_undeclared_fails_at_1e_12() -> None:
    result = run_declared(Float32RopeUndeclared(), "float32 rope undeclared")
    assert isinstance(result.failure, NonConformance)
    assert "exceeds tolerance 1e-12" in str(result.failure)


@pytest.mark.slow
def test_a_declared_float32_softmax_passes() -> None:
    result = run_declared(Float32SoftmaxAdapter(), "float32 softmax")
    assert result.failure is None, result.failure
    error, tolerance = result.worst
    assert ABSOLUTE < error <= tolerance and "with softmax in float32" in result.rule


@pytest.mark.slow
def test_a_float16_rope_table_declared_float32_fails() -> None:
    with np.errstate(over="ignore"):  # float16 cannot hold bases above 65504: the table is wrong twice over
        result = run_declared(Float16RopeClaimingFloat32(), "float16 rope")
    assert isinstance(result.failure, NonConformance)
    assert "exceeds tolerance" in str(result.failure) and "exceeds tolerance 1e-12" not in str(result.failure)


def test_storage_is_a_declaration_about_layer_caches_only() -> None:
    """A quantized adapter's decoder, store and paged pool are judged by its dtype rule: the session machine once
    crashed on the storage judge (it has no stored computation to give)."""
    from impl.conformance import make_fp8_adapter
    from kvcache_conformance.judge.tolerance import Judge
    from kvcache_conformance.oracle import FLOAT64
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine

    adapter = make_fp8_adapter()
    assert Judge.for_adapter(adapter, FLOAT64).storage is not None
    assert Judge.for_adapter(adapter, FLOAT64, layer_caches=False).storage is None
    result = run_machine("session", adapter, property_id="storage-session",
                         settings=profiles.settings_for("ci", database=None, max_examples=5))
    assert result.failure is None, result.failure


def test_storage_and_the_float64_claim_contradict(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from impl.conformance import make_fp8_adapter
    from kvcache_conformance.run import selection

    claiming = make_fp8_adapter()
    claiming.capabilities = claiming.capabilities | {"float64"}
    module = type(sys)("kv_test_storage_claims")
    module.make = lambda: claiming  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kv_test_storage_claims", module)
    with pytest.raises(selection.AdapterLoadError, match="which is it"):
        selection.load_adapter("kv_test_storage_claims:make")


def test_a_float32_rotation_rounds_the_rotated_features_and_keeps_the_rest() -> None:
    vector = [0.1 + 1e-9, -0.7 + 3e-10, 0.3 + 1e-11, 0.9 + 7e-12]
    rope = RopeConfig("interleaved", 10000.0, 2, 64)  # rotates features 0 and 1 only
    table_only = rope_rotate(vector, 5, rope, mixed_precision({"rope": "float32"}))
    rotation = rope_rotate(vector, 5, rope, mixed_precision({"rotation": "float32"}))
    exact = rope_rotate(vector, 5, rope, FLOAT64)
    assert rotation[2:] == vector[2:]  # past the rotary width: untouched, still float64
    assert all(float(np.float32(v)) == v for v in rotation[:2])  # rotated in float32, then back
    assert table_only[:2] != rotation[:2] and all(abs(a - b) < 1e-6 for a, b in zip(rotation, exact))
    with pytest.raises(ValueError, match="rotation"):
        mixed_precision({"rope": "float32", "rotation": "float32"})


def test_float32_transcendentals_round_the_functions_and_nothing_else() -> None:
    """exp, cos, sin and tanh take the argument rounded to float32 and give float32's result; the arithmetic
    around them, and sqrt, stay float64."""
    numbers = mixed_precision({"transcendentals": "float32"})
    assert numbers.name == "float64 with transcendentals in float32" and numbers.components == ()
    x = 0.5 + 1e-12
    for function, exact in ((numbers.exp, np.exp), (numbers.cos, np.cos), (numbers.sin, np.sin),
                            (numbers.tanh, np.tanh)):
        assert function(x) == float(exact(np.float32(x))) and function(x) != float(exact(x))
    assert numbers.sqrt(2.0) == FLOAT64.sqrt(2.0) and numbers.number(x) == x
    both = mixed_precision({"transcendentals": "float32", "softmax": "bfloat16"})
    assert both.component("softmax").name == "bfloat16" and both.exp(x) == numbers.exp(x)


@pytest.mark.slow
def test_declared_float32_transcendentals_pass_and_float16_ones_fail() -> None:
    result = run_declared(Float32TranscendentalsAdapter(), "float32 transcendentals")
    assert result.failure is None, result.failure
    error, tolerance = result.worst
    assert ABSOLUTE < error <= tolerance and "with transcendentals in float32" in result.rule
    with np.errstate(over="ignore"):
        result = run_declared(Float16TranscendentalsClaimingFloat32(), "float16 transcendentals")
    assert isinstance(result.failure, NonConformance)
    assert "exceeds tolerance" in str(result.failure) and "exceeds tolerance 1e-12" not in str(result.failure)


def test_affine_groups_store_each_token_group_on_its_own_grid() -> None:
    from impl.storage import StorageRule
    from kvcache_conformance.oracle import StorageFormat

    rows = np.random.default_rng(7).normal(size=(2, 2, 5, 8)) * np.array([1.0] * 4 + [100.0] * 4)
    rule = StorageFormat("uint4", "per_group", group=4)
    stored, steps = rule.stored(rows), rule.steps(rows)
    grouped = rows.reshape(2, 2, 5, 2, 4)
    expected_steps = (grouped.max(-1) - grouped.min(-1)) / 15
    assert np.allclose(steps.reshape(2, 2, 5, 2, 4), expected_steps[..., None])
    assert np.all(np.abs(stored - rows) <= steps / 2 * (1 + 1e-12))  # nearest level, never past half a step
    assert np.array_equal(stored.reshape(grouped.shape).min(-1), grouped.min(-1))  # each end is a level
    assert np.allclose(rule.stored(stored), stored, rtol=0, atol=1e-12)  # re-quantizing keeps it
    # the first token's first group is a group of its own: a huge value elsewhere does not coarsen it
    assert np.max(steps[..., :4]) < np.min(steps[..., 4:])
    assert np.allclose(StorageRule("uint4", "per_group", group=4).round(rows, np.ones(1)), stored, rtol=0,
                       atol=1e-12)  # the reference stores what the oracle says
    equal = np.full((1, 1, 1, 4), 3.25)
    assert np.array_equal(rule.stored(equal), equal)
    coarse = StorageFormat("uint4", "per_group", group=4, min_step=1e-4)
    tiny = np.array([0.0, 1e-6, 2e-6, 3e-5]).reshape(1, 1, 1, 4)
    assert np.array_equal(coarse.stored(tiny), np.array([0.0, 0.0, 0.0, 0.0]).reshape(1, 1, 1, 4))
    assert np.all(coarse.steps(tiny) == 1e-4)


def test_a_zero_point_on_a_level_holds_zero_exactly_and_every_element_within_half_a_step() -> None:
    from impl.storage import StorageRule
    from kvcache_conformance.oracle import StorageFormat

    rows = np.random.default_rng(11).normal(size=(2, 2, 6, 8)) + np.array([0.0] * 4 + [5.0] * 4)  # one sign: 4..8
    rows[0, 0, 0, :4] = [0.0, -1.0, 0.3, 2.0]
    rule = StorageFormat("uint4", "per_group", group=4, zero_point="level")
    stored, steps = rule.stored(rows), rule.steps(rows)
    grouped = rows.reshape(2, 2, 6, 2, 4)
    widened = np.maximum(grouped.max(-1), 0.0) - np.minimum(grouped.min(-1), 0.0)
    assert np.allclose(steps.reshape(grouped.shape), (widened / 15)[..., None])  # the range widened to hold 0
    assert np.all(np.abs(stored - rows) <= steps / 2 * (1 + 1e-12))  # the far end clipped, within half a step
    assert stored[0, 0, 0, 0] == 0.0  # 0 is a level
    zero = np.rint(-np.minimum(grouped.min(-1, keepdims=True), 0.0) / steps.reshape(grouped.shape))
    levels = stored.reshape(grouped.shape) / steps.reshape(grouped.shape) + zero
    assert np.allclose(levels, np.rint(levels), rtol=0, atol=1e-9) and levels.min() > -1e-9 and levels.max() < 15 + 1e-9
    assert np.array_equal(StorageRule("uint4", "per_group", group=4, zero_point="level").round(rows, np.ones(1)),
                          stored)  # the reference, written apart, stores what the oracle says
    minimum = StorageFormat("uint4", "per_group", group=4)
    assert np.max(np.abs(stored - minimum.stored(rows)) / minimum.steps(rows)) > 0.5  # not the minimum's grid


@pytest.mark.parametrize("format, levels", [("uint2", 3), ("uint3", 7), ("uint4", 15), ("uint8", 255)])
def test_the_larger_extreme_exact_holds_zero_on_a_level_and_every_element_within_one_step(format: str,
                                                                                           levels: int) -> None:
    from impl.storage import StorageRule
    from kvcache_conformance.oracle import StorageFormat

    rows = np.random.default_rng(13).normal(size=(2, 2, 400, 8)) + np.array([0.0] * 4 + [5.0] * 4)  # one sign: 4..8
    rows[0, 0, 0, :4] = [-1.0, 0.2, 0.5, 1.0]  # hi = -lo: the far end falls a whole step short
    rows[0, 0, 1, 4:] = [-0.3] * 4  # a constant group is its one value
    rule = StorageFormat(format, "per_group", group=4, zero_point="extreme")
    stored, steps = rule.stored(rows), rule.steps(rows)
    grouped, kept = rows.reshape(2, 2, 400, 2, 4), stored.reshape(2, 2, 400, 2, 4)
    low, high = grouped.min(-1), grouped.max(-1)
    extreme = np.where(np.abs(low) > np.abs(high), low, high)
    count = np.rint(np.abs(extreme) / np.where(high > low, (high - low) / levels, 1.0))
    at_extreme = np.take_along_axis(kept, np.argmax(grouped == extreme[..., None], axis=-1)[..., None], -1)[..., 0]
    assert np.array_equal(at_extreme, extreme)  # the extreme of larger magnitude is exact
    varied = high > low
    whole = np.abs(extreme) / np.maximum(count, 1.0)  # 0 is a whole number of steps from the extreme
    assert np.allclose(steps.reshape(kept.shape)[..., 0][varied], whole[varied])
    on_levels = (kept - extreme[..., None]) / steps.reshape(kept.shape)
    assert np.allclose(on_levels, np.rint(on_levels), rtol=0, atol=1e-9)
    errors = np.abs(stored - rows) / steps
    assert errors.max() <= 1 + 1e-9 and errors[0, 0, 0, 0] == pytest.approx(1.0)  # a step, where hi = -lo
    signed = -extreme / np.where(count > 0, count, 1.0)  # the step from the extreme towards the other end
    past = (grouped - extreme[..., None]) / signed[..., None] > levels + 0.5  # beyond the grid's last level
    assert np.all(errors.reshape(kept.shape)[~past] <= 0.5 + 1e-9)  # all else within half a step
    assert np.all(((low < 0) & (high > 0))[np.any(past, axis=-1)])  # only a mixed-sign group falls short
    assert np.array_equal(stored[0, 0, 1, 4:], rows[0, 0, 1, 4:])
    guarded = StorageFormat(format, "per_group", group=4, min_step=1e-6, zero_point="extreme")
    tiny = np.array([1e-7, -3e-7, 2e-7, 0.0]).reshape(1, 1, 1, 4)  # under half a step from 0: reads back as 0
    assert not np.any(guarded.stored(tiny)) and np.all(guarded.steps(tiny) == 1e-6)
    assert not np.any(StorageRule(format, "per_group", group=4, min_step=1e-6, zero_point="extreme").round(
        tiny, np.ones(1)))
    assert np.allclose(StorageRule(format, "per_group", group=4, zero_point="extreme").round(rows, np.ones(1)), stored,
                       rtol=0, atol=1e-12)  # the reference, written apart as mlx's quantizer, stores what it says
    for other in ("minimum", "level"):
        assert not np.allclose(StorageFormat(format, "per_group", group=4, zero_point=other).stored(rows), stored)


@pytest.mark.parametrize("storage, complaint", [
    ({"format": "uint4", "scale": "per_group", "group": 4, "zero_point": "middle"}, "zero_point must be one of"),
    ({"format": "int8", "scale": "per_channel", "zero_point": "extreme"}, "belong to a per_group scale"),
    ({"format": "int8", "scale": "per_channel", "zero_point": "level"}, "belong to a per_group scale"),
    ({"format": "uint4", "scale": "per_group"}, "per_group needs group"),
    ({"format": "uint4", "scale": "per_group", "group": "4"}, "per_group needs group"),
    ({"format": "uint4", "scale": "per_group", "group": 0}, "per_group needs group"),
    ({"format": "uint4", "scale": "per_tensor"}, "per_group scales go with the affine formats"),
    ({"format": "int4", "scale": "per_group", "group": 4}, "an integer format"),
    ({"format": "uint4", "scale": "per_group", "group": 4, "update": "frozen"}, "nothing to freeze"),
    ({"format": "uint4", "scale": "per_group", "group": 4, "min_step": -1.0}, "min_step must be"),
    ({"format": "int8", "scale": "per_channel", "group": 4}, "belong to a per_group scale"),
])
def test_a_malformed_affine_declaration_is_refused_with_its_reason(storage: dict[str, Any], complaint: str) -> None:
    from kvcache_conformance.protocol.declarations import declared_storage

    class Declaring:
        pass

    adapter = Declaring()
    adapter.storage = storage  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=complaint):
        declared_storage(adapter)
