"""The conformance machine of a model-wide decode session (docs/spec.md §9, §11).

The model side is the decoder's weights as the session's caches saw them and
the tokens processed since the session was created or reset; the oracle
recomputes all of them from scratch. Every prefill and decode must return the
oracle's logits, and after every rule every block's held rows must be the
oracle's.

Steps with invalid tokens, on a stale session or past the capacity go to
every implementation. A step is checked in the documented order -- tokens,
then parameter revisions, then free capacity -- and the first failing check
names the error kind due; the call policy judges it (the kind where claimed,
nothing changed if it raised, the session replaced if it accepted what it
does not claim to check).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import DECODER_POSITIONS, Needs
from ..judge.calls import Inputs
from ..judge.failures import NonConformance
from ..judge.policy import Due, Expect, Held, Observed
from ..judge.tolerance import Reference
from ..oracle import FLOAT64, AttentionWeights, DecoderTrace, NumberSystem, full_decoder, random_decoder_weights
from ..protocol.decoder import BlockState, longest_prefill
from ..protocol.kinds import Capability, ErrorKind
from ..traces.recording import Draws, initialize, invariant, rule
from .base import (
    ConformanceMachine,
    block_states,
    blocks_match_oracle,
    create_decoder,
    held_block_rows,
    observed_blocks,
    update_block_weights,
)

# What a prefill and a step with invalid tokens are drawn to meet: the first, where shrinking goes, is the session
# as it is; the others are hard cases drawn on purpose, inside the rule (a rule of their own would thin the others).
PREFILL_MEETS = ("the session as it is", "past the capacity of an empty session",
                 "past the room of a session holding tokens", "one token past the window, within the room")
STEP_MEETS = ("the session as it is", "an empty session", "a session holding tokens")
# A decoder as drawn (a window half the time, and any window may be as long as the capacity), or on purpose one with
# a window shorter than the capacity: a prefill past the window, and a decode once it is full, need one.
WINDOWS = ("the decoder drawn", "a window shorter than the capacity")
DECODE_MEETS = ("the session as it is", "a window that is full")  # the second: a windowed session with room only
# Where the W + 1 tokens of a prefill one token past the window land: a ring that wraps inside a prefill over tokens
# it holds already wraps other slots than one that starts empty. (Traces of an earlier suite: the session as it is.)
PAST_THE_WINDOW_ONTO = ("an empty session", "a session holding tokens")

LONG_PREFILL_LOGITS = "logits of a prefill longer than the window"  # the check of a failure of §9.4's prefills


class SessionMachine(ConformanceMachine):
    """Prefill, decode, reset, in-place weight updates, full sessions, invalid tokens, steps with two problems."""

    layer_caches = False  # a decoder's rows are judged by the dtype rule (docs/spec.md §13.6)

    @classmethod
    def needs(cls, **_: Any) -> Needs:
        return Needs.of(Capability.DECODE_SESSION, alternatives=(("decoder position convention", DECODER_POSITIONS),))

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__(adapter, numbers)

    @initialize(data=st.data())
    def build_decoder_and_session(self, data: Draws) -> None:
        """A decoder of a declared position convention, and a session of a drawn capacity."""
        self.config = data.draw(g.decoder_configs(self.capabilities), label="decoder")
        self.weights = random_decoder_weights(self.config, data.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.capacity = data.draw(st.integers(1, g.MAX_SEQUENCE), label="capacity")
        if self.has(Capability.SLIDING_WINDOW) and self.capacity >= 2 and (
                self.config.window is None or self.config.window >= self.capacity) and data.optional(
                g.on_purpose(*WINDOWS), "windows", WINDOWS[0]) == WINDOWS[1]:
            self.need(Capability.SLIDING_WINDOW, "a windowed decoder")  # replaying: stops here if absent
            window = data.draw(st.integers(1, min(g.MAX_DECODER_WINDOW, self.capacity - 1)), label="window")
            self.config = replace(self.config, window=window)
        self.decoder = create_decoder(self, self.config, self.weights, "create the decoder")
        self._new_session()

    def _new_session(self) -> None:
        self.session = self.must("create a session", lambda: self.adapter.create_session(self.decoder,
                                                                                        self.capacity))
        self.session_weights = self.weights  # what every cached row was computed with
        self.tokens: list[int] = []  # processed since creation or reset
        self.trace: Reference[DecoderTrace] | None = None
        self.stale = False  # a block's parameters written in place since the session was created

    def _oracle(self, tokens: list[int]) -> Reference[DecoderTrace]:
        return self.judge.reference(lambda numbers: full_decoder(tokens, self.config, self.session_weights,
                                                                 numbers=numbers))

    def _blocks(self, what: str) -> tuple[BlockState, ...]:
        return block_states(self.must(f"{what}: session state", lambda: self.adapter.session_state(self.session)),
                            what)

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
        """One prefill or decode of ``tokens`` (None: an invalid sequence), judged by its first failing check; a
        valid one must return the oracle's logits (``[vocab]`` for one decoded token, else ``[T, vocab]``)."""
        due = Due.check(self._first_failing_check(tokens))

        def observe() -> Observed:
            return observed_blocks(self._blocks(what))

        if due.kind is not None:
            self.call(what, action, due=due, inputs=handed, observe=observe, replace=self._new_session,
                      held=Held(held_block_rows, evicts=self.config.window is not None))
            return
        assert tokens is not None
        if self._may_refuse(tokens):
            due = Due(may_refuse=ErrorKind.REFUSED)
        trace = self._oracle(self.tokens + tokens)
        wanted, tolerance = self.judge.bound(trace, lambda t: t.logits[-1] if single else t.logits[len(self.tokens):])
        judged = self.call(what, action, due=due, inputs=handed, observe=observe, output=wanted, tolerance=tolerance)
        if judged.refused:  # as declared: nothing changed (judged), nothing processed
            return
        logits = np.asarray(judged.value)
        self.judge.close(logits, wanted, tolerance, what=f"{what}: logits", check=self._logits_check(tokens),
                         axes=("row", "vocab id"))
        self.tokens, self.trace = self.tokens + tokens, trace

    def _logits_check(self, tokens: list[int]) -> str:
        """What a logits mismatch names: where the adapter declares prefill_within_window, a prefill longer than the
        window is judged by a clause of its own (docs/spec.md §9.4: it may be refused, and is judged where taken),
        so its failures are a cause apart from those of prefills within the window, and a user can baseline one
        without hiding the other. Undeclared, such a prefill is a prefill like any other (§9.1)."""
        return LONG_PREFILL_LOGITS if self._may_refuse(tokens) else "logits"

    def _may_refuse(self, tokens: list[int]) -> bool:
        """A valid prefill of more than W tokens, which a session declaring prefill_within_window may refuse
        (docs/spec.md §9.4); one of at most W tokens must succeed."""
        longest = longest_prefill(self.capabilities, self.config.window)
        return longest is not None and len(tokens) > longest

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
        problem, tokens = data.draw(g.invalid_token_sequences(self.config.vocab), label="invalid tokens")
        if data.draw(st.booleans(), label="through decode") and isinstance(tokens, list) and len(tokens) == 1:
            self._decode(tokens[0], problem)
        else:
            self._prefill(tokens, problem)

    def _valid_step(self, data: Draws) -> None:
        if data.draw(st.booleans(), label="through decode"):
            self._decode(data.draw(st.integers(0, self.config.vocab - 1), label="token"))
        else:
            self._prefill(data.draw(g.token_lists(self.config.vocab), label="tokens"))

    def _fill(self, data: Draws, count: int) -> None:
        """Prefill ``count`` valid tokens into the current session, if ``count`` > 0: in prefills of at most W
        where a longer one may be refused, so that a set-up holds what it says."""
        if count > 0:
            prompt = data.draw(g.token_lists(self.config.vocab, count, count), label="prompt")
            size = longest_prefill(self.capabilities, self.config.window) or count
            for first in range(0, count, size):
                self._prefill(prompt[first:first + size])

    def _update_block(self, block: int, new: AttentionWeights) -> None:
        """Write block ``block``'s parameters in place: the session is stale, for every implementation
        (whether a step then says so is judged only with binding_checks)."""
        self.weights = update_block_weights(self, self.decoder, self.weights, block, new,
                                            f"update block {block}'s weights in place")
        self.stale = True

    # -- single steps, in whatever state the session is ---------------------------------------------------

    @rule(data=st.data())
    def prefill(self, data: Draws) -> None:
        """T >= 1 tokens at once: causal inside the chunk, committed in every block or in none. On purpose, one
        token more than the room of an empty session or of one holding tokens: FULL (judged with fixed capacity),
        and the rows held stay -- a session that writes what fits before its room check shows it only there. And
        W + 1 valid tokens into a windowed session with room, as it is, empty or holding tokens
        (``PAST_THE_WINDOW_ONTO``): a ring wraps inside one prefill (the prefill that prefill_within_window may
        refuse)."""
        meets = data.optional(g.on_purpose(*PREFILL_MEETS), "meets", PREFILL_MEETS[0])
        window = self.config.window
        if meets == PREFILL_MEETS[3] and window is not None and window < self.capacity:
            onto = data.optional(st.sampled_from(PAST_THE_WINDOW_ONTO), "onto", "the session as it is")
            room_left = self.capacity - window - 1  # tokens that may be held beside the W + 1
            if onto == PAST_THE_WINDOW_ONTO[0]:
                self._empty_session()
            elif onto == PAST_THE_WINDOW_ONTO[1] and room_left >= 1 and (
                    self.stale or not self.tokens or len(self.tokens) > room_left):
                self._new_session()
                self._fill(data, data.draw(st.integers(1, room_left), label="tokens held"))
            if len(self.tokens) + window + 1 > self.capacity or self.stale:
                self._new_session()
            self._prefill(data.draw(g.token_lists(self.config.vocab, window + 1, window + 1), label="tokens"))
            return
        if meets in (PREFILL_MEETS[0], PREFILL_MEETS[3]):
            self._prefill(data.draw(g.token_lists(self.config.vocab), label="tokens"))
            return
        if meets == PREFILL_MEETS[1]:
            self._empty_session()
        else:
            self._hold_tokens(data, max(1, self.capacity - 1))
        room = self.capacity - len(self.tokens)
        self._prefill(data.draw(g.token_lists(self.config.vocab, room + 1, room + 1), label="tokens"))

    @rule(data=st.data())
    def decode(self, data: Draws) -> None:
        """One token: its logits, and every block's rows, are the oracle's. On purpose, in a windowed session with
        room past W, a decode once the window is full (W tokens held, prefilled into a new session if fewer are or it
        is stale): the first token whose window leaves a held one out -- a decode that ignores the window, or a ring
        that overwrites the wrong slot, shows only from there."""
        window = self.config.window
        if window is not None and window < self.capacity and \
                data.optional(g.on_purpose(*DECODE_MEETS), "meets", DECODE_MEETS[0]) == DECODE_MEETS[1]:
            if len(self.tokens) < window or len(self.tokens) >= self.capacity or self.stale:
                self._new_session()
                self._fill(data, window)
        self._decode(data.draw(st.integers(0, self.config.vocab - 1), label="token"))

    @rule(data=st.data())
    def step_with_invalid_tokens(self, data: Draws) -> None:
        """Checked first, before staleness or capacity: INVALID_TOKENS (judged with token validation);
        if it raises, no block changed. Into the session as it is, or on purpose an empty one (a lazily
        allocating session must not keep what a rejected step set up) or one holding tokens (a session that
        advances its position or writes before its token check shows it only over rows held)."""
        meets = data.optional(g.on_purpose(*STEP_MEETS), "meets", STEP_MEETS[0])
        if meets == STEP_MEETS[1]:
            self._empty_session()
        elif meets == STEP_MEETS[2]:
            self._hold_tokens(data, self.capacity)
        self._invalid_step(data)

    def _empty_session(self) -> None:
        """A new session if this one holds tokens or is stale: the step after it meets an empty one for certain."""
        if self.tokens or self.stale:
            self._new_session()

    def _hold_tokens(self, data: Draws, most: int) -> None:
        """Up to ``most`` valid tokens prefilled into a new session if this one holds none or is stale, so that the
        step after it meets rows held for certain, not by luck."""
        if self.tokens and not self.stale:
            return
        self._new_session()
        self._fill(data, data.draw(st.integers(1, most), label="tokens held"))

    @rule()
    def reset(self) -> None:
        """Empty the session: the next token goes at position 0, bindings kept."""
        self.call("reset the session", lambda: self.adapter.reset_session(self.session))
        self.tokens, self.trace = [], None

    @rule(data=st.data())
    def update_one_block_in_place(self, data: Draws) -> None:
        """Only this block's parameters change; the session is stale as a whole."""
        block, new = data.draw(g.block_update(self.weights), label="block update")
        self._update_block(block, new)

    @rule(when=lambda self: self.stale or len(self.tokens) == self.capacity)
    def replace_session(self) -> None:
        """A new session for the decoder as it is now."""
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
        self._update_block(block, data.draw(g.block_updates(self.weights, block), label="new weights"))
        self._valid_step(data)

    @rule(data=st.data())
    def tokens_checked_before_revision(self, data: Draws) -> None:
        """A new session with room, holding some rows, then a block updated in place: invalid tokens must
        report invalid_tokens, not revision_mismatch."""
        self._new_session()
        self._fill(data, data.draw(st.integers(0, self.capacity - 1), label="prompt length"))
        block, new = data.draw(g.block_update(self.weights), label="block update")
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
        self.tape.expect("after the last step", expect=Expect.STATE.value, tokens=len(self.tokens))
        blocks = self._blocks("after the last step")
        if len(blocks) != self.config.blocks:
            raise NonConformance(f"the session has {len(blocks)} block caches, "
                                 f"but the decoder has {self.config.blocks} blocks", kind="wrong number of blocks")
        if self.tokens and self.trace is None:
            self.trace = self._oracle(self.tokens)
        blocks_match_oracle(blocks, self.trace, self.config.window, len(self.tokens), self.judge,
                            "after the last step")
