"""The reference implementation beyond what the machine sees: AdamW, long prefixes, errors."""

from __future__ import annotations

import numpy as np
import pytest

from impl import AdamW, AttentionLayer, LayerKvCache, RopeConfig, errors
from kvcache_conformance.oracle import AttentionWeights, full_prefix_attention
from kvcache_conformance.oracle import RopeConfig as OracleRope


def make_layer(rng: np.random.Generator, style: str = "half_split", heads: int = 4, kv_heads: int = 2,
               head_width: int = 8, model_width: int = 12, rotary_width: int = 6,
               max_positions: int = 128) -> AttentionLayer:
    q, kv = heads * head_width, kv_heads * head_width
    return AttentionLayer.from_arrays(
        rng.uniform(-0.5, 0.5, (model_width, q)), rng.uniform(-0.5, 0.5, (model_width, kv)),
        rng.uniform(-0.5, 0.5, (model_width, kv)), rng.uniform(-0.5, 0.5, (q, model_width)),
        heads=heads, kv_heads=kv_heads, rope=RopeConfig(style, 10000.0, rotary_width, max_positions))


@pytest.mark.parametrize("style", ["interleaved", "half_split"])
def test_long_incremental_run_equals_full_recomputation_and_the_oracle(style: str) -> None:
    rng = np.random.default_rng(11)
    layer = make_layer(rng, style)
    x = rng.uniform(-1, 1, (2, 40, 12))
    cache = LayerKvCache(layer, 2, 40)
    cached = np.concatenate([layer.forward_incremental(x[:, t:t + 1], cache) for t in range(40)], axis=1)
    np.testing.assert_allclose(cached, layer.forward_full(x), atol=1e-12, rtol=0)
    weights = AttentionWeights(*(p.value.copy() for p in layer.parameters), heads=4, kv_heads=2)
    trace = full_prefix_attention(x, weights, OracleRope(style, 10000.0, 6, 128))
    np.testing.assert_allclose(cached, trace.outputs, atol=1e-12, rtol=0)
    np.testing.assert_allclose(cache.keys(), trace.keys, atol=1e-12, rtol=0)
    np.testing.assert_allclose(cache.values(), trace.values, atol=1e-12, rtol=0)


def test_adamw_updates_in_place_and_makes_old_caches_stale_even_after_reset() -> None:
    rng = np.random.default_rng(12)
    layer = make_layer(rng)
    cache = LayerKvCache(layer, 1, 4)
    row = rng.uniform(-1, 1, (1, 1, 12))
    layer.forward_incremental(row, cache)
    parameters = layer.parameters
    addresses = [p.value.__array_interface__["data"][0] for p in parameters]
    before = [p.value.copy() for p in parameters]
    AdamW(list(parameters), lr=1e-2).step([rng.normal(size=p.shape) for p in parameters])
    assert layer.parameters == parameters  # same objects
    assert [p.value.__array_interface__["data"][0] for p in parameters] == addresses  # same memory
    assert all(p.version == 1 for p in parameters)
    assert all(not np.array_equal(b, p.value) for b, p in zip(before, parameters))
    for _ in range(2):
        with pytest.raises(errors.CacheLayerRevisionMismatch) as rejected:
            layer.forward_incremental(row, cache)
        assert (rejected.value.parameter, rejected.value.cache, rejected.value.layer) == (0, 0, 1)
        assert "create a new cache" in str(rejected.value)
        cache.reset()  # does not refresh the binding
    fresh = LayerKvCache(layer, 1, 4)
    layer.forward_incremental(row, fresh)
    assert fresh.length == 1


def test_parameter_values_cannot_be_written_around_the_version() -> None:
    layer = make_layer(np.random.default_rng(13))
    with pytest.raises(ValueError):
        layer.wq.value[0, 0] = 1.0
    assert layer.wq.version == 0


@pytest.mark.parametrize("x, error", [
    (np.zeros((1, 1, 12), dtype=np.float32), errors.InputDtypeError),
    ([[[0.0] * 12]], errors.InputDtypeError),
    (np.zeros((1, 12)), errors.InputRankError),
    (np.zeros((1, 2, 12)), errors.TokenCountError),
    (np.zeros((2, 1, 12)), errors.InputBatchMismatch),
    (np.zeros((1, 1, 11)), errors.InputWidthMismatch),
    (np.full((1, 1, 12), np.nan), errors.NonFiniteInput),
    (np.full((1, 1, 12), 1e308), errors.NonFiniteError),
])
def test_rejected_rows_raise_typed_errors_and_change_nothing(x: object, error: type[Exception]) -> None:
    layer = make_layer(np.random.default_rng(14))
    cache = LayerKvCache(layer, 1, 3)
    layer.forward_incremental(np.full((1, 1, 12), 0.5), cache)
    before = (cache.length, cache.key_storage.tobytes(), cache.value_storage.tobytes())
    with pytest.raises(error) as rejected:
        layer.forward_incremental(x, cache)  # type: ignore[arg-type]
    assert isinstance(rejected.value, errors.KvCacheError)
    assert before == (cache.length, cache.key_storage.tobytes(), cache.value_storage.tobytes())


@pytest.mark.parametrize("batch, capacity, max_positions, error", [
    (0, 4, 8, errors.ZeroBatchSize),
    (1, 0, 8, errors.ZeroCapacity),
    (1, 9, 8, errors.CapacityExceedsPositions),
    (-1, 4, 8, errors.InvalidCacheArgument),
    (1, 2.0, 8, errors.InvalidCacheArgument),
    (1 << 40, 1 << 40, 1 << 62, errors.ElementCountOverflow),
    (1 << 24, 1 << 30, 1 << 62, errors.AllocationFailed),
])
def test_creation_errors(batch: int, capacity: int, max_positions: int, error: type[Exception]) -> None:
    layer = make_layer(np.random.default_rng(15), max_positions=max_positions)
    with pytest.raises(error) as rejected:
        LayerKvCache(layer, batch, capacity)
    assert isinstance(rejected.value, errors.KvCacheError) and str(rejected.value)


def test_reset_keeps_buffers_and_bytes() -> None:
    layer = make_layer(np.random.default_rng(16))
    cache = LayerKvCache(layer, 1, 3)
    layer.forward_incremental(np.full((1, 1, 12), 0.25), cache)
    keys, storage = cache._keys, cache.key_storage.tobytes()
    cache.reset()
    assert cache.length == 0 and cache._keys is keys and cache.key_storage.tobytes() == storage
    assert cache.keys().shape == (1, 2, 0, 8)


@pytest.mark.parametrize("bad", [
    lambda: RopeConfig("spiral", 10000.0, 4, 8),
    lambda: RopeConfig("interleaved", 10000, 4, 8),
    lambda: RopeConfig("interleaved", 10000.0, 5, 8),
    lambda: RopeConfig("interleaved", 10000.0, 4, 0),
    lambda: make_layer(np.random.default_rng(0), heads=3, kv_heads=2),
    lambda: make_layer(np.random.default_rng(0), rotary_width=10),
])
def test_invalid_configurations_are_typed_errors(bad) -> None:
    with pytest.raises(errors.KvCacheError):
        bad()
