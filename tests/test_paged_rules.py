"""The paged sharing rules as properties/paged_rules.py states them (docs/spec.md §14.3-14.6), on examples."""

from __future__ import annotations

from typing import ClassVar

from kvcache_conformance.machines.paged_rules import (
    blocks_needed,
    chain_keys,
    eviction_problem,
    expected_hit,
    extra_keys,
    fits,
    hit_candidates,
    hit_limit,
    nodes,
    same_prefix,
)
from kvcache_conformance.protocol.paged import PagedPolicy, PolicyError

REFERENCE = PagedPolicy()
TRANSFORMERS = PagedPolicy(frozenset(), "all_at_once", "before_last_token", truncate=False)


def test_a_block_is_its_whole_prefix_under_the_declared_keys() -> None:
    keys = chain_keys([1, 2, 3, 4, 5], "app", "w", REFERENCE, 2)
    assert [tokens for _, tokens in keys] == [(1, 2), (1, 2, 3, 4)]  # full blocks only
    assert keys[0][0] == (("scope", "app"), ("signature", "w"))
    assert chain_keys([1, 2], "app", "w", TRANSFORMERS, 2)[0][0] == ()
    assert chain_keys([1, 2], "app", "w", REFERENCE, 2) != chain_keys([1, 2], "other", "w", REFERENCE, 2)
    assert chain_keys([1, 2], "app", "w", TRANSFORMERS, 2) == chain_keys([1, 2], "other", "v", TRANSFORMERS, 2)


def test_hit_limits() -> None:
    assert [hit_limit(REFERENCE, n, 2) for n in (1, 2, 3, 4, 5)] == [0, 0, 1, 1, 2]  # (len - 1) // bs
    last_full = PagedPolicy(hit_limit="before_last_full_block")
    assert [hit_limit(last_full, n, 2) for n in (1, 2, 3, 4, 5)] == [0, 0, 0, 1, 1]  # len // bs - 1


def test_an_add_reuses_the_longest_registered_run_from_the_start() -> None:
    registered = {key: block for key, block in zip(chain_keys([1, 2, 3, 4, 5, 6], "app", "w", REFERENCE, 2),
                                                   (7, 8, 9))}
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6, 0], "app", "w", REFERENCE, 2) == [7, 8, 9]
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6], "app", "w", REFERENCE, 2) == [7, 8]  # last token recomputed
    assert expected_hit(registered, [1, 2, 0, 4, 5, 6, 0], "app", "w", REFERENCE, 2) == [7]  # parent differs after
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6, 0], "other", "w", REFERENCE, 2) == []
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6, 0], "app", "v", REFERENCE, 2) == []
    eagle = PagedPolicy(hit_limit="drops_last_hit")  # capped as before_last_token, then one block fewer
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6, 0], "app", "w", eagle, 2) == [7, 8]
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6], "app", "w", eagle, 2) == [7]
    assert expected_hit(registered, [1, 2, 0, 4, 5, 6, 0], "app", "w", eagle, 2) == []  # a shorter run: dropped too
    assert expected_hit(registered, [1, 2, 3, 4, 5, 6, 0], "other", "w", eagle, 2) == []


def test_with_registered_duplicates_a_hit_may_take_any_copy() -> None:
    keys = chain_keys([1, 2, 3, 4], "app", "w", REFERENCE, 2)
    registered = {keys[0]: [7, 3], keys[1]: [8]}  # two copies of the first block's content
    duplicates = PagedPolicy(duplicates="registered")
    assert hit_candidates(registered, [1, 2, 3, 4, 0], "app", "w", duplicates, 2) == [[7, 3], [8]]
    assert hit_candidates(registered, [1, 2, 0, 4, 0], "app", "w", duplicates, 2) == [[7, 3]]
    assert expected_hit({keys[0]: 7}, [1, 2, 3, 4, 0], "app", "w", REFERENCE, 2) == [7]


def test_blocks_an_operation_takes() -> None:
    assert blocks_needed("add", 5, 2, hit=1) == 2
    assert blocks_needed("append", 3, 2, new_tokens=1) == 0  # fills the partial block
    assert blocks_needed("append", 3, 2, new_tokens=1, last_block_shared_or_registered=True) == 1  # copy first
    assert blocks_needed("append", 4, 2, new_tokens=1, last_block_shared_or_registered=True) == 1  # a new block
    assert blocks_needed("fork", 4, 2) == 0 and blocks_needed("fork", 5, 2) == 1
    assert blocks_needed("truncate", 5, 2) == blocks_needed("free", 5, 2) == 0
    assert fits(2, 1, {3, 4}, {3}) and not fits(3, 1, {3, 4}, {3})  # a block the add reuses is not evictable


def test_eviction_under_each_policy() -> None:
    cached = {1: 0, 2: 0, 3: 5}  # 1 and 2 cached by one call, 3 later
    assert eviction_problem(REFERENCE, 2, 1, cached, set(), {1}) is None
    assert eviction_problem(REFERENCE, 2, 1, cached, set(), {2}) is None  # ties: either
    assert "cached after" in str(eviction_problem(REFERENCE, 2, 1, cached, set(), {3}))
    assert "exactly the shortfall" in str(eviction_problem(REFERENCE, 2, 1, cached, set(), {1, 2, 3}))
    assert "exactly the shortfall" in str(eviction_problem(REFERENCE, 1, 1, cached, set(), {1}))
    assert eviction_problem(TRANSFORMERS, 2, 1, cached, set(), {1, 2, 3}) is None
    assert "every cached block" in str(eviction_problem(TRANSFORMERS, 2, 1, cached, set(), {1}))
    assert eviction_problem(TRANSFORMERS, 2, 1, cached, {3}, {1, 2}) is None  # the add reuses 3
    assert eviction_problem(TRANSFORMERS, 1, 1, cached, set(), set()) is None
    assert eviction_problem(REFERENCE, 2, 1, cached, set(), set(), maybe={1}) is None  # recomputed in place


def test_sound_and_unsound_sharing() -> None:
    keys = (("scope", "app"),)
    assert same_prefix([("a", 0, [1, 2, 3, 4], keys), ("b", 0, [1, 2, 3, 9], keys)], 2) is None  # block of rows 0, 1
    assert "differ" in str(same_prefix([("a", 1, [1, 2, 3, 4], keys), ("b", 1, [1, 2, 3, 9], keys)], 2))
    assert same_prefix([("a", 1, [1, 2, 3, 4], keys), ("b", 1, [1, 2, 3], keys)], 2) is None  # a truncated holder
    assert "differ" in str(same_prefix([("a", 1, [1, 2, 3, 4], keys), ("b", 1, [0, 2, 3, 4], keys)], 2))
    assert "positions" in str(same_prefix([("a", 1, [1, 2, 3, 4], keys), ("b", 0, [3, 4], keys)], 2))
    assert "other keys" in str(same_prefix([("a", 0, [1, 2], keys), ("b", 0, [1, 2], (("scope", "x"),))], 2))


def test_request_keys_are_named_and_none_is_left_out() -> None:
    policy = PagedPolicy(hash_keys=frozenset({"scope", "lora", "salt"}))
    assert policy.request_keys == ("lora", "salt")
    lora_x = extra_keys(policy, "app", "w", (("lora", "X"), ("salt", "")))
    salt_x = extra_keys(policy, "app", "w", (("lora", ""), ("salt", "X")))
    assert lora_x == (("scope", "app"), ("lora", "X")) and salt_x == (("scope", "app"), ("salt", "X"))
    assert lora_x != salt_x  # one value under two keys is two identities
    assert extra_keys(policy, "app", "w", (("lora", ""), ("salt", ""))) == (("scope", "app"),)


def test_policies_are_read_and_checked() -> None:
    class Declares:
        paged_policy: ClassVar[dict[str, object]] = {"hash_keys": [], "eviction": "all_at_once", "truncate": False}

    assert PagedPolicy.of(Declares()) == TRANSFORMERS
    assert PagedPolicy.of(object()) == REFERENCE
    for bad in ({"hash_keys": ["lora id"]}, {"eviction": "fifo"}, {"hit_limit": 3}, {"colour": 1}, {"truncate": 1},
                {"hash_keys": "scope"}):
        Declares.paged_policy = bad
        try:
            PagedPolicy.of(Declares())
        except PolicyError:
            continue
        raise AssertionError(f"accepted {bad}")


# -- node eviction, hits of cached copies, opaque block ids (docs/spec.md §14.1, §14.3, §14.6) --------------------

NODES = PagedPolicy(eviction="lru_nodes")


def _identities(tokens: list[int], blocks: list[object], block_size: int = 1) -> dict[object, object]:
    return dict(zip(blocks, chain_keys(tokens, "app", "w", NODES, block_size)))


def test_a_node_is_a_chain_of_blocks_one_call_cached() -> None:
    content = {**_identities([1, 2, 3], ["a", "b", "c"]), **_identities([7, 8], ["x", "y"])}
    cached = {"a": 0, "b": 0, "c": 0, "x": 1, "y": 2}  # x and y: cached by two calls
    assert sorted(map(sorted, nodes(cached, content, 1))) == [["a", "b", "c"], ["x"], ["y"]]
    assert sorted(map(sorted, nodes({"a": 0, "c": 0}, content, 1))) == [["a"], ["c"]]  # b between them is not cached


def test_node_eviction_may_pass_the_shortfall_within_the_last_node_only() -> None:
    content = {**_identities([1, 2], [1, 2]), **_identities([5, 6], [5, 6]), **_identities([9], [9])}
    cached = {1: 0, 2: 0, 5: 1, 6: 1, 9: 2}  # nodes {1, 2} oldest, then {5, 6}, then {9}
    def problem(needed: int, evicted: set[int], policy: PagedPolicy = NODES) -> str | None:
        return eviction_problem(policy, needed, 0, cached, set(), evicted, content=content, block_size=1)

    assert problem(1, {1, 2}) is None  # asked for one block, the whole leaf goes (a radix tree's node)
    assert problem(1, {2}) is None  # from its leaf end: exactly the shortfall is fine too
    assert problem(3, {1, 2, 5, 6}) is None
    assert "only the last node" in str(problem(2, {1, 2, 5, 6}))  # met by the first node: the second is surplus
    assert "oldest first" in str(problem(2, {5, 6}))  # a newer node before the older one
    assert "leaf end" in str(problem(1, {1}))  # its child 2 stays: not a whole leaf
    assert "short of the shortfall" in str(problem(3, {1, 2}))
    assert "blocks free" in str(eviction_problem(NODES, 1, 1, cached, set(), {9}, content=content))
    assert "exactly the shortfall" in str(problem(1, {1, 2}, REFERENCE))  # block-exact lru: the same eviction fails
    assert problem(1, {2}, REFERENCE) is None  # what lru evicts, lru_nodes accepts


def test_node_eviction_leaves_the_blocks_an_add_reuses() -> None:
    content = _identities([1, 2, 3], [1, 2, 3])
    cached = {1: 0, 2: 0, 3: 0}
    # the add reuses 1: what is left of the node is {2, 3}, evicted whole
    assert eviction_problem(NODES, 1, 0, cached, {1}, {2, 3}, content=content) is None
    assert "leaf end" in str(eviction_problem(NODES, 1, 0, cached, {1}, {2}, content=content))


def test_block_ids_are_opaque() -> None:
    keys = chain_keys([1, 2, 3, 4], "app", "w", REFERENCE, 2)
    registered = {keys[0]: ["page-7", "page-3"], keys[1]: [("p", 8)]}
    duplicates = PagedPolicy(duplicates="registered")
    assert hit_candidates(registered, [1, 2, 3, 4, 0], "app", "w", duplicates, 2) == [["page-7", "page-3"], [("p", 8)]]
    assert fits(1, 0, {"page-3", "page-7"}, {"page-3"}) and not fits(2, 0, {"page-3", "page-7"}, {"page-3"})
    cached = {"page-1": 0, 13: 1}
    assert eviction_problem(REFERENCE, 1, 0, cached, set(), {"page-1"}) is None
    assert "cached after" in str(eviction_problem(REFERENCE, 1, 0, cached, set(), {13}))


def test_the_new_policy_keys_are_read_and_contradictions_refused() -> None:
    class Declares:
        paged_policy: ClassVar[dict[str, object]] = {"eviction": "lru_nodes"}

    assert PagedPolicy.of(Declares()) == NODES
    Declares.paged_policy = {"duplicates": "registered", "hit_copy": "cached_first"}
    assert PagedPolicy.of(Declares()).hit_copy == "cached_first" and REFERENCE.hit_copy == "any"
    for bad in ({"hit_copy": "first"}, {"eviction": "lru_nodes", "duplicates": "registered"}):
        Declares.paged_policy = bad
        try:
            PagedPolicy.of(Declares())
        except PolicyError:
            continue
        raise AssertionError(f"accepted {bad}")
