"""The layer-cache half of an adapter: one attention layer and its caches (docs/spec.md §3-6, §13).

An adapter is any object with the attributes and methods of ``KvCacheAdapter``
(structural typing: nothing needs to be imported or subclassed). Layers and
caches are opaque handles the suite passes back to the adapter. See
``docs/adapters.md`` for a minimal complete example.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..oracle import AttentionWeights, RopeConfig


@dataclass(frozen=True, eq=False)
class CacheSnapshot:
    """Everything observable about a cache, as copies the suite may keep.

    ``keys`` (rotated) and ``values`` (unrotated) are the logical prefix
    ``[B, KV, length, dh]``; a sliding-window cache gives the rows it holds,
    ``[B, KV, n, dh]``, oldest first, and their absolute ``positions [n]``
    (docs/spec.md §13.5; None elsewhere). With ``physical_storage``, ``physical_keys`` and
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
    positions: np.ndarray | None = None


@runtime_checkable
class KvCacheAdapter(Protocol):
    """Drives one KV-cache implementation for the suite.

    Every array the suite passes is float64 unless a test says otherwise; the
    adapter may keep it but must not write into it. ``step`` returns the
    layer output ``[B, 1, D]``. Exceptions the implementation raises on
    purpose must be mapped by ``error_kind``; returning None marks an
    exception as unexpected. An optional ``dtype`` attribute (``"float64"``,
    the default, ``"float32"``, ``"float16"``, ``"bfloat16"``) chooses the
    tolerance rule (``properties/tolerance.py``).
    """

    name: str  # implementation id: names its example database and reports
    version: str
    capabilities: frozenset[str]

    def create_layer(self, weights: AttentionWeights, rope: RopeConfig) -> Any:
        """A new layer owning new parameters with these values."""

    def recreate_layer(self, layer: Any) -> Any:
        """A new layer with new parameter objects holding equal values and the same RoPE."""

    def with_rope(self, layer: Any, rope: RopeConfig) -> Any:
        """A layer sharing ``layer``'s parameter objects, under another RoPE configuration (needed only with a RoPE
        pairing declared: never called for ``positionless`` layers)."""

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


@runtime_checkable
class CacheOperations(Protocol):
    """Optional operations of a layer cache (docs/spec.md §13), each under its own capability.

    An adapter has only the methods whose capability it declares; with
    ``sliding_window_layer`` its ``create_cache`` also takes ``window=W`` and
    its snapshots give ``positions``; with ``attention_sinks`` it takes
    ``sinks=S`` too (S >= 1; never passed when 0).
    """

    def append(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        """``chunked_append``: attend ``x [B, T, D]`` (T >= 1) causally over the cache and itself at positions
        ``length .. length+T-1``; append all T rows, or none. Returns ``[B, T, D]``."""

    def truncate(self, cache: Any, n: int) -> None:
        """``truncate``: keep the first ``n`` rows; the next row is appended at position ``n``."""

    def reorder(self, cache: Any, indices: np.ndarray) -> None:
        """``batch_reorder``: batch row ``b`` becomes the old row ``indices[b]`` (repeats and drops allowed)."""

    def select(self, cache: Any, indices: Any) -> None:
        """``batch_select``: keep the batch rows ``indices`` (increasing, distinct, 1 to B of them): the batch
        shrinks to ``len(indices)``."""

    def repeat_interleave(self, cache: Any, repeats: int) -> None:
        """``batch_repeat``: every batch row ``repeats`` times in a row: the batch grows to ``B * repeats``."""

    def fork(self, cache: Any) -> Any:
        """``fork``: an independent copy; writes to either never show in the other."""


@dataclass(frozen=True, eq=False)
class RowSnapshot:
    """One row of a ragged batch, as copies: its own ``keys`` (as §3 says) and ``values`` ``[KV, m, dh]``, never
    padding (docs/spec.md §13.8): its ``n`` tokens at positions ``0 .. n - 1``; or, for a window cache that lets
    tokens go, the ``m`` it holds at their ``positions [m]`` (oldest first; None: every token, ``0 .. n - 1``)."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray | None = None


@runtime_checkable
class RaggedBatches(Protocol):
    """Batches whose rows hold their own numbers of tokens, and batches that merge and split (docs/spec.md §13.8),
    each under its own capability. ``reset``, ``truncate``, ``select`` and ``repeat_interleave`` take a ragged
    cache too where their capabilities are declared."""

    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None) -> Any:
        """``ragged_rows``: a cache of ``batch_size`` empty rows, each of room for ``capacity`` tokens; with
        ``sliding_window_layer``, handed ``window=W`` (only where it is drawn): each row a window cache of its own
        tokens (docs/spec.md §13.8)."""

    def append_ragged(self, layer: Any, cache: Any, x: np.ndarray, lengths: Any) -> np.ndarray:
        """``ragged_rows``: row ``b`` appends its last ``lengths[b]`` rows of ``x [B, T, D]`` (left padding before
        them), at its own positions ``n_b ..``; returns ``[B, T, D]``, judged at the rows appended only."""

    def ragged_snapshot(self, cache: Any) -> Any:
        """``ragged_rows``: one ``RowSnapshot`` (or any object with its fields) per batch row, in order."""

    def merge(self, cache: Any, other: Any) -> None:
        """``batch_merge``: ``other``'s rows appended after the cache's, each keeping its tokens; ``other`` is the
        adapter's afterwards (the suite never uses it again)."""

    def extract(self, cache: Any, row: int) -> Any:
        """``batch_extract``: a new ragged cache holding row ``row`` alone; the cache unchanged."""

    def filter(self, cache: Any, rows: Any) -> None:
        """``batch_filter``: keep ``rows`` (distinct, in this order; none leaves a batch of no rows)."""


@dataclass(frozen=True, eq=False)
class LayerState:
    """One layer of a layered cache, as copies: its ``keys`` (as §3 says) and ``values`` ``[B, KV, n, dh]``, the
    ``n`` rows that layer holds (0 for a layer never written) at positions ``0 .. n - 1`` (docs/spec.md §13.9)."""

    keys: np.ndarray
    values: np.ndarray


@runtime_checkable
class LayeredCaches(Protocol):
    """The caches of a model's layers, operated at once (``layered_cache``, docs/spec.md §13.9). ``reset`` takes a
    layered cache, and so do ``truncate``, ``reorder``, ``select`` and ``repeat_interleave`` where their
    capabilities are declared: each acts on every layer at once, a layer never written included, all or nothing."""

    def create_layered_cache(self, layers: list[Any], batch_size: int, capacity: int) -> Any:
        """A cache of ``len(layers)`` layers, layer ``l`` bound to ``layers[l]``, each of ``batch_size`` rows and
        room for ``capacity`` tokens, none written."""

    def layered_append(self, cache: Any, layer: int, x: np.ndarray) -> np.ndarray:
        """``x [B, T, D]`` (T >= 1) through layer ``layer``'s parameters and appended to that layer alone, as
        ``append`` (§13.1) appends to a layer cache; returns ``[B, T, D]``."""

    def layered_snapshot(self, cache: Any) -> Any:
        """One ``LayerState`` (or any object with its fields) per layer, in order."""
