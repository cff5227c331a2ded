"""adapters/hf_report.py replays a published trace against the reference declaring what the recorded adapter
declared: its paged policy and, for a whole model, its model_policy and model_limits (so model traces are
checked as the layer ones are)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from adapters.hf_report import check_traces, reference_declaring
from impl.conformance import ReferenceAdapter
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine

POLICY = {"contexts": ["per_sequence"], "shared_copies": False, "copy_per_sequence": "whole_only",
          "removal": "end_only"}


class CopiesNothing(ReferenceAdapter):
    """A model that copies whole stores only (as transformers' caches and llama.cpp's per-sequence stores do) and
    whose copy forgets to copy."""

    name = "test-hf-report-copies-nothing"
    model_policy: ClassVar[dict[str, Any]] = POLICY
    model_limits: ClassVar[dict[str, Any]] = {"model_width_divisible_by_heads": True}

    def seq_copy(self, context: Any, src: int, dst: int, p0: int, p1: int) -> None:
        pass


def make_copies_nothing() -> CopiesNothing:
    return CopiesNothing()


def test_the_reference_replaying_a_trace_declares_the_recorded_model_policy_and_limits() -> None:
    reference = reference_declaring(CopiesNothing())
    assert reference.model_policy == {**ReferenceAdapter.model_policy, **POLICY}
    assert reference.model_limits == {"model_width_divisible_by_heads": True}
    assert not hasattr(reference_declaring(type("Layer", (), {"capabilities": frozenset({"float64"})})()),
                       "model_limits")  # a layer adapter's trace: the reference as it is


def test_a_model_trace_fails_its_adapter_and_passes_the_reference_declaring_its_policy(tmp_path: Path) -> None:
    result = run_machine("model", CopiesNothing(), property_id="hf-report-model", trace_dir=tmp_path,
                         spec="tests.test_hf_report:make_copies_nothing",
                         settings=profiles.settings_for("ci", database=None, report_multiple_bugs=False),
                         shrink_seconds=1.0)
    assert result.trace is not None
    assert check_traces(tmp_path) == []  # diverges on its adapter at the recorded step, conforms on the reference
