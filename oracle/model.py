"""A whole Llama-family (or Gemma-3-style) model over per-sequence cells, written to be obviously correct
(docs/spec.md §15).

Two parts, read top-down:

1. The model (llama2.c's ``run.c`` order): a token's hidden state starts as its embedding row; each
   layer adds attention over the cells its sequence sees (through its own window and RoPE base), then a gated
   feed-forward (SwiGLU, or GeGLU with Gemma's switches); a final RMSNorm
   and the output head (or the tied embedding) give the logits. Explicit loops over scalars of one
   ``NumberSystem``, so the same code runs in float64 and in mpmath.
2. The cell model (``CellContext``): what a context holds and what each sequence operation does to it,
   as plain data operations. A cell is one decoded token: its position, its token, the sequences it
   belongs to, and per layer its key *before rotation* and its value *as computed when it was decoded*.
   Attention rotates a cell's key at the cell's current position, so a shift re-rotates keys and keeps
   values and every deeper layer as they were: a shift is not a recomputation.

An operation that cannot be done raises ``ModelRefusal`` with the spec's error kind *before* changing
anything, so the machine learns what is due from the oracle itself.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .attention import Vector, rope_rotate, softmax
from .config import OracleInputError
from .model_config import ContextConfig, ModelBatch, ModelConfig, ModelWeights
from .numbers import FLOAT64, NumberSystem
from .rounding import EstimatedStorage
from .storage import BLOCK, BLOCK_FORMATS, StorageFormat

Matrix = list[Vector]  # (out, in): row o holds the weights of output o
KvStorage = Callable[..., Vector]  # a rotated key or a value head row -> what the cache holds of it


@dataclass(frozen=True)
class WholeRowStorage:
    """A cache that stores each token's whole kv row at once (every kv head's, ``KV * dh`` features): its blocks
    may run across heads. Called on the whole row (the heads concatenated), it returns what the cache holds."""

    stored: KvStorage

    def __call__(self, row: Vector) -> Vector:
        return self.stored(row)

# The error kinds of docs/spec.md §15.5 (the protocol's ErrorKind values; the oracle imports no protocol).
FULL, MALFORMED_BATCH, REFUSED = "full", "malformed_batch", "refused"
# A call outside the model (a shift to a position >= max_positions, §15.4): no kind is due, and nothing is judged
# of it but §5.1 (a refusal, any exception, changes nothing); the cell model refuses it, changing nothing.
OUTSIDE = "outside the model"
MERGE, REPLACE, WHOLE_ONLY = "merge", "replace", "whole_only"  # a copy into a non-empty destination


class ModelRefusal(Exception):
    """An operation the cell model does not do, with the kind a conforming context raises; nothing changed."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind, self.reason = kind, reason


# -- the model's pieces ------------------------------------------------------------------------------------------

def matvec(matrix: Matrix, x: Vector) -> Vector:
    """``y[o] = sum_i W[o][i] * x[i]``, summed in the order of ``i``."""
    return [_dot(row, x) for row in matrix]


def rms_norm(x: Vector, weight: Vector, eps: float, numbers: NumberSystem) -> Vector:
    """``x / sqrt(mean(x^2) + eps) * w``. With a mixed precision's norm dtype: ``x`` rounded to it, normalised
    there, the result converted back to ``numbers`` before ``w`` multiplies it (as transformers' RMSNorm does)."""
    inner = numbers.component("norm")
    if inner is not numbers:
        low = [inner.number(numbers.to_float(v)) for v in x]
        scale = inner.sqrt(_dot(low, low) / len(low) + inner.number(eps))
        return [numbers.number(inner.to_float(v / scale)) * w for v, w in zip(low, weight)]
    mean_square = _dot(x, x) / len(x)
    scale = numbers.sqrt(mean_square + numbers.number(eps))
    if numbers.within is not None:  # |x_i| <= sqrt(len(x) * mean_square): every output within sqrt(len(x)) |w_i|
        reach = math.sqrt(len(x))
        return [numbers.within(v / scale * w, w * reach) for v, w in zip(x, weight)]
    return [v / scale * w for v, w in zip(x, weight)]


def silu(x: Any, numbers: NumberSystem) -> Any:
    """``x * sigmoid(x) = x / (1 + exp(-x))``."""
    return x / (1 + numbers.exp(-x))


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)  # GELU's tanh approximation's constant, as a float64
GELU_CUBIC = 0.044715


def gelu_tanh(x: Any, numbers: NumberSystem) -> Any:
    """GELU's tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (Gemma's gate)."""
    inner = numbers.number(SQRT_2_OVER_PI) * (x + numbers.number(GELU_CUBIC) * (x * x * x))
    return numbers.number(0.5) * x * (1 + numbers.tanh(inner))


ACTIVATION_FUNCTIONS: dict[str, Callable[[Any, NumberSystem], Any]] = {"silu": silu, "gelu_tanh": gelu_tanh}


def gated_feed_forward(x: Vector, layer: _Layer, activation: str, numbers: NumberSystem) -> Vector:
    """The feed-forward ``down(act(gate x) * up x)``: SwiGLU with ``silu``, GeGLU with ``gelu_tanh``. With an
    ``"activation"`` component (an activation read from a table of that dtype, as ggml's CPU GELU reads a float16
    one), each gate value is rounded to the component's dtype, activated, and the result rounded to it again."""
    act = ACTIVATION_FUNCTIONS[activation]
    table = numbers.component("activation")
    gate, up = matvec(layer.w_gate, x), matvec(layer.w_up, x)  # [F], [F]
    if table is not numbers:
        def through(value: Any) -> Any:
            return numbers.number(float(table.number(numbers.to_float(value))))

        return matvec(layer.w_down, [through(act(through(g), numbers)) * u for g, u in zip(gate, up)])
    return matvec(layer.w_down, [act(g, numbers) * u for g, u in zip(gate, up)])  # [D]


@dataclass(frozen=True, eq=False)
class _Layer:
    """One layer's weights as scalars of the model's number system (converted once)."""

    attention_norm: Vector
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    ffn_norm: Vector
    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix
    q_norm: Vector | None = None  # the switched-on norms (docs/spec.md §15.1), None where off
    k_norm: Vector | None = None
    post_attention_norm: Vector | None = None
    post_ffn_norm: Vector | None = None


class Model:
    """A Llama-family model in one number system: the weights converted once, the forward in pieces."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, *, numbers: NumberSystem = FLOAT64,
                 kv_storage: KvStorage | None = None) -> None:
        weights.check(config)
        self.config, self.weights, self.numbers = config, weights, numbers
        self.kv_storage = kv_storage  # None: keys and values read as computed
        def vector(array: np.ndarray) -> Vector:
            return [numbers.number(float(v)) for v in array]

        def matrix(array: np.ndarray) -> Matrix:
            return [vector(row) for row in array]

        def optional(array: np.ndarray | None) -> Vector | None:
            return None if array is None else vector(array)

        self.embedding = matrix(weights.embedding)  # [V][D]
        self.layers = [_Layer(attention_norm=vector(layer.attention_norm), wq=matrix(layer.wq), wk=matrix(layer.wk),
                              wv=matrix(layer.wv), wo=matrix(layer.wo), ffn_norm=vector(layer.ffn_norm),
                              w_gate=matrix(layer.w_gate), w_up=matrix(layer.w_up), w_down=matrix(layer.w_down),
                              q_norm=optional(layer.q_norm), k_norm=optional(layer.k_norm),
                              post_attention_norm=optional(layer.post_attention_norm),
                              post_ffn_norm=optional(layer.post_ffn_norm))
                       for layer in weights.layers]
        self.output_norm = vector(weights.output_norm)  # [D]
        self.output = matrix(weights.embedding if weights.output is None else weights.output)  # [V][D]; tied: E

    def embed(self, token: int) -> Vector:
        """The token's first hidden state ``[D]``: its embedding row, times ``sqrt(D)`` with ``embedding_scale``."""
        row = list(self.embedding[token])
        if not self.config.embedding_scale:
            return row
        scale = self.numbers.sqrt(self.numbers.number(float(self.config.model_width)))
        return [v * scale for v in row]

    def project_kv(self, layer: int, hidden: Vector) -> tuple[Vector, Vector, Vector]:
        """The layer's normed input's query ``[H*dh]``, key ``[KV*dh]`` (unrotated) and value ``[KV*dh]``; with
        ``qk_norm`` each head's query and key RMSNormed (the cell keeps the normed key, before rotation)."""
        weights, config = self.layers[layer], self.config
        x = rms_norm(hidden, weights.attention_norm, config.norm_eps, self.numbers)
        query, key, value = matvec(weights.wq, x), matvec(weights.wk, x), matvec(weights.wv, x)
        if weights.q_norm is not None and weights.k_norm is not None:
            query = self._per_head_norm(query, weights.q_norm)
            key = self._per_head_norm(key, weights.k_norm)
        return query, key, value

    def _per_head_norm(self, row: Vector, weight: Vector) -> Vector:
        dh = self.config.head_width
        return [v for h in range(len(row) // dh)
                for v in rms_norm(_head(row, h, dh), weight, self.config.norm_eps, self.numbers)]

    def attend(self, layer: int, query: Vector, position: int, seen: Sequence[Cell]) -> Vector:
        """Attention output ``[D]`` (after ``wo``) of an unrotated ``query`` at ``position`` over ``seen``.

        Query head ``h`` reads kv head ``g = h // (H/KV)``; both sides are rotated at their own (current)
        positions, by the layer's RoPE (its own base in a windowed layer, ``layer_rope``); scores are
        ``q . k / sqrt(dh)``. With ``post_norms`` the output is RMSNormed by ``post_attention_norm``.
        """
        config, numbers = self.config, self.numbers
        rope = config.layer_rope(layer)
        dh = config.head_width
        scale = numbers.sqrt(numbers.number(float(dh)))
        merged: Vector = []  # [H*dh]
        kv_heads = range(config.kv_heads)
        # an estimate of any store's error (EstimatedStorage) counts a key once per quantization, and each stored
        # element once per query head reading it: the heads' terms are one error, added up (at most sqrt(G) times
        # their independent sum, by Cauchy-Schwarz)
        group = config.group_size
        stored_keys = [self._stored_heads([rope_rotate(_head(cell.keys[layer], g, dh), cell.position, rope, numbers)
                                           for g in kv_heads], (1 + cell.moves) * group) for cell in seen]
        stored_values = [self._stored_heads([_head(cell.values[layer], g, dh) for g in kv_heads], group)
                         for cell in seen]
        for h in range(config.heads):
            g = h // config.group_size
            q = rope_rotate(_head(query, h, dh), position, rope, numbers)
            if isinstance(self.kv_storage, EstimatedStorage):
                q = self.kv_storage.query(q)
            keys = [heads[g] for heads in stored_keys]
            values = [heads[g] for heads in stored_values]
            weights = softmax([_dot(q, k) / scale for k in keys], numbers)
            for f in range(dh):
                merged.append(sum((a * v[f] for a, v in zip(weights, values)), start=weights[0] * 0))
        out = matvec(self.layers[layer].wo, merged)
        post = self.layers[layer].post_attention_norm
        return out if post is None else rms_norm(out, post, config.norm_eps, numbers)

    def feed_forward(self, layer: int, hidden: Vector) -> Vector:
        """``hidden + ffn(rms_norm(hidden))`` (the gate's activation as configured), the feed-forward's output
        RMSNormed by ``post_ffn_norm`` first with ``post_norms``."""
        weights, config = self.layers[layer], self.config
        x = rms_norm(hidden, weights.ffn_norm, config.norm_eps, self.numbers)
        out = gated_feed_forward(x, weights, config.activation, self.numbers)
        if weights.post_ffn_norm is not None:
            out = rms_norm(out, weights.post_ffn_norm, config.norm_eps, self.numbers)
        return [h + f for h, f in zip(hidden, out)]

    def logits(self, hidden: Vector) -> Vector:
        """The final RMSNorm, then the output head ``[V]``."""
        x = rms_norm(hidden, self.output_norm, self.config.norm_eps, self.numbers)
        return matvec(self.output, x)

    def _stored_heads(self, heads: list[Vector], times: int = 1) -> list[Vector]:
        """What the cache holds of one token's kv head rows (rotated keys, or values), head by head; ``times``: the
        weight of an estimate of any correct store's error (``EstimatedStorage``: sqrt(times) its bound)."""
        storage = self.kv_storage
        if storage is None:
            return heads
        if isinstance(storage, EstimatedStorage):
            if not storage.whole_row:
                return [storage(row, times) for row in heads]
            whole = storage([v for row in heads for v in row], times)
        elif not isinstance(storage, WholeRowStorage):
            return [storage(row) for row in heads]
        else:
            whole = storage([v for row in heads for v in row])
        dh = self.config.head_width
        return [whole[g * dh:(g + 1) * dh] for g in range(len(heads))]


# -- the cell model ----------------------------------------------------------------------------------------------

@dataclass(eq=False)
class Cell:
    """One decoded token in a store: ``position`` (moved by shifts and divides), ``token``, the ``sequences``
    it belongs to, and per layer ``keys [KV*dh]`` (before rotation) and ``values [KV*dh]`` as computed."""

    position: int
    token: int
    keys: tuple[Vector, ...]
    values: tuple[Vector, ...]
    sequences: set[int] = field(default_factory=set)
    # the sequences whose windowed store may have evicted this cell, unseen: a sequence holding a sink reports its
    # sink as its smallest position, so its evictions behind the window are not observable (docs/spec.md §15.2)
    uncertain: set[int] = field(default_factory=set)
    # in a model of windowed and global layers, the sequences whose windowed store evicted this cell: their windowed
    # layers no longer see it, their global layers still do (llama.cpp's iswa keeps it in its full store)
    window_gone: set[int] = field(default_factory=set)
    moves: int = 0  # shifts and divides that moved it: an engine storing rotated keys re-quantizes each time


@dataclass(frozen=True, eq=False)
class SavedSequence:
    """What saving one sequence keeps: its cells' positions, tokens, keys and values, in store order; in a store that
    evicts, the positions evicted from it and whether each cell may have been evicted unseen."""

    cells: tuple[tuple[int, int, tuple[Vector, ...], tuple[Vector, ...]], ...]
    evicted: frozenset[int] = frozenset()
    uncertain: tuple[bool, ...] = ()
    filled: bool = False
    window_gone: tuple[bool, ...] = ()  # each cell evicted from the windowed store only (global layers keep it)
    moves: tuple[int, ...] = ()  # each cell's moves (Cell.moves)


def open_range(p0: int, p1: int) -> tuple[int, float]:
    """The half-open range ``[p0, p1)`` of docs/spec.md §15.4: any ``p0 < 0`` means from 0, any ``p1 < 0`` to the
    end; ``p1`` itself is never in it (llama.h's comment "p0 < 0 : [0, p1]" closes the bracket, its code does not).
    """
    return (0 if p0 < 0 else p0), (float("inf") if p1 < 0 else p1)


class CellContext:
    """What one context holds: a store of cells (one for every sequence if unified, else one per sequence),
    and the sequence operations as data operations on it.

    ``shared_copies``: in a unified context a copy adds the destination to the source's cells (the same
    cells, no room used) instead of duplicating them. ``copy_into_nonempty``: ``"merge"``, ``"replace"`` or
    ``"whole_only"`` (a range copy is then outside the declaration: an ``OracleInputError``). ``grows``: no
    capacity limit -- nothing is ever full, and ``capacity`` is only the cells the context was asked for.

    ``evicts`` (a windowed model declared ``window_cells: visible``): a sequence's cells no later token of it can
    see may be evicted by the engine, which reports it through ``seq_pos_min``; ``follow_eviction`` judges and
    applies what it reports (evicted cells leave the sequence, their positions kept in ``evicted``). Room is then
    the engine's: a batch, duplicating copy or load past the free cells sets ``may_be_full`` instead of refusing
    (it may reuse evictable cells). ``reaches_evicted`` says whether an operation made an evicted position visible
    again. With windowed and global layers (``split``), eviction is of the windowed layers' store alone: the cell
    stays for the global layers (``Cell.window_gone``), and ``seq_pos_min`` is the windowed store's, as llama.cpp's
    iswa context and transformers' sliding layers report.
    """

    def __init__(self, model: Model, config: ContextConfig, *, shared_copies: bool = True,
                 copy_into_nonempty: str = MERGE, stream_cells: int | None = None, grows: bool = False,
                 evicts: bool = False) -> None:
        if copy_into_nonempty not in (MERGE, REPLACE, WHOLE_ONLY):
            raise OracleInputError(f"copy_into_nonempty must be merge, replace or whole_only, "
                                   f"got {copy_into_nonempty!r}")
        self.model, self.config = model, config
        self.shared_copies = shared_copies and config.unified
        self.copy_into_nonempty = copy_into_nonempty
        self.capacity = config.stream_cells if stream_cells is None else stream_cells  # cells of one store
        self.grows = grows
        self.stores: list[list[Cell]] = [[] for _ in range(1 if config.unified else config.max_sequences)]
        self.evicts = evicts and model.config.window is not None
        layers = range(model.config.layers)
        self.split = self.evicts and any(model.config.layer_window(i) is None for i in layers)
        self.evicted: dict[int, set[int]] = {}  # per sequence, the positions its store evicted (known)
        self.may_be_full = False  # set, not refused, by a call past the free cells of a store that evicts
        # set by a shift or divide that moved a cell its sequence may have evicted unseen while others hold it:
        # whether it moved for them is the engine's secret (reaches_evicted: "uncertain")
        self.moved_unseen = False
        self.filled: set[int] = set()  # the sequences that have held W tokens, or may have lost one to eviction

    # -- what is observable --

    def store_of(self, seq: int) -> list[Cell]:
        return self.stores[0 if self.config.unified else seq]

    def cells_of(self, seq: int) -> list[Cell]:
        """The cells ``seq`` sees, in store order."""
        return [cell for cell in self.store_of(seq) if seq in cell.sequences]

    def window_cells_of(self, seq: int) -> list[Cell]:
        """The cells ``seq``'s windowed layers hold: all of its cells, less those its windowed store evicted while
        global layers keep them."""
        return [cell for cell in self.cells_of(seq) if seq not in cell.window_gone]

    def own_cells(self, seq: int) -> int:
        """The cells only ``seq`` holds: what removing its cells frees (a cell it shares stays for the others)."""
        return sum(1 for cell in self.cells_of(seq) if cell.sequences == {seq})

    def pos_min(self, seq: int) -> int:  # a Python int, whatever ints the batches gave (numpy's, §15.3)
        """The smallest position ``seq`` holds (in its windowed store, where global layers keep more)."""
        return int(min((cell.position for cell in self.window_cells_of(seq)), default=-1))

    def pos_max(self, seq: int) -> int:
        return int(max((cell.position for cell in self.cells_of(seq)), default=-1))

    def free(self, store: list[Cell]) -> int:
        """The store's free cells (of those the context was asked for, when it grows: then below 0 past them)."""
        return self.capacity - len(store)

    def _room(self, store: list[Cell], needed: int, freed: int, what: str) -> None:
        """Refuse ``full`` unless ``needed`` cells fit in the store's free ones and ``freed`` (never, growing). A
        store that evicts may make room by evicting: past its free cells the call may be full, or done."""
        if not self.grows and needed > self.free(store) + freed:
            if self.evicts:
                self.may_be_full = True
                return
            raise ModelRefusal(FULL, f"{what} {needed} cells into a store with {self.free(store) + freed} free")

    # -- windows: sinks and eviction --

    def sees(self, query: int, position: int, layer: int | None = None) -> bool:
        """Whether a token at ``query`` sees a cell of its sequence at ``position`` (in ``layer``; None: in a
        windowed layer): at or before it, and within the window or a sink (positions below ``sinks``)."""
        window = self.model.config.window if layer is None else self.model.config.layer_window(layer)
        return position <= query and (window is None or query - position < window or position < self.config.sinks)

    def hidden_for_good(self, seq: int, position: int) -> bool:
        """Whether no later token of ``seq`` (at ``pos_max + 1`` or after) can see a cell at ``position``."""
        window = self.model.config.window
        return window is not None and self.config.sinks <= position <= self.pos_max(seq) + 1 - window

    def evictable(self, seq: int) -> list[Cell]:
        """``seq``'s cells its store may evict: hidden from every later token, never a sink nor its last cell."""
        if not self.evicts:
            return []
        top = self.pos_max(seq)
        return [c for c in self.window_cells_of(seq) if c.position < top and self.hidden_for_good(seq, c.position)]

    def follow_eviction(self, seq: int, reported_min: int) -> str | None:
        """The engine reports ``seq_pos_min(seq) = reported_min``: its cells below it were evicted. Legal (None
        returned): each was evictable, or may have been evicted unseen; then they leave ``seq`` (their positions
        kept in ``evicted``). Illegal: why (nothing changed)."""
        cells = self.window_cells_of(seq)
        if not cells or reported_min == self.pos_min(seq):
            self._update_uncertain(seq)
            return None
        bound = float("inf") if reported_min < 0 else reported_min
        allowed = {id(c) for c in self.evictable(seq)} | {id(c) for c in cells if seq in c.uncertain}
        gone = [c for c in cells if c.position < bound]
        seen = sorted(int(c.position) for c in gone if id(c) not in allowed)
        if seen:
            return (f"sequence {seq} reports seq_pos_min {reported_min}: its cells at {seen} are gone, but a later "
                    f"token still sees them (or they are sinks, or its last cell)")
        for cell in gone:
            if self.split:
                cell.window_gone.add(seq)
            else:
                cell.sequences.discard(seq)
            cell.uncertain.discard(seq)
            self.evicted.setdefault(seq, set()).add(int(cell.position))
        self.filled.add(seq)
        store = self.store_of(seq)
        store[:] = [cell for cell in store if cell.sequences]
        self._update_uncertain(seq)
        return None

    def _update_uncertain(self, seq: int) -> None:
        """A sequence holding a sink reports it as its smallest position: every cell its store may evict may be
        gone unseen. Without one, ``seq_pos_min`` told what is held: nothing is uncertain."""
        holds_sink = any(c.position < self.config.sinks for c in self.window_cells_of(seq))
        evictable = {id(c) for c in self.evictable(seq)} if holds_sink else set()
        for cell in self.window_cells_of(seq):
            if id(cell) in evictable:
                cell.uncertain.add(seq)
            else:
                cell.uncertain.discard(seq)
        if evictable:
            self.filled.add(seq)

    def reaches_evicted(self) -> str | None:
        """Whether a later token of some sequence would see a position its store evicted: ``"evicted"`` (known), or
        ``"uncertain"`` (a cell that may have been evicted unseen); None: no."""
        if not self.evicts:
            return None
        if self.moved_unseen:
            return "uncertain"
        window = self.model.config.window or 0
        found = None
        for seq in range(self.config.max_sequences):
            top = self.pos_max(seq)

            def visible(position: int) -> bool:  # to some token at top + 1 or later
                return position >= top + 2 - window or position < self.config.sinks

            if any(seq in c.uncertain and visible(c.position) for c in self.cells_of(seq)):
                return "uncertain"
            if any(visible(p) for p in self.evicted.get(seq, ())):
                found = "evicted"
        return found

    def has_filled(self, seq: int) -> bool:
        """Whether ``seq`` has held ``W`` tokens at once since it was last empty, or may have lost a cell to
        eviction (a ring that has wrapped)."""
        return seq in self.filled

    def _mark_filled(self) -> None:
        window = self.model.config.window
        if window is not None:
            self.filled |= {seq for seq in range(self.config.max_sequences) if len(self.cells_of(seq)) >= window}

    def _forget_evicted(self) -> None:
        """An empty sequence starts anew: nothing of it is evicted, its window not filled."""
        for seq in list(self.evicted):
            if not self.evicted[seq] or self.pos_max(seq) < 0:
                del self.evicted[seq]
        self.filled = {seq for seq in self.filled if self.pos_max(seq) >= 0}

    # -- decoding --

    def decode(self, batch: ModelBatch) -> np.ndarray:
        """Decode every token of ``batch`` into its sequence's cells; the wanted logits ``[n, V]`` in float64.

        Each layer first computes every batch token's key and value into its new cell, then each token
        attends over the cells of its sequence at positions ``<= its own`` (within the layer's window), the batch's
        new cells included: a batch is causal, as its tokens were decoded one by one. A token of several sequences
        is one cell all of them hold, and sees the cells every one of them holds.
        """
        self._check_batch(batch)
        model, numbers = self.model, self.model.numbers
        count = len(batch.tokens)
        hidden = [model.embed(t) for t in batch.tokens]  # [n][D]
        cells = [Cell(batch.positions[i], batch.tokens[i], (), (), set(batch.sequences_of(i))) for i in range(count)]
        for layer in range(model.config.layers):
            queries = []  # [n][H*dh], unrotated
            for i in range(count):  # every new cell gains this layer's key and value first
                query, key, value = model.project_kv(layer, hidden[i])
                queries.append(query)
                cells[i].keys, cells[i].values = (*cells[i].keys, key), (*cells[i].values, value)
            for i in range(count):
                seen = self._seen(frozenset(batch.sequences_of(i)), batch.positions[i], cells, layer)
                attention = model.attend(layer, queries[i], batch.positions[i], seen)
                hidden[i] = [h + a for h, a in zip(hidden[i], attention)]
            hidden = [model.feed_forward(layer, h) for h in hidden]
        for i, cell in enumerate(cells):
            self.store_of(batch.sequences_of(i)[0]).append(cell)
        self._mark_filled()
        wanted = [model.logits(hidden[i]) for i in range(count) if batch.logits[i]]
        rounded = [[numbers.to_float(v) for v in row] for row in wanted]
        return np.array(rounded, dtype=np.float64).reshape(len(wanted), model.config.vocab)

    def _seen(self, seqs: frozenset[int], position: int, batch_cells: list[Cell], layer: int) -> list[Cell]:
        """The cells a query of the sequences ``seqs`` (one, or several sharing a token) at ``position`` attends in
        ``layer`` (within that layer's window, and its sinks): held ones every one of them holds, then the batch's
        (whose keys and values of the current layer are in by then)."""
        first = min(seqs)
        candidates = [*(c for c in self.cells_of(first) if seqs <= c.sequences),
                      *(c for c in batch_cells if seqs <= c.sequences)]
        windowed = self.model.config.layer_window(layer) is not None
        return [c for c in candidates if self.sees(position, c.position, layer)
                and not (windowed and seqs & c.window_gone)]

    def _check_batch(self, batch: ModelBatch) -> None:
        """Refuse a malformed batch, then one without room; nothing is computed before both pass."""
        config, model = self.config, self.model.config
        if not batch.tokens:
            raise ModelRefusal(MALFORMED_BATCH, "an empty batch")
        for i, (token, position) in enumerate(zip(batch.tokens, batch.positions)):
            if not _is_int(token) or not 0 <= token < model.vocab:
                raise ModelRefusal(MALFORMED_BATCH, f"token {i} is {token!r}, outside [0, {model.vocab})")
            named = batch.sequences_of(i)
            for seq in named:
                if not _is_int(seq) or not 0 <= seq < config.max_sequences:
                    raise ModelRefusal(MALFORMED_BATCH, f"token {i}'s sequence {seq!r} is not one of "
                                                        f"0..{config.max_sequences - 1}")
            if not named or len(set(named)) < len(named):
                raise ModelRefusal(MALFORMED_BATCH, f"token {i} names the sequences {named!r}: none, or one twice")
            if len({id(self.store_of(seq)) for seq in named}) > 1:
                raise ModelRefusal(MALFORMED_BATCH, f"token {i}'s sequences {named!r} hold their cells in "
                                                    "different stores")
            if not _is_int(position) or position < 0:
                raise ModelRefusal(MALFORMED_BATCH, f"token {i}'s position {position!r} is not an int >= 0")
        named_by = [batch.sequences_of(i) for i in range(len(batch.tokens))]
        for seq in dict.fromkeys(s for named in named_by for s in named):
            positions = [p for p, named in zip(batch.positions, named_by) if seq in named]
            held = self.pos_max(seq)
            start = positions[0] if held < 0 else held + 1  # an empty sequence may start anywhere
            if positions != list(range(start, start + len(positions))):
                raise ModelRefusal(MALFORMED_BATCH, f"sequence {seq}'s positions {positions} do not run on from "
                                   f"{'nothing' if held < 0 else held} one by one")
            if positions[-1] >= model.max_positions:
                raise OracleInputError(f"position {positions[-1]} outside the model's {model.max_positions}")
        for index, store in enumerate(self.stores):
            needed = sum(1 for named in named_by if self.store_of(named[0]) is store)
            self._room(store, needed, 0, f"decoding store {index}'s")

    # -- sequence operations --

    def clear(self) -> None:
        for store in self.stores:
            store.clear()
        self.evicted.clear()
        self.filled.clear()

    def remove(self, seq: int, p0: int, p1: int) -> None:
        """``seq``'s cells at positions in the range leave it (``seq < 0``: every sequence's); a cell no
        sequence holds any more is freed."""
        self._check_sequence(seq, any_allowed=True)
        low, high = open_range(p0, p1)
        for store in (self.stores if seq < 0 or self.config.unified else [self.store_of(seq)]):
            for cell in store:
                if low <= cell.position < high:
                    cell.sequences = set() if seq < 0 else cell.sequences - {seq}
                    cell.uncertain &= cell.sequences
                    cell.window_gone &= cell.sequences
            store[:] = [cell for cell in store if cell.sequences]
        for one, positions in self.evicted.items():  # an evicted position in the range is removed as well
            if seq < 0 or one == seq:
                positions -= {p for p in positions if low <= p < high}
        self._forget_evicted()

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        """``src``'s cells in the range join ``dst``: the same cells (shared copies) or duplicates in
        ``dst``'s store; into a non-empty ``dst``, merged with its cells or replacing them."""
        self._check_sequence(src)
        self._check_sequence(dst)
        if src == dst:
            return
        whole = p0 < 0 and p1 < 0
        if self.copy_into_nonempty == WHOLE_ONLY and not whole:
            raise OracleInputError("a range copy under a whole_only declaration")
        low, high = open_range(p0, p1)
        copied = [cell for cell in self.cells_of(src) if low <= cell.position < high]
        replacing = self.copy_into_nonempty != MERGE
        if not self.shared_copies:
            store = self.store_of(dst)
            freed = sum(1 for cell in self.cells_of(dst) if cell.sequences == {dst}) if replacing else 0
            self._room(store, len(copied), freed, "copying")
        if replacing:
            self.remove(dst, -1, -1)
        for cell in copied:  # what src's windowed store evicted, dst's lacks too
            unseen = {dst} if src in cell.uncertain else set()
            gone = {dst} if src in cell.window_gone else set()
            if self.shared_copies:
                cell.sequences.add(dst)
                cell.uncertain |= unseen
                cell.window_gone |= gone
            else:
                self.store_of(dst).append(Cell(cell.position, cell.token, cell.keys, cell.values, {dst}, unseen,
                                               gone, cell.moves))
        evicted = {p for p in self.evicted.get(src, ()) if low <= p < high}  # what the copy lacks, dst lacks too
        if evicted:
            self.evicted.setdefault(dst, set()).update(evicted)
        self._forget_evicted()
        self._mark_filled()

    def keep(self, seq: int) -> None:
        """Every cell not of ``seq`` is freed; ``seq``'s cells belong to ``seq`` alone."""
        self._check_sequence(seq)
        for store in self.stores:
            for cell in store:
                cell.sequences = cell.sequences & {seq}
                cell.uncertain &= cell.sequences
                cell.window_gone &= cell.sequences
            store[:] = [cell for cell in store if cell.sequences]
        self.evicted = {one: positions for one, positions in self.evicted.items() if one == seq}
        self._forget_evicted()

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        """``delta`` added to the positions of ``seq``'s cells in the range (of every sequence sharing such a
        cell); a cell moved below 0 is freed. Keys are rotated at the new positions when read; values and
        deeper layers stay as computed. A cell moved to ``max_positions`` or past it would leave the model:
        ``OUTSIDE``, before anything changes."""
        self._check_sequence(seq)
        if not _is_int(delta):
            raise ModelRefusal(REFUSED, f"a shift by {delta!r}, not an int")
        low, high = open_range(p0, p1)
        store = self.store_of(seq)
        moved = [cell for cell in store if seq in cell.sequences and low <= cell.position < high]
        limit = self.model.config.max_positions
        if any(cell.position + delta >= limit for cell in moved):
            raise ModelRefusal(OUTSIDE, f"a shift by {delta} moves a cell of sequence {seq} to "
                               f"{max(cell.position for cell in moved) + delta}, past the model's {limit} positions")
        self.moved_unseen = any(seq in cell.uncertain and len(cell.sequences) > 1 for cell in moved)
        for cell in moved:
            cell.position += delta
            cell.moves += delta != 0
            if cell.position < 0:
                cell.sequences = set()
                cell.uncertain = set()
                cell.window_gone = set()
        store[:] = [cell for cell in store if cell.sequences]
        if seq in self.evicted:  # an evicted position moves as its cell would have
            moved_to = {p + delta if low <= p < high else p for p in self.evicted[seq]}
            self.evicted[seq] = {p for p in moved_to if p >= 0}
        self._forget_evicted()

    def divide(self, seq: int, p0: int, p1: int, d: int) -> None:
        """Positions ``p`` of ``seq``'s cells in the range become ``p // d`` (``d >= 1``)."""
        self._check_sequence(seq)
        if not _is_int(d) or d < 1:
            raise ModelRefusal(REFUSED, f"a divisor {d!r}, not an int >= 1")
        low, high = open_range(p0, p1)
        for cell in self.store_of(seq):
            if seq in cell.sequences and low <= cell.position < high:
                self.moved_unseen |= seq in cell.uncertain and len(cell.sequences) > 1 and cell.position // d != \
                    cell.position
                cell.moves += cell.position // d != cell.position
                cell.position //= d
        if seq in self.evicted:
            self.evicted[seq] = {p // d if low <= p < high else p for p in self.evicted[seq]}

    def save(self, seq: int) -> SavedSequence:
        """``seq``'s cells as they are now, self-contained: nothing done to this context later changes them."""
        self._check_sequence(seq)
        cells = self.cells_of(seq)
        return SavedSequence(tuple((c.position, c.token, c.keys, c.values) for c in cells),
                             frozenset(self.evicted.get(seq, ())), tuple(seq in c.uncertain for c in cells),
                             seq in self.filled, tuple(seq in c.window_gone for c in cells),
                             tuple(c.moves for c in cells))

    def load(self, seq: int, saved: SavedSequence) -> None:
        """``seq`` holds exactly the saved cells, its own removed first (their cells count as free)."""
        self._check_sequence(seq)
        store = self.store_of(seq)
        self._room(store, len(saved.cells), self.own_cells(seq), "loading")
        self.remove(seq, -1, -1)
        unseen = saved.uncertain or (False,) * len(saved.cells)
        gone = saved.window_gone or (False,) * len(saved.cells)
        moves = saved.moves or (0,) * len(saved.cells)
        store.extend(Cell(position, token, keys, values, {seq}, {seq} if maybe else set(),
                          {seq} if lost and self.split else set(), moved)
                     for (position, token, keys, values), maybe, lost, moved in zip(saved.cells, unseen, gone, moves))
        if saved.evicted and saved.cells:
            self.evicted[seq] = set(saved.evicted)
        if saved.filled and saved.cells:
            self.filled.add(seq)
        self._mark_filled()

    def _check_sequence(self, seq: Any, *, any_allowed: bool = False) -> None:
        if not _is_int(seq) or seq >= self.config.max_sequences or (seq < 0 and not any_allowed):
            raise ModelRefusal(REFUSED, f"sequence {seq!r} is not one of 0..{self.config.max_sequences - 1}")


def full_model(tokens: Sequence[int], config: ModelConfig, weights: ModelWeights, *,
               numbers: NumberSystem = FLOAT64, kv_storage: KvStorage | None = None) -> np.ndarray:
    """Every position's logits ``[T, V]`` of one sequence ``tokens`` at positions ``0..T-1``, from scratch."""
    model = Model(config, weights, numbers=numbers, kv_storage=kv_storage)
    context = CellContext(model, ContextConfig(cells=max(1, len(tokens)), max_sequences=1))
    return context.decode(ModelBatch.of_sequence(0, list(tokens), 0))


def kv_storage_of(storage: str | StorageFormat, numbers: NumberSystem) -> KvStorage | None:
    """What a cache of element type ``storage`` holds of a head row of ``numbers`` scalars (None: float64, exact).

    ``float32``, ``float16``, ``bfloat16``: each element rounded to nearest. ``q8_0``, ``q4_0``: llama.cpp's
    block formats, one float16 scale per 32 consecutive features (``storage.StorageFormat``), cut from each
    head's row (a whole number of blocks: the head width a multiple of 32) or, for a ``StorageFormat`` along
    ``row``, from the token's whole kv row (a ``WholeRowStorage``: ``KV * dh`` a multiple of 32). Affine
    groups (a ``per_group`` ``StorageFormat``): each head row's groups of consecutive features, as a layer stores.
    """
    dtype = storage if isinstance(storage, str) else storage.format
    if dtype == "float64":
        return None
    if numbers.reads_errors:  # the errors any correct store may have, not one store's values
        if isinstance(storage, str) and storage not in BLOCK_FORMATS and storage not in ("float16", "bfloat16"):
            return None  # a cache in the computation's own dtype: its rounding is the dtype's (§8.3)
        rule = storage if isinstance(storage, StorageFormat) else StorageFormat(
            dtype, "per_block" if dtype in BLOCK_FORMATS else "none")
        return EstimatedStorage(rule, whole_row=rule.along == "row")
    if isinstance(storage, StorageFormat) and storage.scale == "per_group":
        groups = storage

        def in_groups(row: Vector) -> Vector:
            if len(row) % groups.group:
                raise OracleInputError(f"groups of {groups.group} features do not divide a head row of {len(row)}")
            floats = np.array([numbers.to_float(v) for v in row], dtype=np.float64).reshape(1, 1, 1, -1)
            return [numbers.number(float(v)) for v in groups.stored(floats).ravel()]
        return in_groups
    if dtype in BLOCK_FORMATS:
        blocks = StorageFormat(dtype, "per_block")
        what = "a kv row" if isinstance(storage, StorageFormat) and storage.along == "row" else "a head row"

        def stored(row: Vector) -> Vector:
            if len(row) % BLOCK:
                raise OracleInputError(f"{dtype} stores blocks of {BLOCK} features; {what} of {len(row)} is not a "
                                       "whole number of them")
            floats = np.array([numbers.to_float(v) for v in row], dtype=np.float64)
            return [numbers.number(float(v)) for v in blocks.stored(floats)]
        return WholeRowStorage(stored) if what == "a kv row" else stored
    if dtype not in ("float32", "float16", "bfloat16"):
        raise OracleInputError(f"kv storage must be float64, float32, float16, bfloat16, q8_0 or q4_0, got "
                               f"{dtype!r}")
    if dtype == "bfloat16":
        import ml_dtypes

        element: Any = ml_dtypes.bfloat16
    else:
        element = getattr(np, dtype)
    return lambda row: [numbers.number(float(element(numbers.to_float(v)))) for v in row]


def _is_int(value: object) -> bool:
    """An int of docs/spec.md §15.3: a Python int or a numpy integer scalar (what ``argmax`` of logits gives);
    never a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _head(row: Sequence[Any], head: int, dh: int) -> Vector:
    return list(row[head * dh:(head + 1) * dh])


def _dot(a: Sequence[Any], b: Sequence[Any]) -> Any:
    """``sum_f a[f] * b[f]``, from a zero of the same number system, in the order of ``f``."""
    return sum(map(operator.mul, a, b), start=a[0] * 0)
