"""The conformance machine of a whole model over sequences (docs/spec.md §15, capability ``whole_model``).

The model side is the oracle's cell model (``oracle.model.CellContext``) of the context under test, driven
alike: it says what each call is due (it refuses with the spec's kind before changing anything), and a valid
decode's logits are its own. For a low-precision adapter a second cell model computes the naive baseline in
the declared dtype over the declared ``kv_storage`` (docs/spec.md §15.6), whose error sets the tolerance.

Rules interleave, over two or three sequences: prompts, single tokens and batches mixing sequences; removals
at the end, in the middle and of every sequence; copies (whole and range, into empty and non-empty
sequences); keeps, shifts, divides; saves and loads (the same id, another id, a fresh context); clears;
malformed batches, batches past the room, operations on unknown sequences. Every logit asked for is
compared with the oracle, and after every rule every sequence's smallest and largest positions. A call that
raised must change nothing: the positions are compared at once, the cells by the logits of what comes next.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .. import generate as g
from ..generate.models import MAX_PROMPT, POSITION_CEILING
from ..generate.needs import ROPE_PAIRING, Needs
from ..judge.calls import Inputs
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect, Judged
from ..judge.tolerance import Judge, Reference
from ..oracle import FLOAT64, ModelBatch, NumberSystem, random_model_weights
from ..oracle.model import CellContext, Model, ModelRefusal, kv_storage_of
from ..protocol.kinds import Capability, ErrorKind
from ..protocol.model import ModelLimits, ModelPolicy
from ..traces.recording import Draws, NotApplicable, initialize, invariant, rule
from .base import ConformanceMachine

KINDS = {"full": ErrorKind.FULL, "malformed_batch": ErrorKind.MALFORMED_BATCH, "refused": ErrorKind.REFUSED}
MALFORMATIONS = ("token out of the vocabulary", "positions not consecutive", "unknown sequence")
RANGES = ("all", "to the end", "from the start", "in the middle")
SAVED = 3  # saved sequences kept for later loads
# A save as it is, or on purpose followed at once by a load of it under another id: a context that keeps a loaded
# sequence where the saved one was (the first sequence's store, say) shows only there, and a load needs a save before
# it in the same program.
SAVES = ("a save", "a save, then a load of it under another id")


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

    @initialize(data=st.data())
    def build_model_and_context(self, data: Draws) -> None:
        """A tiny model of a declared RoPE pairing, and a context of a declared kind."""
        self.config = data.draw(g.model_configs(self.capabilities, self.model_limits), label="model")
        self.weights = random_model_weights(self.config, data.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.context_config = data.draw(g.context_configs(self.policy, self.model_limits), label="context")
        kind = "unified" if self.context_config.unified else "per_sequence"
        outside = self.model_limits.model_problem(self.config) or self.model_limits.context_problem(
            self.context_config) or (None if kind in self.policy.contexts else
                                     f"a {kind} context, but model_policy contexts are {sorted(self.policy.contexts)}")
        if outside is not None:  # only a replayed trace gives one: live draws stay within the declarations
            raise NotApplicable(f"the recorded model and context are outside what {self.adapter.name} declares: "
                                f"{outside}")
        handed = Inputs()
        given = handed("weights", self.weights)
        self.model = self.must("create the model", lambda: self.adapter.create_model(self.config, given), handed)
        naive = self.judge.naive
        self.oracle_models = [Model(self.config, self.weights, numbers=self.judge.oracle)]
        if naive is not None:
            self.oracle_models.append(Model(self.config, self.weights, numbers=naive,
                                            kv_storage=kv_storage_of(self.judge.kv_storage, naive)))
        self.saved: list[tuple[Any, list[Any], int]] = []  # the adapter's state, the oracles', the cells saved
        self._new_context()

    def _new_context(self) -> None:
        """A new empty context under test, and its cell models."""
        config = self.context_config
        self.context = self.must("create a context", lambda: self.adapter.create_context(self.model, config))
        cells = self.must("the context's cells", lambda: self.adapter.context_cells(self.context))
        if not isinstance(cells, int) or cells < config.stream_cells:
            raise NonConformance(f"context_cells is {cells!r}, but a context of {config} has at least "
                                 f"{config.stream_cells} cells per store", kind="too few cells", check="cells")
        copy = self.policy.copy_into_nonempty(config.unified)
        self.oracles = [CellContext(model, config, shared_copies=self.policy.shared_copies, copy_into_nonempty=copy,
                                    stream_cells=cells) for model in self.oracle_models]

    @property
    def sequences(self) -> int:
        return self.context_config.max_sequences

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

    def _snapshot(self) -> list[list[list[tuple[Any, int, frozenset[int]]]]]:
        return [[[(cell, cell.position, frozenset(cell.sequences)) for cell in store] for store in oracle.stores]
                for oracle in self.oracles]

    def _restore(self, snapshot: list[list[list[tuple[Any, int, frozenset[int]]]]]) -> None:
        for oracle, stores in zip(self.oracles, snapshot):
            for store in stores:
                for cell, position, sequences in store:
                    cell.position, cell.sequences = position, set(sequences)
            oracle.stores = [[cell for cell, _, _ in store] for store in stores]

    def _operation(self, what: str, on_oracle: Any, action: Any, *, inputs: Inputs | None = None,
                   may_refuse: ErrorKind | None = None, **details: Any) -> tuple[Judged, list[Any] | None]:
        """Do ``on_oracle`` to every cell model and judge the adapter's ``action`` by what the oracle did: valid
        (its results returned), or refused with its kind (changing nothing). A call accepted without the claim
        its refusal is judged under replaces the context."""
        __tracebackhide__ = True
        snapshot = self._snapshot()
        results: list[Any] | None
        try:
            results = [on_oracle(oracle) for oracle in self.oracles]
            due = VALID if may_refuse is None else Due(may_refuse=may_refuse)
        except ModelRefusal as refusal:
            results, due = None, Due.check(KINDS[refusal.kind])
        judged = self.call(what, action, due=due, inputs=inputs, observe=self._observe, replace=self._new_context,
                           **details)
        if judged.refused and results is not None:
            self._restore(snapshot)
            results = None
        return judged, results

    # -- batches ---------------------------------------------------------------------------------------------

    def _next_position(self, seq: int, data: Draws) -> int:
        held = self.oracles[0].pos_max(seq)
        return held + 1 if held >= 0 else data.draw(st.integers(0, 3), label=f"sequence {seq} starts at")

    def _batch(self, data: Draws, chosen: list[int], counts: list[int], *, mixed: bool) -> ModelBatch:
        """``counts[i]`` tokens of sequence ``chosen[i]`` at its next positions, in order or interleaved."""
        parts = []
        for seq, count in zip(chosen, counts):
            start = self._next_position(seq, data)
            count = max(1, min(count, POSITION_CEILING - start))
            tokens = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                               label=f"sequence {seq} tokens")
            parts.append([(t, start + i, seq) for i, t in enumerate(tokens)])
        order = [entry for part in parts for entry in part]
        if mixed and len(parts) > 1:  # round robin: each sequence's positions still in order
            order = [part[i] for i in range(max(map(len, parts))) for part in parts if i < len(part)]
        order = order[:self.max_batch]
        wanted = data.draw(st.lists(st.booleans(), min_size=len(order), max_size=len(order)), label="logits of")
        wanted[-1] = True  # at least the last token's logits, as a sampler asks
        return ModelBatch(tuple(t for t, _, _ in order), tuple(p for _, p, _ in order),
                          tuple(s for _, _, s in order), tuple(wanted))

    def _decode(self, what: str, batch: ModelBatch) -> None:
        """Decode ``batch``: the oracle's logits of every token asked for, or the oracle's refusal."""
        handed = Inputs()
        given = handed("batch", batch)
        judged, results = self._operation(what, lambda oracle: oracle.decode(batch),
                                          lambda: self.adapter.decode_batch(self.context, given), inputs=handed,
                                          tokens=list(batch.tokens), positions=list(batch.positions),
                                          sequences=list(batch.sequences))
        if results is None or not judged.to_judge:
            return
        expected, tolerance = self.judge.bound(Reference(results[0], results[1] if len(results) > 1 else None),
                                               lambda logits: logits)
        self.judge.close(judged.value, expected, tolerance, what=f"{what}: logits", check="logits",
                         axes=("token asked for", "vocab id"))

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
        chosen = data.draw(st.lists(st.integers(0, self.sequences - 1), min_size=2, max_size=self.sequences,
                                    unique=True), label="sequences")
        counts = data.draw(st.lists(st.integers(1, 2), min_size=len(chosen), max_size=len(chosen)), label="counts")
        self._decode(f"a batch of sequences {chosen}", self._batch(
            data, chosen, counts, mixed=data.draw(st.booleans(), label="interleaved")))

    @rule(data=st.data())
    def malformed_batch(self, data: Draws) -> None:
        """A batch with a token outside the vocabulary, positions that do not run on one by one, or an unknown
        sequence: malformed_batch (judged with validates_model_batch), changing nothing."""
        seq = self._a_sequence(data)
        batch = self._batch(data, [seq], [data.draw(st.integers(1, 3), label="tokens")], mixed=False)
        problem = data.draw(st.sampled_from(MALFORMATIONS), label="malformation")
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
            fields["sequences"][index] = data.draw(st.sampled_from([self.sequences, self.sequences + 1, -1]),
                                                   label="sequence id")
        broken = ModelBatch(tuple(fields["tokens"]), tuple(fields["positions"]), tuple(fields["sequences"]),
                            batch.logits[:len(fields["tokens"])])
        self._decode(f"a batch with {problem}", broken)

    @rule(data=st.data())
    def batch_past_the_room(self, data: Draws) -> None:
        """More tokens for one sequence's store than it has free cells: full (judged with fixed_capacity),
        changing nothing."""
        seq = self._a_sequence(data)
        oracle = self.oracles[0]
        free = oracle.free(oracle.store_of(seq))
        start = self._next_position(seq, data)
        count = free + data.draw(st.integers(1, 2), label="past the room by")
        if count > self.max_batch or start + count > POSITION_CEILING:
            return  # not drawable within max_batch and the positions: nothing asked
        tokens = data.draw(st.lists(st.integers(0, self.config.vocab - 1), min_size=count, max_size=count),
                           label="tokens")
        self._decode(f"{count} tokens into sequence {seq} with {free} free cells",
                     ModelBatch.of_sequence(seq, tokens, start, all_logits=False))

    # -- sequence operations -----------------------------------------------------------------------------------

    def _range(self, data: Draws, seq: int) -> tuple[int, int]:
        """A position range of llama.h's form ``[p0, p1)``, negative meaning open, around ``seq``'s cells."""
        top = max(self.oracles[0].pos_max(seq), 0) + 2
        kind = data.draw(st.sampled_from(RANGES), label="range")
        if kind == "all":
            return -1, -1
        p = data.draw(st.integers(0, top), label="p")
        if kind == "to the end":
            return p, -1
        if kind == "from the start":
            return -1, p
        return p, p + data.draw(st.integers(1, 3), label="width")

    def _sequence_call(self, operation: str, what: str, on_oracle: Any, action: Any, **details: Any) -> None:
        self._operation(what, on_oracle, action, may_refuse=self._may_refuse(operation, details), **details)

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
        return None

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

    @rule(data=st.data(), requires=[Capability.SEQ_COPY], when=lambda self: self.sequences > 1)
    def copy(self, data: Draws) -> None:
        """One sequence's cells (all, or a range) into another, empty or not: merged or replacing as
        declared. The source is one holding cells, if any does."""
        held = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) >= 0]
        src = data.draw(st.sampled_from(held or list(range(self.sequences))), label="source")
        dst = data.draw(st.sampled_from([seq for seq in range(self.sequences) if seq != src]), label="destination")
        p0, p1 = (-1, -1) if self.whole_copies_only or data.draw(st.booleans(), label="whole") else \
            self._range(data, src)
        self._copy(src, dst, p0, p1)

    def _copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        nonempty = self.oracles[0].pos_max(dst) >= 0
        into = "non-empty" if nonempty else "empty"
        self._sequence_call("copy", f"copy [{p0}, {p1}) of sequence {src} into {into} sequence {dst}",
                            lambda o: o.copy(src, dst, p0, p1),
                            lambda: self.adapter.seq_copy(self.context, src, dst, p0, p1),
                            src=src, dst=dst, p0=p0, p1=p1)

    @rule(data=st.data(), requires=[Capability.SEQ_KEEP])
    def keep(self, data: Draws) -> None:
        """Every other sequence's cells removed (a cell it shares leaves the others). The sequence kept is one
        holding cells, if any does."""
        held = [seq for seq in range(self.sequences) if self.oracles[0].pos_max(seq) >= 0]
        self._keep(data.draw(st.sampled_from(held or list(range(self.sequences))), label="sequence"))

    def _keep(self, seq: int) -> None:
        self._sequence_call("keep", f"keep sequence {seq}", lambda o: o.keep(seq),
                            lambda: self.adapter.seq_keep(self.context, seq), seq=seq)

    @rule(data=st.data(), requires=[Capability.SEQ_SHIFT])
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
        self._sequence_call("shift", f"shift [{p0}, {p1}) of sequence {seq} by {delta}",
                            lambda o: o.shift(seq, p0, p1, delta),
                            lambda: self.adapter.seq_shift(self.context, seq, p0, p1, delta),
                            seq=seq, p0=p0, p1=p1, delta=delta)

    @rule(data=st.data(), requires=[Capability.SEQ_COPY], when=lambda self: self.sequences > 1)
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
        seq = data.draw(st.sampled_from([src, dst]), label="changed")
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
        positions = [c.position for c in moved] + [self.oracles[0].pos_max(s) for s in sharers]
        return (min(positions), max(positions)) if positions else (0, 0)

    @rule(data=st.data(), requires=[Capability.SEQ_DIVIDE])
    def divide(self, data: Draws) -> None:
        """A range of one sequence's positions integer-divided by 1-3 (positions may then repeat)."""
        seq = self._a_sequence(data)
        p0, p1 = self._range(data, seq)
        d = data.draw(st.integers(1, 3), label="divisor")
        self._sequence_call("divide", f"divide [{p0}, {p1}) of sequence {seq} by {d}",
                            lambda o: o.divide(seq, p0, p1, d),
                            lambda: self.adapter.seq_divide(self.context, seq, p0, p1, d), seq=seq, p0=p0, p1=p1,
                            d=d)

    @rule(data=st.data(), requires=[Capability.SEQ_STATE])
    def save(self, data: Draws) -> None:
        """One sequence's cells saved, for a later load; on purpose, loaded at once under another id (``SAVES``)."""
        seq = self._a_sequence(data)
        judged, results = self._operation(f"save sequence {seq}", lambda o: o.save(seq),
                                          lambda: self.adapter.save_sequence(self.context, seq), seq=seq)
        if results is not None and judged.to_judge:
            self.saved = [*self.saved, (judged.value, results, len(results[0].cells))][-SAVED:]
            if self.sequences >= 2 and data.optional(g.on_purpose(*SAVES), "saves", SAVES[0]) == SAVES[1]:
                other = data.draw(st.sampled_from([s for s in range(self.sequences) if s != seq]), label="under")
                self._load_saved(len(self.saved) - 1, other, "this context")

    def _load(self, data: Draws, where: str) -> None:
        index = data.draw(st.integers(0, len(self.saved) - 1), label="saved")
        self._load_saved(index, self._a_sequence(data), where)

    def _load_saved(self, index: int, seq: int, where: str) -> None:
        state, oracle_states, count = self.saved[index]
        states = iter(oracle_states)
        self._operation(f"load {count} saved cells into sequence {seq} of {where}",
                        lambda o: o.load(seq, next(states)),
                        lambda: self.adapter.load_sequence(self.context, seq, state), seq=seq, saved=index)

    @rule(data=st.data(), requires=[Capability.SEQ_STATE], when=lambda self: bool(self.saved))
    def load(self, data: Draws) -> None:
        """A saved sequence loaded into this context, under its own id or another: that sequence holds exactly
        the saved cells (its own removed first), full if they do not fit."""
        self._load(data, "this context")

    @rule(data=st.data(), requires=[Capability.SEQ_STATE], when=lambda self: bool(self.saved))
    def load_into_a_fresh_context(self, data: Draws) -> None:
        """A new empty context of the same model, and a saved sequence loaded into it (it carries on there)."""
        self._new_context()
        self._load(data, "a fresh context")

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
