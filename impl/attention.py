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

from .cache import LayerKvCache
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
from .parameters import Parameter
from .rope import RopeConfig


@dataclass(frozen=True, eq=False)
class PreparedRow:
    """A computed step whose key/value row is not yet in the cache."""

    output: np.ndarray  # [B, 1, D]
    key: np.ndarray  # [B, KV, dh], rotated at the old length
    value: np.ndarray  # [B, KV, dh], not rotated


class AttentionLayer:
    """Causal multi-head attention (MHA, GQA, MQA) with RoPE; row vectors ``y = x @ W``."""

    def __init__(self, wq: Parameter, wk: Parameter, wv: Parameter, wo: Parameter, *,
                 heads: int, kv_heads: int, rope: RopeConfig) -> None:
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
        self.model_width, self.head_width = model_width, head_width

    @classmethod
    def from_arrays(cls, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray, wo: np.ndarray, *,
                    heads: int, kv_heads: int, rope: RopeConfig) -> AttentionLayer:
        """A layer owning four new parameters (a new identity) with copies of these values."""
        return cls(Parameter("wq", wq), Parameter("wk", wk), Parameter("wv", wv), Parameter("wo", wo),
                   heads=heads, kv_heads=kv_heads, rope=rope)

    def with_rope(self, rope: RopeConfig) -> AttentionLayer:
        """The same parameter objects under another RoPE configuration."""
        return AttentionLayer(self.wq, self.wk, self.wv, self.wo,
                              heads=self.heads, kv_heads=self.kv_heads, rope=rope)

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
        prepared = self._prepare(x, cache)
        cache._commit(prepared.key, prepared.value)
        return prepared.output

    def _validate_request(self, x: np.ndarray, cache: LayerKvCache) -> None:
        """Dtype, rank, token count, batch, width, binding, free capacity -- in that order."""
        if not isinstance(x, np.ndarray) or x.dtype != np.float64:
            raise InputDtypeError(f"{type(x).__name__} of {getattr(x, 'dtype', 'no dtype')}")
        if x.ndim != 3:
            raise InputRankError(x.ndim)
        if x.shape[1] != 1:
            raise TokenCountError(x.shape[1])
        if x.shape[0] != cache.batch_size:
            raise InputBatchMismatch(cache=cache.batch_size, input=x.shape[0])
        if x.shape[2] != self.model_width:
            raise InputWidthMismatch(expected=self.model_width, actual=x.shape[2])
        cache.check_binding(self)
        if cache.is_full:
            raise CacheFull(cache.capacity)

    def _prepare(self, x: np.ndarray, cache: LayerKvCache) -> PreparedRow:
        """Compute the step at position = old length; check every value; write nothing."""
        position = cache.length
        batch, kv_heads, dh = x.shape[0], self.kv_heads, self.head_width
        row = x[:, 0, :]  # [B, D]
        _require_finite(NonFiniteInput, "input", row)
        with np.errstate(over="ignore", invalid="ignore"):
            query = (row @ self.wq.value).reshape(batch, self.heads, dh)  # [B, H, dh]
            key = (row @ self.wk.value).reshape(batch, kv_heads, dh)  # [B, KV, dh]
            value = (row @ self.wv.value).reshape(batch, kv_heads, dh)  # [B, KV, dh]
            query = self.rope.rotate(query, position)
            key = self.rope.rotate(key, position)
            _require_finite(NonFiniteKeyValue, "projected key", key)
            _require_finite(NonFiniteKeyValue, "projected value", value)
            _require_finite(NonFiniteAttention, "rotated query", query)
            stored_keys, stored_values = cache._prefix()  # [B, KV, len, dh] views
            mixed = _attend_one_query(query, key, value, stored_keys, stored_values)  # [B, H*dh]
            output = mixed @ self.wo.value  # [B, D]
            _require_finite(NonFiniteAttention, "attention output", output)
        return PreparedRow(output=output[:, None, :], key=key, value=value)

    # -- the cache-free path -------------------------------------------------------------------------

    def forward_full(self, x: np.ndarray) -> np.ndarray:
        """Causal attention over every position of ``x [B, T, D]``, recomputed from scratch."""
        if not isinstance(x, np.ndarray) or x.dtype != np.float64:
            raise InputDtypeError(f"{type(x).__name__} of {getattr(x, 'dtype', 'no dtype')}")
        if x.ndim != 3:
            raise InputRankError(x.ndim)
        if x.shape[2] != self.model_width:
            raise InputWidthMismatch(expected=self.model_width, actual=x.shape[2])
        batch, tokens, _ = x.shape
        heads, kv_heads, dh, group = self.heads, self.kv_heads, self.head_width, self.group_size
        positions = np.arange(tokens)
        query = (x @ self.wq.value).reshape(batch, tokens, heads, dh).transpose(0, 2, 1, 3)  # [B, H, T, dh]
        key = (x @ self.wk.value).reshape(batch, tokens, kv_heads, dh).transpose(0, 2, 1, 3)  # [B, KV, T, dh]
        value = (x @ self.wv.value).reshape(batch, tokens, kv_heads, dh).transpose(0, 2, 1, 3)
        query = self.rope.rotate(query, positions).reshape(batch, kv_heads, group, tokens, dh)
        key = self.rope.rotate(key, positions)[:, :, None]  # [B, KV, 1, T, dh]
        scores = query @ key.swapaxes(-1, -2) / math.sqrt(dh)  # [B, KV, G, T, T]
        scores[..., np.triu(np.ones((tokens, tokens), dtype=bool), k=1)] = -np.inf
        weights = _softmax(scores)
        mixed = weights @ value[:, :, None]  # [B, KV, G, T, dh]
        merged = mixed.reshape(batch, heads, tokens, dh).transpose(0, 2, 1, 3).reshape(batch, tokens, heads * dh)
        output: np.ndarray = merged @ self.wo.value  # [B, T, D]
        return output


def _attend_one_query(query: np.ndarray, key: np.ndarray, value: np.ndarray,
                      stored_keys: np.ndarray, stored_values: np.ndarray) -> np.ndarray:
    """One query row per head over the stored prefix plus the candidate row.

    ``query [B, H, dh]``, ``key``/``value [B, KV, dh]``, stored ``[B, KV, L, dh]``.
    Reads every stored row once, copies none of them.
    """
    batch, kv_heads, length, dh = stored_keys.shape
    grouped = query.reshape(batch, kv_heads, -1, dh)  # [B, KV, G, dh]; head h -> kv head h // G
    scores = np.concatenate([
        grouped @ stored_keys.swapaxes(-1, -2),  # [B, KV, G, L]
        np.einsum("bkgd,bkd->bkg", grouped, key)[..., None],  # [B, KV, G, 1]
    ], axis=-1) / math.sqrt(dh)
    weights = _softmax(scores)  # [B, KV, G, L+1]
    mixed = weights[..., :length] @ stored_values + weights[..., length:] * value[:, :, None, :]  # [B, KV, G, dh]
    merged: np.ndarray = mixed.reshape(batch, -1)  # [B, H*dh]
    return merged


def _softmax(scores: np.ndarray) -> np.ndarray:
    """Stable softmax over the last axis: subtract the row maximum first."""
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights: np.ndarray = shifted / shifted.sum(axis=-1, keepdims=True)
    return weights


def _require_finite(error: type[NonFiniteError], what: str, array: np.ndarray) -> None:
    finite = np.isfinite(array)
    if not finite.all():
        index = int(np.argmin(finite.ravel()))
        raise error(what, index, float(array.ravel()[index]))
