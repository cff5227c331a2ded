"""Hard cases on purpose, not by chance (issue 23, item 3): under the reference's full declaration, a run of each
machine reaches them, because a rule draws each one and constructs it. The runs are derandomised, as the floors'
are: a random run of the default profile reaches each case too, but "at least three times" is then a likelihood
(about one random run in five met some case only twice), and a test of it would flake.

- every malformed-input and over-capacity rule of the layer machines and the session meets an empty cache (session)
  and one holding rows (tokens); a stale cache holding rows is cut, then refuses a row; one holding rows is cut
  past its length;
- under a hit limit that drops the last hit, the paged request-key and duplicate rules reach hits that survive it,
  and a keyed prompt is added past a block an append filled;
- valid selections other than the leading rows, and valid reorders that move rows, are made on caches holding rows;
- in the window run, valid and malformed chunks meet a ring that has wrapped; a windowed session decodes once its
  window is full;
- each rule keeps at least its floor (``FLOORS``) of a derandomised run's examples with everything declared.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test

from impl.conformance import make_cached_first_paged_adapter, make_full_declaration_adapter
from kvcache_conformance import generate as g
from kvcache_conformance.judge.policy import Judged
from kvcache_conformance.machines.layer import GROUPINGS, LayerCacheMachine
from kvcache_conformance.machines.layer_steps import BASE_ONE_ULP_AWAY, MALFORMED, MEETS, ROPE_CHANGES
from kvcache_conformance.machines.operations import (
    BATCHES,
    CHUNK_MEETS,
    CUTS,
    EVICTED_CUTS,
    NEGATIVE,
    REJECTED_CHUNK_MEETS,
    REORDERS,
    SELECTIONS,
    WRAPPED,
    CacheOperationsMachine,
)
from kvcache_conformance.machines.paged import PagedCacheMachine
from kvcache_conformance.machines.paged_rules import chain_keys, hit_candidates, shortest_prompt_with_hit
from kvcache_conformance.machines.session import (
    DECODE_MEETS,
    PREFILL_MEETS,
    STEP_MEETS,
    WINDOWS,
    SessionMachine,
)
from kvcache_conformance.protocol.kinds import ErrorKind
from kvcache_conformance.protocol.paged import HIT_LIMITS, PagedPolicy
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine, without_local_constants

EXAMPLES = 200  # twice the dev profile's: a case drawn in a quarter of its rule's calls is met well past three times
# The rejection rules of the layer machines, each drawing (its "meets" draw) an empty cache or one holding rows.
EMPTY, HELD = MEETS[1], MEETS[2]
REJECTIONS = ("append_malformed_row", "append_non_finite_row")
CHUNKED_REJECTIONS = ("append_malformed_chunk", "append_non_finite_chunk")

FLOOR_EXAMPLES = 150
# The floor of each rule's share of a run's examples (the examples it ran in, of all), with everything the reference
# declares, so that a capability declared or a rule added cannot thin an older rule out unseen: a quarter of its share
# in one derandomised dev run of 100 examples (derandomised runs drew different programs outside and inside pytest:
# the margin is for that).
# Rebalancing a machine's rules moves these shares; a rule that falls under its floor is thinned out, not unlucky.
# 0.0: not drawn there under the full declaration -- a frozen scale (append_zero_first_row_then_a_row), weights whose
# output overflows on an empty cache (append_first_row_overflowing_the_output), the window run's own rule in the full
# run, and in the window run the rules it leaves to the full runs (layer_steps.NOT_IN_WINDOWED_RUNS); and a ring of
# window and sinks (declared apart: window_full_counts_sinks, judged by the lattice); and in the layer run a lone
# overflowing projection, drawn only where the weights have one (0.04 outside pytest, 0 inside). Measured 2026-12-03,
# with the hard cases drawn inside the rules that need them (no rule of their own), so the layer machines' shares
# are those of the plain reference; the paged machine's three rules for hit limits and duplicates run only where
# declared.
# A rule met in under 2% of the examples keeps 0.005 (one example in 200).
# Remeasured 2026-12-05 after truncate's cut of rows held (a third "cuts" case): the window run's derandomised
# programs moved, and fork_then_overwrite ran in 0.075 of them (floor 0.08 -> 0.06). Under the ci seed of the
# property and the release (not of the runner's text), the full run's 100 derandomised examples drew
# append_peaked_row in none (0.23 of 200 examples): unlucky, not thinned out (floor 0.02 -> 0.0).
# 2026-12-06, the paged duplicates rule's pool filled exactly (a hard case): the paged run's 100 derandomised
# examples then drew append in 0.03 of them and truncate_inside_a_shared_block_then_append in 0.01, where 4 random
# runs of 100 drew them in 0.22 and 0.24 (0.17 and 0.11 before the change): one program's luck. The runs are
# now 150 examples (FLOOR_EXAMPLES), under which every run keeps every floor, the paged one included.
# Remeasured 2026-12-04 where a share fell under its floor, after the wrapped-ring chunks and the reorders on rows
# held: in the window run the caches are fuller, so the rule that needs an empty one ran in 0.086 (floor 0.02, a
# quarter); in the full run no drawn weights had a lone overflowing projection (floor 0.0, as in the layer run).
# Without Hypothesis's local constants (the same day), the paged machine's append to a stale sequence ran in none of
# a derandomised run's examples and in one random run of three (0.009): rare by its precondition, floor 0.0.
FLOORS: dict[str, dict[str, float]] = {
    "layer_cache": {
        "append_first_row_overflowing_the_output": 0.0, "append_into_cache_of_other_geometry": 0.17,
        "append_malformed_row": 0.1, "append_malformed_row_to_an_empty_cache": 0.11, "append_non_finite_row": 0.15,
        "append_overflowing_row": 0.09, "append_peaked_row": 0.06, "append_row_overflowing_a_score": 0.16,
        "append_row_overflowing_one_projection": 0.0, "append_rows": 0.12, "append_through_recreated_layer": 0.11,
        "append_under_other_rope": 0.06, "append_zero_first_row_then_a_row": 0.0, "replace_cache": 0.03,
        "reset": 0.11, "update_weights_in_place": 0.12,
    },
    "cache_operations": {
        "append_chunk": 0.09, "append_first_row_overflowing_the_output": 0.0,
        "append_into_cache_of_other_geometry": 0.11, "append_malformed_chunk": 0.1,
        "append_malformed_chunk_to_an_empty_cache": 0.06, "append_malformed_row": 0.05,
        "append_malformed_row_to_an_empty_cache": 0.06, "append_non_finite_chunk": 0.07,
        "append_non_finite_row": 0.12, "append_overflowing_row": 0.05, "append_peaked_row": 0.0,
        "append_row_overflowing_a_score": 0.09, "append_row_overflowing_one_projection": 0.0, "append_rows": 0.05,
        "append_through_recreated_layer": 0.07, "append_under_other_rope": 0.02,
        "append_zero_first_row_then_a_row": 0.0, "fork": 0.05, "fork_then_overwrite": 0.02, "reorder": 0.06,
        "repeat_interleave": 0.1, "replace_cache": 0.03, "reset": 0.08, "select": 0.07, "switch_cache": 0.04,
        "truncate": 0.03, "truncate_a_ring_of_window_and_sinks": 0.0, "truncate_after_the_window_evicts": 0.0,
        "update_weights_in_place": 0.07,
    },
    "cache_operations[window]": {
        "append_chunk": 0.06, "append_first_row_overflowing_the_output": 0.0,
        "append_into_cache_of_other_geometry": 0.0, "append_malformed_chunk": 0.11,
        "append_malformed_chunk_to_an_empty_cache": 0.09, "append_malformed_row": 0.09,
        "append_malformed_row_to_an_empty_cache": 0.02, "append_non_finite_chunk": 0.15,
        "append_non_finite_row": 0.08, "append_overflowing_row": 0.0, "append_peaked_row": 0.0,
        "append_row_overflowing_a_score": 0.0, "append_row_overflowing_one_projection": 0.0, "append_rows": 0.1,
        "append_through_recreated_layer": 0.0, "append_under_other_rope": 0.0,
        "append_zero_first_row_then_a_row": 0.0, "fork": 0.08, "fork_then_overwrite": 0.06, "reorder": 0.1,
        "repeat_interleave": 0.12, "replace_cache": 0.03, "reset": 0.11, "select": 0.09, "switch_cache": 0.08,
        "truncate": 0.11, "truncate_a_ring_of_window_and_sinks": 0.0, "truncate_after_the_window_evicts": 0.11,
        "update_weights_in_place": 0.0,
    },
    "paged": {
        "add": 0.13, "add_a_duplicate_then_evict_a_copy": 0.06, "add_invalid_tokens": 0.12,
        "add_invalid_tokens_where_room_needs_eviction": 0.06, "add_keyed_past_a_block_an_append_filled": 0.1,
        "add_one_value_under_each_request_key": 0.09,
        "add_one_value_under_each_request_key_past_the_hit_limit": 0.09, "add_twice_in_other_scopes": 0.11,
        "append": 0.04, "append_to_a_stale_sequence": 0.0, "exhaust_the_pool": 0.11, "fork": 0.06,
        "fork_and_append_to_both": 0.06, "free": 0.06, "free_everything": 0.13, "truncate": 0.08,
        "truncate_inside_a_shared_block_then_append": 0.03, "truncate_into_a_shared_block_then_append": 0.05,
        "truncate_to_an_invalid_length": 0.03, "update_weights_in_place": 0.08,
        "with_duplicates_hit_a_cached_and_an_in_use_copy": 0.04,
    },
    "session": {
        "decode": 0.08, "prefill": 0.11, "replace_session": 0.09, "reset": 0.15,
        "revision_checked_before_capacity": 0.05, "step_with_invalid_tokens": 0.12,
        "tokens_checked_before_capacity": 0.09, "tokens_checked_before_revision": 0.15,
        "update_one_block_in_place": 0.12,
    },
}


def drive(machine: type, settings: Any) -> None:
    """``machine`` as the suite runs machines: without Hypothesis's local constants (``without_local_constants``)."""
    with without_local_constants():
        run_state_machine_as_test(machine, settings=settings)


def dev(examples: int = EXAMPLES) -> Any:
    """The default profile's settings, derandomised: the same programs every run."""
    return profiles.settings_for("dev", database=None, max_examples=examples, derandomize=True)


class Seen:
    """What the watched machines did: each adapter call's rule, call and situation; each run's rules."""

    calls: ClassVar[list[tuple[str, str, dict[str, Any]]]] = []
    examples: ClassVar[Counter[str]] = Counter()  # rule -> examples it ran in
    runs: ClassVar[list[int]] = [0]  # examples run
    setups: ClassVar[list[tuple[dict[str | None, Any], Any]]] = []  # each example's set-up draws and configuration

    @classmethod
    def clear(cls) -> None:
        cls.calls.clear()
        cls.setups.clear()
        cls.examples.clear()
        cls.runs[0] = 0


def watched(machine: type, adapter: Any, **parameters: Any) -> type:
    """``machine`` over ``adapter``, recording every judged call with the rule that made it and the rows held."""

    class Watching(machine):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__(adapter, **parameters)

        def call(self, what: str, action: Any, **details: Any) -> Judged:
            situation = ({"held": len(self.model.rows), "full": self.full, "wrapped": self.wrapped(),
                          "batch": self.model.batch_size, "capacity": self.config.capacity,
                          "kv heads": self.config.weights.kv_heads, "stale": self.model.stale}
                         if hasattr(self, "model") else {"held": len(self.tokens), "window": self.config.window}
                         if hasattr(self, "tokens") else {})
            situation.update(reused=details.get("reused", 0), due=details.get("due"), meets=self.drawn_case(),
                             draws=dict(self.tape.steps[-1].draws) if self.tape.steps else {},
                             window=getattr(self, "window", situation.get("window")), sinks=getattr(self, "sinks", 0))
            Seen.calls.append((self.tape.steps[-1].rule if self.tape.steps else "", what, situation))
            return super().call(what, action, **details)  # type: ignore[no-any-return]

        def drawn_case(self) -> str | None:
            """The hard case the current rule drew on purpose (its "meets", "cuts", "selects" or "reorders" draw),
            if any."""
            draws = self.tape.steps[-1].draws if self.tape.steps else []
            return next((value for label, value in draws if label in ("meets", "cuts", "selects", "reorders")), None)

        def wrapped(self) -> bool:
            """A window cache that has been fed more than W + S rows since it was created or reset, or is full."""
            window = getattr(self, "window", None)
            return window is not None and (len(self.model.rows) > window + self.sinks or self.full)

        def teardown(self) -> None:
            Seen.setups.append((dict(self.tape.steps[0].draws) if self.tape.steps else {}, self.config))
            Seen.examples.update({step.rule for step in self.tape.steps})
            Seen.runs[0] += 1
            super().teardown()

    return Watching


def rejected(rule: str, meets: str | None = None, steps: tuple[str, ...] = ("append",)) -> list[dict[str, Any]]:
    """The situations of the judged ``steps`` (appends; a session's prefills and decodes) a rule made, having drawn
    the hard case ``meets`` (any, if None), that were due to be rejected."""
    return [s for r, what, s in Seen.calls if r == rule and what.startswith(steps) and s["due"] is not None
            and s["due"].kind is not None and (meets is None or s["meets"] == meets)]


def met_both(rule: str, empty: str, held: str, steps: tuple[str, ...] = ("append",)) -> None:
    on_empty, on_held = rejected(rule, empty, steps), rejected(rule, held, steps)
    assert len(on_empty) >= 3 and all(s["held"] == 0 for s in on_empty), (rule, empty, on_empty)
    assert len(on_held) >= 3 and all(s["held"] > 0 for s in on_held), (rule, held, on_held)


LAYER_RUNS = [("layer_cache", LayerCacheMachine, {}), ("cache_operations", CacheOperationsMachine, {}),
              ("cache_operations[window]", CacheOperationsMachine, {"windowed": True})]


@pytest.mark.slow
@pytest.mark.parametrize("name, machine, parameters", LAYER_RUNS, ids=[run[0] for run in LAYER_RUNS])
def test_every_rejection_rule_meets_an_empty_cache_and_rows_held(name: str, machine: type,
                                                                  parameters: dict[str, Any]) -> None:
    Seen.clear()
    drive(watched(machine, make_full_declaration_adapter(), **parameters), dev())
    for rule in REJECTIONS + (() if machine is LayerCacheMachine else CHUNKED_REJECTIONS):
        met_both(rule, EMPTY, HELD)
    full = rejected("append_rows", "a full cache")
    assert len(full) >= 3 and all(s["full"] and s["held"] > 0 for s in full), full
    if machine is CacheOperationsMachine:
        met_both("append_chunk", CHUNK_MEETS[1], CHUNK_MEETS[2])
    if machine is CacheOperationsMachine and not parameters:  # a stale cache holding rows cut, then a row refused
        cut = [s for s in rejected("truncate", "a stale cache, then a row")
               if s["due"].kind == ErrorKind.REVISION_MISMATCH]
        assert len(cut) >= 3, len(cut)
    if machine is CacheOperationsMachine:  # cuts that remove rows a cache holds, then a row (window runs too)
        removed = [what for r, what, s in Seen.calls if r == "truncate" and s["meets"] == CUTS[2]
                   and what.startswith("truncate") and int(what.rsplit(" to ", 1)[1]) < s["held"]]
        assert len(removed) >= 3, len(removed)
        past = [s for r, what, s in Seen.calls if r == "truncate" and s["meets"] == CUTS[3]
                and what.startswith("truncate") and s["held"] > 0 and s["due"].kind == ErrorKind.INVALID_LENGTH
                and int(what.rsplit(" to ", 1)[1]) > s["held"]]
        assert len(past) >= 3, len(past)  # a cache holding rows cut past its length


@pytest.mark.slow
def test_every_rejected_step_of_a_session_meets_an_empty_session_and_tokens_held() -> None:
    Seen.clear()
    drive(watched(SessionMachine, make_full_declaration_adapter()), dev())
    met_both("step_with_invalid_tokens", STEP_MEETS[1], STEP_MEETS[2], ("prefill", "decode"))
    met_both("prefill", PREFILL_MEETS[1], PREFILL_MEETS[2], ("prefill",))
    past = [s for r, what, s in Seen.calls if r == "decode" and s["meets"] == DECODE_MEETS[1]
            and what.startswith("decode") and s["due"] is not None and s["due"].kind is None]
    assert len(past) >= 5 and all(s["held"] >= s["window"] for s in past), past  # the window is full, then a token


@pytest.mark.slow
def test_non_prefix_selections_are_made_on_caches_holding_rows() -> None:
    Seen.clear()
    drive(watched(CacheOperationsMachine, make_full_declaration_adapter()), dev())
    made = [(what, s) for r, what, s in Seen.calls if r == "select" and s["meets"] == SELECTIONS[1]
            and what.startswith("select")]
    assert len(made) >= 5 and all(s["held"] > 0 for _, s in made), len(made)
    kept = {what.rsplit("rows ", 1)[1] for what, _ in made}
    assert "[0]" not in kept and "[0, 1]" not in kept, kept  # never the leading rows


@pytest.mark.slow
def test_reorders_that_move_rows_are_made_on_caches_holding_rows() -> None:
    Seen.clear()
    drive(watched(CacheOperationsMachine, make_full_declaration_adapter()), dev())
    # (a stale cache replaced first may come back at the configured batch of 1, where no reorder moves a row: the
    # rule then draws any indices)
    made = [(what, s) for r, what, s in Seen.calls if r == "reorder" and s["meets"] == REORDERS[1]
            and what.startswith("reorder") and s["batch"] >= 2]
    assert len(made) >= 5 and all(s["held"] > 0 and s["due"].kind is None for _, s in made), len(made)
    orders = [what.rsplit("indices ", 1)[1] for what, _ in made]
    assert all(order not in ("[0, 1]", "[0, 1, 2]") for order in orders), orders  # never the identity


@pytest.mark.slow
@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
def test_reorders_move_rows_of_a_batch_as_large_as_the_kv_heads(windowed: bool) -> None:
    """A cache's batch is drawn on purpose as large as its layer's KV heads (a layer of 2 or 3 KV heads drawn in place
    of one no batch reaches), and the reorder's third case moves rows held in such a batch (a fresh cache where a
    select or repeat changed it): a gather along the KV-head axis keeps every shape there and shows only in the rows
    it moved (the reorder_along_the_head_axis mutant, killed in 18 random ci runs of 20 before)."""
    Seen.clear()
    drive(watched(CacheOperationsMachine, make_full_declaration_adapter(), windowed=windowed), dev())
    as_large = [(draws, config) for draws, config in Seen.setups if draws.get("batch") == BATCHES[1]]
    assert len(as_large) >= 3 and all(2 <= c.batch_size == c.weights.kv_heads <= g.MAX_BATCH for _, c in as_large)
    assert any("batch geometry" in draws for draws, _ in as_large), "no layer drawn in place of one no batch reaches"
    made = [(what, s) for r, what, s in Seen.calls if r == "reorder" and s["meets"] == REORDERS[2]
            and what.startswith("reorder") and s["batch"] == s["kv heads"] >= 2]
    assert len(made) >= 3 and all(s["held"] > 0 and s["due"].kind is None for _, s in made), len(made)
    orders = [what.rsplit("indices ", 1)[1] for what, _ in made]
    assert all(order not in ("[0, 1]", "[0, 1, 2]") for order in orders), orders  # never the identity


@pytest.mark.slow
def test_rope_bases_one_ulp_away_meet_caches_that_are_not_stale() -> None:
    """The layer machine hands, on purpose, the layer under a RoPE base one ulp away to a cache that is not stale
    (ROPE_MISMATCH due): a base compared within a tolerance shows only there (the rope_base_with_tolerance mutant,
    killed in 19 random ci runs of 20 before)."""
    Seen.clear()
    drive(watched(LayerCacheMachine, make_full_declaration_adapter()), dev())
    made = [what for r, what, s in Seen.calls if r == "append_under_other_rope" and what.startswith("append")
            and s["draws"].get("rope change") == ROPE_CHANGES[1]]
    assert len(made) >= 3 and all(any(name in what for name in BASE_ONE_ULP_AWAY) for what in made), made
    due = [s["due"].kind for r, what, s in Seen.calls if r == "append_under_other_rope" and what.startswith("append")
           and s["draws"].get("rope change") == ROPE_CHANGES[1]]
    assert all(kind == ErrorKind.ROPE_MISMATCH for kind in due), due  # never hidden behind a stale cache


@pytest.mark.slow
def test_malformed_rows_on_purpose_are_valid_rows_as_lists_and_single_rows_into_a_batch() -> None:
    """The layer machine's malformed-row rules hand, on purpose, a valid row as nested lists (DTYPE alone) and one
    valid row into a cache of a batch of 2 or more (BATCH_MISMATCH alone): what a converting or a broadcasting
    cache takes, each about one malformed row in a hundred when drawn at random."""
    Seen.clear()
    drive(watched(LayerCacheMachine, make_full_declaration_adapter()), dev())
    for case, kind, shown in ((MALFORMED[1], ErrorKind.DTYPE, "append list of shape"),
                              (MALFORMED[2], ErrorKind.BATCH_MISMATCH, "append float64 array of shape (1, 1, ")):
        made = [what for r, what, s in Seen.calls if r.startswith("append_malformed_row") and what.startswith("append")
                and s["draws"].get("malformed") == case and s["batch"] >= 2]  # a batch of 1: any malformed row
        assert len(made) >= 3 and all(what.startswith(shown) and f"({kind.value})" in what for what in made), made
    # into a cache of one row, the batch case hands two or three valid rows instead (a write of the first rows)
    larger = [what for r, what, s in Seen.calls if r.startswith("append_malformed_row") and what.startswith("append")
              and s["draws"].get("malformed") == MALFORMED[2] and s["batch"] == 1]
    shapes = ("append float64 array of shape (2, 1, ", "append float64 array of shape (3, 1, ")
    assert len(larger) >= 3 and all(what.startswith(shapes) for what in larger), larger


@pytest.mark.slow
def test_grouped_layers_on_purpose_share_each_of_two_kv_heads_or_more() -> None:
    """Where a layer of one KV head is drawn, on purpose one whose query heads share each of two KV heads or more
    (a query head mapped to KV head h % KV, not h // (H / KV), shows only there); one KV head is still drawn."""
    Seen.clear()
    drive(watched(LayerCacheMachine, make_full_declaration_adapter()), dev())
    grouped = [config.weights for draws, config in Seen.setups if draws.get("grouping") == GROUPINGS[1]]
    assert len(grouped) >= 3 and all(2 <= w.kv_heads < w.heads for w in grouped), [(w.heads, w.kv_heads)
                                                                                   for w in grouped]
    assert sum(1 for draws, config in Seen.setups if draws.get("grouping") == GROUPINGS[0]
               and config.weights.kv_heads == 1 < config.weights.heads) >= 3


@pytest.mark.slow
def test_cuts_after_the_window_evicts_reach_rows_a_ring_let_go() -> None:
    """In the window run, a cut drawn into what a ring let go (by the cut after the window evicts, and by truncate
    where a window of 2 or more and W + S + 1 rows fit): W + S + 1 rows held or more, n from S + 1 to two below the
    length (the next query at n sees a row out of the ring); where the ring has no sinks, the reference has let it
    go, and the cut may be refused with EVICTED."""
    Seen.clear()
    drive(watched(CacheOperationsMachine, make_full_declaration_adapter(), windowed=True), dev())
    for rule, label in (("truncate_after_the_window_evicts", "evicts"), ("truncate", "cuts")):
        cuts = [(what, s) for r, what, s in Seen.calls if r == rule and what.startswith("truncate")
                and s["draws"].get(label) == EVICTED_CUTS[1] and s["window"] >= 2
                and s["window"] + s["sinks"] + 1 <= s["capacity"]]
        assert len(cuts) >= 3, (rule, len(cuts))
        for what, s in cuts:
            length, n = (int(part) for part in what.removeprefix("truncate a cache of ").split(" rows to "))
            assert length >= s["window"] + s["sinks"] + 1 and s["sinks"] + 1 <= n <= length - 2, (rule, what)
        assert sum(1 for _, s in cuts if s["sinks"] == 0 and s["due"].may_refuse == ErrorKind.EVICTED) >= 2, rule


@pytest.mark.slow
def test_negative_reorder_indices_are_handed_to_caches_holding_rows() -> None:
    Seen.clear()
    drive(watched(CacheOperationsMachine, make_full_declaration_adapter()), dev())
    made = [(what, s) for r, what, s in Seen.calls if r == "reorder" and s["draws"].get("negative") == NEGATIVE[1]
            and what.startswith("reorder")]
    assert len(made) >= 3 and all(s["held"] > 0 and s["due"].kind == ErrorKind.INVALID_INDICES and "(negative)" in what
                                  for what, s in made), made


@pytest.mark.slow
def test_sessions_on_purpose_have_a_window_shorter_than_their_capacity() -> None:
    """Where a decoder drawn has no window, or one as long as the session's capacity, on purpose one shorter: a
    prefill past the window and a decode once it is full need one."""
    Seen.clear()
    drive(watched(SessionMachine, make_full_declaration_adapter()), dev())
    windowed = [(draws["window"], draws["capacity"]) for draws, config in Seen.setups
                if draws.get("windows") == WINDOWS[1]]
    assert len(windowed) >= 3 and all(1 <= window < capacity for window, capacity in windowed), windowed
    past = [what for r, what, s in Seen.calls if r == "prefill" and s["meets"] == PREFILL_MEETS[3]
            and what.startswith("prefill") and s["window"] is not None and s["due"].kind is None]
    assert len(past) >= 3, len(past)


@pytest.mark.slow
def test_chunks_meet_a_window_that_has_wrapped() -> None:
    """In the window run, valid chunks (append_chunk) and malformed ones (append_malformed_chunk) that drew the
    wrapped ring meet one: fed more than W + S rows, or full."""
    Seen.clear()
    drive(watched(CacheOperationsMachine, make_full_declaration_adapter(), windowed=True), dev())
    for rule in ("append_chunk", "append_malformed_chunk"):
        met = [s for r, what, s in Seen.calls if r == rule and s["meets"] == WRAPPED and what.startswith("append a")
               and "chunk" in what]
        assert len(met) >= 3 and all(s["wrapped"] for s in met), (rule, len(met))
    assert WRAPPED in REJECTED_CHUNK_MEETS and WRAPPED not in CHUNK_MEETS  # a windowed run's case only


@pytest.mark.slow
def test_paged_hits_survive_the_hit_limit_and_reach_blocks_an_append_filled() -> None:
    """Under drops_last_hit (the full declaration), the request-key, append-filled and duplicate rules add prompts
    whose hits survive the limit -- where the older request-key rule, of two-block prompts, never hits."""
    Seen.clear()
    drive(watched(PagedCacheMachine, make_full_declaration_adapter()), dev(60))

    def hits(rule: str) -> int:
        return sum(1 for r, what, s in Seen.calls if r == rule and what.startswith("add") and s["reused"] > 0)

    assert hits("add_one_value_under_each_request_key_past_the_hit_limit") >= 5
    keyed = [what for r, what, s in Seen.calls if r == "add_keyed_past_a_block_an_append_filled"
             and what.startswith("add") and "'X'" in what and s["reused"] > 0]
    assert len(keyed) >= 3, keyed  # the prompt with the grown sequence's keys hits the block its append filled
    assert hits("add_a_duplicate_then_evict_a_copy") >= 3


@pytest.mark.slow
def test_paged_duplicates_meet_the_later_copy_cached_and_nothing_else_free_or_cached() -> None:
    """Under hit_copy cached_first, the duplicates rule sets up on purpose the state that tells which copy a hit
    takes: the later copy cached, the earlier in use, no other block free or cached (older cached blocks evicted by
    its fillers), where the extension is refused full -- a pool falling back to the in-use copy goes ahead."""
    settings = profiles.settings_for("dev", database=None, max_examples=EXAMPLES // 2, derandomize=True)
    result = run_machine("paged", make_cached_first_paged_adapter(), property_id="tests::paged_duplicates",
                         settings=settings)
    assert result.failure is None, result.failure
    rule = "with_duplicates_hit_a_cached_and_an_in_use_copy"
    counts = result.exercise.counts
    assert counts[(rule, "later copy cached, nothing else")] >= 3, sorted(counts.items())
    assert counts[(rule, "pool full")] >= 3, sorted(counts.items())


# Each machine run the floors are stated for: the window run draws rules the full one does not, and skips others.
RUNS: dict[str, tuple[type, dict[str, Any]]] = {
    "layer_cache": (LayerCacheMachine, {}), "cache_operations": (CacheOperationsMachine, {}),
    "cache_operations[window]": (CacheOperationsMachine, {"windowed": True}), "paged": (PagedCacheMachine, {}),
    "session": (SessionMachine, {})}


def shares(run: str, adapter: Any, examples: int = FLOOR_EXAMPLES) -> dict[str, float]:
    """Each rule's share of a derandomised run's examples: the examples it ran in, of all (none fails: no
    shrinking). Derandomised, a run draws the same programs every time, so a floor is a promise, not a chance."""
    machine, parameters = RUNS[run]
    Seen.clear()
    drive(watched(machine, adapter, **parameters),
          profiles.settings_for("dev", database=None, max_examples=examples, derandomize=True))
    return {rule: count / Seen.runs[0] for rule, count in Seen.examples.items()}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(RUNS))
def test_rule_shares_keep_their_floors(run: str) -> None:
    """With everything declared, every rule keeps its floor of the examples."""
    found = shares(run, make_full_declaration_adapter())
    low = {rule: round(found.get(rule, 0.0), 3) for rule, floor in FLOORS[run].items() if found.get(rule, 0.0) < floor}
    assert not low, low
    machine, _ = RUNS[run]
    rules = {rule for rule, spec in machine.specs().items() if spec.kind == "rule"}
    assert set(FLOORS[run]) == rules, ("every rule has its floor", rules ^ set(FLOORS[run]))


@settings(max_examples=60, database=None, deadline=None)
@given(st.integers(2, 6), st.data())
def test_non_prefix_selections_are_valid_and_never_the_leading_rows(batch: int, data: st.DataObject) -> None:
    drawn = data.draw(g.non_prefix_selections(batch))
    rows = [int(i) for i in drawn.value]  # type: ignore[attr-defined]
    assert drawn.problem is None and g.selection_problem(drawn.value, batch) is None
    assert rows != list(range(len(rows))) and len(rows) < batch, rows


@settings(max_examples=60, database=None, deadline=None)
@given(st.integers(2, 6), st.data())
def test_rearranging_reorders_are_valid_and_never_the_identity(batch: int, data: st.DataObject) -> None:
    drawn = data.draw(g.rearranging_reorders(batch))
    order = [int(i) for i in drawn.value]  # type: ignore[attr-defined]
    assert drawn.problem is None and g.indices_problem(drawn.value, batch) is None
    assert len(order) == batch and order != list(range(batch)), order


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_rearranging_reorders_need_two_rows() -> None:
    with pytest.raises(ValueError, match="batch of 2 or more"):
        g.rearranging_reorders(1).example()


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_non_prefix_selections_need_two_rows() -> None:
    with pytest.raises(ValueError, match="batch of 2 or more"):
        g.non_prefix_selections(1).example()


@pytest.mark.parametrize("hit_limit", HIT_LIMITS)
@pytest.mark.parametrize("block_size", [1, 2, 3])
@pytest.mark.parametrize("blocks", [1, 2])
def test_the_shortest_prompt_with_a_hit_is_the_shortest(hit_limit: str, block_size: int, blocks: int) -> None:
    """With every full block registered, the shortest prompt keeps ``blocks`` blocks of its hit; one token less
    keeps fewer."""
    policy = PagedPolicy(frozenset({"scope", "signature"}), "lru", hit_limit, True, "shared", "private_or_swap")
    length = shortest_prompt_with_hit(policy, block_size, blocks)
    tokens = list(range(length))
    registered = {key: [i] for i, key in enumerate(chain_keys(tokens, "app", "s", policy, block_size))}

    def kept(n: int) -> int:
        return len(hit_candidates(registered, tokens[:n], "app", "s", policy, block_size))

    assert kept(length) >= blocks > kept(length - 1), (length, kept(length), kept(length - 1))


def test_a_hard_case_on_purpose_leaves_the_plain_case_half_the_draws_and_shrinks_to_it() -> None:
    strategy = g.on_purpose("plain", "empty", "held")
    elements = Counter(strategy.elements)  # type: ignore[attr-defined]  # sampled_from: drawn uniformly from these
    assert elements == Counter({"plain": 2, "empty": 1, "held": 1}), elements
    assert find(strategy, lambda _: True) == "plain"
    assert {find(strategy, lambda value, case=case: value == case) for case in ("empty", "held")} == {"empty", "held"}


@settings(max_examples=60, database=None, deadline=None)
@given(st.integers(1, 6), st.data())
def test_negative_indices_are_invalid_and_wrap_to_rows(batch: int, data: st.DataObject) -> None:
    drawn = data.draw(g.negative_indices(batch))
    order = [int(i) for i in drawn.value]  # type: ignore[attr-defined]
    assert drawn.kind == ErrorKind.INVALID_INDICES and g.indices_problem(drawn.value, batch) == drawn.kind
    assert len(order) == batch and sum(i < 0 for i in order) == 1 and all(-batch <= i < batch for i in order), order


@settings(max_examples=40, database=None, deadline=None)
@given(st.integers(1, 3), st.integers(1, 8), st.data())
def test_rows_as_lists_are_valid_rows_but_for_their_type(batch: int, width: int, data: st.DataObject) -> None:
    drawn = data.draw(g.rows_as_lists(batch, width))
    assert isinstance(drawn.value, list) and drawn.problems == (ErrorKind.DTYPE.value,)
    as_array = np.array(drawn.value)
    assert as_array.shape == (batch, 1, width) and as_array.dtype == np.float64 and np.all(np.abs(as_array) <= 1)


@settings(max_examples=40, database=None, deadline=None)
@given(st.integers(2, 3), st.integers(1, 8), st.data())
def test_single_rows_into_a_batch_are_wrong_in_the_batch_only(batch: int, width: int, data: st.DataObject) -> None:
    drawn = data.draw(g.single_rows_into_a_batch(batch, width))
    assert drawn.kind == ErrorKind.BATCH_MISMATCH and drawn.problems == (ErrorKind.BATCH_MISMATCH.value,)
    assert isinstance(drawn.value, np.ndarray) and drawn.value.shape == (1, 1, width)
    assert drawn.value.dtype == np.float64


@settings(max_examples=40, database=None, deadline=None)
@given(st.integers(1, 3), st.integers(1, 8), st.data())
def test_larger_batches_of_rows_are_wrong_in_the_batch_only(batch: int, width: int, data: st.DataObject) -> None:
    drawn = data.draw(g.larger_batches_of_rows(batch, width))
    assert drawn.kind == ErrorKind.BATCH_MISMATCH and drawn.problems == (ErrorKind.BATCH_MISMATCH.value,)
    assert isinstance(drawn.value, np.ndarray) and drawn.value.dtype == np.float64
    assert drawn.value.shape[0] in (batch + 1, batch + 2) and drawn.value.shape[1:] == (1, width)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_single_rows_into_a_batch_need_two_rows() -> None:
    with pytest.raises(ValueError, match="batch of 2 or more"):
        g.single_rows_into_a_batch(1, 4).example()
