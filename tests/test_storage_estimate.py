"""The whole-model storage rule's estimate (docs/spec.md §15.6, change 54): it bounds what any correct store may
do, not what one store happened to do.

A correct engine's cache differs from the oracle's naive store by its own level decisions (made on float32
inputs, either way of a near tie), its scale's float16 rounding and a key re-quantized at every move; those are
what ``StorageFormat.error_bounds`` and ``rounding.EstimatedStorage`` carry through the computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from impl.storage import stored_in_blocks
from kvcache_conformance.judge.tolerance import FACTOR, Judge
from kvcache_conformance.oracle import FLOAT64
from kvcache_conformance.oracle.model import CellContext, Model, full_model, kv_storage_of
from kvcache_conformance.oracle.model_config import ContextConfig, ModelBatch, ModelConfig, random_model_weights
from kvcache_conformance.oracle.rounding import EstimatedStorage, rounding_errors
from kvcache_conformance.oracle.storage import StorageFormat

FORMATS = [StorageFormat("q8_0", "per_block"), StorageFormat("q4_0", "per_block"), StorageFormat("float16"),
           StorageFormat("uint4", "per_group", group=4), StorageFormat("uint4", "per_group", group=4,
                                                                      zero_point="extreme"),
           StorageFormat("uint4", "per_group", group=8, zero_point="level")]


@pytest.mark.parametrize("rule", FORMATS, ids=lambda rule: f"{rule.format}-{rule.scale}-{rule.zero_point}")
def test_every_element_of_the_canonical_store_is_within_its_bound(rule: StorageFormat) -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = rng.normal(0, rng.uniform(0.01, 10), (2, 64)) + rng.uniform(-1, 1)
        bounds = rule.error_bounds(rows)
        assert bounds.shape == rows.shape
        assert np.all(np.abs(rule.stored(rows.reshape(1, 1, 2, 64)).reshape(rows.shape) - rows) <= bounds)
        assert np.all(bounds >= rule.steps(rows.reshape(1, 1, 2, 64)).reshape(rows.shape) / 2)


@pytest.mark.parametrize("format", ["q8_0", "q4_0"])
def test_llama_cpp_s_float32_store_is_within_the_bound(format: str) -> None:
    """The reference's store (levels found in float32, as ggml's ``quantize_row_*_ref``) of rows rounded to float32
    first -- what an engine computing in float32 stores -- is within the bound of the float64 rows."""
    rule, rng = StorageFormat(format, "per_block"), np.random.default_rng(1)
    for _ in range(200):
        rows = rng.normal(0, rng.uniform(0.01, 10), (4, 32))
        engine = stored_in_blocks(rows.astype(np.float32), format).astype(np.float64)
        assert np.all(np.abs(engine - rows) <= rule.error_bounds(rows) + 1e-7 * np.abs(rows).max())


def test_a_key_re_quantized_at_each_move_carries_one_bound_per_quantization() -> None:
    numbers = rounding_errors("float32", whole_model=True)
    storage = kv_storage_of(StorageFormat("q8_0", "per_block"), numbers)
    assert isinstance(storage, EstimatedStorage)
    row = [numbers.number(v) for v in np.random.default_rng(2).normal(0, 1, 32)]
    once, four = storage(row), storage(row, 4)
    for a, b in zip(once, four):
        assert numbers.to_float(b) == pytest.approx(2 * numbers.to_float(a), rel=1e-3)


def test_the_softmax_estimate_bounds_perturbed_scores() -> None:
    """Scores perturbed within their errors move each probability by at most the estimate (first order, scores
    of errors up to 0.5)."""
    numbers = rounding_errors("float32", whole_model=True)
    assert numbers.softmax is not None
    rng = np.random.default_rng(3)
    for _ in range(300):
        values, errors = rng.normal(0, 3, 6), rng.uniform(0, 0.5, 6)
        from kvcache_conformance.oracle.rounding import Estimated
        scores = [Estimated(float(v), float(e), numbers.number(1.0).rounding) for v, e in zip(values, errors)]
        estimate = np.array([p.settled() for p in numbers.softmax(scores)])
        exact = np.exp(values - values.max())
        exact /= exact.sum()
        for _ in range(20):
            moved = values + rng.uniform(-1, 1, 6) * errors
            p = np.exp(moved - moved.max())
            p /= p.sum()
            assert np.all(np.abs(p - exact) <= 2 * estimate + 1e-12)
            assert np.all(estimate <= np.maximum(exact, 1 - exact) + 1e-6)


def test_an_rms_norm_of_a_state_near_zero_stays_bounded() -> None:
    """The first-order estimate through an RMSNorm of a state whose error exceeds its size is infinite (the
    divisor's room is gone); every evaluation still lies within sqrt(d) |w|, which bounds it."""
    from kvcache_conformance.oracle.model import rms_norm
    from kvcache_conformance.oracle.rounding import Estimated

    numbers = rounding_errors("float32", whole_model=True)
    rounding = numbers.number(1.0).rounding
    x = [Estimated(1e-4, 1.0, rounding), Estimated(-2e-4, 1.0, rounding)]
    w = [numbers.number(1.5), numbers.number(0.5)]
    out = rms_norm(x, w, 1e-5, numbers)
    errors = [v.settled() for v in out]
    assert all(math.isfinite(e) for e in errors)
    assert errors[0] <= abs(out[0].value) + math.sqrt(2) * 1.5 + 1e-6
    plain = rms_norm(x, w, 1e-5, rounding_errors("float32"))  # the dtype's own rule: no clamp
    assert not math.isfinite(plain[0].settled())


def test_moves_are_counted_through_shifts_divides_copies_saves_and_loads() -> None:
    config = ModelConfig(vocab=8, model_width=4, layers=1, heads=1, kv_heads=1, head_width=4, ffn_width=4)
    model = Model(config, random_model_weights(config, 0))
    context = CellContext(model, ContextConfig(cells=16, max_sequences=3), shared_copies=False)
    context.decode(ModelBatch.of_sequence(0, [1, 2, 3], 0))
    context.shift(0, 1, -1, 2)  # positions 1, 2 move
    context.shift(0, 0, 1, 0)  # a shift by 0 moves nothing
    context.divide(0, -1, -1, 1)  # nor a divide by 1
    context.divide(0, -1, -1, 2)  # 0 -> 0 stays, 3 -> 1, 4 -> 2
    assert [c.moves for c in context.cells_of(0)] == [0, 2, 2]
    context.copy(0, 1, -1, -1)
    assert [c.moves for c in context.cells_of(1)] == [0, 2, 2]
    saved = context.save(0)
    context.load(2, saved)
    assert [c.moves for c in context.cells_of(2)] == [0, 2, 2]


def _random_store(rule: StorageFormat, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    """A correct store of another engine: every element off by up to half a step, its own way."""
    def stored(row: list[float]) -> list[float]:
        x = np.array(row, dtype=np.float64)
        return list(x + rng.uniform(-1, 1, x.shape) * rule.steps(x.reshape(1, 1, 1, -1)).ravel() / 2)
    return stored


@pytest.mark.parametrize("rule", [StorageFormat("q8_0", "per_block"), StorageFormat("uint4", "per_group", group=4)],
                         ids=["q8_0", "uint4"])
def test_correct_stores_of_every_kind_are_within_the_rule(rule: StorageFormat) -> None:
    """Many correct stores of one model (each element off by up to half a step, independently): every token's
    logits within the per-token tolerance; a store a full step off everywhere (twice as coarse) comes more than
    twice as close to it (q8_0: 1.03 against 0.45, outside; uint4: 0.76 against 0.32)."""
    config = ModelConfig(vocab=10, model_width=8, layers=2, heads=2, kv_heads=1, head_width=32, ffn_width=16)
    weights = random_model_weights(config, 4)
    tokens = [3, 1, 4, 1, 5, 9]
    truth = full_model(tokens, config, weights)
    numbers = rounding_errors("float32", whole_model=True)
    estimate = full_model(tokens, config, weights, numbers=numbers, kv_storage=kv_storage_of(rule, numbers))
    judge = Judge("float32", FLOAT64, storage=rule, estimates_storage=True)
    tolerance = np.asarray(judge.tolerance(truth, estimate))
    assert tolerance.shape == (len(tokens), 1)
    rng = np.random.default_rng(5)
    worst = max(float(np.max(np.abs(full_model(tokens, config, weights, kv_storage=_random_store(rule, rng)) - truth)
                             / tolerance)) for _ in range(25))
    print(f"{rule.format}: worst correct store {worst:.3f}")
    assert worst <= 1.0
    coarse = StorageFormat(rule.format, rule.scale, group=rule.group)

    def twice(row: list[float]) -> list[float]:
        x = np.array(row, dtype=np.float64)
        steps = coarse.steps(x.reshape(1, 1, 1, -1)).ravel()
        return list(x + rng.choice([-1.0, 1.0], x.shape) * steps)  # a full step off: a store twice as coarse
    coarser = max(float(np.max(np.abs(full_model(tokens, config, weights, kv_storage=twice) - truth) / tolerance))
                  for _ in range(10))
    print(f"{rule.format}: worst store a full step off {coarser:.3f}")
    assert coarser > 2 * worst  # twice the worst correct store's error / tolerance, at the least
    assert FACTOR == 2.0
