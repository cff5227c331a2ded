"""Kept counterexamples: every trace in the regression corpus replays as one test.

The corpus is ``regressions/`` beside this file (package data) plus any ``--kv-regressions DIR``. A
trace passes when the selected implementation conforms at every step, fails
at the first divergence, and is skipped (with the reason) when it does not apply: a capability, declaration or
claim the implementation does not make that the trace relied on, something it shows (a context's cells) other
than the recorded run saw, or a state its own unclaimed acceptance replaced. A suite error (a trace the suite
cannot read or replay) is listed apart, never the implementation's failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcache_conformance.judge.failures import NonConformance, is_suite_error
from kvcache_conformance.run import selection
from kvcache_conformance.run.runner import suite_error
from kvcache_conformance.traces import codec, replay


def test_trace_replays(regression_trace: Path, record_property: Any) -> None:
    adapter = selection.selected()
    lines: list[str] = []
    try:
        document = codec.load(regression_trace)
        verdict = replay.replay(document, adapter, numbers=selection.oracle_numbers(), out=lines.append)
    except Exception as error:  # the suite's own (a trace it cannot read, a replay that broke): listed, never failed
        if not is_suite_error(error):
            raise
        record_property("kv_trace", str(regression_trace))
        raise suite_error(error, str(regression_trace)) from error
    if verdict.status == "not applicable":
        pytest.skip(f"{regression_trace.name}: {verdict.message}")
    if not verdict.conforms:  # a cause of its own, with its trace (the report keeps the trace's name)
        record_property("kv_cause_per_instance", True)
        record_property("kv_trace", str(regression_trace))
        record_property("kv_rule_failed", document["steps"][verdict.step]["rule"] if verdict.step is not None
                        else None)
        raise NonConformance(f"{regression_trace}: diverges at step {verdict.step}: {verdict.message}\n"
                             + "\n".join(lines), kind=verdict.kind or "corpus trace diverges", check=verdict.check)
