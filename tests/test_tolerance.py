"""The per-dtype rules: float64 never loosens; the low-precision rule passes an honest float32
implementation and fails one that quietly loses precision."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from examples.minimal_adapter import Float32Adapter
from oracle import FLOAT64, AttentionWeights, RopeConfig, full_prefix_attention, numpy_precision
from properties import profiles
from properties.runner import run_machine
from properties.tolerance import ABSOLUTE, FACTOR, FLOOR_ULPS, Judge
from properties.verdict import NonConformance

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
    truth, naive = np.array([3.0, -0.5]), np.array([3.0 + 1e-6, -0.5])
    judge = Judge("float32", FLOAT64)
    assert judge.tolerance(truth, naive) == pytest.approx(FACTOR * 1e-6 + FLOOR_ULPS * 2.0**-23 * 3.0, rel=1e-9)
    assert Judge("float64", FLOAT64).tolerance(truth, naive) == ABSOLUTE
    assert "2 x |error of the naive float32" in judge.rule and "1e-12" in Judge("float64", FLOAT64).rule


def test_the_naive_baseline_rounds_every_operation_to_its_dtype() -> None:
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (4, 4))
    weights, rope = AttentionWeights(w, w.T.copy(), w, w, heads=1, kv_heads=1), RopeConfig("interleaved", 1e4, 4, 16)
    x = rng.uniform(-1, 1, (1, 6, 4))
    exact = full_prefix_attention(x, weights, rope).outputs
    errors = {d: float(np.abs(full_prefix_attention(x, weights, rope, numbers=numpy_precision(d)).outputs
                              - exact).max()) for d in ("float32", "float16", "bfloat16")}
    assert 0 < errors["float32"] < 1e-5 < errors["float16"] < errors["bfloat16"] < 0.5


def test_an_honest_float32_implementation_passes() -> None:
    result = run_machine("layer_cache", Float32Adapter(), property_id="float32", parameters=MHA, settings=CI)
    assert result.failure is None, result.failure
    error, tolerance = result.worst
    assert 0 < error <= tolerance and "float32" in result.rule


def test_float16_storage_in_a_float32_implementation_fails() -> None:
    result = run_machine("layer_cache", StoresKeysInFloat16(), property_id="f16 keys", parameters=MHA, settings=CI)
    assert isinstance(result.failure, NonConformance)
    assert "cached logical keys" in str(result.failure) and "exceeds tolerance" in str(result.failure)


def test_float64_is_never_loosened_for_a_float32_computation() -> None:
    result = run_machine("layer_cache", Float32ClaimingFloat64(), property_id="claims float64", parameters=MHA,
                         settings=CI)
    assert isinstance(result.failure, NonConformance)
    assert "exceeds tolerance 1e-12" in str(result.failure)
