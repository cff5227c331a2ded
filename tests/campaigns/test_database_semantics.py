"""Who may write to the shared example database and who may delete from it (docs/campaigns.md).

Ordinary runs read it and write locally; campaign workers save to it and
never delete; only prune deletes, and only what no longer fails. Keys name
everything that changes what an example means. Any Hypothesis database can
stand for the shared store here; tests/campaigns/test_campaigns.py runs the
same against a real Redis server.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase
from hypothesis.database import ExampleDatabase, InMemoryExampleDatabase

from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.databases import (
    SharedDatabaseError,
    SharedDatabaseWarning,
    SharedExamples,
    SharedScope,
    SuiteDatabase,
)
from kvcache_conformance.run.runner import RunResult, run_machine
from tests.campaigns.adapters import FixedOffOnInterleavedMha, OffOnInterleavedMha

pytestmark = pytest.mark.slow  # whole machine runs

FAILING = ("properties/test_layer_cache.py::test_layer_cache_conforms[interleaved-mha]", "layer_cache",
           {"style": "interleaved", "grouped": False})
PASSING = ("properties/test_session.py::test_decode_session_conforms", "session", {})


def _scope(adapter: Any, **changes: str) -> SharedScope:  # suite 1.0 under Hypothesis 6
    return SharedScope(**{"implementation": str(adapter.name), "implementation_version": str(adapter.version),
                          "suite_version": "1.0", "hypothesis_major": "6", **changes})


def _run(adapter: Any, database: ExampleDatabase, which: tuple[str, str, dict[str, Any]] = FAILING, *,
         phases: tuple[Phase, ...] = (Phase.reuse, Phase.generate), examples: int = 30) -> RunResult:
    property_id, machine, parameters = which
    chosen = profiles.settings_for("dev", max_examples=examples, stateful_step_count=12, database=database,
                                   report_multiple_bugs=False, phases=phases)
    return run_machine(machine, adapter, property_id=property_id, parameters=parameters, settings=chosen)


def _replay(adapter: Any, database: ExampleDatabase) -> RunResult:
    return _run(adapter, database, phases=(Phase.reuse,))


def _values(store: InMemoryExampleDatabase) -> set[bytes]:
    return {value for values in store.data.values() for value in values}


def test_an_ordinary_run_replays_the_shared_counterexample_and_writes_only_locally() -> None:
    adapter: Any = OffOnInterleavedMha()
    store = InMemoryExampleDatabase()
    worker = SuiteDatabase(InMemoryExampleDatabase(), SharedExamples.over(store, _scope(adapter), where="shared"),
                           "write")
    found = _run(adapter, worker)
    assert isinstance(found.failure, NonConformance)
    shared = set(store.data)
    assert shared, "the worker saved nothing to the shared database"

    local = InMemoryExampleDatabase()
    ordinary = SuiteDatabase(local, SharedExamples.over(store, _scope(adapter), where="shared"), "read")
    again = _replay(adapter, ordinary)
    assert isinstance(again.failure, NonConformance) and again.first_failing == 1  # the first run replayed it
    assert set(store.data) == shared  # nothing written there
    assert local.data, "the ordinary run kept its failure locally"

    fixed: Any = FixedOffOnInterleavedMha()  # what would delete it: a passing replay of the same example
    passing = _replay(fixed, SuiteDatabase(InMemoryExampleDatabase(),
                                           SharedExamples.over(store, _scope(fixed), where="shared"), "read"))
    # It replayed them, and they passed -- or ran out of recorded choices: a shrunk example can end inside the
    # failing step, which the fixed implementation gets past (Hypothesis then calls the run unsatisfiable).
    assert passing.runs >= 1 and (passing.failure is None or type(passing.failure).__name__ == "Unsatisfiable")
    assert set(store.data) == shared and all(store.data[key] for key in shared)


def test_a_worker_saves_and_never_deletes() -> None:
    adapter: Any = OffOnInterleavedMha()
    store = InMemoryExampleDatabase()
    view = SharedExamples.over(store, _scope(adapter), where="shared")
    _run(adapter, SuiteDatabase(InMemoryExampleDatabase(), view, "write"))
    saved = _values(store)
    assert saved and not any(key.endswith(b".pareto") for key in store.data)  # the pareto front stays local
    fixed: Any = FixedOffOnInterleavedMha()
    fixed_view = SharedExamples.over(store, _scope(fixed), where="shared")
    result = _run(fixed, SuiteDatabase(InMemoryExampleDatabase(), fixed_view, "write"))  # replays them all: passes
    assert result.failure is None
    assert saved <= _values(store), "a campaign worker deleted a shared counterexample"


def test_only_prune_deletes_and_only_what_no_longer_fails() -> None:
    adapter: Any = OffOnInterleavedMha()
    store = InMemoryExampleDatabase()
    _run(adapter, SuiteDatabase(InMemoryExampleDatabase(), SharedExamples.over(store, _scope(adapter), where="s"),
                                "write"))
    primary = {key for key in store.data if not key.endswith((b".secondary", b"versions"))}
    before = {key: set(store.data[key]) for key in primary}

    still = SuiteDatabase(None, SharedExamples.over(store, _scope(adapter, implementation_version="2"), where="s"),
                          "prune")
    kept = _replay(adapter, still)  # version 2 still has the bug: nothing it replays is deleted, it is carried forward
    assert isinstance(kept.failure, NonConformance)
    smallest = min((v for values in before.values() for v in values), key=lambda v: (len(v), v))
    assert smallest in _values(store)
    assert any(b":2:" in key for key in store.data), "not carried forward to the current version"

    fixed: Any = FixedOffOnInterleavedMha()
    pruner = SharedExamples.over(store, _scope(fixed), where="s")
    gone = _replay(fixed, SuiteDatabase(None, pruner, "prune"))  # the fixed version
    assert gone.failure is None and pruner.connection.deleted > 0
    assert not any(store.data.get(key) for key in primary), "prune kept an example that no longer fails"


def test_keys_name_everything_that_changes_an_example() -> None:
    scope = SharedScope("impl", "1.0", "0.1.0", "6")
    keys = {scope.prefix("1.0", b"p"), scope.prefix("1.1", b"p"), scope.prefix("1.0", b"q"),
            SharedScope("other", "1.0", "0.1.0", "6").prefix("1.0", b"p"),
            SharedScope("impl", "1.0", "0.2.0", "6").prefix("1.0", b"p"),
            SharedScope("impl", "1.0", "0.1.0", "7").prefix("1.0", b"p"),
            SharedScope("impl", "1.0", "0.1.0", "6", "mpmath").prefix("1.0", b"p")}
    assert len(keys) == 7
    assert not any(a != b and a.startswith(b) for a in keys for b in keys)  # no key reads another's examples
    view = SharedExamples.over(InMemoryExampleDatabase(), scope, where="s")
    parts = {view.for_property(b"kvcache-property:abc:", 30).property_part,
             view.for_property(b"kvcache-property:abc:", 80).property_part,  # another program length
             view.for_property(b"kvcache-property:abd:", 30).property_part}
    assert len(parts) == 3
    assert SharedScope("a:b/c", "1", "0.1.0", "6").lineage() != SharedScope("a", "b/c:1", "0.1.0", "6").lineage()


def test_reads_span_the_versions_of_one_implementation_and_nothing_else() -> None:
    store = InMemoryExampleDatabase()
    old = SharedExamples.over(store, SharedScope("impl", "1.0", "0.1.0", "6"), where="s")
    old.save(b"k", b"found-in-1.0")
    assert list(SharedExamples.over(store, SharedScope("impl", "1.1", "0.1.0", "6"), where="s").fetch(b"k")) == [
        b"found-in-1.0"]
    for other in (SharedScope("other", "1.0", "0.1.0", "6"), SharedScope("impl", "1.0", "0.2.0", "6"),
                  SharedScope("impl", "1.0", "0.1.0", "7")):
        assert list(SharedExamples.over(store, other, where="s").fetch(b"k")) == []


class _Unreachable(ExampleDatabase):
    """A store that went away."""

    def fetch(self, key: bytes) -> Any:
        raise ConnectionRefusedError("gone")

    def save(self, key: bytes, value: bytes) -> None:
        raise ConnectionRefusedError("gone")

    def delete(self, key: bytes, value: bytes) -> None:
        raise ConnectionRefusedError("gone")


def test_an_unreachable_store_warns_and_keeps_every_counterexample(tmp_path: Path) -> None:
    adapter: Any = OffOnInterleavedMha()
    local = InMemoryExampleDatabase()
    view = SharedExamples.over(_Unreachable(), _scope(adapter), where="redis://gone", unpublished=tmp_path / "kept")
    with pytest.warns(SharedDatabaseWarning, match="redis://gone is unreachable .* local database"):
        found = _run(adapter, SuiteDatabase(local, view, "write"))
    assert isinstance(found.failure, NonConformance)
    assert local.data and view.connection.kept_back > 0
    assert len((tmp_path / "kept").read_text().splitlines()) == view.connection.kept_back
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, not one per call
        again = _replay(adapter, SuiteDatabase(local, view, "write"))
    assert isinstance(again.failure, NonConformance) and again.first_failing == 1

    strict = SharedExamples.over(_Unreachable(), _scope(adapter), where="redis://gone", strict=True)
    with pytest.raises(SharedDatabaseError, match="redis://gone failed while fetching"):
        list(strict.fetch(b"k"))
