"""Replay never errors on an adapter it cannot apply to (issue 36): what a trace's later steps relied on -- claims,
a context's cells -- is recorded and checked, and a trace that does not apply is skipped with the reason; a real
non-conformance still fails; a suite error is listed, never the run's failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from impl.model_conformance import ModelReferenceAdapter
from kvcache_conformance.generate.needs import Needs
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine
from kvcache_conformance.traces import codec, recording, replay
from tests.accepting import AcceptsWhatItDoesNotClaim, ReportsTheCellsAskedFor, RoundsCellsUp
from tests.lattice import variant

ROOT = Path(__file__).resolve().parent.parent
REGRESSIONS = ROOT / "properties" / "regressions"
OOV = "impl-mutant-model_shift_not_re_rotated-model_model-859bcdbb72.json"  # a token out of the vocabulary at step 2
# batches past the room, then more: the corpus trace as recorded before model traces recorded their capacity
PAST_THE_ROOM = "../../tests/replay-cases/impl-mutant-model_load_keeps_own_cells-model_model-827de6c2aa.json"
FULL = "impl-mutant-model_decode_writes_then_raises_full-model_model-f8efdbb3ee.json"  # one batch past the room


def quiet(line: str) -> None:
    pass


def load(name: str) -> dict[str, Any]:
    return codec.load(REGRESSIONS / name)


def as_if_unclaimed_and_raised(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` as if recorded (format 5) where no check was claimed and every rejected call raised anyway:
    nothing at the gate rules it out, and an adapter that accepts parts from the recorded path."""
    edited = json.loads(json.dumps(document))
    edited["format_version"], edited["claims"] = 5, {}
    for step in edited["steps"]:
        for entry in step["expected"]:
            if entry.get("expect") == "rejection":
                entry.update(expect="unclaimed", outcome=recording.RAISED)
    return edited


def test_a_trace_whose_later_steps_relied_on_a_claim_is_skipped_where_it_is_not_made() -> None:
    """The issue's case: rejected under validates_model_batch, then more steps; an adapter that does not claim it
    may accept the batch and replace the context. Skipped at the gate (format 3: read from the steps)."""
    verdict = replay.replay(load(OOV), variant("model-accepts-unclaimed"), out=quiet)
    assert (verdict.status, verdict.step) == ("not applicable", None), verdict.message
    assert "does not claim validates_model_batch" in verdict.message and "step 2 (malformed_batch)" in verdict.message
    assert replay.replay(load(OOV), ModelReferenceAdapter(), out=quiet).conforms


def test_which_claims_a_trace_relied_on() -> None:
    def call(expect: str, claim: str | None = None, **more: Any) -> dict[str, Any]:
        return {"call": "c", "expect": expect, **({"claim": claim, "kind": "full"} if claim else {}), **more}

    steps = [{"rule": "a", "expected": [call("rejection", "fixed_capacity"), call("state")]},
             {"rule": "b", "expected": [call("unclaimed", "validates_model_batch", outcome=recording.REPLACED),
                                        call("unclaimed", "validates_sequence_ops", outcome=recording.RAISED)]},
             {"rule": "c", "expected": [{"call": "d", "rejected": "full"}, call("rejection", "validates_length"),
                                        {"call": "after the last step"}]}]
    assert recording.claims_relied_on(steps) == {
        "fixed_capacity": {"value": True, "relied_on_by": ["step 0 (a)", "step 2 (c)"]},  # (format 2's "rejected")
        "validates_model_batch": {"value": False, "relied_on_by": ["step 1 (b)"]}}  # the last call: nothing after
    # a rejection in the last step, followed only by the check after it, relies on nothing
    assert recording.claims_relied_on([steps[0]]) == {}
    # a call outside the spec (Due.outside: a shift past max_positions) accepted: no claim relied on, no KeyError
    outside = [{"rule": "shift", "expected": [call("unclaimed", outcome=recording.REPLACED)]}, steps[0]]
    assert recording.claims_relied_on(outside) == {}
    gate = Needs.drawn_under({}, recording.claims_relied_on(steps))
    assert "claims validates_model_batch" in (gate.problem(ModelReferenceAdapter()) or "")
    accepting = AcceptsWhatItDoesNotClaim()
    assert "does not claim fixed_capacity" in (gate.problem(accepting) or "")


def test_replay_that_leaves_the_recorded_path_is_skipped_where_the_values_no_longer_fit() -> None:
    """A call not claimed that raised in the recorded run, accepted here: the context replaced, and the recorded
    draws no longer fit -- not applicable, naming where the paths parted, never a suite error."""
    for name, parted in ((OOV, 2), (PAST_THE_ROOM, 2)):
        verdict = replay.replay(as_if_unclaimed_and_raised(load(name)), AcceptsWhatItDoesNotClaim(), out=quiet)
        assert verdict.status == "not applicable" and verdict.step is not None and verdict.step > parted, verdict
        assert f"step {parted} (" in verdict.message and "accepted without a claim and replaced here" in \
            verdict.message and "Error" not in verdict.message, verdict.message


class _LosesPositionsOfLaterContexts(AcceptsWhatItDoesNotClaim):
    """Every context after its first shows no positions: a bug met only once the replay has left the path."""

    name = "loses-positions-of-later-contexts"

    def __init__(self) -> None:
        self.first: Any = None

    def create_context(self, model: Any, config: Any) -> Any:
        context = super().create_context(model, config)
        self.first = context if self.first is None else self.first
        return context

    def seq_pos_max(self, context: Any, seq: int) -> int:
        return super().seq_pos_max(context, seq) if context is self.first else -1


def test_a_real_failure_met_after_the_replay_left_the_recorded_path_still_fails() -> None:
    verdict = replay.replay(as_if_unclaimed_and_raised(load(PAST_THE_ROOM)), _LosesPositionsOfLaterContexts(),
                            out=quiet)
    assert (verdict.status, verdict.kind) == ("diverges", "wrong positions") and verdict.step > 2, verdict


def test_a_trace_records_the_cells_it_was_drawn_against_and_replays_only_where_they_are_shown(
        tmp_path: Path) -> None:
    """Rounding up but reporting the cells asked for, a batch past the reported room is accepted: its trace (format
    5) records the cells and the claims; it fails its adapter again, and is not applicable where a store has other
    cells."""
    twin = ReportsTheCellsAskedFor()
    result = run_machine("model", twin, property_id="cells", trace_dir=tmp_path, shrink_seconds=2.0,
                         settings=profiles.settings_for("ci", database=None, max_examples=200))
    assert isinstance(result.failure, NonConformance) and result.trace is not None, result.failure
    document = codec.load(result.trace)
    assert document["format_version"] == codec.FORMAT_VERSION == 5
    assert document["claims"] == recording.claims_relied_on(document["steps"])
    cells = document["steps"][0]["observed"]
    assert [entry["label"] for entry in cells] == ["context cells"], cells
    again = replay.replay(document, ReportsTheCellsAskedFor(), out=quiet)  # the real failure still reproduces
    assert (again.status, again.kind) == ("diverges", result.failure.kind), again.message
    rounded = replay.replay(document, RoundsCellsUp(), out=quiet)
    assert (rounded.status, rounded.step) == ("not applicable", 0), rounded.message
    assert "context cells" in rounded.message and f"recorded against {cells[0]['value']}" in rounded.message
    assert replay.replay(document, ModelReferenceAdapter(), out=quiet).conforms


def test_an_older_trace_past_the_room_is_not_applicable_where_a_store_has_more_cells() -> None:
    """Format 3 records no cells: the step that no longer draws the recorded batch says so (it once passed,
    having asked nothing)."""
    verdict = replay.replay(load(FULL), RoundsCellsUp(), out=quiet)
    assert (verdict.status, verdict.step) == ("not applicable", 1), verdict.message
    assert "did not draw the recorded 'tokens'" in verdict.message


def test_a_suite_error_in_a_replayed_trace_is_listed_never_the_runs_failure(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    broken = load(OOV)
    broken["steps"][1]["rule"] = "no_such_rule"
    (corpus / "broken.json").write_text(json.dumps(broken))
    report = tmp_path / "report.json"
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "properties/test_regressions.py",
         f"--kv-regressions={corpus}", "-k", "broken or model_shift_not_re_rotated", f"--kv-report={report}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout[-3000:]
    assert "kvcache: suite errors" in process.stdout and "broken" in process.stdout, process.stdout[-3000:]
    document = json.loads(report.read_text())
    assert document["summary"]["failed"] == 0 and document["summary"]["suite error"] == 1, document["summary"]
    (listed,) = document["suite_errors"]
    assert listed["kind"] == "suite error (TraceError)" and listed["trace"] == str(corpus / "broken.json"), listed
    assert "no_such_rule" in listed["message"]
