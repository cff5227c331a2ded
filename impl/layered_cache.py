"""The caches of a model's layers, operated at once (docs/spec.md §13.9).

One ``LayerKvCache`` per layer, each bound to its own layer and holding its own
number of rows: a model writes its layers one at a time, so between two writes
they differ, and a layer never written holds nothing. A layer's cache is made
at its first write (lazily, as transformers' ``DynamicCache`` initialises a
layer at its first update), so "never written" is a state of its own here, and
every operation over all layers must take it: truncate, reset, reorder, select
and repeat check their argument once, against the whole cache, before the first
layer is changed -- all layers or none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from .cache import LayerKvCache
from .errors import InvalidCacheArgument, InvalidIndices, InvalidLength

if TYPE_CHECKING:
    from .attention import AttentionLayer


class LayeredKvCache:
    """``len(layers)`` layer caches of one batch and capacity; layer ``l``'s rows computed by ``layers[l]``."""

    def __init__(self, layers: Sequence[AttentionLayer], batch_size: int, capacity: int) -> None:
        if not isinstance(layers, (list, tuple)) or not layers:
            raise InvalidCacheArgument("layer list", layers)
        for layer in layers:  # every layer's creation checks (§4.2), before anything is kept
            LayerKvCache(layer, batch_size, capacity)
        self.layers = list(layers)
        self.batch_size, self.capacity = batch_size, capacity
        self._caches: list[LayerKvCache | None] = [None] * len(layers)  # None: never written

    # -- observation ------------------------------------------------------------------------------

    @property
    def lengths(self) -> list[int]:
        """Rows each layer holds (0 for a layer never written)."""
        return [0 if cache is None else cache.length for cache in self._caches]

    def written(self) -> list[bool]:
        return [cache is not None for cache in self._caches]

    def cache_of(self, index: int) -> LayerKvCache | None:
        """Layer ``index``'s own cache (None: never written)."""
        return self._caches[index]

    def layer_rows(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Copies of layer ``index``'s keys and values ``[B, KV, n, dh]`` (n = 0 if never written)."""
        cache = self._caches[index]
        if cache is None:
            layer = self.layers[index]
            empty = np.zeros((self.batch_size, layer.kv_heads, 0, layer.head_width))
            return empty, empty.copy()
        return cache.keys(), cache.values()

    # -- writes -----------------------------------------------------------------------------------

    def append(self, index: object, x: np.ndarray) -> np.ndarray:
        """Rows ``x [B, T, D]`` appended to layer ``index`` alone (its cache made at its first write)."""
        if not isinstance(index, (int, np.integer)) or isinstance(index, (bool, np.bool_)) \
                or not 0 <= index < len(self.layers):
            raise InvalidIndices(f"layer {index!r} is not an int in [0, {len(self.layers)})")
        layer = self.layers[int(index)]
        cache = self._caches[int(index)]
        if cache is None:
            cache = LayerKvCache(layer, self.batch_size, self.capacity)
        output: np.ndarray = layer.forward_chunk(x, cache)  # checks everything before it writes
        self._caches[int(index)] = cache
        return output

    # -- operations over every layer (each checks its argument once, then changes every layer) -------

    def reset(self, *, zero_storage: bool = False) -> None:
        for cache in self._caches:
            if cache is not None:
                cache.reset(zero_storage=zero_storage)

    def truncate(self, length: object) -> None:
        """Every layer keeps its first ``min(length, n_l)`` rows; ``length`` an int in ``[0, longest layer]``."""
        longest = max(self.lengths)
        if not isinstance(length, (int, np.integer)) or isinstance(length, (bool, np.bool_)) \
                or not 0 <= length <= longest:
            raise InvalidLength(length, longest)
        for cache in self._caches:
            if cache is not None:
                cache.truncate(min(int(length), cache.length))

    def _probe(self) -> LayerKvCache:
        """An empty cache of the batch's size: it checks a batch operation's argument as a layer cache does."""
        return LayerKvCache(self.layers[0], self.batch_size, 1)

    def reorder(self, indices: Sequence[int] | np.ndarray) -> None:
        self._probe().reorder(indices)
        for cache in self._caches:
            if cache is not None:
                cache.reorder(indices)

    def select(self, indices: Sequence[int] | np.ndarray) -> None:
        self._probe().select(indices)
        for cache in self._caches:
            if cache is not None:
                cache.select(indices)
        self.batch_size = len(indices)  # the size of a layer written later, too

    def repeat_interleave(self, repeats: object) -> None:
        self._probe().repeat_interleave(repeats)
        for cache in self._caches:
            if cache is not None:
                cache.repeat_interleave(repeats)
        self.batch_size *= int(repeats)  # type: ignore[call-overload]
