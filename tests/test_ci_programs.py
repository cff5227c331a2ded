"""A ci program depends on the property and the suite's release, never on the text of the runner.

Hypothesis seeds a derandomised state-machine search, and keys its saved examples, by a digest of its factory's
source. ``run_machine`` handed it an inner function: any edit of that function moved every ci program of the suite
(a correct fix of a counter in it moved four checks of CI across their edge). It hands an object now
(``runner.MachineFactory``), seeded by the property's identity (``databases.property_seed``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis.database import InMemoryExampleDatabase

from impl.conformance import make_adapter
from kvcache_conformance.machines import MACHINES
from kvcache_conformance.run import databases, profiles, runner

# Whole machine runs: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow

# Every machine property of the suite (properties/test_*.py), by the machine and parameters it runs.
PROPERTIES: list[tuple[str, str, dict[str, Any]]] = [
    ("properties/test_layer_cache.py::test_layer_cache_conforms", "layer_cache", {}),
    ("properties/test_cache_operations.py::test_cache_operations_conform[full-attention]", "cache_operations",
     {"windowed": False}),
    ("properties/test_cache_operations.py::test_cache_operations_conform[sliding-window]", "cache_operations",
     {"windowed": True}),
    ("properties/test_session.py::test_decode_session_conforms", "session", {}),
    ("properties/test_prefix_store.py::test_prefix_store_conforms[full-attention]", "prefix_store",
     {"windowed": False}),
    ("properties/test_prefix_store.py::test_prefix_store_conforms[sliding-window]", "prefix_store",
     {"windowed": True}),
    ("properties/test_paged_cache.py::test_paged_cache_conforms", "paged", {}),
    ("properties/test_whole_model.py::test_whole_model_conforms", "model", {}),
    ("properties/test_batches.py::test_batches_conform", "batches", {}),
    ("properties/test_layered_cache.py::test_layered_cache_conforms", "layered_cache", {}),
]
EXAMPLES = 3  # a derandomised search's programs, as many as a test affords: the seed decides the first as the last

# Edits of the text only: the same machine, built the same way.
EDITS = [
    ("    def build() -> recording.TracedMachine:\n",
     "    def build() -> recording.TracedMachine:  # edited by tests/test_ci_programs.py\n"
     "        edited = 'a statement that does nothing'\n        del edited\n"),
    ("    def __call__(self) -> recording.TracedMachine:\n        return self.build()\n",
     "    def __call__(self) -> recording.TracedMachine:\n        machine = self.build()  # edited\n"
     "        return machine\n"),
]


@pytest.fixture(scope="module")
def edited_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The runner, its factories' text edited: a module of the same package, from a file (Hypothesis reads a
    function's source from its file)."""
    source = Path(runner.__file__).read_text()
    for old, new in EDITS:
        assert source.count(old) == 1, f"the runner's text moved: {old!r} (update EDITS)"
        source = source.replace(old, new)
    path = tmp_path_factory.mktemp("edited") / "runner_edited.py"
    path.write_text(source)
    name = f"{runner.__package__}.runner_edited"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[name]


def programs(run_machine: Any, monkeypatch: pytest.MonkeyPatch, property_id: str, machine: str,
             parameters: dict[str, Any], settings: Any) -> list[str]:
    """The program of every example a search ran (each machine's tape, as text), against the reference."""
    built: list[Any] = []

    class Recorded(MACHINES[machine]):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    with monkeypatch.context() as patch:
        patch.setitem(MACHINES, machine, Recorded)
        result = run_machine(machine, make_adapter(), property_id=property_id, parameters=parameters,
                             settings=settings)
    assert result.failure is None, result.failure
    assert len(built) >= EXAMPLES  # (and any example Hypothesis discarded)
    return [json.dumps([step.to_json() for step in each.tape.steps], sort_keys=True) for each in built]


def ci() -> Any:
    return profiles.settings_for("ci", max_examples=EXAMPLES, database=None, report_multiple_bugs=False)


@pytest.mark.parametrize(("property_id", "machine", "parameters"), PROPERTIES, ids=[p[0] for p in PROPERTIES])
def test_an_edit_of_the_runners_factory_moves_no_ci_program(edited_runner: ModuleType,
                                                              monkeypatch: pytest.MonkeyPatch, property_id: str,
                                                              machine: str, parameters: dict[str, Any]) -> None:
    before = programs(runner.run_machine, monkeypatch, property_id, machine, parameters, ci())
    after = programs(edited_runner.run_machine, monkeypatch, property_id, machine, parameters, ci())
    assert after == before


def test_the_seed_is_the_propertys_and_the_releases(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a test that cannot fail: the programs do move with the property's identity and the release."""
    layer_id, machine, parameters = PROPERTIES[0]
    drawn = programs(runner.run_machine, monkeypatch, layer_id, machine, parameters, ci())
    assert programs(runner.run_machine, monkeypatch, layer_id + "[other]", machine, parameters, ci()) != drawn
    monkeypatch.setattr(databases, "suite_release", lambda: "0.0.0-another")
    assert programs(runner.run_machine, monkeypatch, layer_id, machine, parameters, ci()) != drawn


class KeysFetched(InMemoryExampleDatabase):
    def __init__(self) -> None:
        super().__init__()
        self.keys: set[bytes] = set()

    def fetch(self, key: bytes) -> Iterator[bytes]:
        self.keys.add(key)
        return super().fetch(key)


def test_an_edit_of_the_runners_factory_keeps_every_saved_examples_key(edited_runner: ModuleType,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A random (dev) search keeps its examples under the same keys, whatever the runner's text."""
    layer_id, machine, parameters = PROPERTIES[0]
    fetched = []
    for run_machine in (runner.run_machine, edited_runner.run_machine):
        database = KeysFetched()
        dev = profiles.settings_for("dev", max_examples=EXAMPLES, database=database, report_multiple_bugs=False)
        programs(run_machine, monkeypatch, layer_id, machine, parameters, dev)
        assert database.keys
        fetched.append(database.keys)
    assert fetched[0] == fetched[1]
