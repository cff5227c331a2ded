"""``--kv-report``: one run under xdist, against an adapter that fails some properties and skips others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvcache_conformance.run import exercise
from kvcache_conformance.run.report import OUTCOMES, ConformanceReport, causes
from kvcache_conformance.traces import codec as trace

# Whole machine runs and subprocess runs of the suite: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def test_the_report_says_what_ran_how_and_what_it_found(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    environment = {**os.environ, "HYPOTHESIS_PROFILE": "ci"}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "properties/test_layer_cache.py",
         "properties/test_session.py", "properties/test_cache_creation.py", "-k",
         "layer_cache or session or zero_batch",
         "--kv-impl", "tests.misbehaving:ReturnsTheWrongDtype", f"--kv-report={report}",
         f"--kv-traces={tmp_path / 'traces'}"],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    document = json.loads(report.read_text())
    assert document["implementation"]["implementation"] == "misbehaving-wrong-dtype"
    assert document["implementation"]["spec"] == "tests.misbehaving:ReturnsTheWrongDtype"
    assert "binding_checks" in document["implementation"]["capabilities"]
    assert document["suite"]["version"] and "commit" in document["suite"]
    assert {"python", "numpy", "hypothesis"} <= set(document["environment"])
    assert document["profile"]["name"] == "ci" and document["profile"]["derandomize"] is True
    assert document["rule"].startswith("float64: |error| <= 1e-12")
    entries = {e["property"].split("::")[1]: e for e in document["properties"]}
    layer = entries["test_layer_cache_conforms"]
    assert layer["outcome"] == "failed" and "dtype float32, but should be float64" in layer["reason"]
    assert layer["runs"] > 1 and Path(layer["trace"]).exists()
    assert trace.load(Path(layer["trace"]))["failure"]["step"] >= 1
    session = entries["test_decode_session_conforms"]
    assert session["outcome"] == "passed" and 0 < session["worst_error"] <= session["tolerance"] == 1e-12
    assert session["rule"] == document["rule"] and session["rules"] == {document["rule"]: session["runs"]}
    assert document["rules"][document["rule"]] >= session["runs"]
    assert entries["test_zero_batch_and_zero_capacity_are_rejected"]["runs"] >= 1  # a @given property
    assert document["summary"] == {o: sum(e["outcome"] == o for e in entries.values()) for o in OUTCOMES}
    assert document["complete"] is True and document["stopped"] is None
    assert layer["trace"] in document["traces"]
    assert layer["failure_kind"] == "output: wrong dtype" and layer["rule_failed"].startswith("append")
    causes = {(c["property"].split("::")[1], c["rule"], c["kind"], c["check"]): c for c in document["causes"]}
    cause = causes["test_layer_cache_conforms", layer["rule_failed"], "output: wrong dtype", "output"]
    assert layer["property"] in cause["instances"] and cause["failed"] >= 1 and cause["known"] == 0
    assert sum(c["failed"] for c in document["causes"]) == document["summary"]["failed"]
    markdown = report.with_suffix(".md").read_text()
    assert "# Conformance of misbehaving-wrong-dtype" in markdown and "Incomplete" not in markdown
    assert "| `properties/test_session.py::test_decode_session_conforms` | passed |" in markdown
    assert "## Distinct causes" in markdown
    assert ("| `properties/test_layer_cache.py::test_layer_cache_conforms` | output: wrong dtype (output) | "
            f"output: wrong dtype | output |  | {layer['rule_failed']}") in markdown


def _report(nodeid: str, when: str, outcome: str, longrepr: object = None, **extra: object) -> pytest.TestReport:
    report = pytest.TestReport(nodeid, ("m.py", 0, nodeid), {}, outcome, longrepr, when, duration=0.5)  # type: ignore[arg-type]
    for name, value in extra.items():
        setattr(report, name, value)
    return report


def test_only_a_finished_call_passes_a_property(tmp_path: Path) -> None:
    plugin = ConformanceReport(tmp_path / "report.json")
    plugin.collected.update(dict.fromkeys(["m.py::started", "m.py::done", "m.py::known", "m.py::fixed",
                                           "m.py::torn", "m.py::never"]))
    for nodeid in ("m.py::started", "m.py::done", "m.py::known", "m.py::fixed", "m.py::torn"):
        plugin.pytest_runtest_logreport(_report(nodeid, "setup", "passed"))
    plugin.pytest_runtest_logreport(_report("m.py::done", "call", "passed"))
    plugin.pytest_runtest_logreport(_report("m.py::known", "call", "skipped", wasxfail="known failure: why"))
    plugin.pytest_runtest_logreport(_report("m.py::fixed", "call", "failed", "[XPASS(strict)] known failure: why"))
    plugin.pytest_runtest_logreport(_report("m.py::torn", "call", "passed"))
    plugin.pytest_runtest_logreport(_report("m.py::torn", "teardown", "failed", "teardown broke"))
    outcomes = {e["property"]: e["outcome"] for e in plugin._entries()}
    assert outcomes == {"m.py::started": "unfinished", "m.py::done": "passed", "m.py::known": "xfailed",
                        "m.py::fixed": "xpassed", "m.py::torn": "failed", "m.py::never": "not run"}
    assert not plugin._complete()


def test_sigterm_is_a_keyboard_interrupt_while_the_session_runs(tmp_path: Path) -> None:
    plugin = ConformanceReport(tmp_path / "report.json")
    before = signal.getsignal(signal.SIGTERM)
    plugin.pytest_sessionstart(None)  # type: ignore[arg-type]
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            signal.raise_signal(signal.SIGTERM)
    finally:
        plugin.pytest_unconfigure(None)  # type: ignore[arg-type]
    assert signal.getsignal(signal.SIGTERM) == before


def test_causes_group_parametrisations_by_rule_and_kind() -> None:
    def failed(nodeid: str, outcome: str = "failed", rule: str = "append_rows",
               kind: str = "output mismatch") -> dict[str, object]:
        return {"property": nodeid, "outcome": outcome, "reason": "r", "rule_failed": rule, "failure_kind": kind,
                "trace": f"{nodeid}.json"}
    found = causes([failed("p.py::t[a]"), failed("p.py::t[b]"), failed("p.py::t[c]", "xfailed"),
                    failed("p.py::t[d]", rule="reset"), failed("p.py::u", kind="hang"),
                    {"property": "p.py::v", "outcome": "passed"}])
    assert [(c["property"], c["rule"], c["kind"], c["failed"], c["known"]) for c in found] == [
        ("p.py::t", "append_rows", "output mismatch", 2, 1), ("p.py::t", "reset", "output mismatch", 1, 0),
        ("p.py::u", "append_rows", "hang", 1, 0)]
    assert found[0]["instances"] == ["p.py::t[a]", "p.py::t[b]", "p.py::t[c]"]


# -- what a pass exercised ------------------------------------------------------------------------------------

def test_a_run_counts_per_rule_what_ran_how_calls_ended_and_the_cases_met() -> None:
    from impl.conformance import ReferenceAdapter
    from kvcache_conformance.machines import MACHINES
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine

    result = run_machine("paged", ReferenceAdapter(), property_id="exercise",
                         settings=profiles.settings_for("ci", database=None, max_examples=15))
    assert result.failure is None
    counted = result.exercise.to_json("paged")
    rules = counted["rules"]
    assert rules["build_pool"]["ran"] == result.runs  # one pool per example: every machine Hypothesis built
    assert sum(c.get("ran", 0) for c in rules.values()) > result.runs
    assert set(rules) <= set(MACHINES["paged"].specs())
    assert rules["add_invalid_tokens"].get("rejected", 0) == rules["add_invalid_tokens"]["ran"]  # claimed here
    met = {case for c in rules.values() for case in c if case not in exercise.OUTCOMES}
    assert {"eviction", "pool full"} <= met
    assert counted["capabilities"]["validates_tokens"] >= rules["add_invalid_tokens"]["ran"]


def test_unclaimed_checks_count_as_raised_or_replaced() -> None:
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine
    from tests.lattice import variant

    result = run_machine("paged", variant("nothing-validated"), property_id="exercise-unclaimed",
                         settings=profiles.settings_for("ci", database=None, max_examples=15))
    assert result.failure is None
    invalid = result.exercise.to_json("paged")["rules"]["add_invalid_tokens"]
    assert "rejected" not in invalid and invalid.get("raised", 0) + invalid.get("replaced", 0) == invalid["ran"]


def test_exercise_merges_over_properties_and_names_what_was_never_exercised() -> None:
    first = {"machine": "paged", "rules": {"add": {"ran": 2, "succeeded": 2, "prefix hit": 1}},
             "capabilities": {"paged_prefix_sharing": 2}}
    second = {"machine": "paged", "rules": {"add": {"ran": 3, "rejected": 1}, "fork": {"ran": 1, "fork": 1}},
              "capabilities": {"validates_tokens": 1}}
    both = exercise.merged([first, None, exercise.merged([second])])
    assert both["machines"]["paged"]["add"] == {"prefix hit": 1, "ran": 5, "rejected": 1, "succeeded": 2}
    section = exercise.summary([{"exercise": both}, {"outcome": "skipped"}],
                               ["paged_prefix_sharing", "validates_tokens", "truncate", "float64"])
    assert section["never_exercised"] == ["truncate"]  # float64 is no claim or rule's need: nothing to tell
    assert exercise.summary([{"outcome": "passed"}], ["truncate"])["never_exercised"] == []  # no machine ran
    table = "\n".join(exercise.markdown(section))
    assert ("| rule | runs | calls succeeded | calls rejected | calls refused | calls raised | calls replaced "
            "| met: fork | met: prefix hit |") in table
    assert "| `add` | 5 | 2 | 1 |  |  |  |  | 1 |" in table
    assert "| `truncate` | 0 |" in table  # a rule of the machine no example ran
    assert "**Declared but never exercised**" in table and "`truncate`" in table
    lines = exercise.terminal_lines(section)
    assert lines[0].startswith("paged: 6 steps of 2 rules (never ran: ") and "met: fork 1, prefix hit 1" in lines[0]
    assert lines[-1] == "declared but never exercised: truncate"


def test_the_terminal_summary_merges_what_workers_sent(capsys: pytest.CaptureFixture[str]) -> None:
    plugin = exercise.ExerciseSummary(["truncate", "paged_prefix_sharing"])
    sent = exercise.merged([{"machine": "paged", "rules": {"add": {"ran": 2}}, "capabilities": {
        "paged_prefix_sharing": 1}}])
    plugin.pytest_runtest_logreport(_report("p.py::a", "call", "passed", user_properties=[("kv_exercise", sent)]))
    plugin.pytest_runtest_logreport(_report("p.py::b", "call", "passed", user_properties=[("kv_exercise", sent)]))

    class Terminal:
        def section(self, title: str) -> None:
            print(f"== {title}")

        def write_line(self, line: str) -> None:
            print(line)

    plugin.pytest_terminal_summary(Terminal())
    out = capsys.readouterr().out
    assert "== kvcache: what the run exercised" in out and "paged: 4 steps of 1 rules" in out
    assert "declared but never exercised: truncate" in out


def test_the_suites_own_checks_are_no_verdict_about_the_implementation(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "properties/test_precision.py",
         "properties/test_prefix_store.py", "-k", "float64_oracle or store", "--hypothesis-profile=quick",
         f"--kv-report={report}", f"--kv-traces={tmp_path / 'traces'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    document = json.loads(report.read_text())
    entries = {e["property"].split("::")[1]: e for e in document["properties"]}
    assert entries["test_float64_oracle_agrees_with_mpmath"]["suite_check"]
    assert not entries["test_prefix_store_conforms[full-attention]"].get("suite_check")
    assert document["summary"]["passed"] == 2 and document["suite_checks"]["passed"] == 1, document["summary"]
    # the two store runs (one per worker, as xdist spreads them) add up
    store = document["exercise"]["machines"]["prefix_store"]
    assert store["build_store"]["ran"] == sum(entries[f"test_prefix_store_conforms[{p}]"]["runs"]
                                              for p in ("full-attention", "sliding-window"))
    assert "kvcache: what the run exercised" in process.stdout and "prefix_store: " in process.stdout
    markdown = report.with_suffix(".md").read_text()
    assert "the suite's own checks (no adapter code; not counted above): 1 passed" in markdown
    assert "| `properties/test_precision.py::test_float64_oracle_agrees_with_mpmath` | passed (suite check) |" \
        in markdown and "### `prefix_store`" in markdown


def test_a_whole_models_report_states_its_storage_policy_and_limits() -> None:
    """Two declarations of one engine (a float16 cache and a q8_0 one, say) never read alike."""
    from examples.minimal_adapter import make_adapter
    from impl.model_conformance import make_float32_model_adapter, make_q8_0_model_adapter
    from kvcache_conformance.run.provenance import implementation_facts

    f16, q8 = (implementation_facts(make(), None) for make in (make_float32_model_adapter, make_q8_0_model_adapter))
    assert (f16["kv_storage"], q8["kv_storage"]) == ("float16", "q8_0")
    assert f16["model_limits"] == {} and q8["model_limits"] == {"head_width_multiple": 32}
    assert f16["model_policy"]["contexts"] == ["per_sequence", "unified"]
    layer_only = implementation_facts(make_adapter(), None)
    assert "model_policy" not in layer_only


def test_the_markdown_names_every_rule_applied_beside_the_adapters() -> None:
    """A float64 model whose own rounding may come near 1e-12 is judged by its estimate (docs/spec.md §15.6): the
    report says so, where the adapter's rule alone would claim 1e-12 for every run."""
    from kvcache_conformance.run import report as reports

    entries = [{"property": "properties/test_whole_model.py::test_whole_model_conforms", "outcome": "passed",
                "reason": None, "rules": {"float64: 1e-12": 13, "float64, estimated": 8}},
               {"property": "properties/test_session.py::test_decode_session_conforms", "outcome": "passed",
                "reason": None, "rules": {"float64: 1e-12": 30}}]
    assert reports.rules_applied(entries) == {"float64: 1e-12": 43, "float64, estimated": 8}
    assert reports.rules_applied([{"property": "p", "outcome": "skipped"}]) == {}
    document = {
        "implementation": {"implementation": "m", "implementation_version": "1", "spec": "m:make", "dtype": "float64",
                           "capabilities": ["float64"]},
        "environment": {"python": "3.11", "numpy": "2", "hypothesis": "6"}, "suite": {"version": "0", "commit": None},
        "profile": {"name": "ci", "max_examples": 100, "stateful_step_count": 30, "derandomize": True},
        "summary": {o: 0 for o in OUTCOMES} | {"passed": 2}, "suite_checks": {o: 0 for o in OUTCOMES},
        "complete": True, "stopped": None, "collection_errors": [], "known_failures": None, "budget": None,
        "rule": "float64: 1e-12", "rules": reports.rules_applied(entries), "causes": [], "suite_errors": [],
        "cause_searches_bounded": [], "traces": [], "exercise": {}, "properties": entries}
    lines = reports.markdown(document).splitlines()
    assert "- rule: float64: 1e-12" in lines and "- also applied: float64, estimated (8 runs)" in lines
    assert not any(line.startswith("- also applied") for line in reports.markdown(
        {**document, "rules": {"float64: 1e-12": 43}}).splitlines())
