"""An adapter for transformers' 4.5x cache API: ``SlidingWindowCache`` under ``MistralAttention``, in float64.

    KVCACHE_IMPL=bench.shipped.pinned45:sliding_window_cache \
        pytest -n 0 "properties/test_cache_operations.py::test_cache_operations_conform[window]"

Before the per-layer caches of 4.54, a cache is one object holding a list of tensors per layer, and a static
cache has no length of its own: the caller (``generate``, or the model from ``get_seq_length``) says where
each row goes with ``cache_kwargs={"cache_position": ...}``. ``SlidingWindowCache(config, max_batch_size,
max_cache_len)`` keeps ``min(sliding_window, max_cache_len)`` slots, oldest first: while it holds fewer
than W rows, slot j is position j; from then on every update shifts the slots by one and writes the newest
row into the last. Its ``get_seq_length`` counts the slots whose keys are not all zero (deprecated, "in favor
of cache_position"), so the glue keeps the count of rows fed, as ``generate`` keeps ``cache_position``: that
count is the length, each step's position and its ``cache_position``.

The layer is ``MistralAttention`` (Mistral is the model this cache was written for) with the adapters'
float64 RoPE table (transformers' float32 table is finding 1 of docs/hf-transformers, not this cache); its
mask is the model's own, ``MistralModel._prepare_4d_causal_attention_mask_with_cache_position``, over
``get_max_cache_shape()`` slots, exactly as ``MistralModel._update_causal_mask`` builds it for this cache.
Reorder is the cache's ``reorder_cache``, fork ``copy.deepcopy``, reset its ``reset``.

Without a window the cache is that era's ``StaticCache(config, max_batch_size, max_cache_len)``, under the
same mask and count.

Declared: ``float64``, ``rope_half_split``, ``gqa``, ``sliding_window_layer``, ``batch_reorder``, ``fork``.
Not declared, because the classes do not do it: ``truncate`` (a static cache has no ``crop`` before 4.54),
``fixed_capacity`` (a window's slots are never full; ``StaticCache`` raises ``IndexError`` past its slots,
and nothing here claims what that means), and ``chunked_append``: ``update`` takes
``T`` rows, but its own comment says a chunk longer than the window "only happens in prefill phase"
("caches are all zeros at this point"), and a chunk that crosses the window's edge writes several rows to
the one clamped last slot; the class takes chunks only as the first write, and the suite has no declaration
for that, so chunks are left out and rows come one at a time, as ``generate`` feeds them after the prompt.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transformers
from torch import nn
from transformers import MistralConfig, SlidingWindowCache, StaticCache
from transformers.models.mistral.modeling_mistral import MistralAttention, MistralModel

from adapters.hf_llama import ATTENTION, DTYPE, write_weights

BASE = frozenset({"float64", "rope_half_split", "gqa", "sliding_window_layer", "batch_reorder", "fork"})


class Float64Rotary(nn.Module):
    """``adapters.hf_llama.Float64Rotary`` (transformers' formula in float64), from the base itself: 4.5x
    configs hold ``rope_theta``, not 5.x's ``rope_parameters``."""

    def __init__(self, head_width: int, base: float) -> None:
        super().__init__()
        self.inv_freq = 1.0 / base ** (torch.arange(0, head_width, 2, dtype=DTYPE) / head_width)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].to(DTYPE) * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def mistral_config(heads: int, kv_heads: int, head_width: int, base: float, max_positions: int,
                   window: int | None) -> MistralConfig:
    return MistralConfig(hidden_size=heads * head_width, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_width, num_hidden_layers=1, intermediate_size=4, vocab_size=2,
                         max_position_embeddings=max_positions, rope_theta=float(base), sliding_window=window,
                         attn_implementation=ATTENTION, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def mistral_attention(config: MistralConfig, weights: Any) -> MistralAttention:
    """As ``adapters.hf_llama.llama_attention``: transformers' module, projections rebuilt at the suite's widths."""
    module = MistralAttention(config, layer_idx=0)
    for name in ("q", "k", "v", "o"):
        w = np.asarray(getattr(weights, f"w{name}"))
        linear = nn.Linear(w.shape[0], w.shape[1], bias=False, dtype=DTYPE)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w.T.copy()))
        setattr(module, f"{name}_proj", linear)
    return module.to(DTYPE).eval()


def _weights_of(module: MistralAttention, heads: int, kv_heads: int) -> Any:
    from types import SimpleNamespace

    arrays = {f"w{n}": getattr(module, f"{n}_proj").weight.detach().numpy().T.copy() for n in ("q", "k", "v", "o")}
    return SimpleNamespace(**arrays, heads=heads, kv_heads=kv_heads)


def _model_mask(new: int, slots: int, cache_position: torch.Tensor, batch: int, config: MistralConfig,
                cache: SlidingWindowCache | StaticCache) -> torch.Tensor:
    """``MistralModel``'s own mask for ``new`` queries over ``slots`` keys, as ``_update_causal_mask`` asks for it
    (target length ``get_max_cache_shape()`` for this cache); 4.51 takes a ``device``, 4.52 reads it off
    ``cache_position``."""
    arguments = {"sequence_length": new, "target_length": slots, "dtype": DTYPE, "device": cache_position.device,
                 "cache_position": cache_position, "batch_size": batch, "config": config, "past_key_values": cache}
    prepare = MistralModel._prepare_4d_causal_attention_mask_with_cache_position
    taken = inspect.signature(prepare).parameters
    return prepare(None, **{name: value for name, value in arguments.items() if name in taken})


@dataclass(eq=False)
class Layer:
    attention: MistralAttention
    rotary: Float64Rotary
    heads: int
    kv_heads: int
    head_width: int
    base: float
    max_positions: int


@dataclass(eq=False)
class Handle:
    """The transformers cache, its config, and the count of rows fed (the caller's ``cache_position``)."""

    hf: SlidingWindowCache | StaticCache
    config: MistralConfig
    batch: int
    fed: int = 0


@dataclass(frozen=True, eq=False)
class Snapshot:
    length: int
    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


class SlidingWindowCacheAdapter:
    """One ``MistralAttention`` over a ``SlidingWindowCache``; a cache without a window is the ``StaticCache`` of
    the same era (``SlidingWindowCache`` refuses a config without one), so the layer machine has its full-attention
    caches too. Neither is a ring in the write-pointer sense: slot j is position j until the window is full."""

    version = f"transformers {transformers.__version__}, torch {torch.__version__}, {ATTENTION}, float64 RoPE table"
    dtype = "float64"

    def __init__(self) -> None:
        self.name = "hf-sliding-window-cache-4.5x"
        self.capabilities = BASE

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        width = weights.wq.shape[1] // weights.heads
        config = mistral_config(weights.heads, weights.kv_heads, width, rope.base, rope.max_positions, None)
        return Layer(mistral_attention(config, weights), Float64Rotary(width, rope.base), weights.heads,
                     weights.kv_heads, width, rope.base, rope.max_positions)

    def recreate_layer(self, layer: Layer) -> Layer:
        config = mistral_config(layer.heads, layer.kv_heads, layer.head_width, layer.base, layer.max_positions, None)
        weights = _weights_of(layer.attention, layer.heads, layer.kv_heads)
        return Layer(mistral_attention(config, weights), Float64Rotary(layer.head_width, layer.base), layer.heads,
                     layer.kv_heads, layer.head_width, layer.base, layer.max_positions)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        return Layer(layer.attention, Float64Rotary(layer.head_width, rope.base), layer.heads, layer.kv_heads,
                     layer.head_width, rope.base, rope.max_positions)

    def update_weights(self, layer: Layer, weights: Any) -> None:
        write_weights(layer.attention, weights)

    def create_cache(self, layer: Layer, batch_size: int, capacity: int, window: int | None = None) -> Handle:
        config = mistral_config(layer.heads, layer.kv_heads, layer.head_width, layer.base, layer.max_positions,
                                window)
        kind = StaticCache if window is None else SlidingWindowCache  # the latter refuses a config without a window
        cache = kind(config=config, max_batch_size=batch_size, max_cache_len=capacity, dtype=DTYPE)
        return Handle(cache, config, batch_size)

    def step(self, layer: Layer, cache: Handle, x: np.ndarray) -> np.ndarray:
        hidden = torch.from_numpy(x)
        batch, new = hidden.shape[0], hidden.shape[1]
        cache_position = torch.arange(cache.fed, cache.fed + new)
        with torch.no_grad():
            cos_sin = layer.rotary(hidden, cache_position[None].expand(batch, new))
            mask = _model_mask(new, cache.hf.get_max_cache_shape(), cache_position, batch, cache.config, cache.hf)
            output, _ = layer.attention(hidden, cos_sin, mask, past_key_value=cache.hf, cache_position=cache_position)
        cache.fed += new  # only once the update and the attention are through
        return output.numpy()

    def reset(self, cache: Handle) -> None:
        cache.hf.reset()
        cache.fed = 0

    def reorder(self, cache: Handle, indices: Any) -> None:
        cache.hf.reorder_cache(torch.as_tensor(np.asarray(indices)))

    def fork(self, cache: Handle) -> Handle:
        return copy.deepcopy(cache)

    def snapshot(self, cache: Handle) -> Snapshot:
        """The first min(fed, slots) slots, oldest first, as the rows ending at the newest one."""
        keys, values = cache.hf.key_cache[0], cache.hf.value_cache[0]
        held = min(cache.fed, keys.shape[2])
        positions = np.arange(cache.fed - held, cache.fed, dtype=np.int64)
        return Snapshot(cache.fed, keys[:, :, :held].detach().numpy().copy(),
                        values[:, :, :held].detach().numpy().copy(), positions)

    def error_kind(self, error: BaseException) -> str | None:
        return None


def sliding_window_cache() -> SlidingWindowCacheAdapter:
    """``SlidingWindowCache`` (transformers 4.5x) under ``MistralAttention``, one row at a time."""
    return SlidingWindowCacheAdapter()
