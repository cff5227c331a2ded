"""The caches of a model's layers, operated at once (docs/spec.md §13.9, issue 38 item 3): the layered-cache machine
meets the cases a library's loop over its layers gets wrong in a default run, on purpose; and the reference's
layered cache agrees with the oracle layer by layer, a layer never written included.

The run is derandomised (the default profile's settings, 100 examples): each case is met at least three times in
it, so that "met" is not a likelihood (tests/test_hard_cases.py says why).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis.stateful import run_state_machine_as_test

from impl.conformance import make_adapter, make_int8_adapter
from kvcache_conformance.machines.layered import UNSTORED, LayeredCacheMachine
from kvcache_conformance.oracle import AttentionWeights, RopeConfig, full_prefix_attention
from kvcache_conformance.protocol.declarations import declaration_problems
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import without_local_constants

CASES = ("layers of different lengths", "a layer first written after others",
         "truncation with a layer never written before one holding rows", "a truncation between two layers' lengths",
         "an invalid truncation of layers holding rows", "reset with a layer never written before one holding rows",
         "reorder with a layer never written before one holding rows",
         "select with a layer never written before one holding rows")


class Counted(LayeredCacheMachine):
    met: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__(make_adapter())

    def teardown(self) -> None:
        Counted.met.update(case for (_, case), times in self.exercise.items() for _ in range(times))
        super().teardown()


def test_a_default_run_meets_every_case_of_layered_caches_on_purpose() -> None:
    Counted.met.clear()
    with without_local_constants():
        run_state_machine_as_test(Counted, settings=profiles.settings_for("dev", database=None, max_examples=100,
                                                                         derandomize=True))
    missed = {case: Counted.met[case] for case in CASES if Counted.met[case] < 3}
    assert not missed, missed


class _Declaring:
    """An adapter declaring ``capabilities`` instead of its own."""

    def __init__(self, inner: Any, capabilities: frozenset[str]) -> None:
        self._inner, self.capabilities = inner, capabilities

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_layered_caches_under_a_declared_storage_are_skipped_with_the_reason() -> None:
    assert LayeredCacheMachine.needs().problem(make_adapter()) is None
    quantized = make_int8_adapter()
    assert "layered_cache" in str(LayeredCacheMachine.needs().problem(quantized))
    declaring = _Declaring(quantized, quantized.capabilities | {"layered_cache"})
    assert UNSTORED in str(LayeredCacheMachine.needs().problem(declaring))


def test_declaring_layered_caches_without_a_layer_convention_is_refused() -> None:
    reference = make_adapter()
    assert not declaration_problems(reference)
    without = reference.capabilities - {"rope_interleaved", "rope_half_split", "positionless", "keys_unrotated"}
    assert any("layered_cache" in problem for problem in declaration_problems(_Declaring(reference, without)))


@pytest.fixture
def layers() -> tuple[Any, list[Any], list[AttentionWeights], RopeConfig]:
    rng = np.random.default_rng(55)
    d, heads, kv_heads, dh = 6, 4, 2, 4
    rope = RopeConfig("half_split", 10000.0, dh, 64)
    adapter = make_adapter()
    weights = [AttentionWeights(rng.uniform(-1, 1, (d, heads * dh)), rng.uniform(-1, 1, (d, kv_heads * dh)),
                                rng.uniform(-1, 1, (d, kv_heads * dh)), rng.uniform(-1, 1, (heads * dh, d)),
                                heads=heads, kv_heads=kv_heads) for _ in range(3)]
    return adapter, [adapter.create_layer(w, rope) for w in weights], weights, rope


def _layers_match(adapter: Any, cache: Any, rows: list[np.ndarray | None], weights: list[AttentionWeights],
                  rope: RopeConfig, batch: int) -> None:
    shown = adapter.layered_snapshot(cache)
    assert len(shown) == len(rows)
    for layer, held, w in zip(shown, rows, weights):
        length = 0 if held is None else held.shape[1]
        assert layer.keys.shape == layer.values.shape == (batch, w.kv_heads, length, w.head_width)
        if held is not None and length:
            trace = full_prefix_attention(held, w, rope)
            np.testing.assert_allclose(layer.keys, trace.keys, atol=1e-12)
            np.testing.assert_allclose(layer.values, trace.values, atol=1e-12)


def test_the_reference_operates_every_layer_a_layer_never_written_included(
        layers: tuple[Any, list[Any], list[AttentionWeights], RopeConfig]) -> None:
    adapter, attention, weights, rope = layers
    rng = np.random.default_rng(2)
    cache = adapter.create_layered_cache(attention, 2, 8)
    rows: list[np.ndarray | None] = [None, None, None]
    for index, tokens in ((0, 3), (2, 1)):  # layer 1 never written
        x = rng.uniform(-1, 1, (2, tokens, weights[index].model_width))
        output = adapter.layered_append(cache, index, x)
        np.testing.assert_allclose(output, full_prefix_attention(x, weights[index], rope).outputs, atol=1e-12)
        rows[index] = x
    _layers_match(adapter, cache, rows, weights, rope, 2)
    adapter.truncate(cache, 2)  # between layer 2's length and layer 0's
    rows[0] = rows[0][:, :2]  # type: ignore[index]
    _layers_match(adapter, cache, rows, weights, rope, 2)
    adapter.reorder(cache, [1, 0])
    rows = [None if r is None else r[[1, 0]] for r in rows]
    _layers_match(adapter, cache, rows, weights, rope, 2)
    adapter.select(cache, [1])
    rows = [None if r is None else r[[1]] for r in rows]
    _layers_match(adapter, cache, rows, weights, rope, 1)
    x = rng.uniform(-1, 1, (1, 2, weights[1].model_width))  # the layer never written, at the new batch size
    adapter.layered_append(cache, 1, x)
    rows[1] = x
    _layers_match(adapter, cache, rows, weights, rope, 1)
    adapter.reset(cache)
    _layers_match(adapter, cache, [None, None, None], weights, rope, 1)


def test_a_rejected_layered_call_changes_nothing(layers: tuple[Any, list[Any], list[AttentionWeights],
                                                               RopeConfig]) -> None:
    adapter, attention, weights, _ = layers
    cache = adapter.create_layered_cache(attention, 2, 8)
    adapter.layered_append(cache, 2, np.full((2, 3, weights[2].model_width), 0.5))
    adapter.layered_append(cache, 0, np.full((2, 1, weights[0].model_width), 0.25))
    before = [(layer.keys.copy(), layer.values.copy()) for layer in adapter.layered_snapshot(cache)]
    for call, kind in ((lambda: adapter.truncate(cache, 4), "invalid_length"),
                       (lambda: adapter.truncate(cache, -1), "invalid_length"),
                       (lambda: adapter.truncate(cache, 2.0), "invalid_length"),
                       (lambda: adapter.reorder(cache, [0, 2]), "invalid_indices"),
                       (lambda: adapter.select(cache, []), "invalid_indices"),
                       (lambda: adapter.layered_append(cache, 3, np.zeros((2, 1, weights[0].model_width))),
                        "invalid_indices")):
        with pytest.raises(Exception) as raised:
            call()
        assert adapter.error_kind(raised.value) == kind
        after = adapter.layered_snapshot(cache)
        assert all(np.array_equal(k, layer.keys) and np.array_equal(v, layer.values)
                   for (k, v), layer in zip(before, after))
