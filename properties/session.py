"""The stateful conformance machine for a model-wide decode session (docs/spec.md §9, §11).

The model side is the decoder's weights as the session's caches saw them and
the tokens processed since the session was created or reset; the oracle
recomputes all of them from scratch. Every prefill and decode must return the
oracle's logits, every call that raises must leave every block's cache as it
was, and after every rule every block's held rows must be the oracle's.

Steps with invalid tokens, on a stale session or past the capacity go to
every implementation. A step is checked in the documented order -- tokens,
then parameter revisions, then free capacity -- and the first failing check
names the error kind due. That kind is judged only where the adapter claims
the check (``CLAIMED_BY``); whatever an implementation raises, the session
must be as it was. An implementation that accepts such a step without
claiming the check is not judged on its result: its session has no specified
contents from then on, and the machine replaces it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from oracle import (
    FLOAT64,
    AttentionWeights,
    DecoderTrace,
    DecoderWeights,
    NumberSystem,
    full_decoder,
    random_decoder_weights,
)

from . import strategies as s
from .protocol import CLAIMED_BY, BlockState, DecoderAdapter, ErrorKind, declared
from .tolerance import Judge, Reference
from .trace import Draws, Tape, TracedMachine, initialize, invariant, rule
from .verdict import Inputs, NonConformance, attempt, call, expect_rejection, expect_success, update_block_weights


def raises(adapter: Any, capabilities: frozenset[str], tape: Tape, expected: ErrorKind, what: str,
           action: Any, handed: Inputs) -> bool:
    """A call whose first failing check gives ``expected``: did it raise?

    Where the adapter claims that check, it must raise ``expected`` (mapped); elsewhere anything it raises
    will do, and accepting is not judged. Either way the caller then proves that a call that raised
    changed nothing."""
    claim = CLAIMED_BY[expected].value
    judged = claim in capabilities
    if judged:
        tape.expect(what, rejected=expected.value, state="unchanged")
    else:
        tape.expect(what, first_failing_check=expected.value, judged=f"no: {claim} is not declared",
                    if_raises="nothing changed", if_accepts="result not judged; replaced")
    outcome = attempt(adapter, what, action, handed, judged=judged)
    if judged:
        expect_rejection(outcome, expected, what)
    return outcome.error is not None


def read_blocks(adapter: DecoderAdapter, session: Any, what: str) -> tuple[BlockState, ...]:
    blocks = expect_success(call(adapter, f"{what}: session state", lambda: adapter.session_state(session)),
                            f"{what}: session state")
    try:
        return tuple(BlockState(np.asarray(b.keys).copy(), np.asarray(b.values).copy(),
                                np.asarray(b.positions).copy()) for b in blocks)
    except AttributeError as error:
        raise NonConformance(f"{what}: a block state lacks keys, values or positions: {error}") from error


def same_blocks(before: tuple[BlockState, ...], after: tuple[BlockState, ...], what: str) -> None:
    """Raise unless every block's held rows and positions are byte for byte as before."""
    __tracebackhide__ = True
    if len(before) != len(after):
        raise NonConformance(f"{what}: {len(before)} block caches before, {len(after)} after, but a call "
                             "that raises must change no block's cache")
    for block, (old, new) in enumerate(zip(before, after)):
        for name in ("keys", "values", "positions"):
            a, b = getattr(old, name), getattr(new, name)
            if a.shape != b.shape or a.tobytes() != b.tobytes():
                raise NonConformance(f"{what}: block {block}'s cached {name} changed, "
                                     "but a call that raises must change no block's cache")


def blocks_match_oracle(blocks: tuple[BlockState, ...], trace: Reference[DecoderTrace] | None,
                        window: int | None, tokens: int, judge: Judge, what: str) -> None:
    """Each block holds the oracle's rows for the last ``window`` (or all) positions, with those positions."""
    __tracebackhide__ = True
    held = np.arange(max(0, tokens - window) if window else 0, tokens)
    for block, state in enumerate(blocks):
        if state.positions.shape != held.shape or not np.array_equal(state.positions, held):
            raise NonConformance(f"{what}: block {block} holds positions {state.positions.tolist()}, "
                                 f"but should hold {held.tolist()}")
        if trace is None:
            continue
        for name in ("keys", "values"):
            expected, tolerance = judge.bound(trace, lambda t: getattr(t, name)[block][:, held])
            judge.close(getattr(state, name), expected, tolerance, what=f"{what}: block {block} cached {name}",
                        axes=("head", "position", "feature"))


@st.composite
def block_updates(draw: st.DrawFn, weights: DecoderWeights, block: int) -> AttentionWeights:
    """New values for block ``block``'s four parameters (an optimiser step on that layer)."""
    old = weights.blocks[block]
    wq, wk, wv, wo = (w + draw(s.seeded_arrays(w.shape, 0.1)) for w in (old.wq, old.wk, old.wv, old.wo))
    return AttentionWeights(wq, wk, wv, wo, heads=old.heads, kv_heads=old.kv_heads)


class SessionMachine(TracedMachine):
    """Prefill, decode, reset, in-place weight updates, full sessions, invalid tokens, steps with two problems."""

    def __init__(self, adapter: DecoderAdapter, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__()
        self.adapter = adapter
        self.judge = Judge.for_adapter(adapter, numbers, layer_caches=False)
        self.capabilities = declared(getattr(adapter, "capabilities", ()))

    @initialize(data=st.data())
    def build_decoder_and_session(self, data: Draws) -> None:
        self.config = data.draw(s.decoder_configs(self.capabilities), label="decoder")
        self.weights = random_decoder_weights(self.config, data.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.capacity = data.draw(st.integers(1, s.MAX_SEQUENCE), label="capacity")
        what = "create the decoder"
        handed = Inputs()
        given = handed("weights", self.weights)
        self.decoder = expect_success(call(self.adapter, what, lambda: self.adapter.create_decoder(
            self.config, given), handed), what)
        self._new_session()

    def _new_session(self) -> None:
        what = "create a session"
        self.session = expect_success(call(self.adapter, what, lambda: self.adapter.create_session(
            self.decoder, self.capacity)), what)
        self.session_weights = self.weights  # what every cached row was computed with
        self.tokens: list[int] = []  # processed since creation or reset
        self.trace: Reference[DecoderTrace] | None = None
        self.stale = False  # a block's parameters written in place since the session was created

    def _oracle(self, tokens: list[int]) -> Reference[DecoderTrace]:
        return self.judge.reference(lambda numbers: full_decoder(tokens, self.config, self.session_weights,
                                                                 numbers=numbers))

    def _first_failing_check(self, tokens: list[int] | None) -> ErrorKind | None:
        """The documented order: tokens (None: invalid), then parameter revisions, then free capacity."""
        if tokens is None:
            return ErrorKind.INVALID_TOKENS
        if self.stale:
            return ErrorKind.REVISION_MISMATCH
        if len(self.tokens) + len(tokens) > self.capacity:
            return ErrorKind.FULL
        return None

    def _step(self, what: str, action: Any, handed: Inputs, tokens: list[int] | None, *, single: bool) -> None:
        """One prefill or decode of ``tokens`` (None: an invalid sequence), judged by the first failing check."""
        expected = self._first_failing_check(tokens)
        if expected is None:
            assert tokens is not None
            self._advance(tokens, what, action, handed, single=single)
            return
        before = read_blocks(self.adapter, self.session, what)
        if raises(self.adapter, self.capabilities, self.tape, expected, what, action, handed):
            same_blocks(before, read_blocks(self.adapter, self.session, what), what)
        else:
            self._new_session()  # accepted what it does not claim to check: its contents are unspecified now

    def _advance(self, new: list[int], what: str, action: Any, handed: Inputs, *, single: bool) -> None:
        """A step that must succeed: the oracle's logits (``[vocab]`` for one decoded token, else ``[T, vocab]``)."""
        trace = self._oracle(self.tokens + new)
        wanted, tolerance = self.judge.bound(trace, lambda t: t.logits[-1] if single else t.logits[len(self.tokens):])
        self.tape.expect(what, output=wanted, tolerance=tolerance)
        logits = np.asarray(expect_success(call(self.adapter, what, action, handed), what))
        self.judge.close(logits, wanted, tolerance, what=f"{what}: logits", axes=("position", "token"))
        self.tokens, self.trace = self.tokens + new, trace

    def _prefill(self, tokens: Any, problem: str | None = None) -> None:
        """Prefill ``tokens``: valid ids, or an invalid sequence described by ``problem``."""
        handed = Inputs()
        given = handed("tokens", tokens)
        self._step(f"prefill {problem or tokens}", lambda: self.adapter.prefill(self.session, given), handed,
                   None if problem else list(tokens), single=False)

    def _decode(self, token: Any, problem: str | None = None) -> None:
        handed = Inputs()
        given = handed("token", token)
        self._step(f"decode {problem or token}", lambda: self.adapter.decode(self.session, given), handed,
                   None if problem else [token], single=True)

    def _invalid_step(self, data: Draws) -> None:
        problem, tokens = data.draw(s.invalid_token_sequences(self.config.vocab), label="invalid tokens")
        if data.draw(st.booleans(), label="through decode") and isinstance(tokens, list) and len(tokens) == 1:
            self._decode(tokens[0], problem)
        else:
            self._prefill(tokens, problem)

    def _valid_step(self, data: Draws) -> None:
        if data.draw(st.booleans(), label="through decode"):
            self._decode(data.draw(st.integers(0, self.config.vocab - 1), label="token"))
        else:
            self._prefill(data.draw(s.token_lists(self.config.vocab), label="tokens"))

    def _fill(self, data: Draws, count: int) -> None:
        """Prefill ``count`` valid tokens into the current session, if ``count`` > 0."""
        if count > 0:
            self._prefill(data.draw(s.token_lists(self.config.vocab, count, count), label="prompt"))

    def _update_block(self, block: int, new: AttentionWeights) -> None:
        """Write block ``block``'s parameters in place: the session is stale, for every implementation
        (whether a step then says so is judged only with binding_checks)."""
        self.weights = update_block_weights(self.adapter, self.decoder, self.weights, block, new,
                                            f"update block {block}'s weights in place")
        self.stale = True

    # -- single steps, in whatever state the session is --------------------------------------------------

    @rule(data=st.data())
    def prefill(self, data: Draws) -> None:
        self._prefill(data.draw(s.token_lists(self.config.vocab), label="tokens"))

    @rule(data=st.data())
    def decode(self, data: Draws) -> None:
        self._decode(data.draw(st.integers(0, self.config.vocab - 1), label="token"))

    @rule(data=st.data())
    def step_with_invalid_tokens(self, data: Draws) -> None:
        """Checked first, before staleness or capacity: INVALID_TOKENS (judged with token validation);
        if it raises, no block changed."""
        self._invalid_step(data)

    @rule()
    def reset(self) -> None:
        expect_success(call(self.adapter, "reset the session", lambda: self.adapter.reset_session(self.session)),
                       "reset the session")
        self.tokens, self.trace = [], None

    @rule(data=st.data())
    def update_one_block_in_place(self, data: Draws) -> None:
        """Only this block's parameters change; the session is stale as a whole."""
        block, new = data.draw(s.block_update(self.weights), label="block update")
        self._update_block(block, new)

    @rule(when=lambda self: self.stale or len(self.tokens) == self.capacity)
    def replace_session(self) -> None:
        self._new_session()

    # -- the order of checks: each scenario set up whole in one rule (Hypothesis disables a random subset
    # of rules in every run, which would keep a set-up spread over rules apart from its step) -------------

    @rule(data=st.data())
    def revision_checked_before_capacity(self, data: Draws) -> None:
        """A new session filled to capacity, then a later block updated in place: a step must report
        revision_mismatch, not full -- the revisions of every block before the capacity, not block by block."""
        self._new_session()
        self._fill(data, self.capacity)
        last = self.config.blocks - 1
        block = data.draw(st.integers(min(1, last), last), label="stale block")
        self._update_block(block, data.draw(block_updates(self.weights, block), label="new weights"))
        self._valid_step(data)

    @rule(data=st.data())
    def tokens_checked_before_revision(self, data: Draws) -> None:
        """A new session with room, holding some rows, then a block updated in place: invalid tokens must
        report invalid_tokens, not revision_mismatch."""
        self._new_session()
        self._fill(data, data.draw(st.integers(0, self.capacity - 1), label="prompt length"))
        block, new = data.draw(s.block_update(self.weights), label="block update")
        self._update_block(block, new)
        self._invalid_step(data)

    @rule(data=st.data())
    def tokens_checked_before_capacity(self, data: Draws) -> None:
        """A new session filled to capacity: invalid tokens must report invalid_tokens, not full."""
        self._new_session()
        self._fill(data, self.capacity)
        self._invalid_step(data)

    @invariant()
    def every_block_matches_the_oracle(self) -> None:
        self.tape.expect("after the last step", tokens=len(self.tokens))
        blocks = read_blocks(self.adapter, self.session, "after the last step")
        if len(blocks) != self.config.blocks:
            raise NonConformance(f"the session has {len(blocks)} block caches, "
                                 f"but the decoder has {self.config.blocks} blocks")
        if self.tokens and self.trace is None:
            self.trace = self._oracle(self.tokens)
        blocks_match_oracle(blocks, self.trace, self.config.window, len(self.tokens), self.judge,
                            "after the last step")
