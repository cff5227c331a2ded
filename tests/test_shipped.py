"""The shipped-bug benchmark's own checks: the catalogue parses and says how each runnable entry is recognised,
and the runner's judgement (caught, quiet on the fix, new causes, known ones, errors) follows from two reports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tomllib", reason="the benchmark runs on Python 3.11 or later (tomllib)")

from bench.shipped import catalogue, environments, runner
from bench.shipped.catalogue import Bug, CatalogueError, CausePattern, Release, Run
from bench.shipped.runner import ReleaseRun, judge, same_cause

ROOT = Path(__file__).resolve().parents[1]


def test_the_catalogue_parses_and_each_runnable_entry_names_its_cause_and_an_adapter_that_exists() -> None:
    bugs = catalogue.load()
    assert len(bugs) >= 12 and len({bug.library for bug in bugs}) >= 4
    for bug in bugs:
        if bug.run is None:
            continue
        assert bug.cause is not None or bug.expect["outcome"] == "miss", bug.id
        module, _, factory = bug.run.adapter.partition(":")
        spec = importlib.util.find_spec(module.split(".")[0])
        path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
        assert factory and (path.is_file() or spec is not None), f"{bug.id}: no module {module}"
        assert all((ROOT / test.split("::")[0]).exists() for test in bug.run.tests), bug.id
        assert all(requirement.format(version="1") for requirement in bug.run.install)


def _entry(**changes: Any) -> dict[str, Any]:
    entry = {"id": "lib-bug", "library": "lib", "buggy": {"version": "1.0", "python": ">=3.10", "torch": "none"},
             "fixed": {"version": "1.1", "python": ">=3.10", "torch": "none"}, "issue": "none found", "fix": "x",
             "what": "a bug", "spec": ["13.5"], "expect": {"outcome": "caught", "property": "p", "rule": "r",
                                                          "check": "c"},
             "status": {"versions": "v", "fix_read": "f", "run": "not run"},
             "cause": {"property": "test_layer_cache_conforms", "kind": "output mismatch", "rule": "append_rows"},
             "run": {"adapter": "adapters.x:y", "install": ["lib=={version}"]}}
    entry.update(changes)
    return entry


def test_a_runnable_entry_needs_its_cause_and_a_well_formed_run_table() -> None:
    bug = catalogue.parse({"bug": [_entry()]})[0]
    assert bug.run == Run("adapters.x:y", ("lib=={version}",)) and bug.cause is not None
    entry = _entry()
    del entry["cause"]
    with pytest.raises(CatalogueError, match="needs `cause`"):
        catalogue.parse({"bug": [entry]})
    with pytest.raises(CatalogueError, match=r"run\.install"):
        catalogue.parse({"bug": [_entry(run={"adapter": "a:b", "install": "lib"})]})
    with pytest.raises(CatalogueError, match="property and kind"):
        catalogue.parse({"bug": [_entry(cause={"property": "test_x"})]})
    miss = _entry(expect={"outcome": "miss", "why": "no declaration"})
    del miss["cause"]
    assert catalogue.parse({"bug": [miss]})[0].cause is None  # a miss is recognised by difference


def _cause(rule: str = "append_rows", kind: str = "output mismatch", prop: str = "test_layer_cache_conforms",
           **more: Any) -> dict[str, Any]:
    return {"property": f"properties/test_layer_cache.py::{prop}", "rule": rule, "rules": [rule], "kind": kind,
            "check": more.get("check", "output"), "changed": more.get("changed", []), "label": kind,
            "instances": [f"properties/test_layer_cache.py::{prop}"], "traces": []}


def _run(version: str, *causes: dict[str, Any], error: str | None = None, profile: str = "ci") -> ReleaseRun:
    properties = {"properties/test_layer_cache.py::test_layer_cache_conforms": {"outcome": "failed", "seconds": 12.5,
                                                                                "runs": 40}}
    return ReleaseRun(version, profile, error=error, causes=list(causes), properties=properties)


BUG = Bug("lib-bug", "lib", Release("1.0", "", ""), Release("1.1", "", ""), "", "", "", ("13.5",),
          {"outcome": "caught"}, {}, Run("adapters.x:y", ("lib=={version}",),
                                         known=(CausePattern("test_layer_cache_conforms", "window: wrong positions",
                                                             why="a published finding"),)),
          CausePattern("test_layer_cache_conforms", "output mismatch", rule="append_rows"))


def test_caught_on_the_buggy_release_and_quiet_on_the_fixed_one() -> None:
    outcome = judge(BUG, _run("1.0", _cause()), _run("1.1"), None)
    assert (outcome.caught, outcome.quiet, outcome.seconds, outcome.new_on_fix) == ("yes", "yes", 12.5, [])


def test_a_cause_new_on_the_fixed_release_is_a_false_alarm_unless_known_or_already_on_the_buggy_one() -> None:
    other = _cause("truncate", kind="state changed by a call that raised", changed=["length"])
    outcome = judge(BUG, _run("1.0", _cause()), _run("1.1", other), None)
    assert outcome.quiet == "no" and len(outcome.new_on_fix) == 1
    assert judge(BUG, _run("1.0", _cause(), other), _run("1.1", other), None).quiet == "yes"  # not new
    known = _cause("truncate", kind="window: wrong positions")
    assert judge(BUG, _run("1.0", _cause()), _run("1.1", known), None).quiet == "yes"
    still = judge(BUG, _run("1.0", _cause()), _run("1.1", _cause()), None)
    assert still.quiet == "no" and "still there" in still.new_on_fix[-1]


def test_a_cause_only_the_fixed_releases_search_reached_is_not_new_if_its_trace_fails_alike_on_the_buggy_one() -> None:
    """A report lists the causes its search reached first: a cause of the fixed release missing from the buggy
    release's report is judged by replaying its trace there -- the same kind, check and changes: on both."""
    other = {**_cause("append_malformed_row", kind="state changed by a call that raised", changed=["keys"]),
             "traces": ["t.json"]}
    alike = {"trace": "t.json", "status": "diverges", "kind": other["kind"], "check": "output", "changed": ["keys"],
             "on": "1.0"}
    outcome = judge(BUG, _run("1.0", _cause()), _run("1.1", other), None, {"t.json": alike})
    assert (outcome.quiet, outcome.new_on_fix, len(outcome.on_both_by_replay)) == ("yes", [], 1)
    for differs in ({**alike, "changed": ["keys", "values"]}, {**alike, "status": "conforms"},
                    {**alike, "kind": "output mismatch"}, {"trace": "t.json", "status": "error", "on": "1.0"},
                    {**alike, "on": "1.1"}):
        outcome = judge(BUG, _run("1.0", _cause()), _run("1.1", other), None, {"t.json": differs})
        assert (outcome.quiet, len(outcome.new_on_fix), outcome.on_both_by_replay) == ("no", 1, []), differs
    assert judge(BUG, _run("1.0", _cause()), _run("1.1", other), None).quiet == "no"  # not replayed: new


def test_a_run_of_some_entries_keeps_the_outcomes_of_the_others(tmp_path: Path) -> None:
    kept = tmp_path / "outcomes.json"
    first, second = judge(BUG, _run("1.0", _cause()), _run("1.1"), None), \
        judge(Bug(**{**BUG.__dict__, "id": "lib-other"}), _run("1.0"), _run("1.1"), None)
    runner._keep_outcomes(kept, [first, second])
    again = judge(BUG, _run("1.0"), _run("1.1"), None)
    runner._keep_outcomes(kept, [again])
    assert {o["bug"]: o["caught"] for o in json.loads(kept.read_text())} == {"lib-bug": "no", "lib-other": "no"}


def test_a_selection_of_entries_it_cannot_run_lists_why_and_claims_no_recall(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bugs = catalogue.load()
    library = next(name for name in {bug.library for bug in bugs}
                   if all(bug.run is None for bug in bugs if bug.library == name))  # vllm: torch pins
    runner.main(["--table", "--out", str(tmp_path), "--library", library])
    printed = capsys.readouterr().out
    assert "recall" not in printed
    for bug in (bug for bug in bugs if bug.library == library):
        assert f"{bug.id}: {bug.status['run'].split()[0]}" in printed


def test_a_run_that_judged_nothing_is_an_error_never_a_verdict() -> None:
    outcome = judge(BUG, _run("1.0", error="collection errors"), _run("1.1"), None)
    assert outcome.caught == "error" and outcome.quiet == "yes" and outcome.errors
    assert judge(BUG, _run("1.0", _cause()), _run("1.1", error="timed out"), None).quiet == "error"


def test_missed_at_ci_and_caught_by_the_stronger_profile() -> None:
    other = _cause("reset", kind="reset held rows")
    outcome = judge(BUG, _run("1.0", other), _run("1.1"), _run("1.0", _cause(), profile="thorough"))
    assert outcome.caught == "only thorough"
    assert judge(BUG, _run("1.0", other), _run("1.1"), _run("1.0", profile="thorough")).caught == "no"


def test_an_entry_without_a_cause_is_caught_by_a_cause_the_fix_took_away() -> None:
    miss = Bug(**{**BUG.__dict__, "cause": None, "expect": {"outcome": "miss"}})
    assert judge(miss, _run("1.0", _cause()), _run("1.1"), None).caught == "yes"
    assert judge(miss, _run("1.0", _cause()), _run("1.1", _cause()), None).caught == "no"
    # Not taken away if its trace fails alike on the fixed release (which a ci run there did not reach).
    traced = {**_cause(), "traces": ["t.json"]}
    there = {"trace": "t.json", "status": "diverges", "kind": "output mismatch", "check": "output", "changed": [],
             "on": "1.1"}
    assert judge(miss, _run("1.0", traced), _run("1.1"), None, {"t.json": there}).caught == "no"
    assert judge(miss, _run("1.0"), _run("1.1"), _run("1.0", traced, profile="thorough"),
                 {"t.json": there}).caught == "no"
    assert judge(miss, _run("1.0", traced), _run("1.1"), None, {"t.json": {**there, "status": "conforms"}}).caught \
        == "yes"


def test_a_pattern_may_name_what_a_call_that_raised_changed() -> None:
    pattern = CausePattern("test_layer_cache_conforms", "state changed by a call that raised", changed="rows")
    assert pattern.matches(_cause(kind=pattern.kind, changed=["rows"]))
    assert not pattern.matches(_cause(kind=pattern.kind, changed=["length", "rows"]))
    either = CausePattern(pattern.property, pattern.kind, changed="rows | rows, positions")
    assert either.matches(_cause(kind=either.kind, changed=["rows"]))
    assert either.matches(_cause(kind=either.kind, changed=["rows", "positions"]))
    assert not either.matches(_cause(kind=either.kind, changed=["length", "rows", "positions"]))


def test_a_pattern_may_name_either_of_two_kinds() -> None:
    """A valid call that crashes after writing fails as "unexpected exception" or as a call that raised and changed
    the state, whichever the judge meets first: one bug, two faces."""
    either = CausePattern("test_layer_cache_conforms", "state changed by a call that raised | unexpected exception "
                          "(ValueError)", rule="append_chunk")
    assert either.matches(_cause("append_chunk", kind="unexpected exception (ValueError)"))
    assert either.matches(_cause("append_chunk", kind="state changed by a call that raised", changed=["length"]))
    assert not either.matches(_cause("append_chunk", kind="unexpected exception (IndexError)"))
    assert not either.matches(_cause("append_rows", kind="unexpected exception (ValueError)"))


def test_a_pattern_may_name_one_instance_of_a_parametrised_property() -> None:
    cause = {**_cause(prop="test_cache_operations_conform"),
             "instances": ["properties/test_cache_operations.py::test_cache_operations_conform[window]"]}
    assert CausePattern("test_cache_operations_conform", "output mismatch").matches(cause)
    assert CausePattern("test_cache_operations_conform[window]", "output mismatch").matches(cause)
    assert not CausePattern("test_cache_operations_conform[full]", "output mismatch").matches(cause)


def test_one_cause_in_two_reports_shares_kind_check_changes_and_a_rule() -> None:
    a, b = _cause(), {**_cause("append_chunk"), "rules": ["append_chunk", "append_rows"]}
    assert same_cause(a, b) and not same_cause(a, _cause("append_chunk"))
    assert not same_cause(a, _cause(check="length"))


def test_environments_live_under_the_users_cache_or_where_told(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("KVCACHE_SHIPPED_CACHE", str(tmp_path))
    assert environments.cache_root() == tmp_path
    monkeypatch.delenv("KVCACHE_SHIPPED_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert environments.cache_root() == tmp_path / "kvcache-conformance" / "shipped"
    with pytest.raises(environments.EnvironmentBuildError, match=r"no python2\.1"):
        environments.interpreter("2.1")
