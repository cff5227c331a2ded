"""Closed-form cases of the oracle, in float64 and mpmath."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from kvcache_conformance.oracle import (
    FLOAT64,
    AttentionWeights,
    OracleInputError,
    RopeConfig,
    full_prefix_attention,
    mpmath_precision,
    rope_rotate,
)

NUMBER_SYSTEMS = [FLOAT64, mpmath_precision(40)]


def random_weights(rng: np.random.Generator, model_width: int = 5, heads: int = 4, kv_heads: int = 2,
                   head_width: int = 6) -> AttentionWeights:
    q, kv = heads * head_width, kv_heads * head_width
    return AttentionWeights(rng.uniform(-1, 1, (model_width, q)), rng.uniform(-1, 1, (model_width, kv)),
                            rng.uniform(-1, 1, (model_width, kv)), rng.uniform(-1, 1, (q, model_width)),
                            heads=heads, kv_heads=kv_heads)


def heads_of(row: np.ndarray, heads: int, head_width: int) -> np.ndarray:
    return row.reshape(heads, head_width)


@pytest.mark.parametrize("numbers", NUMBER_SYSTEMS, ids=lambda n: n.name)
@pytest.mark.parametrize("style", ["interleaved", "half_split"])
def test_single_position_outputs_its_own_value(numbers, style: str) -> None:
    rng = np.random.default_rng(1)
    w = random_weights(rng)
    x = rng.uniform(-1, 1, (2, 1, 5))
    trace = full_prefix_attention(x, w, RopeConfig(style, 10000.0, 4, 8), numbers=numbers)
    # one key: weight 1; RoPE at position 0 is the identity
    values = x[:, 0] @ w.wv  # [B, KV*dh]
    merged = np.repeat(values.reshape(2, 2, 1, 6), 2, axis=2).reshape(2, 24)  # query head h reads kv h // 2
    np.testing.assert_allclose(trace.outputs[:, 0], merged @ w.wo, atol=1e-14)
    np.testing.assert_allclose(trace.keys[:, :, 0].reshape(2, 12), x[:, 0] @ w.wk, atol=1e-15)


@pytest.mark.parametrize("numbers", NUMBER_SYSTEMS, ids=lambda n: n.name)
def test_identical_keys_average_the_values(numbers) -> None:
    rng = np.random.default_rng(2)
    w = random_weights(rng)
    w = AttentionWeights(w.wq, np.zeros_like(w.wk), w.wv, w.wo, heads=4, kv_heads=2)  # every key is 0
    x = rng.uniform(-1, 1, (1, 5, 5))
    trace = full_prefix_attention(x, w, RopeConfig("half_split", 500000.0, 6, 16), numbers=numbers)
    for i in range(5):
        mean_value = (x[0, :i + 1] @ w.wv).mean(axis=0).reshape(2, 1, 6)
        merged = np.repeat(mean_value, 2, axis=1).reshape(24)
        np.testing.assert_allclose(trace.outputs[0, i], merged @ w.wo, atol=1e-14)


@pytest.mark.parametrize("numbers", NUMBER_SYSTEMS, ids=lambda n: n.name)
@pytest.mark.parametrize("style", ["interleaved", "half_split"])
def test_rope_at_position_zero_is_the_identity(numbers, style: str) -> None:
    vector = [numbers.number(v) for v in np.random.default_rng(3).uniform(-1, 1, 8)]
    assert rope_rotate(vector, 0, RopeConfig(style, 10000.0, 8, 4), numbers) == vector


@pytest.mark.parametrize("numbers", NUMBER_SYSTEMS, ids=lambda n: n.name)
def test_rope_rotates_pairs_preserving_norms_and_relative_positions(numbers) -> None:
    rng = np.random.default_rng(4)
    rope = RopeConfig("interleaved", 100.0, 6, 64)
    q, k = ([numbers.number(v) for v in rng.uniform(-1, 1, 8)] for _ in range(2))
    rotated = rope_rotate(q, 9, rope, numbers)
    for i in range(3):  # each rotated pair keeps its length; features past r are untouched
        assert math.isclose(float(q[2 * i] ** 2 + q[2 * i + 1] ** 2),
                            float(rotated[2 * i] ** 2 + rotated[2 * i + 1] ** 2), rel_tol=1e-14)
    assert rotated[6:] == q[6:]

    def dot(p: int, s: int) -> float:
        a, b = rope_rotate(q, p, rope, numbers), rope_rotate(k, s, rope, numbers)
        return float(sum(x * y for x, y in zip(a, b)))

    assert math.isclose(dot(10, 3), dot(50, 43), rel_tol=1e-12)  # only p - s matters


def test_the_two_pairings_agree_after_the_feature_permutation() -> None:
    """half_split(x) == interleaved(x[perm])[inverse], with perm taking (i, i + r/2) to (2i, 2i + 1)."""
    rng = np.random.default_rng(5)
    head_width, r = 8, 6
    perm = np.arange(head_width)  # interleaved feature j reads half-split feature perm[j]
    perm[0:r:2], perm[1:r:2] = np.arange(r // 2), np.arange(r // 2) + r // 2
    x = list(rng.uniform(-1, 1, head_width))
    half = rope_rotate(x, 7, RopeConfig("half_split", 10000.0, r, 16), FLOAT64)
    inter = rope_rotate([x[p] for p in perm], 7, RopeConfig("interleaved", 10000.0, r, 16), FLOAT64)
    assert [half[p] for p in perm] == inter

    # the whole layer: permute the rotary columns of Wq and Wk in every head
    w = random_weights(rng, heads=2, kv_heads=1, head_width=head_width)
    columns = lambda n: np.concatenate([h * head_width + perm for h in range(n)])  # noqa: E731
    permuted = AttentionWeights(w.wq[:, columns(2)], w.wk[:, columns(1)], w.wv, w.wo, heads=2, kv_heads=1)
    x3 = rng.uniform(-1, 1, (2, 6, 5))
    a = full_prefix_attention(x3, w, RopeConfig("half_split", 10000.0, r, 16))
    b = full_prefix_attention(x3, permuted, RopeConfig("interleaved", 10000.0, r, 16))
    np.testing.assert_allclose(a.outputs, b.outputs, atol=1e-13)


def test_window_of_one_sees_only_itself() -> None:
    rng = np.random.default_rng(6)
    w = random_weights(rng, heads=2, kv_heads=2)
    x = rng.uniform(-1, 1, (1, 4, 5))
    trace = full_prefix_attention(x, w, RopeConfig("interleaved", 10000.0, 6, 8), window=1)
    np.testing.assert_allclose(trace.outputs[0], (x[0] @ w.wv) @ w.wo, atol=1e-14)


def test_mpmath_precision_is_local() -> None:
    before = mpmath.mp.dps
    numbers = mpmath_precision(60)
    x = np.random.default_rng(7).uniform(-1, 1, (1, 3, 5))
    full_prefix_attention(x, random_weights(np.random.default_rng(8)), RopeConfig("interleaved", 10.0, 6, 4),
                          numbers=numbers)
    assert mpmath.mp.dps == before
    assert abs(float(numbers.sqrt(numbers.number(2.0)) ** 2 - 2)) < 1e-58


@pytest.mark.parametrize("bad", [
    lambda: RopeConfig("spiral", 10000.0, 4, 8),  # type: ignore[arg-type]
    lambda: RopeConfig("interleaved", 0.0, 4, 8),
    lambda: RopeConfig("interleaved", 10000.0, 3, 8),
    lambda: RopeConfig("interleaved", 10000.0, 4, 0),
    lambda: rope_rotate([1.0, 2.0], 8, RopeConfig("interleaved", 10000.0, 2, 8), FLOAT64),
    lambda: AttentionWeights(np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((4, 2)), heads=2,
                             kv_heads=3),
    lambda: mpmath_precision(8),
])
def test_the_oracle_rejects_what_is_outside_its_conventions(bad) -> None:
    with pytest.raises((OracleInputError, ValueError)):
        bad()
