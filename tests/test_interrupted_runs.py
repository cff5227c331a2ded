"""An interrupted run still writes its report, says it is incomplete, and passes nothing that did not finish.

Each test starts ``pytest -n 2`` (or ``-n 0``) on a module of quick and slow
tests, with the report plugin of the repository's ``conftest.py``, waits
until slow tests are running, then stops the run as a terminal (Ctrl-C: SIGINT
to the process group), a CI runner or ``kill`` (SIGTERM, to the group or to
the controller alone) would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

# Subprocess runs of the suite: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SLOW_MODULE = '''
import os
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize("n", range(2))
def test_quick(n, record_property):
    if n == 1:  # a failure found before the interrupt, with its trace
        record_property("kv_trace", "counterexamples/found-before-the-interrupt.json")
        raise AssertionError("found before the interrupt")


@pytest.mark.parametrize("n", range(6))
def test_slow(n):
    (Path(os.environ["KV_STARTED"]) / f"slow-{n}").touch()
    time.sleep(120)
'''


def _interrupt(tmp_path: Path, workers: str, how: str) -> tuple[dict[str, Any], str, float]:
    """Run the module, stop it ``how`` once two slow tests run; the report, pytest's output, and the
    seconds from the signal to the controller's exit."""
    (tmp_path / "test_slow_module.py").write_text(SLOW_MODULE)
    started = tmp_path / "started"
    started.mkdir()
    report = tmp_path / "report.json"
    output = (tmp_path / "pytest.out").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-n", workers, "-p", "no:cacheprovider",
         str(tmp_path / "test_slow_module.py"), f"--kv-report={report}"],
        cwd=ROOT, env={**os.environ, "KV_STARTED": str(started)}, stdout=output, stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # An xdist worker (where this test may run) ignores SIGINT, and an ignored signal stays ignored across
        # exec: give the run the terminal's default back, so Python installs its KeyboardInterrupt handler.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while len(list(started.iterdir())) < (2 if workers != "0" else 1):
            assert process.poll() is None, (tmp_path / "pytest.out").read_text()
            assert time.monotonic() < deadline, "the slow tests never started"
            time.sleep(0.1)
        time.sleep(1.0)  # the workers' set-up reports reach the controller
        signalled = time.monotonic()
        if how == "SIGINT to the group":
            os.killpg(process.pid, signal.SIGINT)
        elif how == "SIGTERM to the group":
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)  # generous: CI runs this beside other tests on 2 cores
        seconds = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        output.close()
    text = (tmp_path / "pytest.out").read_text()
    assert report.exists(), text
    return json.loads(report.read_text()), text, seconds


@pytest.mark.parametrize(("workers", "how"), [("2", "SIGINT to the group"), ("2", "SIGTERM to the group"),
                                              ("2", "SIGTERM to the controller"), ("0", "SIGTERM to the controller")])
def test_an_interrupted_run_writes_an_incomplete_report(tmp_path: Path, workers: str, how: str) -> None:
    document, output, seconds = _interrupt(tmp_path, workers, how)
    outcomes = {e["property"].split("::")[1]: e["outcome"] for e in document["properties"]}
    assert document["complete"] is False, output
    assert document["stopped"] == ("SIGTERM" if "SIGTERM" in how else "KeyboardInterrupt (SIGINT, Ctrl-C)")
    assert len(outcomes) == 8  # every collected test is listed, run or not
    assert {outcomes[f"test_slow[{n}]"] for n in range(6)} <= {"unfinished", "not run"}
    running = 2 if workers == "2" else 1
    assert sum(outcomes[f"test_slow[{n}]"] == "unfinished" for n in range(6)) == running
    # xdist's load scheduling (and -n 0, in file order) starts each worker on a quick test: both finished.
    assert (outcomes["test_quick[0]"], outcomes["test_quick[1]"]) == ("passed", "failed")
    assert document["traces"] == ["counterexamples/found-before-the-interrupt.json"]
    assert document["summary"] == {o: sum(v == o for v in outcomes.values()) for o in document["summary"]}
    markdown = (tmp_path / "report.md").read_text()
    assert f"**Incomplete run** (stopped: {document['stopped']}): {running} unfinished" in markdown
    unfinished = [e["property"] for e in document["properties"] if e["outcome"] == "unfinished"]
    assert all(f"| `{nodeid}` | unfinished |" in markdown for nodeid in unfinished)
    assert seconds < 60, f"the run took {seconds:.1f} s to stop"
