"""The store rules where the seed admits two readings: the suite accepts both (docs/adapters.md).

- Ties are decided on the uncapped common prefix, then the cut is capped: the seed's order, required.
- The window rule may filter the candidates (the reference) or be applied to the entry chosen.
- A prefill may compute from scratch (the reference) or first reuse a stored prefix by the query's rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from impl.conformance import ReferenceAdapter
from impl.prefix_store import PrefixStore, QueryResult
from kvcache_conformance.machines.store import Entry, acceptable_reuse, expected_reuse
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine

# Whole machine runs and subprocess runs of the suite: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow


def _entries(*token_lists: tuple[int, ...]) -> list[Entry]:
    return [Entry("app", "k", tokens, None, 0) for tokens in token_lists]  # type: ignore[arg-type]


def test_the_longest_prefix_wins_before_the_cap() -> None:
    # [0, 0] shares 2 tokens with the query, the newer [0] only 1: no tie, although both cap to 1.
    assert expected_reuse(_entries((0, 0), (0,)), "app", "k", [0, 0], windowed=False) == (0, 1)
    assert expected_reuse(_entries((0,), (0, 0)), "app", "k", [0, 0], windowed=False) == (1, 1)
    assert expected_reuse(_entries((0,), (0,)), "app", "k", [0, 1], windowed=False) == (1, 1)  # a real tie
    assert expected_reuse(_entries((3, 4)), "app", "k", [3], windowed=False) == (None, 0)  # capped to 0


def test_both_readings_of_the_window_rule() -> None:
    # [1, 2] matches whole; the newer [1, 2, 3, 9] shares more but only in part, and its early rows are gone.
    entries = _entries((1, 2), (1, 2, 3, 9))
    assert expected_reuse(entries, "app", "k", [1, 2, 3, 4, 5], windowed=True) == (0, 2)
    assert expected_reuse(entries, "app", "k", [1, 2, 3, 4, 5], windowed=True, window_rule_first=False) == (None, 0)
    assert acceptable_reuse("query", entries, "app", "k", [1, 2, 3, 4, 5], windowed=True) == [(0, 2), (None, 0)]
    assert acceptable_reuse("prefill", entries, "app", "k", [1, 2, 3, 4, 5], windowed=True) == [(None, 0), (0, 2)]


class WindowRuleLastStore(PrefixStore):
    """Chooses the longest common prefix first, then applies the window rule to that entry alone."""

    def best_prefix(self, tokens: np.ndarray, scope: str, signature: str) -> tuple[int | None, int]:
        best, longest, whole = None, 0, False
        for index, entry in enumerate(self.entries()):
            if entry.scope != scope or entry.signature != signature:
                continue
            common = 0
            while common < min(len(entry.tokens), len(tokens)) and entry.tokens[common] == tokens[common]:
                common += 1
            if common > 0 and common >= longest:
                best, longest = index, common
                whole = not entry.windowed or common == len(entry.tokens) < len(tokens)
        cut = min(longest, len(tokens) - 1) if whole else 0
        return (best, cut) if cut > 0 else (None, 0)


class OtherReadingsAdapter(ReferenceAdapter):
    """The reference with the other reading of each open rule: a conforming implementation too."""

    name = "test-store-other-readings"

    def create_store(self, capacity: int) -> PrefixStore:
        return WindowRuleLastStore(capacity)

    def store_prefill(self, store: PrefixStore, decoder: Any, scope: str, tokens: Any) -> QueryResult:
        reused = store.query(decoder, scope, tokens)  # computed reusing a stored prefix ...
        store.prefill(decoder, scope, tokens)  # ... and stored (the rows are the same)
        return reused


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
def test_the_other_readings_conform(windowed: bool) -> None:
    result = run_machine("prefix_store", OtherReadingsAdapter(), property_id=f"store-readings-{windowed}",
                         parameters={"windowed": windowed}, settings=profiles.settings_for("ci", database=None))
    assert result.failure is None, result.failure

