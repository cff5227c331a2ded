"""The sharing rules of a paged cache (docs/spec.md §14.3-14.6), stated independently of any implementation.

A block's identity is not a hash here but what a hash stands for: the whole
token prefix up to the block's end, plus the extra keys the adapter declares
(``chain_keys``). Two blocks may be shared only if these are equal; an add must
reuse the registered blocks of its longest such prefix, within the declared
hit limit (``expected_hit``); an operation needs a number of new blocks fixed
by the sequence it works on (``blocks_needed``); and making room evicts what
the declared eviction policy says (``eviction_problem``).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from ..protocol.paged import PagedPolicy

ChainKey = tuple[tuple[tuple[str, str], ...], tuple[int, ...]]  # (declared extra keys, the whole token prefix)


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks holding ``tokens`` rows: a partial last block counts."""
    return -(-tokens // block_size)


def extra_keys(policy: PagedPolicy, scope: str, signature: str,
               request: Sequence[tuple[str, str]] = ()) -> tuple[tuple[str, str], ...]:
    """The declared keys of an identity, each named: a request key's value "" is none, and left out."""
    return tuple((name, value) for name, value in (("scope", scope), ("signature", signature), *request)
                 if name in policy.hash_keys and (value or name in ("scope", "signature")))


def chain_keys(tokens: Sequence[int], scope: str, signature: str, policy: PagedPolicy, block_size: int,
               blocks: int | None = None, request: Sequence[tuple[str, str]] = ()) -> list[ChainKey]:
    """The identity of each full block of ``tokens`` (or of the first ``blocks``): prefix up to its end, keys."""
    full = len(tokens) // block_size if blocks is None else blocks
    extra = extra_keys(policy, scope, signature, request)
    return [(extra, tuple(int(t) for t in tokens[:(index + 1) * block_size])) for index in range(full)]


def hit_limit(policy: PagedPolicy, length: int, block_size: int) -> int:
    """How many leading full blocks an add of ``length`` tokens looks up at most (``drops_last_hit`` then drops
    the last one matched)."""
    if policy.hit_limit == "before_last_full_block":
        return max(0, length // block_size - 1)
    return (length - 1) // block_size


def shortest_prompt_with_hit(policy: PagedPolicy, block_size: int, blocks: int = 1) -> int:
    """The fewest tokens an add needs for a hit of ``blocks`` registered blocks to survive the declared hit limit
    (every leading full block registered): under ``drops_last_hit``, one more must be matched and dropped."""
    dropped = int(policy.hit_limit == "drops_last_hit")
    length = 1
    while hit_limit(policy, length, block_size) - dropped < blocks:
        length += 1
    return length


def expected_hit(registered: Mapping[ChainKey, int], tokens: Sequence[int], scope: str, signature: str,
                 policy: PagedPolicy, block_size: int, request: Sequence[tuple[str, str]] = ()) -> list[int]:
    """``hit_candidates`` with one registered block per identity: the blocks themselves."""
    return [blocks[0] for blocks in hit_candidates({key: [block] for key, block in registered.items()}, tokens,
                                                   scope, signature, policy, block_size, request)]


def hit_candidates(registered: Mapping[ChainKey, Sequence[int]], tokens: Sequence[int], scope: str, signature: str,
                   policy: PagedPolicy, block_size: int, request: Sequence[tuple[str, str]] = ()) -> list[list[int]]:
    """What an add must reuse: for each of the longest run of leading full blocks whose identities are
    registered, at most the hit limit (under ``drops_last_hit``, all but the last of them), the registered
    blocks of that identity -- one, or with registered duplicates several, of which the add takes any.
    Contiguous from the start: a registered block after the first miss is not reused (its parent differs)."""
    hit = []
    for key in chain_keys(tokens, scope, signature, policy, block_size, hit_limit(policy, len(tokens), block_size),
                          request):
        blocks = registered.get(key)
        if not blocks:
            break
        hit.append(list(blocks))
    return hit[:-1] if policy.hit_limit == "drops_last_hit" else hit


def blocks_needed(operation: str, length: int, block_size: int, *, new_tokens: int = 0, hit: int = 0,
                  last_block_shared_or_registered: bool = False) -> int:
    """New blocks an operation takes from the free or cached ones.

    - ``add``: every block of the sequence but the ``hit`` reused ones;
    - ``append``: the blocks the new rows reach beyond the sequence's own, plus one copy if the first new row
      lands in a partial block that is shared or registered (copy-on-write);
    - ``fork``: a copy of a partial last block (full blocks are shared);
    - ``truncate``, ``free``: none.
    """
    if operation == "add":
        return blocks_for(length, block_size) - hit
    if operation == "append":
        copy = length % block_size != 0 and last_block_shared_or_registered
        return blocks_for(length + new_tokens, block_size) - blocks_for(length, block_size) + int(copy)
    if operation == "fork":
        return int(length % block_size != 0)
    return 0


def fits(needed: int, free: int, cached: set[int], reused: set[int]) -> bool:
    """Whether an operation can have its blocks: free ones, then cached ones it does not itself reuse."""
    return needed <= free + len(cached - reused)


def eviction_problem(policy: PagedPolicy, needed: int, free: int, cached: Mapping[int, int], reused: set[int],
                     evicted: set[int], maybe: set[int] = frozenset()) -> str | None:  # type: ignore[assignment]
    """What is wrong with evicting ``evicted`` (None: nothing), for an operation that took ``needed`` blocks
    with ``free`` free and ``cached`` (block -> when it was cached; equal stamps: cached by one call) cached.

    ``maybe`` are cached blocks the operation took back holding the very content they had: evicted and
    recomputed, or adopted as a registered block; either reading is accepted. Under ``lru`` exactly the
    shortfall is evicted, never a block cached after one that stays. Under ``all_at_once`` every cached block
    the operation does not reuse is evicted when short, none otherwise.
    """
    shortfall = max(0, needed - free)
    evictable = set(cached) - reused
    kept = evictable - evicted - maybe
    if policy.eviction == "all_at_once":
        if shortfall and kept:
            return (f"kept cached blocks {sorted(kept)}, but all_at_once evicts every cached block when short "
                    f"(needed {needed} blocks, {free} free)")
        if not shortfall and evicted:
            return f"evicted {sorted(evicted)} with {free} blocks free for the {needed} needed"
        return None
    if not len(evicted) <= shortfall <= len(evicted) + len(maybe):
        return (f"evicted {len(evicted)} cached blocks {sorted(evicted)}, but lru evicts exactly the shortfall, "
                f"{shortfall} (needed {needed} blocks, {free} free)")
    if evicted and kept and max(cached[b] for b in evicted) > min(cached[b] for b in kept):
        newest = max(evicted, key=lambda b: cached[b])
        oldest = min(kept, key=lambda b: cached[b])
        return f"evicted block {newest}, cached after block {oldest}, which stays: lru evicts the oldest first"
    return None


def same_prefix(holders: Sequence[tuple[Hashable, int, Sequence[int], Any]], block_size: int) -> str | None:
    """A block held by several tables: (sequence, index in its table, tokens, declared keys) of each holder.

    Sharing is sound only if every holder has it at the same index, under the same declared keys, and
    the tokens of every row up to the end of what both use are equal."""
    first_sequence, first_index, first_tokens, first_keys = holders[0]
    for sequence, index, tokens, keys in holders[1:]:
        if index != first_index:
            return f"sequences {first_sequence!r} and {sequence!r} hold it at positions {first_index} and {index}"
        if keys != first_keys:
            return f"sequences {first_sequence!r} and {sequence!r} hold it under other keys: {first_keys} / {keys}"
        end = min(len(first_tokens), len(tokens), (index + 1) * block_size)
        if list(first_tokens[:end]) != list(tokens[:end]):
            return (f"sequences {first_sequence!r} and {sequence!r} share it, but their tokens up to row {end} "
                    f"differ: {list(first_tokens[:end])} / {list(tokens[:end])}")
    return None
