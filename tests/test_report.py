"""``--kv-report``: one run under xdist, against an adapter that fails some properties and skips others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from properties import trace

ROOT = Path(__file__).resolve().parent.parent


def test_the_report_says_what_ran_how_and_what_it_found(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    environment = {**os.environ, "HYPOTHESIS_PROFILE": "ci"}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "properties/test_layer_cache.py",
         "properties/test_session.py", "properties/test_cache_creation.py", "-k", "mha or session or zero_batch",
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
    layer = entries["test_layer_cache_conforms[interleaved-mha]"]
    assert layer["outcome"] == "failed" and "dtype float32, but should be float64" in layer["reason"]
    assert layer["runs"] > 1 and Path(layer["trace"]).exists()
    assert trace.load(Path(layer["trace"]))["failure"]["step"] >= 1
    session = entries["test_decode_session_conforms"]
    assert session["outcome"] == "passed" and 0 < session["worst_error"] <= session["tolerance"] == 1e-12
    assert entries["test_zero_batch_and_zero_capacity_are_rejected"]["runs"] >= 1  # a @given property
    assert document["summary"] == {o: sum(e["outcome"] == o for e in entries.values())
                                   for o in ("passed", "failed", "skipped")}
    markdown = report.with_suffix(".md").read_text()
    assert "# Conformance of misbehaving-wrong-dtype" in markdown
    assert "| `properties/test_session.py::test_decode_session_conforms` | passed |" in markdown
