"""``--kv-budget``: shares of one deadline, a search stopped before an example with the database left right, the
report and the terminal saying what was cut short, progress lines, and ``-x`` bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from impl.conformance import make_adapter
from kvcache_conformance.judge.failures import NonConformance, cause_of
from kvcache_conformance.run import budget, profiles
from kvcache_conformance.run.runner import run_machine
from tests.misbehaving import AlwaysReturnsTheWrongDtype, ReturnsTheWrongDtype

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("given, seconds", [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0),
                                            ("2.5m", 150.0), ("0", None), ("off", None), ("None", None)])
def test_a_budget_is_a_duration(given: str, seconds: float | None) -> None:
    assert budget.parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["ten minutes", "10x", "-5", "10m junk", "", "0s"])
def test_a_bad_budget_says_what_is_accepted(given: str) -> None:
    with pytest.raises(budget.BudgetError, match="--kv-budget"):
        budget.parse_duration(given)


def test_under_x_a_run_is_bounded_even_when_nothing_fails() -> None:
    assert budget.chosen(None, first_failure=True)[0] == budget.FIRST_FAILURE_BUDGET
    assert budget.chosen(None, first_failure=False) == (None, "")
    assert budget.chosen("off", first_failure=True) == (None, "off")  # lifted by hand
    assert budget.chosen("2m", first_failure=True) == (120.0, "2m")


def test_each_property_gets_its_share_of_what_is_left() -> None:
    run = budget.RunBudget(deadline=time.time() + 100, given="100s", workers=2, expected=8)
    first = run.share("p::a", 100)
    assert first.seconds == pytest.approx(25, abs=0.5)  # 100 s over the 4 of 8 properties this worker expects
    second = run.share("p::b", 100)
    assert second.seconds == pytest.approx(100 / 3, abs=0.5)  # (nothing spent yet: the next ones get more)
    for name in "cdefgh":
        last = run.share(f"p::{name}", 100)
    assert last.seconds == pytest.approx(100, abs=0.5)  # more than expected: all that is left
    spent = budget.RunBudget(deadline=time.time() - 1, given="1s", expected=3).share("p::a", 100)
    assert spent.spent_before_start and spent.stopped and spent.seconds == 0
    assert "not started" in spent.verdict(0)
    assert budget.RunBudget().share("p::a", 100).seconds is None  # no budget
    looks = budget.RunBudget(deadline=time.time() + 100, given="100s", expected=4)
    assert looks.look_share("p::a", 10, looks_left=5).seconds == pytest.approx(100 * budget.LOOK_FRACTION / 5, abs=0.5)
    assert looks.started == 0  # a look is no property's turn


def _settings(directory: Path) -> object:
    return profiles.settings_for("dev", database=DirectoryBasedExampleDatabase(str(directory)))


def test_a_spent_share_stops_the_search_before_an_example_and_saves_nothing(tmp_path: Path) -> None:
    share = budget.Share("properties/test_x.py::test_x", 0.3, 100, "0.3s")
    result = run_machine("layer_cache", make_adapter(), property_id=share.property_id, settings=_settings(tmp_path),
                         budget=share)
    assert result.stopped_by_budget and share.stopped and result.failure is None
    assert 1 <= result.runs < 100 and share.facts(result.runs)["examples"] == result.runs
    # Any other exception than an interruption would be saved by Hypothesis as a failing example.
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]


def test_a_saved_counterexample_replays_first_and_is_shrunk_whatever_the_budget(tmp_path: Path) -> None:
    adapter, settings = ReturnsTheWrongDtype(), _settings(tmp_path)
    found = run_machine("layer_cache", adapter, property_id="p::test_x", settings=settings, shrink_seconds=2)
    assert found.failure is not None
    saved = sorted(path.name for path in tmp_path.rglob("*") if path.is_file())
    assert saved
    share = budget.Share("p::test_x", 0.0, 100, "0s")  # spent before the first example
    again = run_machine("layer_cache", adapter, property_id="p::test_x", settings=settings, shrink_seconds=2,
                        budget=share)
    assert again.failure is not None and not again.stopped_by_budget and not share.stopped
    assert str(again.failure).split("\n")[0] == str(found.failure).split("\n")[0]
    assert sorted(path.name for path in tmp_path.rglob("*") if path.is_file()) == saved


def test_a_search_past_causes_set_aside_still_stops_where_its_share_is_spent(tmp_path: Path) -> None:
    """The search for a further cause discards every example that fails by a cause already found: those are no
    failure of this search, and the budget stops it as any other (it ran its thorough profile's ten times
    max_examples of discarded examples, 17 minutes past a 10-minute share, on transformers 5.19.0)."""
    adapter = AlwaysReturnsTheWrongDtype()  # every example fails by the same cause, from its first step
    found = run_machine("layer_cache", adapter, property_id="p::test_x", settings=_settings(tmp_path / "first"),
                        shrink_seconds=1)
    assert isinstance(found.failure, NonConformance)
    share = budget.Share("p::test_x", 0.5, 100, "0.5s")
    started = time.monotonic()
    result = run_machine("layer_cache", adapter, property_id="p::test_x", settings=_settings(tmp_path / "next"),
                         shrink_seconds=1, set_aside=frozenset({cause_of(found.failure)}), budget=share)
    assert result.stopped_by_budget and share.stopped and result.failure is None
    assert sum(result.met_again.values()) >= 1 and time.monotonic() - started < 30


def test_progress_says_examples_done_and_time_left(tmp_path: Path) -> None:
    lines: list[str] = []
    progress = budget.Progress(lines.append, after=0, every=0)
    share = budget.Share("properties/test_x.py::test_layer_x", 1.0, 100, "1s", progress)
    run_machine("layer_cache", make_adapter(), property_id=share.property_id, settings=_settings(tmp_path),
                budget=share)
    assert lines and all(line.startswith("kvcache test_layer_x: ") for line in lines)
    assert "1/100 examples in" in lines[0] and "of its 1s share left" in lines[0]
    unbounded = budget.Share("p::test_y", None, 100, "", budget.Progress(lines.append, after=0, every=0))
    unbounded.examples = 4
    assert "at this pace" in unbounded.progress_line()
    quiet = budget.Share("p::test_z", None, 100, "", budget.Progress(lines.append, after=3600))
    before = len(lines)
    quiet.before_example(5)
    assert len(lines) == before  # runs shorter than PROGRESS_AFTER say nothing


def test_the_terminal_names_what_the_budget_cut_short() -> None:
    lines = budget.summary_lines("5m", [("p::a", {"examples": 3, "max_examples": 100, "seconds": 61.0}),
                                        ("p::b", {"spent_before_start": True})], 4)
    assert lines[0] == "budget 5m (--kv-budget): 2 of 4 machine properties cut short -- not full passes:"
    assert lines[1] == "  p::a: 3 of 100 examples in 1m01s" and lines[2] == "  p::b: not started"
    assert "every machine property" in budget.summary_lines("5m", [], 4)[0]
    stopped = budget.summary_lines("5m", [], 4, ["p::c"])
    assert stopped[1] == "budget 5m (--kv-budget) stopped the cause search of p::c: it may have more causes"


@pytest.mark.slow
@pytest.mark.parametrize("first_failure", [False, True])
def test_a_run_cut_short_is_reported_as_such_never_as_a_pass(tmp_path: Path, first_failure: bool) -> None:
    report = tmp_path / "report.json"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "properties/test_layer_cache.py",
         "properties/test_session.py", "--kv-budget", "3s", f"--kv-report={report}",
         f"--kv-examples={tmp_path / 'db'}", f"--kv-traces={tmp_path / 'traces'}", *(["-x"] if first_failure else [])],
        cwd=ROOT, env={**os.environ, "HYPOTHESIS_PROFILE": "dev"}, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60
    assert done.returncode == 0, done.stdout[-2000:]  # cut short is no failure either
    document = json.loads(report.read_text())
    entries = {e["property"].split("::")[1]: e for e in document["properties"]}
    assert {e["outcome"] for e in entries.values()} == {"cut short"}
    assert document["summary"]["cut short"] == 2 and document["summary"]["passed"] == 0
    assert document["budget"]["given"] == "3s" and len(document["budget"]["cut_short"]) == 2
    layer = entries["test_layer_cache_conforms"]
    assert layer["budget"]["stopped"] and layer["budget"]["examples"] <= 100 and "not a full pass" in layer["reason"]
    assert "**Cut short by the budget**" in report.with_suffix(".md").read_text()
    assert "kvcache budget" in done.stdout and "machine properties cut short -- not full passes" in done.stdout
