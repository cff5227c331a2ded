"""Kept counterexamples: every trace in the regression corpus replays as one test.

The corpus is ``tests/regressions/`` plus any ``--kv-regressions DIR``. A
trace passes when the selected implementation conforms at every step, fails
at the first divergence, and is skipped (with the reason) when it needs a
capability the implementation does not declare.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import selection
from kvcache_conformance.traces import codec, replay


def test_trace_replays(regression_trace: Path) -> None:
    adapter = selection.selected()
    lines: list[str] = []
    verdict = replay.replay(codec.load(regression_trace), adapter, numbers=selection.oracle_numbers(),
                            out=lines.append)
    if verdict.status == "not applicable":
        pytest.skip(f"{regression_trace.name}: {verdict.message}")
    if not verdict.conforms:
        raise NonConformance(f"{regression_trace}: diverges at step {verdict.step}\n" + "\n".join(lines),
                             kind="corpus trace diverges", check=regression_trace.stem)
