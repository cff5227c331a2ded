"""The sharing rules of a paged cache (docs/spec.md §14.3-14.6), stated independently of any implementation.

A block's identity is not a hash here but what a hash stands for: the whole
token prefix up to the block's end, plus the extra keys the adapter declares
(``chain_keys``). Two blocks may be shared only if these are equal; an add must
reuse the registered blocks of its longest such prefix, within the declared
hit limit (``expected_hit``); an operation needs a number of new blocks fixed
by the sequence it works on (``blocks_needed``); and making room evicts what
the declared eviction policy says (``eviction_problem``, over ``nodes`` where
whole nodes are evicted). Block ids are opaque hashables: no rule here needs
them to be numbers, or in a range.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
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


def expected_hit(registered: Mapping[ChainKey, Hashable], tokens: Sequence[int], scope: str, signature: str,
                 policy: PagedPolicy, block_size: int, request: Sequence[tuple[str, str]] = ()) -> list[Hashable]:
    """``hit_candidates`` with one registered block per identity: the blocks themselves."""
    return [blocks[0] for blocks in hit_candidates({key: [block] for key, block in registered.items()}, tokens,
                                                   scope, signature, policy, block_size, request)]


def hit_candidates(registered: Mapping[ChainKey, Sequence[Hashable]], tokens: Sequence[int], scope: str,
                   signature: str, policy: PagedPolicy, block_size: int,
                   request: Sequence[tuple[str, str]] = ()) -> list[list[Hashable]]:
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


def fits(needed: int, free: int, cached: set[Hashable], reused: set[Hashable]) -> bool:
    """Whether an operation can have its blocks: free ones, then cached ones it does not itself reuse."""
    return needed <= free + len(cached - reused)


def shown(blocks: Iterable[Hashable]) -> list[Hashable]:
    """Block ids in a stable order for a message: numbers by value, other ids by their repr."""
    return sorted(blocks, key=lambda b: (0, b, "") if isinstance(b, int) else (1, 0, repr(b)))


def parent(identity: ChainKey, block_size: int) -> ChainKey:
    """The identity of the block before: the same keys, the prefix one block shorter."""
    extra, tokens = identity
    return extra, tokens[:-block_size]


def nodes(cached: Mapping[Hashable, int], content: Mapping[Hashable, ChainKey], block_size: int) \
        -> list[frozenset[Hashable]]:
    """The cached blocks (block -> when it was cached) grouped into nodes: two blocks are in one node when one
    call cached both and one's identity (``content``) is the other's child, one block longer. A node is a run
    of one table's blocks that one release cached, as a radix tree's node is a run of tokens."""
    by_identity = {(content[b], cached[b]): b for b in cached}
    node_of: dict[Hashable, set[Hashable]] = {b: {b} for b in cached}
    for block in cached:
        above = by_identity.get((parent(content[block], block_size), cached[block]))
        if above is not None and node_of[above] is not node_of[block]:
            merged = node_of[above] | node_of[block]
            for member in merged:
                node_of[member] = merged
    return list({id(node): frozenset(node) for node in node_of.values()}.values())


def eviction_problem(policy: PagedPolicy, needed: int, free: int, cached: Mapping[Hashable, int],
                     reused: set[Hashable], evicted: set[Hashable], maybe: set[Hashable] = frozenset(),  # type: ignore[assignment]
                     content: Mapping[Hashable, ChainKey] | None = None, block_size: int = 1) -> str | None:
    """What is wrong with evicting ``evicted`` (None: nothing), for an operation that took ``needed`` blocks
    with ``free`` free and ``cached`` (block -> when it was cached; equal stamps: cached by one call) cached.

    ``maybe`` are cached blocks the operation took back holding the very content they had: evicted and
    recomputed, or adopted as a registered block; either reading is accepted. Under ``lru`` exactly the
    shortfall is evicted, never a block cached after one that stays. Under ``all_at_once`` every cached block
    the operation does not reuse is evicted when short, none otherwise. Under ``lru_nodes`` (``content``: each
    cached block's identity) at least the shortfall, in the order of ``lru``, a node's blocks from its leaf
    end, and more than the shortfall only within the newest node evicted.
    """
    shortfall = max(0, needed - free)
    evictable = set(cached) - reused
    kept = evictable - evicted - maybe
    if policy.eviction == "lru_nodes":
        return _node_eviction_problem(needed, free, {b: cached[b] for b in evictable}, evicted, maybe,
                                      content or {}, block_size)
    if policy.eviction == "all_at_once":
        if shortfall and kept:
            return (f"kept cached blocks {shown(kept)}, but all_at_once evicts every cached block when short "
                    f"(needed {needed} blocks, {free} free)")
        if not shortfall and evicted:
            return f"evicted {shown(evicted)} with {free} blocks free for the {needed} needed"
        return None
    if not len(evicted) <= shortfall <= len(evicted) + len(maybe):
        return (f"evicted {len(evicted)} cached blocks {shown(evicted)}, but lru evicts exactly the shortfall, "
                f"{shortfall} (needed {needed} blocks, {free} free)")
    return _order_problem(cached, evicted, kept)


def _order_problem(cached: Mapping[Hashable, int], evicted: set[Hashable], kept: set[Hashable]) -> str | None:
    if evicted and kept and max(cached[b] for b in evicted) > min(cached[b] for b in kept):
        newest = max(evicted, key=lambda b: cached[b])
        oldest = min(kept, key=lambda b: cached[b])
        return f"evicted block {newest!r}, cached after block {oldest!r}, which stays: lru evicts the oldest first"
    return None


def _node_eviction_problem(needed: int, free: int, evictable: Mapping[Hashable, int], evicted: set[Hashable],
                           maybe: set[Hashable], content: Mapping[Hashable, ChainKey], block_size: int) -> str | None:
    shortfall = max(0, needed - free)
    kept = set(evictable) - evicted - maybe
    if not shortfall and evicted:
        return f"evicted {shown(evicted)} with {free} blocks free for the {needed} needed"
    if len(evicted) + len(maybe) < shortfall:
        return (f"evicted {len(evicted)} cached blocks {shown(evicted)}, short of the shortfall "
                f"{shortfall} (needed {needed} blocks, {free} free)")
    problem = _order_problem(evictable, evicted, kept)
    if problem:
        return problem.replace("lru evicts", "lru_nodes evicts nodes")
    grouped = nodes(evictable, content, block_size)
    for node in grouped:
        for block in node & evicted:
            below = [b for b in node & kept if parent(content[b], block_size) == content[block]]
            if below:
                return (f"evicted block {block!r}, but kept {below[0]!r}, its child in the same node: a node is "
                        "evicted from its leaf end")
    if evicted:
        newest = max(evictable[b] for b in evicted)
        last = [node for node in grouped if node & evicted and evictable[next(iter(node))] == newest]
        if all(len(evicted - node) >= shortfall for node in last):
            return (f"evicted {len(evicted)} cached blocks {shown(evicted)} for a shortfall of "
                    f"{shortfall}: lru_nodes evicts whole nodes only until the shortfall is met, so only the last "
                    "node evicted may go past it")
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
