"""Each machine property keeps its own examples in its implementation's database.

Hypothesis keys a state machine's examples by the factory it runs, the same
for every property here; ``databases.PropertyDatabase`` prefixes the keys with a
digest of (implementation, property, parameters, rules left out). Without
it, the other properties replayed a saved failure, passed it and deleted it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from impl.conformance import ReferenceAdapter
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.databases import PropertyDatabase, database_prefix, property_settings
from kvcache_conformance.run.runner import run_machine

# Whole machine runs and subprocess runs of the suite: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow

FAILING: tuple[str, str, dict[str, Any]] = (
    "properties/test_layer_cache.py::test_layer_cache_conforms[interleaved-mha]", "layer_cache",
    {"style": "interleaved", "grouped": False})
OTHERS: list[tuple[str, str, dict[str, Any]]] = [
    ("properties/test_layer_cache.py::test_layer_cache_conforms[interleaved-gqa]", "layer_cache",
     {"style": "interleaved", "grouped": True}),
    ("properties/test_layer_cache.py::test_layer_cache_conforms[half_split-mha]", "layer_cache",
     {"style": "half_split", "grouped": False}),
    ("properties/test_layer_cache.py::test_layer_cache_conforms[half_split-gqa]", "layer_cache",
     {"style": "half_split", "grouped": True}),
    ("properties/test_session.py::test_decode_session_conforms", "session", {}),
    ("properties/test_prefix_store.py::test_prefix_store_conforms[full-attention]", "prefix_store",
     {"windowed": False}),
    ("properties/test_prefix_store.py::test_prefix_store_conforms[sliding-window]", "prefix_store",
     {"windowed": True}),
]


class WrongOnInterleavedMha(ReferenceAdapter):
    """Off by 1e-6, with interleaved RoPE and as many KV heads as heads only."""

    name = "wrong-on-interleaved-mha"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        output = super().step(layer, cache, x)
        if layer.rope.style == "interleaved" and layer.heads == layer.kv_heads:
            return output + 1e-6
        return output


def _files(directory: Path) -> set[Path]:
    return {path for path in directory.rglob("*") if path.is_file()}


def test_a_saved_failure_survives_every_other_property_and_is_replayed_first(tmp_path: Path) -> None:
    adapter: Any = WrongOnInterleavedMha()
    directory = tmp_path / adapter.name  # one database per implementation, as conftest makes them
    database = DirectoryBasedExampleDatabase(directory)
    quick = profiles.settings_for("dev", max_examples=20, stateful_step_count=12, database=database,
                                  report_multiple_bugs=False, phases=[Phase.reuse, Phase.generate])  # no shrinking

    property_id, machine, parameters = FAILING
    found = run_machine(machine, adapter, property_id=property_id, parameters=parameters, settings=quick)
    assert isinstance(found.failure, NonConformance), found.failure
    saved = _files(directory)
    assert saved

    brief = settings(quick, max_examples=3)  # what deleted it before: the reuse phase, replaying saved examples
    for other_id, other_machine, other_parameters in OTHERS:
        result = run_machine(other_machine, adapter, property_id=other_id, parameters=other_parameters,
                             settings=brief)
        assert result.failure is None and result.runs >= 3, (other_id, result.failure)
    assert saved <= _files(directory), "another property deleted the saved failure"

    replay_only = settings(quick, phases=[Phase.reuse])  # nothing generated: a failure can only come from there
    again = run_machine(machine, adapter, property_id=property_id, parameters=parameters, settings=replay_only)
    assert isinstance(again.failure, NonConformance), "the saved failure was not replayed"
    assert again.first_failing == 1  # the first machine built failed


def test_the_key_prefix_tells_properties_parameters_implementations_and_left_out_rules_apart() -> None:
    base = database_prefix("impl", "p::t[a]", {"style": "interleaved"})
    assert base == database_prefix("impl", "p::t[a]", {"style": "interleaved"})  # stable: xdist, next run
    assert len({base, database_prefix("other", "p::t[a]", {"style": "interleaved"}),
                database_prefix("impl", "p::t[b]", {"style": "interleaved"}),
                database_prefix("impl", "p::t[a]", {"style": "half_split"}),
                database_prefix("impl", "p::t[a]", {"style": "interleaved"}, {"reset"})}) == 5


def test_the_property_database_wraps_any_database_and_only_its_keys() -> None:
    shared = InMemoryExampleDatabase()
    one, two = PropertyDatabase(shared, b"one:"), PropertyDatabase(shared, b"two:")
    one.save(b"key", b"value")
    assert list(one.fetch(b"key")) == [b"value"] and list(two.fetch(b"key")) == []
    two.delete(b"key", b"value")
    assert list(one.fetch(b"key")) == [b"value"]
    one.move(b"key", b"key.secondary", b"value")
    assert list(one.fetch(b"key.secondary")) == [b"value"] and list(one.fetch(b"key")) == []
    heard: list[Any] = []
    one.add_listener(heard.append)
    two.save(b"key", b"other")
    one.save(b"key", b"again")
    assert heard == [("save", (b"key", b"again"))]  # its own keys, without the prefix
    one.remove_listener(heard.append)
    assert property_settings(settings(database=None), implementation="i", property_id="p",
                             parameters={}).database is None
