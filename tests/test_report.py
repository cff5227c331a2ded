"""``--kv-report``: one run under xdist, against an adapter that fails some properties and skips others."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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
