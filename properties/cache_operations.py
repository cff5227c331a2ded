"""The cache-operations machine: chunked append, truncate, batch reorder, fork, sliding windows (spec §13).

It is the layer machine (every rule of ``LayerCacheMachine`` stays: single
rows, malformed and non-finite inputs, other layers, reset, weight updates)
plus the optional operations, each drawn only when its capability is
declared. The model is the same -- the rows fed since the cache was created
or reset, recomputed by the oracle -- so an operation's semantics is what it
does to that list: a chunk extends it, truncation cuts it, a reorder gathers
every row's batch entries, a fork copies it.

Several caches may be live at once (forks): the one operated on, and up to
two parked ones. A parked cache must not change at all -- bit for bit, in
everything its snapshot shows -- while others are written, in either
direction; when it is operated on again it is checked against the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from oracle import FLOAT64, AttentionWeights, NumberSystem

from . import strategies as s
from .layer_cache import LayerCacheMachine
from .layouts import with_layout
from .protocol import CacheSnapshot, Capability, ErrorKind, KvCacheAdapter
from .trace import Draws, RuleSpec, initialize, invariant, rule
from .verdict import Inputs, NonConformance, call, expect_success, same_state

MAX_PARKED = 2  # live caches besides the one operated on
# The windowed run leaves out the layer machine's rules about other layers and extreme rows, which the
# full run and the layer machine cover: its steps go to filling, evicting and truncating the window.
NOT_IN_WINDOWED_RUNS = frozenset({
    "append_peaked_row", "append_overflowing_row", "append_row_overflowing_one_projection",
    "append_row_overflowing_a_score", "append_first_row_overflowing_the_output", "append_through_recreated_layer",
    "append_under_other_rope", "append_into_cache_of_other_geometry", "update_weights_in_place"})
MAX_WINDOW = 3
WINDOWED_MIN_CAPACITY = 5


@dataclass
class Parked:
    """A live cache not being operated on, its model, and what its snapshot showed when it was parked."""

    cache: Any
    rows: list[np.ndarray]
    weights: AttentionWeights
    stale: bool
    peaked: bool
    calibration: list[np.ndarray] | None  # the first update's rows (a frozen storage scale)
    seen: CacheSnapshot


class CacheOperationsMachine(LayerCacheMachine):
    """The layer machine with chunks, truncation, reorders and forks, optionally on a sliding-window cache."""

    def __init__(self, adapter: KvCacheAdapter, numbers: NumberSystem = FLOAT64, style: str | None = None,
                 grouped: bool | None = None, windowed: bool = False) -> None:
        super().__init__(adapter, numbers, style=style, grouped=grouped)
        self.windowed = windowed
        self.parked: list[Parked] = []

    @initialize(data=st.data())
    def build_layer_and_cache(self, data: Draws) -> None:
        self.config = data.draw(s.layer_configs(self.capabilities, **self.family, limits=self.limits,
                                                min_capacity=WINDOWED_MIN_CAPACITY if self.windowed else 1),
                                label="config")
        if self.windowed:  # two or more below the capacity where it can be: rows are evicted, then more
            self.need(Capability.SLIDING_WINDOW_LAYER, "a sliding-window cache")  # replaying: stops here if absent
            smallest = self.limits.min_window or 1
            self.window = data.draw(st.integers(smallest, max(smallest, min(max(MAX_WINDOW, smallest),
                                                                            self.config.capacity - 2))),
                                    label="window")
        self.weights = self.config.weights
        self.layer = self._create_layer(self.weights, self.config.rope, "create the layer")
        self._new_cache()

    def may_run(self, spec: RuleSpec) -> bool:
        return super().may_run(spec) and not (self.windowed and spec.name in NOT_IN_WINDOWED_RUNS)

    def _new_cache(self) -> None:
        if self.window is None:
            return super()._new_cache()
        what = f"create a cache with a window of {self.window}"
        self.cache = expect_success(call(self.adapter, what, lambda: self.adapter.create_cache(
            self.layer, self.config.batch_size, self.config.capacity, window=self.window)), what)
        self.cache_weights = self.weights
        self.rows, self.trace, self.stale, self.peaked, self.calibration = [], None, False, False, None
        return None

    # -- chunks ------------------------------------------------------------------------------------------

    def _chunk_expected(self, tokens: int, *, non_finite: bool = False) -> ErrorKind | None:
        """A chunk's verdict: as a step's, but FULL when its T rows do not all fit."""
        if self.stale:
            return ErrorKind.REVISION_MISMATCH
        if len(self.rows) + tokens > self.config.capacity:
            return ErrorKind.FULL
        return ErrorKind.NON_FINITE if non_finite else None

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data(), when=lambda self: not self.peaked)
    def append_chunk(self, data: Draws) -> None:
        """T >= 1 valid rows at once, in any layout: causal inside the chunk, exact; or FULL if even one row
        does not fit (nothing written), or REVISION_MISMATCH if stale."""
        room = self.config.capacity - len(self.rows)
        tokens = data.draw(st.integers(1, s.MAX_CHUNK) if room <= 0 else
                           st.integers(1, min(room, s.MAX_CHUNK)) | st.just(room + 1), label="tokens")
        x = with_layout(data.draw(s.chunks(self.config.batch_size, tokens, self.config.model_width), label="chunk"),
                        *data.draw(s.layouts(), label="layout"))
        expected = self._chunk_expected(tokens)
        what = f"append a chunk of {tokens} at position {len(self.rows)}"
        if expected is None:
            self._append_and_check(x, what, chunk=True)
        else:
            self._step(x, expected, f"{what} to a {'stale' if self.stale else 'full'} cache", chunk=True)

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data())
    def append_malformed_chunk(self, data: Draws) -> None:
        """Not a float64 ndarray, not 3-D, no token, another batch or width: the first in order decides."""
        bad = data.draw(s.malformed_rows(self.config.batch_size, self.config.model_width, chunked=True),
                        label="malformed chunk")
        self._step(bad.value, self._expected(malformed=bad.kind), f"append a chunk: {bad.description}", chunk=True)

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data())
    def append_non_finite_chunk(self, data: Draws) -> None:
        """A chunk with one inf or NaN in any of its rows: none of its rows is written."""
        tokens = data.draw(st.integers(1, s.MAX_CHUNK), label="tokens")
        x = data.draw(s.chunks(self.config.batch_size, tokens, self.config.model_width), label="chunk").copy()
        index = data.draw(st.tuples(*(st.integers(0, n - 1) for n in x.shape)), label="index")
        bad = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]), label="value")
        x[index] = bad
        self._step(x, self._chunk_expected(tokens, non_finite=True),
                   f"append a chunk of {tokens} with {bad} at {index}", chunk=True)

    # -- truncation ---------------------------------------------------------------------------------------

    @rule(requires=[Capability.TRUNCATE], data=st.data())
    def truncate(self, data: Draws) -> None:
        """Keep the first n rows: the next row goes at position n. An invalid n is INVALID_LENGTH (where
        claimed). A window cache must truncate wherever it still shows every row the next query sees; where
        it does not, it may refuse with EVICTED (nothing changed) or succeed exactly."""
        n = data.draw(s.truncation_lengths(len(self.rows), self.window), label="n")
        what = f"truncate a cache of {len(self.rows)} rows to {n.value!r}"
        handed = Inputs()

        def action() -> None:
            self.adapter.truncate(self.cache, n.value)  # type: ignore[attr-defined]

        if n.kind is not None:
            self._attempt(action, handed, n.kind, what, self.cache)
            return
        if self.window is not None and not self._shows_rows_for(n.value):
            before = self._snapshot(self.cache, what)
            self.tape.expect(what, result=f"success, or rejected with {ErrorKind.EVICTED.value} and unchanged")
            outcome = call(self.adapter, what, action, handed)
            if outcome.kind is not None:
                if outcome.kind != ErrorKind.EVICTED:
                    raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), but the "
                                         "only rejection allowed is evicted", kind=f"expected success or evicted, "
                                         f"got {outcome.kind.value}")
                same_state(before, self._snapshot(self.cache, what), what, "a rejected call must change nothing")
                return
        else:
            self.tape.expect(what, result="success")
            expect_success(call(self.adapter, what, action, handed), what)
        self.rows, self.trace = self.rows[:n.value], None
        self.peaked = self.peaked and n.value > 0

    def _shows_rows_for(self, n: int) -> bool:
        """Whether the window cache's snapshot shows every row a query at position n sees: n-W+1 .. n-1."""
        assert self.window is not None
        shown = set(self._snapshot(self.cache, "before truncating").positions.tolist())  # type: ignore[union-attr]
        return all(p in shown for p in range(max(0, n - self.window + 1), n))

    # -- batch reorder ------------------------------------------------------------------------------------

    @rule(requires=[Capability.BATCH_REORDER], data=st.data())
    def reorder(self, data: Draws) -> None:
        """Batch row b becomes the old row indices[b], along the batch axis only; repeats and drops allowed.
        Invalid indices are INVALID_INDICES (where claimed), nothing changed."""
        indices = data.draw(s.batch_indices(self.config.batch_size), label="indices")
        what = f"reorder the batch by {indices.description}"
        handed = Inputs()
        given = handed("indices", indices.value)

        def action() -> None:
            self.adapter.reorder(self.cache, given)  # type: ignore[attr-defined]

        self._attempt(action, handed, indices.kind, what, self.cache)
        if indices.kind is None:
            gather = np.asarray(indices.value, dtype=np.int64)
            self.rows, self.trace = [row[gather] for row in self.rows], None

    # -- forks ----------------------------------------------------------------------------------------------

    @rule(requires=[Capability.FORK], data=st.data(), when=lambda self: len(self.parked) < MAX_PARKED)
    def fork(self, data: Draws) -> None:
        """An independent copy, showing exactly what the original shows; go on with either, park the other."""
        what = "fork the cache"
        original = self._snapshot(self.cache, what)
        twin = expect_success(call(self.adapter, what, lambda: self.adapter.fork(self.cache)), what)  # type: ignore
        copy = self._snapshot(twin, f"{what}: the copy")
        _same_logical(original, copy, f"{what}: the copy", "a fork must show exactly what the original shows")
        _same_logical(original, self._snapshot(self.cache, what), f"{what}: the original", "forking must not change "
                      "the original")
        if data.draw(st.booleans(), label="go on with the copy"):
            self.parked.append(self._park(original))
            self.cache = twin
        else:
            self.parked.append(Parked(twin, list(self.rows), self.cache_weights, self.stale, self.peaked,
                                      self.calibration, copy))

    @rule(data=st.data(), when=lambda self: bool(self.parked))
    def switch_cache(self, data: Draws) -> None:
        """Park the cache operated on; operate on a parked one."""
        index = data.draw(st.integers(0, len(self.parked) - 1), label="parked cache")
        chosen = self.parked.pop(index)
        self.parked.append(self._park(self._snapshot(self.cache, "park the cache")))
        self.cache, self.rows, self.cache_weights = chosen.cache, chosen.rows, chosen.weights
        self.stale, self.peaked, self.calibration, self.trace = chosen.stale, chosen.peaked, chosen.calibration, None

    def _park(self, seen: CacheSnapshot) -> Parked:
        return Parked(self.cache, list(self.rows), self.cache_weights, self.stale, self.peaked, self.calibration,
                      seen)

    def _weights_changed(self) -> None:
        """Every live cache of the layer is stale, parked ones too."""
        super()._weights_changed()
        for parked in self.parked:
            parked.stale = True

    # -- after every rule -----------------------------------------------------------------------------------

    @invariant()
    def cache_matches_oracle(self) -> None:
        """The cache operated on equals the oracle (a window cache: every row it shows, at its position, and
        at least the rows the next query sees); every parked cache shows what it showed when parked."""
        for index, parked in enumerate(self.parked):
            now = self._snapshot(parked.cache, f"parked cache {index}")
            _same_logical(parked.seen, now, f"parked cache {index}", "a parked cache must not change while another "
                          "is operated on")
        if self.window is None:
            return LayerCacheMachine.cache_matches_oracle(self)
        self.tape.expect("after the last step", length=len(self.rows))
        snapshot = self._snapshot(self.cache, "after the last step")
        if snapshot.length != len(self.rows):
            raise NonConformance(f"cache length is {snapshot.length}, but {len(self.rows)} rows were appended")
        positions = snapshot.positions.tolist()  # type: ignore[union-attr]
        needed = list(range(max(0, len(self.rows) - self.window + 1), len(self.rows)))
        if positions != sorted(set(positions)) or any(not 0 <= p < len(self.rows) for p in positions):
            raise NonConformance(f"window cache shows rows at positions {positions}: not increasing positions of "
                                 f"rows fed (0 .. {len(self.rows) - 1})", kind="window: wrong positions")
        missing = sorted(set(needed) - set(positions))
        if missing:
            raise NonConformance(f"window cache of {len(self.rows)} rows (window {self.window}) shows positions "
                                 f"{positions}, without {missing}, which the next row attends to",
                                 kind="window: rows the next row sees are missing")
        if self.rows and self.trace is None:
            self.trace = self._oracle(self.rows)
        held = self._cached_keys_oracle()
        for name, actual, reference in (("keys", snapshot.keys, held), ("values", snapshot.values, self.trace)):
            shape = (self.config.batch_size, self.config.weights.kv_heads, len(positions),
                     self.config.weights.head_width)
            if reference is None:
                expected, tolerance = np.zeros(shape), 0.0
            else:
                field = "keys" if name == "keys" else "values"
                steps = self._steps(reference, field, None if reference is self.trace else self._unrotated)
                expected, tolerance = self.judge.rows_bound(reference, lambda t: getattr(t, field)[:, :, positions],
                                                            None if steps is None else steps[:, :, positions])
            self.judge.close(actual, expected, tolerance, what=f"cached {name} at positions {positions}")
        return None


def _same_logical(before: CacheSnapshot, after: CacheSnapshot, what: str, rule: str) -> None:
    """Length, held rows and positions bit for bit (storage may move: copy-on-write is allowed)."""
    same_state(CacheSnapshot(before.length, before.keys, before.values, positions=before.positions),
               CacheSnapshot(after.length, after.keys, after.values, positions=after.positions), what, rule)
