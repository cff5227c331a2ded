"""A minimal complete adapter around a tiny KV cache written from scratch.

The cache is a Python list of rows: no fixed capacity, no validation, MHA
and interleaved RoPE only -- and it says so in ``capabilities``. The suite
still feeds it malformed, non-finite and over-capacity rows: what it raises on
must change nothing (so a step appends only once everything has succeeded),
and what it accepts without claiming to reject is not judged. Run it with::

    KVCACHE_IMPL=examples.minimal_adapter:make_adapter pytest -n auto properties/

``make_float32_adapter`` is the same cache computing and storing in float32:
it declares ``dtype = "float32"`` and is judged by the low-precision rule
(``properties/tolerance.py``) instead of 1e-12. ``make_float32_rope_adapter``
stays float64 but computes its RoPE table (angles, cos, sin) in float32, as
Hugging Face's ``LlamaRotaryEmbedding`` does in a float64 model, and
``make_float32_softmax_adapter`` its softmax, ``make_float32_rotation_adapter``
its whole rotation (table and products), and ``make_float32_transcendentals_adapter``
every exp, cos and sin (float32 functions on float64 arithmetic): each declares it in
``mixed_precision`` and is judged by the mixed-precision rule.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np


class Layer:
    def __init__(self, weights: dict[str, np.ndarray], heads: int, rope: Any) -> None:
        self.weights, self.heads, self.rope = weights, heads, rope  # weights shared by with_rope
        self.head_width = weights["wq"].shape[1] // heads


class Cache:
    def __init__(self, batch_size: int, heads: int, head_width: int) -> None:
        self.shape = (batch_size, heads, 0, head_width)
        self.keys: list[np.ndarray] = []  # one [B, H, dh] row per position, rotated
        self.values: list[np.ndarray] = []


def function_in(function: Any, dtype: str | None) -> Any:
    """``function`` of ``dtype``'s accuracy: the argument rounded to it, the result back in the argument's dtype."""
    if dtype is None:
        return function
    return lambda x: function(np.asarray(x).astype(dtype)).astype(np.asarray(x).dtype)


def rotate(x: np.ndarray, position: int, rope: Any, table: str | None = None,
           rotation: str | None = None, transcendentals: str | None = None) -> np.ndarray:
    """Interleaved RoPE of ``x [..., dh]`` at ``position``; angles, cos and sin in dtype ``table`` (None: float64),
    or, with ``rotation``, the table and the rotation itself in that dtype (the result back in x's); with
    ``transcendentals``, cos and sin of that dtype's accuracy. A layer without RoPE (``rope`` None) is not
    rotated."""
    if rope is None:
        return x
    r, table = rope.rotary_width, rotation or table
    cos, sin = function_in(np.cos, transcendentals), function_in(np.sin, transcendentals)
    theta = position * np.asarray(rope.base, table) ** (-np.arange(0, r, 2, dtype=table) / r)
    a, b = x[..., 0:r:2].astype(rotation or x.dtype), x[..., 1:r:2].astype(rotation or x.dtype)
    out = x.copy()
    out[..., 0:r:2], out[..., 1:r:2] = a * cos(theta) - b * sin(theta), a * sin(theta) + b * cos(theta)
    return out


class MinimalAdapter:
    name = "example-minimal"
    version = "1.0"
    dtype = "float64"
    capabilities = frozenset({"float64", "rope_interleaved"})
    rope_table: str | None = None  # dtype of the RoPE table if not float64 (declare it in mixed_precision)
    softmax_dtype: str | None = None  # dtype the softmax runs in if not self.dtype (likewise)
    rotation_dtype: str | None = None  # dtype of the whole rotation, table included, if not float64 (likewise)
    transcendental_dtype: str | None = None  # dtype whose accuracy exp, cos and sin have, if not float64 (likewise)

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        arrays = {name: np.array(getattr(weights, name), dtype=self.dtype) for name in ("wq", "wk", "wv", "wo")}
        return Layer(arrays, weights.heads, rope)

    def recreate_layer(self, layer: Layer) -> Layer:
        return Layer({name: w.copy() for name, w in layer.weights.items()}, layer.heads, layer.rope)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        return Layer(layer.weights, layer.heads, rope)

    def update_weights(self, layer: Layer, weights: Any) -> None:
        for name, array in layer.weights.items():
            array[...] = getattr(weights, name)

    def create_cache(self, layer: Layer, batch_size: int, capacity: int) -> Cache:
        return Cache(batch_size, layer.heads, layer.head_width)

    def step(self, layer: Layer, cache: Cache, x: np.ndarray) -> np.ndarray:
        w, heads, dh = layer.weights, layer.heads, layer.head_width
        row, position = x[:, 0, :].astype(self.dtype), len(cache.keys)
        split = lambda y: y.reshape(row.shape[0], heads, dh)  # noqa: E731  [B, H, dh]
        query = rotate(split(row @ w["wq"]), position, layer.rope, self.rope_table, self.rotation_dtype,
                       self.transcendental_dtype)
        key = rotate(split(row @ w["wk"]), position, layer.rope, self.rope_table, self.rotation_dtype,
                     self.transcendental_dtype)
        value = split(row @ w["wv"])
        keys = np.stack([*cache.keys, key], axis=2)  # [B, H, T, dh]; raises on a wrong batch: nothing written yet
        values = np.stack([*cache.values, value], axis=2)
        scores = np.einsum("bhd,bhtd->bht", query, keys) / np.sqrt(np.array(dh, dtype=self.dtype))
        scores = scores.astype(self.softmax_dtype or self.dtype)
        weights = function_in(np.exp, self.transcendental_dtype)(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        mixed = np.einsum("bht,bhtd->bhd", weights.astype(self.dtype), values).reshape(row.shape[0], heads * dh)
        output = (mixed @ w["wo"])[:, None, :]
        cache.keys.append(key)  # only now: a step that raises above changes nothing
        cache.values.append(value)
        return output

    def reset(self, cache: Cache) -> None:
        cache.keys.clear()
        cache.values.clear()

    def snapshot(self, cache: Cache) -> SimpleNamespace:
        stack = lambda rows: np.stack(rows, axis=2) if rows else np.zeros(cache.shape, self.dtype)  # noqa: E731
        return SimpleNamespace(length=len(cache.keys), keys=stack(cache.keys), values=stack(cache.values))

    def error_kind(self, error: BaseException) -> str | None:
        return None  # this cache raises nothing on purpose


class Float32Adapter(MinimalAdapter):
    name = "example-minimal-float32"
    dtype = "float32"
    capabilities = frozenset({"rope_interleaved"})


class Float32RopeAdapter(MinimalAdapter):
    """Float64 with a float32 RoPE table, declared: judged against the oracle run with a float32 table."""

    name = "example-minimal-float32-rope"
    capabilities = frozenset({"rope_interleaved"})  # not "float64": that capability means 1e-12 everywhere
    rope_table = "float32"
    mixed_precision: ClassVar[dict[str, str]] = {"rope": "float32"}


class Float32SoftmaxAdapter(MinimalAdapter):
    """Float64 with its softmax (exp, sum, division) in float32, declared."""

    name = "example-minimal-float32-softmax"
    capabilities = frozenset({"rope_interleaved"})
    softmax_dtype = "float32"
    mixed_precision: ClassVar[dict[str, str]] = {"softmax": "float32"}


class Float32RotationAdapter(MinimalAdapter):
    """Float64 with the whole RoPE rotation in float32 -- the table, and the rotated features multiplied and summed
    in float32 -- as a model whose ``apply_rotary_pos_emb`` runs on float32 cos/sin does; declared."""

    name = "example-minimal-float32-rotation"
    capabilities = frozenset({"rope_interleaved"})
    rotation_dtype = "float32"
    mixed_precision: ClassVar[dict[str, str]] = {"rotation": "float32"}


class Float32TranscendentalsAdapter(MinimalAdapter):
    """Float64 arithmetic whose exp, cos and sin have float32 accuracy (the argument rounded to float32, the
    function computed there), as a framework whose float64 calls float32 kernels for them does; declared."""

    name = "example-minimal-float32-transcendentals"
    capabilities = frozenset({"rope_interleaved"})
    transcendental_dtype = "float32"
    mixed_precision: ClassVar[dict[str, str]] = {"transcendentals": "float32"}


def make_adapter() -> MinimalAdapter:
    return MinimalAdapter()


def make_float32_adapter() -> MinimalAdapter:
    return Float32Adapter()


def make_float32_rope_adapter() -> MinimalAdapter:
    return Float32RopeAdapter()


def make_float32_softmax_adapter() -> MinimalAdapter:
    return Float32SoftmaxAdapter()


def make_float32_rotation_adapter() -> MinimalAdapter:
    return Float32RotationAdapter()


def make_float32_transcendentals_adapter() -> MinimalAdapter:
    return Float32TranscendentalsAdapter()
