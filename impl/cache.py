"""The fixed-capacity, layer-bound KV cache of chapter 37.

Physical buffers ``[B, KV, C, dh]`` are allocated once; the logical prefix is
the first ``length`` positions. The cache remembers which parameter objects
(identity) at which value versions, and which exact RoPE configuration, its
rows were computed with; ``reset`` empties the prefix and refreshes none of it.
Rows are written only by ``AttentionLayer.forward_incremental`` after it has
computed and checked the whole step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .errors import (
    AllocationFailed,
    CacheHeadCountMismatch,
    CacheHeadWidthMismatch,
    CacheKvHeadCountMismatch,
    CacheLayerMismatch,
    CacheLayerRevisionMismatch,
    CacheModelWidthMismatch,
    CacheRopeMismatch,
    CapacityExceedsPositions,
    ElementCountOverflow,
    InvalidCacheArgument,
    ZeroBatchSize,
    ZeroCapacity,
)

if TYPE_CHECKING:
    from .attention import AttentionLayer

_MAX_BYTES = int(np.iinfo(np.intp).max)


class LayerKvCache:
    """Rotated keys and unrotated values of one attention layer, one row per position."""

    def __init__(self, layer: AttentionLayer, batch_size: int, capacity: int) -> None:
        for name, value in (("batch size", batch_size), ("capacity", capacity)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidCacheArgument(name, value)
        if batch_size == 0:
            raise ZeroBatchSize()
        if capacity == 0:
            raise ZeroCapacity()
        if capacity > layer.rope.max_positions:
            raise CapacityExceedsPositions(capacity, layer.rope.max_positions)
        shape = (batch_size, layer.kv_heads, capacity, layer.head_width)
        elements = batch_size * layer.kv_heads * capacity * layer.head_width
        if elements * 8 > _MAX_BYTES:
            raise ElementCountOverflow(batch_size, layer.kv_heads, capacity, layer.head_width)
        try:
            self._keys = np.zeros(shape)
            self._values = np.zeros(shape)
        except MemoryError:
            raise AllocationFailed(elements) from None
        self._length = 0
        self.batch_size, self.capacity = batch_size, capacity
        self.model_width, self.heads = layer.model_width, layer.heads
        self.kv_heads, self.head_width = layer.kv_heads, layer.head_width
        self._parameters = layer.parameters  # the objects themselves: identity
        self._versions = tuple(p.version for p in layer.parameters)
        self._rope = layer.rope

    # -- observation ------------------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self._length

    @property
    def is_full(self) -> bool:
        return self._length >= self.capacity

    def keys(self) -> np.ndarray:
        """A copy of the logical rotated-key prefix ``[B, KV, length, dh]``."""
        keys: np.ndarray = self._keys[:, :, :self._length].copy()
        return keys

    def values(self) -> np.ndarray:
        """A copy of the logical value prefix ``[B, KV, length, dh]``."""
        values: np.ndarray = self._values[:, :, :self._length].copy()
        return values

    @property
    def key_storage(self) -> np.ndarray:
        """Read-only view of the whole physical key buffer ``[B, KV, C, dh]``, for audits."""
        return _read_only(self._keys)

    @property
    def value_storage(self) -> np.ndarray:
        """Read-only view of the whole physical value buffer ``[B, KV, C, dh]``, for audits."""
        return _read_only(self._values)

    # -- state changes ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Empty the logical prefix; keep both buffers, their bytes and every binding."""
        self._length = 0

    def check_binding(self, layer: AttentionLayer) -> None:
        """Raise unless this cache was built for exactly this layer, as it is now."""
        for error, cache_value, layer_value in (
            (CacheModelWidthMismatch, self.model_width, layer.model_width),
            (CacheHeadCountMismatch, self.heads, layer.heads),
            (CacheKvHeadCountMismatch, self.kv_heads, layer.kv_heads),
            (CacheHeadWidthMismatch, self.head_width, layer.head_width),
        ):
            if cache_value != layer_value:
                raise error(layer=layer_value, cache=cache_value)
        for index, (recorded, current) in enumerate(zip(self._parameters, layer.parameters)):
            if recorded is not current:
                raise CacheLayerMismatch(index)
        for index, (version, current) in enumerate(zip(self._versions, layer.parameters)):
            if current.version != version:
                raise CacheLayerRevisionMismatch(index, cache=version, layer=current.version)
        if not self._rope.same_as(layer.rope):
            raise CacheRopeMismatch(cache=self._rope, layer=layer.rope)

    def _prefix(self) -> tuple[np.ndarray, np.ndarray]:
        """Views (no copies) of the stored keys and values ``[B, KV, length, dh]``."""
        return self._keys[:, :, :self._length], self._values[:, :, :self._length]

    def _commit(self, key: np.ndarray, value: np.ndarray) -> None:
        """Write one fully checked row ``[B, KV, dh]`` at position ``length``."""
        self._keys[:, :, self._length] = key
        self._values[:, :, self._length] = value
        self._length += 1


def _read_only(array: np.ndarray) -> np.ndarray:
    view: np.ndarray = array.view()
    view.flags.writeable = False
    return view
