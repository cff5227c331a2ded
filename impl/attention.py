"""The attention layer: four parameters plus an exact RoPE configuration.

``forward_incremental`` is the chapter-37 step: validate (in the documented
order), prepare the whole step without touching the cache, and only then
commit one row. ``forward_full`` recomputes the full causal prefix; it is the
cache-free path the demo and the benchmarks compare against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .cache import LayerKvCache, RaggedKvCache
from .errors import (
    CacheFull,
    InputBatchMismatch,
    InputDtypeError,
    InputRankError,
    InputWidthMismatch,
    InvalidLayerConfig,
    NonFiniteAttention,
    NonFiniteError,
    NonFiniteInput,
    NonFiniteKeyValue,
    TokenCountError,
)
from .functions import FLOAT64_FUNCTIONS, Functions
from .parameters import Parameter
from .rope import RopeConfig


@dataclass(frozen=True, eq=False)
class PreparedRows:
    """A computed step whose key/value rows are not yet in the cache."""

    output: np.ndarray  # [B, T, D]
    keys: np.ndarray  # [B, KV, T, dh], rotated at their absolute positions
    values: np.ndarray  # [B, KV, T, dh], not rotated


class AttentionLayer:
    """Causal multi-head attention (MHA, GQA, MQA) with RoPE; row vectors ``y = x @ W``."""

    def __init__(self, wq: Parameter, wk: Parameter, wv: Parameter, wo: Parameter, *,
                 heads: int, kv_heads: int, rope: RopeConfig, functions: Functions = FLOAT64_FUNCTIONS) -> None:
        if not all(isinstance(p, Parameter) for p in (wq, wk, wv, wo)):
            raise InvalidLayerConfig("wq, wk, wv and wo must be Parameter objects")
        if not isinstance(rope, RopeConfig):
            raise InvalidLayerConfig(f"rope must be an impl.RopeConfig, got {type(rope).__name__}")
        for name, count in (("heads", heads), ("kv heads", kv_heads)):
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise InvalidLayerConfig(f"{name} must be an int >= 1, got {count!r}")
        if heads % kv_heads:
            raise InvalidLayerConfig(f"heads {heads} must be a multiple of kv heads {kv_heads}")
        if len(wq.shape) != 2 or wq.shape[1] % heads or wq.shape[1] == 0:
            raise InvalidLayerConfig(f"wq shape {wq.shape} must be [D, heads * head_width]")
        model_width, head_width = wq.shape[0], wq.shape[1] // heads
        expected = {"wk": (model_width, kv_heads * head_width), "wv": (model_width, kv_heads * head_width),
                    "wo": (heads * head_width, model_width)}
        for name, parameter in (("wk", wk), ("wv", wv), ("wo", wo)):
            if parameter.shape != expected[name]:
                raise InvalidLayerConfig(f"{name} shape {parameter.shape} must be {expected[name]}")
        if rope.rotary_width > head_width:
            raise InvalidLayerConfig(f"rotary width {rope.rotary_width} exceeds head width {head_width}")
        if len({id(p) for p in (wq, wk, wv, wo)}) != 4:
            raise InvalidLayerConfig("wq, wk, wv and wo must be four distinct parameters")
        self.wq, self.wk, self.wv, self.wo = wq, wk, wv, wo
        self.heads, self.kv_heads, self.rope = heads, kv_heads, rope
        self.functions = functions  # exp, cos and sin: float64's, or of a lower dtype's accuracy
        self.model_width, self.head_width = model_width, head_width

    @classmethod
    def from_arrays(cls, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray, *,
                    heads: int, kv_heads: int, rope: RopeConfig,
                    functions: Functions = FLOAT64_FUNCTIONS) -> AttentionLayer:
        """A layer owning four new parameters (a new identity) with copies of these values."""
        return cls(Parameter("wq", wq), Parameter("wk", wk), Parameter("wv", wv), Parameter("wo", wo),
                   heads=heads, kv_heads=kv_heads, rope=rope, functions=functions)

    def with_rope(self, rope: RopeConfig) -> AttentionLayer:
        """The same parameter objects under another RoPE configuration."""
        return AttentionLayer(self.wq, self.wk, self.wv, self.wo,
                              heads=self.heads, kv_heads=self.kv_heads, rope=rope, functions=self.functions)

    @property
    def parameters(self) -> tuple[Parameter, Parameter, Parameter, Parameter]:
        return self.wq, self.wk, self.wv, self.wo

    @property
    def group_size(self) -> int:
        """Query heads sharing one kv head: query head ``h`` reads kv head ``h // group_size``."""
        return self.heads // self.kv_heads

    # -- the cached step ---------------------------------------------------------------------------

    def forward_incremental(self, x: np.ndarray, cache: LayerKvCache) -> np.ndarray:
        """Attend one new row ``x [B, 1, D]`` over the cached prefix; append its K/V row.

        Returns ``[B, 1, D]``. Any rejection raises before the cache changes.
        """
        self._validate_request(x, cache)
        prepared = self.prepare(x, cache)
        cache.commit(prepared.keys, prepared.values)
        return prepared.output

    def forward_chunk(self, x: np.ndarray, cache: LayerKvCache) -> np.ndarray:
        """Attend ``T >= 1`` new rows ``x [B, T, D]`` causally over the cache and each other; append all T.

        Returns ``[B, T, D]``. A chunk that does not fit raises ``CacheFull``
        before anything is written, as does any other rejection.
        """
        self._validate_request(x, cache, chunk=True)
        prepared = self.prepare(x, cache)
        cache.commit(prepared.keys, prepared.values)
        return prepared.output

    def _validate_request(self, x: np.ndarray, cache: LayerKvCache, *, chunk: bool = False) -> None:
        """Dtype, rank, token count, batch, width, binding, free capacity -- in that order."""
        _check_float_rows(x)
        if x.shape[1] < 1 or (x.shape[1] != 1 and not chunk):
            raise TokenCountError(x.shape[1])
        if x.shape[0] != cache.batch_size:
            raise InputBatchMismatch(cache=cache.batch_size, input=x.shape[0])
        if x.shape[2] != self.model_width:
            raise InputWidthMismatch(expected=self.model_width, actual=x.shape[2])
        cache.check_binding(self)
        if cache.length + x.shape[1] > cache.capacity:
            if cache.checks_room:
                raise CacheFull(cache.capacity)
            # a buffer without a full check: the write past its end is the buffer's to refuse (commit)

    def prepare(self, x: np.ndarray, cache: LayerKvCache) -> PreparedRows:
        """Compute rows ``x [B, T, D]`` at positions ``next_position ..``; write nothing.

        The caller has established the binding, the shape and the free capacity
        (``forward_incremental`` per call, a decode session once). Checks every
        computed value, so that a commit afterwards can never write inf or NaN.
        """
        start = cache.next_position
        positions = np.arange(start, start + x.shape[1])  # [T]
        _require_finite(NonFiniteInput, "input", x)
        with np.errstate(over="ignore", invalid="ignore"):
            query, key, value = self._project(x)
            angles = self.rope.angles(positions, self.functions)  # one table for queries and keys
            query = self.rope.rotate_with(query, angles)
            key = self.rope.rotate_with(key, angles)
            _require_finite(NonFiniteKeyValue, "projected key", key)
            _require_finite(NonFiniteKeyValue, "projected value", value)
            _require_finite(NonFiniteAttention, "rotated query", query)
            stored_keys, stored_values, stored_positions = cache.held_rows(oldest_first=False)  # [B, KV, n, dh]
            mixed = _attend(query, key, value, positions, stored_keys, stored_values, stored_positions,
                            window=cache.window, sinks=cache.sinks, functions=self.functions)  # [B, T, H*dh]
            output = mixed @ self.wo.value  # [B, T, D]
            _require_finite(NonFiniteAttention, "attention output", output)
        return PreparedRows(output=output, keys=key, values=value)

    # -- ragged batches (docs/spec.md §13.8) -------------------------------------------------------------

    def forward_ragged(self, x: np.ndarray, lengths: object, cache: RaggedKvCache) -> np.ndarray:
        """Row ``b`` appends its last ``lengths[b]`` rows of the left-padded ``x [B, T, D]`` at its own positions
        ``n_b ..``, attending to its own tokens only. Returns ``[B, T, D]`` (zero at padding). Checked in §13.8's
        order; nothing is written unless every check passes."""
        _check_float_rows(x)
        if x.shape[1] < 1:
            raise TokenCountError(x.shape[1])
        if len(x) != cache.batch_size:  # one row of x per batch row
            raise InputBatchMismatch(input=len(x), cache=cache.batch_size)
        if x.shape[2] != self.model_width:
            raise InputWidthMismatch(expected=self.model_width, actual=x.shape[2])
        counts = cache.chunk_lengths(lengths, x.shape[1])
        cache.check_binding(self)
        if int((cache.lengths + counts).max(initial=0)) > cache.capacity:
            raise CacheFull(cache.capacity)
        output, key, value = self._prepare_ragged(x, counts, cache)
        cache.commit(key, value, counts)
        return output

    def _prepare_ragged(self, x: np.ndarray, counts: np.ndarray,
                        cache: RaggedKvCache) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        tokens = x.shape[1]
        real = np.arange(tokens)[None, :] >= (tokens - counts)[:, None]  # [B, T]: a token, not padding
        positions = cache.lengths[:, None] + np.arange(tokens)[None, :] - (tokens - counts)[:, None]  # [B, T]
        rows = np.where(real[..., None], x, 0.0)  # padding is never read
        _require_finite(NonFiniteInput, "input", rows)
        with np.errstate(over="ignore", invalid="ignore"):
            query, key, value = self._project(rows)
            cos, sin = self.rope.angles(np.maximum(positions, 0), self.functions)  # [B, T, r/2]
            angles = (cos[:, None], sin[:, None])  # one table per row, over its heads
            query, key = self.rope.rotate_with(query, angles), self.rope.rotate_with(key, angles)
            for error, what, array in ((NonFiniteKeyValue, "projected key", key),
                                       (NonFiniteKeyValue, "projected value", value),
                                       (NonFiniteAttention, "rotated query", query)):
                _require_finite(error, what, array)
            stored_keys, stored_values = cache.padded_rows()  # [B, KV, P, dh], left-padded
            width = stored_keys.shape[2]
            stored_real = np.arange(width)[None, :] >= (width - cache.lengths)[:, None]  # [B, P]
            stored_positions = cache.lengths[:, None] - width + np.arange(width)[None, :]
            key_positions = np.concatenate([stored_positions, positions], axis=1)  # [B, P + T]
            key_real = np.concatenate([stored_real, real], axis=1)
            visible = key_real[:, None, :] & (key_positions[:, None, :] <= positions[:, :, None]) \
                & real[:, :, None]  # [B, T, P + T]: a row's own tokens, causally
            if cache.window is not None:  # and within the row's own window, counted in its own positions
                visible &= key_positions[:, None, :] > positions[:, :, None] - cache.window
            mixed = _attend_masked(query, np.concatenate([stored_keys, key], axis=2),
                                   np.concatenate([stored_values, value], axis=2), visible, self.functions)
            output = np.where(real[..., None], mixed @ self.wo.value, 0.0)  # [B, T, D]
            _require_finite(NonFiniteAttention, "attention output of the rows appended", output)
        return output, key, value

    def _project(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Queries ``[B, H, T, dh]``, keys and values ``[B, KV, T, dh]`` of rows ``x [B, T, D]``."""
        batch, tokens, _ = x.shape

        def heads_first(y: np.ndarray, heads: int) -> np.ndarray:
            split: np.ndarray = y.reshape(batch, tokens, heads, self.head_width).transpose(0, 2, 1, 3)
            return split

        return (heads_first(x @ self.wq.value, self.heads), heads_first(x @ self.wk.value, self.kv_heads),
                heads_first(x @ self.wv.value, self.kv_heads))

    # -- the cache-free path -------------------------------------------------------------------------

    def forward_full(self, x: np.ndarray, window: int | None = None) -> np.ndarray:
        """Causal attention over every position of ``x [B, T, D]``, recomputed from scratch."""
        _check_float_rows(x)
        if x.shape[2] != self.model_width:
            raise InputWidthMismatch(expected=self.model_width, actual=x.shape[2])
        positions = np.arange(x.shape[1])
        query, key, value = self._project(x)
        angles = self.rope.angles(positions, self.functions)
        query, key = self.rope.rotate_with(query, angles), self.rope.rotate_with(key, angles)
        nothing = np.zeros((*key.shape[:2], 0, self.head_width))  # no stored rows
        mixed = _attend(query, key, value, positions, nothing, nothing, positions[:0], window=window,
                        functions=self.functions)
        output: np.ndarray = mixed @ self.wo.value  # [B, T, D]
        return output


QUERY_BLOCK = 128  # new rows per tile: a tile scores only the keys it can see, so long prompts skip the masked half


def _attend(query: np.ndarray, key: np.ndarray, value: np.ndarray, positions: np.ndarray,
            stored_keys: np.ndarray, stored_values: np.ndarray, stored_positions: np.ndarray,
            window: int | None, sinks: int = 0, functions: Functions = FLOAT64_FUNCTIONS) -> np.ndarray:
    """New query rows over the stored rows plus the new rows, causally (and within ``window``, besides the first
    ``sinks`` positions, which every later query sees: attention sinks).

    ``query [B, H, T, dh]``, ``key``/``value [B, KV, T, dh]`` at ``positions [T]``;
    stored ``[B, KV, n, dh]`` at ``stored_positions [n]``. Returns ``[B, T, H*dh]``.
    Reads every stored row once per tile and copies none of them.
    """
    batch, heads, tokens, dh = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, -1, tokens, dh)  # [B, KV, G, T, dh]; head h -> kv head h // G
    tiles = []
    for first in range(0, tokens, QUERY_BLOCK):
        last = min(first + QUERY_BLOCK, tokens)
        # earlier new rows are out of every window (unless some are sinks: then keep them all, the mask decides)
        oldest = 0 if window is None or sinks else max(0, first - window + 1)
        tiles.append(_attend_tile(grouped[:, :, :, first:last], positions[first:last], key[:, :, oldest:last],
                                  value[:, :, oldest:last], positions[oldest:last], stored_keys, stored_values,
                                  stored_positions, window, sinks, functions))
    mixed = tiles[0] if len(tiles) == 1 else np.concatenate(tiles, axis=3)  # [B, KV, G, T, dh]
    merged: np.ndarray = mixed.reshape(batch, heads, tokens, dh).transpose(0, 2, 1, 3).reshape(batch, tokens, -1)
    return merged


def _attend_tile(query: np.ndarray, positions: np.ndarray, key: np.ndarray, value: np.ndarray,
                 key_positions_new: np.ndarray, stored_keys: np.ndarray, stored_values: np.ndarray,
                 stored_positions: np.ndarray, window: int | None, sinks: int = 0,
                 functions: Functions = FLOAT64_FUNCTIONS) -> np.ndarray:
    """``query [B, KV, G, t, dh]`` at ``positions [t]`` over stored and new keys; ``[B, KV, G, t, dh]``.

    Query heads of a group and tile rows share one axis (``G*t``) so that every
    product is a plain batched matrix product over ``[B, KV]``.
    """
    batch, kv_heads, group, rows, dh = query.shape
    stored = stored_keys.shape[2]
    flat = query.reshape(batch, kv_heads, group * rows, dh)  # [B, KV, G*t, dh]
    new_scores = flat @ key.swapaxes(-1, -2)  # [B, KV, G*t, k]
    if stored:
        scores = np.concatenate([flat @ stored_keys.swapaxes(-1, -2), new_scores], axis=-1)
    else:
        scores = new_scores  # a fresh array either way: the steps below work in place
    scores /= math.sqrt(dh)
    scores = scores.reshape(batch, kv_heads, group, rows, -1)  # [B, KV, G, t, n + k]
    _require_finite_scores(scores, positions, stored_positions, key_positions_new, window, sinks)
    if window is None:  # every key before the tile is visible: only the tile's own square can be masked
        own = scores[..., -rows:]  # [B, KV, G, t, t]
        np.copyto(own, -np.inf, where=key_positions_new[None, -rows:] > positions[:, None])
    else:
        key_positions = np.concatenate([stored_positions, key_positions_new])  # [n + k]
        outside = (key_positions[None, :] <= positions[:, None] - window) & (key_positions[None, :] >= sinks)
        hidden = (key_positions[None, :] > positions[:, None]) | outside
        np.copyto(scores, -np.inf, where=hidden)
    weights = _softmax(scores, functions).reshape(batch, kv_heads, group * rows, -1)  # [B, KV, G*t, n + k]
    mixed: np.ndarray = weights[..., :stored] @ stored_values + weights[..., stored:] @ value  # [B, KV, G*t, dh]
    return mixed.reshape(batch, kv_heads, group, rows, dh)


def _attend_masked(query: np.ndarray, keys: np.ndarray, values: np.ndarray, visible: np.ndarray,
                   functions: Functions = FLOAT64_FUNCTIONS) -> np.ndarray:
    """``query [B, H, T, dh]`` over ``keys``/``values [B, KV, K, dh]`` where ``visible [B, T, K]`` (one mask per
    batch row, the same for every head); ``[B, T, H*dh]``. A query that sees nothing (padding) mixes nothing."""
    batch, heads, tokens, dh = query.shape
    kv_heads, count = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    grouped = query.reshape(batch, kv_heads, group, tokens, dh)  # [B, KV, G, T, dh]; head h -> kv head h // G
    scores = (grouped.reshape(batch, kv_heads, group * tokens, dh) @ keys.swapaxes(-1, -2)) / math.sqrt(dh)
    scores = scores.reshape(batch, kv_heads, group, tokens, count)  # [B, KV, G, T, K]
    mask = visible[:, None, None]  # [B, 1, 1, T, K]: over kv heads and the query heads of each group
    bad = ~np.isfinite(scores) & mask
    if bad.any():
        index = int(np.argmax(bad.ravel()))
        raise NonFiniteAttention("attention score of a visible key", index, float(scores.ravel()[index]))
    seen = mask.any(axis=-1, keepdims=True)  # a query that sees nothing is padding: scored 0 everywhere, then 0
    scores = np.where(mask, scores, np.where(seen, -np.inf, 0.0))
    weights = _softmax(scores, functions) * seen
    mixed = weights.reshape(batch, kv_heads, group * tokens, count) @ values  # [B, KV, G*T, dh]
    by_head = mixed.reshape(batch, heads, tokens, dh)  # head h = kv head h // G, query head h % G of its group
    merged: np.ndarray = by_head.swapaxes(1, 2).reshape(batch, tokens, heads * dh)
    return merged


def _softmax(scores: np.ndarray, functions: Functions = FLOAT64_FUNCTIONS) -> np.ndarray:
    """Stable softmax over the last axis, in place: subtract the row maximum first."""
    scores -= scores.max(axis=-1, keepdims=True)
    if functions.dtype is None:
        np.exp(scores, out=scores)
    else:
        scores[...] = functions.exp(scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _require_finite_scores(scores: np.ndarray, positions: np.ndarray, stored_positions: np.ndarray,
                           key_positions_new: np.ndarray, window: int | None, sinks: int = 0) -> None:
    """Every score of a key the query can see is finite; ``scores [B, KV, G, t, n + k]``, before masking.

    A masked key's score (a later row of the chunk, or one out of the window)
    may overflow: it is never used, and masking sets it to -inf anyway. One
    pass over the scores when all are finite; the mask is built only when one is not.
    """
    finite = np.isfinite(scores)
    if finite.all():
        return
    key_positions = np.concatenate([stored_positions, key_positions_new])  # [n + k]
    visible = key_positions[None, :] <= positions[:, None]  # [t, n + k]
    if window is not None:
        visible &= (key_positions[None, :] > positions[:, None] - window) | (key_positions[None, :] < sinks)
    bad = ~finite & visible
    if bad.any():
        index = int(np.argmax(bad.ravel()))
        raise NonFiniteAttention("attention score of a visible key", index, float(scores.ravel()[index]))


def _check_float_rows(x: object) -> None:
    """A float64 numpy array of rank 3, ``[B, T, D]``."""
    if not isinstance(x, np.ndarray) or x.dtype != np.float64:
        raise InputDtypeError(f"{type(x).__name__} of {getattr(x, 'dtype', 'no dtype')}")
    if x.ndim != 3:
        raise InputRankError(x.ndim)


def _require_finite(error: type[NonFiniteError], what: str, array: np.ndarray) -> None:
    finite = np.isfinite(array)
    if not finite.all():
        index = int(np.argmin(finite.ravel()))
        raise error(what, index, float(array.ravel()[index]))
