"""The adapter protocol: the only way the suite reaches an implementation.

An adapter is any object with the attributes and methods of ``KvCacheAdapter``
(structural typing: nothing needs to be imported or subclassed). Layers and
caches are opaque handles the suite passes back to the adapter. Error kinds
and capabilities are plain strings, listed in ``ErrorKind`` and ``Capability``,
so an adapter need not import this module. See ``docs/adapters.md`` for a
minimal complete example.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from oracle import AttentionWeights, RopeConfig

__all__ = ["AttentionWeights", "CacheSnapshot", "Capability", "ErrorKind", "KvCacheAdapter", "RopeConfig"]


class ErrorKind(str, Enum):
    """What a rejected call was rejected for; adapters map their exceptions onto these.

    A step is validated in this order, and the first failing check decides the
    kind: dtype, rank, token count, batch, width, geometry, layer identity,
    parameter revision, RoPE configuration, free capacity, non-finite values.
    """

    DTYPE = "dtype"  # the input is not a float64 array
    RANK = "rank"  # the input is not [B, 1, D]-ranked
    TOKEN_COUNT = "token_count"  # not exactly one new token
    BATCH_MISMATCH = "batch_mismatch"  # input batch != cache batch
    WIDTH_MISMATCH = "width_mismatch"  # input width != model width
    GEOMETRY_MISMATCH = "geometry_mismatch"  # cache built for other widths or head counts
    LAYER_MISMATCH = "layer_mismatch"  # cache built for other parameter objects
    REVISION_MISMATCH = "revision_mismatch"  # parameters written in place since the cache was built
    ROPE_MISMATCH = "rope_mismatch"  # cache built under another RoPE configuration
    FULL = "full"  # no free row
    NON_FINITE = "non_finite"  # the input, a projection, the scores or the output is inf/NaN
    # cache creation
    ZERO_BATCH = "zero_batch"
    ZERO_CAPACITY = "zero_capacity"
    CAPACITY_EXCEEDS_POSITIONS = "capacity_exceeds_positions"
    ELEMENT_COUNT_OVERFLOW = "element_count_overflow"  # more bytes than an array can index
    ALLOCATION_FAILED = "allocation_failed"  # addressable, but the memory cannot be had


class Capability(str, Enum):
    """What an implementation claims; properties needing an absent one are skipped."""

    FLOAT64 = "float64"  # computes in float64: judged at 1e-12 absolute
    INPUT_VALIDATION = "input_validation"  # rejects bad dtype, rank, token count, batch, width
    NON_FINITE_REJECTION = "non_finite_rejection"  # rejects inf/NaN inputs and overflowing steps
    BINDING_CHECKS = "binding_checks"  # rejects other geometry, identity, revision, RoPE
    FIXED_CAPACITY = "fixed_capacity"  # preallocated capacity; a full cache rejects with FULL
    CREATION_ERRORS = "creation_errors"  # typed errors for bad batch/capacity/size at creation
    GQA = "gqa"  # kv_heads may divide heads (GQA, MQA), not only equal them
    ROPE_INTERLEAVED = "rope_interleaved"
    ROPE_HALF_SPLIT = "rope_half_split"
    PARTIAL_ROTARY = "partial_rotary"  # rotary width may be below head width
    PHYSICAL_STORAGE = "physical_storage"  # snapshots expose [B, KV, C, dh] buffers and their identity


@dataclass(frozen=True, eq=False)
class CacheSnapshot:
    """Everything observable about a cache, as copies the suite may keep.

    ``keys`` (rotated) and ``values`` (unrotated) are the logical prefix
    ``[B, KV, length, dh]``. With ``physical_storage``, ``physical_keys`` and
    ``physical_values`` are copies of the whole buffers ``[B, KV, C, dh]`` and
    ``buffer_identity`` is any hashable that changes iff a buffer is
    reallocated (e.g. the buffers' addresses); otherwise all three are None.
    """

    length: int
    keys: np.ndarray
    values: np.ndarray
    physical_keys: np.ndarray | None = None
    physical_values: np.ndarray | None = None
    buffer_identity: Hashable | None = None


@runtime_checkable
class KvCacheAdapter(Protocol):
    """Drives one KV-cache implementation for the suite.

    Every array the suite passes is float64 unless a test says otherwise, and
    the adapter may keep it. ``step`` returns the layer output ``[B, 1, D]``.
    Exceptions the implementation raises on purpose must be mapped by
    ``error_kind``; returning None marks an exception as unexpected.
    """

    name: str  # implementation id: names its example database and reports
    version: str
    capabilities: frozenset[str]

    def create_layer(self, weights: AttentionWeights, rope: RopeConfig) -> Any:
        """A new layer owning new parameters with these values."""

    def recreate_layer(self, layer: Any) -> Any:
        """A new layer with new parameter objects holding equal values and the same RoPE."""

    def with_rope(self, layer: Any, rope: RopeConfig) -> Any:
        """A layer sharing ``layer``'s parameter objects, under another RoPE configuration."""

    def update_weights(self, layer: Any, weights: AttentionWeights) -> None:
        """Write new values into ``layer``'s parameters in place, as an optimiser step does."""

    def create_cache(self, layer: Any, batch_size: int, capacity: int) -> Any:
        """A new empty cache bound to ``layer``."""

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        """One incremental step: attend ``x [B, 1, D]`` over the cache, append its K/V row."""

    def reset(self, cache: Any) -> None:
        """Empty the cache's logical prefix."""

    def snapshot(self, cache: Any) -> CacheSnapshot:
        """Copies of the cache's observable state: a ``CacheSnapshot`` or any object with its fields."""

    def error_kind(self, error: BaseException) -> str | None:
        """The ``ErrorKind`` value of an exception the implementation raised, or None."""
