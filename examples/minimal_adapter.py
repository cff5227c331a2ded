"""A minimal complete adapter around a tiny KV cache written from scratch.

The cache is a Python list of rows: no fixed capacity, no validation, MHA
and interleaved RoPE only -- and it says so in ``capabilities``, so the suite
skips what it does not claim and checks everything else. Run it with::

    KVCACHE_IMPL=examples.minimal_adapter:make_adapter pytest -n auto properties/

``make_float32_adapter`` is the same cache computing and storing in float32:
it declares ``dtype = "float32"`` and is judged by the low-precision rule
(``properties/tolerance.py``) instead of 1e-12.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

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


def rotate(x: np.ndarray, position: int, rope: Any) -> np.ndarray:
    """Interleaved RoPE of ``x [..., dh]`` at ``position``."""
    r = rope.rotary_width
    theta = position * rope.base ** (-np.arange(0, r, 2) / r)
    a, b = x[..., 0:r:2], x[..., 1:r:2]
    out = x.copy()
    out[..., 0:r:2], out[..., 1:r:2] = a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)
    return out


class MinimalAdapter:
    name = "example-minimal"
    version = "1.0"
    dtype = "float64"
    capabilities = frozenset({"float64", "rope_interleaved"})

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
        query = rotate(split(row @ w["wq"]), position, layer.rope)
        cache.keys.append(rotate(split(row @ w["wk"]), position, layer.rope))
        cache.values.append(split(row @ w["wv"]))
        keys, values = np.stack(cache.keys, axis=2), np.stack(cache.values, axis=2)  # [B, H, T, dh]
        scores = np.einsum("bhd,bhtd->bht", query, keys) / np.sqrt(np.array(dh, dtype=self.dtype))
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        mixed = np.einsum("bht,bhtd->bhd", weights, values).reshape(row.shape[0], heads * dh)
        return (mixed @ w["wo"])[:, None, :]

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


def make_adapter() -> MinimalAdapter:
    return MinimalAdapter()


def make_float32_adapter() -> MinimalAdapter:
    return Float32Adapter()
