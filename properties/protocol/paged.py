"""The paged-cache half of an adapter (capability ``paged_prefix_sharing``, docs/spec.md §14).

A pool serves many sequences of decoders of one geometry from ``num_blocks``
blocks of ``block_size`` rows. Sequences are opaque hashable ids the adapter
chooses. Engines differ in policy, so the adapter declares its own in
``paged_policy`` (a mapping, read by ``PagedPolicy.of``) and the suite judges
against that declaration, never against the reference's choices.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .decoder import BlockState, DecoderAdapter

PAGED_PREFIX_SHARING = "paged_prefix_sharing"
HASH_KEYS = ("scope", "signature", "lora", "multimodal", "salt")  # what a block hash may cover besides parent, tokens
REQUEST_KEYS = ("lora", "multimodal", "salt")  # the keys given with each add, when declared ("" means none)
EVICTIONS = ("lru", "all_at_once", "lru_nodes")  # least recently cached first, one block at a time; every cached
# block; or whole least recently cached nodes, possibly more than the shortfall (a radix tree's leaves, SGLang)
HIT_LIMITS = ("before_last_token", "before_last_full_block", "drops_last_hit")  # (len-1)//bs; len//bs - 1; and
# the first, then one block fewer than matched (vLLM with an EAGLE draft head)
FORKS = ("shared", "re_add", "none")  # share the parent's blocks; add its tokens again; no paged_fork
DUPLICATES = ("private_or_swap", "registered")  # a block that fills with registered content: either of the first
# two readings of docs/spec.md §14.3; or registered as well, several blocks per identity (vLLM v1)
HIT_COPIES = ("any", "cached_first")  # of several registered copies a hit takes any; or a cached one where one is


class PolicyError(TypeError):
    """A ``paged_policy`` the suite cannot judge (unknown key or value); a usage error, not a verdict."""


@dataclass(frozen=True)
class PagedPolicy:
    """What an adapter declares about its paged cache.

    - ``hash_keys``: the extra keys of a block's hash. Without ``"signature"``
      the pool belongs to one computation: the suite never mixes weights in one
      pool, and a weight update replaces the pool. Without ``"scope"`` sharing
      across scopes is declared, and must then happen. ``"lora"``,
      ``"multimodal"``, ``"salt"``: request keys (``REQUEST_KEYS``), given to
      every ``paged_add`` as ``keys``; each is a key of its own ("" means none).
    - ``eviction``: ``"lru"`` (evict exactly the shortfall, least recently
      cached first), ``"all_at_once"`` (every cached block, when short) or
      ``"lru_nodes"`` (whole nodes, least recently cached first, until the
      shortfall is met: docs/spec.md §14.6).
    - ``hit_limit``: ``"before_last_token"`` (at most ``(len-1)//bs`` full
      blocks: the last token is always recomputed), ``"before_last_full_block"``
      (at most ``len//bs - 1``) or ``"drops_last_hit"`` (as the first, then the
      last matched block dropped: vLLM with an EAGLE draft head).
    - ``truncate``: whether ``paged_truncate`` exists.
    - ``fork``: ``"shared"`` (the child shares the parent's full blocks and
      copies a partial one), ``"re_add"`` (the child is what ``paged_add`` of
      the parent's tokens in its scope would give: registered blocks reused
      up to the hit limit, the rest computed; engines' parallel sampling) or
      ``"none"`` (no ``paged_fork``: no rule that forks is drawn).
    - ``duplicates``: ``"private_or_swap"`` (a block that fills with content
      already registered stays private and unregistered, or is swapped for the
      registered block) or ``"registered"`` (it is registered too: several
      blocks per identity, each cached and evicted on its own; a hit may take
      any of them).
    - ``hit_copy``: ``"any"`` (a hit may take any registered copy; an add
      that fits only with referenced copies may refuse) or ``"cached_first"``
      (a hit takes a cached copy wherever one exists, and ``full`` is due
      exactly when the add does not fit with those copies).
    """

    hash_keys: frozenset[str] = frozenset({"scope", "signature"})
    eviction: str = "lru"
    hit_limit: str = "before_last_token"
    truncate: bool = True
    fork: str = "shared"
    duplicates: str = "private_or_swap"
    hit_copy: str = "any"

    @classmethod
    def of(cls, adapter: Any) -> PagedPolicy:
        given = getattr(adapter, "paged_policy", None)
        if given is None:
            return cls()
        if not isinstance(given, Mapping):
            raise PolicyError(f"paged_policy must be a mapping, got {type(given).__name__}")
        known = ("hash_keys", "eviction", "hit_limit", "truncate", "fork", "duplicates", "hit_copy")
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise PolicyError(f"paged_policy: unknown key {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        keys = given.get("hash_keys", ("scope", "signature"))
        if isinstance(keys, str) or not all(key in HASH_KEYS for key in keys):
            raise PolicyError(f"paged_policy['hash_keys'] must be a list drawn from {list(HASH_KEYS)}, got {keys!r}")
        eviction, hit_limit = given.get("eviction", "lru"), given.get("hit_limit", "before_last_token")
        if eviction not in EVICTIONS:
            raise PolicyError(f"paged_policy['eviction'] must be one of {list(EVICTIONS)}, got {eviction!r}")
        if hit_limit not in HIT_LIMITS:
            raise PolicyError(f"paged_policy['hit_limit'] must be one of {list(HIT_LIMITS)}, got {hit_limit!r}")
        truncate = given.get("truncate", True)
        if not isinstance(truncate, bool):
            raise PolicyError(f"paged_policy['truncate'] must be a bool, got {truncate!r}")
        fork = given.get("fork", "shared")
        if fork not in FORKS:
            raise PolicyError(f"paged_policy['fork'] must be one of {list(FORKS)}, got {fork!r}")
        duplicates = given.get("duplicates", "private_or_swap")
        if duplicates not in DUPLICATES:
            raise PolicyError(f"paged_policy['duplicates'] must be one of {list(DUPLICATES)}, got {duplicates!r}")
        hit_copy = given.get("hit_copy", "any")
        if hit_copy not in HIT_COPIES:
            raise PolicyError(f"paged_policy['hit_copy'] must be one of {list(HIT_COPIES)}, got {hit_copy!r}")
        if eviction == "lru_nodes" and duplicates == "registered":  # a node is a run of prefixes, one block each
            raise PolicyError("paged_policy: 'eviction': 'lru_nodes' and 'duplicates': 'registered' contradict each "
                              "other: a node holds one block per prefix (docs/spec.md §14.1)")
        return cls(frozenset(keys), eviction, hit_limit, truncate, fork, duplicates, hit_copy)

    @property
    def request_keys(self) -> tuple[str, ...]:
        """The declared request keys, in a stable order: ``paged_add`` is given one str value for each."""
        return tuple(key for key in REQUEST_KEYS if key in self.hash_keys)

    def methods(self) -> tuple[str, ...]:
        """The paged methods this policy adds to those of ``paged_prefix_sharing``."""
        return (*(("paged_fork",) if self.fork != "none" else ()), *(("paged_truncate",) if self.truncate else ()))

    def described(self) -> dict[str, Any]:
        """For reports and failure messages."""
        return {"hash_keys": sorted(self.hash_keys), "eviction": self.eviction, "hit_limit": self.hit_limit,
                "truncate": self.truncate, "fork": self.fork, "duplicates": self.duplicates, "hit_copy": self.hit_copy}


@dataclass(frozen=True, eq=False)
class PagedAdd:
    """What ``paged_add`` returns: the new sequence's id, the logits of the positions computed, tokens reused."""

    sequence: Hashable
    logits: np.ndarray  # [len(tokens) - reused, vocab]
    reused: int


@dataclass(frozen=True)
class PoolState:
    """The pool's accounting, as copies.

    ``free``: how many blocks hold nothing; ``cached``: blocks no table holds,
    kept for their registered content (any order); ``references``: block ->
    how many tables hold it, for every block some table holds; ``tables``:
    sequence id -> its blocks, the block of rows ``0..bs-1`` first. Block ids
    are opaque: any hashable values, each naming one block while it is held
    or cached (numbers from 1, strings...).
    """

    total: int
    free: int
    cached: tuple[Hashable, ...]
    references: dict[Hashable, int]
    tables: dict[Hashable, tuple[Hashable, ...]]


@runtime_checkable
class PagedCacheAdapter(DecoderAdapter, Protocol):
    """The methods of ``paged_prefix_sharing`` (besides ``create_decoder`` and ``update_block_weights``).

    Token sequences arrive exactly as the suite built them, valid or not.
    Results may be any objects with the fields of ``PagedAdd``, ``PoolState``
    and ``BlockState``.
    """

    paged_policy: Mapping[str, Any]

    def create_pool(self, config: Any, block_size: int, num_blocks: int) -> Any:
        """An empty pool of ``num_blocks`` blocks of ``block_size`` rows, for decoders of ``config``'s geometry."""

    def paged_add(self, pool: Any, decoder: Any, scope: str, tokens: Any, keys: Mapping[str, str] = ...) -> PagedAdd:
        """A new sequence: reuse the longest registered prefix (whole blocks, within the hit limit), compute the
        rest. Raises ``full`` (changing nothing) when the blocks it needs are neither free nor evictable. ``keys``
        (a dict: each declared request key -> a str, "" for none) is passed only if ``hash_keys`` declares one."""

    def paged_append(self, pool: Any, sequence: Hashable, tokens: Any) -> np.ndarray:
        """``T >= 1`` tokens at positions ``len..len+T-1``, causal inside the chunk; logits ``[T, vocab]``."""

    def paged_fork(self, pool: Any, sequence: Hashable) -> Hashable:
        """An independent copy, as ``paged_policy['fork']`` says (``"shared"``: full blocks shared, the partial last
        block copied; ``"re_add"``: the parent's tokens added again in its scope); returns the new id. Absent with
        ``"fork": "none"``."""

    def paged_truncate(self, pool: Any, sequence: Hashable, length: Any) -> None:
        """Keep the first ``length`` tokens (0 <= length <= len, else ``invalid_length``). Absent with
        ``"truncate": False``."""

    def paged_free(self, pool: Any, sequence: Hashable) -> None:
        """Release the sequence's blocks; registered ones stay cached."""

    def paged_rows(self, pool: Any, sequence: Hashable) -> tuple[BlockState, ...]:
        """Per decoder layer: the sequence's keys (rotated under RoPE) and values ``[KV, len, dh]``, positions."""

    def paged_state(self, pool: Any) -> PoolState:
        """The pool's accounting (``PoolState``)."""
