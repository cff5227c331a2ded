"""The paged machine draws what it promises: decoders the adapter declares, invalid lengths, and programs
that really reach sharing, exhaustion, eviction, copy-on-write and stale sequences."""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.paged_cache import BlocksExhausted
from impl.paged_conformance import make_paged_adapter
from kvcache_conformance.generate import paged_decoder_configs
from kvcache_conformance.machines.paged import INVALID_LENGTHS
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_decoders_are_small_windowless_and_declared(data: st.DataObject) -> None:
    capabilities = frozenset({"positions_rope", "rope_half_split"})
    config = data.draw(paged_decoder_configs(capabilities))
    assert config.window is None and config.positions == "rope" and config.rope_style == "half_split"
    assert 2 <= config.vocab <= 5 and config.kv_heads == config.heads and config.blocks <= 2
    grouped = data.draw(paged_decoder_configs(capabilities | {"gqa", "positions_sinusoidal"}))
    assert grouped.heads % grouped.kv_heads == 0


def test_invalid_lengths_are_invalid() -> None:
    from kvcache_conformance.machines.paged import invalid_length

    for problem in INVALID_LENGTHS:
        value = invalid_length(problem, 3)
        assert not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3), problem


class Counting(type(make_paged_adapter())):  # type: ignore[misc]
    """The reference, counting what the machine made it do."""

    name = "test-paged-counting"
    seen: ClassVar[Counter[str]] = Counter()

    def paged_add(self, pool: Any, decoder: Any, scope: str, tokens: Any) -> Any:
        before = pool.state()
        try:
            result = super().paged_add(pool, decoder, scope, tokens)
        except BlocksExhausted:
            self.seen["full"] += 1
            raise
        after = pool.state()
        reused = set(after.tables[result.sequence][:result.reused // pool.block_size])
        self.seen["reused"] += result.reused > 0
        self.seen["evicted"] += bool(set(before.cached) - set(after.cached) - reused)
        self.seen["reused a cached block"] += bool(reused & set(before.cached))
        return result

    def paged_append(self, pool: Any, sequence: Any, tokens: Any) -> Any:
        before = pool.state().tables[sequence]
        length = len(pool.tokens(sequence))
        result = super().paged_append(pool, sequence, tokens)
        after = pool.state().tables[sequence]
        self.seen["copy on write"] += bool(length % pool.block_size and after[length // pool.block_size]
                                           != before[length // pool.block_size])
        return result

    def paged_fork(self, pool: Any, sequence: Any) -> Any:
        self.seen["fork sharing a block"] += len(pool.tokens(sequence)) >= pool.block_size
        return super().paged_fork(pool, sequence)

    def update_block_weights(self, decoder: Any, block: int, weights: Any) -> None:
        self.seen["weight update"] += 1
        super().update_block_weights(decoder, block, weights)


@pytest.mark.slow
def test_programs_reach_every_situation() -> None:
    Counting.seen.clear()
    result = run_machine("paged", Counting(), property_id="paged-coverage",
                         settings=profiles.settings_for("ci", database=None, max_examples=60))
    assert result.failure is None, result.failure
    for situation in ("full", "reused", "evicted", "reused a cached block", "copy on write", "fork sharing a block",
                      "weight update"):
        assert Counting.seen[situation] >= 3, (situation, dict(Counting.seen))
