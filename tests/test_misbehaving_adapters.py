"""The harness survives bad plug-ins: each misbehaviour is a non-conformance verdict naming the step,
with a trace that replays to the same verdict -- never a crash of the run, never a hang."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from kvcache_conformance.judge import calls as verdict
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine
from kvcache_conformance.traces import codec as trace
from kvcache_conformance.traces import replay
from tests import misbehaving

pytestmark = pytest.mark.slow  # whole machine runs against adapters that misbehave (on Python 3.11 only)

QUICK = profiles.settings_for("ci", max_examples=100, database=None, report_multiple_bugs=False)

CASES = [
    (misbehaving.MutatesItsInput, r"modified its input x in place"),
    (misbehaving.ReturnsTheWrongShape, r"shape \(1, \d+\), but should be \(1, 1, \d+\)"),
    (misbehaving.ReturnsTheWrongDtype, r"dtype float32, but should be float64"),
    (misbehaving.ReturnsAList, r"expected a numpy array of shape \(1, 1, \d+\), got list"),
    (misbehaving.RaisesAnUnmappedError, r"raised RuntimeError: internal error in the implementation -- an exception "
                                        r"the adapter does not map"),
    (misbehaving.ErrorKindRaises, r"and the adapter's error_kind raised KeyError"),
]


@pytest.mark.parametrize(("adapter_class", "verdict_text"), CASES, ids=[c[0].__name__ for c in CASES])
def test_misbehaviour_is_a_verdict_naming_the_step(adapter_class: type, verdict_text: str, tmp_path: Path) -> None:
    adapter = adapter_class()
    # shrinking given time to finish: under CI's load (other envs beside) the default 30 s cut it at 4 steps
    result = run_machine("layer_cache", adapter, property_id=adapter.name, settings=QUICK, trace_dir=tmp_path,
                         parameters={"style": "interleaved", "grouped": False}, shrink_seconds=300)
    assert isinstance(result.failure, NonConformance), result.failure
    message = str(result.failure)
    assert re.search(verdict_text, message), message
    assert message.startswith("append ")  # the step, by what it did: "append a row ...", "append through ..."
    assert result.steps <= 3, f"shrunk to {result.steps} steps"
    assert result.trace is not None and f"counterexample trace: {result.trace.name}" in message.replace(
        str(result.trace.parent) + "/", "")
    replayed = replay.replay(trace.load(result.trace), adapter, out=lambda line: None)
    assert (replayed.status, replayed.step) == ("diverges", result.failing_step)
    assert re.search(verdict_text, replayed.message), replayed.message


def test_a_hanging_call_is_stopped_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verdict, "CALL_TIMEOUT", 0.5)
    adapter = misbehaving.Hangs()
    start = time.perf_counter()
    # shrinking given time to finish: under CI's load (other envs beside) the default 30 s cut it at 4 steps
    result = run_machine("layer_cache", adapter, property_id=adapter.name, settings=QUICK, trace_dir=tmp_path,
                         parameters={"style": "interleaved", "grouped": False}, shrink_seconds=300)
    assert time.perf_counter() - start < 30  # one timeout, no shrinking through hangs
    assert isinstance(result.failure, NonConformance)
    assert "did not return within 0.5 s" in str(result.failure)
    assert str(result.failure).startswith("append ")
    assert result.trace is not None
    replayed = replay.replay(trace.load(result.trace), adapter, out=lambda line: None)
    assert (replayed.status, replayed.step) == ("diverges", result.failing_step)


def test_the_reference_passes_the_same_quick_run(tmp_path: Path) -> None:
    """The control: what fails above is the misbehaviour, not the quick settings."""
    from impl.conformance import ReferenceAdapter

    result = run_machine("layer_cache", ReferenceAdapter(), property_id="reference", settings=QUICK,
                         trace_dir=tmp_path, parameters={"style": "interleaved", "grouped": False})
    assert result.failure is None and result.trace is None and not list(tmp_path.iterdir())
