"""The machine side of the judging core: what every conformance machine shares.

``ConformanceMachine`` holds the adapter, what it declares (capabilities,
layer limits, the tolerance rule) and routes every judged adapter call
through the one call policy (``judge.policy``). The helpers below it are
shared by the machines that drive a decoder -- the session, the prefix store
and the paged pool -- so that no machine imports another.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
from hypothesis import note, target

from ..generate.needs import Needs
from ..judge.calls import Inputs, call
from ..judge.checks import expect_success, window_positions
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect, Held, Judged, Observed, judge_call
from ..judge.tolerance import Judge, Reference
from ..oracle import FLOAT64, AttentionWeights, DecoderConfig, DecoderTrace, DecoderWeights, NumberSystem, full_decoder
from ..protocol.declarations import LayerLimits
from ..protocol.decoder import BlockState
from ..protocol.kinds import Capability, declared
from ..traces.recording import TracedMachine

# What became of a judged call, as the exercise counts name it (run/exercise.py adds them up): a claimed check's
# rejection, an allowed refusal, an unclaimed check's raise, an unclaimed input accepted (the object replaced).
CALL_OUTCOMES = ("succeeded", "rejected", "refused", "raised", "replaced")
SET_UP = "(set-up)"  # calls before the first rule's step (none: every rule's calls are its own)


def call_outcome(expect: Expect, judged: Judged) -> str:
    if judged.replaced:
        return "replaced"
    if not judged.refused:
        return "succeeded"
    return {Expect.REJECTION: "rejected", Expect.UNCLAIMED: "raised"}.get(expect, "refused")


class ConformanceMachine(TracedMachine):
    """A differential machine over one adapter: the implementation on one side, the oracle on the other.

    ``exercise`` counts, per rule, its judged calls by outcome (``CALL_OUTCOMES``) and the interesting cases its
    rules met (``exercised``); ``claims_rejected`` the claims whose checks rejected a call. A pass says what it
    exercised from these (``run.exercise``)."""

    layer_caches: ClassVar[bool] = True  # whether a declared ``storage`` applies (it is about layer caches)

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__()
        self.adapter = adapter
        self.capabilities = declared(getattr(adapter, "capabilities", ()))
        self.limits = LayerLimits.of(adapter)
        self.judge = Judge.for_adapter(adapter, numbers, layer_caches=self.layer_caches)
        self.targeting = False  # the runner sets it when the profile hill-climbs (Hypothesis's target phase)
        self.exercise: Counter[tuple[str, str]] = Counter()  # (rule, call outcome or case) -> times
        self.claims_rejected: Counter[str] = Counter()

    @classmethod
    def needs(cls, **parameters: Any) -> Needs:
        """What an adapter must declare for this machine, run with ``parameters``, to apply (the one gate:
        ``generate.needs``)."""
        return Needs()

    def has(self, capability: Capability | str) -> bool:
        return str(getattr(capability, "value", capability)) in self.capabilities

    def call(self, what: str, action: Callable[[], Any], *, due: Due = VALID, inputs: Inputs | None = None,
             observe: Callable[[], Observed] | None = None, replace: Callable[[], None] | None = None,
             held: Held | None = None, **details: Any) -> Judged:
        """One judged adapter call (docs/spec.md §5), its expectation written on the tape."""
        __tracebackhide__ = True
        judged = judge_call(self.adapter, self.capabilities, self.tape.expect, what, action, due=due, inputs=inputs,
                            observe=observe, replace=replace, held=held, **details)
        expect = due.expect(self.capabilities)
        self.tape.judged(expect.value, judged.replaced)
        self.exercise[(self._rule(), call_outcome(expect, judged))] += 1
        if expect is Expect.REJECTION and due.claim is not None:
            self.claims_rejected[due.claim] += 1
        return judged

    def exercised(self, case: str) -> None:
        """The current rule met its interesting case (a prefix hit, an eviction, a fork...): counted for the
        report, so that a pass says whether it ever happened."""
        self.exercise[(self._rule(), case)] += 1

    def _rule(self) -> str:
        return self.tape.steps[-1].rule if self.tape.steps else SET_UP

    def must(self, what: str, action: Callable[[], Any], inputs: Inputs | None = None) -> Any:
        """A call that must succeed and is not itself the step judged (creating, reading, updating)."""
        __tracebackhide__ = True
        return expect_success(call(self.adapter, what, action, inputs), what)

    def teardown(self) -> None:
        error, tolerance = self.judge.worst
        note(f"worst |error| against the oracle: {error:.3e} (tolerance {tolerance:.1e})")
        if self.targeting:  # only the target phase reads it; elsewhere it only costs (the database's Pareto front)
            target(error / tolerance, label="worst |error| / tolerance")


# -- what the decoder machines share ------------------------------------------------------------------------

def create_decoder(machine: ConformanceMachine, config: DecoderConfig, weights: DecoderWeights,
                   what: str = "create a decoder") -> Any:
    handed = Inputs()
    given = handed("weights", weights)
    return machine.must(what, lambda: machine.adapter.create_decoder(config, given), handed)


def update_block_weights(machine: ConformanceMachine, decoder: Any, weights: DecoderWeights, block: int,
                         new: AttentionWeights, what: str) -> DecoderWeights:
    """Write block ``block``'s parameters in place through the adapter (which must succeed); the decoder's
    weights afterwards."""
    handed = Inputs()
    given = handed("weights", new)
    machine.must(what, lambda: machine.adapter.update_block_weights(decoder, block, given), handed)
    blocks = list(weights.blocks)
    blocks[block] = new
    return replace(weights, blocks=tuple(blocks))  # type: ignore[misc]


def block_states(rows: Sequence[Any], what: str) -> tuple[BlockState, ...]:
    """Copies of per-block (or per-layer) rows an adapter returned, as ``BlockState``s."""
    try:
        return tuple(BlockState(np.array(r.keys), np.array(r.values), np.array(r.positions)) for r in rows)
    except AttributeError as error:
        raise NonConformance(f"{what}: a block's rows lack keys, values or positions: {error}",
                             kind="malformed rows") from error


def rows_by_position(keys: np.ndarray, values: np.ndarray, positions: Any, *, axis: int,
                     prefix: str = "") -> dict[str, Any]:
    """Each key and value row of ``keys`` and ``values`` (along ``axis``) by its position: what an accepted call
    must keep (``policy.Held``). A cache left inconsistent by a call it accepted unclaimed may show fewer value
    rows than key rows (or than positions): a row it does not show is not held, so never a suite error."""
    rows: dict[str, Any] = {}
    for index, position in enumerate(np.asarray(positions).tolist()):
        if index < keys.shape[axis]:
            rows[f"{prefix}key row at position {position}"] = np.take(keys, index, axis=axis)
        if index < values.shape[axis]:
            rows[f"{prefix}value row at position {position}"] = np.take(values, index, axis=axis)
    return rows


def held_block_rows(seen: Observed) -> dict[str, Any]:
    """The rows of every block of an ``observed_blocks`` observation, by block and position."""
    rows: dict[str, Any] = {}
    for index in range(int(seen["blocks"])):
        rows.update(rows_by_position(seen[f"block {index} keys"], seen[f"block {index} values"],
                                     seen[f"block {index} positions"], axis=-2, prefix=f"block {index} "))
    return rows


def observed_blocks(blocks: Sequence[BlockState], prefix: str = "") -> dict[str, Any]:
    """What a call must not change of these blocks' rows, by name."""
    seen: dict[str, Any] = {f"{prefix}blocks": len(blocks)}
    for index, block in enumerate(blocks):
        for name in ("keys", "values", "positions"):
            seen[f"{prefix}block {index} {name}"] = getattr(block, name)
    return seen


def blocks_match_oracle(blocks: Sequence[BlockState], trace: Reference[DecoderTrace] | None, window: int | None,
                        tokens: int, judge: Judge, what: str) -> None:
    """Each block holds the oracle's rows: every position, or with a window at least the ones the next query sees
    (older ones allowed, docs/spec.md §9.1), each at its position."""
    __tracebackhide__ = True
    for block, state in enumerate(blocks):
        if window:
            window_positions(np.asarray(state.positions).tolist(), tokens, window, f"{what}: block {block}")
            held = np.asarray(state.positions, dtype=np.int64)
        else:
            held = np.arange(tokens)
            if state.positions.shape != held.shape or not np.array_equal(state.positions, held):
                raise NonConformance(f"{what}: block {block} holds positions {state.positions.tolist()}, "
                                     f"but should hold {held.tolist()}", kind="held rows at wrong positions",
                                     check="held positions")
        if trace is None:
            continue
        for name in ("keys", "values"):
            expected, tolerance = judge.bound(trace, lambda t: getattr(t, name)[block][:, held])
            judge.close(getattr(state, name), expected, tolerance, what=f"{what}: block {block} cached {name}",
                        check=f"cached {name}", axes=("head", "cached row", "feature"))


def signature(weights: DecoderWeights) -> str:
    """The weights' content: decoders with equal weights (and configuration) compute the same rows."""
    digest = hashlib.sha256()
    for array in (weights.embedding, *(w for b in weights.blocks for w in (b.wq, b.wk, b.wv, b.wo))):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


class DecoderOracle:
    """Full recomputation of a decoder, remembered per (weights object, tokens): invariants ask after every step."""

    def __init__(self, config: DecoderConfig, judge: Judge) -> None:
        self.config, self.judge = config, judge
        self._known: dict[tuple[int, tuple[int, ...]], tuple[DecoderWeights, Reference[DecoderTrace]]] = {}

    def __call__(self, weights: DecoderWeights, tokens: Sequence[int]) -> Reference[DecoderTrace]:
        key = (id(weights), tuple(tokens))
        known = self._known.get(key)
        if known is None or known[0] is not weights:
            known = (weights, self.judge.reference(lambda numbers: full_decoder(
                list(tokens), self.config, weights, numbers=numbers)))
            self._known[key] = known
        return known[1]
