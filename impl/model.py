"""The reference whole model: a Llama-family decoder over a context of cells, vectorised (docs/spec.md §15);
with per-layer windows and RoPE bases, and Gemma 3's switches where the configuration sets them.

Written apart from the oracle, and closer to how engines store it (llama.cpp's ``llama_kv_cache``): a
context preallocates, per store (one if unified, else one per sequence), ``[layers, cells, KV, dh]`` keys
*rotated at the cell's position* and values, the positions and tokens of the cells, and a membership
matrix ``[cells, sequences]``. A shift or divide re-rotates the moved keys by the change of position at
once; a copy in a unified context adds the destination to the membership (the same cells), elsewhere
it duplicates cells into the destination's store. Every call validates first and writes last, so a call
that raises changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass
from typing import Any

import numpy as np

from .errors import ContextFull, InvalidModelConfig, MalformedBatch, SequenceOperationRefused
from .rope import RopeConfig
from .storage import BLOCK_FORMATS, StorageRule, stored_in_blocks

COPY_POLICIES = ("merge", "replace", "whole_only")
_LAYER_ARRAYS = ("attention_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
_QK_NORMS, _POST_NORMS = ("q_norm", "k_norm"), ("post_attention_norm", "post_ffn_norm")
ACTIVATIONS = ("silu", "gelu_tanh")


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, dtype: np.dtype | None = None) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * w`` over the last axis; with ``dtype``, ``x`` cast to it and normalised there,
    then cast back before ``w`` multiplies it (transformers' RMSNorm: float32 inside a float64 model)."""
    if dtype is not None and dtype != x.dtype:
        low = x.astype(dtype)
        normed = (low / np.sqrt(np.mean(low * low, axis=-1, keepdims=True) + dtype.type(eps))).astype(x.dtype)
        return np.asarray(normed * weight)
    scaled: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight
    return scaled


@dataclass(frozen=True)
class ModelShape:
    """The fields of a model configuration this reference reads (any object with them will do)."""

    vocab: int
    model_width: int
    layers: int
    heads: int
    kv_heads: int
    head_width: int
    ffn_width: int
    rope_style: str
    rope_base: float
    norm_eps: float
    tied_output: bool
    window: int | None
    max_positions: int
    # read where present (a Llama's configuration may lack them): which layers the window applies to ("all", every
    # k-th layer global, or one bool per layer), the windowed layers' RoPE base, and Gemma 3's switches
    window_pattern: Any = "all"
    local_rope_base: float | None = None
    embedding_scale: bool = False
    qk_norm: bool = False
    post_norms: bool = False
    activation: str = "silu"

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        fields = cls.__dataclass_fields__
        try:
            given = {name: getattr(config, name) for name, field in fields.items()
                     if field.default is MISSING or hasattr(config, name)}
        except AttributeError as error:
            raise InvalidModelConfig(f"the configuration lacks {error.name!r}") from None
        shape = cls(**given)
        shape.windows()  # checks the pattern
        if shape.activation not in ACTIVATIONS:
            raise InvalidModelConfig(f"activation must be one of {ACTIVATIONS}, got {shape.activation!r}")
        if shape.local_rope_base is not None and shape.window is None:
            raise InvalidModelConfig("a local RoPE base without a window")
        return shape

    def windows(self) -> list[int | None]:
        """Each layer's window: None where it is global."""
        pattern, layers = self.window_pattern, self.layers
        if self.window is None:
            if pattern != "all":
                raise InvalidModelConfig(f"a window pattern {pattern!r} without a window")
            return [None] * layers
        if isinstance(pattern, str) and pattern == "all":
            return [self.window] * layers
        if isinstance(pattern, tuple) and len(pattern) == layers and all(isinstance(b, bool) for b in pattern):
            return [self.window if windowed else None for windowed in pattern]
        if _is_int(pattern) and int(pattern) >= 2:
            return [None if (i + 1) % int(pattern) == 0 else self.window for i in range(layers)]
        raise InvalidModelConfig(f"window pattern must be 'all', an int >= 2 or one bool per layer, got {pattern!r}")


DTYPES = ("float64", "float32", "float16")


class LlamaModel:
    """The weights (copied into ``dtype``, float64 by default) and the vectorised pieces of the forward, every
    operation in that dtype (as an engine computing in float32 does)."""

    def __init__(self, config: Any, weights: Any, *, dtype: str = "float64", norm_dtype: str | None = None,
                 activation_table: str | None = None) -> None:
        if dtype not in DTYPES or norm_dtype not in (None, *DTYPES):
            raise InvalidModelConfig(f"dtype and norm_dtype must be among {DTYPES}, got {dtype!r}, {norm_dtype!r}")
        if activation_table not in (None, "float16"):
            raise InvalidModelConfig(f"activation_table must be None or float16, got {activation_table!r}")
        # the gate activation read from a table of this dtype: its argument and its value rounded to it (ggml's GELU)
        self.activation_table = None if activation_table is None else np.dtype(activation_table)
        self.dtype = np.dtype(dtype)
        self.norm_dtype = None if norm_dtype is None else np.dtype(norm_dtype)  # RMSNorm's, if another
        shape = self.shape = ModelShape.of(config)
        if shape.heads % shape.kv_heads or shape.head_width % 2:
            raise InvalidModelConfig("heads must be a multiple of kv heads and the head width even")
        d, dh, f = shape.model_width, shape.head_width, shape.ffn_width
        expected = {"attention_norm": (d,), "wq": (shape.heads * dh, d), "wk": (shape.kv_heads * dh, d),
                    "wv": (shape.kv_heads * dh, d), "wo": (d, shape.heads * dh), "ffn_norm": (d,),
                    "w_gate": (f, d), "w_up": (f, d), "w_down": (d, f)}
        self.embedding = self._array(weights.embedding, (shape.vocab, d), "embedding")
        self.output_norm = self._array(weights.output_norm, (d,), "output_norm")
        if (weights.output is None) != bool(shape.tied_output):
            raise InvalidModelConfig("the output matrix must be absent exactly when the head is tied")
        self.output = self.embedding if weights.output is None else self._array(weights.output, (shape.vocab, d),
                                                                                "output")
        if len(weights.layers) != shape.layers:
            raise InvalidModelConfig(f"{len(weights.layers)} layers of weights for {shape.layers} layers")
        optional = [*(_QK_NORMS if shape.qk_norm else ()), *(_POST_NORMS if shape.post_norms else ())]
        expected |= {"q_norm": (dh,), "k_norm": (dh,), "post_attention_norm": (d,), "post_ffn_norm": (d,)}
        for layer in weights.layers:
            for name in (*_QK_NORMS, *_POST_NORMS):
                if (getattr(layer, name, None) is None) == (name in optional):
                    raise InvalidModelConfig(f"{name} must be given exactly when its switch is on")
        self.layers = [{name: self._array(getattr(layer, name), expected[name], name)
                        for name in (*_LAYER_ARRAYS, *optional)} for layer in weights.layers]
        self.windows = shape.windows()
        self.rope = RopeConfig(shape.rope_style, float(shape.rope_base), dh, shape.max_positions)
        local = shape.rope_base if shape.local_rope_base is None else shape.local_rope_base
        RopeConfig(shape.rope_style, local, dh, shape.max_positions)  # checks the local base as the global one
        # each layer's RoPE frequencies [dh/2]: the local base's in a windowed layer
        self.inverse_frequencies = [float(local if window is not None else shape.rope_base)
                                    ** (-np.arange(0, dh, 2, dtype=np.float64) / dh) for window in self.windows]
        self.embedding_scale = self.dtype.type(math.sqrt(d)) if shape.embedding_scale else None

    def _array(self, value: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
        array = np.array(value, dtype=np.float64)
        if array.shape != shape or not np.all(np.isfinite(array)):
            raise InvalidModelConfig(f"{name} must be finite of shape {shape}, got {array.shape}")
        return array.astype(self.dtype)

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """The first hidden states ``[n, D]``: embedding rows (times ``sqrt(D)`` with the embedding scale)."""
        rows: np.ndarray = self.embedding[tokens]
        return rows if self.embedding_scale is None else rows * self.embedding_scale

    def rotate(self, layer: int, x: np.ndarray, turns: np.ndarray) -> np.ndarray:
        """Rotate ``x [n, heads, dh]`` by ``turns [n]`` positions (a position, or a change of one) with layer
        ``layer``'s frequencies."""
        theta = np.multiply.outer(np.asarray(turns, dtype=np.float64), self.inverse_frequencies[layer])[:, None, :]
        return self.rope.rotate_with(x, (np.cos(theta).astype(self.dtype), np.sin(theta).astype(self.dtype)))

    def qkv(self, layer: int, hidden: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, ...]:
        """Rotated queries ``[n, H, dh]``, rotated keys and values ``[n, KV, dh]`` of ``hidden [n, D]`` (queries and
        keys RMSNormed per head first, with ``qk_norm``)."""
        s, w = self.shape, self.layers[layer]
        x = _rms_norm(hidden, w["attention_norm"], s.norm_eps, self.norm_dtype)
        n = len(hidden)
        q = (x @ w["wq"].T).reshape(n, s.heads, s.head_width)
        k = (x @ w["wk"].T).reshape(n, s.kv_heads, s.head_width)
        v = (x @ w["wv"].T).reshape(n, s.kv_heads, s.head_width)
        if "q_norm" in w:
            q = _rms_norm(q, w["q_norm"], s.norm_eps, self.norm_dtype)
            k = _rms_norm(k, w["k_norm"], s.norm_eps, self.norm_dtype)
        return self.rotate(layer, q, positions), self.rotate(layer, k, positions), v

    def attention(self, layer: int, q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                  visible: np.ndarray) -> np.ndarray:
        """``q [m, H, dh]`` over ``keys``, ``values [M, KV, dh]`` where ``visible [m, M]``; after ``wo``: [m, D]."""
        s = self.shape
        group = s.heads // s.kv_heads
        keys_h, values_h = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)  # [M, H, dh]
        scores = np.einsum("mhd,jhd->mhj", q, keys_h) / self.dtype.type(math.sqrt(s.head_width))
        scores = np.where(visible[:, None, :], scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        merged = np.einsum("mhj,jhd->mhd", weights, values_h).reshape(len(q), s.heads * s.head_width)
        out: np.ndarray = merged @ self.layers[layer]["wo"].T
        post = self.layers[layer].get("post_attention_norm")
        return out if post is None else _rms_norm(out, post, s.norm_eps, self.norm_dtype)

    def feed_forward(self, layer: int, hidden: np.ndarray) -> np.ndarray:
        """``hidden`` plus the gated feed-forward of its norm (silu or GELU's tanh form; post-normed if switched)."""
        w = self.layers[layer]
        x = _rms_norm(hidden, w["ffn_norm"], self.shape.norm_eps, self.norm_dtype)
        gate = x @ w["w_gate"].T
        if self.activation_table is not None:
            gate = gate.astype(self.activation_table).astype(self.dtype)
        if self.shape.activation == "gelu_tanh":
            cubic = gate + self.dtype.type(0.044715) * gate * gate * gate
            activated = self.dtype.type(0.5) * gate * (1 + np.tanh(self.dtype.type(math.sqrt(2 / math.pi)) * cubic))
        else:
            activated = gate / (1 + np.exp(-gate))
        if self.activation_table is not None:
            activated = activated.astype(self.activation_table).astype(self.dtype)
        out: np.ndarray = (activated * (x @ w["w_up"].T)) @ w["w_down"].T
        if "post_ffn_norm" in w:
            out = _rms_norm(out, w["post_ffn_norm"], self.shape.norm_eps, self.norm_dtype)
        result: np.ndarray = hidden + out
        return result

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        out: np.ndarray = _rms_norm(hidden, self.output_norm, self.shape.norm_eps, self.norm_dtype) @ self.output.T
        return out


@dataclass(frozen=True, eq=False)
class SequenceState:
    """One sequence's cells, saved: positions and tokens ``[n]``, keys (rotated) and values ``[L, n, KV, dh]``."""

    positions: np.ndarray
    tokens: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    filled: bool = False  # the sequence had held a window's worth of tokens (or lost one to eviction)


class ModelContext:
    """A context of ``cells`` cells for sequences ``0 .. max_sequences-1`` of one ``LlamaModel``; its keys and
    values are stored in ``kv_dtype`` (default the model's), rounded when written, read back in the model's; a
    block format's blocks cut from each head's row, or with ``blocks_along_row`` from each token's whole kv row;
    or with ``kv_groups`` (affine groups) each head row rounded in groups, held in the model's dtype.

    A windowed model's ``sinks`` S: positions below S stay visible to every later token. ``evicts``: a batch short
    of free cells overwrites cells no later token of their sequence sees (llama.cpp's sliding-window cache without
    ``swa_full``), oldest first, never a sink nor a sequence's last cell. ``removal_until_full``: a removal to the
    end is refused once the sequence has held W tokens (a ring that cannot bring evicted cells back)."""

    def __init__(self, model: LlamaModel, cells: int, max_sequences: int, unified: bool, *,
                 shared_copies: bool = True, copy_into_nonempty: str = "merge", kv_dtype: str | None = None,
                 end_only_removal: bool = False, bounded_shifts: bool = True, blocks_along_row: bool = False,
                 kv_groups: StorageRule | None = None, numbers_positions: bool = False, grows: bool = False,
                 micro_batch: int | None = None, sinks: int = 0, evicts: bool = False,
                 removal_until_full: bool = False) -> None:
        if kv_dtype is not None and kv_dtype not in (*DTYPES, *BLOCK_FORMATS):
            raise InvalidModelConfig(f"kv_dtype must be one of {(*DTYPES, *BLOCK_FORMATS)}, got {kv_dtype!r}")
        if not (_is_int(cells) and _is_int(max_sequences)) or cells < 1 or max_sequences < 1 or (
                not unified and cells < max_sequences):
            raise InvalidModelConfig(f"cells {cells!r} and max_sequences {max_sequences!r} must be ints >= 1 "
                                     f"(a cell for each sequence when not unified)")
        if copy_into_nonempty not in COPY_POLICIES:
            raise InvalidModelConfig(f"copy_into_nonempty must be one of {COPY_POLICIES}")
        s = model.shape
        row = s.kv_heads * s.head_width if blocks_along_row else s.head_width
        if kv_dtype in BLOCK_FORMATS and row % 32:
            raise InvalidModelConfig(f"a {kv_dtype} cache stores blocks of 32 features: "
                                     f"{'a kv row' if blocks_along_row else 'a head'} of {row}")
        if kv_groups is not None and (kv_groups.scale != "per_group" or s.head_width % kv_groups.group):
            raise InvalidModelConfig(f"kv_groups must be affine groups that divide a head of {s.head_width}")
        self.blocks_along_row, self.kv_groups = blocks_along_row, kv_groups
        self.model, self.unified, self.sequences = model, bool(unified), max_sequences
        self.shared_copies, self.copy_into_nonempty = shared_copies and self.unified, copy_into_nonempty
        self.end_only_removal = end_only_removal  # a removal that would leave cells after its range is refused
        self.bounded_shifts = bounded_shifts  # a shift past max_positions refused (else done, as llama.cpp does)
        # the batch's positions ignored: each sequence's tokens numbered on from its largest position, an empty one
        # from 0 (llama.cpp's decode of a batch whose pos is NULL)
        self.numbers_positions = numbers_positions
        self.grows = grows  # no capacity limit: a store short of free cells is reallocated larger, never full
        # a longer batch is computed in parts of this many tokens, each committed before the next (llama.cpp's
        # n_ubatch); a part without room undoes the parts before it
        self.micro_batch = micro_batch
        if not _is_int(sinks) or sinks < 0:
            raise InvalidModelConfig(f"sinks must be an int >= 0, got {sinks!r}")
        self.sinks = int(sinks)
        self.evicts = evicts and s.window is not None
        self.removal_until_full = removal_until_full and s.window is not None
        self.filled = np.zeros(max_sequences, dtype=bool)  # per sequence, since it was last empty
        streams = 1 if self.unified else max_sequences
        self.capacity = cells if self.unified else cells // max_sequences
        self.kv_blocks = kv_dtype if kv_dtype in BLOCK_FORMATS else None  # held as read back, in the model's dtype
        self.kv_dtype = model.dtype if kv_dtype is None or self.kv_blocks else np.dtype(kv_dtype)
        self.keys = np.zeros((streams, s.layers, self.capacity, s.kv_heads, s.head_width), dtype=self.kv_dtype)
        self.values = np.zeros_like(self.keys)
        self.positions = np.full((streams, self.capacity), -1, dtype=np.int64)
        self.tokens = np.full((streams, self.capacity), -1, dtype=np.int64)
        self.members = np.zeros((streams, self.capacity, max_sequences), dtype=bool)  # cell -> its sequences

    # -- what is observable --

    def stream(self, seq: int) -> int:
        return 0 if self.unified else int(seq)

    def pos_min(self, seq: int) -> int:
        held = self.positions[self.stream(seq)][self.members[self.stream(seq), :, seq]]
        return int(held.min()) if held.size else -1

    def pos_max(self, seq: int) -> int:
        held = self.positions[self.stream(seq)][self.members[self.stream(seq), :, seq]]
        return int(held.max()) if held.size else -1

    def _free_slots(self, stream: int) -> np.ndarray:
        return np.flatnonzero(~self.members[stream].any(axis=1))

    def _reserve(self, stream: int, needed: int) -> None:
        """A growing context: at least ``needed`` free cells in ``stream``, every store reallocated alike (at least
        twice as large), the cells held copied over. Growing is not observable: the same cells, more room."""
        short = needed - len(self._free_slots(stream))
        if not self.grows or short <= 0:
            return
        held, grown = self.capacity, max(2 * self.capacity, self.capacity + short)

        def widened(array: np.ndarray, axis: int, fill: Any) -> np.ndarray:
            shape = list(array.shape)
            shape[axis] = grown
            wide = np.full(shape, fill, dtype=array.dtype)
            wide[(slice(None),) * axis + (slice(0, held),)] = array
            return wide

        self.keys = widened(self.keys, 2, 0)
        self.values = widened(self.values, 2, 0)
        self.positions = widened(self.positions, 1, -1)
        self.tokens = widened(self.tokens, 1, -1)
        self.members = widened(self.members, 1, False)
        self.capacity = grown

    # -- decoding --

    def decode(self, tokens: Any, positions: Any, sequences: Any, logits: Any) -> np.ndarray:
        """Decode a batch into its sequences' cells, all or none; the wanted logits ``[n, V]`` in batch order. A token
        may name several sequences (a tuple of ids): one cell they all hold, seeing the cells they all hold."""
        tokens, positions, sequences, named = self._checked_batch(tokens, positions, sequences)
        wanted = np.array([bool(w) for w in logits], dtype=bool)
        step = self.micro_batch or len(tokens)
        if step >= len(tokens):
            return self._decode_checked(tokens, positions, sequences, named, wanted)
        kept = self._arrays()
        outputs = []
        try:
            for start in range(0, len(tokens), step):
                part = slice(start, start + step)
                outputs.append(self._decode_checked(tokens[part], positions[part], sequences[part], named[part],
                                                    wanted[part]))
        except ContextFull:
            self._restore(kept)
            raise
        return np.concatenate(outputs)

    def _arrays(self) -> tuple[np.ndarray, ...]:
        """Copies of everything a decode writes (a growing context's larger arrays included)."""
        return tuple(array.copy() for array in (self.keys, self.values, self.positions, self.tokens, self.members,
                                                self.filled))

    def _restore(self, kept: tuple[np.ndarray, ...]) -> None:
        self.keys, self.values, self.positions, self.tokens, self.members, self.filled = kept
        self.capacity = self.positions.shape[1]

    def _evict_for(self, stream: int, needed: int) -> None:
        """Free slots by overwriting, as llama.cpp's sliding-window cache does: a cell of one sequence that no later
        token of it sees (below its next position's window, not a sink, not its last cell), oldest first, and with
        it every cell of that sequence below (its positions stay contiguous). Too few: nothing is evicted."""
        short = needed - len(self._free_slots(stream))
        if not self.evicts or short <= 0:
            return
        window, members, positions = self.model.shape.window or 1, self.members[stream], self.positions[stream]
        candidates = []
        for seq in range(self.sequences):
            mine = members[:, seq]
            if not mine.any():
                continue
            top = int(positions[mine].max())
            hidden = mine & (members.sum(axis=1) == 1) & (positions >= self.sinks) & (positions < top) & (
                positions <= top + 1 - window)
            candidates += [(int(positions[slot]), seq) for slot in np.flatnonzero(hidden)]
        if len(candidates) < short:
            return
        for position, seq in sorted(candidates)[:short]:
            below = members[:, seq] & (positions >= self.sinks) & (positions <= position)
            self.members[stream, below, seq] = False
            self.filled[seq] = True
        self._release_empty()

    def _mark_filled(self) -> None:
        """A sequence holding W cells or more has filled its window."""
        if self.model.shape.window is not None:
            self.filled |= self.members.sum(axis=(0, 1)) >= self.model.shape.window

    def _decode_checked(self, tokens: np.ndarray, positions: np.ndarray, sequences: np.ndarray, named: np.ndarray,
                        wanted: np.ndarray) -> np.ndarray:
        """Decode a checked batch (or one part of it) into its sequences' cells; the wanted logits."""
        slots = np.empty(len(tokens), dtype=np.int64)
        streams = np.array([self.stream(seq) for seq in sequences], dtype=np.int64)
        kept = self._arrays() if self.evicts else None  # a store that evicted before another was full: undone
        for stream in np.unique(streams):
            mine = np.flatnonzero(streams == stream)
            self._reserve(int(stream), len(mine))
            self._evict_for(int(stream), len(mine))
            free = self._free_slots(stream)
            if len(mine) > len(free):
                if kept is not None:
                    self._restore(kept)
                raise ContextFull(len(mine), len(free), "decoding the batch")
            slots[mine] = free[:len(mine)]
        model, s = self.model, self.model.shape
        hidden = model.embed(tokens)  # [n, D]
        new_keys = np.empty((s.layers, len(tokens), s.kv_heads, s.head_width), dtype=self.kv_dtype)
        new_values = np.empty_like(new_keys)
        for layer in range(s.layers):
            q, k, v = model.qkv(layer, hidden, positions)
            new_keys[layer], new_values[layer] = self._as_stored(k), self._as_stored(v)  # rotated, then stored
            attended = np.empty_like(hidden)
            for stream in np.unique(streams):
                mine = np.flatnonzero(streams == stream)
                keys = np.concatenate([self.keys[stream, layer], new_keys[layer, mine]]).astype(model.dtype)
                values = np.concatenate([self.values[stream, layer], new_values[layer, mine]]).astype(model.dtype)
                cell_positions = np.concatenate([self.positions[stream], positions[mine]])
                # a token sees a cell (held, or of the batch) that every one of its sequences holds
                held = ~(named[mine][:, None, :] & ~self.members[stream][None, :, :]).any(axis=2)  # [m, C]
                batch = ~(named[mine][:, None, :] & ~named[mine][None, :, :]).any(axis=2)  # [m, m]
                visible = np.concatenate([held, batch], axis=1) & (cell_positions[None, :] <= positions[mine, None])
                window = model.windows[layer]  # this layer's (None: a global layer)
                if window is not None:  # within the window, or a sink
                    visible &= (positions[mine, None] - cell_positions[None, :] < window) | (
                        cell_positions[None, :] < self.sinks)
                attended[mine] = model.attention(layer, q[mine], keys, values, visible)
            hidden = model.feed_forward(layer, hidden + attended)
        result = model.logits(hidden[wanted])
        for i, (stream, slot) in enumerate(zip(streams, slots)):  # commit: nothing above wrote the context
            self.keys[stream, :, slot], self.values[stream, :, slot] = new_keys[:, i], new_values[:, i]
            self.positions[stream, slot], self.tokens[stream, slot] = positions[i], tokens[i]
            self.members[stream, slot] = named[i]
        self._mark_filled()
        return result

    def _as_stored(self, rows: np.ndarray) -> np.ndarray:
        """``rows [..., KV, dh]`` as the cache holds them."""
        if self.kv_groups is not None:  # rounded in float64, each head row's groups on their own
            return self.kv_groups.round(rows.astype(np.float64), np.ones(1)).astype(self.kv_dtype)
        if self.kv_blocks is not None and self.blocks_along_row:  # each token's heads side by side, then cut
            whole = stored_in_blocks(rows.reshape(*rows.shape[:-2], -1), self.kv_blocks)
            return whole.reshape(rows.shape).astype(self.kv_dtype)
        if self.kv_blocks is not None:
            return stored_in_blocks(rows, self.kv_blocks).astype(self.kv_dtype)
        return rows.astype(self.kv_dtype)

    def _checked_batch(self, tokens: Any, positions: Any, sequences: Any) -> tuple[np.ndarray, ...]:
        """The batch as arrays: token ids, positions, each token's first sequence ``[n]``, and the sequences each
        token names ``[n, max_sequences]``."""
        s = self.model.shape
        tokens, sequences = list(tokens), list(sequences)
        positions = self._numbered(sequences) if self.numbers_positions else list(positions)
        if not tokens:
            raise MalformedBatch("the batch is empty")
        named = np.zeros((len(tokens), self.sequences), dtype=bool)
        for i, (token, position, seq) in enumerate(zip(tokens, positions, sequences)):
            if not _is_int(token) or not 0 <= token < s.vocab:
                raise MalformedBatch(f"token {i} is {token!r}, not an id in [0, {s.vocab})")
            for one in (seq if isinstance(seq, tuple) else (seq,)):
                if not _is_int(one) or not 0 <= one < self.sequences:
                    raise MalformedBatch(f"token {i}'s sequence {one!r} is not one of 0..{self.sequences - 1}")
                if named[i, one]:
                    raise MalformedBatch(f"token {i} names sequence {one} twice")
                named[i, one] = True
            if not named[i].any():
                raise MalformedBatch(f"token {i} names no sequence")
            if len({self.stream(int(one)) for one in np.flatnonzero(named[i])}) > 1:
                raise MalformedBatch(f"token {i}'s sequences hold their cells in different stores")
            if not _is_int(position) or not 0 <= position < s.max_positions:
                raise MalformedBatch(f"token {i}'s position {position!r} is not in [0, {s.max_positions})")
        as_arrays = (np.array(tokens, dtype=np.int64), np.array(positions, dtype=np.int64),
                     named.argmax(axis=1).astype(np.int64), named)
        for seq in np.flatnonzero(named.any(axis=0)):
            mine = as_arrays[1][named[:, seq]]
            last = self.pos_max(int(seq))
            start = mine[0] if last < 0 else last + 1
            if not np.array_equal(mine, np.arange(start, start + len(mine))):
                raise MalformedBatch(f"sequence {seq}'s positions {mine.tolist()} do not follow "
                                     f"{'an empty sequence' if last < 0 else last} one by one")
        return as_arrays

    def _numbered(self, sequences: list[Any]) -> list[Any]:
        """The engine's own positions for a batch of ``sequences``: each sequence's tokens run on, in batch order,
        from its largest position + 1 (an empty sequence from 0)."""
        following: dict[int, int] = {}
        numbered: list[Any] = []
        for seq in sequences:
            named = seq if isinstance(seq, tuple) else (seq,)
            if not named or not all(_is_int(one) and 0 <= one < self.sequences for one in named):
                numbered.append(0)  # refused below, as an unknown sequence
                continue
            key = int(named[0])  # a token of several sequences: the next of its first (they hold the same cells)
            if key not in following:
                following[key] = self.pos_max(key) + 1
            numbered.append(following[key])
            for one in named:
                following[int(one)] = numbered[-1] + 1
        return numbered

    # -- sequence operations --

    def _check_seq(self, operation: str, seq: Any, *, any_allowed: bool = False) -> None:
        if not _is_int(seq) or seq >= self.sequences or (seq < 0 and not any_allowed):
            raise SequenceOperationRefused(operation, f"sequence {seq!r} is not one of 0..{self.sequences - 1}")

    def _in_range(self, p0: Any, p1: Any, operation: str) -> np.ndarray:
        if not (_is_int(p0) and _is_int(p1)):
            raise SequenceOperationRefused(operation, f"positions {p0!r}, {p1!r} are not ints")
        low = 0 if p0 < 0 else p0  # half-open [p0, p1): any negative end is open, p1 itself never included
        mask: np.ndarray = (self.positions >= low) & ((self.positions < p1) if p1 >= 0 else True)
        return mask  # [streams, cells]

    def _release_empty(self) -> None:
        self.positions[~self.members.any(axis=2)] = -1
        self.filled &= self.members.any(axis=(0, 1))  # an empty sequence starts anew

    def clear(self) -> None:
        self.members[:] = False
        self._release_empty()

    def remove(self, seq: int, p0: int, p1: int) -> None:
        self._check_seq("seq_remove", seq, any_allowed=True)
        chosen = self._in_range(p0, p1, "seq_remove")
        if self.end_only_removal and p1 >= 0:
            held = self.members.any(axis=2) if seq < 0 else self.members[..., seq]  # [streams, cells]
            if (held & (self.positions >= p1)).any():
                raise SequenceOperationRefused("seq_remove", f"[{p0}, {p1}) would leave cells after it: removals "
                                               "to the end only")
        # a removal to the end that leaves a cell (of every cell held it always succeeds) of a filled sequence
        rings = [one for one in (range(self.sequences) if seq < 0 else (seq,)) if self.filled[one]
                 and (self.members[..., one] & (self.positions < max(p0, 0))).any()]
        if self.removal_until_full and p1 < 0 and rings:
            raise SequenceOperationRefused("seq_remove", "a removal to the end of a sequence that has filled its "
                                           "window: a ring cannot bring its evicted cells back")
        if seq < 0:
            self.members[chosen] = False
        else:
            self.members[..., seq] &= ~chosen
        self._release_empty()

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        self._check_seq("seq_copy", src)
        self._check_seq("seq_copy", dst)
        chosen = self._in_range(p0, p1, "seq_copy")
        if self.copy_into_nonempty == "whole_only" and (p0 >= 0 or p1 >= 0):
            raise SequenceOperationRefused("seq_copy", "only whole sequences are copied (p0 and p1 below 0)")
        if src == dst:
            return
        replacing = self.copy_into_nonempty != "merge"
        source, target = self.stream(src), self.stream(dst)
        picked = np.flatnonzero(chosen[source] & self.members[source, :, src])
        if self.shared_copies:
            if replacing:
                self.remove(dst, -1, -1)
            self.members[source, picked, dst] = True
            self._mark_filled()
            return
        self._reserve(target, len(picked))
        only_dst = self.members[target, :, dst] & (self.members[target].sum(axis=1) == 1)
        free = len(self._free_slots(target)) + (int(only_dst.sum()) if replacing else 0)
        if len(picked) > free:
            raise ContextFull(len(picked), free, "copying the sequence")
        cells = (self.positions[source, picked].copy(), self.tokens[source, picked].copy(),
                 self.keys[source][:, picked].copy(), self.values[source][:, picked].copy())
        if replacing:
            self.remove(dst, -1, -1)
        self._write(target, dst, *cells)
        self._mark_filled()

    def _write(self, stream: int, seq: int, positions: np.ndarray, tokens: np.ndarray, keys: np.ndarray,
               values: np.ndarray) -> None:
        """New cells of ``seq`` alone in free slots of ``stream`` (the caller checked the room)."""
        slots = self._free_slots(stream)[:len(positions)]
        self.positions[stream, slots], self.tokens[stream, slots] = positions, tokens
        self.keys[stream][:, slots], self.values[stream][:, slots] = keys, values
        self.members[stream, slots] = False
        self.members[stream, slots, seq] = True

    def keep(self, seq: int) -> None:
        self._check_seq("seq_keep", seq)
        kept = self.members[..., seq].copy()
        self.members[:] = False
        self.members[..., seq] = kept
        self._release_empty()

    def _move(self, seq: int, chosen: np.ndarray, new_positions: np.ndarray) -> None:
        """Cells of ``seq`` where ``chosen [cells]`` go to ``new_positions`` (of the same cells), keys re-rotated;
        those below 0 leave every sequence."""
        stream = self.stream(seq)
        picked = np.flatnonzero(chosen & self.members[stream, :, seq])
        if not picked.size:
            return
        moved = new_positions[picked] - self.positions[stream, picked]
        for layer in range(self.model.shape.layers):  # read back, re-rotated in the model's dtype, stored again
            held = self.keys[stream, layer, picked].astype(self.model.dtype)
            self.keys[stream, layer, picked] = self._as_stored(self.model.rotate(layer, held, moved))
        self.positions[stream, picked] = new_positions[picked]
        gone = picked[new_positions[picked] < 0]
        self.members[stream, gone] = False
        self._release_empty()

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        self._check_seq("seq_shift", seq)
        if not _is_int(delta):
            raise SequenceOperationRefused("seq_shift", f"delta {delta!r} is not an int")
        stream = self.stream(seq)
        chosen = self._in_range(p0, p1, "seq_shift")[stream]
        moved = self.positions[stream][chosen & self.members[stream, :, seq]]
        too_far = self.bounded_shifts and moved.size > 0 and int(moved.max()) + delta >= self.model.shape.max_positions
        if too_far:  # the RoPE table ends there: refused before anything moves
            raise SequenceOperationRefused("seq_shift", f"a shift by {delta} would move a cell past the model's "
                                           f"{self.model.shape.max_positions} positions")
        self._move(seq, chosen, self.positions[stream] + int(delta))

    def divide(self, seq: int, p0: int, p1: int, d: int) -> None:
        self._check_seq("seq_divide", seq)
        if not _is_int(d) or d < 1:
            raise SequenceOperationRefused("seq_divide", f"the divisor {d!r} is not an int >= 1")
        stream = self.stream(seq)
        self._move(seq, self._in_range(p0, p1, "seq_divide")[stream], self.positions[stream] // d)

    def save(self, seq: int) -> SequenceState:
        """Copies of the sequence's cells: nothing done to this context afterwards changes a saved state."""
        self._check_seq("save_sequence", seq)
        stream = self.stream(seq)
        picked = np.flatnonzero(self.members[stream, :, seq])
        return SequenceState(self.positions[stream, picked].copy(), self.tokens[stream, picked].copy(),
                             self.keys[stream][:, picked].copy(), self.values[stream][:, picked].copy(),
                             bool(self.filled[seq]))

    def load(self, seq: int, state: Any) -> None:
        self._check_seq("load_sequence", seq)
        s = self.model.shape
        if not isinstance(state, SequenceState) or state.keys.shape[0::2] != (s.layers, s.kv_heads) or \
                state.keys.shape[3] != s.head_width:
            raise SequenceOperationRefused("load_sequence", "the state is not a saved sequence of this model")
        stream = self.stream(seq)
        only_seq = self.members[stream, :, seq] & (self.members[stream].sum(axis=1) == 1)
        self._reserve(stream, len(state.positions))
        free = len(self._free_slots(stream)) + int(only_seq.sum())
        if len(state.positions) > free:
            raise ContextFull(len(state.positions), free, "loading the sequence")
        self.remove(seq, -1, -1)
        self._write(stream, seq, state.positions, state.tokens, state.keys, state.values)
        self.filled[seq] = state.filled and len(state.positions) > 0
        self._mark_filled()
