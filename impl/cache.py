"""The fixed-capacity, layer-bound KV cache of chapter 37.

Physical buffers ``[B, KV, C, dh]`` are allocated once; the logical prefix is
the first ``length`` positions. The cache remembers which parameter objects
(identity) at which value versions, and which exact RoPE configuration, its
rows were computed with; ``reset`` empties the prefix and refreshes none of it.
Rows are written only by ``commit``, which a layer's step (or a session) calls
after it has computed and checked the whole step; ``truncate``, ``reorder``
and ``fork`` are the other operations of docs/spec.md §13.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
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
    InvalidIndices,
    InvalidLength,
    InvalidRowLengths,
    RowsEvicted,
    ZeroBatchSize,
    ZeroCapacity,
)

if TYPE_CHECKING:
    from .attention import AttentionLayer
    from .storage import StorageRule

_MAX_BYTES = int(np.iinfo(np.intp).max)


class LayerKvCache:
    """Rotated keys and unrotated values of one attention layer, one row per position.

    Row ``i`` (the i-th appended since creation or reset) lives in slot
    ``i % slots``, with its absolute position beside it. Without a window
    there are ``capacity`` slots, so every row is kept and, in chapter 37's
    use, row = slot = position. With a sliding ``window`` W there are
    ``min(capacity, W)`` slots: the cache keeps the last W rows.
    """

    def __init__(self, layer: AttentionLayer, batch_size: int, capacity: int, window: int | None = None,
                 storage: StorageRule | None = None, truncates_until_full: bool = False,
                 keeps_every_row: bool = False, sinks: int = 0, full_counts_sinks: bool = False,
                 checks_room: bool = True) -> None:
        for name, value in (("batch size", batch_size), ("capacity", capacity)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidCacheArgument(name, value)
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise InvalidCacheArgument("window", window)
        if not isinstance(sinks, int) or isinstance(sinks, bool) or sinks < 0 or (sinks and window is None):
            raise InvalidCacheArgument("sinks", sinks)
        if batch_size == 0:
            raise ZeroBatchSize()
        if capacity == 0:
            raise ZeroCapacity()
        if capacity > layer.rope.max_positions:
            raise CapacityExceedsPositions(capacity, layer.rope.max_positions)
        # A window is a ring of min(C, W) slots; ``keeps_every_row``: C slots, the window a mask only (what a
        # cache that never evicts shows: more rows than the next query sees, which docs/spec.md allows).
        # With attention sinks the reference keeps every row too (the first ``sinks`` stay visible forever).
        slots = capacity if window is None or keeps_every_row or sinks else min(capacity, window)
        shape = (batch_size, layer.kv_heads, slots, layer.head_width)
        elements = batch_size * layer.kv_heads * slots * layer.head_width
        if elements * 8 > _MAX_BYTES:
            raise ElementCountOverflow(batch_size, layer.kv_heads, slots, layer.head_width)
        try:
            self._keys = np.zeros(shape)
            self._values = np.zeros(shape)
        except MemoryError:
            raise AllocationFailed(elements) from None
        # With a storage rule the buffers hold the rows as stored (rounded); the exact rows are kept beside
        # them, so that a recomputed scale re-rounds from them rather than from rounded values.
        self.storage = storage
        self._exact_keys = np.zeros(shape) if storage else self._keys
        self._exact_values = np.zeros(shape) if storage else self._values
        self._scales: tuple[np.ndarray, np.ndarray] | None = None  # a frozen scale, set by the first update
        self._positions = np.zeros(slots, dtype=np.int64)  # absolute position of each slot's row
        self._length = 0  # rows appended
        self._next_position = 0  # absolute position of the next row
        self._first_held = 0  # index of the oldest row still held (a window evicts; truncation cannot undo it)
        self.batch_size, self.capacity, self.window, self.slots = batch_size, capacity, window, slots
        self.truncates_until_full = truncates_until_full  # a window cache refusing truncation once length >= W
        self.sinks = sinks  # the first positions every later query sees besides its window (StreamingLLM)
        # A window cache refusing every truncation once it holds W + S rows, as a ring of W + S slots does (the
        # reference keeps every row of a cache with sinks: this is the refusal such a ring makes, not its layout).
        self.full_counts_sinks = full_counts_sinks
        # False: a preallocated buffer without a full check; a write past its end raises IndexError (commit).
        self.checks_room = checks_room
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
        return np.arange(self._first_held, self._length) % self.slots

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
        self._length = self._next_position = self._first_held = 0
        self._scales = None

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` rows; the next row is appended at the position after them.

        ``length`` must be an int in ``[0, self.length]`` (``self.length``: a no-op).
        With a window, the rows the next row will see must still be held:
        truncation never brings an evicted row back; with ``truncates_until_full``, a cache that holds W
        rows or more refuses every truncation (``full_counts_sinks``: W + S rows). Nothing changes on a rejection.
        """
        if not isinstance(length, (int, np.integer)) or isinstance(length, (bool, np.bool_)) \
                or not 0 <= length <= self._length:
            raise InvalidLength(length, self._length)
        length = int(length)
        if self.window is not None and self.truncates_until_full and self._length >= self.window:
            oldest = self._next_position - self._length + self._first_held
            raise RowsEvicted(length, self._next_position - self._length + max(0, length - self.window + 1), oldest)
        if self.window is not None and self.full_counts_sinks and self._length >= self.window + self.sinks:
            raise RowsEvicted(length, self._next_position - self._length + max(0, length - self.window + 1),
                              self._next_position - self._length + self._first_held)
        if self.window is not None:
            needed = max(0, length - self.window + 1)  # the oldest row a query at the new end sees
            if needed < length and self._first_held > needed:
                oldest = self._next_position - self._length + self._first_held
                raise RowsEvicted(length, self._next_position - self._length + needed, oldest)
        self._next_position -= self._length - length
        self._length = length
        self._first_held = min(self._first_held, length)
        self._store(recompute=True)

    def reorder(self, indices: Sequence[int] | np.ndarray) -> None:
        """Batch row ``b`` becomes the old row ``indices[b]``, in place, along the batch axis only.

        ``indices``: one int per batch row, each in ``[0, batch_size)``; repeats
        and drops allowed. Nothing changes on a rejection.
        """
        gather = _batch_indices(indices, self.batch_size)
        self._keys[...] = self._keys[gather]  # fancy indexing copies first: in-place is safe
        self._values[...] = self._values[gather]
        if self.storage is not None:
            self._exact_keys[...] = self._exact_keys[gather]
            self._exact_values[...] = self._exact_values[gather]
            self._store(recompute=True)

    def select(self, indices: Sequence[int] | np.ndarray) -> None:
        """Keep the batch rows ``indices`` (1 to B distinct ints in ``[0, B)``, in the order given): the batch
        shrinks, as when finished sequences leave. New buffers; nothing changes on a rejection."""
        self._regather(_selection_indices(indices, self.batch_size))

    def repeat_interleave(self, repeats: object) -> None:
        """Each batch row ``repeats`` times in a row (beam expansion): batch ``B * repeats``. New buffers."""
        if not isinstance(repeats, (int, np.integer)) or isinstance(repeats, (bool, np.bool_)) or repeats < 1:
            raise InvalidIndices(f"repeats {repeats!r} is not an int >= 1")
        self._regather(np.repeat(np.arange(self.batch_size), int(repeats)))

    def _regather(self, gather: np.ndarray) -> None:
        """Every buffer gathered along the batch axis into new ones (the batch size changes)."""
        elements = len(gather) * self.kv_heads * self.slots * self.head_width
        if elements * 8 > _MAX_BYTES:
            raise ElementCountOverflow(len(gather), self.kv_heads, self.slots, self.head_width)
        keys, values = self._keys[gather], self._values[gather]
        if self.storage is not None:
            self._exact_keys, self._exact_values = self._exact_keys[gather], self._exact_values[gather]
        else:
            self._exact_keys, self._exact_values = keys, values
        self._keys, self._values, self.batch_size = keys, values, len(gather)
        if self.storage is not None:
            self._store(recompute=True)

    def fork(self) -> LayerKvCache:
        """An independent copy: the same bindings (layer, parameter versions, RoPE), copies of every row."""
        twin = copy.copy(self)
        twin._keys, twin._values, twin._positions = self._keys.copy(), self._values.copy(), self._positions.copy()
        if self.storage is not None:
            twin._exact_keys, twin._exact_values = self._exact_keys.copy(), self._exact_values.copy()
        else:
            twin._exact_keys, twin._exact_values = twin._keys, twin._values
        return twin

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

    def check_binding_of(self, other: LayerKvCache) -> None:
        """Raise unless ``other`` was bound to the same layer as this cache: geometry, parameter objects, versions
        and RoPE (a merge of two caches)."""
        for error, mine, theirs in ((CacheModelWidthMismatch, self.model_width, other.model_width),
                                    (CacheHeadCountMismatch, self.heads, other.heads),
                                    (CacheKvHeadCountMismatch, self.kv_heads, other.kv_heads),
                                    (CacheHeadWidthMismatch, self.head_width, other.head_width)):
            if mine != theirs:
                raise error(layer=theirs, cache=mine)
        for index, (own, other_parameter) in enumerate(zip(self._parameters, other._parameters)):
            if own is not other_parameter:
                raise CacheLayerMismatch(index)
        for index, (version, other_version) in enumerate(zip(self._versions, other._versions)):
            if other_version != version:
                raise CacheLayerRevisionMismatch(index, cache=version, layer=other_version)
        if not self._rope.same_as(other._rope):
            raise CacheRopeMismatch(cache=self._rope, layer=other._rope)

    def held_rows(self, *, oldest_first: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The held keys and values ``[B, KV, n, dh]`` and their positions ``[n]``, oldest first.

        Read-only views (no copies) while the held rows are contiguous in the
        buffers; a gather of at most ``slots`` rows once a window wraps around,
        unless ``oldest_first`` is False and every slot holds a row (a window's
        steady state): then the whole ring, in slot order, as views -- attention
        masks by position and does not need the order.
        For layers computing a step; ``keys()``/``values()`` return copies.
        """
        if self._first_held == 0 and self._length <= self.slots:
            held = slice(0, self._length)
            return (_read_only(self._keys[:, :, held]), _read_only(self._values[:, :, held]),
                    _read_only(self._positions[held]))
        if not oldest_first and self._length - self._first_held == self.slots:
            return _read_only(self._keys), _read_only(self._values), _read_only(self._positions)
        slots = self._held_slots()
        return self._keys[:, :, slots], self._values[:, :, slots], self._positions[slots]

    def commit(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Append computed rows ``[B, KV, T, dh]`` at positions ``next_position ..``.

        The caller (a layer's step, a session) has checked the binding, the free
        capacity and every value: this only writes. A chunk longer than the
        window keeps its last rows.
        """
        tokens = keys.shape[2]
        start = self._length
        if self.window is None and start + tokens > self.slots:  # past the buffer (no full check before)
            raise IndexError(f"rows {start} .. {start + tokens - 1} are past a buffer of {self.slots} rows")
        kept = min(tokens, self.slots)
        slots = np.arange(start + tokens - kept, start + tokens) % self.slots
        self._exact_keys[:, :, slots] = keys[:, :, tokens - kept:]
        self._exact_values[:, :, slots] = values[:, :, tokens - kept:]
        self._positions[slots] = np.arange(self._next_position + tokens - kept, self._next_position + tokens)
        self._length += tokens
        self._next_position += tokens
        self._first_held = max(self._first_held, self._length - self.slots)
        if self.storage is not None:
            if self.storage.update == "frozen" and self._scales is None:
                self._scales = (self.storage.scale_for(keys), self.storage.scale_for(values))
            self._store(recompute=self.storage.update == "recomputed", slots=slots)

    def _store(self, *, recompute: bool, slots: np.ndarray | None = None) -> None:
        """Round exact rows into the buffers: ``slots`` at a frozen or fixed scale, or with a recomputed
        scale every held row (its scale may have changed)."""
        storage = self.storage
        if storage is None or (not recompute and slots is None):
            return
        if recompute and storage.update == "recomputed":
            slots = self._held_slots()
            held_keys, held_values = self._exact_keys[:, :, slots], self._exact_values[:, :, slots]
            scales = (storage.scale_for(held_keys), storage.scale_for(held_values))
        elif slots is None:
            return  # a frozen or fixed scale: the stored rows stay as they are
        else:
            scales = self._scales if self._scales is not None else (np.ones((1, 1, 1, 1)),) * 2
        self._keys[:, :, slots] = storage.round(self._exact_keys[:, :, slots], scales[0])
        self._values[:, :, slots] = storage.round(self._exact_values[:, :, slots], scales[1])

    def load_rows(self, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, next_position: int) -> None:
        """Replace the whole state: rows ``[B, KV, n, dh]`` at ``positions``, then ``next_position``.

        For the prefix store, which rebuilds a cache from an entry's copies.
        The caller guarantees ``n <= slots`` and ``n <= capacity``.
        """
        count = keys.shape[2]
        self._keys[:, :, :count] = self._exact_keys[:, :, :count] = keys
        self._values[:, :, :count] = self._exact_values[:, :, :count] = values
        self._positions[:count] = positions
        self._length, self._next_position, self._first_held = count, next_position, 0


class RaggedKvCache:
    """A batch whose rows hold their own numbers of tokens (docs/spec.md §13.8), laid out left-padded.

    ``[B, KV, P, dh]`` buffers with ``P`` the longest row's length: row ``b``'s ``n_b`` tokens sit in the last
    ``n_b`` slots, token ``i`` at its own position ``i``; the slots before them are padding, zero, and masked.
    Every operation lays the rows out anew (``_relayout``): rows merge, split and shrink as continuous batching
    makes them. The binding (layer identity, versions, RoPE) is a one-row ``LayerKvCache``'s. With ``storage``
    (a rule whose scales are each token's own: none or per_group) each token is stored rounded as it is appended:
    what a row stores is a function of its own tokens, whatever the other rows hold. ``truncation`` is how
    ``truncate(n)`` cuts the rows: ``"per_row"``, each its first ``n`` tokens; ``"columns"``, the layout's first
    ``n`` columns (every row drops its last ``longest - n`` tokens: transformers' ``crop`` of a left-padded cache).
    """

    def __init__(self, layer: AttentionLayer, batch_size: int, capacity: int,
                 storage: StorageRule | None = None, window: int | None = None, truncation: str = "per_row") -> None:
        for name, value in (("batch size", batch_size), ("capacity", capacity)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidCacheArgument(name, value)
        if window is not None and (not isinstance(window, int) or isinstance(window, bool) or window < 1):
            raise InvalidCacheArgument("window", window)
        if truncation not in ("per_row", "columns"):
            raise ValueError(f"truncation is per_row or columns, not {truncation!r}")
        if batch_size == 0:
            raise ZeroBatchSize()
        if capacity == 0:
            raise ZeroCapacity()
        self._binding = LayerKvCache(layer, 1, 1)  # the binding only: its rows are never used
        if capacity > layer.rope.max_positions:
            raise CapacityExceedsPositions(capacity, layer.rope.max_positions)
        if storage is not None and storage.scale not in ("none", "per_group"):
            raise ValueError(f"a ragged batch stores each row's own tokens: a {storage.scale} scale is the batch's")
        self.capacity, self.kv_heads, self.head_width = capacity, layer.kv_heads, layer.head_width
        self.storage = storage
        self.window = window  # each row's query sees its own last ``window`` positions; every token is kept (a mask)
        self.truncation = truncation
        self._set(np.zeros((batch_size, layer.kv_heads, 0, layer.head_width)),
                  np.zeros((batch_size, layer.kv_heads, 0, layer.head_width)), np.zeros(batch_size, dtype=np.int64))

    def _set(self, keys: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
        self._keys, self._values, self.lengths = keys, values, lengths
        self.batch_size = len(lengths)

    @property
    def width(self) -> int:
        """Slots per row: the longest row's length."""
        return int(self._keys.shape[2])

    def check_binding(self, layer: AttentionLayer) -> None:
        self._binding.check_binding(layer)

    def padded_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """Read-only views of the left-padded keys and values ``[B, KV, P, dh]``."""
        return _read_only(self._keys), _read_only(self._values)

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of row ``index``'s own keys and values ``[KV, n, dh]``, oldest first."""
        first = self.width - int(self.lengths[index])
        return self._keys[index, :, first:].copy(), self._values[index, :, first:].copy()

    def chunk_lengths(self, lengths: object, tokens: int) -> np.ndarray:
        """A ragged append's ``lengths`` as int64, one per row in ``[0, tokens]``, or ``InvalidRowLengths``."""
        try:
            array = _int_array(lengths)
        except InvalidIndices:
            raise InvalidRowLengths(lengths, self.batch_size, tokens) from None
        if array.shape != (self.batch_size,) or (array.size and (array.min() < 0 or array.max() > tokens)):
            raise InvalidRowLengths(lengths, self.batch_size, tokens)
        return array

    def commit(self, keys: np.ndarray, values: np.ndarray, counts: np.ndarray) -> None:
        """Append computed rows ``[B, KV, T, dh]``, left-padded: row ``b`` its last ``counts[b]``. The caller has
        checked everything."""
        tokens = keys.shape[2]
        if self.storage is not None:  # each token's own scale (none, or its groups'): rounded once, as appended
            keys, values = (self.storage.round(rows, self.storage.scale_for(rows)) for rows in (keys, values))
        real = np.concatenate([self._real(), np.arange(tokens)[None, :] >= (tokens - counts)[:, None]], axis=1)
        self._relayout(np.concatenate([self._keys, keys], axis=2), np.concatenate([self._values, values], axis=2),
                       real)

    def _real(self) -> np.ndarray:
        """Which slots hold a token ``[B, P]`` (the others are padding)."""
        return np.arange(self.width)[None, :] >= (self.width - self.lengths)[:, None]

    def _relayout(self, keys: np.ndarray, values: np.ndarray, real: np.ndarray) -> None:
        """Keep the slots ``real [B, S]`` marks, in order, left-padded to the longest row anew."""
        lengths = real.sum(axis=1).astype(np.int64)
        width = int(lengths.max(initial=0))
        order = np.argsort(real, axis=1, kind="stable")[:, real.shape[1] - width:]  # padding first, then tokens
        kept = np.take_along_axis(real, order, axis=1)[:, None, :, None]
        gather = order[:, None, :, None]
        self._set(np.where(kept, np.take_along_axis(keys, gather, axis=2), 0.0),
                  np.where(kept, np.take_along_axis(values, gather, axis=2), 0.0), lengths)

    def reset(self, *, zero_storage: bool = False) -> None:
        """Every row emptied (its buffers hold no slot: ``zero_storage`` has nothing to zero)."""
        self._set(self._keys[:, :, :0], self._values[:, :, :0], np.zeros(self.batch_size, dtype=np.int64))

    def truncate(self, length: object) -> None:
        """Each row keeps its first ``min(length, n_b)`` tokens, or by columns ``max(0, n_b - (longest - length))``;
        ``length`` an int in ``[0, longest row]`` (the layout is as wide as the longest row)."""
        if not isinstance(length, (int, np.integer)) or isinstance(length, (bool, np.bool_)) \
                or not 0 <= length <= self.width:
            raise InvalidLength(length, self.width)
        if self.truncation == "columns":  # the layout's first ``length`` columns, a row's padding among them
            kept = np.arange(self.width)[None, :] < int(length)
        else:
            rank = np.arange(self.width)[None, :] - (self.width - self.lengths)[:, None]  # a token's position
            kept = rank < int(length)
        self._relayout(self._keys, self._values, self._real() & kept)

    def _gather(self, rows: np.ndarray) -> None:
        """The batch rows ``rows`` (old row of each new one), left-padded to their longest."""
        self._relayout(self._keys[rows], self._values[rows], self._real()[rows])

    def select(self, indices: object) -> None:
        self._gather(_selection_indices(indices, self.batch_size))

    def reorder(self, indices: object) -> None:
        """Batch row ``b`` becomes the old row ``indices[b]`` with its own tokens (§13.3: repeats and drops
        allowed, the batch size unchanged)."""
        self._gather(_batch_indices(indices, self.batch_size))

    def fork(self) -> RaggedKvCache:
        """An independent copy: the same binding, copies of every row."""
        twin = copy.copy(self)
        twin._set(self._keys.copy(), self._values.copy(), self.lengths.copy())
        return twin

    def repeat_interleave(self, repeats: object) -> None:
        if not isinstance(repeats, (int, np.integer)) or isinstance(repeats, (bool, np.bool_)) or repeats < 1:
            raise InvalidIndices(f"repeats {repeats!r} is not an int >= 1")
        self._gather(np.repeat(np.arange(self.batch_size), int(repeats)))

    def filter(self, rows: object) -> None:
        """Keep ``rows`` (distinct ints in ``[0, B)``, in this order); none leaves a batch of no rows."""
        array = _int_array(rows)
        if array.ndim != 1 or len(set(array.tolist())) != array.size:
            raise InvalidIndices(f"{array.tolist()}: a filter keeps distinct rows")
        if array.size and (array.min() < 0 or array.max() >= self.batch_size):
            raise InvalidIndices(f"{array.tolist()} has an index outside [0, {self.batch_size})")
        self._gather(array)

    def extract(self, row: object) -> RaggedKvCache:
        """A new cache of row ``row`` alone, with this one's binding; this one unchanged."""
        if not isinstance(row, (int, np.integer)) or isinstance(row, (bool, np.bool_)) \
                or not 0 <= row < self.batch_size:
            raise InvalidIndices(f"row {row!r} is not an int in [0, {self.batch_size})")
        single = copy.copy(self)
        single._gather(np.array([int(row)]))
        return single

    def merge(self, other: RaggedKvCache) -> None:
        """``other``'s rows after this one's, each keeping its tokens, left-padded to the longest of both."""
        if not isinstance(other, RaggedKvCache):
            raise InvalidIndices(f"a {type(other).__name__} is not a ragged cache to merge")
        self._binding.check_binding_of(other._binding)
        width = max(self.width, other.width)
        parts = [side._left_padded(width) for side in (self, other)]
        self._set(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                  np.concatenate([self.lengths, other.lengths]))
        self.capacity = max(self.capacity, other.capacity)

    def _left_padded(self, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values left-padded with zeros to ``width`` slots."""
        pad = ((0, 0), (0, 0), (width - self.width, 0), (0, 0))
        return np.pad(self._keys, pad), np.pad(self._values, pad)


def _int_array(indices: object) -> np.ndarray:
    """``indices`` (an integer array, or a list or tuple of ints) as an int64 array, or ``InvalidIndices``."""
    if isinstance(indices, np.ndarray):
        if indices.dtype.kind not in "iu":
            raise InvalidIndices(f"indices of dtype {indices.dtype}, not integers")
        return indices.astype(np.int64)
    if isinstance(indices, (list, tuple)):
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in indices):
            raise InvalidIndices(f"{indices!r} holds something other than ints")
        return np.asarray(indices, dtype=np.int64).reshape(len(indices))
    raise InvalidIndices(f"a {type(indices).__name__}, not a sequence of ints")


def _batch_indices(indices: object, batch_size: int) -> np.ndarray:
    """``indices`` as an int64 array of ``batch_size`` entries in ``[0, batch_size)``, or ``InvalidIndices``."""
    array = _int_array(indices)
    if array.shape != (batch_size,):
        raise InvalidIndices(f"shape {array.shape}, but the batch has {batch_size} rows")
    if array.size and (array.min() < 0 or array.max() >= batch_size):
        raise InvalidIndices(f"{array.tolist()} has an index outside [0, {batch_size})")
    return array


def _selection_indices(indices: object, batch_size: int) -> np.ndarray:
    """``indices`` as an int64 array of 1 to ``batch_size`` distinct entries in ``[0, batch_size)``, or
    ``InvalidIndices``."""
    array = _int_array(indices)
    if array.ndim != 1:
        raise InvalidIndices(f"indices of shape {array.shape}, not 1-D")
    if not 1 <= array.size <= batch_size or len(set(array.tolist())) != array.size:
        raise InvalidIndices(f"{array.tolist()}: a selection holds 1 to {batch_size} distinct indices")
    if array.min() < 0 or array.max() >= batch_size:
        raise InvalidIndices(f"{array.tolist()} has an index outside [0, {batch_size})")
    return array


def _read_only(array: np.ndarray) -> np.ndarray:
    view: np.ndarray = array.view()
    view.flags.writeable = False
    return view
