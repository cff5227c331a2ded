"""The stateful conformance machine for a model-wide decode session (SPEC §4, §6).

The model side is the decoder's weights as the session's caches saw them and
the tokens processed since the session was created or reset; the oracle
recomputes all of them from scratch. Every prefill and decode must return the
oracle's logits, every rejection must leave every block's cache as it was,
and after every rule every block's held rows must be the oracle's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from oracle import FLOAT64, DecoderTrace, NumberSystem, full_decoder, random_decoder_weights

from . import strategies as s
from .protocol import BlockState, Capability, DecoderAdapter, ErrorKind
from .tolerance import Judge, Reference, declared_dtype
from .trace import Draws, TracedMachine, initialize, invariant, rule
from .verdict import Inputs, NonConformance, call, expect_rejection, expect_success


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
    for block, (old, new) in enumerate(zip(before, after)):
        for name in ("keys", "values", "positions"):
            a, b = getattr(old, name), getattr(new, name)
            if a.shape != b.shape or a.tobytes() != b.tobytes():
                raise NonConformance(f"{what}: block {block}'s cached {name} changed, "
                                     "but a rejected call must change no block's cache")


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


class SessionMachine(TracedMachine):
    """Prefill, decode, reset, in-place weight updates, full sessions, invalid tokens."""

    def __init__(self, adapter: DecoderAdapter, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__()
        self.adapter = adapter
        self.judge = Judge(declared_dtype(adapter), numbers)
        self.capabilities = frozenset(getattr(adapter, "capabilities", ()))

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
        self.stale = False

    def _oracle(self, tokens: list[int]) -> Reference[DecoderTrace]:
        return self.judge.reference(lambda numbers: full_decoder(tokens, self.config, self.session_weights,
                                                                 numbers=numbers))

    def _advance(self, new: list[int], what: str, action: Any, handed: Inputs, *, single: bool) -> None:
        """A step of valid tokens: the oracle's logits (``[vocab]`` for one decoded token, else
        ``[T, vocab]``), or FULL / REVISION_MISMATCH with nothing changed."""
        expected = ErrorKind.REVISION_MISMATCH if self.stale else (
            ErrorKind.FULL if len(self.tokens) + len(new) > self.capacity else None)
        if expected is ErrorKind.FULL and Capability.FIXED_CAPACITY.value not in self.capabilities:
            return  # past its capacity such a session has no specified behaviour: not asked
        before = read_blocks(self.adapter, self.session, what)
        if expected is not None:
            self.tape.expect(what, rejected=expected.value, state="unchanged")
            outcome = call(self.adapter, what, action, handed)
            expect_rejection(outcome, expected, what)
            same_blocks(before, read_blocks(self.adapter, self.session, what), what)
            return
        trace = self._oracle(self.tokens + new)
        wanted, tolerance = self.judge.bound(trace, lambda t: t.logits[-1] if single else t.logits[len(self.tokens):])
        self.tape.expect(what, output=wanted, tolerance=tolerance)
        logits = np.asarray(expect_success(call(self.adapter, what, action, handed), what))
        self.judge.close(logits, wanted, tolerance, what=f"{what}: logits", axes=("position", "token"))
        self.tokens, self.trace = self.tokens + new, trace

    @rule(data=st.data())
    def prefill(self, data: Draws) -> None:
        tokens = data.draw(s.token_lists(self.config.vocab), label="tokens")
        handed = Inputs()
        given = handed("tokens", tokens)
        self._advance(tokens, f"prefill {tokens}", lambda: self.adapter.prefill(self.session, given), handed,
                      single=False)

    @rule(data=st.data())
    def decode(self, data: Draws) -> None:
        token = data.draw(st.integers(0, self.config.vocab - 1), label="token")
        self._advance([token], f"decode {token}", lambda: self.adapter.decode(self.session, token), Inputs(),
                      single=True)

    @rule(data=st.data(), requires=[Capability.INPUT_VALIDATION])
    def step_with_invalid_tokens(self, data: Draws) -> None:
        """Checked first, before staleness or capacity: INVALID_TOKENS, no block changed."""
        problem, tokens = data.draw(s.invalid_token_sequences(self.config.vocab), label="invalid tokens")
        decode = data.draw(st.booleans(), label="through decode")
        handed = Inputs()
        given = handed("tokens", tokens)
        if decode and isinstance(tokens, list) and len(tokens) == 1:
            what, action = f"decode {problem}", lambda: self.adapter.decode(self.session, given[0])
        else:
            what, action = f"prefill {problem}", lambda: self.adapter.prefill(self.session, given)
        before = read_blocks(self.adapter, self.session, what)
        self.tape.expect(what, rejected=ErrorKind.INVALID_TOKENS.value, state="unchanged")
        expect_rejection(call(self.adapter, what, action, handed), ErrorKind.INVALID_TOKENS, what)
        same_blocks(before, read_blocks(self.adapter, self.session, what), what)

    @rule()
    def reset(self) -> None:
        expect_success(call(self.adapter, "reset the session", lambda: self.adapter.reset_session(self.session)),
                       "reset the session")
        self.tokens, self.trace = [], None

    @rule(data=st.data())
    def update_one_block_in_place(self, data: Draws) -> None:
        """Only this block's parameters change; the session is stale as a whole."""
        block, new = data.draw(s.block_update(self.weights), label="block update")
        what = f"update block {block}'s weights in place"
        handed = Inputs()
        given = handed("weights", new)
        expect_success(call(self.adapter, what, lambda: self.adapter.update_block_weights(
            self.decoder, block, given), handed), what)
        blocks = list(self.weights.blocks)
        blocks[block] = new
        self.weights = replace(self.weights, blocks=tuple(blocks))  # type: ignore[misc]
        if Capability.BINDING_CHECKS.value in self.capabilities:
            self.stale = True
        else:
            self._new_session()  # without binding checks a stale session has no specified behaviour

    @rule(when=lambda self: self.stale or len(self.tokens) == self.capacity)
    def replace_session(self) -> None:
        self._new_session()

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
