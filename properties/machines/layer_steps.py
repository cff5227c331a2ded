"""The rules of a layer cache's one-row step (docs/spec.md §4-6), shared by the layer and cache-operations machines.

A differential rule set: on one side the implementation, driven only through
its adapter; on the other the model of every live cache (``layer_model``)
and the oracle's full-prefix recomputation of it. Each rule says what the
specification expects of its call -- success, or the first failing check in
the documented order -- and the call policy judges it; after every rule the
invariant compares the cache's contents with the oracle.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import LAYER_CONVENTION, Alternatives, Needs
from ..judge.calls import Inputs
from ..judge.checks import read_snapshot, window_positions
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect, Held, Judged, Observed, unchanged
from ..oracle import FLOAT64, AttentionWeights, NumberSystem, RopeConfig
from ..protocol.kinds import Capability, ErrorKind
from ..protocol.layer import CacheSnapshot
from ..traces.recording import Draws, NotApplicable, RuleSpec, initialize, invariant, rule
from .base import ConformanceMachine, rows_by_position
from .layer_model import CacheModel, LayerOracle

MAX_WINDOW = 3
WINDOWED_MIN_CAPACITY = 5
# The states a rejected call is drawn to meet (``LayerSteps.meet``), the first the one shrinking goes to.
MEETS = ("the cache as it is", "an empty cache", "a cache holding rows")
# Which score overflows: any, or on purpose a -inf beside rows held -- softmax weighs it 0 beside finite scores and
# the output stays finite, so only a check of the scores shows it (a lone -inf, or a +inf, makes the output NaN).
SCORE_MEETS = ("any overflowing score", "a -inf score beside rows held")
# Which malformed row a step is handed: any (one or several problems), or on purpose one that a converting or
# broadcasting cache takes -- a valid row as nested lists, one row into a batch of 2 or more (where the batch is 1,
# two or three valid rows, which a write of the first rows takes). Among every malformed row, each is about one in a
# hundred.
MALFORMED = ("any malformed row", "a valid row as nested lists", "one row into a larger batch")
# Which RoPE a layer is handed against a cache: any change, or on purpose its base one ulp away, on a cache that is not
# stale -- a base compared within a tolerance, not bit for bit, shows only there (two changes of five or more).
ROPE_CHANGES = ("any RoPE change", "the base one ulp away, on a cache that is not stale")
BASE_ONE_ULP_AWAY = ("base one ulp up", "base one ulp down")

# A windowed run leaves out the rules about other layers and extreme rows, which the full runs cover: its steps
# go to filling, evicting and truncating the window.
NOT_IN_WINDOWED_RUNS = frozenset({
    "append_peaked_row", "append_overflowing_row", "append_row_overflowing_one_projection",
    "append_row_overflowing_a_score", "append_first_row_overflowing_the_output", "append_through_recreated_layer",
    "append_under_other_rope", "append_into_cache_of_other_geometry", "update_weights_in_place"})


@dataclass
class Parked:
    """A live cache not being operated on, its model, and what its snapshot showed when it was parked."""

    cache: Any
    model: CacheModel
    seen: CacheSnapshot


def observed(snapshot: CacheSnapshot) -> Observed:
    """Everything a snapshot shows, by name (what a call that raised must leave as it was)."""
    seen: dict[str, Any] = {"length": int(snapshot.length), "keys": snapshot.keys, "values": snapshot.values}
    for name in ("positions", "physical_keys", "physical_values", "buffer_identity"):
        if getattr(snapshot, name) is not None:
            seen[name.replace("_", " ")] = getattr(snapshot, name)
    return seen


def held_rows(seen: Observed) -> Observed:
    """The rows an ``observed`` snapshot shows, by position (without a window: 0 .. length - 1)."""
    positions = seen.get("positions", np.arange(seen["keys"].shape[2]))
    return rows_by_position(seen["keys"], seen["values"], positions, axis=2)


def shown(snapshot: CacheSnapshot) -> Observed:
    """What a snapshot shows of the rows held, wherever the bytes live (copy-on-write is allowed)."""
    return {name: value for name, value in observed(snapshot).items() if not name.startswith(("physical", "buffer"))}


def layer_needs(style: str | None, grouped: bool | None, *also: Any,
                alternatives: tuple[tuple[str, Alternatives], ...] = ()) -> Needs:
    """What a layer machine drawing ``style`` (None: any) and ``grouped`` layers needs: that convention, GQA if
    asked for, and layer limits that leave one such layer."""
    convention = [] if style is None else ["positionless" if style == "none" else f"rope_{style}"]
    return Needs.of(*convention, *([Capability.GQA] if grouped else []), *also,
                    alternatives=(("layer convention", LAYER_CONVENTION), *alternatives), families=((style, grouped),))


class LayerSteps(ConformanceMachine):
    """Drive one layer and its cache at random, one row at a time; check every step against the oracle."""

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64, style: str | None = None,
                 grouped: bool | None = None, windowed: bool = False, left_out_families: Sequence[str] = (),
                 family_rules: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(adapter, numbers)
        # Which configurations this run draws: one family, or (neither fixed) every family the adapter can
        # build, alike, but those a known-failures entry leaves out; and rules left out in one family only.
        self.draws: dict[str, Any] = {"style": style, "grouped": grouped}
        if style is None and grouped is None:
            self.draws["families"] = tuple(f for f in g.layer_families(self.capabilities, self.limits)
                                           if g.family_name(*f) not in left_out_families)
        self.family_rules: dict[str, set[str]] = {}  # (family, rule): known failures narrowed to one family
        for family, rule_name in family_rules:
            self.family_rules.setdefault(family, set()).add(rule_name)
        self.windowed, self.window = windowed, None  # a sliding-window cache (the cache-operations machine)
        self.sinks = 0  # its attention sinks: the first positions every later query sees (attention_sinks)
        self.physical = self.has(Capability.PHYSICAL_STORAGE)
        self.parked: list[Parked] = []  # other live caches (forks), not operated on
        self._facts: tuple[AttentionWeights | None, dict[str, list[Any]]] = (None, {})

    def may_run(self, spec: RuleSpec) -> bool:
        return super().may_run(spec) and not (self.windowed and spec.name in NOT_IN_WINDOWED_RUNS) and not (
            self.family_rules and spec.name in self.family_rules.get(self.family, ()))

    @property
    def family(self) -> str:
        """The family of the layer drawn: its position convention and attention kind, "interleaved-mha"."""
        config = self.config
        return g.family_name("none" if config.rope is None else config.rope.style,
                             config.weights.kv_heads < config.weights.heads)

    # -- set-up -----------------------------------------------------------------------------------------

    @initialize(data=st.data())
    def build_layer_and_cache(self, data: Draws) -> None:
        """A layer of a family the adapter can build, within its layer limits, and a cache for it."""
        self.config = data.draw(g.layer_configs(self.capabilities, **self.draws, limits=self.limits,
                                                min_capacity=WINDOWED_MIN_CAPACITY if self.windowed else 1),
                                label="config")
        self.config = self.hard_config(data, self.config)
        if self.windowed:  # two or more below the capacity where it can be: rows are evicted, then more
            self.need(Capability.SLIDING_WINDOW_LAYER, "a sliding-window cache")  # replaying: stops here if absent
            smallest = self.limits.min_window or 1
            self.window = data.draw(st.integers(smallest, max(smallest, min(max(MAX_WINDOW, smallest),
                                                                            self.config.capacity - 2))),
                                    label="window")
            outside = self.limits.cache_problem(self.config.batch_size, self.config.capacity, window=self.window)
            if outside:  # (only a replayed window can be: the draw stays within the limits)
                raise NotApplicable(f"the recorded window is outside this implementation's layer_limits: {outside}")
            if self.has(Capability.ATTENTION_SINKS):  # half the windows keep 1 or 2 sinks (traces before: none)
                self.sinks = data.optional(st.sampled_from([0, 0, 1, 2]), "sinks", 0)
            if self.sinks:
                self.need(Capability.ATTENTION_SINKS, "a window cache with attention sinks")
        self.oracle = LayerOracle(self.config, self.window, self.judge, self.has(Capability.KEYS_UNROTATED),
                                  self.sinks)
        self.weights = self.config.weights  # the layer's weights now (a cache's rows keep theirs: its model's)
        self.layer = self._create_layer(self.weights, self.config.rope, "create the layer")
        self._new_cache()

    def hard_config(self, data: Draws, config: g.LayerConfig) -> g.LayerConfig:
        """The layer and cache drawn, or one a machine's rules need on purpose (a hard case); the layer machine's
        rules need none."""
        return config

    def shapes_for(self, config: g.LayerConfig, *, grouped: bool, keep: Any) -> list[Any]:
        """The geometries (``g.geometries``' heads, KV heads, head width, model widths) a hard case may put in place of
        ``config``'s layer: those ``keep`` takes that its RoPE fits, of the same head width where one is."""
        rope = config.rope
        drawn = g.geometries(self.capabilities, self.limits, grouped=grouped, rope=rope is not None)
        shapes = [shape for shape in drawn if keep(shape) and (rope is None or rope.rotary_width <= shape[2])]
        return [shape for shape in shapes if shape[2] == config.weights.head_width] or shapes

    def with_geometry(self, data: Draws, config: g.LayerConfig, shapes: list[Any], label: str, *,
                      batch_of_kv_heads: bool = False) -> g.LayerConfig:
        """``config`` with a layer of one of ``shapes`` (drawn as ``label``), its RoPE still rotating every feature
        where it did, and with ``batch_of_kv_heads`` a batch as large as its KV heads; ``config`` as it is where
        such a cache is outside the limits."""
        rope = config.rope
        heads, kv_heads, head_width, widths = data.draw(st.sampled_from(shapes), label=label)
        rope = rope_of_geometry(rope, config.weights.head_width, head_width)
        batch_size = kv_heads if batch_of_kv_heads else config.batch_size
        if self.limits.cache_problem(batch_size, config.capacity, None if rope is None else rope.rotary_width):
            return config
        width = data.draw(st.sampled_from(widths), label="model_width")
        outside = self.limits.geometry_problem(width, heads, head_width)
        if outside:  # (only a replayed geometry can be: the draw stays within the limits)
            raise NotApplicable(f"the recorded {label} is outside this implementation's layer_limits: {outside}")
        return replace(config, weights=data.draw(g.attention_weights(width, heads, kv_heads, head_width)), rope=rope,
                       batch_size=batch_size)

    def _create_layer(self, weights: AttentionWeights, rope: RopeConfig | None, what: str) -> Any:
        handed = Inputs()
        given = handed("weights", weights)
        return self.must(what, lambda: self.adapter.create_layer(given, rope), handed)

    def _new_cache(self) -> None:
        """A fresh cache for the layer as it is now."""
        config, window = self.config, self.window
        if window is None:
            self.cache = self.must("create a cache", lambda: self.adapter.create_cache(
                self.layer, config.batch_size, config.capacity))
        else:
            sinks = {"sinks": self.sinks} if self.sinks else {}
            self.cache = self.must(f"create a cache with a window of {window}" + (
                f" and {self.sinks} sinks" if self.sinks else ""), lambda: self.adapter.create_cache(
                self.layer, config.batch_size, config.capacity, window=window, **sinks))
        self.model = CacheModel(self.weights, config.batch_size)

    def _snapshot(self, cache: Any, what: str) -> CacheSnapshot:
        return read_snapshot(self.adapter, cache, what, physical=self.physical, positions=self.window is not None)

    @property
    def full(self) -> bool:
        return len(self.model.rows) >= self.config.capacity

    def _due(self, **situation: Any) -> Due:
        return Due.check(self.oracle.first_failing_check(self.model, self.config.capacity, **situation))

    # -- one call, judged ---------------------------------------------------------------------------------

    def _step(self, x: Any, due: Due, what: str, layer: Any = None, cache: Any = None, *, chunk: bool = False,
              **details: Any) -> Judged:
        """One step (``chunk``: the chunked ``append``) of ``layer`` into ``cache``, judged by the call policy. A
        call accepted without the claim of its first failing check leaves the machine's cache unspecified: it is
        replaced."""
        layer = self.layer if layer is None else layer
        cache = self.cache if cache is None else cache
        handed = Inputs()
        given = handed("x", x)
        method = self.adapter.append if chunk else self.adapter.step
        return self.call(what, lambda: method(layer, cache, given), due=due, inputs=handed,
                         observe=lambda: observed(self._snapshot(cache, what)),
                         replace=self._new_cache if cache is self.cache else lambda: None,
                         held=self._held, **details)

    @property
    def _held(self) -> Held | None:
        """What an accepted append must keep (docs/spec.md §5.5): every row held, but those a window lets go; none
        under a declared storage, which may re-round rows held (a recomputed scale at every append, residual rows
        held exact until their group fills, as HQQ's QuantizedCache does)."""
        if self.judge.storage is not None:
            return None
        return Held(held_rows, evicts=self.window is not None)

    def _append_and_check(self, x: np.ndarray, what: str, *, chunk: bool = False) -> None:
        """A step (or chunk) that must succeed: its output must equal full-prefix recomputation."""
        model = self.model
        x = self.oracle.within_frozen_scale(model, x)
        rows = [*model.rows, *(np.array(x[:, t, :]) for t in range(x.shape[1]))]
        if model.calibration is None:  # a frozen scale is calibrated here, and kept until reset
            model.calibration = rows
        trace = self.oracle.reference(model, rows)
        expected, tolerance = self.judge.bound(trace, lambda t: t.outputs[:, -x.shape[1]:, :])
        output = self._step(x, VALID, what, chunk=chunk, output=expected, tolerance=tolerance).value
        self.judge.close(output, expected, tolerance, what=f"{what}: output at position {len(model.rows)}"
                         + (f" and the {x.shape[1] - 1} after it" if x.shape[1] > 1 else ""), check="output",
                         axes=("batch", "step row", "feature"))
        model.rows, model.trace = rows, trace
        if self.window is not None and len(rows) > self.window:
            self.exercised("window eviction")

    # -- valid rows ----------------------------------------------------------------------------------------

    @rule(data=st.data(), when=lambda self: not self.model.peaked)
    def append_rows(self, data: Draws) -> None:
        """Valid rows in any memory layout, one step each: accepted and exact; or FULL, or
        REVISION_MISMATCH if stale (judged where claimed). Into the cache as it is, or into one filled first."""
        if data.optional(g.on_purpose("the cache as it is", "a full cache"), "meets",
                         "the cache as it is") == "a full cache":
            self.fill(data)
        for _ in range(data.draw(st.integers(1, 3), label="count")):
            x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
            x = g.with_layout(x, *data.draw(g.layouts(), label="layout"))
            due = self._due()
            layout = "" if g.layout_of(x) == ("C", True) else f" ({', '.join(map(str, g.layout_of(x)))})"
            if due.kind is None:
                self._append_and_check(x, f"append a row{layout}")
            else:
                self._step(x, due, f"append a row{layout} to a {'stale' if self.model.stale else 'full'} cache")

    # float64 only: a peaked row's inputs reach 60, and the low-precision budget is not calibrated there --
    # the thorough profile found a float32 cancellation (terms ~34, output 0.86) the naive run escaped by luck.
    @rule(data=st.data(), when=lambda self: not self.model.rows and not self.model.stale and self.facts["peaks"]
          and self.judge.dtype == "float64" and not self.judge.components and self.judge.storage is None,
          relies_on=["dtype", "mixed_precision", "storage"])
    def append_peaked_row(self, data: Draws) -> None:
        """A first row whose lone score is +-750: exp overflows or underflows unless shifted."""
        feature, scale = data.draw(st.sampled_from(self.facts["peaks"]), label="feature, scale")
        sign = data.draw(st.sampled_from([1.0, -1.0]), label="sign")
        x = np.zeros(self._row_shape)
        x[:, 0, feature] = sign * scale
        self._append_and_check(x, f"append a peaked row (feature {feature} = {sign * scale:.6g})")
        self.model.peaked = True

    @rule(data=st.data(), when=lambda self: self.frozen_scale and self.model.calibration is None
          and not self.model.stale and len(self.model.rows) + 2 <= self.config.capacity, relies_on=["storage"])
    def append_zero_first_row_then_a_row(self, data: Draws) -> None:
        """A frozen scale calibrated on an all-zero first update: where every value it is computed from is 0 the
        scale is 1 (docs/spec.md §13.6), and a later row must not read back as 0."""
        self._append_and_check(np.zeros(self._row_shape), "append an all-zero first row (a frozen scale's calibration)")
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        self._append_and_check(x, "append a row after an all-zero calibration")

    @property
    def frozen_scale(self) -> bool:
        return self.judge.storage is not None and self.judge.storage.update == "frozen"

    # -- rejected rows -------------------------------------------------------------------------------------

    @rule(data=st.data())
    def append_malformed_row(self, data: Draws) -> None:
        """Not a float64 ndarray, not 3-D, not one token, another batch or width -- one or several at once:
        the first in the documented order decides the kind. Into the cache as it is, an empty one or one holding
        rows (``meet``)."""
        self.meet(data)
        self._append_malformed(data)

    def _append_malformed(self, data: Draws) -> None:
        batch, width = self.model.batch_size, self.config.model_width
        case = data.optional(g.on_purpose(*MALFORMED), "malformed", MALFORMED[0])  # older traces: any
        if case == MALFORMED[1]:
            strategy = g.rows_as_lists(batch, width)
        elif case == MALFORMED[2]:
            strategy = (g.single_rows_into_a_batch(batch, width) if batch >= 2
                        else g.larger_batches_of_rows(batch, width))
        else:
            strategy = g.malformed_rows(batch, width)
        bad = data.draw(strategy, label="malformed row")
        if self.model.rows:
            self.exercised("malformed row on rows held")
        self._step(bad.value, Due.check(bad.kind), f"append {bad.description}")

    @rule(data=st.data(), when=lambda self: not self.model.rows)
    def append_malformed_row_to_an_empty_cache(self, data: Draws) -> None:
        """The same as the first write: a cache that allocates lazily takes its shapes from the first row it
        sees, and must not keep those of one it rejects (transformers' DynamicLayer kept a wrong rank)."""
        self._append_malformed(data)

    @rule(data=st.data())
    def append_non_finite_row(self, data: Draws) -> None:
        """A row with one inf or NaN: NON_FINITE where non_finite_rejection is claimed; if it raises, nothing
        changed. Into the cache as it is, an empty one or one holding rows (``meet``)."""
        self.meet(data)
        self._append_non_finite(data)

    # -- the state a call meets, on purpose ----------------------------------------------------------------
    # A hard case is drawn inside the rule that needs it, not as a rule of its own: Hypothesis disables a random
    # subset of rules in every run, and each rule added thins every other one out (issue 23: two old mutants
    # survived eleven added rules).

    def meet(self, data: Draws, cases: tuple[str, ...] = MEETS) -> int:
        """Where a call lands, drawn from ``cases`` (named for the call; by default ``MEETS``): 0, the cache as it
        is; 1, an empty cache (a fresh one if this one holds rows); 2, one holding rows (one or two valid rows
        appended first if it holds none) -- a lazily allocating cache shows a kept shape only when empty, a write
        before the checks only over rows held; a further case is the caller's to set up. Traces of an earlier
        suite, without this draw, meet it as it is."""
        meets = cases.index(data.optional(g.on_purpose(*cases), "meets", cases[0]))
        if meets == 1:
            self.empty_cache()
        elif meets == 2:
            self.hold_rows(data)
        return meets

    def empty_cache(self) -> None:
        """A fresh cache in place of one that holds rows, so that the call after it meets an empty cache for
        certain (a rule recorded before on an empty cache replays as it was)."""
        if self.model.rows:
            self._new_cache()

    def hold_rows(self, data: Draws) -> None:
        """One or two valid rows appended (within the capacity; into a fresh cache if this one is stale) if the
        cache holds none, so that the call after it meets rows held for certain, not by luck."""
        if self.model.rows:
            return
        if self.model.stale:
            self._new_cache()
        for _ in range(data.draw(st.integers(1, max(1, min(2, self.config.capacity - 1))), label="rows held")):
            self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                                   "append a row")

    def fill(self, data: Draws) -> None:
        """Valid rows appended until the cache is full (a fresh cache first if this one is stale or holds a
        peaked row): a cache that advances its length or clamps its index before the room check shows it only
        when full."""
        if self.model.stale or self.model.peaked:
            self._new_cache()
        while not self.full:
            self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                                   "append a row")

    def _append_non_finite(self, data: Draws) -> None:
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        bad = data.draw(st.sampled_from([math.nan, math.inf, -math.inf]), label="value")
        index = data.draw(st.tuples(st.integers(0, x.shape[0] - 1), st.integers(0, x.shape[2] - 1)), label="index")
        x[index[0], 0, index[1]] = bad
        self._step(x, self._due(non_finite=True), f"append a row with {bad} at {index}")

    @rule(data=st.data(), when=lambda self: self.facts["overflows"])
    def append_overflowing_row(self, data: Draws) -> None:
        """A finite row whose query, key or value projection is certain to overflow."""
        name, column, _ = data.draw(st.sampled_from(self.facts["overflows"]), label="target")
        x = np.broadcast_to(g.overflowing_row(self.weights, name, column), self._row_shape).copy()
        self._step(x, self._due(non_finite=True), f"append a row overflowing {name} feature {column}")

    @rule(data=st.data(), when=lambda self: self.facts["isolated overflows"])
    def append_row_overflowing_one_projection(self, data: Draws) -> None:
        """Only the key, only the value or only the query overflows: still nothing is written."""
        name, column, row = data.draw(st.sampled_from(self.facts["isolated overflows"]), label="target")
        x = np.broadcast_to(row, self._row_shape).copy()
        self._step(x, self._due(non_finite=True), f"append a row overflowing only {name} feature {column}")

    @rule(data=st.data(), when=lambda self: self.score_overflows, relies_on=["storage"])  # (what is stored)
    def append_row_overflowing_a_score(self, data: Draws) -> None:
        """Finite q, k and v, but the score with the row's own key overflows -- to -inf too, which softmax
        weighs 0 beside finite scores, leaving a finite output: only a check of the scores rejects it."""
        targets = self.score_overflows
        if any(sign < 0 for _, sign, _ in targets) and data.optional(
                g.on_purpose(*SCORE_MEETS), "meets", SCORE_MEETS[0]) == SCORE_MEETS[1]:
            if self.model.stale or self.full:  # checked before the values: a fresh cache, then rows
                self._new_cache()
            self.hold_rows(data)
            targets = [target for target in self.score_overflows if target[1] < 0] or self.score_overflows
            if not targets:  # (a frozen scale calibrated by the rows held: no stored score overflows now)
                return
        head, sign, row = data.draw(st.sampled_from(targets), label="target")
        x = np.broadcast_to(row, self._row_shape).copy()
        self._step(x, self._due(non_finite=True),
                   f"append a row whose head {head} score with its own key is {'+' if sign > 0 else '-'}inf")

    @rule(data=st.data(), when=lambda self: not self.model.rows and self.facts["output overflows"])
    def append_first_row_overflowing_the_output(self, data: Draws) -> None:
        """Finite q, k and v and a score of exactly 0 (an empty cache), but the output projection overflows."""
        feature, column, row = data.draw(st.sampled_from(self.facts["output overflows"]), label="target")
        x = np.broadcast_to(row, self._row_shape).copy()
        self._step(x, self._due(non_finite=True),
                   f"append a first row (feature {feature} = {row[feature]:.6g}) overflowing output feature {column}")

    @property
    def facts(self) -> dict[str, list[Any]]:
        """Rows the current weights allow, computed once per weights (preconditions run every step)."""
        if self._facts[0] is not self.weights:
            self._facts = (self.weights, {
                "overflows": g.overflow_targets(self.weights),
                "isolated overflows": g.isolated_overflows(self.weights),
                "score overflows": g.score_overflows(self.weights),
                "output overflows": g.output_overflows(self.weights),
                "peaks": g.peak_features(self.weights),
            })
        return self._facts[1]

    @property
    def score_overflows(self) -> list[tuple[int, float, np.ndarray]]:
        """The score-overflowing rows, judged over what the cache stores (docs/spec.md §13.6): a frozen scale
        saturates a stored key, and a score over what is stored may stay finite -- such a row is no overflow."""
        rows = self.facts["score overflows"]
        if not self.frozen_scale or self.model.calibration is None:
            return rows
        return [(head, sign, row) for head, sign, row in rows
                if self.oracle.stored_score_overflows(self.model, head, row)]

    @property
    def _row_shape(self) -> tuple[int, int, int]:
        return (self.model.batch_size, 1, self.config.model_width)

    # -- other layers against this cache -------------------------------------------------------------------

    @rule(data=st.data())
    def append_through_recreated_layer(self, data: Draws) -> None:
        """Equal values in new parameter objects: LAYER_MISMATCH."""
        recreated = self.must("recreate the layer", lambda: self.adapter.recreate_layer(self.layer))
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        self._step(x, self._due(layer="recreated"), "append through a recreated layer", layer=recreated)

    @rule(data=st.data(), when=lambda self: self.config.rope is not None)
    def append_under_other_rope(self, data: Draws) -> None:
        """The same parameters under another RoPE: ROPE_MISMATCH (the base compared bit for bit). On purpose, a
        cache bound to the weights as they are (a fresh one if this one is stale): staleness is checked first, and
        hides the RoPE check; and on purpose (``ROPE_CHANGES``) the base one ulp away on such a cache."""
        rope = self.config.rope
        assert rope is not None
        fresh = data.optional(g.on_purpose("the cache as it is", "a cache that is not stale"), "meets",
                              "the cache as it is") != "the cache as it is"
        one_ulp = data.optional(g.on_purpose(*ROPE_CHANGES), "rope change", ROPE_CHANGES[0]) == ROPE_CHANGES[1]
        if (fresh or one_ulp) and self.model.stale:
            self._new_cache()
        variants = {  # (the base one ulp away first: a list's first entries are drawn more often)
            BASE_ONE_ULP_AWAY[0]: {"base": math.nextafter(rope.base, math.inf)},
            BASE_ONE_ULP_AWAY[1]: {"base": math.nextafter(rope.base, 0.0)},
            "base doubled": {"base": rope.base * 2},
            "max positions + 1": {"max_positions": rope.max_positions + 1},
            "max positions - 1": {"max_positions": rope.max_positions - 1},
        }
        if self.has(Capability.ROPE_INTERLEAVED) and self.has(Capability.ROPE_HALF_SPLIT):
            variants["other pairing"] = {"style": "half_split" if rope.style == "interleaved" else "interleaved"}
        if self.has(Capability.PARTIAL_ROTARY):
            for width in range(2, self.config.weights.head_width + 1, 2):
                if width != rope.rotary_width:
                    variants[f"rotary width {width}"] = {"rotary_width": width}
        name = data.choose(list(BASE_ONE_ULP_AWAY) if one_ulp else
                           [n for n, v in variants.items() if "max_positions" not in v or v["max_positions"] >= 1],
                           label="RoPE change")
        if name in BASE_ONE_ULP_AWAY and not self.model.stale:
            self.exercised(ROPE_CHANGES[1])
        other = replace(rope, **variants[name])  # type: ignore[arg-type]
        what = f"the layer under RoPE with {name}"
        layer = self.must(what, lambda: self.adapter.with_rope(self.layer, other))
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        self._step(x, self._due(layer="rope variant"), f"append through {what}", layer=layer)

    @rule(data=st.data(), when=lambda self: self.geometry_changes)
    def append_into_cache_of_other_geometry(self, data: Draws) -> None:
        """This layer against a cache built for another shape: GEOMETRY_MISMATCH, that cache untouched."""
        change = data.choose(sorted(self.geometry_changes), label="geometry change")
        width, heads, kv_heads, dh = self.geometry_changes[change]
        weights = data.draw(g.attention_weights(width, heads, kv_heads, dh), label="other weights")
        rope = rope_of_geometry(self.config.rope, self.config.weights.head_width, dh)
        other_layer = self._create_layer(weights, rope, f"create a layer with another {change}")
        other_cache = self.must("create a cache for the other layer", lambda: self.adapter.create_cache(
            other_layer, self.model.batch_size, self.config.capacity))
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        self._step(x, Due.check(ErrorKind.GEOMETRY_MISMATCH), f"append into a cache built for another {change}",
                   cache=other_cache)

    @functools.cached_property
    def geometry_changes(self) -> dict[str, tuple[int, int, int, int]]:
        """``other_geometries`` of the layer drawn at set-up (computed once)."""
        return other_geometries(self.config, self.limits, self.has(Capability.GQA))

    # -- lifecycle -----------------------------------------------------------------------------------------

    @rule()
    def reset(self) -> None:
        """Length 0 and nothing held, for everyone; the storage as the adapter declares (reset_keeps_bytes:
        the same buffers and every byte; reset_keeps_buffers: the same buffers; reset_zeroes: all zero).
        Bindings survive: a stale cache stays stale."""
        self._reset()

    def _reset(self) -> None:
        before = self._snapshot(self.cache, "reset")
        self.call("reset", lambda: self.adapter.reset(self.cache))
        after = self._snapshot(self.cache, "reset")
        if after.length != 0 or after.keys.shape[2:3] != (0,) or after.values.shape[2:3] != (0,):
            raise NonConformance(f"reset: length {after.length}, keys {after.keys.shape}, values "
                                 f"{after.values.shape}, but nothing should be held", kind="reset held rows")
        if self.physical and self.has(Capability.RESET_KEEPS_BYTES):
            storage = ("physical keys", "physical values", "buffer identity")
            unchanged({k: v for k, v in observed(before).items() if k in storage},
                      {k: v for k, v in observed(after).items() if k in storage}, "reset",
                      kind="reset changed the storage", check=Capability.RESET_KEEPS_BYTES.value,
                      because="reset must keep both buffers and every byte in them (reset_keeps_bytes)")
        elif self.physical and self.has(Capability.RESET_KEEPS_BUFFERS) and \
                before.buffer_identity != after.buffer_identity:
            raise NonConformance("reset: the storage buffers were replaced, but reset_keeps_buffers is declared",
                                 kind="reset replaced buffers", check=Capability.RESET_KEEPS_BUFFERS.value)
        if self.physical and self.has(Capability.RESET_ZEROES):
            for name in ("physical_keys", "physical_values"):
                if np.any(getattr(after, name) != 0):
                    raise NonConformance(f"reset: {name.replace('_', ' ')} hold non-zero bytes, but reset_zeroes "
                                         "is declared", kind="reset did not zero",
                                         check=Capability.RESET_ZEROES.value)
        self.model.emptied()

    @rule(data=st.data())
    def update_weights_in_place(self, data: Draws) -> None:
        """An optimiser-like write into the same parameters (possibly of identical values): every live cache of
        the layer is stale (rejected with REVISION_MISMATCH where binding_checks is claimed)."""
        self.write_weights_in_place(data)

    def write_weights_in_place(self, data: Draws) -> None:
        """The body of ``update_weights_in_place``, for a rule that needs a stale cache as one of its steps."""
        new = data.draw(g.weight_updates(self.weights), label="new weights")
        handed = Inputs()
        given = handed("weights", new)
        self.must("update the weights in place", lambda: self.adapter.update_weights(self.layer, given), handed)
        self.weights = new
        for model in (self.model, *(parked.model for parked in self.parked)):
            model.stale = True

    @rule(when=lambda self: self.model.stale or self.full)
    def replace_cache(self) -> None:
        """A fresh cache for the layer as it is now."""
        self._new_cache()

    # -- after every rule ----------------------------------------------------------------------------------

    @invariant()
    def cache_matches_oracle(self) -> None:
        """The cache operated on equals the oracle: its length, its logical keys (§3) and values, and the first
        rows of its physical storage (a window cache: every row it shows, at its position, and at least the
        rows the next query sees); every parked cache shows what it showed when parked."""
        for index, parked in enumerate(self.parked):
            unchanged(shown(parked.seen), shown(self._snapshot(parked.cache, f"parked cache {index}")),
                      f"parked cache {index}", kind="parked cache changed",
                      because="a parked cache must not change while another is operated on")
        model = self.model
        self.tape.expect("after the last step", expect=Expect.STATE.value, length=len(model.rows))
        snapshot = self._snapshot(self.cache, "after the last step")
        if snapshot.length != len(model.rows):
            raise NonConformance(f"cache length is {snapshot.length}, but {len(model.rows)} rows were appended",
                                 kind="wrong length", check="length")
        if self.window is not None:
            return self._window_matches_oracle(snapshot)
        batch, kv, dh = model.batch_size, self.config.weights.kv_heads, self.config.weights.head_width
        empty = np.zeros((batch, kv, 0, dh))
        held, held_keys = self.oracle.held(model), self.oracle.held_keys(model)
        keys, key_tolerance = self.judge.rows_bound(held_keys, lambda t: t.keys, self.oracle.steps(
            model, held_keys, "keys", None if held_keys is held else self.oracle.unrotated)) \
            if held_keys else (empty, 0.0)
        values, value_tolerance = self.judge.rows_bound(held, lambda t: t.values, self.oracle.steps(
            model, held, "values")) if held else (empty, 0.0)
        checks = [("cached logical keys", "cached keys", snapshot.keys, keys, key_tolerance),
                  ("cached logical values", "cached values", snapshot.values, values, value_tolerance)]
        if self.physical:
            shape = (batch, kv, self.config.capacity, dh)
            for name in ("physical_keys", "physical_values"):
                if getattr(snapshot, name).shape != shape:
                    raise NonConformance(f"{name.replace('_', ' ')}: shape {getattr(snapshot, name).shape}, "
                                         f"but the layout is [B, KV, C, dh] = {shape}",
                                         kind="physical storage: wrong shape", check=name.replace("_", " "))
            length = len(model.rows)
            checks += [("cached physical key rows", "physical keys", snapshot.physical_keys[:, :, :length],  # type: ignore
                        keys, key_tolerance),
                       ("cached physical value rows", "physical values", snapshot.physical_values[:, :, :length],  # type: ignore
                        values, value_tolerance)]
        for what, check, actual, expected, tolerance in checks:
            self.judge.close(actual, expected, tolerance, what=what, check=check)
        return None

    def _window_matches_oracle(self, snapshot: CacheSnapshot) -> None:
        """A window cache shows increasing positions of rows fed, at least the ones the next row sees, each
        equal to the oracle's row at its position."""
        model, window = self.model, self.window
        assert window is not None
        positions = snapshot.positions.tolist()  # type: ignore[union-attr]
        window_positions(positions, len(model.rows), window, "window cache", sinks=self.sinks)
        held, held_keys = self.oracle.held(model), self.oracle.held_keys(model)
        for name, actual, reference in (("keys", snapshot.keys, held_keys), ("values", snapshot.values, held)):
            shape = (model.batch_size, self.config.weights.kv_heads, len(positions), self.config.weights.head_width)
            if reference is None:
                expected, tolerance = np.zeros(shape), 0.0
            else:
                steps = self.oracle.steps(model, reference, name, None if reference is held else self.oracle.unrotated)
                expected, tolerance = self.judge.rows_bound(reference, lambda t: getattr(t, name)[:, :, positions],
                                                            None if steps is None else steps[:, :, positions])
            self.judge.close(actual, expected, tolerance, what=f"cached {name} at positions {positions}",
                             check=f"cached {name}")


def other_geometries(config: g.LayerConfig, limits: Any, gqa: bool) -> dict[str, tuple[int, int, int, int]]:
    """Other (model width, heads, kv heads, head width) the implementation can build, by name: the nearest
    geometry within its layer limits that differs from ``config``'s layer in that one respect. A RoPE layer's
    rotary width must still fit the head. For a step into, or a merge of, a cache of another geometry."""
    w = config.weights
    tied = limits.model_width_is_heads_times_head_width
    rotary = 0 if config.rope is None else config.rope.rotary_width

    def admitted(width: int, heads: int, dh: int) -> bool:
        return limits.geometry_problem(width, heads, dh) is None and rotary <= dh

    changes: dict[str, tuple[int, int, int, int]] = {}
    widths = [d for d in range(w.model_width + 1, w.model_width + 9) if not tied and admitted(d, w.heads,
                                                                                               w.head_width)]
    if widths:
        changes["model width"] = (widths[0], w.heads, w.kv_heads, w.head_width)
    full_rotary = config.rope is not None and rotary == w.head_width  # the other layer's: all of dh
    for dh in range(w.head_width + 2, 2 * w.head_width + 9, 2):
        width = w.heads * dh if tied else w.model_width
        if full_rotary and limits.max_rotary_width is not None and dh > limits.max_rotary_width:
            break  # its rotary width would be above the limit
        if admitted(width, w.heads, dh):
            changes["head width"] = (width, w.heads, w.kv_heads, dh)
            break
    heads = 2 * w.heads
    width = heads * w.head_width if tied else w.model_width
    if admitted(width, heads, w.head_width):
        changes["heads"] = (width, heads, w.kv_heads * (1 if gqa else 2), w.head_width)
    return changes


def rope_of_geometry(rope: RopeConfig | None, head_width: int, dh: int) -> RopeConfig | None:
    """The RoPE of a layer of head width ``dh`` beside one of ``head_width``: a rotation of every feature still
    rotates every feature (partial rotary only where declared)."""
    if rope is not None and rope.rotary_width == head_width:
        return replace(rope, rotary_width=dh)
    return rope
