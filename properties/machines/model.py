"""The conformance machine of a whole model over sequences (docs/spec.md §15, capability ``whole_model``).

The model side is the oracle's cell model (``oracle.model.CellContext``) of the context under test, driven
alike: it says what each call is due (it refuses with the spec's kind before changing anything), and a valid
decode's logits are its own. For a low-precision adapter a second cell model computes the baseline that sets
the tolerance (docs/spec.md §15.6): the rounding errors any evaluation in the declared dtype may have, or with
a narrower ``kv_storage`` the naive computation in the dtype over what the cache stores.

Rules interleave, over two or three sequences: prompts, single tokens and batches mixing sequences (ids and
positions as Python or numpy ints); removals at the end, in the middle and of every sequence (ranges open at
any negative end); copies (whole and range, into empty and non-empty sequences); keeps, shifts, divides;
shifts past ``max_positions`` (outside the model: judged only by §5.1); saves and loads (the same id, another
id, the source changed since, a fresh context of another cell count); clears; malformed batches, batches past
the room, operations on unknown sequences; and, each set up whole in one rule, the chains engines get wrong (a
load where the room is short, a save with a move pending, a move then a batch past the room, three sequences
over one copy, a save after storage and position orders diverge: docs/spec.md §11.1); and, where the model has a
window, its edges (a sequence outgrowing it, then removals, shifts, divides, copies, saves and loads around the
oldest position its next token sees, and batches of sequences on both sides of it; where stores evict, a copied cell
evicted from its source while the copy still sees it). As declared: prompts
shared by several sequences (``multi_sequence_tokens``), batches longer than the engine's ``micro_batch``, every
empty sequence started at 0 (``positions: from_zero``), contexts that grow past their cells (``capacity:
grows``). Every logit asked for is
compared with the oracle, and after every rule every sequence's smallest and largest positions. A call that
raised must change nothing: the positions are compared at once, the cells by the logits of what comes next.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.models import MAX_PROMPT, POSITION_CEILING, context_cells
from ..generate.needs import ROPE_PAIRING, Needs
from ..judge.calls import Inputs
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect, Judged
from ..judge.tolerance import Judge, Reference
from ..oracle import FLOAT64, ModelBatch, NumberSystem, random_model_weights
from ..oracle.model import OUTSIDE, CellContext, Model, ModelRefusal, kv_storage_of, open_range
from ..protocol.kinds import Capability, ErrorKind
from ..protocol.model import ModelLimits, ModelPolicy
from ..traces.recording import Draws, NotApplicable, initialize, invariant, rule
from .base import ConformanceMachine

KINDS = {"full": ErrorKind.FULL, "malformed_batch": ErrorKind.MALFORMED_BATCH, "refused": ErrorKind.REFUSED}
MALFORMATIONS = ("token out of the vocabulary", "positions not consecutive", "unknown sequence",
                 "unknown sequence among several")  # the last: a token of several sequences, one not the context's
POSITIONS = "model_policy.positions"  # every program's starts and malformations are drawn under it
CAPACITY = "model_policy.capacity"  # and its fills and batches past the room
WINDOW_CELLS = "model_policy.window_cells"  # and how often its model is windowed
RANGES = ("all", "to the end", "from the start", "in the middle")
OPEN_ENDS = (-1, -2, -7)  # any negative end of a range is open (docs/spec.md §15.4), not -1 alone
INTS = {"int": int, "numpy.int64": np.int64, "numpy.int32": np.int32}  # a batch's ids and positions (§15.3)
CHANGES_AFTER_A_SAVE = ("clear", "remove", "shift", "decode")  # what a saved state must not see (§15.4)
# the declarations draws read (generate.needs.DECLARATIONS): a trace replays only where they admit its program
WHOLE_COPIES = ("model_policy.copy_unified whole_only", "model_policy.copy_per_sequence whole_only")
NEGATIVE_SHIFT = "model_policy.negative_shift"
SAVED = 3  # saved sequences kept for later loads
# chains set up on purpose: where a load meets a store too full for it, and where a state saved with a move
# pending is loaded
ROOM_AIMS = ("fits by freeing its own cells", "too full even so")
LOAD_PLACES = ("the same sequence", "another sequence", "a fresh context", "cells freed with the move pending")
# A save as it is, or on purpose followed at once by a load of it under another id: a context that keeps a loaded
# sequence where the saved one was (the first sequence's store, say) shows only there, and a load needs a save before
# it in the same program.
SAVES = ("a save", "a save, then a load of it under another id")
# Where declared (multi_sequence_tokens, a unified context), a batch of sequences at the same next position may open
# with a token all of them hold: a sequence's own token after it in the batch must see it (an engine masking a batch
# by equal sequence sets does not; met by shared_prompt alone before, that mutant was killed in 18 random ci runs of
# 20).
LEADS = ("own tokens only", "a shared token first")
SHARED_LEAD = "own tokens after a shared token in one batch"
# A keep, on purpose, of a sequence that shares cells with another (forked first where none does): the cells it
# shares leave the others (an engine clearing only the cells the kept sequence does not hold leaves them there).
KEEPS = ("any sequence holding cells", "a sequence sharing cells")
KEPT_SHARED = "kept a sequence sharing cells with another"
# what a sequence that outgrew its window undergoes, each where declared (the last two need another sequence)
WINDOW_CHANGES = (("remove to the end", Capability.SEQ_REMOVE), ("remove in the middle", Capability.SEQ_REMOVE),
                  ("last cells shifted back", Capability.SEQ_SHIFT), ("divided", Capability.SEQ_DIVIDE),
                  ("copied into another", Capability.SEQ_COPY),
                  ("saved, loaded under another id", Capability.SEQ_STATE))
WINDOW_CHANGES_TO_ANOTHER = ("copied into another", "saved, loaded under another id")

# -- the window's edges on purpose (issue 37): a windowed sequence outgrown, then each operation around the
# oldest position its next token sees (``edge``: max + 2 - W); the cases each rule counts (the exercise table's
# columns) --
BEYOND = (1, 3)  # a sequence outgrows the window to W + 1 or W + 3 positions
OUTGROWN, OUTGROWN_FAR = "window outgrown", "window outgrown by more than two"
CHUNK_AFTER = "chunk after the window was outgrown"
EDGE_REMOVALS = ("at the end", "in the middle")
REMOVED_ACROSS = {where: f"removal {where} across the window edge" for where in EDGE_REMOVALS}
SEEN_AGAIN = "cell out of the window seen again"  # a removal at the end brings older cells back into the window
MOVED_PARTS = ("the cells in the window", "the cells out of it")
MOVED_ACROSS = {"shift": "shift across the window edge", "divide": "divide across the window edge"}
COPIED_PARTS = ("whole", *MOVED_PARTS)
COPIED, COPIED_OUT = "copy of an outgrown sequence", "copy of the cells out of the window"
OUTGROWN_LOADS = ("itself, after more tokens", "another sequence", "a fresh context")
LOADED_INTO = {place: f"outgrown sequence loaded into {place}" for place in OUTGROWN_LOADS}
STRADDLING, CROSSING = "straddling batch", "straddling batch, a sequence crossing the edge in it"
# a cell two sequences share (a copy), evicted from one that outgrew its window while the other still sees it (issue 36:
# a store freeing it for every sequence survived 5 ci runs in 20); only where stores evict (window_cells: visible)
EVICTED_SHARED = "cell evicted from one sequence, another still seeing it"
WINDOW_EDGE_CASES = (OUTGROWN, OUTGROWN_FAR, CHUNK_AFTER, *REMOVED_ACROSS.values(), SEEN_AGAIN, *MOVED_ACROSS.values(),
                     COPIED, COPIED_OUT, *LOADED_INTO.values(), STRADDLING, CROSSING)


def _outgrowable(machine: ModelMachine) -> bool:
    """The drawn model has a window (drawn only where ``sliding_window`` is declared), and a store of the context
    holds a sequence past it with a cell to spare (W + 2 cells), or grows."""
    window = machine.config.window
    return window is not None and (machine.grows or machine.oracles[0].capacity >= window + 2)


def _edge_seen(machine: ModelMachine) -> bool:
    """As ``_outgrowable``, and a window of 2 or more: a next token sees some held cell, so an operation can move
    the edge across one."""
    return _outgrowable(machine) and (machine.config.window or 0) >= 2


class ModelMachine(ConformanceMachine):
    """Batches over several sequences and every sequence operation the adapter declares, against the cell
    model."""

    layer_caches = False  # a whole model's cache is judged by its dtype and kv_storage (docs/spec.md §15.6)

    @classmethod
    def needs(cls, **_: Any) -> Needs:
        return Needs.of(Capability.WHOLE_MODEL, alternatives=(("RoPE pairing", ROPE_PAIRING),))

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__(adapter, numbers)
        self.judge = Judge.for_model(adapter, numbers)
        self.policy = ModelPolicy.of(adapter)
        self.model_limits = ModelLimits.of(adapter)
        self.max_batch = min(self.model_limits.max_batch or 2 * MAX_PROMPT, 2 * MAX_PROMPT)

    # -- set-up ----------------------------------------------------------------------------------------------

    @initialize(data=st.data(), relies_on=[POSITIONS, CAPACITY, WINDOW_CELLS])
    def build_model_and_context(self, data: Draws) -> None:
        """A tiny model of a declared RoPE pairing, and a context of a declared kind (with 0-2 kept sink tokens, for
        a windowed model, where ``attention_sinks`` is declared)."""
        self.config = data.draw(g.model_configs(self.capabilities, self.model_limits,
                                                windowed_stores=self.policy.window_cells == "visible"), label="model")
        self.weights = random_model_weights(self.config, data.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.context_config = data.draw(g.context_configs(self.policy, self.model_limits), label="context")
        sinks = data.optional(g.context_sinks(self.capabilities, self.config), "sinks", 0)
        self.context_config = dataclasses.replace(self.context_config, sinks=sinks)
        kind = "unified" if self.context_config.unified else "per_sequence"
        unsunk = None if not sinks or self.has(Capability.ATTENTION_SINKS) else (
            f"{sinks} kept sink tokens, but attention_sinks is not declared")
        unkind = None if kind in self.policy.contexts else (
            f"a {kind} context, but model_policy contexts are {sorted(self.policy.contexts)}")
        outside = self.model_limits.model_problem(self.config) or self.model_limits.context_problem(
            self.context_config) or unkind or unsunk
        if outside is not None:  # only a replayed trace gives one: live draws stay within the declarations
            raise NotApplicable(f"the recorded model and context are outside what {self.adapter.name} declares: "
                                f"{outside}")
        handed = Inputs()
        given = handed("weights", self.weights)
        self.model = self.must("create the model", lambda: self.adapter.create_model(self.config, given), handed)
        self.judge = self.judge.for_weights(self.config, self.weights)  # a deep float64 model: by its estimate
        naive = self.judge.naive
        self.oracle_models = [Model(self.config, self.weights, numbers=self.judge.oracle)]
        if naive is not None:
            self.oracle_models.append(Model(self.config, self.weights, numbers=naive,
                                            kv_storage=kv_storage_of(self.judge.storage, naive)
                                            if self.judge.storage is not None else None))
        self.saved: list[tuple[Any, list[Any], int]] = []  # the adapter's state, the oracles', the cells saved
        self._new_context()

    def _new_context(self) -> None:
        """A new empty context under test, and its cell models."""
        config = self.context_config
        self.context = self.must("create a context", lambda: self.adapter.create_context(self.model, config))
        cells = self.must("the context's cells", lambda: self.adapter.context_cells(self.context))
        # a growing context reports the cells it has now, and they bound nothing (docs/spec.md §15.2)
        least = 0 if self.grows else config.stream_cells
        if not isinstance(cells, int) or isinstance(cells, bool) or cells < least:
            raise NonConformance(f"context_cells is {cells!r}, but a context of {config} has at least {least} cells "
                                 "per store", kind="too few cells", check="cells")
        self.tape.observe("context cells", cells)  # what is past the room depends on it: replay compares it
        copy = self.policy.copy_into_nonempty(config.unified)
        self.oracles = [CellContext(model, config, shared_copies=self.policy.shared_copies, copy_into_nonempty=copy,
                                    stream_cells=config.stream_cells if self.grows else cells, grows=self.grows,
                                    evicts=self.evicting) for model in self.oracle_models]
        # a shift or divide since the last decode: an engine that moves keys lazily (llama.cpp's K-shift, applied
        # at the next decode) still has it to apply
        self.move_pending = False

    @property
    def sequences(self) -> int:
        return self.context_config.max_sequences

    @property
    def grows(self) -> bool:
        """No capacity limit (``capacity: grows``): the cells a context was asked for are only what it starts with."""
        return self.policy.capacity == "grows"

    @property
    def evicting(self) -> bool:
        """A windowed model whose stores keep only what the window can still see (``window_cells: visible``)."""
        return self.policy.window_cells == "visible" and self.config.window is not None

    @property
    def whole_copies_only(self) -> bool:
        return self.policy.copy_into_nonempty(self.context_config.unified) == "whole_only"

    # -- judging one call ------------------------------------------------------------------------------------

    def _observe(self) -> dict[str, Any]:
        """What a call that raised must not change, as the adapter shows it: every sequence's positions."""
        seen: dict[str, Any] = {}
        for seq in range(self.sequences):
            seen[f"sequence {seq} pos_min"] = self.must("seq_pos_min", lambda: self.adapter.seq_pos_min(
                self.context, seq))
            seen[f"sequence {seq} pos_max"] = self.must("seq_pos_max", lambda: self.adapter.seq_pos_max(
                self.context, seq))
        return seen

    def _snapshot(self) -> list[Any]:
        # window_gone too: a refused removal must not give back a cell the windowed store had evicted
        return [([[(cell, cell.position, frozenset(cell.sequences), frozenset(cell.uncertain),
                    frozenset(cell.window_gone)) for cell in store]
                  for store in oracle.stores], {seq: set(p) for seq, p in oracle.evicted.items()}, set(oracle.filled))
                for oracle in self.oracles]

    def _restore(self, snapshot: list[Any]) -> None:
        for oracle, (stores, evicted, filled) in zip(self.oracles, snapshot):
            for store in stores:
                for cell, position, sequences, uncertain, window_gone in store:
                    cell.position, cell.sequences, cell.uncertain = position, set(sequences), set(uncertain)
                    cell.window_gone = set(window_gone)
            oracle.stores = [[cell for cell, *_ in store] for store in stores]
            oracle.evicted, oracle.filled = evicted, filled

    def _operation(self, what: str, on_oracle: Any, action: Any, *, inputs: Inputs | None = None,
                   may_refuse: ErrorKind | None = None, **details: Any) -> tuple[Judged, list[Any] | None]:
        """Do ``on_oracle`` to every cell model and judge the adapter's ``action`` by what the oracle did: valid
        (its results returned), or refused with its kind (changing nothing). A call accepted without the claim
        its refusal is judged under replaces the context."""
        __tracebackhide__ = True
        snapshot = self._snapshot()
        results: list[Any] | None
        for oracle in self.oracles:
            oracle.may_be_full = oracle.moved_unseen = False
        reach = None
        try:
            results = [on_oracle(oracle) for oracle in self.oracles]
            reach = self.oracles[0].reaches_evicted()
            due = self._windowed_due(may_refuse, reach)
        except ModelRefusal as refusal:  # outside the model: not judged but by §5.1
            results = None
            due = Due.outside(ErrorKind.REFUSED) if refusal.kind == OUTSIDE else Due.check(KINDS[refusal.kind])
        judged = self.call(what, action, due=due, inputs=inputs, observe=self._observe, replace=self._new_context,
                           **details)
        if judged.refused and results is not None:
            self._restore(snapshot)
            results = None
            if reach is not None:
                self.exercised("refused for an evicted cell")
        if results is not None and judged.to_judge:
            self._follow_evictions(what)
        return judged, results

    # -- windowed stores (model_policy window_cells, window_removal; sinks): docs/spec.md §15.2, §15.4 --

    def _windowed_due(self, may_refuse: ErrorKind | None, reach: str | None) -> Due:
        """What a valid call is due in a store that evicts, the oracle having done it over what is held: past the
        free cells it may be full (the engine may or may not make room by evicting); after it, if a later token
        would see a position evicted, it may be refused (an engine cannot bring an evicted cell back), and done,
        it is judged over what is held; if that position may have been evicted unseen (behind a sink), the call is
        outside what is judged (§5.1 only). Two refusals at once are not judged but by §5.1 either."""
        short = ErrorKind.FULL if self.oracles[0].may_be_full else None
        evicted = ErrorKind.REFUSED if reach else None
        kinds = {kind for kind in (may_refuse, short, evicted) if kind is not None}
        if reach == "uncertain" or len(kinds) > 1:
            return Due.outside(ErrorKind.REFUSED)
        return VALID if not kinds else Due(may_refuse=kinds.pop())

    def _follow_evictions(self, what: str) -> None:
        """After a call done, each sequence's ``seq_pos_min`` says what its store evicted: judged legal (only cells no
        later token sees, oldest first, never a sink nor the last cell), then the oracle follows it."""
        if not self.evicting:
            return
        for seq in range(self.sequences):
            reported = self.must("seq_pos_min", lambda: self.adapter.seq_pos_min(self.context, seq))
            if not isinstance(reported, (int, np.integer)) or isinstance(reported, bool):
                return  # the invariant reports it
            before = len(self.oracles[0].evicted.get(seq, ()))
            for oracle in self.oracles:
                problem = oracle.follow_eviction(seq, int(reported))
                if problem is not None:
                    raise NonConformance(f"after {what}: {problem}", kind="evicted a cell still seen",
                                         check="eviction")
            if len(self.oracles[0].evicted.get(seq, ())) > before:
                self.exercised("window outgrown")

    # -- batches ---------------------------------------------------------------------------------------------

    def _next_position(self, seq: int, data: Draws) -> int:
        """Where ``seq``'s next token goes: after its largest position; an empty sequence starts at 0-3, or at 0 where
        the engine numbers positions itself (``positions: from_zero``)."""
        held = self.oracles[0].pos_max(seq)
        latest = 0 if self.policy.positions == "from_zero" else 3
        return held + 1 if held >= 0 else data.draw(st.integers(0, latest), label=f"sequence {seq} starts at")

    def _batch(self, data: Draws, chosen: list[int], counts: list[int], *, mixed: bool,
               lead: tuple[int, ...] = ()) -> ModelBatch:
        """``counts[i]`` tokens of sequence ``chosen[i]`` at its next positions, in order or interleaved; first, where
        ``lead`` names sequences at the same next position (``_sharing_a_position``), a token that is one cell all of
        them hold, their own tokens after."""
        leading: list[tuple[int, int, Any]] = []
        starts: dict[int, int] = {}
        if lead:
            start = self._next_position(lead[0], data)
            token = data.draw(st.integers(0, self.config.vocab - 1), label="shared lead token")
            leading = [(token, start, lead)]
            starts = {seq: start + 1 for seq in lead}
        parts = []
        for seq, count in zip(chosen, counts):
            start = starts[seq] if seq in starts else self._next_position(seq, data)
            count = max(1, min(count, POSITION_CEILING - start))
            tokens = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                               label=f"sequence {seq} tokens")
            parts.append([(t, start + i, seq) for i, t in enumerate(tokens)])
        order = [entry for part in parts for entry in part]
        if mixed and len(parts) > 1:  # round robin: each sequence's positions still in order
            order = [part[i] for i in range(max(map(len, parts))) for part in parts if i < len(part)]
        order = [*leading, *order]
        order = order[:self.max_batch]
        wanted = data.draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order)), label="logits of")
        wanted[-1] = True  # at least the last token's logits, as a sampler asks
        # token ids and positions as a numpy pipeline hands them (argmax, arange), or Python ints
        as_int = INTS[data.optional(st.sampled_from(sorted(INTS)), "ints", "int")]
        return ModelBatch(tuple(as_int(t) for t, _, _ in order), tuple(as_int(p) for _, p, _ in order),
                          tuple(s for _, _, s in order), tuple(wanted))

    def _decode(self, what: str, batch: ModelBatch) -> bool:
        """Decode ``batch``: the oracle's logits of every token asked for, or the oracle's refusal; whether they were
        judged."""
        handed = Inputs()
        given = handed("batch", batch)
        met = self._window_cases(batch)
        judged, results = self._operation(what, lambda oracle: oracle.decode(batch),
                                          lambda: self.adapter.decode_batch(self.context, given), inputs=handed,
                                          tokens=list(batch.tokens), positions=list(batch.positions),
                                          sequences=list(batch.sequences))
        if results is None:
            return False
        self.move_pending = False
        if not judged.to_judge:
            return False
        for case in met:
            self.exercised(case)
        expected, tolerance = self.judge.bound(Reference(results[0], results[1] if len(results) > 1 else None),
                                               lambda logits: logits)
        self.judge.close(judged.value, expected, tolerance, what=f"{what}: logits", check="logits",
                         axes=("token asked for", "vocab id"))
        return True

    def _decode_after(self, lead: tuple[int, ...], what: str, batch: ModelBatch) -> None:
        """``_decode``, of a batch that opens with a token of the sequences ``lead`` where any (``_lead``)."""
        if self._decode(what + (f" after a token of {list(lead)}" if lead else ""), batch) and lead:
            self.exercised(SHARED_LEAD)

    def _sharing_a_position(self, chosen: list[int]) -> tuple[int, ...]:
        """The most of ``chosen`` (two or more) whose next tokens may be one cell all of them hold: empty, or holding
        the same largest position (after a copy, say), with room for positions after it and for a shared token and
        one of each; none unless the context is unified (one store)."""
        if not self.context_config.unified:
            return ()
        groups: dict[int, list[int]] = {}
        for seq in chosen:
            groups.setdefault(self.oracles[0].pos_max(seq), []).append(seq)
        best = max(groups.values(), key=len)
        oracle = self.oracles[0]
        top, free = oracle.pos_max(best[0]), oracle.free(oracle.store_of(best[0]))
        fits = self.grows or free > len(best)  # the shared token and one of each after it
        return tuple(sorted(best)) if len(best) > 1 and fits and top + 1 + 3 + MAX_PROMPT < POSITION_CEILING else ()

    def _lead(self, data: Draws, chosen: list[int]) -> tuple[int, ...]:
        """The sequences of ``chosen`` a batch opens with a token of, on purpose half the time where they may and
        ``multi_sequence_tokens`` is declared (``LEADS``, plain first: with the hard case first the derandomised
        window-edge run of tests/test_model_chains.py never ran move_across_the_window_edge); none otherwise."""
        lead = self._sharing_a_position(chosen)
        if not lead:
            return ()
        offered = LEADS if self.has(Capability.MULTI_SEQUENCE_TOKENS) else LEADS[:1]
        choice = data.optional(st.sampled_from(offered), "lead", LEADS[0])
        if choice not in offered:  # only a replayed trace gives one: the live draw is of what is declared
            raise NotApplicable(f"the recorded batch opens with a token of several sequences, but {self.adapter.name}"
                                " does not declare multi_sequence_tokens")
        return lead if choice == LEADS[1] else ()

    def _a_sequence(self, data: Draws, label: str = "sequence") -> int:
        return data.draw(st.integers(0, self.sequences - 1), label=label)

    @rule(data=st.data())
    def prompt(self, data: Draws) -> None:
        """Several tokens of one sequence in one batch, at its next positions."""
        seq = self._a_sequence(data)
        self._decode(f"prompt of sequence {seq}", self._batch(
            data, [seq], [data.draw(st.integers(2, MAX_PROMPT), label="tokens")], mixed=False))

    @rule(data=st.data())
    def single_token(self, data: Draws) -> None:
        """One token of one sequence."""
        seq = self._a_sequence(data)
        self._decode(f"one token of sequence {seq}", self._batch(data, [seq], [1], mixed=False))

    @rule(data=st.data())
    def batch_mixing_sequences(self, data: Draws) -> None:
        """Tokens of two or more sequences in one batch, in sequence order or interleaved: each sees only its
        own sequence's cells and its own earlier tokens in the batch."""
        lead = self._lead(data, list(range(self.sequences)))  # on purpose, those that may share a token first
        chosen = data.draw(st.lists(st.integers(0, self.sequences - 1), min_size=2, max_size=self.sequences,
                                    unique=True), label="sequences")
        chosen = [*lead, *(seq for seq in chosen if seq not in lead)]
        counts = data.draw(st.lists(st.integers(1, 2), min_size=len(chosen), max_size=len(chosen)), label="counts")
        # a per-sequence context splits an interleaved batch by store, and must return its logits in batch order
        interleaved = data.draw(st.booleans() if self.context_config.unified else st.sampled_from((False, True, True)),
                                label="interleaved")
        if interleaved and not self.context_config.unified:
            self.exercised("interleaved in a per-sequence context")
        oracle = self.oracles[0]
        if lead and not self.grows and 1 + sum(counts) > oracle.free(oracle.store_of(lead[0])):
            chosen, counts = list(lead), [1] * len(lead)  # what fits: the shared token and one of each after it
        self._decode_after(lead, f"a batch of sequences {chosen}",
                           self._batch(data, chosen, counts, mixed=interleaved, lead=lead))

    @rule(data=st.data(), requires=[Capability.MULTI_SEQUENCE_TOKENS],
          when=lambda self: self.context_config.unified and self.sequences > 1)
    def shared_prompt(self, data: Draws) -> None:
        """A prompt decoded once for two or three empty sequences (every context cleared first if fewer are
        empty): each token one cell all of them hold (llama.cpp's ``n_seq_id > 1``), then, in the same batch or
        not at all, a token of each of its own. Each sees the shared cells; later operations on one leave the
        others holding them, as after a shared copy."""
        empty = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) < 0]
        if len(empty) < 2:
            self._operation("clear", lambda o: o.clear(), lambda: self.adapter.clear(self.context))
            empty = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) < 0]
            if len(empty) < 2:  # the clear raised: nothing to share
                return
        sharing = tuple(sorted(data.draw(st.lists(st.sampled_from(empty), min_size=2, max_size=len(empty),
                                                  unique=True), label="sharing")))
        # Own tokens after the prompt in its batch three times in four: a token that misses the shared cells before
        # it in the same batch shows only there, and this rule is all that draws tokens of several sequences.
        own = data.draw(st.sampled_from((False, True, True, True)), label="own tokens after")
        most = max(1, min(MAX_PROMPT, self.max_batch - (len(sharing) if own else 0)))
        count = data.draw(st.integers(1, most), label="tokens")
        start = self._next_position(sharing[0], data)
        shared = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                           label="shared tokens")
        entries: list[tuple[int, int, Any]] = [(t, start + i, sharing) for i, t in enumerate(shared)]
        if own and count + len(sharing) <= self.max_batch:
            after = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=len(sharing),
                                       max_size=len(sharing)), label="own tokens")
            entries += [(t, start + count, seq) for t, seq in zip(after, sharing)]
        wanted = data.draw(st.lists(st.booleans(), min_size=len(entries), max_size=len(entries)), label="logits of")
        wanted[-1] = True
        self.exercised("prompt shared by several sequences")
        self._decode(f"a prompt shared by sequences {list(sharing)}",
                     ModelBatch(tuple(t for t, _, _ in entries), tuple(p for _, p, _ in entries),
                                tuple(s for _, _, s in entries), tuple(wanted)))

    @rule(data=st.data(), when=lambda self: self.model_limits.micro_batch is not None)
    def batch_across_micro_batches(self, data: Draws) -> None:
        """A batch longer than the declared micro_batch u (u + 1 to 2u + 1 tokens, of one sequence or several,
        in order or interleaved), which the engine computes in parts: each part sees the parts before it, the
        logits come back in batch order, and a part without room undoes the parts before it (all or nothing)."""
        micro = self.model_limits.micro_batch or 1
        total = data.draw(st.integers(micro + 1, max(micro + 1, min(2 * micro + 1, self.max_batch))), label="tokens")
        chosen = data.draw(st.lists(st.integers(0, self.sequences - 1), min_size=1,
                                    max_size=min(self.sequences, total), unique=True), label="sequences")
        counts = [total // len(chosen) + (i < total % len(chosen)) for i in range(len(chosen))]
        batch = self._batch(data, chosen, counts, mixed=data.draw(st.booleans(), label="interleaved"))
        if len(batch.tokens) > micro:
            oracle = self.oracles[0]
            room = min(oracle.free(oracle.store_of(seq)) for seq in chosen)
            self.exercised("batch split into micro-batches" if len(batch.tokens) <= room or self.grows
                           else "batch split into micro-batches, past the room")
        self._decode(f"a batch of {len(batch.tokens)} tokens of sequences {chosen}, past the micro-batch of {micro}",
                     batch)

    @rule(data=st.data())
    def malformed_batch(self, data: Draws) -> None:
        """A batch with a token outside the vocabulary, positions that do not run on one by one, or an unknown
        sequence (alone, or among the sequences of a token of several, where ``multi_sequence_tokens`` is declared):
        malformed_batch (judged with validates_model_batch), changing nothing. Where the engine numbers
        positions itself (``positions: from_zero``) it cannot be handed positions, so none that do not run on."""
        seq = self._a_sequence(data)
        batch = self._batch(data, [seq], [data.draw(st.integers(1, 3), label="tokens")], mixed=False)
        offered = [m for m in MALFORMATIONS if (m != MALFORMATIONS[1] or self.policy.positions == "given") and (
            m != MALFORMATIONS[3] or (self.has(Capability.MULTI_SEQUENCE_TOKENS) and self.context_config.unified))]
        problem = data.draw(st.sampled_from(offered), label="malformation")
        index = data.draw(st.integers(0, len(batch.tokens) - 1), label="index")
        fields = {"tokens": list(batch.tokens), "positions": list(batch.positions), "sequences": list(batch.sequences)}
        if problem == MALFORMATIONS[0]:
            fields["tokens"][index] = data.draw(st.sampled_from([self.config.vocab, self.config.vocab + 3, -1]),
                                                label="token")
        elif problem == MALFORMATIONS[1]:
            held = self.oracles[0].pos_max(seq) >= 0
            index = index if held or index > 0 else len(batch.tokens) - 1  # an empty sequence may start anywhere
            if not held and len(batch.tokens) == 1:
                fields["positions"] = [batch.positions[0], batch.positions[0] + 2]
                fields["tokens"], fields["sequences"] = [batch.tokens[0]] * 2, [seq] * 2
                batch = ModelBatch(batch.tokens * 2, batch.positions * 2, batch.sequences * 2, (True, True))
            else:
                fields["positions"][index] += data.draw(st.sampled_from([1, 2]), label="gap")
        else:
            bad = data.draw(st.sampled_from([self.sequences, self.sequences + 1, -1]), label="sequence id")
            fields["sequences"][index] = bad if problem == MALFORMATIONS[2] else (seq, bad)
        broken = ModelBatch(tuple(fields["tokens"]), tuple(fields["positions"]), tuple(fields["sequences"]),
                            batch.logits[:len(fields["tokens"])])
        self._decode(f"a batch with {problem}", broken)

    @rule(data=st.data())
    def batch_past_the_room(self, data: Draws) -> None:
        """More tokens for one sequence's store than it has free cells: full (judged with fixed_capacity),
        changing nothing; declared capacity grows, past the cells the context was asked for, and it must succeed."""
        self._past_the_room(data, self._a_sequence(data))

    def _past_the_room(self, data: Draws, seq: int) -> None:
        """A batch of ``seq`` one or two tokens past its store's free cells; a store with more free cells than a
        batch holds is filled first (from the context's real cell count, ``context_cells``)."""
        oracle = self.oracles[0]
        if oracle.free(oracle.store_of(seq)) + 1 > self.max_batch and data.optional(
                st.just(True), "fill the store first", False):  # a trace of an earlier suite did not
            self._fill(data, seq, self.max_batch - 2, self._sharing_the_store(seq))
            oracle = self.oracles[0]
        free = oracle.free(oracle.store_of(seq))  # growing: below 0 once past the cells asked for
        start = self._next_position(seq, data)
        count = max(free, 0) + data.draw(st.integers(1, 2), label="past the room by")
        if count > self.max_batch or start + count > POSITION_CEILING:
            return  # not drawable within max_batch and the positions: nothing asked
        tokens = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                           label="tokens")
        if self.grows:
            self.exercised("grown past the cells asked for")
        elif self.model_limits.micro_batch is not None and free >= self.model_limits.micro_batch:
            self.exercised("room exceeded after a micro-batch that fits")
        else:
            self.exercised("room exceeded with a move pending" if self.move_pending else "room exceeded")
        self._decode(f"{count} tokens into sequence {seq} with {free} free cells",
                     ModelBatch.of_sequence(seq, tokens, start, all_logits=False))

    def _sharing_the_store(self, seq: int) -> list[int]:
        """``seq``, then the other sequences whose cells are in its store (a unified context's: all)."""
        oracle = self.oracles[0]
        return [seq, *(s for s in range(self.sequences) if s != seq and oracle.store_of(s) is oracle.store_of(seq))]

    def _fill(self, data: Draws, seq: int, leave: int, into: list[int]) -> None:
        """Tokens of the sequences ``into`` (in ``seq``'s store) decoded until that store has at most ``leave``
        free cells, as far as the positions and the batch size allow."""
        for target in into:
            for _ in range(POSITION_CEILING):  # each pass decodes at least one token, or stops
                oracle = self.oracles[0]
                free = oracle.free(oracle.store_of(seq))
                if free <= leave or oracle.pos_max(target) + 1 >= POSITION_CEILING:
                    break
                self._decode(f"tokens of sequence {target} filling its store",
                             self._batch(data, [target], [min(free - leave, self.max_batch)], mixed=False))
                if self.oracles[0].free(self.oracles[0].store_of(seq)) == free:
                    return  # nothing decoded (refused, or replaced): the chain goes on from here

    def _decode_one(self, data: Draws, seq: int) -> None:
        self._decode(f"one token of sequence {seq}", self._batch(data, [seq], [1], mixed=False))

    def _held(self, data: Draws, seq: int, at_least: int = 2) -> None:
        """``seq`` prompted first if it holds fewer than ``at_least`` cells (as far as its store has room)."""
        oracle = self.oracles[0]
        missing = at_least - len(oracle.cells_of(seq))
        free = POSITION_CEILING if self.grows else oracle.free(oracle.store_of(seq))
        room = min(free, POSITION_CEILING - 1 - oracle.pos_max(seq) - 3)
        if missing > 0 and room > 0:
            count = min(max(missing, data.draw(st.integers(1, MAX_PROMPT), label="tokens")), room)
            self._decode(f"prompt of sequence {seq}", self._batch(data, [seq], [count], mixed=False))

    # -- sequence operations -----------------------------------------------------------------------------------

    def _range(self, data: Draws, seq: int) -> tuple[int, int]:
        """A position range ``[p0, p1)`` around ``seq``'s cells, any negative end open (-1 or below: an engine
        reading only -1 as open is caught); ``[-1, 0)`` is empty."""
        top = max(self.oracles[0].pos_max(seq), 0) + 2
        kind = data.draw(st.sampled_from(RANGES), label="range")

        def open_end(which: str) -> int:
            return int(data.optional(st.sampled_from(OPEN_ENDS), f"open {which}", -1))

        if kind == "all":
            return open_end("p0"), open_end("p1")
        p = data.draw(st.integers(0, top), label="p")
        if kind == "to the end":
            return p, open_end("p1")
        if kind == "from the start":
            return open_end("p0"), p
        return p, p + data.draw(st.integers(1, 3), label="width")

    def _sequence_call(self, operation: str, what: str, on_oracle: Any, action: Any,
                       **details: Any) -> tuple[Judged, list[Any] | None]:
        return self._operation(what, on_oracle, action, may_refuse=self._may_refuse(operation, details), **details)

    def _may_refuse(self, operation: str, arguments: dict[str, Any]) -> ErrorKind | None:
        """The kind a valid sequence operation may still be refused with, as ``model_policy`` declares (each such
        declaration is judged here alone; the suite then expects refusal, changing nothing, or success):

        - ``refuses_shift``: a shift or divide, while ``can_shift`` is false;
        - ``removal: end_only``: a removal that would leave a cell of its sequence (of any, ``seq < 0``) at a
          position past the range; a removal to the end, or of every cell the sequence holds, must succeed.
        """
        if operation in ("shift", "divide") and self.policy.refuses_shift and not self.must(
                "can_shift", lambda: self.adapter.can_shift(self.context)):
            return ErrorKind.REFUSED
        if operation == "remove" and self.policy.removal == "end_only":
            seq, p1 = arguments["seq"], arguments["p1"]
            held = range(self.sequences) if seq < 0 else (seq,)
            if p1 >= 0 and any(self.oracles[0].pos_max(s) >= p1 for s in held):
                return ErrorKind.REFUSED
        if operation == "remove" and self.policy.window_removal == "until_full":
            return self._ring_may_refuse(arguments["seq"], arguments["p0"], arguments["p1"])
        return None

    def _ring_may_refuse(self, seq: int, p0: int, p1: int) -> ErrorKind | None:
        """``window_removal: until_full``: a removal to the end that leaves a cell of a sequence that has held W tokens
        (or may have evicted one) may be refused; one of every cell held must succeed."""
        oracle = self.oracles[0]
        rings = [s for s in (range(self.sequences) if seq < 0 else (seq,)) if oracle.has_filled(s)
                 and any(c.position < max(p0, 0) for c in oracle.cells_of(s))]
        return ErrorKind.REFUSED if p1 < 0 and rings else None

    @rule(data=st.data(), requires=[Capability.SEQ_REMOVE])
    def remove(self, data: Draws) -> None:
        """A position range of one sequence (or of every sequence, -1) removed: at the end, from the start, in
        the middle, or all of it; a cell another sequence shares stays for that one. Declared removal end_only,
        one that would leave cells after the range may be refused."""
        self._remove(data, data.draw(st.integers(-1, self.sequences - 1), label="sequence"))

    def _remove(self, data: Draws, seq: int) -> None:
        p0, p1 = self._range(data, max(seq, 0))
        self._sequence_call("remove", f"remove [{p0}, {p1}) of sequence {seq}", lambda o: o.remove(seq, p0, p1),
                            lambda: self.adapter.seq_remove(self.context, seq, p0, p1), seq=seq, p0=p0, p1=p1)

    @rule(data=st.data(), requires=[Capability.SEQ_COPY], when=lambda self: self.sequences > 1,
          relies_on=WHOLE_COPIES)
    def copy(self, data: Draws) -> None:
        """One sequence's cells (all, or a range) into another, empty or not: merged or replacing as
        declared. The source is one holding cells, if any does."""
        held = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) >= 0]
        src = data.draw(st.sampled_from(held or list(range(self.sequences))), label="source")
        dst = data.draw(st.sampled_from([seq for seq in range(self.sequences) if seq != src]), label="destination")
        p0, p1 = (-1, -1) if self.whole_copies_only or data.draw(st.booleans(), label="whole") else \
            self._range(data, src)
        self._copy(src, dst, p0, p1)

    def _copy(self, src: int, dst: int, p0: int, p1: int) -> bool:
        """Copy ``[p0, p1)`` of ``src`` into ``dst``; whether it was done."""
        nonempty = self.oracles[0].pos_max(dst) >= 0
        into = "non-empty" if nonempty else "empty"
        if nonempty:
            self.exercised("copy into a non-empty sequence")
        judged, results = self._sequence_call("copy", f"copy [{p0}, {p1}) of sequence {src} into {into} sequence {dst}",
                            lambda o: o.copy(src, dst, p0, p1),
                            lambda: self.adapter.seq_copy(self.context, src, dst, p0, p1),
                            src=src, dst=dst, p0=p0, p1=p1)
        return results is not None and judged.to_judge

    @rule(data=st.data(), requires=[Capability.SEQ_KEEP])
    def keep(self, data: Draws) -> None:
        """Every other sequence's cells removed (a cell it shares leaves the others). The sequence kept is one
        holding cells, if any does; in a unified context, half the time on purpose one sharing cells with another
        (``KEEPS``), a sequence holding cells copied whole into another first where none does (shared copies)."""
        held = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) >= 0]
        if self.context_config.unified:
            forks = bool(held) and self.has(Capability.SEQ_COPY) and self.policy.shared_copies
            offered = KEEPS if self._sharers() or forks else KEEPS[:1]
            aim = data.optional(g.on_purpose(*offered) if len(offered) > 1 else st.just(offered[0]), "keep", KEEPS[0])
            if aim not in offered:  # only a replayed trace gives one: the live draw is of what is declared
                raise NotApplicable(f"the recorded keep is of a sequence sharing cells, which {self.adapter.name}'s "
                                    "copies do not make (shared_copies, seq_copy)")
            if aim == KEEPS[1]:
                if not self._sharers():  # a fork: the copy shares the source's cells
                    src = data.draw(st.sampled_from(held), label="source")
                    dst = data.draw(st.sampled_from([seq for seq in range(self.sequences) if seq != src]),
                                    label="destination")
                    self._copy(src, dst, -1, -1)
                sharers = self._sharers()
                if sharers:  # (none if the copy was refused)
                    if self._keep(data.draw(st.sampled_from(sharers), label="sharing")):
                        self.exercised(KEPT_SHARED)
                    return
                held = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) >= 0]
        self._keep(data.draw(st.sampled_from(held or list(range(self.sequences))), label="sequence"))

    def _sharers(self) -> list[int]:
        """The sequences holding a cell another sequence holds too."""
        return sorted({seq for store in self.oracles[0].stores for cell in store if len(cell.sequences) > 1
                       for seq in cell.sequences})

    def _keep(self, seq: int) -> bool:
        """Keep ``seq`` alone; whether it was done."""
        judged, results = self._sequence_call("keep", f"keep sequence {seq}", lambda o: o.keep(seq),
                                              lambda: self.adapter.seq_keep(self.context, seq), seq=seq)
        return results is not None and judged.to_judge

    @rule(data=st.data(), requires=[Capability.SEQ_SHIFT], relies_on=[NEGATIVE_SHIFT])
    def shift(self, data: Draws) -> None:
        """A range of one sequence's positions moved by -3..3: keys re-rotated, values kept as computed (not a
        recomputation); below 0 the cells leave (or, declared not_drawn, never asked)."""
        self._shift(data, self._a_sequence(data))

    def _shift(self, data: Draws, seq: int) -> None:
        p0, p1 = self._range(data, seq)
        low, high = self._moved(seq, p0, p1)
        least = -3 if self.policy.negative_shift == "removed" else max(-3, -low)
        most = min(3, POSITION_CEILING - 1 - high)
        if least > most:
            return
        delta = data.draw(st.integers(least, most), label="delta")
        self._move("shift", f"shift [{p0}, {p1}) of sequence {seq} by {delta}", lambda o: o.shift(seq, p0, p1, delta),
                   lambda: self.adapter.seq_shift(self.context, seq, p0, p1, delta), seq=seq, p0=p0, p1=p1,
                   delta=delta)

    def _move(self, operation: str, what: str, on_oracle: Any, action: Any, **details: Any) -> None:
        """A shift or divide: done, it is pending until the next decode (``move_pending``)."""
        judged, results = self._operation(what, on_oracle, action, may_refuse=self._may_refuse(operation, details),
                                          **details)
        if results is not None and judged.to_judge:
            self.move_pending = True

    @rule(data=st.data(), requires=[Capability.SEQ_COPY], when=lambda self: self.sequences > 1,
          relies_on=[NEGATIVE_SHIFT])  # (its copy is whole: a shift is its change's only draw a policy reads)
    def fork_then_change_one(self, data: Draws) -> None:
        """A sequence (prompted first if empty) copied whole into another, as parallel sampling forks, then one
        of the two changed -- a range removed, kept alone, shifted, or a token decoded -- set up whole in one
        rule (Hypothesis leaves a random subset of rules out of every run): the other holds what it held."""
        src = self._a_sequence(data, "source")
        if self.oracles[0].pos_max(src) < 0:
            self._decode(f"prompt of sequence {src}", self._batch(
                data, [src], [data.draw(st.integers(1, MAX_PROMPT), label="tokens")], mixed=False))
        dst = data.draw(st.sampled_from([seq for seq in range(self.sequences) if seq != src]), label="destination")
        self._copy(src, dst, -1, -1)
        self._change_one(data, data.draw(st.sampled_from([src, dst]), label="changed"))

    def _change_one(self, data: Draws, seq: int) -> None:
        """``seq`` changed alone: a range removed, kept alone, shifted, or a token decoded."""
        offered = [name for name, capability in (("remove", Capability.SEQ_REMOVE), ("keep", Capability.SEQ_KEEP),
                                                 ("shift", Capability.SEQ_SHIFT)) if self.has(capability)]
        change = data.draw(st.sampled_from([*offered, "decode"]), label="change")
        if change not in (*offered, "decode"):  # only a replayed trace gives one: the live draw is of what is offered
            raise NotApplicable(f"the recorded change is a {change}, which {self.adapter.name} does not declare")
        if change == "remove":
            self._remove(data, seq)
        elif change == "keep":
            self._keep(seq)
        elif change == "shift":
            self._shift(data, seq)
        else:
            self._decode(f"one token of sequence {seq}", self._batch(data, [seq], [1], mixed=False))

    def _moved(self, seq: int, p0: int, p1: int) -> tuple[int, int]:
        """The lowest and highest position in the range of ``seq``'s cells, and of every sequence sharing one of
        them (a shared cell moves for both): what a shift must keep within the positions."""
        low, high = (0 if p0 < 0 else p0), (float("inf") if p1 < 0 else p1)
        moved = [c for c in self.oracles[0].cells_of(seq) if low <= c.position < high]
        sharers = {s for c in moved for s in c.sequences}
        positions = [int(c.position) for c in moved] + [self.oracles[0].pos_max(s) for s in sharers]
        return (min(positions), max(positions)) if positions else (0, 0)

    @rule(data=st.data(), requires=[Capability.SEQ_DIVIDE])
    def divide(self, data: Draws) -> None:
        """A range of one sequence's positions integer-divided by 1-3 (positions may then repeat)."""
        self._divide(data, self._a_sequence(data))

    def _divide(self, data: Draws, seq: int) -> None:
        p0, p1 = self._range(data, seq)
        d = data.draw(st.integers(1, 3), label="divisor")
        self._move("divide", f"divide [{p0}, {p1}) of sequence {seq} by {d}", lambda o: o.divide(seq, p0, p1, d),
                   lambda: self.adapter.seq_divide(self.context, seq, p0, p1, d), seq=seq, p0=p0, p1=p1, d=d)

    @rule(data=st.data(), requires=[Capability.SEQ_STATE])
    def save(self, data: Draws) -> None:
        """One sequence's cells saved, for a later load; on purpose, loaded at once under another id (``SAVES``)."""
        seq = self._a_sequence(data)
        if self._save(seq) and self.sequences >= 2 and data.optional(g.on_purpose(*SAVES), "saves",
                                                                      SAVES[0]) == SAVES[1]:
            other = data.draw(st.sampled_from([s for s in range(self.sequences) if s != seq]), label="under")
            self._load(data, "this context", index=len(self.saved) - 1, seq=other)

    def _save(self, seq: int) -> bool:
        """Save ``seq`` (the newest of ``saved``); whether it was saved."""
        pending = self.move_pending and self.oracles[0].pos_max(seq) >= 0
        judged, results = self._operation(f"save sequence {seq}", lambda o: o.save(seq),
                                          lambda: self.adapter.save_sequence(self.context, seq), seq=seq)
        if results is None or not judged.to_judge:
            return False
        self.saved = [*self.saved, (judged.value, results, len(results[0].cells))][-SAVED:]
        if pending:
            self.exercised("saved with a move pending")
        return True

    def _load(self, data: Draws, where: str, *, index: int | None = None, seq: int | None = None) -> bool:
        """A saved sequence (drawn, or ``index``) loaded into ``seq`` (drawn if None); whether it was loaded."""
        index = data.draw(st.integers(0, len(self.saved) - 1), label="saved") if index is None else index
        state, oracle_states, count = self.saved[index]
        seq = self._a_sequence(data) if seq is None else seq
        oracle = self.oracles[0]
        store = oracle.store_of(seq)
        free, own = oracle.free(store), oracle.own_cells(seq)
        pending = self.move_pending
        states = iter(oracle_states)
        judged, results = self._operation(f"load {count} saved cells into sequence {seq} of {where}",
                                          lambda o: o.load(seq, next(states)),
                                          lambda: self.adapter.load_sequence(self.context, seq, state), seq=seq,
                                          saved=index)
        if self.grows:
            if count > free and judged.to_judge:
                self.exercised("load past the cells asked for")
        elif count > free + own:
            self.exercised("load refused for room")
        elif count > free:
            self.exercised("load fits by freeing its own cells")
        loaded = results is not None and judged.to_judge
        if loaded and pending:
            self.exercised("loaded with a move pending")
        if loaded and where.startswith("a fresh context"):
            self.exercised("load into a fresh context")
        return loaded

    @rule(data=st.data(), requires=[Capability.SEQ_STATE])
    def save_change_then_load(self, data: Draws) -> None:
        """A sequence holding cells (prompted first if none does) saved; its context then changed -- cleared,
        the sequence removed from or shifted, or a token decoded into it -- and the state loaded back: a saved
        state is self-contained, the cells as they were when saved (docs/spec.md §15.4). Set up whole in one
        rule, as a load long after its save is rare in a random program."""
        held = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) >= 0]
        seq = data.draw(st.sampled_from(held or list(range(self.sequences))), label="sequence")
        if not held:
            self._decode(f"prompt of sequence {seq}", self._batch(
                data, [seq], [data.draw(st.integers(1, MAX_PROMPT), label="tokens")], mixed=False))
        if not self._save(seq):
            return
        offered = [change for change, capability in (("clear", None), ("remove", Capability.SEQ_REMOVE),
                                                     ("shift", Capability.SEQ_SHIFT), ("decode", None))
                   if capability is None or self.has(capability)]
        change = data.draw(st.sampled_from(offered), label="change")
        if change not in offered:  # only a replayed trace gives one: the live draw is of what is offered
            raise NotApplicable(f"the recorded change is a {change}, which {self.adapter.name} does not declare")
        if change == "clear":
            self._operation("clear", lambda o: o.clear(), lambda: self.adapter.clear(self.context))
        elif change == "remove":
            self._remove(data, seq)
        elif change == "shift":
            self._shift(data, seq)
        elif self.oracles[0].pos_max(seq) + 1 < POSITION_CEILING:
            self._decode(f"one token of sequence {seq}", self._batch(data, [seq], [1], mixed=False))
        self._load(data, "the context it was saved from, changed since", index=len(self.saved) - 1)

    @rule(data=st.data(), requires=[Capability.SEQ_SHIFT])
    def shift_past_the_model(self, data: Draws) -> None:
        """A sequence's last cell (or all its cells) shifted to max_positions or past it: outside the model, a
        refusal (any exception) must change nothing, an acceptance is not judged (docs/spec.md §15.4). Engines
        differ -- llama.cpp's ``seq_add`` bounds nothing and rotates at any position, a RoPE table of
        ``max_positions`` rows cannot -- so only §5.1 is judged (a shift that moves some cells, then raises,
        fails); an accepted one's context is replaced."""
        seq = self._a_sequence(data)
        if self.oracles[0].pos_max(seq) < 0:
            self._decode(f"prompt of sequence {seq}", self._batch(
                data, [seq], [data.draw(st.integers(1, MAX_PROMPT), label="tokens")], mixed=False))
        top = self.oracles[0].pos_max(seq)
        if top < 0:  # the prompt was refused, or accepted unclaimed and its context replaced
            return
        p0 = data.draw(st.sampled_from([-1, top]), label="from")  # the whole sequence, or its last cell
        delta = self.config.max_positions - top + data.draw(st.sampled_from([0, 1, 30]), label="past the end by")
        self._sequence_call("shift", f"shift [{p0}, -1) of sequence {seq} by {delta}, past the model's "
                            f"{self.config.max_positions} positions", lambda o: o.shift(seq, p0, -1, delta),
                            lambda: self.adapter.seq_shift(self.context, seq, p0, -1, delta),
                            seq=seq, p0=p0, p1=-1, delta=delta)

    @rule(data=st.data(), requires=[Capability.SEQ_STATE], when=lambda self: bool(self.saved))
    def load(self, data: Draws) -> None:
        """A saved sequence loaded into this context, under its own id or another: that sequence holds exactly
        the saved cells (its own removed first), full if they do not fit."""
        self._load(data, "this context")

    @rule(data=st.data(), requires=[Capability.SEQ_STATE], when=lambda self: bool(self.saved))
    def load_into_a_fresh_context(self, data: Draws) -> None:
        """A new empty context of the same model -- of the same kind and sequences, its cells drawn anew -- and a
        saved sequence loaded into it (it carries on there): a state does not depend on the context it was saved
        from, nor on that context's cell count (docs/spec.md §15.4)."""
        config = self.context_config
        least, most = context_cells(config.unified, config.max_sequences, self.model_limits)
        cells = data.optional(st.integers(least, most), "fresh context cells", config.cells)
        fresh = dataclasses.replace(config, cells=cells)
        outside = self.model_limits.context_problem(fresh)
        if outside is not None:  # only a replayed trace gives one: live draws stay within the limits
            raise NotApplicable(f"the recorded fresh context is outside what {self.adapter.name} declares: {outside}")
        self.context_config = fresh
        self._new_context()
        self._load(data, f"a fresh context of {cells} cells")

    # -- chains engines get wrong, each set up whole in one rule: three particular rules in a row are rare by
    # chance (a save with a shift pending met once in 1,000 examples of thorough), and each link is judged as
    # its own rule judges it --

    @property
    def moves(self) -> list[str]:
        """The position moves declared: shift, divide."""
        return [name for name, capability in (("shift", Capability.SEQ_SHIFT), ("divide", Capability.SEQ_DIVIDE))
                if self.has(capability)]

    def _move_one(self, data: Draws, seq: int) -> None:
        move = data.draw(st.sampled_from(self.moves), label="move")
        if move not in self.moves:  # only a replayed trace gives one: the live draw is of what is declared
            raise NotApplicable(f"the recorded move is a {move}, which {self.adapter.name} does not declare")
        (self._shift if move == "shift" else self._divide)(data, seq)

    @rule(data=st.data(), requires=[Capability.SEQ_STATE])
    def load_where_the_room_is_short(self, data: Draws) -> None:
        """A sequence saved, then the destination's store filled on purpose, and the state loaded where it does not
        fit in the free cells: into a destination whose own cells make the room (freed first: the load must
        succeed), or into one too full even so (full, changing nothing); then a token of the destination."""
        src = self._a_sequence(data, "source")
        self._held(data, src)
        if not self._save(src):
            return
        count = self.saved[-1][2]
        oracle = self.oracles[0]
        own = {seq: oracle.own_cells(seq) for seq in range(self.sequences)}
        # too full even so: a destination of fewer own cells than the state, other sequences in its store to fill
        short = [seq for seq in range(self.sequences) if seq != src and own[seq] < count
                 and len(self._sharing_the_store(seq)) > 1]
        aim = data.draw(st.sampled_from(ROOM_AIMS if short else ROOM_AIMS[:1]), label="aim")
        if aim == ROOM_AIMS[0]:  # tokens of dst keep free + own cells alike: once free < count, its own make room
            dst = self._a_sequence(data, "destination")
            self._fill(data, dst, count - 1, [dst])
        else:  # other sequences' tokens leave fewer free cells than count, dst's own counted
            dst = data.draw(st.sampled_from(short), label="destination")
            self._fill(data, dst, count - 1 - own[dst], self._sharing_the_store(dst)[1:])
        self._load(data, "this context", index=len(self.saved) - 1, seq=dst)
        self._decode_one(data, dst)

    @rule(data=st.data(), requires=[Capability.SEQ_STATE], when=lambda self: bool(self.moves))
    def save_with_a_move_pending(self, data: Draws) -> None:
        """A sequence shifted or divided and saved before any decode (an engine that moves keys lazily has the move
        still to apply), then loaded into itself, another sequence, or another sequence into the cells it held,
        freed while the move was pending; then a token of it decoded."""
        places = [p for p in LOAD_PLACES if p != LOAD_PLACES[2] and (p != LOAD_PLACES[3]
                                                                    or self.has(Capability.SEQ_REMOVE))]
        self._save_moved_then_load(data, lambda: data.draw(st.sampled_from(places), label="loaded into"))

    @rule(data=st.data(), requires=[Capability.SEQ_STATE], when=lambda self: bool(self.moves))
    def save_with_a_move_pending_into_a_fresh_context(self, data: Draws) -> None:
        """A sequence shifted or divided and saved before any decode, then loaded into a new empty context of the
        same model (where nothing is pending), and a token of it decoded."""
        self._save_moved_then_load(data, lambda: LOAD_PLACES[2])

    def _save_moved_then_load(self, data: Draws, place: Any) -> None:
        seq = self._a_sequence(data)
        self._held(data, seq)
        self._move_one(data, seq)
        if not self._save(seq):
            return
        where = place()
        if where == LOAD_PLACES[2]:
            self._new_context()
        if where == LOAD_PLACES[3]:  # its cells freed, the move still pending, and another sequence loaded there
            self._sequence_call("remove", f"remove [-1, -1) of sequence {seq}", lambda o: o.remove(seq, -1, -1),
                                lambda: self.adapter.seq_remove(self.context, seq, -1, -1), seq=seq, p0=-1, p1=-1)
        target = seq if where in (LOAD_PLACES[0], LOAD_PLACES[2]) else (seq + 1) % self.sequences
        if self._load(data, "a fresh context" if where == LOAD_PLACES[2] else "this context",
                      index=len(self.saved) - 1, seq=target) and self.saved[-1][2]:
            self.exercised(f"move pending at save, loaded into {where}")
        self._decode_one(data, target)

    @rule(data=st.data(), when=lambda self: bool(self.moves))
    def move_then_past_the_room_then_decode(self, data: Draws) -> None:
        """A shift or divide, then a batch past the room (full, changing nothing: an engine that applies the move
        at the start of that decode must not leave it half done), then a token decoded."""
        seq = self._a_sequence(data)
        self._held(data, seq)
        self._move_one(data, seq)
        self._past_the_room(data, seq)
        self._decode_one(data, seq)

    @rule(data=st.data(), requires=[Capability.SEQ_COPY], when=lambda self: self.sequences > 2)
    def three_sequences_over_one_copy(self, data: Draws) -> None:
        """One sequence copied whole into a second and the second (or the first) into a third, then one of the
        three changed alone, then a token of each decoded in one batch: each holds what it held."""
        first, second, third = data.draw(st.permutations(range(3)), label="sequences")
        self._held(data, first)
        self._copy(first, second, -1, -1)
        self._copy(data.draw(st.sampled_from([first, second]), label="copied again"), third, -1, -1)
        if all(self.oracles[0].pos_max(seq) >= 0 for seq in (first, second, third)):
            self.exercised("three sequences over one copy")
        self._change_one(data, data.draw(st.sampled_from([first, second, third]), label="changed"))
        lead = self._lead(data, [first, second, third])
        self._decode_after(lead, f"a token of each of sequences {[first, second, third]}",
                           self._batch(data, [first, second, third], [1, 1, 1], mixed=False, lead=lead))

    @rule(data=st.data(), requires=[Capability.SEQ_STATE, Capability.SEQ_REMOVE])
    def save_after_storage_and_position_orders_diverge(self, data: Draws) -> None:
        """A sequence's first positions removed and new tokens decoded into the cells freed (an engine reusing the
        lowest free cell now stores later positions before earlier ones; in a unified context another sequence
        holds the cells after), then saved and loaded into a fresh context or another sequence, where a token is
        decoded: the state is read back by position, not by where it was stored."""
        seq = self._a_sequence(data)
        self._held(data, seq, 3)
        neighbours = self._sharing_the_store(seq)[1:]
        if neighbours:
            self._decode_one(data, neighbours[0])
        top = self.oracles[0].pos_max(seq)
        if top < 1:
            return
        cut = data.draw(st.integers(1, top), label="removed below")
        self._sequence_call("remove", f"remove [-1, {cut}) of sequence {seq}", lambda o: o.remove(seq, -1, cut),
                            lambda: self.adapter.seq_remove(self.context, seq, -1, cut), seq=seq, p0=-1, p1=cut)
        self._decode(f"tokens of sequence {seq} into the cells freed", self._batch(
            data, [seq], [data.draw(st.integers(1, 2), label="tokens")], mixed=False))
        if not self._save(seq):
            return
        if self.oracles[0].pos_min(seq) >= cut:
            self.exercised("saved after its orders diverged")
        fresh = data.draw(st.booleans(), label="into a fresh context")
        if fresh:
            self._new_context()
        target = seq if fresh else (seq + 1) % self.sequences
        self._load(data, "a fresh context" if fresh else "this context", index=len(self.saved) - 1, seq=target)
        self._decode_one(data, target)

    # -- the window's edges on purpose (issue 37): a windowed sequence outgrown -- more than W positions from its
    # oldest to its newest, so its newest token no longer sees its oldest -- then each operation around the oldest
    # position the next token sees (``edge``), set up whole in one rule. Each call is judged as its own rule judges
    # it, by the cell model: a store that evicts what no window can see, or a model whose global layers see every
    # cell, changes what is due, not what is drawn --

    def _edge(self, seq: int) -> int:
        """The oldest position ``seq``'s next token (at its largest + 1) sees in a windowed layer."""
        return self.oracles[0].pos_max(seq) + 2 - (self.config.window or 0)

    def _in_the_window(self, seq: int) -> set[int]:
        """The cells of ``seq`` (by identity) its next token sees in a windowed layer."""
        edge = self._edge(seq)
        return {id(cell) for cell in self.oracles[0].cells_of(seq) if cell.position >= edge}

    def _make_room(self, seq: int, needed: int, keep: tuple[int, ...] = ()) -> None:
        """The sequences of ``seq``'s store (but those of ``keep``), others first, removed whole one by one until it
        has ``needed`` free cells (nothing where the context grows or removals are not declared)."""
        if self.grows or not self.has(Capability.SEQ_REMOVE):
            return
        for other in [*self._sharing_the_store(seq)[1:], seq]:
            oracle = self.oracles[0]
            if oracle.free(oracle.store_of(seq)) >= needed:
                return
            if other not in keep and oracle.pos_max(other) >= 0:
                self._sequence_call("remove", f"remove [-1, -1) of sequence {other}, making room",
                                    lambda o, s=other: o.remove(s, -1, -1),
                                    lambda s=other: self.adapter.seq_remove(self.context, s, -1, -1),
                                    seq=other, p0=-1, p1=-1)

    def _chunk(self, data: Draws, seq: int, count: int, what: str) -> int:
        """Up to ``count`` tokens of ``seq`` in one batch (as many as its store's room, the batch size and the
        positions allow); how many were decoded."""
        oracle = self.oracles[0]
        free = count if self.grows else oracle.free(oracle.store_of(seq))
        count = min(count, free, self.max_batch, POSITION_CEILING - 1 - max(oracle.pos_max(seq), 3))
        if count < 1:
            return 0
        before = len(oracle.cells_of(seq))
        self._decode(f"{what} of sequence {seq}", self._batch(data, [seq], [count], mixed=False))
        return max(0, len(self.oracles[0].cells_of(seq)) - before)

    def _outgrow(self, data: Draws, seq: int, beyond: int, keep: tuple[int, ...] = (), reserve: int = 1) -> bool:
        """``seq`` decoded in chunks of 1 to MAX_PROMPT tokens until its newest position is ``W + beyond - 1``
        past the oldest it held when this began (a chunk may cross the window's edge within itself), or its store
        has only ``reserve`` cells left for what follows; room made first by removing other sequences of its store
        (but ``keep``), and ``seq`` itself started anew where its positions or its store are too short. Whether
        it spans more than W positions."""
        window = self.config.window or 0
        oracle = self.oracles[0]
        goal = window + beyond if self.grows else max(window + 1, min(window + beyond, oracle.capacity - reserve))
        top, held = oracle.pos_max(seq), len(oracle.cells_of(seq))
        short = not self.grows and held + goal - (top - oracle.pos_min(seq) + 1) > oracle.capacity - reserve
        if top >= 0 and self.has(Capability.SEQ_REMOVE) and (top + goal + MAX_PROMPT >= POSITION_CEILING or short):
            self._sequence_call("remove", f"remove [-1, -1) of sequence {seq}, starting it anew",
                                lambda o: o.remove(seq, -1, -1),
                                lambda: self.adapter.seq_remove(self.context, seq, -1, -1), seq=seq, p0=-1, p1=-1)
        start = self.oracles[0].pos_min(seq) if self.oracles[0].pos_max(seq) >= 0 else None

        def reach() -> int:
            top = self.oracles[0].pos_max(seq)
            return 0 if top < 0 or start is None else top - start + 1

        for _ in range(goal):  # each pass decodes at least one token, or stops
            missing = goal - reach()
            if missing <= 0:
                break
            self._make_room(seq, min(missing, MAX_PROMPT), keep=(seq, *keep))
            count = data.draw(st.integers(1, MAX_PROMPT), label="chunk")
            if not self._chunk(data, seq, min(count, missing), "tokens outgrowing the window"):
                break  # its store is full: as far as it holds
            if start is None:
                start = self.oracles[0].pos_min(seq)
        if reach() > window:
            self.exercised(OUTGROWN)
        if reach() > window + 2:
            self.exercised(OUTGROWN_FAR)
        return reach() > window

    def _next_chunk(self, data: Draws, seq: int) -> None:
        """One token or a chunk of 2-3 of ``seq``, judged against the cells its window sees now."""
        self._chunk(data, seq, data.draw(st.integers(1, 3), label="next tokens"), "tokens")

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW], when=_outgrowable)
    def outgrow_the_window(self, data: Draws) -> None:
        """A sequence decoded in chunks until it spans W + 1 or W + 3 positions (a chunk may cross the window's
        edge within itself), then a chunk of 2-4 tokens: each new token sees only the last W positions, and a
        chunk's first token sees cells its last does not."""
        seq = self._a_sequence(data)
        if not self._outgrow(data, seq, data.draw(st.sampled_from(BEYOND), label="beyond the window by"),
                             reserve=2):
            return
        self._make_room(seq, MAX_PROMPT, keep=(seq,))
        if self._chunk(data, seq, data.draw(st.integers(2, MAX_PROMPT), label="tokens after"), "a chunk after "
                       "the window was outgrown") >= 2:
            self.exercised(CHUNK_AFTER)

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW, Capability.SEQ_REMOVE], when=_edge_seen)
    def remove_across_the_window_edge(self, data: Draws) -> None:
        """An outgrown sequence's cells removed from one before to one past the window's edge, a middle range of
        one or two positions, then to the end (its next token then sees cells that were out of its window); after
        each, a token or a chunk of it decoded."""
        seq = self._a_sequence(data)
        if not self._outgrow(data, seq, data.draw(st.sampled_from(BEYOND), label="beyond the window by")):
            return
        for where in (EDGE_REMOVALS[1], EDGE_REMOVALS[0]):
            edge = self._edge(seq)
            p0 = max(0, edge + data.draw(st.integers(-1, 1), label="from the edge"))
            p1 = (int(data.draw(st.sampled_from(OPEN_ENDS), label="open p1")) if where == EDGE_REMOVALS[0]
                  else p0 + data.draw(st.integers(1, 2), label="width"))
            judged, results = self._sequence_call(
                "remove", f"remove [{p0}, {p1}) of sequence {seq}, {where}, across the window's edge at {edge}",
                lambda o, p0=p0, p1=p1: o.remove(seq, p0, p1),
                lambda p0=p0, p1=p1: self.adapter.seq_remove(self.context, seq, p0, p1), seq=seq, p0=p0, p1=p1)
            if results is not None and judged.to_judge and self.oracles[0].pos_max(seq) >= 0:
                self.exercised(REMOVED_ACROSS[where])
                if any(edge > cell.position >= self._edge(seq) for cell in self.oracles[0].cells_of(seq)):
                    self.exercised(SEEN_AGAIN)
            self._next_chunk(data, seq)

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW],
          when=lambda self: _edge_seen(self) and bool(self.moves), relies_on=[NEGATIVE_SHIFT])
    def move_across_the_window_edge(self, data: Draws) -> None:
        """An outgrown sequence's cells in its window (from about the edge to the end) or out of it (from the
        start to about the edge) shifted by -3..3, then divided by 2 or 3 (those declared), each chosen so that
        cells cross into or out of the window of its next token where some such move exists (keys re-rotated,
        values as computed); after each, a token or a chunk of it decoded."""
        seq = self._a_sequence(data)
        if not self._outgrow(data, seq, data.draw(st.sampled_from(BEYOND), label="beyond the window by")):
            return
        for move in ("shift", "divide"):  # each declared move in turn, a token or a chunk decoded after each
            if not data.draw(st.just(move in self.moves), label=f"{move} across the edge"):
                continue
            if move not in self.moves:  # only a replayed trace gives one: the live draw is of what is declared
                raise NotApplicable(f"the recorded move is a {move}, which {self.adapter.name} does not declare")
            edge = self._edge(seq)
            options = [(p0, p1, amount) for at in (edge - 1, edge, edge + 1) if at >= 0
                       for p0, p1 in ((at, -1), (-1, at)) for amount in self._amounts(move, seq, p0, p1)]
            if not options or self.oracles[0].pos_max(seq) < 0:
                return
            crossing = [option for option in options if self._crosses(seq, move, *option)]
            p0, p1, amount = data.draw(st.sampled_from(crossing or options), label=f"{move} range and amount")
            crosses = self._crosses(seq, move, p0, p1, amount)
            what = f"{move} [{p0}, {p1}) of sequence {seq} by {amount}, across the window's edge at {edge}"
            if move == "shift":
                self._move("shift", what, lambda o, a=amount, r=(p0, p1): o.shift(seq, *r, a),
                           lambda a=amount, r=(p0, p1): self.adapter.seq_shift(self.context, seq, *r, a), seq=seq,
                           p0=p0, p1=p1, delta=amount)
            else:
                self._move("divide", what, lambda o, a=amount, r=(p0, p1): o.divide(seq, *r, a),
                           lambda a=amount, r=(p0, p1): self.adapter.seq_divide(self.context, seq, *r, a), seq=seq,
                           p0=p0, p1=p1, d=amount)
            if self.move_pending and crosses:
                self.exercised(MOVED_ACROSS[move])
            self._next_chunk(data, seq)

    def _amounts(self, move: str, seq: int, p0: int, p1: int) -> list[int]:
        """The shifts (-3..3 but 0, within the positions and the declared negative_shift) or divisors (2, 3) of
        ``[p0, p1)`` of ``seq`` the suite draws."""
        if move == "divide":
            return [2, 3]
        low, high = self._moved(seq, p0, p1)
        least = -3 if self.policy.negative_shift == "removed" else max(-3, -low)
        return [d for d in range(least, min(3, POSITION_CEILING - 1 - high) + 1) if d != 0]

    def _crosses(self, seq: int, move: str, p0: int, p1: int, amount: int) -> bool:
        """Whether moving ``[p0, p1)`` of ``seq`` so changes which of its cells still held its next token sees in
        a windowed layer (worked out on the positions, before the move)."""
        window = self.config.window or 0
        low, high = open_range(p0, p1)
        cells = self.oracles[0].cells_of(seq)
        moved = [(cell.position + amount if move == "shift" else cell.position // amount)
                 if low <= cell.position < high else cell.position for cell in cells]
        held = [(cell, after) for cell, after in zip(cells, moved) if after >= 0]
        if not held:
            return False
        edge, top = self._edge(seq), max(after for _, after in held)
        return any((cell.position >= edge) != (after >= top + 2 - window) for cell, after in held)

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW, Capability.SEQ_COPY],
          when=lambda self: _edge_seen(self) and self.sequences > 1, relies_on=WHOLE_COPIES)
    def copy_an_outgrown_sequence(self, data: Draws) -> None:
        """An outgrown sequence's cells in the window or out of it (from about the edge) copied into another,
        then the whole sequence (where only whole copies are declared, that alone); after each copy, a token of
        each decoded in one batch: the destination's sees the copied cells in its own window, the source's its
        own."""
        src, dst = data.draw(st.permutations(range(self.sequences)), label="sequences")[:2]
        if not self._outgrow(data, src, data.draw(st.sampled_from(BEYOND), label="beyond the window by")):
            return
        parts = [COPIED_PARTS[0]] if self.whole_copies_only else [
            data.draw(st.sampled_from(COPIED_PARTS[1:]), label="copied first"), COPIED_PARTS[0]]
        for part in parts:
            at = max(0, self._edge(src) + data.draw(st.integers(-1, 1), label="from the edge"))
            p0, p1 = {COPIED_PARTS[0]: (-1, -1), COPIED_PARTS[1]: (at, -1), COPIED_PARTS[2]: (-1, at)}[part]
            self._make_room(dst, len(self.oracles[0].cells_of(src)), keep=(src,))
            if not self._copy(src, dst, p0, p1):
                return
            if part == COPIED_PARTS[0]:
                self.exercised(COPIED)
            if part == COPIED_PARTS[2] and self.oracles[0].pos_max(dst) >= 0:
                self.exercised(COPIED_OUT)
            self._make_room(src, 2, keep=(src, dst))
            self._decode(f"a token of each of sequences {[src, dst]}",
                         self._batch(data, [src, dst], [1, 1], mixed=False))

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW, Capability.SEQ_COPY, Capability.SEQ_REMOVE],
          when=lambda self: self.evicting and _edge_seen(self) and self.context_config.unified and self.sequences > 1)
    def evict_a_cell_another_sequence_sees(self, data: Draws) -> None:
        """In a store that evicts (one store for every sequence), a short sequence copied whole into another, emptied
        first (the other sequences removed, it started anew if too long for what follows): each copied cell one cell
        both hold. The source then fills the store and is decoded a token or two past it, so the store evicts its
        oldest own cells and, below them, its share of the copied ones -- which the copy, shorter, still sees: they
        must stay for it (``seq_pos_min``, and the logits of a token of the copy decoded last)."""
        src, dst = data.draw(st.permutations(range(self.sequences)), label="sequences")[:2]
        window, sinks = self.config.window or 0, self.context_config.sinks
        for other in range(self.sequences):
            if other != src and self.oracles[0].pos_max(other) >= 0:
                self._sequence_call("remove", f"remove [-1, -1) of sequence {other}, making room",
                                    lambda o, s=other: o.remove(s, -1, -1),
                                    lambda s=other: self.adapter.seq_remove(self.context, s, -1, -1),
                                    seq=other, p0=-1, p1=-1)
        oracle = self.oracles[0]
        most = min(MAX_PROMPT, self.max_batch, oracle.capacity - window - 2)  # W + 1 own cells fit after the copy
        top = oracle.pos_max(src)
        if top >= 0 and (top < sinks or len(oracle.cells_of(src)) > most
                         or top + oracle.capacity + 3 >= POSITION_CEILING):
            self._sequence_call("remove", f"remove [-1, -1) of sequence {src}, starting it anew",
                                lambda o: o.remove(src, -1, -1),
                                lambda: self.adapter.seq_remove(self.context, src, -1, -1), seq=src, p0=-1, p1=-1)
        if self.oracles[0].pos_max(src) < 0:
            start = self._next_position(src, data)
            least = max(1, sinks + 1 - start)  # its last cell past the sinks: one the store may evict
            if least > most:
                return
            count = data.draw(st.integers(least, most), label="tokens")
            tokens = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                               label="prompt")
            self._decode(f"prompt of sequence {src}", ModelBatch.of_sequence(src, tokens, start, all_logits=False))
        if self.oracles[0].pos_max(dst) >= 0 or not self._copy(src, dst, -1, -1):
            return
        oracle = self.oracles[0]
        shared = [cell for cell in oracle.cells_of(dst) if src in cell.sequences and cell.position >= sinks
                  and cell.position >= self._edge(dst)]
        self._fill(data, src, 0, [src])
        for _ in range(data.draw(st.integers(1, 2), label="past the room by")):
            self._decode_one(data, src)
        if any(dst in cell.sequences and dst not in cell.window_gone and (
                src not in cell.sequences or src in cell.window_gone or src in cell.uncertain) for cell in shared):
            self.exercised(EVICTED_SHARED)
        self._decode_one(data, dst)

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW, Capability.SEQ_STATE], when=_edge_seen)
    def save_and_load_an_outgrown_sequence(self, data: Draws) -> None:
        """An outgrown sequence saved, more of its tokens decoded, and the state loaded back into it (a rollback:
        its window goes back too); then loaded again into another sequence (where one can hold it) and into a fresh
        context. After each load, a token or a chunk of the sequence loaded into decoded."""
        seq = self._a_sequence(data)
        # another sequence whose store holds the state beside the outgrown one, or is another store
        room = self.grows or self.oracles[0].capacity >= 2 * (self.config.window or 0) + 2
        others = [s for s in range(self.sequences) if s != seq and (room or s not in self._sharing_the_store(seq))]
        places = OUTGROWN_LOADS if others else OUTGROWN_LOADS[::2]
        target, reserve, beside = seq, 2, False
        if others:
            target = data.draw(st.sampled_from(others), label="into")
            beside = target in self._sharing_the_store(seq)
            if beside:  # the state must fit beside the sequence saved
                reserve = max(reserve, (self.oracles[0].capacity + 1) // 2)
        if not self._outgrow(data, seq, data.draw(st.sampled_from(BEYOND), label="beyond the window by"),
                             keep=(target,) if target != seq else (), reserve=reserve):
            return
        if not self._save(seq):
            return
        index, count = len(self.saved) - 1, self.saved[-1][2]
        self._make_room(seq, 3, keep=(seq, target))
        self._next_chunk(data, seq)
        for where in places:
            if where == OUTGROWN_LOADS[1]:
                self._make_room(target, count - self.oracles[0].own_cells(target), keep=(seq, target))
            if where == OUTGROWN_LOADS[2]:
                self._new_context()
            loaded_into = seq if where != OUTGROWN_LOADS[1] else target
            if self._load(data, "a fresh context" if where == OUTGROWN_LOADS[2] else "this context", index=index,
                          seq=loaded_into):
                self.exercised(LOADED_INTO[where])
                if where == OUTGROWN_LOADS[0] and beside:
                    continue  # no more tokens of it: the state is loaded beside it next
                self._make_room(loaded_into, 3, keep=(seq, target))
                self._next_chunk(data, loaded_into)

    @rule(data=st.data(), requires=[Capability.SLIDING_WINDOW],
          when=lambda self: _outgrowable(self) and self.sequences > 1)
    def batch_straddling_the_window_edge(self, data: Draws) -> None:
        """One batch of several sequences, some past the window and some within it (holding fewer than W
        positions, empty or not; on purpose, one crossing the edge inside the batch), in sequence order or
        interleaved: each token sees its own sequence's last W positions."""
        long, short, *rest = data.draw(st.permutations(range(self.sequences)), label="sequences")
        if not self._outgrow(data, long, 1, keep=(short,)):
            return
        window = self.config.window or 0
        oracle = self.oracles[0]
        if oracle.pos_max(short) >= 0 and oracle.pos_max(short) - oracle.pos_min(short) + 1 >= window:
            if not self.has(Capability.SEQ_REMOVE):
                return
            self._sequence_call("remove", f"remove [-1, -1) of sequence {short}, to hold fewer than the window",
                                lambda o: o.remove(short, -1, -1),
                                lambda: self.adapter.seq_remove(self.context, short, -1, -1), seq=short, p0=-1, p1=-1)
        oracle = self.oracles[0]
        span = oracle.pos_max(short) - oracle.pos_min(short) + 1 if oracle.pos_max(short) >= 0 else 0
        if oracle.pos_max(long) < 0 or span >= window:  # a call above raised, or replaced the context
            return
        chosen = [long, short, *rest[:data.draw(st.integers(0, len(rest)), label="others")]]
        crossing = data.draw(st.booleans(), label="short one crossing the edge")
        counts = {long: data.draw(st.integers(1, 2), label="long tokens"),
                  short: window - span + 1 if crossing else data.draw(st.integers(1, window - span), label="short "
                                                                                                        "tokens"),
                  **{seq: data.draw(st.integers(1, 2), label="other tokens") for seq in chosen[2:]}}
        for seq in chosen:  # room made, then what does not fit left out: the others first, then the short one's
            store = self._sharing_the_store(seq)
            self._make_room(seq, sum(counts[s] for s in chosen if s in store), keep=tuple(chosen))
            oracle = self.oracles[0]
            while not self.grows and sum(counts[s] for s in chosen if s in store) > oracle.free(oracle.store_of(seq)):
                if len(chosen) > 2 and chosen[-1] in store:
                    chosen.pop()
                elif counts[short] > 1 and short in store:
                    counts[short] -= 1
                elif counts[long] > 1 and long in store:
                    counts[long] -= 1
                else:
                    return  # not even a token of each fits
        batch = self._batch(data, chosen, [counts[s] for s in chosen], mixed=data.draw(st.booleans(),
                                                                                        label="interleaved"))
        before = len(self.oracles[0].cells_of(short))
        self._decode(f"a batch of sequences {chosen} straddling the window's edge", batch)
        if len(self.oracles[0].cells_of(short)) > before:
            self.exercised(STRADDLING)
            if span + batch.sequences.count(short) > window:
                self.exercised(CROSSING)

    # Only where a cell is held: a clear of an empty context judges nothing, and as the one rule without
    # arguments it is Hypothesis's first choice, so programs of nothing but clears were a third of the steps.
    @rule(when=lambda self: any(self.oracles[0].stores))
    def clear(self) -> None:
        """Every cell of every sequence removed."""
        self._operation("clear", lambda o: o.clear(), lambda: self.adapter.clear(self.context))

    @rule(data=st.data(), when=lambda self: bool(self.operations_to_refuse))
    def operation_on_an_unknown_sequence(self, data: Draws) -> None:
        """keep, shift or divide (those declared) of a sequence id outside the context, or a divisor 0: refused
        (judged with validates_sequence_ops), changing nothing."""
        bad = data.draw(st.sampled_from([self.sequences, self.sequences + 1, -1]), label="sequence")
        which = data.draw(st.sampled_from(self.operations_to_refuse), label="operation")
        seq = 0 if which == "divide by 0" else bad
        calls = {"keep": (lambda o: o.keep(seq), lambda: self.adapter.seq_keep(self.context, seq)),
                 "shift": (lambda o: o.shift(seq, -1, -1, 1),
                           lambda: self.adapter.seq_shift(self.context, seq, -1, -1, 1)),
                 "divide": (lambda o: o.divide(seq, -1, -1, 2),
                            lambda: self.adapter.seq_divide(self.context, seq, -1, -1, 2)),
                 "divide by 0": (lambda o: o.divide(seq, -1, -1, 0),
                                 lambda: self.adapter.seq_divide(self.context, seq, -1, -1, 0))}
        on_oracle, action = calls[which]
        self._operation(f"{which} of sequence {seq}", on_oracle, action, seq=seq)

    @property
    def operations_to_refuse(self) -> list[str]:
        offered = {"keep": Capability.SEQ_KEEP, "shift": Capability.SEQ_SHIFT, "divide": Capability.SEQ_DIVIDE,
                   "divide by 0": Capability.SEQ_DIVIDE}
        return [name for name, capability in offered.items() if self.has(capability)]

    # -- windowed stores, on purpose: a sequence outgrowing its window, then an operation that may need a cell its
    # store evicted; sinks kept past a wrapped ring (docs/spec.md §15.2, §15.4) --

    def _window_cases(self, batch: ModelBatch) -> list[str]:
        """The window edges a batch meets: a chunk of two or more tokens of a sequence holding a sink, decoded once it
        has held S + W tokens (a ring of W + S slots has wrapped; the sink is seen only as a sink)."""
        window, sinks = self.config.window, self.context_config.sinks
        if window is None or not sinks:
            return []
        oracle = self.oracles[0]
        named = [s for s in batch.sequences if isinstance(s, int) and 0 <= s < self.sequences]
        return ["sink kept past a wrap" for seq in sorted(set(named)) if named.count(seq) >= 2
                and any(c.position < sinks for c in oracle.cells_of(seq)) and oracle.pos_max(seq) + 1 >= sinks + window]

    def _outgrow_the_room(self, data: Draws, seq: int) -> None:
        """``seq`` decoded past its window and, where its store has a room, past it by a token or two (a store that
        evicts lazily, as llama.cpp's, evicts only then)."""
        self._held(data, seq, 2)
        if not self.grows:
            self._fill(data, seq, 0, [seq])
        for _ in range(data.draw(st.integers(1, 2), label="past the room by")):
            self._decode_one(data, seq)

    @rule(data=st.data(), when=lambda self: self.config.window is not None, relies_on=[NEGATIVE_SHIFT])
    def outgrow_the_window_then_change(self, data: Draws) -> None:
        """A sequence (forked first, or not) decoded past its window and its store's room (a store declared
        ``window_cells: visible`` may evict), then an operation that may need a cell no longer held -- a removal to
        the end just above its oldest held cell, one in the middle, its last cells shifted back, a divide, a copy
        into another sequence, a save loaded under another id -- and a token of it decoded: refused changing
        nothing, or done over what is held."""
        seq = self._a_sequence(data)
        others = [s for s in range(self.sequences) if s != seq]
        if others and self.has(Capability.SEQ_COPY) and data.optional(st.booleans(), "forked first", False):
            self._held(data, seq, 2)  # a copy sharing its cells: what one outgrows the other may still see
            self._copy(seq, data.draw(st.sampled_from(others), label="fork"), -1, -1)
        self._outgrow_the_room(data, seq)
        offered = [name for name, capability in WINDOW_CHANGES if self.has(capability)
                   and (name not in WINDOW_CHANGES_TO_ANOTHER or others)]
        oracle = self.oracles[0]
        top = oracle.pos_max(seq)
        # the oldest cell surely held past the sinks: the positions below it are evicted, or may be
        held = [c.position for c in oracle.cells_of(seq) if c.position >= self.context_config.sinks
                and seq not in c.uncertain]
        low = int(min(held, default=oracle.pos_min(seq)))
        if not offered or top < 0:
            return
        # half the time a removal to the end, the one that brings evicted positions back into view
        change = data.draw(g.on_purpose(*offered) if len(offered) > 1 else st.just(offered[0]), label="change")
        if change not in offered:  # only a replayed trace gives one: the live draw is of what is declared
            raise NotApplicable(f"the recorded change is a {change}, which {self.adapter.name} does not declare")
        window = self.config.window or 1
        if change == "remove to the end":  # just above the oldest held cell: the positions before it come into view
            p0 = data.draw(st.integers(low + 1, max(low + 1, min(top, low + window - 2))), label="from")
            self._sequence_call("remove", f"remove [{p0}, -1) of sequence {seq}", lambda o: o.remove(seq, p0, -1),
                                lambda: self.adapter.seq_remove(self.context, seq, p0, -1), seq=seq, p0=p0, p1=-1)
        elif change == "remove in the middle":
            p0, width = data.draw(st.integers(low, top), label="from"), data.draw(st.integers(1, 2), label="width")
            self._sequence_call("remove", f"remove [{p0}, {p0 + width}) of sequence {seq}",
                                lambda o: o.remove(seq, p0, p0 + width),
                                lambda: self.adapter.seq_remove(self.context, seq, p0, p0 + width),
                                seq=seq, p0=p0, p1=p0 + width)
        elif change == "last cells shifted back":
            p0 = data.draw(st.integers(low, top), label="from")
            least = -3 if self.policy.negative_shift == "removed" else max(-3, -self._moved(seq, p0, -1)[0])
            if least > -1:
                return
            delta = data.draw(st.integers(least, -1), label="delta")
            self._move("shift", f"shift [{p0}, -1) of sequence {seq} by {delta}",
                       lambda o: o.shift(seq, p0, -1, delta),
                       lambda: self.adapter.seq_shift(self.context, seq, p0, -1, delta), seq=seq, p0=p0, p1=-1,
                       delta=delta)
        elif change == "divided":
            self._move("divide", f"divide [-1, -1) of sequence {seq} by 2", lambda o: o.divide(seq, -1, -1, 2),
                       lambda: self.adapter.seq_divide(self.context, seq, -1, -1, 2), seq=seq, p0=-1, p1=-1, d=2)
        else:
            dst = data.draw(st.sampled_from(others), label="into")
            if change == "copied into another":
                self._copy(seq, dst, -1, -1)
            elif self._save(seq):
                self._load(data, "this context", index=len(self.saved) - 1, seq=dst)
            self._decode_one(data, dst)
        self._decode_one(data, seq)

    @rule(data=st.data(), requires=[Capability.SEQ_REMOVE], when=lambda self: self.config.window is not None)
    def remove_to_the_end_around_a_full_window(self, data: Draws) -> None:
        """A sequence emptied, then W - 1, W or W + 1 tokens decoded into it and a removal to the end that leaves some
        of them, then a token: below W tokens it must succeed; from W on, a ring (``window_removal: until_full``) may
        refuse it, changing nothing (the layer machine's ``truncate_a_ring_of_window_and_sinks``, at model level)."""
        seq = self._a_sequence(data)
        if self.oracles[0].pos_max(seq) >= 0:
            self._sequence_call("remove", f"remove [-1, -1) of sequence {seq}", lambda o: o.remove(seq, -1, -1),
                                lambda: self.adapter.seq_remove(self.context, seq, -1, -1), seq=seq, p0=-1, p1=-1)
            if self.oracles[0].pos_max(seq) >= 0:  # refused, or replaced: nothing to start from
                return
        window = self.config.window or 1
        count = window + data.draw(st.sampled_from((-1, 0, 1)), label="tokens past W")
        if count < 2:
            return  # nothing would be left after a removal to the end of a sequence of one token
        self._decode(f"{count} tokens into sequence {seq}", self._batch(data, [seq], [count], mixed=False))
        low, top = self.oracles[0].pos_min(seq), self.oracles[0].pos_max(seq)
        if top <= low:  # the batch was refused, or replaced
            return
        p0 = data.draw(st.integers(low + 1, top), label="from")
        self._sequence_call("remove", f"remove [{p0}, -1) of sequence {seq} after {count} tokens",
                            lambda o: o.remove(seq, p0, -1), lambda: self.adapter.seq_remove(self.context, seq, p0, -1),
                            seq=seq, p0=p0, p1=-1)
        self._decode_one(data, seq)

    @rule(data=st.data(), when=lambda self: self.config.window is not None)
    def sinks_past_a_wrap(self, data: Draws) -> None:
        """A sequence started anew at position 0 (its first S tokens the sinks, where the context keeps S >= 1),
        decoded past S + W tokens (and past its store's room, where it evicts: a ring of W + S slots has wrapped),
        then a chunk of 2-4 tokens: each sees the sinks besides its window (a ring that masks by slot, not
        position, loses them); with no sinks, only its window, now past the sequence's start."""
        seq = self._a_sequence(data)
        oracle = self.oracles[0]
        target = self.context_config.sinks + (self.config.window or 0)
        short = oracle.free(oracle.store_of(seq)) + oracle.own_cells(seq) < target + 2 and not (
            self.evicting or self.grows)
        if short and any(oracle.stores):  # a store that keeps every cell needs S + W + 2 of them: emptied first
            self._operation("clear", lambda o: o.clear(), lambda: self.adapter.clear(self.context))
        if self.oracles[0].pos_max(seq) >= 0:
            if self.has(Capability.SEQ_REMOVE):
                self._sequence_call("remove", f"remove [-1, -1) of sequence {seq}", lambda o: o.remove(seq, -1, -1),
                                    lambda: self.adapter.seq_remove(self.context, seq, -1, -1), seq=seq, p0=-1, p1=-1)
            else:
                self._operation("clear", lambda o: o.clear(), lambda: self.adapter.clear(self.context))
            if self.oracles[0].pos_max(seq) >= 0:  # refused, or replaced: nothing to start from
                return
        count = min(MAX_PROMPT, self.max_batch, data.draw(st.integers(1, MAX_PROMPT), label="tokens"))
        tokens = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                           label="sink tokens")
        self._decode(f"prompt of sequence {seq} from position 0", ModelBatch.of_sequence(seq, tokens, 0))
        if self.evicting:
            self._outgrow_the_room(data, seq)
        for _ in range(target):
            if self.oracles[0].pos_max(seq) + 1 >= target:
                break
            self._decode_one(data, seq)
        chunk = data.draw(st.integers(2, MAX_PROMPT), label="chunk")
        free = self.oracles[0].free(self.oracles[0].store_of(seq))
        if not (self.evicting or self.grows):  # within the room where every cell is kept (past it: full, no wrap)
            chunk = min(chunk, max(2, free))
        self._decode(f"a chunk of sequence {seq} past its window and sinks", self._batch(
            data, [seq], [chunk], mixed=False))

    # -- after every rule --------------------------------------------------------------------------------------

    @invariant()
    def every_sequence_holds_the_oracles_positions(self) -> None:
        self.tape.expect("after the last step", expect=Expect.STATE.value)
        oracle = self.oracles[0]
        for seq in range(self.sequences):
            got = (self.must("seq_pos_min", lambda: self.adapter.seq_pos_min(self.context, seq)),
                   self.must("seq_pos_max", lambda: self.adapter.seq_pos_max(self.context, seq)))
            wanted = (oracle.pos_min(seq), oracle.pos_max(seq))
            if got != wanted:
                raise NonConformance(f"after the last step: sequence {seq} holds positions {got[0]}..{got[1]} "
                                     f"(seq_pos_min, seq_pos_max), but should hold {wanted[0]}..{wanted[1]}",
                                     kind="wrong positions", check="positions")
