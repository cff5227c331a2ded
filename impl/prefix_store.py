"""The longest-common-prefix store of the prefix-reuse experiment (docs/spec.md §10).

An entry is one cached prefill: per block the K and V rows and the absolute
position of each, plus ``next_position``, under a scope (a caller string, not
authentication) and the model's computation signature. A query reuses the
longest usable common prefix of an entry of its scope and signature, copies
the retained rows, trims K, V, positions *and* ``next_position`` to the cut,
and computes the suffix from absolute position ``cut``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .decoder import Decoder, DecodeSession, validate_tokens
from .errors import InvalidStoreArgument

IMPLEMENTATION_ID = "kvcache-conformance impl.prefix_store 1"


@dataclass(frozen=True, eq=False)
class BlockRows:
    """One block's cached rows: ``keys``/``values [KV, n, dh]`` at ``positions [n]``."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray

    def copy(self) -> BlockRows:
        return BlockRows(self.keys.copy(), self.values.copy(), self.positions.copy())


@dataclass(frozen=True, eq=False)
class CachedPrefill:
    scope: str
    signature: str
    tokens: tuple[int, ...]
    blocks: tuple[BlockRows, ...]
    next_position: int
    windowed: bool


@dataclass(frozen=True, eq=False)
class QueryResult:
    """What a query computed and what it reused."""

    logits: np.ndarray  # [len(query) - cut, vocab]: the positions computed
    cut: int  # positions reused from ``entry``
    rows_computed: int  # projection rows: blocks * 3 * (len(query) - cut)
    full_rows: int  # the same for full recomputation: blocks * 3 * len(query)
    entry: int | None  # index in ``entries()`` (oldest first) of the entry reused, if any
    state: CachedPrefill  # the query's own cache afterwards (a new object; not stored)


def computation_signature(model: Decoder) -> str:
    """Everything the cached rows depend on: weights content, implementation, window, positions."""
    digest = hashlib.sha256(IMPLEMENTATION_ID.encode())
    rope = model.blocks[0].rope
    digest.update(repr((model.positions, model.window, rope.style, rope.rotary_width, rope.max_positions,
                        model.blocks[0].heads, model.blocks[0].kv_heads)).encode())
    digest.update(struct.pack("<dd", rope.base, model.sinusoid_base))
    for parameter in (model.embedding, *(p for block in model.blocks for p in block.parameters)):
        digest.update(repr(parameter.shape).encode())
        digest.update(np.ascontiguousarray(parameter.value).tobytes())
    return digest.hexdigest()


class PrefixStore:
    """At most ``capacity`` cached prefills, oldest evicted first."""

    def __init__(self, capacity: int = 2) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise InvalidStoreArgument(f"capacity must be an int >= 1, got {capacity!r}")
        self.capacity = capacity
        self._entries: list[CachedPrefill] = []  # oldest first

    def entries(self) -> list[CachedPrefill]:
        """Copies of the entries, oldest first (mutating them changes nothing here)."""
        return [_copy(entry) for entry in self._entries]

    def prefill(self, model: Decoder, scope: str, tokens: Sequence[int]) -> QueryResult:
        """Compute ``tokens`` from scratch and store the result, evicting the oldest entry if full."""
        ids, signature = self._validate(model, scope, tokens)
        result = _continue(model, ids, None, 0, 0, scope, signature)
        self._entries.append(_copy(result.state))
        del self._entries[:-self.capacity]
        return result

    def query(self, model: Decoder, scope: str, tokens: Sequence[int]) -> QueryResult:
        """Compute ``tokens`` reusing the longest usable stored prefix; store nothing."""
        ids, signature = self._validate(model, scope, tokens)
        index, cut = self.best_prefix(ids, scope, signature)
        entry = None if index is None else self._entries[index]
        return _continue(model, ids, entry, cut, cut, scope, signature, index)

    def best_prefix(self, tokens: np.ndarray, scope: str, signature: str) -> tuple[int | None, int]:
        """The entry to reuse and the cut, by the rules of docs/spec.md §10.3.

        Only entries of this scope and signature count. A full-attention entry
        is usable up to its longest contiguous common prefix with the query; a
        sliding-window entry only when all of it matches and the query extends
        it. The longest common prefix wins, ties to the newest; only then is
        the cut capped below the query's length, so that at least the last
        token is recomputed (the seed's order). A cut capped to 0 reuses nothing.
        """
        best, longest = None, 0
        for index in reversed(range(len(self._entries))):  # newest first: ties keep the newest
            entry = self._entries[index]
            if entry.scope != scope or entry.signature != signature:
                continue
            common = _common_prefix(entry.tokens, tokens)
            if entry.windowed and not (common == len(entry.tokens) < len(tokens)):
                continue  # a partial hit on a window: the rows before the cut are gone
            if common > longest:
                best, longest = index, common
        cut = min(longest, len(tokens) - 1)
        return (best, cut) if cut > 0 else (None, 0)

    def _validate(self, model: Decoder, scope: str, tokens: Sequence[int]) -> tuple[np.ndarray, str]:
        if not isinstance(scope, str):
            raise InvalidStoreArgument(f"scope must be a str, got {type(scope).__name__}")
        return validate_tokens(tokens, model.vocab), computation_signature(model)


def _continue(model: Decoder, tokens: np.ndarray, entry: CachedPrefill | None, cut: int, next_position: int,
              scope: str, signature: str, index: int | None = None) -> QueryResult:
    """Rebuild a session from ``entry``'s rows before ``cut`` (copies), resume at ``next_position``.

    The store always passes ``next_position = cut``; the experiment's negative
    control passes the entry's stale one.
    """
    session = DecodeSession(model, capacity=len(tokens))
    if entry is not None and cut > 0:
        for cache, rows in zip(session.caches, entry.blocks):
            keep = rows.positions < cut
            cache.load_rows(rows.keys[None, :, keep].copy(), rows.values[None, :, keep].copy(),
                           rows.positions[keep].copy(), next_position)
    logits = session.prefill([int(t) for t in tokens[cut:]])
    blocks = tuple(BlockRows(cache.keys()[0], cache.values()[0], cache.positions()) for cache in session.caches)
    state = CachedPrefill(scope, signature, tuple(int(t) for t in tokens), blocks,
                          session.caches[0].next_position, model.window is not None)
    per_token = 3 * len(model.blocks)  # Q, K and V projections in every block
    return QueryResult(logits=logits, cut=cut, rows_computed=per_token * (len(tokens) - cut),
                       full_rows=per_token * len(tokens), entry=index, state=state)


def _common_prefix(a: Sequence[int], b: np.ndarray) -> int:
    """Length of the longest contiguous common prefix (equal ids after a difference do not count)."""
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def _copy(entry: CachedPrefill) -> CachedPrefill:
    return CachedPrefill(entry.scope, entry.signature, entry.tokens, tuple(b.copy() for b in entry.blocks),
                         entry.next_position, entry.windowed)
