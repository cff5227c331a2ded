"""Test the tests: the conformance machine must kill every deliberately broken implementation."""

from __future__ import annotations

import pytest

from tests.mutants import MUTANTS, Mutant, kill

pytestmark = pytest.mark.mutation


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_machine_kills_mutant(mutant: Mutant, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The kill is the check; shrinking stops after 1 s (10 s took more than half of the env: most of 122
    # mutants shrink for the whole budget). The shrunk lengths with the suite's own budget: python bench/run.py
    # --only mutants.
    caught = kill(mutant, tmp_path_factory.getbasetemp() / "mutants", shrink_seconds=1.0)
    assert caught is not None, f"the machine did not catch {mutant.name}: {mutant.why}"
    print(f"{mutant.name}: caught in {caught.family} at example {caught.examples} "
          f"({caught.total_runs} runs with shrinking), shrunk to {caught.shrunk_steps} steps: {caught.message}")
