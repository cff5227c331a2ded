"""The layered-cache machine: the caches of a model's layers, operated at once (docs/spec.md §13.9).

A layered cache holds one layer cache per layer of a model, all of one batch and capacity. A model writes its
layers one at a time, so the machine appends to one layer per rule: layers hold different numbers of rows, and a
layer may never have been written at all. Reset, truncate, reorder, select and repeat act on every layer at once
(each where its layer-level capability is declared). The model of each layer is its own ``CacheModel``: layer
``l`` is exactly the layer cache of §4 fed layer ``l``'s rows, and the oracle judges it so.

The cases a library's loop over its layers gets wrong are drawn on purpose: a layer never written before one
holding rows (a lazily initialised layer, which transformers' ``DynamicCache.crop`` half-applied over and then
raised at), then a truncation, reset, reorder or select; a truncation between two layers' lengths; an invalid
length on layers holding rows, which must change nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import Needs
from ..judge.calls import Inputs
from ..judge.calls import call as raw_call
from ..judge.checks import expect_success
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect, Observed
from ..oracle import FLOAT64, NumberSystem
from ..protocol.kinds import Capability, ErrorKind
from ..traces.recording import Draws, initialize, invariant, rule
from .base import ConformanceMachine
from .layer_model import CacheModel, LayerOracle
from .layer_steps import layer_needs

MAX_LAYERS = 4
# What each rule is drawn to meet: the plain case first (where shrinking goes), then the hard ones. Every hard case
# is met on a cache with a layer never written before a layer holding rows (``_with_a_layer_never_written``).
APPENDS = ("any layer", "a layer never written")
TRUNCATIONS = ("any n", "a layer never written", "between two layers' lengths", "an invalid n, on rows held")
WITH_NEVER_WRITTEN = ("the cache as it is", "a layer never written")
UNSTORED = "layered caches are judged without a declared storage only (docs/spec.md §13.9)"


class LayeredCacheMachine(ConformanceMachine):
    """Drive the caches of several layers -- appends to one layer at a time, and truncate, reset, reorder, select
    and repeat over all of them -- and check every layer against the oracle of its own rows."""

    @classmethod
    def needs(cls, **_: Any) -> Needs:
        needs = layer_needs(None, None, Capability.LAYERED_CACHE)
        return Needs(needs.capabilities, needs.alternatives, needs.layer_caches, needs.families, needs.why,
                     unstored=UNSTORED)

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__(adapter, numbers)
        self.families = tuple(g.layer_families(self.capabilities, self.limits))
        self.layers: list[Any] = []
        self.weights: list[Any] = []

    # -- set-up ---------------------------------------------------------------------------------------

    @initialize(data=st.data())
    def build_layers_and_cache(self, data: Draws) -> None:
        """1 to 4 layers of one family and geometry (GQA included), each with its own weights, and a layered
        cache of them holding nothing."""
        self.config = data.draw(g.layer_configs(self.capabilities, limits=self.limits, families=self.families,
                                                min_capacity=4), label="config")
        self.oracle = LayerOracle(self.config, None, self.judge, self.has(Capability.KEYS_UNROTATED))
        self._add_layers(data, data.draw(st.integers(1, MAX_LAYERS), label="layers"))
        self._new_cache(self.config.batch_size)

    def _add_layers(self, data: Draws, count: int) -> None:
        """Layers up to ``count``: the first with the drawn configuration's weights, the others their own."""
        w = self.config.weights
        while len(self.layers) < count:
            weights = w if not self.layers else data.draw(
                g.attention_weights(w.model_width, w.heads, w.kv_heads, w.head_width), label="weights")
            handed = Inputs()
            given = handed("weights", weights)
            self.layers.append(self.must(f"create layer {len(self.layers)}",
                                         lambda: self.adapter.create_layer(given, self.config.rope), handed))
            self.weights.append(weights)

    def _new_cache(self, batch_size: int) -> None:
        layers = list(self.layers)  # the handles themselves (a copy would be other layers)
        self.cache = self.must(f"create a layered cache of {len(layers)} layers",
                               lambda: self.adapter.create_layered_cache(layers, batch_size, self.config.capacity))
        self.models = [CacheModel(weights, batch_size) for weights in self.weights]
        self.written = [False] * len(self.layers)  # never cleared: a layer emptied is not a layer never written

    def _replace(self) -> None:
        self._new_cache(self.batch)

    @property
    def batch(self) -> int:
        return self.models[0].batch_size

    @property
    def largest(self) -> int:
        return min(2 * g.MAX_BATCH, self.limits.max_batch or 2 * g.MAX_BATCH)

    def _lengths(self) -> list[int]:
        return [len(model.rows) for model in self.models]

    def _never_written_before_rows(self) -> bool:
        """A layer never written before a layer holding rows: what a loop stopping (or raising) there misses."""
        return any(not self.written[first] and self.models[later].rows
                   for first in range(len(self.models)) for later in range(first + 1, len(self.models)))

    def _with_a_layer_never_written(self, data: Draws, *, rows: int = 1) -> None:
        """Unless the cache has one (and ``rows`` batch rows), a fresh cache of 2 layers or more and a batch of
        ``rows`` or more where the limits allow, every layer written but one before the last; the last written holds
        2 rows at least, so that some n lies between two layers' lengths."""
        if self._never_written_before_rows() and self.batch >= min(rows, self.largest):
            return
        self._add_layers(data, max(2, len(self.layers)))
        # recorded: a trace replayed where max_batch allows fewer rows is not applicable (its chunks hold this many)
        self._new_cache(data.choose([min(self.largest, max(rows, self.batch))], "batch of the layers"))
        skipped = data.draw(st.integers(0, len(self.layers) - 2), label="layer never written")
        for index in range(len(self.layers)):
            if index != skipped:
                self._append(data, index, least=2 if index == len(self.layers) - 1 else 1)

    # -- appends, one layer at a time -----------------------------------------------------------------

    @rule(data=st.data())
    def append_to_one_layer(self, data: Draws) -> None:
        """1 to 4 rows appended to one layer alone, attending causally over that layer's rows (§13.1): its
        outputs and rows the oracle's for that layer's own rows. On purpose (``APPENDS``) a layer never written."""
        case = data.optional(g.on_purpose(*APPENDS), "appends", APPENDS[0])
        roomy = [index for index, model in enumerate(self.models) if len(model.rows) < self.config.capacity]
        if not roomy:
            self._reset()
            roomy = list(range(len(self.models)))
        never = [index for index in roomy if not self.written[index]]
        index = data.draw(st.sampled_from(never if case == APPENDS[1] and never else roomy), label="layer")
        self._append(data, index)

    def _append(self, data: Draws, index: int, least: int = 1) -> None:
        model = self.models[index]
        room = min(g.MAX_CHUNK, self.config.capacity - len(model.rows))
        tokens = data.draw(st.integers(min(least, room), room), label="tokens")
        x = data.draw(g.chunks(self.batch, tokens, self.config.model_width), label="chunk")
        rows = [*model.rows, *(np.array(x[:, t, :]) for t in range(tokens))]
        trace = self.oracle.reference(model, rows)
        expected, tolerance = self.judge.bound(trace, lambda t: t.outputs[:, -tokens:, :])
        what = f"append {tokens} rows to layer {index} of layers holding {self._lengths()}"
        handed = Inputs()
        given = handed("x", x)
        judged = self.call(what, lambda: self.adapter.layered_append(self.cache, index, given), due=VALID,
                           inputs=handed, observe=lambda: self._observed(what), replace=self._replace)
        if not judged.to_judge:
            return
        output = judged.value
        if not isinstance(output, np.ndarray) or output.shape != x.shape:
            raise NonConformance(f"{what}: output of shape {getattr(output, 'shape', None)}, but the rows are "
                                 f"{x.shape}", kind="wrong output shape", check="output")
        self.judge.close(output, expected, tolerance, what=f"{what}: output at positions {len(model.rows)} .. "
                         f"{len(rows) - 1}", check="output", axes=("batch", "step row", "feature"))
        model.rows, model.trace = rows, trace
        if not self.written[index] and any(self.written):
            self.exercised("a layer first written after others")
        self.written[index] = True
        if len(set(self._lengths())) > 1:
            self.exercised("layers of different lengths")

    @rule(data=st.data(), requires=[Capability.VALIDATES_INDICES])
    def append_to_an_invalid_layer(self, data: Draws) -> None:
        """Rows for a layer that is not an int in [0, L) -- negative (never wrapped around), L or more, a float, a
        bool: INVALID_INDICES, no layer changed."""
        count = len(self.layers)
        index = data.draw(st.sampled_from([-1, -count, count, count + 1, 0.0, True]), label="invalid layer")
        x = data.draw(g.chunks(self.batch, 1, self.config.model_width), label="chunk")
        what = f"append a row to layer {index!r} of {count} layers holding {self._lengths()}"
        handed = Inputs()
        given = handed("x", x)
        self.call(what, lambda: self.adapter.layered_append(self.cache, index, given),
                  due=Due.check(ErrorKind.INVALID_INDICES), inputs=handed, observe=lambda: self._observed(what),
                  replace=self._replace)

    # -- operations over every layer ------------------------------------------------------------------

    @rule(data=st.data(), requires=[Capability.TRUNCATE])
    def truncate(self, data: Draws) -> None:
        """Every layer keeps its first min(n, n_l) rows, n an int in [0, the longest layer]; else INVALID_LENGTH
        where validates_length is claimed, nothing changed. On purpose (``TRUNCATIONS``) with a layer never
        written, n between two layers' lengths, an invalid n on layers holding rows."""
        case = data.optional(g.on_purpose(*TRUNCATIONS), "truncations", TRUNCATIONS[0])
        if case != TRUNCATIONS[0]:
            self._with_a_layer_never_written(data)
        lengths = self._lengths()
        longest = max(lengths)
        value: object
        if case == TRUNCATIONS[0]:
            value = data.draw(g.truncation_lengths(longest), label="n").value
        elif case == TRUNCATIONS[1]:
            value = data.draw(st.integers(0, longest), label="n")
        elif case == TRUNCATIONS[2]:
            value = data.draw(st.integers(min(lengths) + 1, max(min(lengths) + 1, longest - 1)), label="n")
        else:
            value = data.draw(st.sampled_from([-1, longest + 1, float(longest - 1), True]), label="invalid n")
        problem = g.length_problem(value, longest)
        what = f"truncate layers holding {lengths} to {value!r}"
        judged = self.call(what, lambda: self.adapter.truncate(self.cache, value), due=Due.check(problem),
                           observe=lambda: self._observed(what), replace=self._replace)
        if problem is not None:
            if longest and not judged.replaced:
                self.exercised("an invalid truncation of layers holding rows")
            return
        if not judged.to_judge:
            return
        n = int(value)  # type: ignore[call-overload]
        if any(length > n for length in lengths) and any(length < n for length in lengths):
            self.exercised("a truncation between two layers' lengths")
        self._exercised_with_never_written("truncation")
        for model in self.models:
            model.cut(min(n, len(model.rows)))

    @rule(data=st.data())
    def reset(self, data: Draws) -> None:
        """Every layer emptied, a layer never written included; the batch size and the bindings kept. On purpose
        with a layer never written."""
        if data.optional(g.on_purpose(*WITH_NEVER_WRITTEN), "reset", WITH_NEVER_WRITTEN[0]) != \
                WITH_NEVER_WRITTEN[0]:
            self._with_a_layer_never_written(data)
        self._exercised_with_never_written("reset")
        self._reset()

    def _reset(self) -> None:
        self.call(f"reset layers holding {self._lengths()}", lambda: self.adapter.reset(self.cache),
                  observe=lambda: self._observed("reset"), replace=self._replace)
        for model in self.models:
            model.emptied()

    @rule(data=st.data(), requires=[Capability.BATCH_REORDER])
    def reorder(self, data: Draws) -> None:
        """Batch row b of every layer becomes its old row indices[b] (§13.3), a layer never written included (it
        stays empty); invalid indices are INVALID_INDICES where validates_indices is claimed. On purpose a reversal
        of two rows or more with a layer never written before one holding rows."""
        if data.optional(g.on_purpose(*WITH_NEVER_WRITTEN), "reorders", WITH_NEVER_WRITTEN[0]) != \
                WITH_NEVER_WRITTEN[0]:
            self._with_a_layer_never_written(data, rows=2)
            value: object = data.draw(st.just(list(range(self.batch))[::-1]), label="indices")
        else:
            value = data.draw(g.batch_indices(self.batch), label="indices").value
        self._batch_operation("reorder", value, g.indices_problem(value, self.batch),
                              lambda given: self.adapter.reorder(self.cache, given),
                              lambda: np.asarray(value, dtype=np.int64))

    @rule(data=st.data(), requires=[Capability.BATCH_SELECT])
    def select(self, data: Draws) -> None:
        """Every layer keeps the batch rows ``indices`` (§13.7): the batch shrinks in every layer, a layer never
        written included (its first write later is of the new size). On purpose, with a layer never written, the
        rows after the first."""
        if data.optional(g.on_purpose(*WITH_NEVER_WRITTEN), "selections", WITH_NEVER_WRITTEN[0]) != \
                WITH_NEVER_WRITTEN[0]:
            self._with_a_layer_never_written(data, rows=2)
            value: object = data.draw(st.just(list(range(min(1, self.batch - 1), self.batch))), label="rows")
        else:
            value = data.draw(g.batch_selections(self.batch), label="rows").value
        self._batch_operation("select", value, g.selection_problem(value, self.batch),
                              lambda given: self.adapter.select(self.cache, given),
                              lambda: np.asarray(value, dtype=np.int64))

    @rule(data=st.data(), requires=[Capability.BATCH_REPEAT], when=lambda self: self.batch <= self.largest // 2)
    def repeat_interleave(self, data: Draws) -> None:
        """Every layer's batch rows each r times in a row (§13.7), a layer never written included."""
        value = data.draw(g.repeat_counts(self.batch, self.largest), label="repeats").value
        self._batch_operation("repeat", value, g.repeats_problem(value),
                              lambda given: self.adapter.repeat_interleave(self.cache, given),
                              lambda: np.repeat(np.arange(self.batch), int(value)))  # type: ignore[call-overload]

    def _batch_operation(self, name: str, value: object, problem: ErrorKind | None, action: Callable[[Any], Any],
                         gather: Callable[[], np.ndarray]) -> None:
        what = f"{name} the batch of layers holding {self._lengths()} by {np.asarray(value).tolist()!r}"
        handed = Inputs()
        given = handed("indices", value)
        judged = self.call(what, lambda: action(given), due=Due.check(problem), inputs=handed,
                           observe=lambda: self._observed(what), replace=self._replace)
        if not judged.to_judge or problem is not None:
            return
        rows = gather()
        if self.batch >= 2 and not np.array_equal(rows, np.arange(self.batch)):
            self._exercised_with_never_written(name)
        for model in self.models:
            model.gather(rows)

    def _exercised_with_never_written(self, name: str) -> None:
        if self._never_written_before_rows():
            self.exercised(f"{name} with a layer never written before one holding rows")

    @rule(data=st.data())
    def new_cache(self, data: Draws) -> None:
        """A fresh layered cache of the same layers, of a batch of 1 to 3 rows (within max_batch)."""
        self._new_cache(data.draw(st.integers(1, min(g.MAX_BATCH, self.largest)), label="batch"))

    # -- what a layered cache shows -------------------------------------------------------------------

    def _snapshot(self, what: str) -> list[tuple[np.ndarray, np.ndarray]]:
        shown = expect_success(raw_call(self.adapter, f"{what}: layered snapshot",
                                        lambda: self.adapter.layered_snapshot(self.cache)), f"{what}: layered snapshot")
        try:
            return [(np.array(layer.keys), np.array(layer.values)) for layer in shown]
        except (AttributeError, TypeError) as error:
            raise NonConformance(f"{what}: a layered snapshot is one object with keys and values per layer: {error}",
                                 kind="malformed snapshot") from error

    def _observed(self, what: str) -> Observed:
        seen: dict[str, Any] = {}
        layers = self._snapshot(what)
        seen["layers"] = len(layers)
        for index, (keys, values) in enumerate(layers):
            seen[f"layer {index} keys"], seen[f"layer {index} values"] = keys, values
        return seen

    @invariant()
    def layers_match_oracle(self) -> None:
        """Every layer shows exactly its own rows' keys (§3) and values, of the cache's batch size: a layer never
        written (or emptied) shows none, [B, KV, 0, dh]."""
        what = "after the last step"
        self.tape.expect(what, expect=Expect.STATE.value, lengths=self._lengths(), batch=self.batch)
        shown = self._snapshot(what)
        if len(shown) != len(self.models):
            raise NonConformance(f"{what}: {len(shown)} layers shown, but the cache has {len(self.models)}",
                                 kind="wrong layer count", check="layer count")
        kv, dh = self.config.weights.kv_heads, self.config.weights.head_width
        for index, ((keys, values), model) in enumerate(zip(shown, self.models)):
            held, held_keys = self.oracle.held(model), self.oracle.held_keys(model)
            for name, actual, reference in (("keys", keys, held_keys), ("values", values, held)):
                shape = (self.batch, kv, len(model.rows), dh)
                if actual.shape != shape:
                    raise NonConformance(f"{what}: layer {index} shows {name} of shape {actual.shape}, but it holds "
                                         f"{len(model.rows)} rows of a batch of {self.batch}: {shape}",
                                         kind="wrong layer length", check=f"cached {name}")
                if reference is None:
                    continue
                expected, tolerance = self.judge.bound(reference, lambda t: getattr(t, name))
                self.judge.close(actual, expected, tolerance, what=f"{what}: layer {index}'s cached {name}",
                                 check=f"cached {name}", axes=("batch", "head", "position", "feature"))
