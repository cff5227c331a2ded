"""The reference paged cache (impl/paged_cache.py) on examples: oracle equality, sharing, copy-on-write,
LRU eviction, and a call that raises changing nothing."""

from __future__ import annotations

import numpy as np
import pytest

from impl import errors
from impl.conformance import ReferenceAdapter
from impl.decoder import Decoder
from impl.paged_cache import BlocksExhausted, PagedPool
from kvcache_conformance.oracle import DecoderConfig, full_decoder, random_decoder_weights

CONFIG = DecoderConfig(vocab=5, model_width=4, blocks=2, heads=2, kv_heads=1, positions="rope")
WEIGHTS = random_decoder_weights(CONFIG, 11)


def _decoder(weights: object = WEIGHTS) -> Decoder:
    decoder: Decoder = ReferenceAdapter().create_decoder(CONFIG, weights)
    return decoder


def _pool(blocks: int = 8, block_size: int = 2, **policy: object) -> PagedPool:
    return PagedPool(CONFIG.blocks, CONFIG.kv_heads, CONFIG.head_width, block_size, blocks, **policy)  # type: ignore[arg-type]


def _matches_oracle(pool: PagedPool, sequence: int) -> None:
    tokens = pool.tokens(sequence)
    trace = full_decoder(tokens, CONFIG, WEIGHTS)
    for layer, rows in enumerate(pool.rows(sequence)):
        np.testing.assert_allclose(rows.keys, trace.keys[layer], atol=1e-12, rtol=0)
        np.testing.assert_allclose(rows.values, trace.values[layer], atol=1e-12, rtol=0)
        assert rows.positions.tolist() == list(range(len(tokens)))


def test_add_append_fork_truncate_equal_full_recomputation() -> None:
    pool, model = _pool(), _decoder()
    first = pool.add(model, "app", [1, 2, 3, 4, 0])
    np.testing.assert_allclose(first.logits, full_decoder([1, 2, 3, 4, 0], CONFIG, WEIGHTS).logits, atol=1e-12)
    logits = pool.append(first.sequence, [3, 3])
    np.testing.assert_allclose(logits, full_decoder([1, 2, 3, 4, 0, 3, 3], CONFIG, WEIGHTS).logits[5:], atol=1e-12)
    child = pool.fork(first.sequence)
    pool.truncate(child, 3)
    pool.append(child, [1])
    for sequence in (first.sequence, child):
        _matches_oracle(pool, sequence)


def test_full_blocks_of_an_equal_prefix_are_shared_and_the_last_token_recomputed() -> None:
    pool, model = _pool(), _decoder()
    first = pool.add(model, "app", [1, 2, 3, 4])
    again = pool.add(model, "app", [1, 2, 3, 4])  # 2 full blocks equal, but the last token is recomputed
    assert again.reused == 2 and again.logits.shape == (2, CONFIG.vocab)
    tables = pool.state().tables
    assert tables[again.sequence][0] == tables[first.sequence][0] and pool.state().references[tables[0][0]] == 2
    other = pool.add(model, "other app", [1, 2, 3, 4])
    assert other.reused == 0  # the scope is hashed
    stale = _decoder(random_decoder_weights(CONFIG, 12))
    assert pool.add(stale, "app", [1, 2, 3, 4, 0]).reused == 0  # so are the weights


def test_a_shared_block_is_copied_before_an_append_writes_into_it() -> None:
    pool, model = _pool(), _decoder()
    parent = pool.add(model, "app", [1, 2, 3, 4]).sequence
    child = pool.fork(parent)
    assert pool.state().tables[child] == pool.state().tables[parent]  # both blocks full: shared
    pool.truncate(child, 3)
    pool.append(child, [0])
    assert pool.state().tables[child][1] != pool.state().tables[parent][1]
    for sequence in (parent, child):
        _matches_oracle(pool, sequence)


def test_a_fork_copies_the_partial_block() -> None:
    pool, model = _pool(), _decoder()
    parent = pool.add(model, "app", [1, 2, 3]).sequence
    child = pool.fork(parent)
    tables = pool.state().tables
    assert tables[child][0] == tables[parent][0] and tables[child][1] != tables[parent][1]
    pool.append(parent, [4])
    pool.append(child, [0])
    for sequence in (parent, child):
        _matches_oracle(pool, sequence)


def test_freed_registered_blocks_stay_cached_and_lru_evicts_the_oldest_tail_first() -> None:
    pool, model = _pool(blocks=4), _decoder()
    first = pool.add(model, "app", [1, 2, 3, 4]).sequence  # blocks 0, 1
    second = pool.add(model, "app", [0, 0, 0, 1]).sequence  # blocks 2, 3
    pool.free(first)
    pool.free(second)
    assert pool.state().cached == (1, 0, 3, 2) and pool.state().free == 0  # each sequence's tail first
    pool.add(model, "app", [4, 4])  # one block: the oldest cached, block 1, is evicted
    assert pool.state().cached == (0, 3, 2)
    assert pool.add(model, "app", [1, 2, 0]).reused == 2  # block 0 still serves its prefix


def test_all_at_once_eviction() -> None:
    pool, model = _pool(blocks=4, eviction="all_at_once"), _decoder()
    for tokens in ([1, 2, 3, 4], [0, 0, 0, 1]):
        pool.free(pool.add(model, "app", tokens).sequence)
    pool.add(model, "app", [4, 4])
    assert pool.state().cached == () and pool.state().free == 3


def test_node_eviction_frees_whole_least_recently_cached_runs() -> None:
    pool, model = _pool(blocks=4, eviction="lru_nodes"), _decoder()
    for tokens in ([1, 2, 3, 4], [0, 0, 0, 1]):  # blocks 0, 1 then 2, 3: two nodes of two blocks
        pool.free(pool.add(model, "app", tokens).sequence)
    pool.add(model, "app", [4, 4])  # one block short: the oldest node, both its blocks, is evicted
    assert pool.state().cached == (3, 2) and pool.state().free == 1
    assert pool.add(model, "app", [0, 0, 0, 1, 2]).reused == 4  # the younger node still serves its prefix


def test_a_hit_takes_a_cached_copy_first_where_declared() -> None:
    for hit_copy, taken in (("any", 0), ("cached_first", 2)):
        pool, model = _pool(blocks=5, duplicates="registered", hit_copy=hit_copy), _decoder()
        first = pool.add(model, "app", [1, 2]).sequence  # block 0
        second = pool.add(model, "app", [1, 2]).sequence  # its last token recomputed: block 1, a registered copy
        third = pool.add(model, "app", [1, 2]).sequence  # block 2, a third copy
        pool.free(third)
        assert pool.state().cached == (2,)
        extended = pool.add(model, "app", [1, 2, 0]).sequence
        assert pool.state().tables[extended][0] == taken and pool.state().tables[second] == (1,)
        assert pool.state().tables[first] == (0,)


def test_with_a_padding_page_blocks_are_numbered_from_one() -> None:
    pool, model = _pool(blocks=3, padding_page=True), _decoder()
    first = pool.add(model, "app", [1, 2, 3, 4, 0])
    assert pool.state().tables[first.sequence] == (1, 2, 3) and pool.state().total == 3
    _matches_oracle(pool, first.sequence)  # the padded writes into page 0 touch no block of the pool
    with pytest.raises(BlocksExhausted):
        pool.add(model, "other", [1])


def test_running_out_of_blocks_changes_nothing() -> None:
    pool, model = _pool(blocks=3), _decoder()
    kept = pool.add(model, "app", [1, 2, 3, 4]).sequence
    pool.free(pool.add(model, "app", [0, 1]).sequence)  # cached
    before = pool.state()
    with pytest.raises(BlocksExhausted):
        pool.add(model, "app", [4, 4, 4, 4, 4])  # 3 blocks: 1 evictable, 0 free
    with pytest.raises(errors.CacheFull):  # the same kind the suite maps to "full"
        pool.append(kept, [1, 1, 1])
    assert pool.state() == before
    _matches_oracle(pool, kept)


def test_a_stale_sequence_is_rejected_and_invalid_calls_change_nothing() -> None:
    pool, model = _pool(), _decoder()
    sequence = pool.add(model, "app", [1, 2, 3]).sequence
    before = pool.state()
    for length in (4, -1, True, 1.0):
        with pytest.raises(errors.InvalidLength):
            pool.truncate(sequence, length)
    with pytest.raises(errors.InvalidTokens):
        pool.append(sequence, [5])
    model.blocks[0].wq.assign(model.blocks[0].wq.value + 0.1)
    with pytest.raises(errors.CacheLayerRevisionMismatch):
        pool.append(sequence, [1])
    assert pool.state() == before


def test_nothing_leaks_once_every_sequence_is_freed() -> None:
    pool, model = _pool(blocks=6), _decoder()
    first = pool.add(model, "app", [1, 2, 3, 4, 0]).sequence
    child = pool.fork(first)
    pool.append(child, [1, 1])
    pool.truncate(first, 1)
    for sequence in (first, child):
        pool.free(sequence)
    state = pool.state()
    assert state.references == {} and state.free + len(state.cached) == 6
