"""The stateful conformance machine for paged KV caches with prefix sharing (docs/spec.md §14, capability
``paged_prefix_sharing``).

The model side is every live sequence (tokens, scope, the weights that computed
its rows) and what the pool must have registered: for each block, the identity
of the content it was registered with -- the whole token prefix up to its end,
plus the extra keys the adapter declares (``paged_rules``). Blocks are learned
from the adapter's own accounting, and every step is checked against the rules
stated in ``paged_rules``: the reuse an add owes, the blocks an operation
takes, what the declared eviction policy may evict, when the pool is full.

After every step: every live sequence's logits and rows equal the oracle's
full recomputation; free + referenced + cached = total, and each reference
count is the number of tables holding the block; a block is shared only
between sequences whose whole prefix up to it is equal under the declared
keys. A call that raises -- ``full``, invalid tokens, an invalid length, a
stale sequence -- must change nothing, for every adapter; its error kind is
judged where claimed (``full`` of a pool is part of ``paged_prefix_sharing``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import DECODER_POSITIONS, Needs
from ..judge.calls import Inputs
from ..judge.checks import fields
from ..judge.failures import NonConformance
from ..judge.policy import VALID, Due, Expect
from ..oracle import FLOAT64, DecoderWeights, NumberSystem, random_decoder_weights
from ..protocol.decoder import BlockState
from ..protocol.kinds import Capability, ErrorKind
from ..protocol.paged import PAGED_PREFIX_SHARING, PagedPolicy, PoolState
from ..traces.recording import Draws, NotApplicable, initialize, invariant, rule
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
from .paged_rules import (
    ChainKey,
    blocks_for,
    blocks_needed,
    chain_keys,
    eviction_problem,
    extra_keys,
    fits,
    hit_candidates,
    same_prefix,
    shortest_prompt_with_hit,
)

SCOPES = ("app", "other app")
REQUEST_VALUES = ("", "X", SCOPES[0])  # "" is none; "X" under two keys, or a scope's name, collide if untagged
Request = tuple[tuple[str, str], ...]  # (request key, value) for every declared request key
MAX_LENGTH = 10  # tokens per sequence: the oracle recomputes every live one after every step
MAX_BLOCK_SIZE, MAX_BLOCKS = 3, 8
INVALID_LENGTHS = ("one past the length", "negative", "a bool", "an integral float", "a string")
VARIANTS = ("same", "extend", "prefix", "edit")  # adds built from an earlier one, to make prefixes meet
# The policy's parts that shape what is drawn (generate.needs.DECLARATIONS); the rest only shapes the expectations.
SIGNATURE, REQUEST_KEYS = "paged_policy.hash_keys signature", "paged_policy.request_keys"
TRUNCATE, FORK = "paged_policy.truncate", "paged_policy.fork"
DUPLICATES = "paged_policy.duplicates"


@dataclass
class Live:
    """A live sequence as the model knows it."""

    tokens: list[int]
    decoder: int
    scope: str
    weights: DecoderWeights  # what its rows were computed with
    signature: str
    request: Request = ()  # its declared request keys (a LoRA adapter's name, ...), "" values meaning none
    stale: bool = False  # its decoder's weights were written in place since
    settled: int = 0  # its leading full blocks already offered for registration (a block is offered once, when full)


def invalid_length(problem: str, length: int) -> object:
    return {"one past the length": length + 1, "negative": -1, "a bool": True, "an integral float": float(length),
            "a string": str(length)}[problem]


class PagedCacheMachine(ConformanceMachine):
    """Adds, appends, forks, truncations and frees of many sequences in one pool; weight updates, other scopes,
    pool exhaustion, invalid calls."""

    layer_caches = False  # a pool's rows are judged by the dtype rule (docs/spec.md §13.6)

    @classmethod
    def needs(cls, **_: Any) -> Needs:
        return Needs.of(PAGED_PREFIX_SHARING, alternatives=(("decoder position convention", DECODER_POSITIONS),))

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64) -> None:
        super().__init__(adapter, numbers)
        self.policy = PagedPolicy.of(adapter)

    # -- set-up --------------------------------------------------------------------------------------------

    @initialize(data=st.data(), relies_on=[SIGNATURE])
    def build_pool(self, data: Draws) -> None:
        """A pool of drawn block size and count for a decoder of a declared position convention."""
        self.config = data.draw(g.paged_decoder_configs(self.capabilities), label="decoder")
        # Two computations share one pool only where the hash keeps them apart (declared "signature").
        count = 2 if "signature" in self.policy.hash_keys else 1
        seeds = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=count, max_size=count), label="seeds")
        if len(seeds) != count:  # a replayed trace older than its recorded declarations (format 3 and before)
            raise NotApplicable(f"the trace creates {len(seeds)} decoders in one pool, but {self.adapter.name} "
                                f"declares {SIGNATURE} {count == 2} (paged_policy hash_keys "
                                f"{sorted(self.policy.hash_keys)}; without 'signature', one computation per pool)")
        self.weights = [random_decoder_weights(self.config, seed) for seed in seeds]
        self.decoders = [create_decoder(self, self.config, weights) for weights in self.weights]
        self.block_size = data.draw(st.integers(1, MAX_BLOCK_SIZE), label="block size")
        self.num_blocks = data.draw(st.integers(2, MAX_BLOCKS), label="blocks")
        self._oracle = DecoderOracle(self.config, self.judge)
        self._new_pool()

    def _new_pool(self) -> None:
        what = f"create a pool of {self.num_blocks} blocks of {self.block_size}"
        self.pool = self.must(what, lambda: self.adapter.create_pool(self.config, self.block_size, self.num_blocks))
        self.live: dict[Hashable, Live] = {}
        self.registered: dict[ChainKey, list[Hashable]] = {}  # content identity -> the blocks registered with it
        self.content: dict[Hashable, ChainKey] = {}  # block -> the identity it is registered with
        self.stamps: dict[Hashable, int] = {}  # cached block -> when it was cached
        self.clock = 0
        self.history: list[tuple[list[int], str, int, Request]] = []  # earlier adds: tokens, scope, decoder, keys
        self._verified: dict[Hashable, tuple[Any, ...]] = {}  # sequence -> what its rows were checked as
        self.state = self._read_state(what)
        self._check_accounting(self.state, what)

    # -- reading the adapter ---------------------------------------------------------------------------------

    def _read_state(self, what: str) -> PoolState:
        raw = self.must(f"{what}: pool state", lambda: self.adapter.paged_state(self.pool))
        total, free, cached, references, tables = fields(raw, ("total", "free", "cached", "references", "tables"),
                                                         what)
        try:
            return PoolState(int(total), int(free), tuple(map(_block_id, cached)),
                             {_block_id(b): int(n) for b, n in dict(references).items()},
                             {sequence: tuple(map(_block_id, table)) for sequence, table in dict(tables).items()})
        except (TypeError, ValueError) as error:
            raise NonConformance(f"{what}: malformed pool state: {error}", kind="malformed pool state") from error

    def _read_rows(self, sequence: Hashable, what: str) -> tuple[BlockState, ...]:
        return block_states(self.must(f"{what}: rows", lambda: self.adapter.paged_rows(self.pool, sequence)), what)

    def _observed(self, what: str) -> dict[str, Any]:
        """What a call must not change: the pool's accounting, and every live sequence's rows."""
        state = self._read_state(what)  # first: a sequence the call dropped has no rows to read
        seen: dict[str, Any] = {"the pool's accounting": state}
        for sequence in self.live:
            if sequence in state.tables:
                seen.update(observed_blocks(self._read_rows(sequence, what), prefix=f"sequence {sequence!r} "))
        return seen

    # -- the rules, applied to what the adapter did ----------------------------------------------------------

    def _keys(self, live: Live) -> tuple[tuple[str, str], ...]:
        return extra_keys(self.policy, live.scope, live.signature, live.request)

    def _chains(self, live: Live) -> list[ChainKey]:
        return chain_keys(live.tokens, live.scope, live.signature, self.policy, self.block_size,
                          request=live.request)

    def _check_accounting(self, state: PoolState, what: str) -> None:
        """Tables as long as their sequences; references = tables holding each block; free + referenced +
        cached = total; nothing both cached and referenced."""
        def fail(problem: str) -> None:
            raise NonConformance(f"{what}: {problem}", kind="pool accounting")

        if state.total != self.num_blocks:
            fail(f"the pool reports {state.total} blocks, but was created with {self.num_blocks}")
        if set(state.tables) != set(self.live):
            fail(f"the pool has tables for {sorted(map(repr, state.tables))}, but the live sequences are "
                 f"{sorted(map(repr, self.live))}")
        held: Counter[Hashable] = Counter()
        for sequence, table in state.tables.items():
            wanted = blocks_for(len(self.live[sequence].tokens), self.block_size)
            if len(table) != wanted or len(set(table)) != len(table):
                fail(f"sequence {sequence!r} of {len(self.live[sequence].tokens)} tokens has table {list(table)}, "
                     f"but needs {wanted} distinct blocks")
            held.update(table)
        if state.references != dict(held):
            fail(f"reference counts {state.references}, but the tables hold {dict(held)}")
        if set(state.cached) & set(held) or len(set(state.cached)) != len(state.cached):
            fail(f"cached blocks {list(state.cached)} must be distinct and held by no table")
        if state.free + len(held) + len(state.cached) != state.total:
            fail(f"free {state.free} + referenced {len(held)} + cached {len(state.cached)} != total {state.total}")

    def _settle(self, after: PoolState, before: PoolState, needed: int, what: str, hit: set[Hashable] = frozenset()) \
            -> None:  # type: ignore[assignment]
        """Learn what the step registered and evicted (``hit``: the cached blocks an add reused), and check
        that against the rules."""
        self._check_accounting(after, what)
        chains = {sequence: self._chains(live) for sequence, live in self.live.items()}
        placed = {(after.tables[q][i], key) for q, keys in chains.items() for i, key in enumerate(keys)}
        returned = set(before.cached) - set(after.cached) - hit
        same_content = {b for b in returned if (b, self.content.get(b)) in placed}
        evicted = returned - same_content
        problem = eviction_problem(self.policy, needed, before.free, {b: self.stamps[b] for b in before.cached},
                                   hit, evicted, same_content, content=self.content, block_size=self.block_size)
        if problem:
            raise NonConformance(f"{what}: {problem}", kind="eviction against the declared policy")
        if evicted:
            self.exercised("eviction")
        for block in evicted:
            identity = self.content.pop(block)
            self.registered[identity].remove(block)
            if not self.registered[identity]:
                del self.registered[identity]
        for block in self.content:
            if block not in after.references and block not in after.cached:
                raise NonConformance(f"{what}: block {block} holds registered content {self._show(block)} and no "
                                     "table holds it, but it was freed: it must stay cached until evicted",
                                     kind="registered block not cached")
        for sequence, keys in chains.items():
            for index, (block, key) in enumerate(zip(after.tables[sequence], keys)):
                if block in self.content and self.content[block] != key:
                    raise NonConformance(
                        f"{what}: sequence {sequence!r} holds block {block} for {_describe(key)}, but the block "
                        f"was registered with {self._show(block)}", kind="block shared across different prefixes")
                # A block is registered when it becomes full, unless its content is registered already: then it
                # stays a private duplicate, or is replaced by the registered block -- or, as declared, is
                # registered too (several blocks per identity).
                if index >= self.live[sequence].settled and block not in self.content and key in self.registered:
                    self.exercised("duplicate")  # a block filled with content registered already
                if index >= self.live[sequence].settled and block not in self.content and (
                        key not in self.registered or self.policy.duplicates == "registered"):
                    self.registered.setdefault(key, []).append(block)
                    self.content[block] = key
            self.live[sequence].settled = len(keys)
        for block in set(before.cached) - set(after.cached):
            del self.stamps[block]
        for block in set(after.cached) - set(before.cached):
            if block not in self.content:
                raise NonConformance(f"{what}: block {block} is cached, but holds no registered content",
                                     kind="unregistered block cached")
            self.stamps[block] = self.clock
        self.clock += 1
        self.state = after

    def _show(self, block: Hashable) -> str:
        return _describe(self.content[block])

    def _rejected(self, what: str, expected: ErrorKind, claim: str, action: Callable[[], Any],
                  handed: Inputs) -> None:
        """A call whose first failing check gives ``expected``, judged under ``claim`` by the call policy;
        accepted without the claim, the pool's contents are unspecified from then on, and it is replaced."""
        self.call(what, action, due=Due.check(expected, claim), inputs=handed, observe=lambda: self._observed(what),
                  replace=self._new_pool)

    # -- operations --------------------------------------------------------------------------------------------

    def _add(self, tokens: list[int], scope: str, index: int, request: Request = (),
             fork_of: Hashable | None = None) -> Hashable | None:
        """Add ``tokens``; or, with ``fork_of``, fork that sequence under ``"fork": "re_add"``, which must do what
        this add would (the new id is all it returns). The new sequence's id, or None if the pool was full."""
        weights = self.weights[index]
        key = signature(weights)
        request = request or self._no_request_keys()
        candidates = hit_candidates(self.registered, tokens, scope, key, self.policy, self.block_size, request)
        # the first of each identity's copies: the only one, unless duplicates are registered
        hit = [blocks[0] for blocks in candidates]
        needed = blocks_needed("add", len(tokens), self.block_size, hit=len(hit))
        keys = f" and keys {dict(request)}" if request else ""
        what = (f"add {tokens} in scope {scope!r}{keys} with decoder {index}" if fork_of is None else
                f"fork sequence {fork_of!r} of {len(tokens)} tokens (re-added in scope {scope!r})")
        handed = Inputs()
        given = handed("tokens", tokens)

        def action() -> Any:
            if fork_of is not None:
                return self.adapter.paged_fork(self.pool, fork_of)
            return self._paged_add(index, scope, given, request)

        before = self.state
        cached = set(before.cached)
        # Of several copies the add may take any. Taking a cached copy of each identity leaves the fewest blocks
        # to evict (if it fits then, it fits for sure); taking referenced copies, the most (if it does not fit
        # even then, it must be refused).
        worst = {next((b for b in blocks if b in cached), blocks[0]) for blocks in candidates}
        best = {next((b for b in blocks if b not in cached), blocks[0]) for blocks in candidates}
        # A pool that hits cached copies first has no choice left: it fits exactly when it fits with them.
        cached_first = self.policy.hit_copy == "cached_first"
        if not fits(needed, before.free, cached, worst if cached_first else best):
            self.exercised("pool full")
            self._rejected(f"{what} (needs {needed} blocks)", ErrorKind.FULL, PAGED_PREFIX_SHARING, action, handed)
            return None
        due = VALID if fits(needed, before.free, cached, worst) else Due(may_refuse=ErrorKind.FULL)
        if fork_of is None:
            reference = self._oracle(weights, tokens)
            judged = self.call(what, action, due=due, inputs=handed, observe=lambda: self._observed(what),
                               replace=self._new_pool, reused=len(hit) * self.block_size, blocks=_recorded(hit))
            if not judged.to_judge:
                return None
            sequence, logits, reused = fields(judged.value, ("sequence", "logits", "reused"), what)
            if reused != len(hit) * self.block_size:
                raise NonConformance(f"{what}: reused {reused} tokens, but the rules give "
                                     f"{len(hit) * self.block_size} (registered blocks {hit}, block size "
                                     f"{self.block_size}, policy {self.policy.described()})",
                                     kind="reuse differs from the rules")
            wanted, tolerance = self.judge.bound(reference, lambda t: t.logits[reused:])
            self.judge.close(np.asarray(logits), wanted, tolerance, what=f"{what}: logits from position {reused}",
                             check="logits", axes=("row", "vocab id"))
        else:
            judged = self.call(what, action, due=due, observe=lambda: self._observed(what), replace=self._new_pool,
                               reused=len(hit) * self.block_size, blocks=_recorded(hit))
            if not judged.to_judge:
                return None
            sequence = judged.value
        if not isinstance(sequence, Hashable) or sequence in self.live:
            raise NonConformance(f"{what}: returned sequence id {sequence!r}, which is not a new hashable id",
                                 kind="malformed result")
        self.live[sequence] = Live(list(tokens), index, scope, weights, key, request)
        self.history = [*self.history, (list(tokens), scope, index, request)][-6:]
        after = self._read_state(what)
        table = after.tables.get(sequence, ())
        if len(table) < len(candidates) or any(b not in blocks for b, blocks in zip(table, candidates)):
            shown = hit if all(len(blocks) == 1 for blocks in candidates) else candidates
            raise NonConformance(f"{what}: its table starts {list(table[:len(hit)])}, but must reuse the registered "
                                 f"blocks {shown}", kind="reuse differs from the rules")
        if cached_first:
            passed = [(b, [c for c in blocks if c in cached]) for b, blocks in zip(table, candidates)]
            missed = [(b, copies) for b, copies in passed if copies and b not in copies]
            if missed:
                raise NonConformance(f"{what}: took block {missed[0][0]!r}, but the declared hit_copy "
                                     f"'cached_first' takes a cached copy, here of {missed[0][1]}",
                                     kind="reuse differs from the rules")
        self._settle(after, before, needed, what, set(table[:len(hit)]))
        if hit:
            self.exercised("prefix hit")
        if fork_of is not None:
            self.exercised("fork")
        return sequence

    def _append(self, sequence: Hashable, tokens: list[int]) -> None:
        live = self.live[sequence]
        before = self.state
        length, table = len(live.tokens), before.tables[sequence]
        last = table[-1] if table else None
        shared = last is not None and (before.references.get(last, 0) > 1 or last in self.content)
        needed = blocks_needed("append", length, self.block_size, new_tokens=len(tokens),
                               last_block_shared_or_registered=shared)
        what = f"append {tokens} to sequence {sequence!r} of {length} tokens"
        handed = Inputs()
        given = handed("tokens", tokens)

        def action() -> Any:
            return self.adapter.paged_append(self.pool, sequence, given)

        if live.stale:
            self._rejected(what, ErrorKind.REVISION_MISMATCH, Capability.BINDING_CHECKS.value, action, handed)
            return
        if not fits(needed, before.free, set(before.cached), set()):
            self.exercised("pool full")
            self._rejected(f"{what} (needs {needed} blocks)", ErrorKind.FULL, PAGED_PREFIX_SHARING, action, handed)
            return
        if shared and length % self.block_size:
            self.exercised("append into a shared block")
        reference = self._oracle(live.weights, live.tokens + tokens)
        wanted, tolerance = self.judge.bound(reference, lambda t: t.logits[length:])
        logits = self.call(what, action, inputs=handed, output=wanted, tolerance=tolerance).value
        self.judge.close(np.asarray(logits), wanted, tolerance, what=f"{what}: logits", check="logits",
                         axes=("row", "vocab id"))
        live.tokens = live.tokens + tokens
        after = self._read_state(what)
        full = length // self.block_size
        if after.tables[sequence][:full] != table[:full]:
            raise NonConformance(f"{what}: its full blocks changed {list(table[:full])} -> "
                                 f"{list(after.tables[sequence][:full])}", kind="full blocks replaced by an append")
        if length % self.block_size and shared and after.tables[sequence][full] == last \
                and self.content.get(last) != [*self._chains(live), None][full]:
            raise NonConformance(f"{what}: wrote into block {last}, which is shared or registered: it must be "
                                 "copied first (copy-on-write)", kind="copy-on-write missing")
        self._settle(after, before, needed, what)

    def _fork(self, sequence: Hashable) -> Hashable | None:
        """Fork ``sequence`` as the policy declares; the child's id, or None if the pool was full."""
        live = self.live[sequence]
        if self.policy.fork == "re_add":
            return self._add(list(live.tokens), live.scope, live.decoder, live.request, fork_of=sequence)
        before = self.state
        needed = blocks_needed("fork", len(live.tokens), self.block_size)
        what = f"fork sequence {sequence!r} of {len(live.tokens)} tokens"

        def action() -> Any:
            return self.adapter.paged_fork(self.pool, sequence)

        if not fits(needed, before.free, set(before.cached), set()):
            self.exercised("pool full")
            self._rejected(f"{what} (needs {needed} blocks)", ErrorKind.FULL, PAGED_PREFIX_SHARING, action, Inputs())
            return None
        child = self.call(what, action).value
        self.exercised("fork")
        if not isinstance(child, Hashable) or child in self.live:
            raise NonConformance(f"{what}: returned sequence id {child!r}, which is not a new hashable id",
                                 kind="malformed result")
        self.live[child] = replace(live, tokens=list(live.tokens))
        after = self._read_state(what)
        self._check_accounting(after, what)
        full, parent, copy = len(live.tokens) // self.block_size, after.tables[sequence], after.tables[child]
        if copy[:full] != parent[:full]:
            raise NonConformance(f"{what}: the fork's full blocks {list(copy[:full])} are not the parent's "
                                 f"{list(parent[:full])}: a fork shares them", kind="fork does not share")
        if copy[full:] and copy[full] in parent:
            raise NonConformance(f"{what}: the fork holds the parent's partial block {copy[full]}: a fork copies it",
                                 kind="fork aliases a partial block")
        self._settle(after, before, needed, what)
        return child

    def _truncate(self, sequence: Hashable, length: int) -> None:
        live = self.live[sequence]
        before = self.state
        what = f"truncate sequence {sequence!r} of {len(live.tokens)} tokens to {length}"
        self.call(what, lambda: self.adapter.paged_truncate(self.pool, sequence, length))
        live.tokens = live.tokens[:length]
        live.settled = min(live.settled, length // self.block_size)
        after = self._read_state(what)
        kept = before.tables[sequence][:blocks_for(length, self.block_size)]
        if after.tables.get(sequence) != kept:
            raise NonConformance(f"{what}: table {after.tables.get(sequence)}, but must keep {list(kept)}",
                                 kind="truncate")
        self._settle(after, before, 0, what)

    def _free(self, sequence: Hashable) -> None:
        before = self.state
        what = f"free sequence {sequence!r}"
        self.call(what, lambda: self.adapter.paged_free(self.pool, sequence))
        del self.live[sequence]
        self._settle(self._read_state(what), before, 0, what)

    # -- choosing what to do -------------------------------------------------------------------------------------

    def _fresh(self, shortest: int = 0, longest: int = MAX_LENGTH) -> list[Hashable]:
        """Live sequences computed with their decoder's current weights, of ``shortest..longest`` tokens."""
        return [q for q, live in self.live.items() if not live.stale and shortest <= len(live.tokens) <= longest]

    def _forkable(self, longest: int = MAX_LENGTH) -> list[Hashable]:
        """The sequences a fork may be drawn for: none without ``paged_fork``; a re-adding fork needs a token
        (forking an empty sequence is unspecified there: an add of no tokens is invalid)."""
        if self.policy.fork == "none":
            return []
        return self._fresh(shortest=1 if self.policy.fork == "re_add" else 0, longest=longest)

    def _share(self, sequence: Hashable) -> None:
        """Another sequence holding ``sequence``'s blocks: a fork, or, in a pool that does not fork, an add of
        its tokens (which reuses its registered full blocks)."""
        if self.policy.fork == "none":
            live = self.live[sequence]
            self._add(list(live.tokens), live.scope, live.decoder, live.request)
        else:
            self._fork(sequence)

    def _pick(self, data: Draws, among: list[Hashable], label: str) -> Hashable:
        return among[data.choose(range(len(among)), label)]

    def _tokens(self, data: Draws) -> tuple[list[int], str, int, Request]:
        """Tokens, scope, decoder and request keys of an add: fresh, or built from an earlier add so that prefixes
        meet."""
        kind = data.choose(["fresh", *(VARIANTS if self.history else ())], "add kind")
        vocab = self.config.vocab
        if kind == "fresh":
            tokens = data.draw(g.token_lists(vocab, 1, 8), label="tokens")
            return (tokens, data.choose(SCOPES, "scope"), data.choose(range(len(self.decoders)), "decoder"),
                    self._request_keys(data))
        base, scope, index, request = self.history[data.choose(range(len(self.history)), "from add")]
        tokens = list(base)
        if kind == "extend":
            tokens += data.draw(g.token_lists(vocab, 1, 4), label="extension")
        elif kind == "prefix":
            tokens = tokens[:data.draw(st.integers(1, len(tokens)), label="keep")]
        elif kind == "edit":
            at = data.draw(st.integers(0, len(tokens) - 1), label="edit at")
            tokens[at] = (tokens[at] + data.draw(st.integers(1, vocab - 1), label="shift")) % vocab
        if not data.draw(st.booleans(), label="same scope and decoder"):
            scope = data.choose(SCOPES, "scope")
            index = data.choose(range(len(self.decoders)), "decoder")
            request = self._request_keys(data)
        return tokens[:MAX_LENGTH], scope, index, request

    def _request_keys(self, data: Draws) -> Request:
        """A value for each declared request key, from a few shared by every key and the scopes (so that an
        untagged hash, one value under two keys, would collide); none drawn if none is declared."""
        return tuple((key, data.optional(st.sampled_from(REQUEST_VALUES), f"{key} key", ""))  # older traces: none
                     for key in self.policy.request_keys)

    def _no_request_keys(self) -> Request:
        return tuple((key, "") for key in self.policy.request_keys)

    def _paged_add(self, index: int, scope: str, tokens: Any, request: Request) -> Any:
        """``paged_add``, with ``keys`` only where the policy declares request keys."""
        if self.policy.request_keys:
            return self.adapter.paged_add(self.pool, self.decoders[index], scope, tokens, dict(request))
        return self.adapter.paged_add(self.pool, self.decoders[index], scope, tokens)

    # -- rules -----------------------------------------------------------------------------------------------------

    @rule(data=st.data(), relies_on=[REQUEST_KEYS])
    def add(self, data: Draws) -> None:
        """A new sequence: its leading full blocks whose identities are registered are reused, up to the hit limit."""
        self._add(*self._tokens(data))

    @rule(data=st.data())
    def add_twice_in_other_scopes(self, data: Draws) -> None:
        """One prompt of two or more blocks in one scope, then in the other, then in the first again: shared
        across scopes exactly when the declared hash leaves the scope out, and within a scope always."""
        tokens = data.draw(g.token_lists(self.config.vocab, self.block_size + 1, MAX_LENGTH), label="tokens")
        index = data.choose(range(len(self.decoders)), "decoder")
        for scope in (SCOPES[0], SCOPES[1], SCOPES[0]):
            self._add(tokens, scope, index)

    @rule(data=st.data(), when=lambda self: bool(self.policy.request_keys), relies_on=[REQUEST_KEYS])
    def add_one_value_under_each_request_key(self, data: Draws) -> None:
        """One prompt of two or more blocks with no request key, then with the same value under each declared
        request key in turn, then with none again: nothing shared between them, except with the first (a hash of
        untagged values would take a LoRA adapter named "X" for a salt "X", vLLM #44701)."""
        tokens = data.draw(g.token_lists(self.config.vocab, self.block_size + 1, MAX_LENGTH), label="tokens")
        index = data.choose(range(len(self.decoders)), "decoder")
        none = self._no_request_keys()
        for chosen in (None, *self.policy.request_keys, None):
            self._add(tokens, SCOPES[0], index, tuple((key, "X" if key == chosen else "") for key, _ in none))

    # -- hits that survive the declared hit limit, on purpose ------------------------------------------------------

    def _surviving(self, blocks: int = 1) -> int:
        """The shortest prompt whose hit keeps ``blocks`` blocks under the declared hit limit."""
        return shortest_prompt_with_hit(self.policy, self.block_size, blocks)

    def _fits(self, length: int) -> bool:
        """Whether a prompt of ``length`` tokens fits the machine's sequences and an emptied pool."""
        return length <= MAX_LENGTH and blocks_for(length, self.block_size) <= self.num_blocks

    def _free_all(self) -> None:
        for sequence in list(self.live):
            self._free(sequence)

    @rule(data=st.data(), when=lambda self: bool(self.policy.request_keys) and self._fits(self._surviving()))
    def add_one_value_under_each_request_key_past_the_hit_limit(self, data: Draws) -> None:
        """The same with a prompt long enough that a hit survives the declared hit limit, in an emptied pool, each
        add freed before the next (its blocks cached for the next to look up): twice with no key (the second must
        hit), then with the value "X" under each request key in turn (none may hit the one before: an untagged
        hash would)."""
        length = self._surviving()
        longest = max(n for n in range(length, MAX_LENGTH + 1) if self._fits(n))
        tokens = data.draw(g.token_lists(self.config.vocab, length, longest), label="tokens")
        index = data.choose(range(len(self.decoders)), "decoder")
        none = self._no_request_keys()
        self._free_all()
        for chosen in (None, None, *self.policy.request_keys):
            added = self._add(tokens, SCOPES[0], index, tuple((key, "X" if key == chosen else "") for key, _ in none))
            if added is not None:
                self._free(added)

    @rule(data=st.data(), when=lambda self: bool(self.policy.request_keys)
          and self._fits(self._surviving(1 // self.block_size + 1)))
    def add_keyed_past_a_block_an_append_filled(self, data: Draws) -> None:
        """A keyed sequence of one token grown by an append to every full block of a prompt whose hit survives the
        hit limit and reaches a block the append filled; freed; then that prompt added with the same keys (it
        must hit that block) and with none (it must not): an append that hashes without the keys is caught."""
        first_filled = 1 // self.block_size  # the first block that an append, not the add, fills
        length = self._surviving(first_filled + 1)
        tokens = data.draw(g.token_lists(self.config.vocab, length, length), label="tokens")
        chosen = data.choose(self.policy.request_keys, "request key")
        request = tuple((key, "X" if key == chosen else "") for key in self.policy.request_keys)
        index = data.choose(range(len(self.decoders)), "decoder")
        self._free_all()
        grown = self._add(tokens[:1], SCOPES[0], index, request)
        if grown is None:
            return
        self._append(grown, tokens[1:length // self.block_size * self.block_size])
        self._free(grown)
        for keys in (request, self._no_request_keys()):
            added = self._add(tokens, SCOPES[0], index, keys)
            if added is not None:
                self._free(added)

    @rule(data=st.data(), when=lambda self: self.num_blocks >= 5)  # A's three blocks and B's two, none shared
    def add_a_duplicate_then_evict_a_copy(self, data: Draws) -> None:
        """Duplicates of registered blocks, one copy evicted, then a hit past the hit limit on what they hold. In
        an emptied pool: B, a prompt of two blocks less a token; A, that prompt and two tokens more (it reuses
        B's block as far as the hit limit lets it, computing the rest anew: under drops_last_hit a duplicate);
        B's token appended (its second block fills with A's content: a duplicate). B freed, then A; one-block
        prompts of other tokens added until every block B left cached is evicted, and freed; then A's tokens
        again: a hit must take the copies still registered -- never an evicted one, nor lose a content whose
        other copy was evicted."""
        bs = self.block_size
        tokens = data.draw(g.token_lists(self.config.vocab, 2 * bs + 1, 2 * bs + 1), label="tokens")
        index = data.choose(range(len(self.decoders)), "decoder")
        self._free_all()
        short = self._add(tokens[:2 * bs - 1], SCOPES[0], index)
        whole = self._add(tokens, SCOPES[0], index)
        if short is None or whole is None:
            return
        self._append(short, tokens[2 * bs - 1:2 * bs])
        before = set(self.state.cached)
        self._free(short)
        left = set(self.state.cached) - before
        self._free(whole)
        others = []
        for _ in range(self.num_blocks + 1):
            if not left & set(self.state.cached):
                break
            other = self._add([(tokens[0] + 1) % self.config.vocab, *tokens[1:bs]], SCOPES[0], index)
            if other is None:
                break
            others.append(other)
        for other in others:
            self._free(other)
        again = self._add(tokens, SCOPES[0], index)
        if again is not None:
            self._free(again)

    @rule(data=st.data(), when=lambda self: self._fresh(longest=MAX_LENGTH - 1))
    def append(self, data: Draws) -> None:
        """Tokens appended to a sequence: its full blocks stay, a shared partial block is copied first."""
        sequence = self._pick(data, self._fresh(longest=MAX_LENGTH - 1), "sequence")
        room = MAX_LENGTH - len(self.live[sequence].tokens)
        self._append(sequence, data.draw(g.token_lists(self.config.vocab, 1, min(3, room)), label="tokens"))

    @rule(data=st.data(), when=lambda self: self._forkable(), relies_on=[FORK])
    def fork(self, data: Draws) -> None:
        """A new sequence sharing the parent's full blocks, with a private copy of a partial last block (full if
        no block is free for it); with ``"fork": "re_add"``, what adding the parent's tokens again would give."""
        self._fork(self._pick(data, self._forkable(), "sequence"))

    @rule(data=st.data(), when=lambda self: self._forkable(longest=MAX_LENGTH - 1), relies_on=[FORK])
    def fork_and_append_to_both(self, data: Draws) -> None:
        """A fork, then tokens appended to parent and child: neither may see the other's rows."""
        sequence = self._pick(data, self._forkable(longest=MAX_LENGTH - 1), "sequence")
        child = self._fork(sequence)
        for target in (sequence, child):
            if target in self.live:
                self._append(target, data.draw(g.token_lists(self.config.vocab, 1, 1), label="tokens"))

    @rule(data=st.data(), when=lambda self: self.policy.truncate and self._fresh(), relies_on=[TRUNCATE])
    def truncate(self, data: Draws) -> None:
        """Keep the first k tokens (with "truncate": True in paged_policy): the table keeps its first ceil(k / bs)
        blocks."""
        sequence = self._pick(data, self._fresh(), "sequence")
        self._truncate(sequence, data.draw(st.integers(0, len(self.live[sequence].tokens)), label="keep"))

    @rule(data=st.data(), when=lambda self: self.policy.truncate and self._fresh(shortest=2), relies_on=[TRUNCATE])
    def truncate_into_a_shared_block_then_append(self, data: Draws) -> None:
        """Two sequences share a block (a fork); one is cut inside it and grows again with other tokens: it must
        copy the block first, and the other keeps its rows."""
        sequence = self._pick(data, self._fresh(shortest=2), "sequence")
        length = len(self.live[sequence].tokens)
        self._share(sequence)
        self._truncate(sequence, data.draw(st.integers(1, length - 1), label="keep"))
        self._append(sequence, data.draw(g.token_lists(self.config.vocab, 1, 2), label="tokens"))

    @rule(data=st.data(), when=lambda self: self.policy.truncate and self.block_size >= 2
          and self._fresh(shortest=2, longest=MAX_LENGTH - 1), relies_on=[TRUNCATE])
    def truncate_inside_a_shared_block_then_append(self, data: Draws) -> None:
        """The copy-on-write that must copy rows: a short sequence of other tokens is added and freed (its
        partial block goes back to the free blocks holding its rows), a sequence is forked, cut inside a
        block at an offset above 0 and grown again: the block it writes into must first be a copy of the
        shared one, with its first rows -- not a fresh block holding whatever was freed."""
        sequence = self._pick(data, self._fresh(shortest=2, longest=MAX_LENGTH - 1), "sequence")
        vocab = self.config.vocab
        filler = [(t + 1) % vocab for t in self.live[sequence].tokens[:self.block_size - 1]]
        before = set(self.live)
        self._add(filler, SCOPES[0], self.live[sequence].decoder)
        for added in set(self.live) - before:
            self._free(added)
        length = len(self.live[sequence].tokens)
        self._share(sequence)
        cuts = [k for k in range(1, length) if k % self.block_size]
        self._truncate(sequence, cuts[data.choose(range(len(cuts)), "cut")])
        self._append(sequence, data.draw(g.token_lists(vocab, 1, 2), label="tokens"))

    @rule(data=st.data(), when=lambda self: self.policy.truncate and self._fresh(), relies_on=[TRUNCATE])
    def truncate_to_an_invalid_length(self, data: Draws) -> None:
        """invalid_length where validates_length is claimed; from every adapter, if it raises, nothing changed."""
        sequence = self._pick(data, self._fresh(), "sequence")
        problem = data.choose(INVALID_LENGTHS, "problem")
        length = invalid_length(problem, len(self.live[sequence].tokens))
        handed = Inputs()
        given = handed("length", length)
        self._rejected(f"truncate sequence {sequence!r} to {problem} ({length!r})", ErrorKind.INVALID_LENGTH,
                       Capability.VALIDATES_LENGTH.value,
                       lambda: self.adapter.paged_truncate(self.pool, sequence, given), handed)

    def _add_invalid(self, data: Draws, where: str = "") -> None:
        problem, tokens = data.draw(g.invalid_token_sequences(self.config.vocab), label="invalid tokens")
        handed = Inputs()
        given = handed("tokens", tokens)
        self._rejected(f"add {problem}{where}", ErrorKind.INVALID_TOKENS, Capability.VALIDATES_TOKENS.value,
                       lambda: self._paged_add(0, SCOPES[0], given, self._no_request_keys()), handed)

    @rule(data=st.data())
    def add_invalid_tokens(self, data: Draws) -> None:
        """INVALID_TOKENS where validates_tokens is claimed; if it raises, nothing changed."""
        self._add_invalid(data)

    @rule(data=st.data(), when=lambda self: not self.state.free and self.state.cached)
    def add_invalid_tokens_where_room_needs_eviction(self, data: Draws) -> None:
        """The same with no block free and some cached: a pool that makes room before it looks at the tokens
        has evicted blocks it cannot give back (transformers' PagedAttentionCache, which checks no token)."""
        self._add_invalid(data, " (no block free, some cached)")

    @rule(data=st.data(), when=lambda self: self.live)
    def free(self, data: Draws) -> None:
        """Every block of a sequence released: registered ones become cached."""
        self._free(self._pick(data, list(self.live), "sequence"))

    @rule(when=lambda self: self.live)
    def free_everything(self) -> None:
        """Nothing leaks: with every sequence freed, every block is free or cached."""
        for sequence in list(self.live):
            self._free(sequence)
        if self.state.references:
            raise NonConformance(f"every sequence freed, but blocks are still referenced: {self.state.references}",
                                 kind="pool accounting")

    @rule(data=st.data())
    def exhaust_the_pool(self, data: Draws) -> None:
        """Fresh prompts added until one no longer fits: full, with nothing changed; cached blocks evicted on the
        way as the declared policy says. Then the prompts are freed again (their blocks cached), so that the
        machine goes on with few live sequences."""
        added = []
        for _ in range(self.num_blocks + 1):  # every add takes a block: one of these no longer fits
            tokens = data.draw(g.token_lists(self.config.vocab, 1, min(MAX_LENGTH, 2 * self.block_size)),
                               label="tokens")
            before = set(self.live)
            self._add(tokens, data.choose(SCOPES, "scope"), 0)
            if set(self.live) == before:
                break
            added += list(set(self.live) - before)
        for sequence in added:
            if sequence in self.live:
                self._free(sequence)

    @rule(data=st.data(), when=lambda self: self.policy.duplicates == "registered" and self.state.free >= 2,
          relies_on=[DUPLICATES])
    def with_duplicates_hit_a_cached_and_an_in_use_copy(self, data: Draws) -> None:
        """A prompt of whole blocks added twice (its last block recomputed: a registered duplicate), one of the two
        freed, the pool perhaps filled, then the prompt extended: its hit has a cached and an in-use copy to take
        (any, or the cached one under "hit_copy": "cached_first", with full due exactly when that leaves no room)."""
        full = data.draw(st.integers(1, min(3, (MAX_LENGTH - 1) // self.block_size, self.state.free - 1)),
                         label="full blocks")
        tokens = data.draw(g.token_lists(self.config.vocab, full * self.block_size, full * self.block_size),
                           label="tokens")
        # On purpose, the one state that tells which copy a hit takes and whether a short pool is refused: the copy
        # registered later cached, the earlier one in use (the first registered, which a pool serving the first copy
        # takes), and nothing else free or cached, every earlier cached block evicted by the fillers while both
        # copies are in use; the extension's new block then fits only by taking the in-use copy, and under
        # "cached_first" full is due.
        case = data.optional(g.on_purpose("as drawn", "later copy cached, nothing else"), "copies",
                             "as drawn")
        added = [self._add(tokens, SCOPES[0], 0), self._add(tokens, SCOPES[0], 0)]
        added = [q for q in added if q is not None and q in self.live]  # None: refused
        fillers = []
        if case == "as drawn":
            if added:
                self._free(added[data.choose(range(len(added)), "freed")])
            # On purpose, the pool filled to its last free block: the cached copy alone then leaves no room for the
            # extension's new block, and only the in-use copy would (full is due under "cached_first").
            exactly = data.optional(g.on_purpose("filled as drawn", "filled exactly"), "fill", "filled as drawn")
            while (exactly == "filled exactly" or data.draw(st.booleans(), label="fill the pool")) and self.state.free:
                room = min(MAX_LENGTH, self.state.free * self.block_size)  # free blocks only: no eviction
                filler = data.draw(g.token_lists(self.config.vocab, room if exactly == "filled exactly" else 1, room),
                                   label="filler")
                before = self.state.free
                fillers.append(self._add(filler, SCOPES[1], 0))
                if self.state.free == before:  # refused: the pool is as full as an add can make it
                    break
        else:
            for _ in range(self.num_blocks + 1):  # every add takes a free or cached block
                if not self.state.free and not self.state.cached:
                    break
                room = min(MAX_LENGTH, (self.state.free + len(self.state.cached)) * self.block_size)
                before = self.state
                fillers.append(self._add(data.draw(g.token_lists(self.config.vocab, room, room), label="filler"),
                                         SCOPES[1], 0))
                if self.state == before:  # refused
                    break
            if added:
                self._free(added[-1])
            if len(added) == 2 and not self.state.free and len(self.state.cached) == 1:
                self.exercised("later copy cached, nothing else")
        self._add([*tokens, data.draw(st.integers(0, self.config.vocab - 1), label="extension")], SCOPES[0], 0)
        for sequence in fillers:
            if sequence in self.live:
                self._free(sequence)

    @rule(data=st.data(), relies_on=[SIGNATURE])
    def update_weights_in_place(self, data: Draws) -> None:
        """A weight update: new adds must not reuse rows of the old weights. Where the declared hash leaves the
        signature out, the pool belongs to one computation, and the update comes with a new pool."""
        index = data.choose(range(len(self.decoders)), "decoder")
        block, new = data.draw(g.block_update(self.weights[index]), label="block update")
        self.weights[index] = update_block_weights(self, self.decoders[index], self.weights[index], block,
                                                   new, f"update decoder {index}'s layer {block} in place")
        if "signature" not in self.policy.hash_keys:
            self._new_pool()
            return
        for live in self.live.values():
            live.stale = live.stale or live.decoder == index

    @rule(data=st.data(), when=lambda self: any(live.stale for live in self.live.values()), relies_on=[SIGNATURE])
    def append_to_a_stale_sequence(self, data: Draws) -> None:
        """revision_mismatch where binding_checks is claimed; if it raises, nothing changed."""
        sequence = self._pick(data, [q for q, live in self.live.items() if live.stale], "sequence")
        self._append(sequence, data.draw(g.token_lists(self.config.vocab, 1, 2), label="tokens"))

    # -- after every step -------------------------------------------------------------------------------------------

    @invariant()
    def pool_matches_the_model(self) -> None:
        what = "after the last step"
        self.tape.expect(what, expect=Expect.STATE.value,
                         sequences=[[repr(q), list(live.tokens)] for q, live in self.live.items()])
        state = self._read_state(what)
        if state != self.state:
            raise NonConformance(f"{what}: reading the pool changed it ({self.state} -> {state})",
                                 kind="pool accounting")
        self._check_accounting(state, what)
        holders: dict[Hashable, list[tuple[Hashable, int, list[int], Any]]] = {}
        for sequence, table in state.tables.items():
            live = self.live[sequence]
            for index, block in enumerate(table):
                holders.setdefault(block, []).append((sequence, index, live.tokens, self._keys(live)))
        for block, sharing in holders.items():
            problem = same_prefix(sharing, self.block_size) if len(sharing) > 1 else None
            if problem:
                raise NonConformance(f"{what}: block {block} is shared unsoundly: {problem}",
                                     kind="block shared across different prefixes")
        verified = {}
        for sequence, live in self.live.items():
            rows = self._read_rows(sequence, what)
            if len(rows) != self.config.blocks:
                raise NonConformance(f"{what}: sequence {sequence!r} has rows for {len(rows)} layers, but the "
                                     f"decoder has {self.config.blocks}", kind="malformed rows")
            # Rows byte for byte as verified after an earlier step, for the same tokens and weights, need no
            # second comparison with the oracle (they must still be read: any step may have written into them).
            fingerprint = (id(live.weights), tuple(live.tokens), *(a.tobytes() for r in rows for a in (
                r.keys, r.values, r.positions)))
            if self._verified.get(sequence) != fingerprint:
                trace = self._oracle(live.weights, live.tokens) if live.tokens else None
                blocks_match_oracle(rows, trace, None, len(live.tokens), self.judge,
                                    f"{what}: sequence {sequence!r} ({live.tokens}, scope {live.scope!r})")
            verified[sequence] = fingerprint
        self._verified = verified


def _block_id(block: Any) -> Hashable:
    """A block id as the adapter reported it, numpy integers as ints: ids are opaque, any hashable value."""
    if isinstance(block, np.integer):
        return int(block)
    if not isinstance(block, Hashable):
        raise TypeError(f"block id {block!r} is not hashable")
    return block


def _recorded(blocks: list[Hashable]) -> list[Any]:
    """Block ids for a trace: numbers and strings as they are, any other id by its repr (a note for people)."""
    return [b if isinstance(b, (int, str)) else repr(b) for b in blocks]


def _describe(key: ChainKey) -> str:
    extra, tokens = key
    shown = ", ".join(f"{name} {value[:12]!r}" for name, value in extra)
    return f"prefix {list(tokens)}" + (f" ({shown})" if shown else "")
