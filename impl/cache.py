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
    """Rotated keys and unrotated values of one attention layer, one row per position.

    Row ``i`` (the i-th appended since creation or reset) lives in slot
    ``i % slots``, with its absolute position beside it. Without a window
    there are ``capacity`` slots, so every row is kept and, in chapter 37's
    use, row = slot = position. With a sliding ``window`` W there are
    ``min(capacity, W)`` slots: the cache keeps the last W rows.
    """

    def __init__(self, layer: AttentionLayer, batch_size: int, capacity: int, window: int | None = None) -> None:
        for name, value in (("batch size", batch_size), ("capacity", capacity)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidCacheArgument(name, value)
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise InvalidCacheArgument("window", window)
        if batch_size == 0:
            raise ZeroBatchSize()
        if capacity == 0:
            raise ZeroCapacity()
        if capacity > layer.rope.max_positions:
            raise CapacityExceedsPositions(capacity, layer.rope.max_positions)
        slots = capacity if window is None else min(capacity, window)
        shape = (batch_size, layer.kv_heads, slots, layer.head_width)
        elements = batch_size * layer.kv_heads * slots * layer.head_width
        if elements * 8 > _MAX_BYTES:
            raise ElementCountOverflow(batch_size, layer.kv_heads, slots, layer.head_width)
        try:
            self._keys = np.zeros(shape)
            self._values = np.zeros(shape)
        except MemoryError:
            raise AllocationFailed(elements) from None
        self._positions = np.zeros(slots, dtype=np.int64)  # absolute position of each slot's row
        self._length = 0  # rows appended
        self._next_position = 0  # absolute position of the next row
        self.batch_size, self.capacity, self.window, self.slots = batch_size, capacity, window, slots
        self.model_width, self.heads = layer.model_width, layer.heads
        self.kv_heads, self.head_width = layer.kv_heads, layer.head_width
        self._parameters = layer.parameters  # the objects themselves: identity
        self._versions = tuple(p.version for p in layer.parameters)
        self._rope = layer.rope

    # -- observation ------------------------------------------------------------------------------

    @property
    def length(self) -> int:
        """Rows appended since creation or reset (chapter 37: also the next row's position)."""
        return self._length

    @property
    def next_position(self) -> int:
        """The absolute position the next row is rotated at."""
        return self._next_position

    @property
    def is_full(self) -> bool:
        return self._length >= self.capacity

    def _held_slots(self) -> np.ndarray:
        """Slots of the rows held, oldest first."""
        return np.arange(max(0, self._length - self.slots), self._length) % self.slots

    def positions(self) -> np.ndarray:
        """Absolute positions of the rows held, oldest first."""
        positions: np.ndarray = self._positions[self._held_slots()]
        return positions

    def keys(self) -> np.ndarray:
        """A copy of the held rotated-key rows ``[B, KV, n, dh]``, oldest first."""
        keys: np.ndarray = self._keys[:, :, self._held_slots()]
        return keys

    def values(self) -> np.ndarray:
        """A copy of the held value rows ``[B, KV, n, dh]``, oldest first."""
        values: np.ndarray = self._values[:, :, self._held_slots()]
        return values

    @property
    def key_storage(self) -> np.ndarray:
        """Read-only view of the whole physical key buffer ``[B, KV, slots, dh]``, for audits."""
        return _read_only(self._keys)

    @property
    def value_storage(self) -> np.ndarray:
        """Read-only view of the whole physical value buffer ``[B, KV, slots, dh]``, for audits."""
        return _read_only(self._values)

    # -- state changes ------------------------------------------------------------------------------

    def reset(self, *, zero_storage: bool = False) -> None:
        """Empty the logical prefix; keep both buffers and every binding. The bytes stay as they were
        (chapter 37), unless ``zero_storage``: then both buffers are overwritten with zeros."""
        if zero_storage:
            self._keys.fill(0.0)
            self._values.fill(0.0)
        self._length = self._next_position = 0

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

    def _prefix(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The held keys and values ``[B, KV, n, dh]`` and their positions ``[n]``.

        Views (no copies) until a sliding window wraps around; then a gather of
        at most W rows.
        """
        if self._length <= self.slots:
            held = slice(0, self._length)
            return self._keys[:, :, held], self._values[:, :, held], self._positions[held]
        slots = self._held_slots()
        return self._keys[:, :, slots], self._values[:, :, slots], self._positions[slots]

    def _commit(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Append fully checked rows ``[B, KV, T, dh]`` at positions ``next_position ..``."""
        tokens = keys.shape[2]
        kept = min(tokens, self.slots)  # a chunk longer than the window keeps its last rows only
        slots = np.arange(self._length + tokens - kept, self._length + tokens) % self.slots
        self._keys[:, :, slots] = keys[:, :, tokens - kept:]
        self._values[:, :, slots] = values[:, :, tokens - kept:]
        self._positions[slots] = np.arange(self._next_position + tokens - kept, self._next_position + tokens)
        self._length += tokens
        self._next_position += tokens

    def _restore(self, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, next_position: int) -> None:
        """Replace the whole state: rows ``[B, KV, n, dh]`` at ``positions``, then ``next_position``.

        For the prefix store, which rebuilds a cache from an entry's copies.
        The caller guarantees ``n <= slots`` and ``n <= capacity``.
        """
        count = keys.shape[2]
        self._keys[:, :, :count] = keys
        self._values[:, :, :count] = values
        self._positions[:count] = positions
        self._length, self._next_position = count, next_position


def _read_only(array: np.ndarray) -> np.ndarray:
    view: np.ndarray = array.view()
    view.flags.writeable = False
    return view
