"""The stateful conformance machine for the longest-common-prefix store (docs/spec.md §10, §11).

The model side is the list of entries the store must hold (scope, the weights
they were computed with, tokens), oldest first, and the rules of docs/spec.md §10.3
restated here independently (``expected_reuse``). Queries are built from the
stored prefixes by extension, truncation and edits -- including edits after
which later ids are equal again -- under several scopes and weights; returned
arrays get scribbled on. Every result must equal the oracle's full
recomputation from the expected cut, and after every rule the entries must be
exactly the model's, with the oracle's rows. Invalid token sequences go to
every implementation, judged by the call policy: the error kind where token
validation is claimed, nothing changed if it raised, the store replaced if it
accepted them without the claim.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import DECODER_POSITIONS, Needs
from ..judge.calls import Inputs
from ..judge.checks import fields
from ..judge.failures import NonConformance
from ..judge.policy import Due, Expect
from ..oracle import FLOAT64, DecoderWeights, NumberSystem, random_decoder_weights
from ..protocol.decoder import StoreEntry
from ..protocol.kinds import Capability, ErrorKind
from ..traces.recording import Draws, initialize, invariant, rule
from .base import (
    ConformanceMachine,
    DecoderOracle,
    block_states,
    blocks_match_oracle,
    create_decoder,
    observed_blocks,
    signature,
    update_block_weights,
)

SCOPES = ("app", "other app")
VARIANTS = ("extend", "truncate", "edit", "edit and extend", "same")  # queries built from a stored prompt


@dataclass(frozen=True)
class Entry:
    scope: str
    signature: str
    tokens: tuple[int, ...]
    weights: DecoderWeights
    decoder: int  # which of the machine's decoders computed it


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Contiguous from the start: equal ids after the first difference do not count."""
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def expected_reuse(entries: list[Entry], scope: str, key: str, tokens: Sequence[int], windowed: bool,
                   *, window_rule_first: bool = True) -> tuple[int | None, int]:
    """docs/spec.md §10.3: (index of the entry to reuse, cut). Same scope and signature only; the longest contiguous
    common prefix, ties to the newest; then the cut is capped at len(query) - 1, so at least the last token
    is recomputed. Ties are decided before the cap: a longer stored prefix beats a shorter, newer one even
    when both cap to the same cut. A cut capped to 0 reuses nothing.

    A window entry is reusable only when all of it matches and the query extends it. The seed leaves open
    whether that rule filters the candidates (``window_rule_first``, the reference's reading) or is applied
    to the entry chosen, whose partial hit then recomputes from 0; both are accepted."""
    chosen, longest, usable = None, 0, False
    for index, entry in enumerate(entries):  # oldest first, so ">=" hands ties to the newest
        if entry.scope != scope or entry.signature != key:
            continue
        common = common_prefix(entry.tokens, tokens)
        whole = not windowed or common == len(entry.tokens) < len(tokens)
        if window_rule_first and not whole:
            continue
        if common > 0 and common >= longest:
            chosen, longest, usable = index, common, whole
    cut = min(longest, len(tokens) - 1) if usable else 0
    return (chosen, cut) if cut > 0 else (None, 0)


def acceptable_reuse(verb: str, entries: list[Entry], scope: str, key: str, tokens: Sequence[int],
                     windowed: bool) -> list[tuple[int | None, int]]:
    """Every (entry, cut) the rules admit for this call, the reference's reading first.

    A query follows ``expected_reuse`` under either reading of the window rule. A prefill stores its
    result; whether it may first reuse a stored prefix the seed does not say, so computing from scratch
    (the reference) and reusing by the query's rules are both accepted."""
    readings = [expected_reuse(entries, scope, key, tokens, windowed, window_rule_first=first)
                for first in (True, False)]
    if verb == "prefill":
        readings.insert(0, (None, 0))
    return list(dict.fromkeys(readings))


class PrefixStoreMachine(ConformanceMachine):
    """Prefills and queries under several scopes and weights, invalid queries, scribbled results."""

    layer_caches = False  # a store's rows are judged by the dtype rule (docs/spec.md §13.6)

    @classmethod
    def needs(cls, windowed: bool | None = None, **_: Any) -> Needs:
        return Needs.of(Capability.PREFIX_STORE, *([Capability.SLIDING_WINDOW] if windowed else []),
                        alternatives=(("decoder position convention", DECODER_POSITIONS),))

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64, windowed: bool | None = None) -> None:
        super().__init__(adapter, numbers)
        self.windowed = windowed

    @initialize(data=st.data())
    def build_store(self, data: Draws) -> None:
        """A store of a drawn capacity and two decoders of different weights."""
        self.config = data.draw(g.decoder_configs(self.capabilities, windowed=self.windowed), label="decoder")
        seeds = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2), label="seeds")
        self.weights = [random_decoder_weights(self.config, seed) for seed in seeds]
        self.decoders = [create_decoder(self, self.config, weights) for weights in self.weights]
        self.capacity = data.draw(st.integers(1, 3), label="store capacity")
        self._new_store()
        self._oracle = DecoderOracle(self.config, self.judge)

    def _new_store(self) -> None:
        self.store = self.must("create the store", lambda: self.adapter.create_store(self.capacity))
        self.entries: list[Entry] = []  # oldest first

    def _tokens(self, data: Draws) -> tuple[list[int], Entry | None]:
        """A query built from a stored prefix (extended, truncated or edited), or fresh; and that entry."""
        kinds = ["fresh", *(VARIANTS if self.entries else ())]
        kind = data.choose(kinds, "query kind")
        if kind == "fresh":
            return data.draw(g.token_lists(self.config.vocab, 1, 8), label="tokens"), None
        entry = self.entries[data.choose(range(len(self.entries)), "from entry")]
        return self._variant(data, list(entry.tokens), kind), entry

    def _variant(self, data: Draws, base: list[int], kind: str) -> list[int]:
        vocab = self.config.vocab
        if kind in ("extend", "edit and extend"):
            base += data.draw(g.token_lists(vocab, 1, 3), label="extension")
        if kind == "truncate":
            base = base[:data.draw(st.integers(1, len(base)), label="keep")]
        if kind.startswith("edit") and vocab > 1:
            at = data.draw(st.integers(0, len(base) - 1), label="edit at")
            base[at] = data.draw(st.integers(0, vocab - 1).filter(lambda t: t != base[at]), label="new id")
        return base[:g.MAX_SEQUENCE]

    def _call(self, verb: str, data: Draws) -> None:
        tokens, entry = self._tokens(data)
        # Half the time a query built from an entry comes in that entry's scope, through its decoder: only
        # then can the entry be reused, and only with two such entries are there ties to break.
        if entry is not None and data.draw(st.booleans(), label="in the entry's scope, through its decoder"):
            scope, index = entry.scope, entry.decoder
        else:
            scope = data.choose(SCOPES, "scope")
            index = data.choose(range(len(self.decoders)), "decoder")
        self._store(verb, tokens, scope, index)

    def _store(self, verb: str, tokens: list[int], scope: str, index: int) -> None:
        """One store call, checked against spec §10.3's choice of entry and cut and the oracle's logits."""
        weights, key = self.weights[index], signature(self.weights[index])
        readings = acceptable_reuse(verb, self.entries, scope, key, tokens, self.config.window is not None)
        what = f"{verb} {tokens} in scope {scope!r} with decoder {index}"
        rows = 3 * self.config.blocks
        acceptable = [(reused, cut, rows * (len(tokens) - cut), rows * len(tokens)) for reused, cut in readings]
        reference = self._oracle(weights, tokens)
        everything, tolerance = self.judge.bound(reference, lambda t: t.logits)
        method = self.adapter.store_prefill if verb == "prefill" else self.adapter.store_query
        handed = Inputs()
        given = handed("tokens", tokens)
        result = self.call(what, lambda: method(self.store, self.decoders[index], scope, given), inputs=handed,
                           entry_cut_rows_full_rows_one_of=acceptable, output=everything, tolerance=tolerance).value
        *reported, result_logits = fields(result, ("entry", "cut", "rows_computed", "full_rows", "logits"), what)
        if tuple(reported) not in acceptable:
            rules = acceptable[0] if len(acceptable) == 1 else f"one of {acceptable}"
            raise NonConformance(f"{what}: entry/cut/rows/full rows {tuple(reported)}, but the rules give {rules} "
                                 f"(entries, oldest first: {[(e.scope, list(e.tokens)) for e in self.entries]})",
                                 kind="reuse differs from the rules", check=f"{verb} reuse")
        cut = int(reported[1])
        if cut:
            self.exercised(f"{verb} prefix hit")
        logits, tolerance = self.judge.bound(reference, lambda t: t.logits[cut:])
        self.judge.close(np.asarray(result_logits), logits, tolerance, what=f"{what}: logits from position {cut}",
                         check="logits", axes=("row", "vocab id"))
        self.last_logits = result_logits
        if verb == "prefill":
            if len(self.entries) >= self.capacity:
                self.exercised("entry evicted")
            self.entries = [*self.entries, Entry(scope, key, tuple(tokens), weights, index)][-self.capacity:]

    @rule(data=st.data())
    def prefill(self, data: Draws) -> None:
        """Compute a prompt (perhaps reusing a stored prefix) and store it: the oldest entry evicted when full."""
        self._call("prefill", data)

    @rule(data=st.data())
    def query(self, data: Draws) -> None:
        """Reuse the entry with the longest common prefix in scope and signature, capped to recompute the last token."""
        self._call("query", data)

    @rule(data=st.data())
    def prefill_then_query_a_variant(self, data: Draws) -> None:
        """A prompt stored, then a query built from it in the same context: reused up to the contiguous
        common prefix, whatever else is stored. (The rules below each do their whole scenario: Hypothesis
        disables a random subset of rules in every run, which would often keep prefill and query apart.)"""
        tokens = data.draw(g.token_lists(self.config.vocab, 1, 8), label="tokens")
        scope = data.choose(SCOPES, "scope")
        index = data.choose(range(len(self.decoders)), "decoder")
        self._store("prefill", tokens, scope, index)
        kind = data.choose(VARIANTS, "query kind")
        self._store("query", self._variant(data, list(tokens), kind), scope, index)

    @rule(data=st.data())
    def prefill_twice_then_query(self, data: Draws) -> None:
        """One prompt stored twice in one context: the two entries tie for a query that extends it,
        and the newest must win."""
        tokens = data.draw(g.token_lists(self.config.vocab, 1, 6), label="tokens")
        scope = data.choose(SCOPES, "scope")
        index = data.choose(range(len(self.decoders)), "decoder")
        self._store("prefill", tokens, scope, index)
        self._store("prefill", tokens, scope, index)
        extension = data.draw(g.token_lists(self.config.vocab, 0, 2), label="extension")
        self._store("query", tokens + extension, scope, index)

    @rule(data=st.data())
    def prefill_longer_then_shorter_then_query(self, data: Draws) -> None:
        """A prompt stored, then a prefix of it, then a query one token past that prefix: the longer entry
        shares more with the query and wins, although both cap to the same cut (the newer, shorter one
        would win a tie decided after capping). In the other storing order both readings agree."""
        tokens = data.draw(g.token_lists(self.config.vocab, 2, 8), label="tokens")
        keep = data.draw(st.integers(1, len(tokens) - 1), label="keep")
        scope = data.choose(SCOPES, "scope")
        index = data.choose(range(len(self.decoders)), "decoder")
        self._store("prefill", tokens, scope, index)
        self._store("prefill", tokens[:keep], scope, index)
        self._store("query", tokens[:keep + 1], scope, index)

    @rule(data=st.data())
    def invalid_query(self, data: Draws) -> None:
        """INVALID_TOKENS where token validation is claimed; from every implementation, if it raises, no entry,
        entry order or stored array changed. A store that accepts what it does not claim to check holds
        unspecified entries from then on: it is replaced by a new one."""
        problem, tokens = data.draw(g.invalid_token_sequences(self.config.vocab), label="invalid tokens")
        verb = data.draw(st.sampled_from(["prefill", "query"]), label="verb")
        method = self.adapter.store_prefill if verb == "prefill" else self.adapter.store_query
        what = f"{verb} with {problem}"
        handed = Inputs()
        given = handed("tokens", tokens)
        self.call(what, lambda: method(self.store, self.decoders[0], "app", given),
                  due=Due.check(ErrorKind.INVALID_TOKENS), inputs=handed, observe=lambda: self._observed(what),
                  replace=self._new_store)

    @rule(data=st.data())
    def update_weights_in_place(self, data: Draws) -> None:
        """The decoder's computation changes: its old entries no longer match its signature."""
        index = data.choose(range(len(self.decoders)), "decoder")
        block, new = data.draw(g.block_update(self.weights[index]), label="block update")
        self.weights[index] = update_block_weights(self, self.decoders[index], self.weights[index], block, new,
                                                   f"update decoder {index}'s block {block} in place")

    @rule(when=lambda self: self.entries)
    def scribble_on_returned_arrays(self) -> None:
        """Whatever the store returned is the caller's: writing into it must not reach the store."""
        for entry in self._read_entries("read the entries", copy=False):
            for block in entry.blocks:
                for array in (block.keys, block.values):
                    if isinstance(array, np.ndarray) and array.flags.writeable:
                        array[...] = np.nan
        if isinstance(getattr(self, "last_logits", None), np.ndarray) and self.last_logits.flags.writeable:
            self.last_logits[...] = np.nan

    @invariant()
    def entries_are_the_models(self) -> None:
        self.tape.expect("after the last step", expect=Expect.STATE.value,
                         entries=[[e.scope, list(e.tokens)] for e in self.entries])
        entries = self._read_entries("after the last step")
        described = [(e.scope, tuple(int(t) for t in e.tokens)) for e in entries]
        if described != [(e.scope, e.tokens) for e in self.entries]:
            raise NonConformance(f"the store holds {described}, but should hold, oldest first, "
                                 f"{[(e.scope, e.tokens) for e in self.entries]}", kind="wrong entries",
                                 check="entries")
        for index, (entry, model) in enumerate(zip(entries, self.entries)):
            what = f"entry {index} ({model.scope!r}, {list(model.tokens)})"
            if entry.next_position != len(model.tokens):
                raise NonConformance(f"{what}: next_position {entry.next_position}, should be {len(model.tokens)}",
                                     kind="wrong next_position", check="next_position")
            trace = self._oracle(model.weights, model.tokens)
            blocks_match_oracle(tuple(entry.blocks), trace, self.config.window, len(model.tokens), self.judge, what)

    def _read_entries(self, what: str, copy: bool = True) -> list[Any]:
        entries = self.must(what, lambda: self.adapter.store_entries(self.store))
        return [_copied(e, what) for e in entries] if copy else list(entries)

    def _observed(self, what: str) -> dict[str, Any]:
        """What a call must not change of the store: its entries, their order, and every array they hold."""
        entries = self._read_entries(what)
        seen: dict[str, Any] = {"entries": [(e.scope, e.tokens, e.next_position) for e in entries]}
        for index, entry in enumerate(entries):
            seen.update(observed_blocks(entry.blocks, prefix=f"entry {index} "))
        return seen


def _copied(entry: Any, what: str) -> StoreEntry:
    return StoreEntry(entry.scope, tuple(entry.tokens), block_states(entry.blocks, what), int(entry.next_position))
