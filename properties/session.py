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
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from oracle import FLOAT64, DecoderTrace, NumberSystem, full_decoder, random_decoder_weights

from . import strategies as s
from .protocol import BlockState, DecoderAdapter, ErrorKind
from .verdict import NonConformance, assert_close, call, expect_rejection, expect_success


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


def blocks_match_oracle(blocks: tuple[BlockState, ...], trace: DecoderTrace | None, window: int | None,
                        tokens: int, tolerance: float, what: str) -> float:
    """Each block holds the oracle's rows for the last ``window`` (or all) positions, with those positions."""
    __tracebackhide__ = True
    held = np.arange(max(0, tokens - window) if window else 0, tokens)
    worst = 0.0
    for block, state in enumerate(blocks):
        if state.positions.shape != held.shape or not np.array_equal(state.positions, held):
            raise NonConformance(f"{what}: block {block} holds positions {state.positions.tolist()}, "
                                 f"but should hold {held.tolist()}")
        if trace is None:
            continue
        for name in ("keys", "values"):
            expected = getattr(trace, name)[block][:, held]
            worst = max(worst, assert_close(getattr(state, name), expected, tolerance=tolerance,
                                            what=f"{what}: block {block} cached {name}",
                                            axes=("head", "position", "feature")))
    return worst


class SessionMachine(RuleBasedStateMachine):
    """Prefill, decode, reset, in-place weight updates, full sessions, invalid tokens."""

    def __init__(self, adapter: DecoderAdapter, numbers: NumberSystem = FLOAT64,
                 tolerance: float = s.TOLERANCE) -> None:
        super().__init__()
        self.adapter, self.numbers, self.tolerance = adapter, numbers, tolerance
        self.capabilities = frozenset(getattr(adapter, "capabilities", ()))

    @initialize(data=st.data())
    def build_decoder_and_session(self, data: st.DataObject) -> None:
        self.config = data.draw(s.decoder_configs(self.capabilities), label="decoder")
        self.weights = random_decoder_weights(self.config, data.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.capacity = data.draw(st.integers(1, s.MAX_SEQUENCE), label="capacity")
        what = "create the decoder"
        self.decoder = expect_success(call(self.adapter, what, lambda: self.adapter.create_decoder(
            self.config, self.weights)), what)
        self._new_session()

    def _new_session(self) -> None:
        what = "create a session"
        self.session = expect_success(call(self.adapter, what, lambda: self.adapter.create_session(
            self.decoder, self.capacity)), what)
        self.session_weights = self.weights  # what every cached row was computed with
        self.tokens: list[int] = []  # processed since creation or reset
        self.trace: DecoderTrace | None = None
        self.stale = False

    def _oracle(self, tokens: list[int]) -> DecoderTrace:
        return full_decoder(tokens, self.config, self.session_weights, numbers=self.numbers)

    def _advance(self, new: list[int], what: str, action: Any, *, single: bool) -> None:
        """A step of valid tokens: the oracle's logits (``[vocab]`` for one decoded token, else
        ``[T, vocab]``), or FULL / REVISION_MISMATCH with nothing changed."""
        expected = ErrorKind.REVISION_MISMATCH if self.stale else (
            ErrorKind.FULL if len(self.tokens) + len(new) > self.capacity else None)
        before = read_blocks(self.adapter, self.session, what)
        outcome = call(self.adapter, what, action)
        if expected is not None:
            expect_rejection(outcome, expected, what)
            same_blocks(before, read_blocks(self.adapter, self.session, what), what)
            return
        logits = np.asarray(expect_success(outcome, what))
        trace = self._oracle(self.tokens + new)
        wanted = trace.logits[-1] if single else trace.logits[len(self.tokens):]
        assert_close(logits, wanted, tolerance=self.tolerance, what=f"{what}: logits",
                     axes=("position", "token"))
        self.tokens, self.trace = self.tokens + new, trace

    @rule(data=st.data())
    def prefill(self, data: st.DataObject) -> None:
        tokens = data.draw(s.token_lists(self.config.vocab), label="tokens")
        self._advance(tokens, f"prefill {tokens}", lambda: self.adapter.prefill(self.session, list(tokens)),
                      single=False)

    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        token = data.draw(st.integers(0, self.config.vocab - 1), label="token")
        self._advance([token], f"decode {token}", lambda: self.adapter.decode(self.session, token), single=True)

    @rule(data=st.data())
    def step_with_invalid_tokens(self, data: st.DataObject) -> None:
        """Checked first, before staleness or capacity: INVALID_TOKENS, no block changed."""
        problem, tokens = data.draw(s.invalid_token_sequences(self.config.vocab), label="invalid tokens")
        decode = data.draw(st.booleans(), label="through decode")
        if decode and isinstance(tokens, list) and len(tokens) == 1:
            what, action = f"decode {problem}", lambda: self.adapter.decode(self.session, tokens[0])
        else:
            what, action = f"prefill {problem}", lambda: self.adapter.prefill(self.session, tokens)
        before = read_blocks(self.adapter, self.session, what)
        expect_rejection(call(self.adapter, what, action), ErrorKind.INVALID_TOKENS, what)
        same_blocks(before, read_blocks(self.adapter, self.session, what), what)

    @rule()
    def reset(self) -> None:
        expect_success(call(self.adapter, "reset the session", lambda: self.adapter.reset_session(self.session)),
                       "reset the session")
        self.tokens, self.trace = [], None

    @rule(data=st.data())
    def update_one_block_in_place(self, data: st.DataObject) -> None:
        """Only this block's parameters change; the session is stale as a whole."""
        block, new = data.draw(s.block_update(self.weights), label="block update")
        what = f"update block {block}'s weights in place"
        expect_success(call(self.adapter, what, lambda: self.adapter.update_block_weights(
            self.decoder, block, new)), what)
        blocks = list(self.weights.blocks)
        blocks[block] = new
        self.weights = replace(self.weights, blocks=tuple(blocks))  # type: ignore[misc]
        self.stale = True

    @precondition(lambda self: self.stale or len(self.tokens) == self.capacity)
    @rule()
    def replace_session(self) -> None:
        self._new_session()

    @invariant()
    def every_block_matches_the_oracle(self) -> None:
        blocks = read_blocks(self.adapter, self.session, "after the last step")
        if len(blocks) != self.config.blocks:
            raise NonConformance(f"the session has {len(blocks)} block caches, "
                                 f"but the decoder has {self.config.blocks} blocks")
        if self.tokens and self.trace is None:
            self.trace = self._oracle(self.tokens)
        blocks_match_oracle(blocks, self.trace, self.config.window, len(self.tokens), self.tolerance,
                            "after the last step")
