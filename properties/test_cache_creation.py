"""docs/spec.md §4.2: creating a cache rejects a batch or capacity that is not a non-negative int,
zero batch, zero capacity, capacity above the RoPE position capacity, element-count
overflow and allocation failure, each with its own error kind; the boundary cases are
accepted and the cache starts empty."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcache_conformance import generate as s
from kvcache_conformance.generate.needs import LAYER_CONVENTION, ROPE_PAIRING, Needs
from kvcache_conformance.judge.calls import call
from kvcache_conformance.judge.checks import expect_rejection, expect_success, read_snapshot
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.oracle import RopeConfig
from kvcache_conformance.protocol.declarations import LayerLimits
from kvcache_conformance.protocol.kinds import Capability, ErrorKind, declared
from kvcache_conformance.protocol.layer import KvCacheAdapter
from kvcache_conformance.run import selection

MAX_INDEXABLE_BYTES = 2**63 - 1  # the largest byte count a 64-bit numpy array can index
UNMAPPABLE_BYTES = 2**58  # indexable, but above every x86-64/arm64 user address space (57 bits)


# What the properties need (the one gate, generate/needs.py): the claim, and a layer the adapter can build --
# for the position-capacity property a RoPE layer (a positionless one has no position capacity).
CREATION = Needs.of(Capability.CREATION_ERRORS, alternatives=[("layer convention", LAYER_CONVENTION)],
                    families=((None, None),))
ROPE_CREATION = Needs.of(Capability.CREATION_ERRORS, alternatives=[("RoPE pairing", ROPE_PAIRING)],
                         families=(("interleaved", None), ("half_split", None)))


def _gated(needs: Needs) -> KvCacheAdapter:
    adapter = selection.selected()
    problem = needs.problem(adapter)
    if problem is not None:
        pytest.skip(problem)
    return adapter


@pytest.fixture(scope="module")
def adapter() -> KvCacheAdapter:
    return _gated(CREATION)


@pytest.fixture(scope="module")
def rope_adapter() -> KvCacheAdapter:
    return _gated(ROPE_CREATION)


def _layer(adapter: KvCacheAdapter, config: s.LayerConfig, max_positions: int | None = None) -> Any:
    rope = config.rope
    if max_positions is not None and rope is not None:
        rope = RopeConfig(rope.style, rope.base, rope.rotary_width, max_positions)
    return expect_success(call(adapter, "create a layer", lambda: adapter.create_layer(config.weights, rope)),
                          "create a layer")


def _create(adapter: KvCacheAdapter, layer: Any, batch: Any, capacity: Any) -> Any:
    return call(adapter, f"create a cache of batch {batch}, capacity {capacity}",
                lambda: adapter.create_cache(layer, batch, capacity))


def configs(*, rope: bool = False) -> st.SearchStrategy[s.LayerConfig]:
    """Layers the implementation can build, of every family alike; with ``rope``, only RoPE layers. Deferred to
    when a property runs: one that does not apply is skipped by its fixture before anything is drawn."""
    def build() -> st.SearchStrategy[s.LayerConfig]:
        adapter = selection.selected()
        capabilities, limits = declared(adapter.capabilities), LayerLimits.of(adapter)
        families = tuple(f for f in s.layer_families(capabilities, limits) if f[0] != "none" or not rope)
        return s.layer_configs(capabilities, limits=limits, families=families)

    return st.deferred(build)


NOT_SIZES = st.one_of(st.integers(-(1 << 40), -1), st.booleans(), st.floats(allow_nan=True), st.just("2"),
                      st.just(None), st.just(np.int64(-1)))


@given(config=configs(), bad=NOT_SIZES, which=st.sampled_from(["batch", "capacity"]))
def test_a_batch_or_capacity_that_is_not_a_count_is_rejected(adapter: KvCacheAdapter, config: s.LayerConfig,
                                                             bad: Any, which: str) -> None:
    """Negative, bool, float, str, None: INVALID_ARGUMENT -- never a zero_* kind or a raw TypeError."""
    layer = _layer(adapter, config)
    batch, capacity = (bad, config.capacity) if which == "batch" else (config.batch_size, bad)
    expect_rejection(_create(adapter, layer, batch, capacity), ErrorKind.INVALID_ARGUMENT, f"{which} {bad!r}")


@given(config=configs(), data=st.data())
def test_zero_batch_and_zero_capacity_are_rejected(adapter: KvCacheAdapter, config: s.LayerConfig,
                                                   data: st.DataObject) -> None:
    layer = _layer(adapter, config)
    expect_rejection(_create(adapter, layer, 0, config.capacity), ErrorKind.ZERO_BATCH, "batch 0")
    expect_rejection(_create(adapter, layer, config.batch_size, 0), ErrorKind.ZERO_CAPACITY, "capacity 0")


@given(config=configs(rope=True), extra=st.integers(1, 1 << 20))
def test_capacity_is_bounded_by_rope_positions(rope_adapter: KvCacheAdapter, config: s.LayerConfig,
                                               extra: int) -> None:
    adapter = rope_adapter
    if LayerLimits.of(adapter).max_capacity is not None:
        pytest.skip(f"layer_limits bound the capacity ({LayerLimits.of(adapter).described()}): a capacity above "
                    "the RoPE positions is outside them")
    assert config.rope is not None
    layer = _layer(adapter, config)
    limit = config.rope.max_positions
    expect_rejection(_create(adapter, layer, config.batch_size, limit + extra),
                     ErrorKind.CAPACITY_EXCEEDS_POSITIONS, f"capacity {limit + extra} > max positions {limit}")
    if limit <= 4096:  # the boundary itself is accepted, and a new cache is empty
        cache = expect_success(_create(adapter, layer, config.batch_size, limit), f"capacity = max positions {limit}")
        snapshot = read_snapshot(adapter, cache, "a new cache", physical=False)
        if snapshot.length != 0:
            raise NonConformance(f"a new cache has length {snapshot.length}, but should be empty",
                                 kind="a new cache is not empty", check="length")


def _sized(adapter: KvCacheAdapter, config: s.LayerConfig, capacity: int, bytes_wanted: int) -> tuple[int, int]:
    """(batch, capacity) of at least ``bytes_wanted`` bytes of storage within the declared limits: a large batch
    (a large capacity where only the batch is limited); the property is skipped where both are."""
    limits = LayerLimits.of(adapter)
    per_row = config.weights.kv_heads * config.weights.head_width * 8  # bytes
    if limits.max_batch is not None and limits.max_capacity is not None:
        pytest.skip(f"layer_limits bound both the batch and the capacity ({limits.described()}): no cache that "
                    "large is within them")
    if limits.max_capacity is not None:
        capacity = min(capacity, limits.max_capacity)
        return -(-bytes_wanted // (per_row * capacity)), capacity
    if limits.max_batch is not None:
        return 1, -(-bytes_wanted // per_row)
    return -(-bytes_wanted // (per_row * capacity)), capacity


@given(config=configs(), capacity_bits=st.integers(31, 48), surplus=st.integers(0, 1000))
def test_element_count_overflow_is_rejected(adapter: KvCacheAdapter, config: s.LayerConfig,
                                            capacity_bits: int, surplus: int) -> None:
    """More bytes than an array can index: ELEMENT_COUNT_OVERFLOW, never a raw numpy error."""
    batch, capacity = _sized(adapter, config, 1 << capacity_bits, MAX_INDEXABLE_BYTES + 1)
    per_batch = config.weights.kv_heads * capacity * config.weights.head_width * 8  # bytes
    batch += surplus if LayerLimits.of(adapter).max_batch is None else 0
    layer = _layer(adapter, config, max_positions=1 << 62)
    expect_rejection(_create(adapter, layer, batch, capacity), ErrorKind.ELEMENT_COUNT_OVERFLOW,
                     f"{batch * per_batch} bytes of storage")


@given(config=configs(), capacity_bits=st.integers(20, 40))
def test_allocation_failure_is_a_typed_error(adapter: KvCacheAdapter, config: s.LayerConfig,
                                             capacity_bits: int) -> None:
    """Indexable but unmappable storage: ALLOCATION_FAILED, never a raw MemoryError."""
    batch, capacity = _sized(adapter, config, 1 << capacity_bits, UNMAPPABLE_BYTES)
    per_batch = config.weights.kv_heads * capacity * config.weights.head_width * 8
    assert batch * per_batch <= MAX_INDEXABLE_BYTES
    layer = _layer(adapter, config, max_positions=1 << 62)
    expect_rejection(_create(adapter, layer, batch, capacity), ErrorKind.ALLOCATION_FAILED,
                     f"{batch * per_batch} bytes of storage")
