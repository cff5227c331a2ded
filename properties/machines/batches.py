"""The batches machine: rows at their own offsets, and batches that merge and split (docs/spec.md §13.8).

A ragged batch is a list of rows, each the list of tokens it appended since creation or reset, at its own
positions 0, 1, ...; the oracle computes each row on its own (``layer_model``'s oracle of a one-row cache). A
chunk appends a number of tokens of its own to every row (left-padded: the padding is never read); a merge
appends another batch's rows; extract, filter, select and repeat pick rows; truncation cuts every row (each to its
first n tokens, or under ``ragged_truncate = "columns"`` each by the longest row's last columns). After
every rule each row of the running batch shows exactly its own tokens' keys and values.

The cases servers meet are drawn on purpose (``RAGGED``, ``MERGES``, ``FILTERS``): a row empty beside a long
one, one token per row, under a window a decode beside a prefill, merges with and into a batch that holds no token
and of batches whose longest rows differ, filters to one row and to none; the layer's family (GQA included) is
drawn per example, as in the layer machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import Needs
from ..judge.calls import Inputs
from ..judge.calls import call as raw_call
from ..judge.checks import expect_success
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect, Observed, unchanged
from ..oracle import FLOAT64, NumberSystem
from ..protocol.declarations import declared_ragged_truncate
from ..protocol.kinds import Capability, ErrorKind
from ..traces.recording import Draws, initialize, invariant, rule
from .base import ConformanceMachine
from .layer_model import CacheModel, LayerOracle
from .layer_steps import layer_needs, other_geometries, rope_of_geometry

# The batch a ragged chunk is drawn to meet: the plain case first (where shrinking goes), then the hard ones.
RAGGED = ("any lengths", "one row empty beside a long one", "one token per row")
SHORTER = "an empty row given fewer tokens than the longest"  # truncate's cut between rows: by row and by columns
# keep the same tokens where the shorter row is empty, so a cache cutting the wrong way shows only beside a row that
# holds some
WINDOW_EDGE = "rows at, past and before the window's edge"  # a windowed batch's hard case: n = W, W + 1, 0
BESIDE_A_PREFILL = "one token per row beside a prefill"  # the window edge's chunk: each row holding tokens decodes
# one, padded beside an empty row given 2 or more (a decode and a prefill in one step, as continuous batching has)
PADDED_IN_THE_WINDOW = "a row padded in a chunk, its window reaching tokens it held"  # where a window counted in
# the padded layout's columns instead of the row's own positions hides some of them
MERGES = ("a batch holding tokens", "a batch holding no token", "into a batch holding no token",
          "into a batch of no rows")  # the last where batch_filter is declared: a filter to none first
UNEVEN = "a batch holding tokens into one holding tokens, the longest rows unequal"  # a merge's hard case: the
# shorter side's rows padded anew, before their tokens
UNEVEN_MET = "merge of batches holding tokens, the longest rows unequal"
FILTERS = ("any rows", "one row", "no rows", "invalid rows", "rows out of order")
FILTERS_DRAWN = (FILTERS[0], FILTERS[4], FILTERS[1], FILTERS[2], FILTERS[3])  # the order drawn (a later one is met
# less often in a derandomised run)
EXTRACTS = ("a valid row", "a row of a ragged batch", "an invalid row")
REORDERS = ("any indices", "a reorder moving ragged rows", "a negative index")
PAST_ROOM = ("any row", "a full row beside shorter ones")  # an append after which some row holds more than C
OTHER_LAYERS = ("a recreated layer", "another RoPE", "weights updated since",  # a merge of a cache bound elsewhere
                "another geometry")  # where the adapter's layer limits admit one (other_geometries)
BAD_SIZES = ("negative", "a bool", "a float", "a string", "None", "zero", "above the RoPE positions")
ZERO = 3  # how many times more often than each of the other problems a zero of either side is drawn
PAST = 2 * ZERO  # and the positions' check (under RoPE), as often as a zero of either side: the one way to meet it
LARGEST_BATCH = 2 * g.MAX_BATCH  # merges and repeats grow the batch to at most this many rows
UNSTORED = ("a ragged batch is judged under a storage whose scales are each row's own (scale none or per_group, "
            "docs/spec.md §13.8): a scale over the whole batch (per_tensor, per_channel) is not a scale of one row")


@dataclass(frozen=True)
class Aside:
    """A batch the machine no longer writes to, and what it showed when set aside: by a fork or an extract."""

    cache: Any
    then: Observed
    by: str  # "fork" or "extract"


class BatchesMachine(ConformanceMachine):
    """Drive a ragged batch of one layer -- chunks of per-row lengths, merges, extracts, filters, selects, repeats,
    truncations -- and check every row against the oracle of its own tokens."""

    @classmethod
    def needs(cls, **_: Any) -> Needs:
        needs = layer_needs(None, None, Capability.RAGGED_ROWS)
        return Needs(needs.capabilities, needs.alternatives, needs.layer_caches, needs.families, needs.why,
                     unstored=UNSTORED)

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__(adapter, numbers)
        self.families = tuple(g.layer_families(self.capabilities, self.limits))
        self.by_columns = declared_ragged_truncate(adapter) == "columns"

    # -- set-up ---------------------------------------------------------------------------------------

    @initialize(data=st.data())
    def build_layer_and_batch(self, data: Draws) -> None:
        """A layer of a family the adapter can build (GQA included), and a ragged batch of empty rows for it."""
        self.config = data.draw(g.layer_configs(self.capabilities, limits=self.limits, families=self.families,
                                                min_capacity=4), label="config")
        least = self.limits.min_window or 1
        # no window half the time: truncation is drawn only there; a window of 2 or more first (drawn more often):
        # a window of one sees its own token alone, where no window's edge falls between the tokens a row holds
        windows = sorted(range(least, max(least, 3) + 1), key=lambda w: w < 2)
        self.window = data.optional(st.sampled_from([*[None] * len(windows), *windows]), "window",
                                    None) if self.has(Capability.SLIDING_WINDOW_LAYER) else None
        self.oracle = LayerOracle(self.config, self.window, self.judge, self.has(Capability.KEYS_UNROTATED))
        self.weights = self.config.weights
        self.layer = self._create_layer(self.weights, self.config.rope, "create the layer")
        self.cache, self.rows = self._new_batch(self.config.batch_size)
        self.stale = False

    def _create_layer(self, weights: Any, rope: Any, what: str) -> Any:
        handed = Inputs()
        given = handed("weights", weights)
        return self.must(what, lambda: self.adapter.create_layer(given, rope), handed)

    def _new_batch(self, batch_size: int, what: str = "create a ragged cache") -> tuple[Any, list[CacheModel]]:
        cache = self.must(what, lambda: self._create(self.layer, batch_size))
        return cache, [CacheModel(self.weights, 1) for _ in range(batch_size)]

    def _create(self, layer: Any, batch_size: int) -> Any:
        """A ragged cache of the layer, of the batch's window if it has one (handed only then)."""
        if self.window is None:
            return self.adapter.create_ragged_cache(layer, batch_size, self.config.capacity)
        return self.adapter.create_ragged_cache(layer, batch_size, self.config.capacity, window=self.window)

    @property
    def grouped(self) -> bool:
        return self.config.weights.kv_heads < self.config.weights.heads

    @property
    def largest(self) -> int:
        return min(LARGEST_BATCH, self.limits.max_batch or LARGEST_BATCH)

    def _fresh_if_stale(self) -> None:
        if self.stale:
            self._replace()

    # -- chunks of per-row lengths --------------------------------------------------------------------

    @rule(data=st.data())
    def append_ragged(self, data: Draws) -> None:
        """A chunk of its own number of tokens for every row (0 included), left-padded: each row attends to its
        own tokens only, at its own positions; or REVISION_MISMATCH if stale. On purpose (``RAGGED``) one row left
        empty beside one filled as far as its room allows, or one token per row (a decode step); under a window,
        rows at, past and before its edge, then one token for each row holding some beside a prefill of the empty
        one (the rows decoding padded in the chunk)."""
        case = data.optional(g.on_purpose(RAGGED[0], *([WINDOW_EDGE] if self.window else []), *RAGGED[1:]), "ragged",
                             RAGGED[0])  # the window's edge first: a list's first entries are drawn more often
        if case == WINDOW_EDGE:
            case = BESIDE_A_PREFILL
            if self.largest >= 2:
                self._around_the_window_edge(data)
        elif case == RAGGED[2] and self.largest >= 2:
            self._offsets_with_room(data)
        held = {len(row.rows) for row in self.rows}
        if self.window and 0 in held and self.window in held and any(n > self.window for n in held):
            self.exercised(WINDOW_EDGE)
        self._append(data, self.cache, self.rows, case)

    def _around_the_window_edge(self, data: Draws) -> None:
        """A fresh batch of up to three rows: one holding W tokens (at the window's edge), one more than W (past
        it), one none (before it)."""
        assert self.window is not None
        self.cache, self.rows = self._new_batch(min(self.largest, 3))
        self.stale = False
        self._fill(data, [self.window, min(self.config.capacity, self.window + data.draw(
            st.integers(1, 2), label="past the edge by")), 0][:len(self.rows)])

    def _offsets_with_room(self, data: Draws) -> None:
        """Rows at different offsets, each with room for one more token, for certain: unless the batch has them, a
        fresh batch of two rows or more (the stale one replaced) and one row filled below its room."""
        held = [len(row.rows) for row in self.rows]
        if len(set(held)) > 1 and max(held) < self.config.capacity and not self.stale:
            return
        self.cache, self.rows = self._new_batch(min(self.largest, max(2, len(self.rows))))
        self.stale = False
        lengths = [0] * len(self.rows)
        lengths[data.draw(st.integers(0, len(self.rows) - 1), label="row filled")] = data.draw(
            st.integers(1, self.config.capacity - 1), label="tokens")
        self._fill(data, lengths)

    def _lengths(self, data: Draws, rows: list[CacheModel], case: str) -> list[int]:
        rooms = [min(g.MAX_CHUNK, self.config.capacity - len(row.rows)) for row in rows]
        if case == RAGGED[2]:
            return [min(1, room) for room in rooms]
        if case == BESIDE_A_PREFILL:
            return [min(1, room) if row.rows or room < 2 else data.draw(st.integers(2, room), label="prefill")
                    for row, room in zip(rows, rooms)]
        if case == SHORTER:
            longest = max(len(row.rows) for row in rows)
            return [data.draw(st.integers(1, min(room, longest - 1)), label="shorter")
                    if not row.rows and min(room, longest - 1) >= 1 else 0 for row, room in zip(rows, rooms)]
        if case == RAGGED[1] and len(rows) >= 2 and any(not row.rows for row in rows):
            empty = data.draw(st.sampled_from([b for b, row in enumerate(rows) if not row.rows]), label="empty row")
            long = max((b for b in range(len(rows)) if b != empty), key=lambda b: (rooms[b], -b))
            lengths = [0] * len(rows)
            lengths[long] = rooms[long]
            return lengths
        return [data.draw(st.integers(0, room), label="length") for room in rooms]

    def _append(self, data: Draws, cache: Any, rows: list[CacheModel], case: str, what: str = "",
                layer: Any = None) -> None:
        """One ragged chunk into ``cache`` (the running batch, or one about to be merged) whose rows are ``rows``,
        through ``layer`` (this one unless given: a recreated layer of equal values computes the same)."""
        layer = self.layer if layer is None else layer
        if case == RAGGED[1] and len(rows) >= 2 and cache is self.cache and all(row.rows for row in rows):
            self._reset()  # a row that holds no token, for certain
        lengths = self._lengths(data, rows, case)
        tokens = max([*lengths, 1]) + data.draw(st.integers(0, 1), label="padding columns")
        x = (data.draw(g.chunks(len(rows), tokens, self.config.model_width), label="chunk") if rows
             else np.zeros((0, tokens, self.config.model_width)))
        as_list = data.draw(st.booleans(), label="lengths as a list")
        argument: Any = list(lengths) if as_list else np.array(lengths, dtype=np.int64)
        stale = self.stale and cache is self.cache  # a batch to merge is always fresh
        what = what or f"append a ragged chunk of lengths {lengths} ({tokens} columns)"
        handed = Inputs()
        given_x, given_lengths = handed("x", x), handed("lengths", argument)
        due = Due.check(ErrorKind.REVISION_MISMATCH if stale else None)
        expected = [self._expected(row, x[b, tokens - length:]) if length and not stale else None
                    for b, (row, length) in enumerate(zip(rows, lengths))]
        judged = self.call(what, lambda: self.adapter.append_ragged(layer, cache, given_x, given_lengths),
                           due=due, inputs=handed, observe=lambda: self._observed(cache, what),
                           replace=self._replace if cache is self.cache else lambda: None)
        if not judged.to_judge or stale:
            return
        output = judged.value
        if not isinstance(output, np.ndarray) or output.shape != x.shape:
            raise NonConformance(f"{what}: output of shape {getattr(output, 'shape', None)}, but the chunk is "
                                 f"{x.shape}", kind="wrong output shape", check="output")
        # its last query sees tokens it held beyond the chunk's columns (a window counted in columns would not)
        padded = self.window is not None and any(0 < length < min(self.window, tokens) and len(row.rows) >= max(
            1, self.window - tokens + 1) for row, length in zip(rows, lengths))
        for b, (row, length) in enumerate(zip(rows, lengths)):
            if not length:
                continue
            trace, new_rows = expected[b]  # type: ignore[misc]
            wanted, tolerance = self.judge.bound(trace, lambda t: t.outputs[0, -length:, :])
            self.judge.close(output[b, tokens - length:], wanted, tolerance, what=f"{what}: row {b}'s output at "
                             f"positions {len(row.rows)} .. {len(row.rows) + length - 1}", check="output",
                             axes=("step row", "feature"))
            row.rows, row.trace = new_rows, trace
        self._note_ragged(rows, lengths)
        if padded:
            self.exercised(PADDED_IN_THE_WINDOW)

    def _expected(self, row: CacheModel, new: np.ndarray) -> tuple[Any, list[np.ndarray]]:
        rows = [*row.rows, *(new[t][None, :] for t in range(len(new)))]
        return self.oracle.reference(row, rows), rows

    def _note_ragged(self, rows: list[CacheModel], lengths: Sequence[int]) -> None:
        held = [len(row.rows) for row in rows]
        if len(set(held)) > 1:
            self.exercised("rows at different offsets")
            if self.window is not None and max(held) > self.window:
                self.exercised("rows at different offsets past a window")
            if self.grouped:
                self.exercised("rows at different offsets, grouped-query layer")
        if 0 in held and max(held, default=0) >= 3:
            self.exercised("a row empty beside a long one")
        if len(rows) >= 2 and all(length == 1 for length in lengths) and len(set(held)) > 1:
            self.exercised("one token per row at different offsets")

    @rule(data=st.data(), requires=[Capability.VALIDATES_LENGTH])
    def append_ragged_with_invalid_lengths(self, data: Draws) -> None:
        """Lengths that are not one int in [0, T] per row (one too few or too many, negative, above T, floats):
        INVALID_LENGTH, nothing changed."""
        rows = self.rows
        tokens = data.draw(st.integers(1, g.MAX_CHUNK), label="columns")
        problem = data.draw(st.sampled_from(["too few", "too many", "negative", "above T", "floats"]),
                            label="problem")
        valid = [0] * len(rows)
        value: Any
        if problem == "too few":
            value = valid[:-1] if rows else None
        elif problem == "too many":
            value = [*valid, 0]
        elif problem == "negative":
            value = [-1, *valid[1:]] if rows else None
        elif problem == "above T":
            value = [tokens + 1, *valid[1:]] if rows else None
        else:
            value = np.zeros(len(rows), dtype=np.float64) if rows else None
        if value is None:  # a batch of no rows: only one too many is invalid
            value = [0]
        x = (data.draw(g.chunks(len(rows), tokens, self.config.model_width), label="chunk") if rows
             else np.zeros((0, tokens, self.config.model_width)))
        what = f"append a ragged chunk with lengths {value!r} ({problem})"
        handed = Inputs()
        given_x, given_lengths = handed("x", x), handed("lengths", value)
        self.call(what, lambda: self.adapter.append_ragged(self.layer, self.cache, given_x, given_lengths),
                  due=Due.check(ErrorKind.INVALID_LENGTH), inputs=handed,
                  observe=lambda: self._observed(self.cache, what), replace=self._replace)

    @rule(data=st.data(), when=lambda self: bool(self.rows))
    def append_ragged_past_the_room(self, data: Draws) -> None:
        """A chunk after which one row would hold more than C tokens, the others within their room: FULL where
        fixed_capacity is claimed, nothing written (the rows that fit included). On purpose (``PAST_ROOM``) one
        token more for a row already full, beside shorter rows."""
        self._fresh_if_stale()
        case = data.optional(g.on_purpose(*PAST_ROOM), "past the room", PAST_ROOM[0])
        capacity = self.config.capacity
        row = data.draw(st.integers(0, len(self.rows) - 1), label="row past its room")
        if case == PAST_ROOM[1] and len(self.rows[row].rows) < capacity:  # fill it first, the others left as they are
            fill = [0] * len(self.rows)
            fill[row] = capacity - len(self.rows[row].rows)
            self._fill(data, fill)
        rooms = [capacity - len(r.rows) for r in self.rows]
        lengths = [data.draw(st.integers(0, min(room, g.MAX_CHUNK)), label="length") for room in rooms]
        lengths[row] = rooms[row] + data.draw(st.integers(1, 2), label="tokens past the room")
        tokens = max(lengths)
        x = data.draw(g.chunks(len(self.rows), tokens, self.config.model_width), label="chunk")
        what = f"append a ragged chunk of lengths {lengths} to rows of {[len(r.rows) for r in self.rows]} tokens " \
               f"(room for {capacity} each)"
        handed = Inputs()
        given_x, given_lengths = handed("x", x), handed("lengths", list(lengths))
        self.call(what, lambda: self.adapter.append_ragged(self.layer, self.cache, given_x, given_lengths),
                  due=Due.check(ErrorKind.FULL), inputs=handed, observe=lambda: self._observed(self.cache, what),
                  replace=self._replace)
        self.exercised("a row appended past its room")
        if len(self.rows[row].rows) == capacity and any(len(r.rows) < capacity for r in self.rows):
            self.exercised("a full row appended past its room beside shorter rows")

    def _fill(self, data: Draws, lengths: list[int], cache: Any = None, rows: list[CacheModel] | None = None,
              what: str = "filling a row") -> None:
        """Valid chunks of at most MAX_CHUNK tokens a row until each row ``b`` has appended ``lengths[b]`` more: to
        the running batch, or to ``cache`` whose rows are ``rows`` (a batch about to be merged)."""
        cache, rows = (self.cache, self.rows) if cache is None or rows is None else (cache, rows)
        left = list(lengths)
        while any(left):
            step = [min(n, g.MAX_CHUNK) for n in left]
            tokens = max(step)
            x = data.draw(g.chunks(len(rows), tokens, self.config.model_width), label="chunk")
            doing = f"append a ragged chunk of lengths {step} ({what})"
            handed = Inputs()
            given_x, given_lengths = handed("x", x), handed("lengths", list(step))
            expected = [self._expected(r, x[b, tokens - n:]) if n else None
                        for b, (r, n) in enumerate(zip(rows, step))]
            judged = self.call(doing, lambda: self.adapter.append_ragged(self.layer, cache, given_x,
                                                                         given_lengths), due=VALID, inputs=handed)
            output = judged.value
            for b, (r, n) in enumerate(zip(rows, step)):
                if n:
                    trace, new_rows = expected[b]  # type: ignore[misc]
                    wanted, tolerance = self.judge.bound(trace, lambda t: t.outputs[0, -n:, :])
                    self.judge.close(np.asarray(output)[b, tokens - n:], wanted, tolerance,
                                     what=f"{doing}: row {b}'s output", check="output", axes=("step row", "feature"))
                    r.rows, r.trace = new_rows, trace
            left = [n - m for n, m in zip(left, step)]

    @rule(data=st.data(), requires=[Capability.CREATION_ERRORS])
    def create_ragged_cache_of_invalid_size(self, data: Draws) -> None:
        """A batch size or capacity that is not a count (negative, a bool, a float, a string, None), zero, or a
        capacity above the RoPE positions: §4.2's kind, the running batch untouched."""
        past = self.config.rope is not None and self.limits.max_capacity is None  # (else outside the limits)
        # the rarer checks first: a derandomised run draws a list's first entries more often than its last
        # (problem, side): the zero's two sides interleaved, so each is met
        zeros = [(BAD_SIZES[5], "capacity"), (BAD_SIZES[5], "batch")] * ZERO
        problem, side = data.draw(st.sampled_from([*[(BAD_SIZES[6], "capacity")] * (PAST if past else 0),
                                                   *zeros, *((p, "") for p in BAD_SIZES[:5])]), label="problem")
        which = side or data.draw(st.sampled_from(["batch", "capacity"]), label="which")
        bad: Any = {"negative": -1, "a bool": True, "a float": 2.0, "a string": "2", "None": None, "zero": 0}.get(
            problem, None if self.config.rope is None else self.config.rope.max_positions + 1)
        kind = (ErrorKind.CAPACITY_EXCEEDS_POSITIONS if problem == BAD_SIZES[6]
                else ErrorKind.INVALID_ARGUMENT if problem != "zero"
                else ErrorKind.ZERO_BATCH if which == "batch" else ErrorKind.ZERO_CAPACITY)
        batch, capacity = (bad, self.config.capacity) if which == "batch" else (max(1, len(self.rows)), bad)
        what = f"create a ragged cache of batch {batch!r}, capacity {capacity!r} ({which}: {problem})"
        self.call(what, lambda: self.adapter.create_ragged_cache(self.layer, batch, capacity),
                  due=Due.check(kind, Capability.CREATION_ERRORS.value),
                  observe=lambda: self._observed(self.cache, what), replace=lambda: None)
        self.exercised(f"a ragged cache's creation rejected: {kind.value}")

    def _make_ragged(self, data: Draws) -> None:
        """Rows of different lengths, one holding tokens, for certain: unless the batch has them, a fresh batch of
        two rows or more (the stale one replaced) and a chunk leaving one row empty beside a long one."""
        if len({len(row.rows) for row in self.rows}) > 1 and not self.stale:
            return
        self.cache, self.rows = self._new_batch(min(self.largest, max(2, len(self.rows))))
        self.stale = False
        self._append(data, self.cache, self.rows, RAGGED[1])
        # judged here, so that a wrong chunk is blamed on the chunk, not on the extract, filter or reorder after it
        self._rows_match(self.cache, self.rows, "the ragged chunk appended first, to make rows of different lengths")

    # -- merge, extract, filter -----------------------------------------------------------------------

    @rule(data=st.data(), requires=[Capability.BATCH_MERGE], when=lambda self: len(self.rows) < self.largest)
    def merge(self, data: Draws) -> None:
        """Another batch of the layer (1 row or more, its own lengths) appended after the running one's rows,
        each row keeping its tokens. On purpose (``MERGES``) the other batch holds no token, or the running one
        holds none (reset first); or (``UNEVEN``) both hold tokens, the other's longest row shorter or longer than
        the running one's."""
        self._fresh_if_stale()
        if len(self.rows) >= self.largest:  # (a stale batch of no rows, replaced by one of a row, at max_batch 1)
            return
        case = data.optional(g.on_purpose(MERGES[0], UNEVEN, *MERGES[1:4 if self.has(Capability.BATCH_FILTER)
                                                                   else 3]), "merges", MERGES[0])
        if case == UNEVEN and not self.rows:  # a batch of no rows holds no token: a fresh one of a row, if it may
            if self.largest < 2:
                case = MERGES[0]
            else:
                self._replace()
        if case == UNEVEN and not any(row.rows for row in self.rows):  # one row holding 1 .. MAX_CHUNK tokens
            lengths = [0] * len(self.rows)
            lengths[data.draw(st.integers(0, len(self.rows) - 1), label="row filled")] = data.draw(
                st.integers(1, min(g.MAX_CHUNK, self.config.capacity)), label="tokens")
            self._fill(data, lengths)
        if case == MERGES[2] and any(row.rows for row in self.rows):
            self._reset()
        if case == MERGES[3] and self.rows:
            what = f"filter a batch of {len(self.rows)} to no rows (to merge into)"
            if self.call(what, lambda: self.adapter.filter(self.cache, []), due=VALID).to_judge:
                self.rows = []
        size = data.draw(st.integers(1, self.largest - len(self.rows)), label="other batch")
        other, other_rows = self._new_batch(size, "create the ragged cache to merge")
        if case == UNEVEN:  # its longest row shorter or longer than the running batch's, each side padded anew
            held = max(len(row.rows) for row in self.rows)
            longest = data.draw(st.sampled_from([n for n in range(1, min(self.config.capacity, held + g.MAX_CHUNK) + 1)
                                                 if n != held]), label="the other's longest")
            lengths = [data.draw(st.integers(0, longest), label="length") for _ in other_rows]
            lengths[data.draw(st.integers(0, size - 1), label="the other's longest row")] = longest
            self._fill(data, lengths, other, other_rows, "the batch to merge")
        elif case != MERGES[1]:
            for _ in range(data.draw(st.integers(1, 2), label="chunks of the other")):
                self._append(data, other, other_rows, data.draw(st.sampled_from(RAGGED), label="other's lengths"),
                             "append a ragged chunk to the batch to merge")
        if not any(row.rows for row in other_rows):
            self.exercised("merge of a batch holding no token")
        if not any(row.rows for row in self.rows):
            self.exercised("merge into a batch holding no token")
        if not self.rows:
            self.exercised("merge into a batch of no rows")
        if size != len(self.rows):
            self.exercised("merge of batches of different sizes")
        widths = {max((len(row.rows) for row in side), default=0) for side in (self.rows, other_rows)}
        if 0 not in widths and len(widths) > 1:
            self.exercised(UNEVEN_MET)
        what = f"merge a batch of {size} rows holding {[len(r.rows) for r in other_rows]} tokens into one of " \
               f"{[len(r.rows) for r in self.rows]}"
        judged = self.call(what, lambda: self.adapter.merge(self.cache, other), due=VALID,
                           observe=lambda: self._observed(self.cache, what), replace=self._replace)
        if judged.to_judge:
            self.rows = [*self.rows, *other_rows]

    @rule(data=st.data(), requires=[Capability.BATCH_MERGE], when=lambda self: len(self.rows) < self.largest)
    def merge_a_batch_of_another_layer(self, data: Draws) -> None:
        """A batch bound elsewhere (``OTHER_LAYERS``): created on a recreated layer of equal values
        (LAYER_MISMATCH), on the same parameters under another RoPE (ROPE_MISMATCH), on the layer after its
        weights were updated in place while the running batch was not (REVISION_MISMATCH), or on a layer of another
        model width, head count or head width (GEOMETRY_MISMATCH): refused where binding_checks is claimed, the
        running batch unchanged."""
        self._fresh_if_stale()
        if len(self.rows) >= self.largest:  # (a stale batch of no rows, replaced by one of a row, at max_batch 1)
            return
        # a RoPE layer is drawn two times in three: its own case half the time there, to be met as often
        cases = [*OTHER_LAYERS[:3], OTHER_LAYERS[1]] * 2 + [OTHER_LAYERS[1]] * 2 if self.config.rope is not None \
            else [OTHER_LAYERS[0], OTHER_LAYERS[2]]
        geometries = other_geometries(self.config, self.limits, self.has(Capability.GQA))
        if geometries:
            cases += [OTHER_LAYERS[3]] * max(1, len(cases) // 4)  # 2 of 12 under RoPE, 1 of 3 without
        case = data.draw(st.sampled_from(cases), label="other layer")
        size = data.draw(st.integers(1, self.largest - len(self.rows)), label="other batch")
        kind = ErrorKind.LAYER_MISMATCH
        if case == OTHER_LAYERS[0]:
            layer = self.must("recreate the layer", lambda: self.adapter.recreate_layer(self.layer))
        elif case == OTHER_LAYERS[1]:
            rope = self.config.rope
            assert rope is not None
            other_rope = replace(rope, base=rope.base * 2)
            layer = self.must("the layer under RoPE of base doubled",
                              lambda: self.adapter.with_rope(self.layer, other_rope))
            kind = ErrorKind.ROPE_MISMATCH
        elif case == OTHER_LAYERS[2]:
            self._update_weights(data)  # the running batch is stale; the batch to merge is not
            layer, kind = self.layer, ErrorKind.REVISION_MISMATCH
        else:
            change = data.choose(sorted(geometries), label="geometry change")
            width, heads, kv_heads, dh = geometries[change]
            weights = data.draw(g.attention_weights(width, heads, kv_heads, dh), label="other weights")
            layer = self._create_layer(weights, rope_of_geometry(self.config.rope, self.config.weights.head_width, dh),
                                       f"create a layer with another {change}")
            kind = ErrorKind.GEOMETRY_MISMATCH
        other = self.must("create the ragged cache of the other layer", lambda: self._create(layer, size))
        if case == OTHER_LAYERS[0] and data.draw(st.booleans(), label="tokens in the other"):
            self._append(data, other, [CacheModel(self.weights, 1) for _ in range(size)], RAGGED[0],
                         "append a ragged chunk to the batch of a recreated layer", layer=layer)
        what = f"merge a batch of {size} rows bound to {case} into one of {[len(r.rows) for r in self.rows]}"
        self.call(what, lambda: self.adapter.merge(self.cache, other), due=Due.check(kind),
                  observe=lambda: self._observed(self.cache, what), replace=self._replace)
        self.exercised(f"merge of a batch of another layer: {kind.value}")

    @rule(data=st.data(), requires=[Capability.BATCH_EXTRACT])
    def extract(self, data: Draws) -> None:
        """One row as a new batch of one, holding that row's tokens; the running batch unchanged. On purpose
        (``EXTRACTS``) a row holding tokens of a batch whose rows differ in length (made so first if they do not).
        An invalid row (negative, B or more, a float, a bool) is INVALID_INDICES where validates_indices is claimed.
        Then go on with either."""
        case = data.optional(g.on_purpose(*EXTRACTS), "extracts", EXTRACTS[0]) if self.rows else EXTRACTS[2]
        if case == EXTRACTS[1] and self.largest < 2:  # (a batch of one row at most: nothing ragged to extract from)
            case = EXTRACTS[0]
        if case == EXTRACTS[1]:
            self._make_ragged(data)
        size = len(self.rows)
        if case == EXTRACTS[0]:
            row: Any = data.draw(st.integers(0, size - 1), label="row")
        elif case == EXTRACTS[1]:
            row = data.draw(st.sampled_from([b for b, r in enumerate(self.rows) if r.rows]), label="row")
        else:
            row = data.draw(st.sampled_from([-1, size, size + 1, 0.0, True]), label="invalid row")
        what = f"extract row {row!r} of a batch of {size}"
        due = Due.check(ErrorKind.INVALID_INDICES if case == EXTRACTS[2] else None)
        judged = self.call(what, lambda: self.adapter.extract(self.cache, row), due=due,
                           observe=lambda: self._observed(self.cache, what), replace=self._replace)
        if not judged.to_judge or due.kind is not None:
            return
        single = [self.rows[row].copy()]
        self._rows_match(judged.value, single, f"{what}: the row extracted")
        if len(self.rows[row].rows) and len({len(r.rows) for r in self.rows}) > 1:
            self.exercised("extract of a row shorter or longer than another")
        if data.draw(st.booleans(), label="go on with the row"):
            self._rows_match(self.cache, self.rows, f"{what}: the batch")
            self.aside = Aside(self.cache, self._observed(self.cache, f"{what}: the batch set aside"), "extract")
            self.cache, self.rows = judged.value, single
        else:
            self.aside = Aside(judged.value, self._observed(judged.value, f"{what}: the row set aside"), "extract")

    @rule(data=st.data(), requires=[Capability.BATCH_FILTER], when=lambda self: bool(self.rows))
    def filter(self, data: Draws) -> None:
        """Keep some rows, in the order given (finished requests leave): one row, or none -- a batch of no rows,
        which later chunks and merges take. Rows that are not distinct ints in [0, B) (a repeat,
        negative, B or more, floats) are INVALID_INDICES where validates_indices is claimed."""
        size = len(self.rows)
        case = data.optional(g.on_purpose(*FILTERS_DRAWN), "filters", FILTERS[0])
        if case == FILTERS[4]:  # two rows or more holding tokens, kept in another order than theirs
            if self.largest < 2:
                case = FILTERS[0]
            else:
                self._make_ragged(data)
                size = len(self.rows)
        if case == FILTERS[3]:
            value: Any = data.draw(st.sampled_from(
                [[-1], [size], np.zeros(size, dtype=np.float64), [0, 0]]),
                label="invalid rows")
            due = Due.check(ErrorKind.INVALID_INDICES)
        else:
            if case == FILTERS[2]:
                kept: list[int] = []
            elif case == FILTERS[1]:
                kept = [data.draw(st.integers(0, size - 1), label="kept row")]
            elif case == FILTERS[4]:
                kept = data.draw(st.permutations(range(size)).map(  # never the identity: the draw shows the rows
                    lambda order: order if order != sorted(order) else order[::-1]), label="order")  # handed
            else:
                kept = data.draw(st.permutations(range(size)), label="order")[:data.draw(
                    st.integers(0, size), label="kept")]
            value = kept if data.draw(st.booleans(), label="as a list") else np.array(kept, dtype=np.int64)
            due = VALID
        what = f"filter a batch of {size} to rows {np.asarray(value).tolist()!r}"
        handed = Inputs()
        given = handed("rows", value)
        judged = self.call(what, lambda: self.adapter.filter(self.cache, given), due=due, inputs=handed,
                           observe=lambda: self._observed(self.cache, what), replace=self._replace)
        if judged.to_judge and due.kind is None:
            self.rows = [self.rows[b] for b in kept]
            self.exercised("filter to no rows" if not kept else "filter to one row" if len(kept) == 1
                           else "filter to rows")
            if kept != sorted(kept) and len({len(self.rows[j].rows) for j in range(len(kept))}) > 1:
                self.exercised("filter keeping rows of different lengths out of their order")

    # -- the batch operations of §13 on ragged rows ----------------------------------------------------

    @rule(data=st.data(), requires=[Capability.BATCH_SELECT], when=lambda self: bool(self.rows))
    def select(self, data: Draws) -> None:
        """A select of ragged rows: the rows kept keep their own tokens and lengths."""
        indices = data.draw(g.listed_or_not(g.batch_selections(len(self.rows))), label="rows")
        problem = g.selection_problem(indices.value, len(self.rows))
        self._pick(f"select the ragged rows {indices.description}", indices.value, problem,
                   lambda given: self.adapter.select(self.cache, given),
                   lambda: [int(i) for i in np.asarray(indices.value)])

    @rule(data=st.data(), requires=[Capability.BATCH_REPEAT], when=lambda self: 0 < len(self.rows) <= self.largest // 2)
    def repeat_interleave(self, data: Draws) -> None:
        """A repeat of ragged rows: every row, with its own tokens, r times in a row."""
        repeats = data.draw(g.repeat_counts(len(self.rows), self.largest), label="repeats")
        self._pick(f"repeat every ragged row: {repeats.description}", repeats.value, g.repeats_problem(repeats.value),
                   lambda given: self.adapter.repeat_interleave(self.cache, given),
                   lambda: [b for b in range(len(self.rows)) for _ in range(int(repeats.value))])  # type: ignore

    @rule(data=st.data(), requires=[Capability.BATCH_REORDER], when=lambda self: bool(self.rows))
    def reorder(self, data: Draws) -> None:
        """A reorder of ragged rows (§13.3: repeats and drops allowed): each row moves with its own tokens and
        length. On purpose (``REORDERS``), one that moves a row of a batch whose rows differ in length (made so
        first), and one with a negative index (a list or an array), which a gather wrapping it takes as a row."""
        case = data.optional(g.on_purpose(*REORDERS), "reorders", REORDERS[0])
        moving = case == REORDERS[1] and self.largest >= 2
        if moving:
            self._make_ragged(data)
        size = len(self.rows)
        drawn = g.rearranging_reorders(size) if moving else g.negative_indices(size) if case == REORDERS[2] \
            else g.batch_indices(size)
        indices = data.draw(g.listed_or_not(drawn), label="indices")
        problem = g.indices_problem(indices.value, size)
        lengths = [len(r.rows) for r in self.rows]
        self._pick(f"reorder the ragged rows {indices.description}", indices.value, problem,
                   lambda given: self.adapter.reorder(self.cache, given),
                   lambda: [int(i) for i in np.asarray(indices.value)])
        if problem is None and [lengths[int(i)] for i in np.asarray(indices.value)] != lengths:
            self.exercised("reorder moving rows of different lengths")

    @rule(data=st.data(), requires=[Capability.FORK])
    def fork(self, data: Draws) -> None:
        """A copy of the ragged batch showing exactly its rows; the machine goes on with either and sets the other
        aside: whatever is written to the one it goes on with never shows in the one set aside."""
        what = f"fork a ragged batch of rows of {[len(r.rows) for r in self.rows]} tokens"
        forked = self.call(what, lambda: self.adapter.fork(self.cache)).value
        rows = [row.copy() for row in self.rows]
        self._rows_match(forked, rows, f"{what}: the fork")
        if data.draw(st.booleans(), label="go on with the fork"):
            self.aside = Aside(self.cache, self._observed(self.cache, f"{what}: the original set aside"), "fork")
            self.cache, self.rows = forked, rows
        else:
            self.aside = Aside(forked, self._observed(forked, f"{what}: the fork set aside"), "fork")
        if len({len(r.rows) for r in self.rows}) > 1:
            self.exercised("fork of rows at different offsets")

    aside: Aside | None = None  # the batch the last fork or extract set aside, and what it showed then
    window: int | None = None  # each row's window (drawn at set-up where sliding_window_layer is declared)

    @invariant()
    def the_batch_set_aside_is_unchanged(self) -> None:
        """A fork and its original, an extracted row and its batch, are independent: the one set aside shows, bit
        for bit, what it showed then."""
        if self.aside is None:
            return
        by = self.aside.by
        what = f"the batch set aside at the last {by}"
        unchanged(self.aside.then, self._observed(self.aside.cache, what), what, kind=f"{by} not independent",
                  because=f"a write to either side of the {by} must not show in the other")

    def _pick(self, what: str, argument: object, problem: ErrorKind | None, action: Any, picked: Any) -> None:
        handed = Inputs()
        given = handed("indices", argument)
        judged = self.call(what, lambda: action(given), due=Due.check(problem), inputs=handed,
                           observe=lambda: self._observed(self.cache, what), replace=self._replace)
        if judged.to_judge and problem is None:
            self.rows = [self.rows[b].copy() for b in picked()]

    @rule(data=st.data(), requires=[Capability.TRUNCATE], when=lambda self: self.window is None)
    def truncate(self, data: Draws) -> None:
        """Every row keeps its first min(n, its length) tokens, n in [0, the longest row]; declared ragged_truncate
        "columns", every row drops its last longest - n tokens instead (all it holds if fewer); an invalid n is
        INVALID_LENGTH where validates_length is claimed."""
        between = data.optional(g.on_purpose("any n", "between two rows' lengths"), "cuts", "any n") != "any n"
        if between and self.largest >= 2:
            self._make_ragged(data)
            if not any(0 < len(row.rows) < max(len(r.rows) for r in self.rows) for row in self.rows):
                self._append(data, self.cache, self.rows, SHORTER)
        held = sorted(len(row.rows) for row in self.rows)
        longest = max(held, default=0)
        # n between the shortest and the longest row; by columns, the cut longest - n is (some row emptied, another
        # keeping some of its tokens)
        gaps = [longest - n if self.by_columns else n for n in range(1, longest) if held[0] < n < longest]
        n = (data.draw(st.sampled_from(sorted(gaps)).map(lambda v: g.Argument(v, None, f"n = {v}")),
                       label="n between")
             if between and gaps else data.draw(g.truncation_lengths(longest), label="n"))
        what = f"truncate ragged rows of {[len(r.rows) for r in self.rows]} tokens to {n.value!r}" + \
            (" columns" if self.by_columns else "")
        judged = self.call(what, lambda: self.adapter.truncate(self.cache, n.value),
                           due=Due.check(g.length_problem(n.value, longest)),
                           observe=lambda: self._observed(self.cache, what), replace=self._replace)
        if judged.to_judge and n.kind is None:
            bound = longest - int(n.value) if self.by_columns else int(n.value)  # type: ignore[call-overload]
            if any(len(row.rows) > bound for row in self.rows) and any(len(row.rows) < bound for row in self.rows):
                self.exercised("truncation shorter than one row, longer than another")
            for row in self.rows:
                row.cut(max(0, len(row.rows) - bound) if self.by_columns else min(bound, len(row.rows)))

    # -- lifecycle ------------------------------------------------------------------------------------

    @rule()
    def reset(self) -> None:
        """Every row emptied; the batch size and the binding kept."""
        self._reset()

    def _reset(self) -> None:
        self.call("reset the ragged cache", lambda: self.adapter.reset(self.cache))
        for row in self.rows:
            row.emptied()

    @rule(data=st.data())
    def update_weights_in_place(self, data: Draws) -> None:
        """An optimiser-like write into the layer's parameters: the batch is stale, its chunks REVISION_MISMATCH
        where binding_checks is claimed."""
        self._update_weights(data)

    def _update_weights(self, data: Draws) -> None:
        new = data.draw(g.weight_updates(self.weights), label="new weights")
        handed = Inputs()
        given = handed("weights", new)
        self.must("update the weights in place", lambda: self.adapter.update_weights(self.layer, given), handed)
        self.weights = new
        self.stale = True

    @rule(when=lambda self: self.stale)
    def replace_batch(self) -> None:
        """A fresh batch for the layer as it is now."""
        self._replace()

    def _replace(self) -> None:
        self.cache, self.rows = self._new_batch(max(1, len(self.rows)))
        self.stale = False  # its layer's parameters written in place since it was built (the whole batch's)

    # -- what a batch shows ---------------------------------------------------------------------------

    def _snapshot(self, cache: Any, what: str) -> list[Any]:
        rows = expect_success(raw_call(self.adapter, f"{what}: ragged snapshot",
                                       lambda: self.adapter.ragged_snapshot(cache)), f"{what}: ragged snapshot")
        try:
            return [(np.array(row.keys), np.array(row.values),
                     None if getattr(row, "positions", None) is None else np.array(row.positions)) for row in rows]
        except (AttributeError, TypeError) as error:
            raise NonConformance(f"{what}: a ragged snapshot is one object with keys and values per row: {error}",
                                 kind="malformed snapshot") from error

    def _observed(self, cache: Any, what: str) -> Observed:
        seen: dict[str, Any] = {}
        rows = self._snapshot(cache, what)
        seen["rows"] = len(rows)
        for b, (keys, values, positions) in enumerate(rows):
            seen[f"row {b} keys"], seen[f"row {b} values"] = keys, values
            if positions is not None:
                seen[f"row {b} positions"] = positions
        return seen

    def _rows_match(self, cache: Any, rows: list[CacheModel], what: str) -> None:
        shown = self._snapshot(cache, what)
        if len(shown) != len(rows):
            raise NonConformance(f"{what}: {len(shown)} rows shown, but the batch has {len(rows)}",
                                 kind="wrong batch size", check="batch size")
        kv, dh = self.config.weights.kv_heads, self.config.weights.head_width
        for b, ((keys, values, positions), row) in enumerate(zip(shown, rows)):
            at = self._positions_shown(positions, keys, row, f"{what}: row {b}")
            held, held_keys = self.oracle.held(row), self.oracle.held_keys(row)
            for name, actual, reference in (("keys", keys, held_keys), ("values", values, held)):
                rope = self.oracle.unrotated if name == "keys" and reference is not held else None
                shape = (kv, len(at), dh)
                if actual.shape != shape:
                    raise NonConformance(f"{what}: row {b} shows {name} of shape {actual.shape}, but it holds "
                                         f"{len(row.rows)} tokens, {len(at)} shown: {shape}",
                                         kind="wrong row length", check=f"cached {name}")
                if reference is None:
                    continue
                steps = self.oracle.steps(row, reference, name, rope)  # a declared storage's step per element
                expected, tolerance = self.judge.rows_bound(reference, lambda t: getattr(t, name)[0][:, at],
                                                            None if steps is None else steps[0][:, at])
                self.judge.close(actual, expected, tolerance, what=f"{what}: row {b}'s cached {name}",
                                 check=f"cached {name}", axes=("head", "position", "feature"))

    def _positions_shown(self, positions: np.ndarray | None, keys: np.ndarray, row: CacheModel,
                         what: str) -> np.ndarray:
        """The positions a row shows: all of its tokens ``0 .. n - 1`` where it gives none; under a window, those
        it gives, which must be distinct, increasing, below its length, and hold every position its next query
        sees (docs/spec.md §13.5, §13.8)."""
        length = len(row.rows)
        if positions is None:
            return np.arange(length)
        visible = range(max(0, length - self.window + 1), length) if self.window else range(length)
        if positions.ndim != 1 or positions.dtype.kind not in "iu" or positions.size != keys.shape[1] or (
                positions.size and (np.any(np.diff(positions) <= 0) or positions[0] < 0
                                    or positions[-1] >= length)) or not set(visible) <= set(positions.tolist()):
            raise NonConformance(f"{what} shows positions {positions.tolist()!r} of {length} tokens, but must show "
                                 f"{list(visible)} at least, increasing, below {length}", kind="wrong positions",
                                 check="positions")
        return positions.astype(np.int64)

    @invariant()
    def rows_match_oracle(self) -> None:
        """Every row of the running batch shows its own tokens' keys (§3) and values, and nothing else."""
        self.tape.expect("after the last step", expect=Expect.STATE.value, rows=[len(row.rows) for row in self.rows])
        self._rows_match(self.cache, self.rows, "after the last step")
