"""Crash isolation (protocol/isolation.py): an engine that aborts, segfaults, exits or hangs in a child process
fails one call with a typed error, the proxy starts a new child on the next call, and a machine run reports the
death as a failure of kind "crash" with the shrunk trace up to the fatal step."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from impl.conformance import ReferenceAdapter
from kvcache_conformance.judge import calls
from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.oracle import AttentionWeights, RopeConfig
from kvcache_conformance.protocol.isolation import EngineDied, EngineHung, Isolated, Remote, StaleHandle, isolated
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine
from kvcache_conformance.traces import codec as trace
from kvcache_conformance.traces import replay
from tests import misbehaving

QUICK = profiles.settings_for("ci", max_examples=30, database=None, report_multiple_bugs=False)
LAYER = {"style": "interleaved", "grouped": False}


def weights(seed: int = 0, d: int = 8, heads: int = 2) -> AttentionWeights:
    rng = np.random.default_rng(seed)
    return AttentionWeights(*(rng.standard_normal((d, d)) / np.sqrt(d) for _ in range(4)), heads=heads,
                            kv_heads=heads)


ROPE = RopeConfig(style="interleaved", base=10000.0, rotary_width=4, max_positions=64)


@pytest.fixture
def engine() -> Isolated:
    proxy = isolated(misbehaving.Aborts)
    yield proxy
    proxy.stop()


def test_calls_are_forwarded_and_answers_match_the_engine_in_process(engine: Isolated) -> None:
    local = ReferenceAdapter()
    assert (engine.name, engine.version, engine.capabilities) == (misbehaving.Aborts.name, local.version,
                                                                 local.capabilities)
    layer, x = engine.create_layer(weights(), ROPE), np.random.default_rng(1).standard_normal((1, 1, 8))
    cache = engine.create_cache(layer, 1, 4)
    assert isinstance(layer, Remote) and isinstance(cache, Remote)
    local_layer = local.create_layer(weights(), ROPE)
    expected = local.step(local_layer, local.create_cache(local_layer, 1, 4), x)
    np.testing.assert_array_equal(engine.step(layer, cache, x), expected)  # bit for bit: the same code
    assert engine.snapshot(cache).length == 1  # a snapshot comes back by value or as a handle; either reads
    assert cache.length == 1  # a handle's attributes are read in the child


def test_an_engine_error_keeps_its_kind(engine: Isolated) -> None:
    layer = engine.create_layer(weights(), ROPE)
    cache = engine.create_cache(layer, 1, 4)
    with pytest.raises(Exception) as raised:
        engine.step(layer, cache, np.ones((2, 1, 8)))  # the wrong batch size
    assert engine.error_kind(raised.value) == "batch_mismatch"  # as the child's adapter mapped it
    assert "InputBatchMismatch" in str(raised.value)  # rebuilt, or named when it cannot be
    assert engine.error_kind(ValueError("raised here, not in the engine")) is None
    assert engine.alive  # an exception is an answer, not a death


def test_an_abort_is_a_typed_death_with_its_stderr_and_the_proxy_starts_again(engine: Isolated) -> None:
    layer = engine.create_layer(weights(), ROPE)
    cache = engine.create_cache(layer, 1, 4)
    x = np.ones((1, 1, 8))
    engine.step(layer, cache, x)
    with pytest.raises(EngineDied) as died:
        engine.step(layer, cache, x)  # holds a row: aborts
    assert (died.value.signal_name, died.value.cause, died.value.call) == ("SIGABRT", "SIGABRT", "step")
    assert died.value.exitcode is not None and died.value.exitcode < 0
    assert "GGML_ASSERT(n_rows < capacity) failed" in died.value.stderr_tail
    assert not engine.alive
    with pytest.raises(StaleHandle):
        engine.step(layer, cache, x)  # starts a new child, where the old cache never existed
    assert engine.alive and engine.restarts == 1
    fresh = engine.create_layer(weights(), ROPE)
    assert engine.step(fresh, engine.create_cache(fresh, 1, 4), x).shape == (1, 1, 8)


def test_a_segfault_and_an_exit_are_told_apart() -> None:
    x = np.ones((1, 1, 8))
    for factory, cause in ((misbehaving.Segfaults, "SIGSEGV"), (misbehaving.ExitsOnTheThirdStep, "exit code 3")):
        proxy = isolated(factory)
        try:
            layer = proxy.create_layer(weights(), ROPE)
            cache = proxy.create_cache(layer, 1, 8)
            proxy.step(layer, cache, x)
            proxy.step(layer, cache, x) if factory is misbehaving.ExitsOnTheThirdStep else None
            with pytest.raises(EngineDied) as died:
                proxy.step(layer, cache, x)
            assert died.value.cause == cause
        finally:
            proxy.stop()


def test_a_call_that_hangs_is_killed_at_the_proxys_limit_and_the_next_call_works() -> None:
    proxy = isolated(misbehaving.Hangs, timeout=1.0)
    try:
        layer = proxy.create_layer(weights(), ROPE)
        cache = proxy.create_cache(layer, 1, 4)
        proxy.step(layer, cache, np.ones((1, 1, 8)))
        start = time.perf_counter()
        with pytest.raises(EngineHung) as hung:
            proxy.step(layer, cache, np.ones((1, 1, 8)))
        assert time.perf_counter() - start < 10 and hung.value.seconds == 1.0
        assert not proxy.alive
        assert isinstance(proxy.create_layer(weights(), ROPE), Remote)
    finally:
        proxy.stop()


def test_the_suites_own_time_limit_kills_the_child_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls, "CALL_TIMEOUT", 0.5)
    proxy = isolated(misbehaving.Hangs)  # no limit of its own
    try:
        layer = proxy.create_layer(weights(), ROPE)
        cache = proxy.create_cache(layer, 1, 4)
        proxy.step(layer, cache, np.ones((1, 1, 8)))
        with pytest.raises(calls.AdapterHung):
            calls.run("step", lambda: proxy.step(layer, cache, np.ones((1, 1, 8))))
        assert not proxy.alive  # else its late answer would be read as the next call's
        assert isinstance(proxy.create_layer(weights(), ROPE), Remote)
    finally:
        proxy.stop()


def test_the_call_harness_turns_a_death_into_a_crash_failure(engine: Isolated) -> None:
    layer = engine.create_layer(weights(), ROPE)
    cache = engine.create_cache(layer, 1, 4)
    engine.step(layer, cache, np.ones((1, 1, 8)))
    with pytest.raises(NonConformance) as failure:
        calls.run("append a row", lambda: engine.step(layer, cache, np.ones((1, 1, 8))))
    assert (failure.value.kind, failure.value.check) == ("crash", "SIGABRT")
    assert str(failure.value).startswith("append a row: step: the engine's process died (killed by SIGABRT)")


def test_bad_factories_and_limits_are_usage_errors() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        isolated(misbehaving.Aborts, timeout=0)
    with pytest.raises(RuntimeError, match=r"(?s)adapter factory failed in the child:.*AttributeError"):
        isolated("tests.misbehaving:no_such_factory")
    with pytest.raises(ValueError, match="'module:function'"):
        isolated("tests.misbehaving")


@pytest.mark.slow
@pytest.mark.parametrize(("factory", "cause"), [(misbehaving.Aborts, "SIGABRT"), (misbehaving.Segfaults, "SIGSEGV")])
def test_a_machine_run_survives_a_crash_and_shrinks_it_to_the_fatal_step(factory: type, cause: str,
                                                                         tmp_path: Path) -> None:
    adapter = isolated(factory)
    try:
        result = run_machine("layer_cache", adapter, property_id=factory.name, settings=QUICK, trace_dir=tmp_path,
                             parameters=LAYER, shrink_seconds=20)
        assert isinstance(result.failure, NonConformance), result.failure
        assert (result.failure.kind, result.failure.check) == ("crash", cause)
        assert str(result.failure).startswith("append ")  # the fatal step, by what it did
        assert result.steps <= 3, f"shrunk to {result.steps} steps"
        document = trace.load(result.trace)
        assert document["failure"]["kind"] == "crash"
        replayed = replay.replay(document, adapter, out=lambda line: None)
        assert (replayed.status, replayed.step) == ("diverges", result.failing_step)
        assert adapter.restarts >= 2  # one child per crash: the run went on after each
    finally:
        adapter.stop()
