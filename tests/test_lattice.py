"""The declaration lattice (tests/lattice.py): every variant of the reference that claims less or chooses
differently, declared honestly, conforms -- the whole suite, properties and corpus, with only skips; every twin
that declares a choice it did not make fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase

from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine
from tests.lattice import AREAS, REFERENCE, TWINS, VARIANTS, Declared, ReferenceAdapter, scope, scope_of

pytestmark = pytest.mark.slow  # a subprocess run of the whole suite per variant

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_an_honest_variant_conforms_to_the_whole_suite(name: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    process = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", scope(name),
         "--kv-impl=tests.lattice:from_environment", "--hypothesis-profile=quick", f"--kv-report={report}",
         f"--kv-traces={tmp_path / 'traces'}"],
        cwd=ROOT, env={**os.environ, "KVCACHE_LATTICE": name}, capture_output=True, text=True, timeout=900)
    document = json.loads(report.read_text())
    summary = document["summary"]
    assert document["complete"] and not document["collection_errors"], process.stdout[-3000:]
    failed = [(e["property"], e["reason"]) for e in document["properties"] if e["outcome"] not in (
        "passed", "skipped")]
    # a run of the whole suite passes something; one property alone may skip (the variant lacks its area)
    assert not failed and (summary["passed"] > 0 or scope(name) != "properties"), failed
    for entry in document["properties"]:  # a skip names what is missing, never a crash
        if entry["outcome"] == "skipped":
            assert entry["reason"] and "Error" not in entry["reason"], entry


def test_a_variant_runs_alone_only_the_property_of_the_one_area_it_differs_in() -> None:
    class ContextsElsewhere(ReferenceAdapter):
        def create_context(self, *args: object) -> object:
            return super().create_context(*args)

    class StepsElsewhereToo(ContextsElsewhere):
        def step(self, *args: object) -> object:
            return super().step(*args)

    model = {**ReferenceAdapter.model_policy, "shared_copies": False}
    assert scope_of(Declared("model", REFERENCE, ContextsElsewhere(), model_policy=model)) == AREAS["model"][3]
    assert scope_of(Declared("both", REFERENCE, StepsElsewhereToo(), model_policy=model)) == "properties"
    assert scope_of(Declared("nothing", REFERENCE)) == "properties"  # no difference found: no area claimed
    assert scope("policy-fork-none") == AREAS["paged"][3]
    assert scope("without-validates_batch") == "properties"


@pytest.mark.parametrize("name", sorted(TWINS))
def test_the_wrongly_declared_twin_fails(name: str) -> None:
    factory, machine, parameters, kind = TWINS[name]
    adapter = factory()
    # No shrinking: the kind is the check, and the first failing example's kind is fixed by the derandomised
    # draws. A shrink cut short by its time bound (a loaded CI machine) could end on another failure of the same
    # twin -- an append past the room that the twin took, then a RoPE position past the layer's -- and did.
    result = run_machine(machine, adapter, property_id=f"twin-{name}", parameters=parameters,
                         settings=profiles.settings_for("ci", database=None, report_multiple_bugs=False,
                                                        max_examples=200,  # twice ci's: a twin's corner is narrow
                                                        phases=(Phase.explicit, Phase.generate)))
    assert isinstance(result.failure, NonConformance), result.failure
    assert result.failure.kind.startswith(kind), result.failure
