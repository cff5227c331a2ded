"""The published Hugging Face adapters, pinned to transformers releases older than 5.24.

    KVCACHE_IMPL=bench.shipped.pinned:dynamic_cache_float64_rope pytest -n 0 properties/test_layer_cache.py

``adapters/hf_llama.py`` and ``adapters/hf_caches.py`` call ``LlamaAttention(..., cache=...)``, the keyword
of 5.24.0. Releases up to 5.23.0 name it ``past_key_values`` and take anything else into ``**kwargs``,
silently: the cache is never written, and every run fails at its first append ("cache length is 0, but 1
rows were appended") whatever the release's cache does. Here the layer the adapter builds maps the keyword
back; nothing else of the adapters changes, so the declarations are the published ones.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.models.llama.modeling_llama import LlamaAttention

from adapters import hf_caches, hf_llama

# True from 5.24.0 on: the published adapters need no bridge there.
TAKES_CACHE_KEYWORD = "cache" in inspect.signature(LlamaAttention.forward).parameters


class PastKeyValuesAttention(LlamaAttention):
    """``LlamaAttention`` that takes 5.24's ``cache=`` keyword and passes it on as ``past_key_values=``."""

    def forward(self, *args: Any, cache: Any = None, **kwargs: Any) -> Any:
        return super().forward(*args, past_key_values=cache, **kwargs)


def _bridge(module: LlamaAttention) -> None:
    # The same module object: parameter identity and versions stay the adapter's.
    if not TAKES_CACHE_KEYWORD:
        module.__class__ = PastKeyValuesAttention


def _bridged(layer: hf_llama.Layer) -> hf_llama.Layer:
    _bridge(layer.attention)
    return layer


class _Bridge:
    """Every layer the adapter makes gets the keyword bridge (``with_rope`` reuses a bridged module)."""

    def create_layer(self, weights: Any, rope: Any) -> hf_llama.Layer:
        return _bridged(super().create_layer(weights, rope))  # type: ignore[misc]

    def recreate_layer(self, layer: hf_llama.Layer) -> hf_llama.Layer:
        return _bridged(super().recreate_layer(layer))  # type: ignore[misc]


class PinnedDecoderAdapter(_Bridge, hf_llama.LlamaDecoderAdapter):
    """``adapters.hf_llama``'s decoder adapter with bridged layers and decoder blocks."""

    def create_decoder(self, config: Any, weights: Any) -> hf_llama.Decoder:
        decoder = super().create_decoder(config, weights)
        for block in decoder.blocks:
            _bridge(block)
        return decoder


class PinnedDynamicCacheAdapter(_Bridge, hf_caches.DynamicCacheAdapter):
    """``adapters.hf_caches``'s ``DynamicCache`` adapter with bridged layers."""


class PinnedHqqCacheAdapter(_Bridge, hf_caches.HqqCacheAdapter):
    """``adapters.hf_caches``'s ``QuantizedCache("hqq")`` adapter with bridged layers, the same declarations.

    Its snapshot reads the quantized rows through the layer's ``_apply_pending_reorder`` where the layer has one:
    from 5.19.0 on, ``QuantizedLayer.reorder_cache`` defers the reorder of its quantized rows to the next
    ``update``, and that method is how the layer itself presents them then. Up to 5.18.0 the layer has no
    pending reorder (``reorder_cache`` is ``CacheLayerMixin``'s), and the quantized rows are read as stored.
    """

    def _held(self, layer: Any) -> tuple[Any, Any]:
        keys, values = layer._dequantize(layer._quantized_keys), layer._dequantize(layer._quantized_values)
        pending = getattr(layer, "_apply_pending_reorder", None)
        if pending is not None:
            keys, values = pending(keys, values)
        if layer.keys is not None and layer.keys.dim() == 4:
            keys, values = torch.cat([keys, layer.keys], dim=-2), torch.cat([values, layer.values], dim=-2)
        return keys, values


def dynamic_cache_float64_rope() -> PinnedDecoderAdapter:
    """As ``adapters.hf_llama:dynamic_cache_float64_rope``."""
    return PinnedDecoderAdapter(float64_rope=True)


def dynamic_cache_operations() -> PinnedDynamicCacheAdapter:
    """As ``adapters.hf_caches:dynamic_cache_operations``."""
    return PinnedDynamicCacheAdapter()


def quantized_cache_hqq() -> PinnedHqqCacheAdapter:
    """As ``adapters.hf_caches:quantized_cache_hqq``; needs hqq (``DISABLE_CUDA=1 pip install hqq==0.2.8.post1``)."""
    return PinnedHqqCacheAdapter()


def dynamic_window_past_recording() -> PinnedDynamicCacheAdapter:
    """As ``adapters.hf_caches:dynamic_window_past_recording``."""
    return PinnedDynamicCacheAdapter("dynamic-cache-past-recording", record_past=True, skip_empty_crop=True)
