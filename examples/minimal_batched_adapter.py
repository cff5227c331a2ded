"""A minimal batched adapter: ragged batches that merge and split (docs/spec.md §13.8), on the minimal example.

``examples.minimal_adapter``'s layer and cache (MHA, interleaved RoPE, float64, no validation), plus a ragged
batch kept as a server keeps one: a list of rows, each the list of its own tokens' rotated keys and values, at its
own positions 0, 1, ... -- no padding anywhere. A chunk comes left-padded (``x [B, T, D]``, row ``b``'s tokens its
last ``lengths[b]`` columns); each row attends to its own tokens only. Continuous batching's merge, extract and
filter are list operations. Nothing is checked that is not claimed: a stale batch, a row past its room or a merge
of another layer's batch is taken (the suite replaces it and judges nothing of it), a bad row index raises a plain
error (which must change nothing). Run it with::

    KVCACHE_IMPL=examples.minimal_batched_adapter:make_adapter pytest -n auto properties/test_batches.py
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from examples.minimal_adapter import Layer, MinimalAdapter, rotate


class RaggedBatch:
    def __init__(self, rows: list[list[tuple[np.ndarray, np.ndarray]]], heads: int, head_width: int) -> None:
        self.rows = rows  # per batch row: (key [H, dh] rotated at its position, value [H, dh]) per token
        self.heads, self.head_width = heads, head_width


def _row_indices(value: Any, batch_size: int) -> list[int]:
    """Distinct ints in [0, batch_size) (a list or a 1-D integer array), or a plain ValueError."""
    items = value.tolist() if isinstance(value, np.ndarray) and value.dtype.kind in "iu" else value
    if not isinstance(items, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in items) \
            or len(set(items)) != len(items) or any(not 0 <= i < batch_size for i in items):
        raise ValueError(f"{value!r} is not distinct rows of a batch of {batch_size}")
    return items


class MinimalBatchedAdapter(MinimalAdapter):
    name = "example-minimal-batched"
    capabilities = frozenset({"float64", "rope_interleaved", "ragged_rows", "batch_merge", "batch_extract",
                              "batch_filter"})

    def create_ragged_cache(self, layer: Layer, batch_size: int, capacity: int) -> RaggedBatch:
        return RaggedBatch([[] for _ in range(batch_size)], layer.heads, layer.head_width)

    def append_ragged(self, layer: Layer, cache: RaggedBatch, x: np.ndarray, lengths: Any) -> np.ndarray:
        w, heads, dh = layer.weights, layer.heads, layer.head_width
        batch, tokens, _ = x.shape
        counts = [int(n) for n in lengths]
        if len(counts) != batch or len(cache.rows) != batch:
            raise ValueError(f"{len(counts)} lengths, {batch} rows of x, {len(cache.rows)} rows in the batch")
        output = np.zeros(x.shape)
        grown = []
        for b, (row, count) in enumerate(zip(cache.rows, counts)):
            held = list(row)  # a new list: the batch changes only once every row is computed
            for column in range(tokens - count, tokens):
                token, position = x[b, column], len(held)
                query = rotate((token @ w["wq"]).reshape(heads, dh), position, layer.rope)
                key = rotate((token @ w["wk"]).reshape(heads, dh), position, layer.rope)
                held.append((key, (token @ w["wv"]).reshape(heads, dh)))
                keys = np.stack([k for k, _ in held], axis=1)  # [H, n, dh]: this row's tokens only
                values = np.stack([v for _, v in held], axis=1)
                scores = np.einsum("hd,hnd->hn", query, keys) / np.sqrt(dh)
                weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
                weights /= weights.sum(axis=-1, keepdims=True)
                output[b, column] = np.einsum("hn,hnd->hd", weights, values).reshape(heads * dh) @ w["wo"]
            grown.append(held)
        cache.rows = grown
        return output

    def ragged_snapshot(self, cache: RaggedBatch) -> list[SimpleNamespace]:
        def stacked(row: list[tuple[np.ndarray, np.ndarray]], part: int) -> np.ndarray:
            return (np.stack([token[part] for token in row], axis=1) if row
                    else np.zeros((cache.heads, 0, cache.head_width)))

        return [SimpleNamespace(keys=stacked(row, 0), values=stacked(row, 1)) for row in cache.rows]

    def merge(self, cache: RaggedBatch, other: RaggedBatch) -> None:
        cache.rows = [*cache.rows, *other.rows]  # ``other`` is ours now: its rows are not copied

    def extract(self, cache: RaggedBatch, row: Any) -> RaggedBatch:
        (index,) = _row_indices([row], len(cache.rows))
        return RaggedBatch([list(cache.rows[index])], cache.heads, cache.head_width)

    def filter(self, cache: RaggedBatch, rows: Any) -> None:
        cache.rows = [cache.rows[b] for b in _row_indices(rows, len(cache.rows))]  # [] leaves a batch of no rows

    def reset(self, cache: Any) -> None:
        if isinstance(cache, RaggedBatch):
            cache.rows = [[] for _ in cache.rows]
        else:
            super().reset(cache)


def make_adapter() -> MinimalBatchedAdapter:
    return MinimalBatchedAdapter()
