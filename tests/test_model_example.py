"""The minimal whole-model example adapter (examples/minimal_model_adapter.py) conforms to what it claims, and the
layer properties skip it."""

from __future__ import annotations

from examples.minimal_model_adapter import make_adapter
from kvcache_conformance.run import profiles, selection
from kvcache_conformance.run.runner import run_machine


def test_the_minimal_model_example_conforms_to_what_it_claims() -> None:
    adapter = selection.load_adapter("examples.minimal_model_adapter:make_adapter")
    result = run_machine("model", adapter, property_id="model-example",
                         settings=profiles.settings_for("ci", database=None, max_examples=30))
    assert result.failure is None, result.failure


def test_the_layer_machines_do_not_apply_to_it() -> None:
    from kvcache_conformance.machines import MACHINES

    adapter = make_adapter()
    for machine in ("layer_cache", "session", "paged"):
        assert MACHINES[machine].needs().problem(adapter) is not None, machine
    assert MACHINES["model"].needs().problem(adapter) is None


def test_the_model_machine_drives_a_model_in_a_child_process() -> None:
    """A native engine's adapter, isolated (docs/adapters.md "Whole models"): contexts stay in the child as
    handles, batches, logits and saved states cross by value."""
    from kvcache_conformance.protocol.isolation import isolated

    adapter = isolated("impl.model_conformance:make_model_adapter", timeout=None)
    try:
        result = run_machine("model", adapter, property_id="model-isolated",
                             settings=profiles.settings_for("ci", database=None, max_examples=5))
    finally:
        adapter.stop()
    assert result.failure is None, result.failure
