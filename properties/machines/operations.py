"""The cache-operations machine: chunked append, truncate, batch reorder, select and repeat, fork, sliding windows
(docs/spec.md §13).

Every rule of the layer's one-row step (``layer_steps``: single rows,
malformed and non-finite inputs, other layers, reset, weight updates) plus
the optional operations, each drawn only when its capability is declared.
The model is the same -- the rows fed since the cache was created or reset,
recomputed by the oracle -- so an operation's meaning is what it does to that
list (``layer_model``).

Several caches may be live at once (forks): the one operated on, and up to
two parked ones. A parked cache must not change at all -- bit for bit, in
everything its snapshot shows -- while others are written, in either
direction; when it is operated on again it is checked against the oracle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import Needs, one_of
from ..judge.calls import Inputs
from ..judge.checks import seen_by_next
from ..judge.policy import VALID, Due, unchanged
from ..oracle import FLOAT64, NumberSystem
from ..protocol.kinds import Capability, ErrorKind
from ..traces.recording import Draws, rule
from .layer_steps import MEETS, LayerSteps, Parked, layer_needs, observed, shown

MAX_PARKED = 2  # live caches besides the one operated on
OPERATIONS = one_of([Capability.CHUNKED_APPEND], [Capability.TRUNCATE], [Capability.BATCH_REORDER],
                    [Capability.BATCH_SELECT], [Capability.BATCH_REPEAT], [Capability.FORK])
# What a valid chunk is drawn to meet, and which rows a selection keeps: the first, where shrinking goes, is the
# plain case; the others are hard cases drawn on purpose (``LayerSteps.meet``).
CHUNK_MEETS = ("the cache as it is", "past the room of an empty cache", "past the room of a cache holding rows")
SELECTIONS = ("any rows", "rows other than the leading ones, on rows held")
# The last, rows moved in a batch as large as the KV heads (a fresh cache of the batch configured so, where one is):
# a gather along the KV-head axis keeps every shape there and shows only in the rows it moved.
REORDERS = ("any indices", "a reorder that moves rows, on rows held",
            "a reorder that moves rows of a batch as large as the KV heads")
BATCH_AS_LARGE_AS_THE_KV_HEADS = "rows moved in a batch as large as the KV heads"  # an exercise table's case
# Where a reorder draws any indices: as drawn (a negative index in one of 24), or on purpose a negative index, on rows
# held -- a gather that wraps it (numpy's indexing) takes it as a row.
NEGATIVE = ("any indices", "a negative index, on rows held")
# The last, a cut past the length of a cache holding rows: a plain draw of n is above the length in one call of
# fourteen (issue 36: a cache accepting it survived 2 ci runs in 20).
CUTS = ("the cache as it is", "a stale cache, then a row", "rows held, cut, then a row",
        "rows held, cut past the length")
# A cut after the window evicts: of W or W + 1 rows (the edge), or on purpose of W + S + 1 rows into what a ring of
# W + S slots let go (with sinks half the windows are rings that have let nothing go at W + 1).
EVICTED_CUTS = ("at the window's edge", "into rows a ring let go")
# The batch a cache is created with: as drawn, or on purpose as large as the layer's KV heads (a layer of 2 or 3 KV
# heads drawn in place of one whose KV heads no batch reaches) -- a gather along the KV-head axis instead of the
# batch's keeps every shape there, and shows only in the rows it moved.
BATCHES = ("the batch drawn", "a batch as large as the KV heads")
# A repeat's count: any, or on purpose one that grows the batch past the largest a cache is created with (a valid
# repeat of 2 first where the batch is 1) -- storage sized by the batch a cache was created with shows only there.
REPEATS = ("any count", "a batch grown past the largest created")
WRAPPED = "a window cache that has wrapped"  # a further case of a windowed run: a ring that has let rows go
REJECTED_CHUNK_MEETS = (*MEETS, WRAPPED)


class CacheOperationsMachine(LayerSteps):
    """The layer's one-row steps with chunks, truncation, reorders and forks, optionally on a sliding-window cache."""

    @classmethod
    def needs(cls, style: str | None = None, grouped: bool | None = None, windowed: bool = False,
              **_: Any) -> Needs:
        if windowed:
            return layer_needs(style, grouped, Capability.SLIDING_WINDOW_LAYER)
        return layer_needs(style, grouped, alternatives=(("cache operation", OPERATIONS),))

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64, style: str | None = None,
                 grouped: bool | None = None, windowed: bool = False) -> None:
        super().__init__(adapter, numbers, style=style, grouped=grouped, windowed=windowed)

    def hard_config(self, data: Draws, config: g.LayerConfig) -> g.LayerConfig:
        """On purpose (``BATCHES``), a batch as large as the KV heads where that is 2 or more and within the limits;
        where the layer's KV heads are not, in its place one of the same family whose are (of the same head width
        where one is). Never where the adapter draws from few shapes (a shape of its own)."""
        weights = config.weights
        if self.limits.max_shapes is not None or config.batch_size == weights.kv_heads:
            return config
        largest = min(g.MAX_BATCH, self.limits.max_batch or g.MAX_BATCH)

        def fits(kv_heads: int) -> bool:
            return 2 <= kv_heads <= largest and self.limits.cache_problem(kv_heads, config.capacity) is None

        shapes = []
        if not fits(weights.kv_heads):
            grouped = weights.kv_heads < weights.heads  # the family drawn is kept
            shapes = self.shapes_for(config, grouped=grouped, keep=lambda shape: fits(shape[1]))
            if not shapes:
                return config
        if data.optional(g.on_purpose(*BATCHES), "batch", BATCHES[0]) == BATCHES[0]:
            return config
        if not shapes:
            return replace(config, batch_size=weights.kv_heads)
        return self.with_geometry(data, config, shapes, "batch geometry", batch_of_kv_heads=True)

    # -- chunks --------------------------------------------------------------------------------------------

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data(), when=lambda self: not self.model.peaked)
    def append_chunk(self, data: Draws) -> None:
        """T >= 1 valid rows at once, in any layout: causal inside the chunk, exact; or FULL if even one row
        does not fit (nothing written), or REVISION_MISMATCH if stale. On purpose, a chunk one row larger than
        the room of an empty cache or of one holding rows: a cache that writes what fits before its room check
        shows it only over rows held; in a windowed run also a chunk into a ring that has wrapped, where a chunk's
        mask and the slots it overwrites are hardest."""
        cases = CHUNK_MEETS if self.window is None else (*CHUNK_MEETS, WRAPPED)
        meets = self.meet(data, cases)
        if meets == len(CHUNK_MEETS):
            self._wrap_the_window(data)
        past_the_room = 0 < meets < len(CHUNK_MEETS)
        room = self.config.capacity - len(self.model.rows)
        if past_the_room:
            tokens = max(1, room + 1)
        else:
            # Within the room: the hard cases above go past it on purpose (this draw once did, half the time).
            tokens = data.draw(st.integers(1, g.MAX_CHUNK if room <= 0 else min(room, g.MAX_CHUNK)), label="tokens")
        x = g.with_layout(data.draw(g.chunks(self.model.batch_size, tokens, self.config.model_width),
                                    label="chunk"), *data.draw(g.layouts(), label="layout"))
        due = self._due(tokens=tokens)
        what = f"append a chunk of {tokens} at position {len(self.model.rows)}"
        if due.kind is None:
            self._append_and_check(x, what, chunk=True)
        else:
            self._step(x, due, f"{what} to a {'stale' if self.model.stale else 'full'} cache", chunk=True)

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data())
    def append_malformed_chunk(self, data: Draws) -> None:
        """Not a float64 ndarray, not 3-D, no token, another batch or width: the first in order decides. Into the
        cache as it is, an empty one or one holding rows (``meet``); in a windowed run also, on purpose, one that
        has held more than W + S rows -- a ring that reorders its slots before the chunk raises shows it only
        once it has wrapped."""
        if self.window is None:
            self.meet(data)
        elif self.meet(data, REJECTED_CHUNK_MEETS) == REJECTED_CHUNK_MEETS.index(WRAPPED):
            self._wrap_the_window(data)
        self._append_malformed_chunk(data)

    def _wrap_the_window(self, data: Draws) -> None:
        """Valid rows appended (into a fresh cache if this one is stale or holds a peaked row) until the cache has
        held W + S + 1 rows, or is full."""
        assert self.window is not None
        if self.model.stale or self.model.peaked:
            self._new_cache()
        while len(self.model.rows) < min(self.window + self.sinks + 1, self.config.capacity):
            self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                                   "append a row")

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data(), when=lambda self: not self.model.rows)
    def append_malformed_chunk_to_an_empty_cache(self, data: Draws) -> None:
        """The same as the first write (a lazily allocating cache must not keep a rejected chunk's shapes)."""
        self._append_malformed_chunk(data)

    def _append_malformed_chunk(self, data: Draws) -> None:
        bad = data.draw(g.malformed_rows(self.model.batch_size, self.config.model_width, chunked=True),
                        label="malformed chunk")
        self._step(bad.value, Due.check(bad.kind), f"append a chunk: {bad.description}", chunk=True)

    @rule(requires=[Capability.CHUNKED_APPEND], data=st.data())
    def append_non_finite_chunk(self, data: Draws) -> None:
        """A chunk with one inf or NaN in any of its rows: none of its rows is written. Into the cache as it is,
        an empty one or one holding rows (``meet``)."""
        self.meet(data)
        self._append_non_finite_chunk(data)

    def _append_non_finite_chunk(self, data: Draws) -> None:
        tokens = data.draw(st.integers(1, g.MAX_CHUNK), label="tokens")
        x = data.draw(g.chunks(self.model.batch_size, tokens, self.config.model_width), label="chunk").copy()
        index = data.draw(st.tuples(*(st.integers(0, n - 1) for n in x.shape)), label="index")
        bad = data.draw(st.sampled_from([np.nan, np.inf, -np.inf]), label="value")
        x[index] = bad
        self._step(x, self._due(tokens=tokens, non_finite=True), f"append a chunk of {tokens} with {bad} at {index}",
                   chunk=True)

    # -- truncation ----------------------------------------------------------------------------------------

    @rule(requires=[Capability.TRUNCATE], data=st.data())
    def truncate(self, data: Draws) -> None:
        """Keep the first n rows: the next row goes at position n. An invalid n is INVALID_LENGTH (where
        claimed). A window cache must truncate wherever it still shows every row the next query sees; where
        it does not, it may refuse with EVICTED (nothing changed) or succeed exactly. Declared
        window_truncates_until_full: it truncates while it holds fewer than W rows (W + S with S sinks, declared
        window_full_counts_sinks), and refuses every truncation with EVICTED from then on. On purpose, a stale cache
        holding rows, cut, then a row: REVISION_MISMATCH where binding_checks is claimed -- a cut keeps the cache
        bound to the parameters its rows were computed with; one that binds itself anew takes a stale cache back. And
        a cache holding rows, cut below its length, then a row (a cut that removes rows held, not only a stale
        one's), and one holding rows cut past its length; in a windowed run also a cut into rows a ring let go
        (``_cut_into_rows_let_go``)."""
        cases = CUTS if self.window is None else (*CUTS, EVICTED_CUTS[1])  # a windowed run's case too
        cuts = data.optional(g.on_purpose(*cases), "cuts", CUTS[0])
        if cuts == EVICTED_CUTS[1] and self._can_cut_into_rows_let_go:
            self._cut_into_rows_let_go(data)
        elif cuts == CUTS[1]:
            self._truncate_a_stale_cache_then_append(data)
        elif cuts == CUTS[2]:
            self._truncate_rows_held_then_append(data)
        elif cuts == CUTS[3]:  # INVALID_LENGTH where claimed, nothing changed
            self.hold_rows(data)
            self._truncate(len(self.model.rows) + data.draw(st.integers(1, 2), label="past the length by"))
        else:
            self._truncate(data.draw(g.truncation_lengths(len(self.model.rows), self.window), label="n").value)

    @rule(requires=[Capability.TRUNCATE], data=st.data(), when=lambda self: self.window is not None
          and not self.model.stale and not self.model.peaked and self.window + 1 <= self.config.capacity)
    def truncate_after_the_window_evicts(self, data: Draws) -> None:
        """Rows appended until the window is full (W rows) or has let some go (W + 1), then a cut of two rows or
        more: into what it let go, refused with EVICTED (nothing changed) or exact -- never rows brought back that
        it no longer has; and with window_truncates_until_full, refused from W rows on."""
        if self._can_cut_into_rows_let_go and data.optional(
                g.on_purpose(*EVICTED_CUTS), "evicts", EVICTED_CUTS[0]) == EVICTED_CUTS[1]:
            self._cut_into_rows_let_go(data)
            return
        target = self.window + data.draw(st.integers(0, 1), label="rows past the window")
        while len(self.model.rows) < max(target, 2):
            self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                                   "append a row")
        self._truncate(data.draw(st.integers(0, len(self.model.rows) - 2), label="n"))

    @property
    def _can_cut_into_rows_let_go(self) -> bool:
        """A window of 2 or more (one of 1 sees only its own row and the sinks) in a cache that can hold W + S + 1."""
        return self.window is not None and self.window >= 2 and self.window + self.sinks + 1 <= self.config.capacity

    def _cut_into_rows_let_go(self, data: Draws) -> None:
        """Rows appended until a ring of W + S slots has let one go (W + S + 1 held), then a cut to n in
        [S + 1, length - 2]: the next query at n sees a row out of the ring -- where the ring has let it go, refused
        with EVICTED (nothing changed) or exact, never a slot brought back that holds a later row (W >= 2: a
        window of 1 sees only its own row and the sinks)."""
        assert self.window is not None
        if self.model.stale or self.model.peaked:  # (the plain truncate rule's case: rows are appended first)
            self._new_cache()
        while len(self.model.rows) < self.window + self.sinks + 1:
            self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                                   "append a row")
        self._truncate(data.draw(st.integers(self.sinks + 1, len(self.model.rows) - 2), label="n"))

    @rule(requires=[Capability.WINDOW_FULL_COUNTS_SINKS], data=st.data(), when=lambda self: self.sinks > 0
          and not self.model.stale and not self.model.peaked and self.window + self.sinks <= self.config.capacity)
    def truncate_a_ring_of_window_and_sinks(self, data: Draws) -> None:
        """A cache with S sinks, full at W + S rows (window_full_counts_sinks), reset if it holds more, then
        filled to W + S - 1 rows, W + S or W + S + 1 and cut: done below W + S, refused with EVICTED from there."""
        full_at = self._full_at
        target = min(full_at - 1 + data.draw(st.integers(0, 2), label="rows from the last that truncates"),
                     self.config.capacity)
        if len(self.model.rows) > target:  # the edge is reached from below
            self._reset()
        while len(self.model.rows) < target:
            self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                                   "append a row")
        self._truncate(data.draw(st.integers(0, len(self.model.rows)), label="n"))

    def _truncate_rows_held_then_append(self, data: Draws) -> None:
        """A cache holding rows cut below its length (the rows after n removed), then a row at position n."""
        self.hold_rows(data)
        self._truncate(data.draw(st.integers(0, len(self.model.rows) - 1), label="n"))
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        due = self._due()  # a refused or replaced cut leaves the cache as it was, or a fresh one
        if due.kind is None:
            self._append_and_check(x, "append a row to a cache, cut")
        else:
            self._step(x, due, f"append a row to a {'stale' if self.model.stale else 'full'} cache, cut")

    def _truncate_a_stale_cache_then_append(self, data: Draws) -> None:
        self.hold_rows(data)
        self.write_weights_in_place(data)
        self._truncate(data.draw(st.integers(0, len(self.model.rows)), label="n"))
        x = data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row")
        due = self._due()  # not stale if the cut was refused or accepted unclaimed: the cache was replaced
        if due.kind is None:
            self._append_and_check(x, "append a row to a cache, cut")
        else:
            self._step(x, due, f"append a row to a {'stale' if self.model.stale else 'full'} cache, cut")

    def _truncate(self, n: object) -> None:
        what = f"truncate a cache of {len(self.model.rows)} rows to {n!r}"
        problem = g.length_problem(n, len(self.model.rows))  # of this state: a replayed n may land elsewhere
        until_full = Capability.WINDOW_TRUNCATES_UNTIL_FULL
        if problem is not None:
            due = Due.check(problem)
        elif self.window is not None and self.has(until_full) and len(self.model.rows) >= self._full_at:
            due = Due.check(ErrorKind.EVICTED, until_full.value)
        elif self.window is not None and not self._shows_rows_for(int(n)):  # type: ignore[call-overload]
            due = Due(may_refuse=ErrorKind.EVICTED)
        else:
            due = VALID
        judged = self.call(what, lambda: self.adapter.truncate(self.cache, n), due=due, inputs=Inputs(),
                           observe=lambda: observed(self._snapshot(self.cache, what)), replace=self._new_cache)
        if judged.to_judge:
            self.model.cut(int(n))  # type: ignore[call-overload]

    @property
    def _full_at(self) -> int:
        """The length from which a window cache declaring window_truncates_until_full refuses every truncation: W,
        or W + S where its sinks count (window_full_counts_sinks: a ring of W + S slots)."""
        assert self.window is not None
        return self.window + (self.sinks if self.has(Capability.WINDOW_FULL_COUNTS_SINKS) else 0)

    def _shows_rows_for(self, n: int) -> bool:
        """Whether the window cache's snapshot shows every row a query at position n sees: n-W+1 .. n-1, and the
        sinks."""
        assert self.window is not None
        shown_positions = set(self._snapshot(self.cache, "before truncating").positions.tolist())  # type: ignore
        return all(p in shown_positions for p in seen_by_next(n, self.window, self.sinks))

    # -- batch reorder -------------------------------------------------------------------------------------

    @rule(requires=[Capability.BATCH_REORDER], data=st.data())
    def reorder(self, data: Draws) -> None:
        """Batch row b becomes the old row indices[b], along the batch axis only; repeats and drops allowed.
        Invalid indices are INVALID_INDICES (where claimed), nothing changed. On purpose (B >= 2), valid indices
        that move a row, on rows held (one or two appended first if none are): a cache that gathers only part of
        what it holds (a quantized cache its full-precision rows) shows it only there; and so in a batch as large as
        the KV heads (a fresh cache where a select or repeat changed the configured one): a gather along the KV-head
        axis shows only there."""
        kv_heads = self.config.weights.kv_heads
        across = self.config.batch_size == kv_heads >= 2  # a fresh cache's batch is as large as the KV heads
        case = data.optional(g.on_purpose(*REORDERS), "reorders", REORDERS[0]) \
            if self.model.batch_size >= 2 or across else REORDERS[0]
        if case == REORDERS[2] and not across:
            case = REORDERS[1]
        if case == REORDERS[2] and self.model.batch_size != kv_heads:
            self._new_cache()  # (a select or repeat changed the batch)
        if case != REORDERS[0]:
            self.hold_rows(data)  # a stale cache is replaced: its batch is the configured one, maybe 1
        indices = data.draw(g.rearranging_reorders(self.model.batch_size) if case != REORDERS[0]
                            and self.model.batch_size >= 2 else self._any_indices(data)(self.model.batch_size),
                            label="indices")
        what = f"reorder the batch by {indices.description}"
        handed = Inputs()
        given = handed("indices", indices.value)
        due = Due.check(g.indices_problem(indices.value, self.model.batch_size))
        judged = self.call(what, lambda: self.adapter.reorder(self.cache, given), due=due, inputs=handed,
                           observe=lambda: observed(self._snapshot(self.cache, what)), replace=self._new_cache)
        if judged.to_judge:
            if due.kind is None and self.model.rows and self.model.batch_size == kv_heads >= 2 and \
                    list(np.asarray(indices.value)) != list(range(kv_heads)):
                self.exercised(BATCH_AS_LARGE_AS_THE_KV_HEADS)
            self.model.gather(np.asarray(indices.value, dtype=np.int64))

    def _any_indices(self, data: Draws) -> Callable[[int], Any]:
        """A reorder's indices where no other hard case was drawn: any, or on purpose (``NEGATIVE``) a negative
        index on rows held (drawn only when the strategy is asked for)."""
        def strategy(batch_size: int) -> Any:
            if data.optional(g.on_purpose(*NEGATIVE), "negative", NEGATIVE[0]) == NEGATIVE[1]:
                self.hold_rows(data)
                return g.negative_indices(self.model.batch_size)
            return g.batch_indices(batch_size)
        return strategy

    def _batch_indices(self, data: Draws, cases: tuple[str, ...], case_label: str,
                       on_purpose: tuple[Callable[[int], Any], ...], plain: Callable[[int], Any], label: str) -> Any:
        """Indices over the batch: ``plain(B)``'s, or on purpose (``cases[i]``, B >= 2) ``on_purpose[i - 1](B)``'s
        on rows held, one or two appended first if none are -- a select that keeps the leading rows whatever was
        asked shows only there."""
        chosen = cases.index(data.optional(g.on_purpose(*cases), case_label, cases[0])) \
            if self.model.batch_size >= 2 else 0
        if chosen:
            self.hold_rows(data)  # a stale cache is replaced: its batch is the configured one, maybe 1
        strategy = on_purpose[chosen - 1] if chosen and self.model.batch_size >= 2 else plain
        return data.draw(strategy(self.model.batch_size), label=label)

    # -- batch size ----------------------------------------------------------------------------------------

    @rule(requires=[Capability.BATCH_SELECT], data=st.data())
    def select(self, data: Draws) -> None:
        """Keep some batch rows, in order (finished sequences leave): the batch shrinks to them; every held row
        keeps its positions. Invalid indices are INVALID_INDICES (where validates_indices is claimed). On
        purpose (B >= 2), a valid selection other than the leading rows, on rows held (one or two appended first
        if none are): a select that keeps the first k rows whatever was asked shows only there."""
        indices = self._batch_indices(data, SELECTIONS, "selects", (g.non_prefix_selections,), g.batch_selections,
                                      "rows")
        self._regather(f"select the batch {indices.description}", indices.value,
                       g.selection_problem(indices.value, self.model.batch_size),
                       lambda given: self.adapter.select(self.cache, given), lambda: indices.value)

    @rule(requires=[Capability.BATCH_REPEAT], data=st.data())
    def repeat_interleave(self, data: Draws) -> None:
        """Every batch row r times in a row (beam expansion): the batch grows to B * r. A count that is not an
        int >= 1 is INVALID_INDICES (where validates_indices is claimed). On purpose (``REPEATS``), a count that
        grows the batch past the largest a cache is created with, after a repeat of 2 where the batch is 1."""
        largest = min(2 * g.MAX_BATCH, self.limits.max_batch or 2 * g.MAX_BATCH)
        if largest > g.MAX_BATCH and data.optional(g.on_purpose(*REPEATS), "repeats case", REPEATS[0]) == REPEATS[1]:
            if self.model.batch_size == 1:
                self._repeat(g.Argument(2, None, "repeats = 2"))
            grown = g.MAX_BATCH // self.model.batch_size + 1  # the least count past the largest created batch
            if grown <= min(3, largest // self.model.batch_size):
                count = data.draw(st.integers(grown, min(3, largest // self.model.batch_size)),
                                  label="repeats past the largest batch")
                self._repeat(g.Argument(count, None, f"repeats = {count}"))
                return
        self._repeat(data.draw(g.repeat_counts(self.model.batch_size, largest), label="repeats"))

    def _repeat(self, repeats: g.Argument) -> None:
        self._regather(f"repeat every batch row: {repeats.description}", repeats.value,
                       g.repeats_problem(repeats.value),
                       lambda given: self.adapter.repeat_interleave(self.cache, given),
                       lambda: np.repeat(np.arange(self.model.batch_size), int(repeats.value)))  # type: ignore

    def _regather(self, what: str, argument: object, problem: ErrorKind | None, action: Any,
                  gather: Any) -> None:
        """A call that gathers the batch anew (``gather()``: old row of each new one), judged as a reorder is."""
        handed = Inputs()
        given = handed("indices", argument)
        judged = self.call(what, lambda: action(given), due=Due.check(problem), inputs=handed,
                           observe=lambda: observed(self._snapshot(self.cache, what)), replace=self._new_cache)
        if judged.to_judge:
            self.model.gather(np.asarray(gather(), dtype=np.int64))

    # -- forks ---------------------------------------------------------------------------------------------

    @rule(requires=[Capability.FORK], data=st.data(), when=lambda self: len(self.parked) < MAX_PARKED)
    def fork(self, data: Draws) -> None:
        """An independent copy, showing exactly what the original shows; go on with either, park the other."""
        self._fork(data)

    @rule(requires=[Capability.FORK], data=st.data(), when=lambda self: len(self.parked) < MAX_PARKED
          and bool(self.model.rows) and not self.model.stale and not self.model.peaked)
    def fork_then_overwrite(self, data: Draws) -> None:
        """A fork, then the cache operated on reset and written again: the parked one must still show its rows
        bit for bit. (An append lands past what the other shows; a rewrite of row 0 is where a fork that
        aliases the buffers shows.)"""
        self._fork(data)
        self._reset()
        self._append_and_check(data.draw(g.rows(self.model.batch_size, self.config.model_width), label="row"),
                               "append a row after the reset")

    def _fork(self, data: Draws) -> None:
        what = "fork the cache"
        original = self._snapshot(self.cache, what)
        twin = self.call(what, lambda: self.adapter.fork(self.cache)).value
        copy = self._snapshot(twin, f"{what}: the copy")
        unchanged(shown(original), shown(copy), f"{what}: the copy", kind="fork differs from the original",
                  because="a fork must show exactly what the original shows")
        unchanged(shown(original), shown(self._snapshot(self.cache, what)), f"{what}: the original",
                  kind="forking changed the original", because="forking must not change the original")
        if data.draw(st.booleans(), label="go on with the copy"):
            self.parked.append(Parked(self.cache, self.model.copy(), original))
            self.cache = twin
        else:
            self.parked.append(Parked(twin, self.model.copy(), copy))

    @rule(data=st.data(), when=lambda self: bool(self.parked))
    def switch_cache(self, data: Draws) -> None:
        """Park the cache operated on; operate on a parked one."""
        index = data.choose(range(len(self.parked)), "parked cache")
        chosen = self.parked.pop(index)
        self.parked.append(Parked(self.cache, self.model, self._snapshot(self.cache, "park the cache")))
        self.cache, self.model = chosen.cache, chosen.model
