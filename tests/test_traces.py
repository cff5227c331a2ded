"""Counterexample traces: exact round trips, and replays that reach the same verdict anywhere."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import rule

from examples.minimal_adapter import make_adapter as minimal_adapter
from impl.conformance import ReferenceAdapter
from kvcache_conformance.generate import LayerConfig
from kvcache_conformance.machines import MACHINES
from kvcache_conformance.oracle import AttentionWeights, DecoderConfig, RopeConfig
from kvcache_conformance.run import selection
from kvcache_conformance.traces import codec as trace
from kvcache_conformance.traces import recording, replay
from tests.mutants import build, recorded_mutant

REGRESSIONS = Path(__file__).parent.parent / "properties" / "regressions"  # the corpus, package data
CORPUS = sorted(REGRESSIONS.glob("*.json"))


def test_values_round_trip_exactly() -> None:
    w = np.array([[0.1, -2.5e-300], [np.nextafter(1.0, 2.0), -0.0]])
    values = [
        None, True, 3, 0.1, math.inf, -math.inf, "01", [1.0, 2], [[0]], (("query", 3, 1.5),),
        np.array([math.nan, math.inf, 1e308]), np.array([[1 + 2j, math.nan - 1j]]), np.zeros((2, 0, 3)),
        np.array([1, -2], dtype=np.int64), np.array([True]),
        LayerConfig(AttentionWeights(w, w, w, w, heads=1, kv_heads=1), RopeConfig("half_split", 10000.0, 2, 7), 2, 3),
        DecoderConfig(vocab=5, window=2),
    ]
    for value in values:
        text = json.dumps(trace.encode(value), allow_nan=False)
        again = trace.decode(json.loads(text))
        assert json.dumps(trace.encode(again), allow_nan=False) == text
        assert type(again) is type(value)
        if isinstance(value, np.ndarray):
            assert again.dtype == value.dtype and again.shape == value.shape
            assert again.tobytes() == value.tobytes()
    assert math.copysign(1.0, trace.decode(trace.encode(np.array([-0.0])))[0]) == -1.0


def test_a_rule_that_is_not_traced_is_refused() -> None:
    with pytest.raises(TypeError, match=r"not declared with traces\.recording\.rule"):
        class Untraced(recording.TracedMachine):
            @rule(data=st.data())
            def forgot(self, data: st.DataObject) -> None:
                pass


def test_hypothesis_rule_markers_are_where_the_untraced_check_looks() -> None:
    """The one private name the suite reads: if Hypothesis moves it, this fails loudly (not the check)."""
    from hypothesis import stateful

    assert isinstance(getattr(stateful, "RULE_MARKER", None), str)
    assert isinstance(getattr(stateful, "INITIALIZE_RULE_MARKER", None), str)


def test_rules_declare_what_they_need_and_disabled_rules_are_never_drawn() -> None:
    from kvcache_conformance.machines.layer import LayerCacheMachine
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine

    specs = LayerCacheMachine.specs()
    assert specs["append_under_other_rope"].when is not None and not specs["reset"].requires
    assert specs["build_layer_and_cache"].kind == "initialize"
    drawn: set[str] = set()

    class Watching(LayerCacheMachine):
        def may_run(self, spec: trace.RuleSpec) -> bool:
            allowed = super().may_run(spec)
            if allowed:
                drawn.add(spec.name)
            return allowed

    from kvcache_conformance.run import runner
    runner.MACHINES["watching"] = Watching
    try:
        result = run_machine("watching", ReferenceAdapter(), property_id="disabled", disabled_rules=frozenset(
            {"reset", "append_malformed_row"}), settings=profiles.settings_for("ci", database=None, max_examples=20))
    finally:
        del runner.MACHINES["watching"]
    assert result.failure is None
    assert "append_rows" in drawn and not drawn & {"reset", "append_malformed_row"}
    with pytest.raises(ValueError, match="no rule"):
        run_machine("layer_cache", ReferenceAdapter(), property_id="typo", disabled_rules=frozenset({"rest"}))


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_a_mutant_trace_fails_the_mutant_at_the_recorded_step_and_passes_the_reference(
        path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    document = trace.load(path)
    spec = build(recorded_mutant(document), tmp_path_factory.getbasetemp() / "mutants")
    against_mutant = replay.replay(document, selection.load_adapter(spec), out=lambda line: None)
    assert (against_mutant.status, against_mutant.step) == ("diverges", document["failure"]["step"])
    if "kind" in document["failure"]:  # format 3 records the failure's kind and check (messages are for people)
        assert (against_mutant.kind, against_mutant.check) == (document["failure"]["kind"],
                                                               document["failure"]["check"])
    # The reference the mutant was made from: the same factory of the unmutated impl (its storage declared too).
    factory = document["recorded_with"]["spec"].partition(":")[2]
    reference = selection.load_adapter(f"impl.conformance:{factory}")
    against_reference = replay.replay(document, reference, out=lambda line: None)
    assert against_reference.conforms, against_reference.message


def test_the_corpus_holds_a_trace_of_every_machine() -> None:
    assert {trace.load(p)["machine"] for p in CORPUS} == set(MACHINES)


def test_replay_needs_what_the_trace_needs() -> None:
    """A trace that drew a capability the implementation lacks is not applicable -- and says why."""
    gqa = next(p for p in CORPUS if trace.load(p)["parameters"].get("grouped") is True)
    verdict = replay.replay(trace.load(gqa), minimal_adapter(), out=lambda line: None)
    assert verdict.status == "not applicable"
    assert "gqa" in verdict.message or "rope_half_split" in verdict.message


def test_a_windowed_trace_is_not_applicable_without_window_caches() -> None:
    """Found by the transformers runs: a windowed trace once fed create_cache(window=...) to any adapter."""
    windowed = [p for p in CORPUS if trace.load(p)["machine"] == "cache_operations"
                and trace.load(p)["parameters"].get("windowed") is True]
    assert windowed
    without = type("NoWindows", (ReferenceAdapter,), {
        "name": "test-no-windows", "capabilities": ReferenceAdapter.capabilities - {"sliding_window_layer"}})()
    for path in windowed:
        verdict = replay.replay(trace.load(path), without, out=lambda line: None)
        assert verdict.status == "not applicable" and "sliding_window_layer" in verdict.message, verdict.message


def test_the_replay_command_exits_by_verdict(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setattr(selection, "_selected", selection._selected)  # main() selects; restored afterwards
    monkeypatch.setattr(selection, "_oracle", selection._oracle)
    path = next(p for p in CORPUS if trace.load(p)["machine"] == "layer_cache")
    assert replay.main([str(path), "--kv-impl", "impl.conformance:make_adapter"]) == 0
    mutant = recorded_mutant(trace.load(path))
    spec = build(mutant, tmp_path_factory.getbasetemp() / "mutants")
    verdicts = tmp_path_factory.mktemp("replay") / "verdicts.json"
    assert replay.main([str(path), "--kv-impl", spec, f"--json={verdicts}"]) == 1
    out = capsys.readouterr().out
    recorded = trace.load(path)["failure"]
    assert f"DIVERGES at step {recorded['step']}" in out
    [written] = json.loads(verdicts.read_text())  # for programs: the cause, as the recorded run had it
    assert (written["trace"], written["status"], written["step"]) == (str(path), "diverges", recorded["step"])
    assert (written["kind"], written["check"], written["changed"]) == (recorded["kind"], recorded["check"],
                                                                      recorded.get("changed", []))


def test_a_trace_from_another_suite_version_is_refused(tmp_path: Path) -> None:
    document = json.loads(CORPUS[0].read_text())
    document["steps"][0]["draws"][0]["label"] = "renamed"
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(document))
    with pytest.raises(trace.TraceError, match="the suite changed"):
        replay.replay(trace.load(changed), ReferenceAdapter(), out=lambda line: None)
    document["format_version"] = 99
    changed.write_text(json.dumps(document))
    with pytest.raises(trace.TraceError, match="format version 99"):
        trace.load(changed)


def test_a_run_that_stopped_inside_its_last_step_replays_as_far_as_recorded() -> None:
    """A failure inside a rule ends the recording there; an implementation that gets further has conformed on
    everything recorded (running out of draws in an earlier step still means the suite changed)."""
    path = next(p for p in CORPUS if "write_then_raise" in p.name)
    document = trace.load(path)
    last = document["steps"][-1]
    assert last["draws"], "the trace's last step draws something"
    cut = json.loads(json.dumps(document))
    cut["steps"][-1]["draws"] = []  # as if the run had stopped before the step's first draw
    verdict = replay.replay(cut, ReferenceAdapter(), out=lambda line: None)
    assert verdict.conforms and "as far as recorded" in verdict.message
    earlier = json.loads(json.dumps(document))
    step = next(i for i, s in enumerate(earlier["steps"][:-1]) if s["draws"])
    earlier["steps"][step]["draws"] = []
    with pytest.raises(trace.TraceError, match="the suite changed"):
        replay.replay(earlier, ReferenceAdapter(), out=lambda line: None)
