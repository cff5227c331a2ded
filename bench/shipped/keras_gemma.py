"""An adapter over keras-nlp's Gemma attention and its cache tensor (keras-nlp 0.14.x, Keras 3 on torch, float32).

    KERAS_BACKEND=torch KVCACHE_IMPL=bench.shipped.keras_gemma:make_adapter pytest -n 0 properties/test_session.py

The layer is ``keras_nlp.src.models.gemma.gemma_attention.CachedGemmaAttention`` as ``GemmaDecoderBlock`` calls
it: ``attention(x, attention_mask=..., cache=..., cache_update_index=...)`` returns the output and the new cache,
a ``[B, 2, C, KV, dh]`` tensor (keys, then values) that the layer writes with ``ops.slice_update`` at
``cache_update_index``. The mask is the block's own: ``compute_causal_mask(B, C, T, cache_index)`` from
``keras_nlp.src.layers.modeling.transformer_layer_utils`` over the whole cache length, as
``GemmaDecoderBlock._compute_attention_mask`` builds it without padding. The sliding window is the layer's own
(``use_sliding_window_attention``, ``sliding_window_size``), applied inside ``_compute_attention``: the code the
shipped bug is in. The cache holds no length: ``GemmaCausalLM.generate`` keeps the index, and the adapter's
counter plays that role; the caller keeps the returned cache (the layer is functional), so a step of a decoder
commits in every block or in none, as ``GemmaCausalLM.call_with_cache`` stacks the blocks' new caches.

What it does, and so what is declared:

- ``rope_half_split``: keras-nlp's ``RotaryEmbedding`` rotates feature i with i + dh/2 (``rotate_half``), then
  ``CachedGemmaAttention._apply_rope`` interleaves the two halves ("Gemma uses a different layout"): keys are
  stored with their features permuted, queries alike, so the scores are those of half-split RoPE. The snapshots
  undo the permutation (docs/spec.md §4.3: a stored permutation is a storage layout). Gemma's layer builds its
  ``RotaryEmbedding`` with ``max_wavelength=10_000`` fixed; the suite draws the base and has no declaration for a
  fixed one, so before each call the adapter sets that ``RotaryEmbedding``'s ``max_wavelength`` (its constructor
  argument, read on every call) to the layer's base; nothing else of the layer changes. No partial rotary (the
  whole head is rotated).
- ``gqa`` (``num_key_value_heads``), ``decode_session``, ``positions_rope``, ``sliding_window``: the decoder of
  docs/spec.md §2.4 from one ``CachedGemmaAttention`` per block (a window on every block when the decoder has
  one), the glue being the embedding, the ``tanh`` residual and the tied logits.
- dtype ``float32``: Keras' default policy; the softmax is a ``keras.layers.Softmax(dtype="float32")`` anyway,
  and RoPE's positions and frequencies are float32 in keras-nlp. Inputs arrive as float64 and are cast.
- no reset of a cache (Gemma's ``generate`` builds a new zeroed cache per call: ``reset`` does so), no fixed
  capacity check (past the cache's length ``ops.slice_update`` raises, and nothing was kept: not declared), no
  physical storage (every step returns a new tensor), no validation, no binding checks: not declared.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version as _version
from typing import Any

import keras
import numpy as np
from keras import ops

if keras.config.backend() != "torch":  # the benchmark runs Keras 3 on torch 2.13.0 only
    raise ImportError(f"bench.shipped.keras_gemma needs KERAS_BACKEND=torch, got {keras.config.backend()!r}")

from keras_nlp.src.layers.modeling.transformer_layer_utils import compute_causal_mask
from keras_nlp.src.models.gemma.gemma_attention import CachedGemmaAttention

DTYPE = "float32"
VERSION = f"keras-nlp {_version('keras-nlp')}, keras {keras.__version__} (torch backend)"


def _stored_order(head_width: int) -> np.ndarray:
    """Where ``_apply_rope`` puts features: stored slot j holds model feature ``order[j]`` (halves interleaved)."""
    half = head_width // 2
    return np.stack([np.arange(half), np.arange(half, head_width)], axis=-1).reshape(-1)


def _attention(weights: Any, rope: Any, window: int | None = None) -> CachedGemmaAttention:
    heads, kv_heads = weights.heads, weights.kv_heads
    model_width, head_width = weights.wq.shape[0], weights.wq.shape[1] // heads
    attention = CachedGemmaAttention(head_dim=head_width, num_query_heads=heads, num_key_value_heads=kv_heads,
                                     use_sliding_window_attention=window is not None,
                                     sliding_window_size=window if window is not None else 4096, dtype=DTYPE)
    attention.build((None, None, model_width))
    _write(attention, weights)
    return attention


def _write(attention: CachedGemmaAttention, weights: Any) -> None:
    """The suite's ``x @ W`` matrices into the layer's einsum kernels, in place."""
    heads, kv_heads = weights.heads, weights.kv_heads
    model_width, head_width = weights.wq.shape[0], weights.wq.shape[1] // heads

    def heads_first(matrix: np.ndarray, count: int) -> np.ndarray:  # [D, n*dh] -> [n, D, dh]
        return np.asarray(matrix).reshape(model_width, count, head_width).transpose(1, 0, 2)

    attention.query_dense.kernel.assign(heads_first(weights.wq, heads).astype(DTYPE))
    attention.key_dense.kernel.assign(heads_first(weights.wk, kv_heads).astype(DTYPE))
    attention.value_dense.kernel.assign(heads_first(weights.wv, kv_heads).astype(DTYPE))
    attention.output_dense.kernel.assign(
        np.asarray(weights.wo).reshape(heads, head_width, model_width).astype(DTYPE))


@dataclass(eq=False)
class Layer:
    attention: CachedGemmaAttention
    weights: Any  # the suite's AttentionWeights, for recreate_layer / with_rope
    rope: Any


@dataclass(eq=False)
class Cache:
    layer: Layer
    batch_size: int
    capacity: int
    tensor: Any = None  # [B, 2, C, KV, dh], as GemmaCausalLM._build_cache makes it
    length: int = 0  # cache_update_index, the counter GemmaCausalLM.generate keeps


@dataclass(frozen=True, eq=False)
class Snapshot:
    length: int
    keys: np.ndarray
    values: np.ndarray


@dataclass(eq=False)
class Decoder:
    config: Any
    embedding: Any  # [vocab, D], also the output projection
    layers: list[Layer]


@dataclass(eq=False)
class Session:
    decoder: Decoder
    caches: list[Cache]
    capacity: int
    length: int = 0


@dataclass(frozen=True, eq=False)
class BlockRows:
    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


def _new_tensor(layer: Layer, batch_size: int, capacity: int) -> Any:
    weights = layer.weights
    return ops.zeros((batch_size, 2, capacity, weights.kv_heads, weights.wq.shape[1] // weights.heads), DTYPE)


def _call(cache: Cache, hidden: Any) -> tuple[Any, Any]:
    """One ``CachedGemmaAttention`` call of ``hidden [B, T, D]`` at ``cache.length``, as ``GemmaDecoderBlock``."""
    batch, count = ops.shape(hidden)[0], ops.shape(hidden)[1]
    mask = compute_causal_mask(batch, ops.shape(cache.tensor)[2], count, cache_index=cache.length)
    cache.layer.attention.rope_layer.max_wavelength = cache.layer.rope.base  # Gemma's layer fixes 10_000 (see above)
    return cache.layer.attention(hidden, attention_mask=mask, cache=cache.tensor, cache_update_index=cache.length)


class KerasGemmaAdapter:
    name = "keras-nlp-gemma-attention"
    version = VERSION
    dtype = DTYPE
    capabilities = frozenset({"rope_half_split", "gqa", "decode_session", "positions_rope", "sliding_window"})

    # -- layers --------------------------------------------------------------------------------------------------

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        return Layer(_attention(weights, rope), weights, rope)

    def recreate_layer(self, layer: Layer) -> Layer:
        return Layer(_attention(layer.weights, layer.rope), layer.weights, layer.rope)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        return Layer(layer.attention, layer.weights, rope)  # the same layer and parameters, another base per call

    def update_weights(self, layer: Layer, weights: Any) -> None:
        _write(layer.attention, weights)
        layer.weights = weights

    # -- caches --------------------------------------------------------------------------------------------------

    def create_cache(self, layer: Layer, batch_size: int, capacity: int) -> Cache:
        return Cache(layer, batch_size, capacity, _new_tensor(layer, batch_size, capacity))

    def step(self, layer: Layer, cache: Cache, x: np.ndarray) -> np.ndarray:
        hidden = ops.convert_to_tensor(np.asarray(x, dtype=np.float64).astype(DTYPE))
        output, cache.tensor = _call(Cache(layer, cache.batch_size, cache.capacity, cache.tensor, cache.length),
                                     hidden)
        cache.length += int(ops.shape(hidden)[1])
        return ops.convert_to_numpy(output)

    def reset(self, cache: Cache) -> None:
        cache.tensor = _new_tensor(cache.layer, cache.batch_size, cache.capacity)  # what generate does per call
        cache.length = 0

    def _rows(self, cache: Cache) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values ``[B, KV, n, dh]`` of the first n slots, keys in the model's feature order."""
        tensor = ops.convert_to_numpy(cache.tensor)[:, :, :cache.length]  # [B, 2, n, KV, dh]
        stored_keys = tensor[:, 0].transpose(0, 2, 1, 3)
        keys = np.empty_like(stored_keys)
        keys[..., _stored_order(stored_keys.shape[-1])] = stored_keys
        return keys, tensor[:, 1].transpose(0, 2, 1, 3).copy()

    def snapshot(self, cache: Cache) -> Snapshot:
        return Snapshot(cache.length, *self._rows(cache))

    def error_kind(self, error: BaseException) -> str | None:
        return None  # nothing is claimed: any exception will do where the suite allows one

    # -- the decoder of docs/spec.md §2.4: Gemma attention and its cache per block, glue for the rest -----------

    def create_decoder(self, config: Any, weights: Any) -> Decoder:
        layers = [Layer(_attention(block, config.rope, config.window), block, config.rope)
                  for block in weights.blocks]
        return Decoder(config, ops.convert_to_tensor(np.asarray(weights.embedding).astype(DTYPE)), layers)

    def update_block_weights(self, decoder: Decoder, block: int, weights: Any) -> None:
        _write(decoder.layers[block].attention, weights)
        decoder.layers[block].weights = weights

    def create_session(self, decoder: Decoder, capacity: int) -> Session:
        return Session(decoder, [self.create_cache(layer, 1, capacity) for layer in decoder.layers], capacity)

    def prefill(self, session: Session, tokens: Any) -> np.ndarray:
        ids = np.asarray(tokens)
        if ids.ndim != 1:
            raise ValueError("tokens must be a 1-D sequence")
        hidden = ops.take(session.decoder.embedding, ops.convert_to_tensor(ids[None]), axis=0)  # [1, T, D]
        tensors = []
        for cache in session.caches:
            output, tensor = _call(cache, hidden)
            hidden = hidden + ops.tanh(output)
            tensors.append(tensor)
        for cache, tensor in zip(session.caches, tensors):  # every block's new cache, as call_with_cache stacks them
            cache.tensor, cache.length = tensor, cache.length + len(ids)
        session.length += len(ids)
        return ops.convert_to_numpy(ops.matmul(hidden[0], ops.transpose(session.decoder.embedding)))

    def decode(self, session: Session, token: Any) -> np.ndarray:
        return self.prefill(session, [token])[0]

    def reset_session(self, session: Session) -> None:
        for cache in session.caches:
            self.reset(cache)
        session.length = 0

    def session_state(self, session: Session) -> tuple[BlockRows, ...]:
        rows = []
        for cache in session.caches:
            keys, values = self._rows(cache)  # the cache keeps every position: slot = position
            rows.append(BlockRows(keys[0], values[0], np.arange(cache.length)))
        return tuple(rows)


def make_adapter() -> KerasGemmaAdapter:
    return KerasGemmaAdapter()
