"""Adapters for mlx-lm's KV caches (``mlx_lm.models.cache``), layer-level, float32 on mlx's CPU backend.

    pip install mlx-lm==0.26.4 mlx==0.26.1     # Linux: mlx-lm >= 0.30 needs `mlx[cpu]==X` named beside it
    KVCACHE_IMPL=adapters.mlx_lm:rotating_window pytest -n 0 properties/test_cache_operations.py

The layer is mlx-lm's own ``mlx_lm.models.llama.Attention`` (``q_proj``/``k_proj``/``v_proj``/``o_proj``
``nn.Linear`` without bias, its ``initialize_rope``: ``nn.RoPE`` over the whole head, ``rope_traditional``
choosing the interleaved pairing, and ``scaled_dot_product_attention`` from ``mlx_lm.models.base``), built from
a ``llama.ModelArgs`` at the suite's widths. Each call is what a model's forward does for one layer:
``mask = create_attention_mask(h, cache)`` from ``mlx_lm.models.base``, then ``attention(h, mask, cache)``,
which rotates at ``cache.offset`` and calls ``cache.update_and_fetch``. The glue is the numpy <-> ``mx.array``
conversion (float32), the weights (``x @ W`` into ``nn.Linear``'s ``[out, in]``) and reading snapshots.

How the mask is asked for follows the release's own models:

- up to 0.26: ``create_attention_mask(h, [cache])`` (the model passes its cache list; the first layer's cache
  decides, and a ``RotatingKVCache``'s ``max_size`` is the window);
- from 0.28: ``create_attention_mask(h, cache, window_size=W)`` for a sliding layer and
  ``create_attention_mask(h, cache)`` for a full one (as ``llama.py``'s ``LlamaModel`` does with its
  ``swa_idx`` and ``fa_idx`` caches); the cache's own ``make_mask`` answers.

Two pairings of a sliding-window layer, both mlx-lm's:

- ``rotating_window``: a ``RotatingKVCache(max_size=W, keep=0)``, as every sliding layer's ``make_cache``
  builds it (llama, gemma3_text, gpt_oss, olmo3, ...). mlx-lm's window is ``max_size`` keys, a query's own
  included: a one-token step attends the ring of W rows (no mask), as docs/spec.md §13.5 reads W.
- ``kv_cache_window``: a plain ``KVCache`` (every row kept) with the window left to the mask,
  ``create_attention_mask(h, cache, window_size=W)``, as ``step3p5.py``'s sliding layers do (its
  ``make_cache`` is ``[KVCache() for _ in self.layers]``) and as the fix of PR #843 tests
  (``test_window_mask_with_full_kv_cache``). Needs the 0.28+ mask API; on older releases it is refused.

Full-attention layers use ``KVCache()``. What mlx-lm has, and so what is declared:

- no fixed capacity (the buffers grow by 256 rows), no validation, no non-finite rejection, no binding
  checks, no typed creation errors: not declared;
- no reset: "reset" is a new cache object in the handle (docs/adapters.md, "No reset");
- ``trim(n)`` (what ``trim_prompt_cache`` calls): ``truncate``. A ``RotatingKVCache`` is trimmable only while
  ``offset < max_size`` (``is_trimmable``, which ``can_trim_prompt_cache`` checks before every trim mlx-lm's
  server makes); past that the glue raises ``Evicted`` without touching the cache: declared
  ``window_truncates_until_full`` (refused from W rows on). A ``KVCache`` always trims.
- ``copy.deepcopy`` of a cache (mlx-lm's server and evaluate copy prompt caches so): ``fork``;
- T rows in one call (``update_and_fetch`` of a chunk; the ring's ``_update_concat``): ``chunked_append``;
- GQA (``num_key_value_heads``), both RoPE pairings; no partial rotary (``Attention`` rotates the whole head).

Precision: mlx has no float64 on the CPU. Everything runs in float32 -- projections, ``mx.fast.rope``, the
attention -- and is declared ``dtype = "float32"`` (docs/adapters.md, "Declaring precision").

Snapshots: a ``KVCache`` shows its ``offset`` rows, positions ``0..offset-1``. A ``RotatingKVCache`` shows the
rows of its buffer in temporal order, by its own ``_temporal_order`` (what ``_update_concat`` uses before a
chunk), ending at position ``offset - 1`` (keep is 0: no sinks): a ring after a chunk holds more than W rows,
which a snapshot may show (docs/adapters.md, "Cache operations").
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from importlib.metadata import version as _version
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models import base as mlx_base
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models import llama

VERSION = f"mlx-lm {_version('mlx-lm')}, mlx {_version('mlx')} (cpu), float32"
# 0.28 on: create_attention_mask(h, cache, window_size=..., return_array=...) and caches with make_mask.
PER_CACHE_MASKS = "window_size" in inspect.signature(mlx_base.create_attention_mask).parameters


class Evicted(RuntimeError):
    """``truncate`` of a ``RotatingKVCache`` that ``is_trimmable()`` refuses (it has let rows go)."""


def _args(heads: int, kv_heads: int, head_width: int, model_width: int, rope: Any) -> llama.ModelArgs:
    return llama.ModelArgs(model_type="llama", hidden_size=model_width, num_hidden_layers=1, intermediate_size=1,
                           num_attention_heads=heads, rms_norm_eps=1e-6, vocab_size=1, head_dim=head_width,
                           num_key_value_heads=kv_heads, rope_theta=float(rope.base),
                           rope_traditional=rope.style == "interleaved",
                           max_position_embeddings=rope.max_positions)


def _linear_weight(matrix: np.ndarray) -> mx.array:
    """The suite's ``x @ W`` matrix as ``nn.Linear``'s weight (``x @ weight.T``), float32."""
    return mx.array(np.ascontiguousarray(np.asarray(matrix, dtype=np.float32).T))


def _write(attention: llama.Attention, weights: Any) -> None:
    attention.q_proj.weight = _linear_weight(weights.wq)
    attention.k_proj.weight = _linear_weight(weights.wk)
    attention.v_proj.weight = _linear_weight(weights.wv)
    attention.o_proj.weight = _linear_weight(weights.wo)


@dataclass(eq=False)
class Layer:
    attention: llama.Attention
    args: llama.ModelArgs
    rope: Any


@dataclass(eq=False)
class Handle:
    """The mlx-lm cache and what a snapshot of an empty one needs; ``reset`` puts a new cache in it."""

    cache: Any
    batch: int
    kv_heads: int
    head_width: int
    window: int | None


@dataclass(frozen=True, eq=False)
class Snapshot:
    length: int
    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


class MlxLmAdapter:
    """mlx-lm's llama ``Attention`` over ``KVCache``, and a sliding-window pairing chosen by the subclass."""

    version = VERSION
    dtype = "float32"
    base_capabilities = frozenset({"rope_half_split", "rope_interleaved", "gqa", "chunked_append", "truncate",
                                   "fork", "sliding_window_layer"})

    def __init__(self, name: str, capabilities: frozenset[str]) -> None:
        self.name = name
        self.capabilities = capabilities

    # -- layers ------------------------------------------------------------------------------------------------

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        args = _args(weights.heads, weights.kv_heads, weights.wq.shape[1] // weights.heads, weights.wq.shape[0],
                     rope)
        attention = llama.Attention(args)
        _write(attention, weights)
        return Layer(attention, args, rope)

    def recreate_layer(self, layer: Layer) -> Layer:
        attention = llama.Attention(layer.args)  # new parameter objects, equal values
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attention, name).weight = mx.array(getattr(layer.attention, name).weight)
        return Layer(attention, layer.args, layer.rope)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        old = layer.args
        args = _args(old.num_attention_heads, old.num_key_value_heads, old.head_dim, old.hidden_size, rope)
        attention = llama.Attention(args)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):  # the same parameter modules, another RoPE
            setattr(attention, name, getattr(layer.attention, name))
        return Layer(attention, args, rope)

    def update_weights(self, layer: Layer, weights: Any) -> None:
        _write(layer.attention, weights)

    # -- caches ------------------------------------------------------------------------------------------------

    def create_cache(self, layer: Layer, batch_size: int, capacity: int, window: int | None = None) -> Handle:
        return Handle(self._new_cache(window), batch_size, layer.args.num_key_value_heads, layer.args.head_dim,
                      window)

    def _new_cache(self, window: int | None) -> Any:
        return mlx_cache.KVCache()

    def _mask(self, hidden: mx.array, handle: Handle) -> Any:
        """The mask a model's forward makes for this layer's cache, by the release's own API."""
        if not PER_CACHE_MASKS:
            return mlx_base.create_attention_mask(hidden, [handle.cache])
        if handle.window is None:
            return mlx_base.create_attention_mask(hidden, handle.cache)
        return mlx_base.create_attention_mask(hidden, handle.cache, window_size=handle.window)

    def _forward(self, layer: Layer, handle: Handle, x: Any) -> np.ndarray:
        hidden = mx.array(x)  # mlx's own conversion: float64 numpy rows become float32 arrays
        mask = self._mask(hidden, handle)
        output = layer.attention(hidden, mask, handle.cache)
        mx.eval(output)
        return np.array(output)

    def step(self, layer: Layer, cache: Handle, x: Any) -> np.ndarray:
        return self._forward(layer, cache, x)

    def append(self, layer: Layer, cache: Handle, x: Any) -> np.ndarray:
        return self._forward(layer, cache, x)

    def truncate(self, cache: Handle, n: int) -> None:
        c = cache.cache
        if not c.is_trimmable():  # what can_trim_prompt_cache asks before mlx-lm trims a prompt cache
            raise Evicted(f"{type(c).__name__} is not trimmable at offset {c.offset}")
        c.trim(c.offset - n)

    def fork(self, cache: Handle) -> Handle:
        return copy.deepcopy(cache)

    def reset(self, cache: Handle) -> None:
        cache.cache = self._new_cache(cache.window)  # mlx-lm has no reset: a new cache

    def _held(self, c: Any) -> tuple[mx.array, mx.array] | None:
        """The rows the cache holds, oldest first, ending at position ``offset - 1``."""
        if c.keys is None or c.offset == 0:
            return None
        if isinstance(c, mlx_cache.RotatingKVCache):
            return c._temporal_order(c.keys), c._temporal_order(c.values)
        return c.keys[..., : c.offset, :], c.values[..., : c.offset, :]

    def snapshot(self, cache: Handle) -> Snapshot:
        c = cache.cache
        length = int(c.offset)
        held = self._held(c)
        if held is None:
            empty = np.zeros((cache.batch, cache.kv_heads, 0, cache.head_width), dtype=np.float32)
            return Snapshot(length, empty, empty.copy(), np.arange(0, dtype=np.int64))
        keys, values = (np.array(a) for a in held)
        shown = keys.shape[2]
        return Snapshot(length, keys, values, np.arange(length - shown, length, dtype=np.int64))

    def error_kind(self, error: BaseException) -> str | None:
        if isinstance(error, Evicted):
            return "evicted"
        return None


class RotatingWindowAdapter(MlxLmAdapter):
    """Sliding-window layers over ``RotatingKVCache(max_size=W, keep=0)``, as the models' ``make_cache``."""

    def __init__(self) -> None:
        super().__init__("mlx-lm-rotating-window", self.base_capabilities | {"window_truncates_until_full"})

    def _new_cache(self, window: int | None) -> Any:
        if window is None:
            return mlx_cache.KVCache()
        return mlx_cache.RotatingKVCache(max_size=window, keep=0)


class KvCacheWindowAdapter(MlxLmAdapter):
    """Sliding-window layers over a plain ``KVCache``, the window in the mask (``step3p5``'s pairing)."""

    def __init__(self) -> None:
        if not PER_CACHE_MASKS:
            raise RuntimeError(f"{VERSION}: create_attention_mask takes no window_size: no KVCache window pairing")
        super().__init__("mlx-lm-kv-cache-window", self.base_capabilities)


def rotating_window() -> MlxLmAdapter:
    """``KVCache`` for full layers, ``RotatingKVCache(max_size=W)`` for sliding ones."""
    return RotatingWindowAdapter()


def kv_cache_window() -> MlxLmAdapter:
    """``KVCache`` for every layer, the window in ``create_attention_mask(..., window_size=W)``."""
    return KvCacheWindowAdapter()
