"""Causes told apart by what changed (issue #23): two bugs failing one claimed check in two ways are two causes,
each with its own shrunk trace; a third bug behind them is found in the same plain run; the search says where it
stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from impl.conformance import QuantizedReferenceAdapter, ReferenceAdapter
from impl.storage import StorageRule
from kvcache_conformance.generate import LayerConfig
from kvcache_conformance.judge.failures import (
    STATE_CHANGED,
    Cause,
    NonConformance,
    SuiteError,
    cause_of,
    is_suite_error,
)
from kvcache_conformance.judge.policy import unchanged
from kvcache_conformance.judge.tolerance import Judge
from kvcache_conformance.machines.layer_model import CacheModel, LayerOracle
from kvcache_conformance.machines.session import LONG_PREFILL_LOGITS
from kvcache_conformance.oracle import FLOAT64, AttentionWeights, OracleInputError, RopeConfig
from kvcache_conformance.run import profiles
from kvcache_conformance.run.report import ConformanceReport, causes, suite_errors
from kvcache_conformance.run.runner import cause_search, run_machine, suite_error
from tests.mutants import MUTANTS, build
from tests.test_report import _report

ROOT = Path(__file__).resolve().parent.parent
PAIR = ("batch_mismatch_after_the_length_moves", "smaller_batch_broadcast_then_raise")
BEHIND = "chunk_window_mask_spares_held_rows"


def test_a_cause_is_its_kind_claimed_check_and_the_kinds_of_field_that_changed() -> None:
    with pytest.raises(NonConformance) as length:
        unchanged({"length": 1, "keys": 0}, {"length": 2, "keys": 0}, "append", check="batch_mismatch")
    with pytest.raises(NonConformance) as rows:
        unchanged({"block 0 keys": 0, "block 3 keys": 0}, {"block 0 keys": 1, "block 3 keys": 1}, "add")
    assert cause_of(length.value) == Cause(STATE_CHANGED, "batch_mismatch", ("length",))
    assert cause_of(rows.value) == Cause(STATE_CHANGED, None, ("block rows",))  # one kind of field, whichever block
    assert "block 0 keys 0 -> 1; block 3 keys 0 -> 1" in str(rows.value)  # every field that changed is named
    assert cause_of(length.value).label == "a call that raised changed length (claimed check: batch_mismatch)"
    assert cause_of(rows.value).label == "a call that raised changed block rows"  # no unclaimed check named
    # A row written shows in its key, its value or both (a zero key over a zero key shows in neither): one cause.
    causes = set()
    for changed in (("keys",), ("values",), ("keys", "values")):
        with pytest.raises(NonConformance) as written:
            unchanged({"length": 1, **{f"physical {f}": 0 for f in changed}},
                      {"length": 1, **{f"physical {f}": 1 for f in changed}}, "append")
        causes.add(cause_of(written.value))
    assert causes == {Cause(STATE_CHANGED, None, ("physical rows",))}
    assert Cause("output mismatch", "output").label == "output mismatch (output)"


def test_where_a_cause_search_stopped_names_the_option_that_lifts_its_bound() -> None:
    assert cause_search("cause bound", 4, 4, 12.0)["lift"] == "--kv-causes 8"
    assert cause_search("time bound", 2, 4, 301.0)["bound"] is True
    assert "--kv-cause-seconds" in cause_search("time bound", 2, 4, 301.0)["said"]
    assert cause_search("passed", 3, 4, 40.0)["bound"] is False


@pytest.mark.slow  # a subprocess run of one property against a mutant with three bugs
def test_one_plain_run_finds_two_bugs_on_one_check_and_the_one_behind_them(tmp_path: Path) -> None:
    chosen = {m.name: m for m in MUTANTS}
    spec = build(chosen[PAIR[0]], tmp_path / "mutants", chosen[PAIR[1]], chosen[BEHIND])
    report = tmp_path / "report.json"
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", f"--kv-impl={spec}",
         f"--kv-report={report}", f"--kv-traces={tmp_path / 'traces'}", "-k", "test_cache_operations_conform",
         "properties/test_cache_operations.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
        env={**os.environ, "HYPOTHESIS_PROFILE": "ci", "PYTHONPATH": f"{tmp_path / 'mutants'}{os.pathsep}{ROOT}"})
    document = json.loads(report.read_text())
    window = next(e for e in document["properties"] if e["property"].endswith("[window]"))
    assert window["outcome"] == "failed", process.stdout[-3000:]
    found = window["causes"]
    changed = {(c["check"], tuple(c["changed"])) for c in found if c["kind"] == STATE_CHANGED}
    # One check, two ways: two causes at least (a program where both bugs act on one call, or where the physical
    # storage shows one of the writes, is a further set of what changed).
    assert len({c for c, _ in changed}) == 1 and len(changed) >= 2, found
    assert any(c["check"] == "output" for c in found), found  # the bug behind them
    traces = [c["trace"] for c in found]
    # Three bugs, at least three causes, each with its own trace. A fourth may come from two of them at once: the
    # broadcast bug meeting a row of a wrong batch and width raises numpy's ValueError, not the kind due.
    assert len(found) >= 3 and len(set(traces)) == len(found) and all(Path(t).exists() for t in traces), [
        (c["rule"], c["kind"], c["check"], c["changed"]) for c in found]
    assert window["cause_search"]["stopped"] in ("passed", "cause bound"), window["cause_search"]
    markdown = report.with_suffix(".md").read_text()
    assert "a call that raised changed length" in markdown, markdown


def test_a_suite_error_is_an_outcome_of_its_own_never_the_implementations_failure(tmp_path: Path) -> None:
    plugin = ConformanceReport(tmp_path / "report.json")
    met = {"rule": "append_rows", "kind": "suite error (OracleInputError)", "check": None, "changed": [],
           "suite_error": True, "trace": "t.json", "message": "position 6 outside RoPE range [0, 6)"}
    plugin.pytest_runtest_logreport(_report("m.py::broken", "call", "failed", "SUITE ERROR",
                                            user_properties=[("kv_suite_error", True), ("kv_causes", [met])]))
    entries = plugin._entries()
    assert entries[0]["outcome"] == "suite error"
    assert causes(entries) == [] and suite_errors(entries)[0]["trace"] == "t.json"
    error = suite_error(OracleInputError("position 6 outside RoPE range [0, 6)"), "t.json")
    assert isinstance(error, SuiteError) and error.kind == "suite error (OracleInputError)"
    assert "not a verdict about the implementation" in str(error) and "t.json" in str(error)
    assert is_suite_error(error) and not is_suite_error(NonConformance("x", kind="k"))


def test_a_full_cache_at_the_end_of_the_rope_range_offers_no_score_overflow() -> None:
    # An int8 cache with a frozen scale, full at capacity 6 = RoPE max positions 6: the precondition of
    # append_row_overflowing_a_score asked the oracle for position 6 and raised OracleInputError (a suite error).
    adapter = QuantizedReferenceAdapter(StorageRule("int8", "per_channel", "frozen"))
    rng = np.random.default_rng(0)
    w = [rng.uniform(-1, 1, (4, 4)) for _ in range(4)]
    config = LayerConfig(AttentionWeights(*w, heads=1, kv_heads=1), RopeConfig("interleaved", 10000.0, 4, 6), 1, 6)
    oracle = LayerOracle(config, None, Judge.for_adapter(adapter, FLOAT64), keys_unrotated=False)
    rows = [rng.uniform(-1, 1, (1, 4)) for _ in range(6)]
    model = CacheModel(config.weights, 1, rows=rows, calibration=rows[:1])
    assert oracle.stored_score_overflows(model, 0, rng.uniform(-1, 1, 4)) is False
    model.cut(5)
    assert oracle.stored_score_overflows(model, 0, np.zeros(4)) is False  # (evaluated: a zero row never overflows)


class _WrongPrefills(ReferenceAdapter):
    """The reference whose windowed prefills of more than W tokens (``long``), or of 2..W tokens, return logits
    off by 0.5: two bugs of one property and kind."""

    def __init__(self, long: bool) -> None:
        self.long = long

    def prefill(self, session: Any, tokens: Any) -> np.ndarray:
        logits = super().prefill(session, tokens)
        window = session.model.window
        if window is not None and 1 < len(tokens) and (len(tokens) > window) == self.long:
            return logits + 0.5
        return logits


class _WrongPrefillsWithinWindow(_WrongPrefills):
    """The same, declaring prefill_within_window: it takes every prefill longer than W it may refuse."""

    capabilities = ReferenceAdapter.capabilities | {"prefill_within_window"}


@pytest.mark.parametrize("declared", [True, False], ids=["prefill_within_window", "undeclared"])
@pytest.mark.parametrize("long", [True, False], ids=["longer than W", "2 to W tokens"])
def test_wrong_logits_of_a_prefill_longer_than_the_window_are_a_cause_apart_where_declared(long: bool,
                                                                                         declared: bool) -> None:
    """Where §9.4 governs a long prefill (prefill_within_window declared), its wrong logits are a check of their own;
    undeclared, a long prefill is a prefill like any other, and one bug that shows in long prefills and in decodes
    stays one cause (litgpt 0.5.11's window ignored by one-token forwards, which a chunking adapter shows in both)."""
    adapter = (_WrongPrefillsWithinWindow if declared else _WrongPrefills)(long)
    result = run_machine("session", adapter, property_id="causes-long-prefill",
                         settings=profiles.settings_for("ci", database=None, report_multiple_bugs=False),
                         shrink_seconds=1.0)
    assert isinstance(result.failure, NonConformance), result.failure
    assert result.failure.check == (LONG_PREFILL_LOGITS if long and declared else "logits"), result.failure


@pytest.mark.slow  # two searches of the window operations property against a mutant with two bugs
def test_a_search_past_a_cause_counts_its_first_failure_from_its_own_not_from_a_discarded_example(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``first_failing`` (and the shrink budget's label, which counts from the same moment) is the first example
    this search failed, not the first it discarded for a cause already found: those fail all the time."""
    from kvcache_conformance.machines import MACHINES
    from kvcache_conformance.run import selection

    chosen = {m.name: m for m in MUTANTS}
    adapter = selection.load_adapter(build(chosen[PAIR[0]], tmp_path / "mutants", chosen[BEHIND]))
    ci = profiles.settings_for("ci", database=None, report_multiple_bugs=False, print_blob=False)
    built: list[tuple[Any, int]] = []  # each machine, and how many non-conformances were made before it

    class Counted(MACHINES["cache_operations"]):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append((self, NonConformance.raised))

    # A ci program is its property's: the first whose search past the known cause meets that cause before its own
    # (the case the count could get wrong) is the one judged; a search meeting its own first says nothing.
    for attempt in range(8):
        where: dict[str, Any] = {"property_id": f"operations[window]#{attempt}", "parameters": {"windowed": True},
                                 "settings": ci, "shrink_seconds": 1.0}
        first = run_machine("cache_operations", adapter, **where)
        assert isinstance(first.failure, NonConformance), first.failure
        built.clear()
        with monkeypatch.context() as patched:
            patched.setitem(MACHINES, "cache_operations", Counted)
            past = run_machine("cache_operations", adapter, set_aside=frozenset({cause_of(first.failure)}), **where)
        assert isinstance(past.failure, NonConformance) and cause_of(past.failure) != cause_of(first.failure)
        made = [after - before for (_, before), (_, after) in zip(built, [*built[1:], (None, NonConformance.raised)])]
        own = [n for n, ((machine, _), count) in enumerate(zip(built, made), 1) if count > len(machine.met_again)]
        discarded = [n for n, (machine, _) in enumerate(built, 1) if machine.met_again]
        if discarded and discarded[0] < own[0]:  # the search met the known cause first
            assert past.first_failing == own[0], (past.first_failing, own[:5], discarded[:5])
            return
    pytest.fail("no search of 8 met the known cause before its own")
