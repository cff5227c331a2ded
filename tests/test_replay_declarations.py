"""Replay gated by every declaration a trace's program relied on (generate.needs.DECLARATIONS): the whole corpus
against every lattice variant passes or is skipped, each skip naming what rules it out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from impl.conformance import ReferenceAdapter
from kvcache_conformance.generate.needs import Needs, UnknownDeclaration
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.machines import MACHINES
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine
from kvcache_conformance.traces import codec, recording, replay
from tests.accepting import AcceptsWhatItDoesNotClaim, RoundsCellsUp
from tests.lattice import TWINS, VARIANTS, variant

pytestmark = pytest.mark.slow  # the whole corpus replayed against every lattice variant (on Python 3.11 only): 14,420
# replays, 19 s of CPU (2026-12-05)

REGRESSIONS = Path(__file__).parent.parent / "properties" / "regressions"
CORPUS = {path.name: codec.load(path) for path in sorted(REGRESSIONS.glob("*.json"))}
OLD = {f"old-traces/{path.name}": codec.load(path)  # (some share a name with a corpus trace)
       for path in sorted((Path(__file__).parent / "old-traces").glob("*.json"))}
LRU = "impl-mutant-paged_lru_evicts_everything-paged_paged-25c46b7a23.json"
TRUNCATING = ("impl-mutant-paged_copy_on_write_missing-paged_paged-89945b46b9.json",
              "impl-mutant-paged_copy_on_write_without_rows-paged_paged-d44dfb2a2f.json",
              "impl-mutant-paged_fork_aliases_partial_block-paged_paged-c16741a960.json")


def quiet(line: str) -> None:
    pass


def test_the_whole_corpus_passes_or_is_skipped_against_every_lattice_variant() -> None:
    """In-process: each variant built once, every trace (and the old formats') replayed against it; and against the
    whole models that accept every input whose check they do not claim, or have more cells than asked for, as
    users load them (issue 36: never a suite error)."""
    outcomes: dict[str, int] = {}
    adapters = {**VARIANTS, "accepting": AcceptsWhatItDoesNotClaim, "rounding": RoundsCellsUp}
    for name in sorted(adapters):
        adapter = adapters[name]()
        for trace_name, document in {**CORPUS, **OLD}.items():
            verdict = replay.replay(document, adapter, out=quiet)
            assert verdict.status in ("conforms", "not applicable"), (name, trace_name, verdict.message)
            if verdict.status == "not applicable":  # a reason, never a crash
                assert verdict.message and "Error" not in verdict.message, (name, trace_name, verdict.message)
            outcomes[verdict.status] = outcomes.get(verdict.status, 0) + 1
    assert outcomes["conforms"] > outcomes["not applicable"] > 0, outcomes


def test_a_pool_without_signature_never_replays_two_decoders() -> None:
    """The known bad case: the lru mutant's trace adds the same tokens under two decoders in one pool."""
    without_signature = variant("policy-hash-scope-only")
    verdict = replay.replay(CORPUS[LRU], without_signature, out=quiet)
    assert verdict.status == "not applicable" and verdict.step == 0, verdict.message  # format 3: at build_pool
    assert "paged_policy.hash_keys signature False" in verdict.message, verdict.message
    gated = json.loads(json.dumps(CORPUS[LRU]))
    gated["declarations"] = {"paged_policy.hash_keys signature": {"value": True, "relied_on_by": ["build_pool"]}}
    verdict = replay.replay(gated, without_signature, out=quiet)
    assert verdict.status == "not applicable" and verdict.step is None, verdict  # format 4: before any step
    assert "paged_policy.hash_keys signature False" in verdict.message and "build_pool" in verdict.message
    assert replay.replay(gated, variant("policy-hash-signature-only"), out=quiet).conforms


@pytest.mark.parametrize("name", TRUNCATING)
def test_a_skip_names_the_declaration_that_rules_the_trace_out(name: str) -> None:
    verdict = replay.replay(CORPUS[name], variant("policy-no-truncate"), out=quiet)
    assert verdict.status == "not applicable", verdict.message
    assert "paged_policy.truncate False" in verdict.message and "capabilities and dtype" not in verdict.message


def test_a_new_trace_records_the_declarations_its_program_relied_on(tmp_path: Path) -> None:
    """A pool that cannot truncate, declared as one that can, fails in a truncating rule: its trace records
    truncate True, and replays only where truncate is declared."""
    factory, machine, parameters, _ = TWINS["policy-no-truncate-claims-truncate"]
    result = run_machine(machine, factory(), property_id="declarations", parameters=parameters, trace_dir=tmp_path,
                         settings=profiles.settings_for("ci", database=None, max_examples=200))
    assert isinstance(result.failure, NonConformance) and result.trace is not None
    document = codec.load(result.trace)
    assert document["format_version"] == codec.FORMAT_VERSION
    relied = document["declarations"]
    assert relied["paged_policy.truncate"]["value"] is True and relied["paged_policy.hash_keys signature"] == {
        "value": True, "relied_on_by": ["build_pool", *(
            ["update_weights_in_place"] if any(s["rule"] == "update_weights_in_place" for s in document["steps"])
            else [])]}
    rules = {step["rule"] for step in document["steps"]}
    assert set(relied) == set(MACHINES["paged"].relied_on(rules))
    verdict = replay.replay(document, variant("policy-no-truncate"), out=quiet)
    assert verdict.status == "not applicable" and verdict.step is None
    assert "declares paged_policy.truncate False, but the trace was drawn under True" in verdict.message
    assert replay.replay(document, ReferenceAdapter(), out=quiet).conforms


def test_which_declared_values_admit_a_program_drawn_under_others() -> None:
    def admitted(name: str, recorded: object, adapter: object) -> bool:
        return Needs.drawn_under({name: {"value": recorded, "relied_on_by": ["add"]}}).problem(adapter) is None

    keys = variant("policy-hash-request-keys")
    assert admitted("paged_policy.request_keys", [], keys)  # no key drawn: each is "" under any keys
    assert not admitted("paged_policy.request_keys", ["salt"], keys)
    assert admitted("paged_policy.fork", "shared", variant("policy-fork-re-add"))
    assert not admitted("paged_policy.fork", "shared", variant("policy-fork-none"))
    assert not admitted("storage", None, variant("storage-uint4-min-step"))
    assert admitted("dtype", "float64", ReferenceAdapter())


def test_an_unknown_declaration_is_a_clear_error() -> None:
    with pytest.raises(UnknownDeclaration, match=r"no declaration 'paged_policy\.trunc'"):
        recording.rule(relies_on=["paged_policy.trunc"])
    document = json.loads(json.dumps(CORPUS[LRU]))
    document["declarations"] = {"paged_policy.colour": {"value": "red"}}
    with pytest.raises(codec.TraceError, match=r"paged_policy\.colour"):
        replay.replay(document, ReferenceAdapter(), out=quiet)


def test_the_guide_names_every_declaration_a_trace_may_record() -> None:
    from kvcache_conformance.generate.needs import DECLARATIONS

    guide = " ".join((Path(__file__).parent.parent / "docs" / "adapters.md").read_text().split())
    assert [name for name in DECLARATIONS if f"`{name}`" not in guide] == []
