"""Adapters for transformers' cache family, with the operations of docs/spec.md §13 each class really has.

    KVCACHE_IMPL=adapters.hf_caches:dynamic_cache_operations pytest -n 2 properties/test_cache_operations.py

One ``LlamaAttention`` layer in float64 over one transformers cache class or
layer type. Unlike ``adapters.hf_llama``'s plain adapters, every adapter
here computes the RoPE table in float64 (``Float64Rotary``): transformers'
float32 table is finding 1 of docs/hf-transformers/README.md, and would
otherwise be the first failure of every class, hiding what the caches do.

The glue places tokens and masks, nothing more: RoPE positions and the
mask's offsets come from the cache itself (``get_seq_length``,
``get_mask_sizes``, exactly what transformers' own mask builders read), and
a window's mask is the glue's (``LlamaAttention`` does not apply the window:
a key at p is visible to a query at q iff q-W < p <= q). Each operation maps
to the class's own public method: ``truncate(n)`` to ``crop(n - length)``
(5.24's ``crop`` takes a negative count of rows to remove), ``reorder`` to
``reorder_cache``, ``fork`` to ``copy.deepcopy``. Snapshots read the rows a
layer holds -- for the quantized layers, the dequantized stored rows, read
through the layer's own ``_dequantize``: there is no public accessor.

The ``*_padded`` adapters drive ragged batches (§13.8) as ``generate`` drives a left-padded batch
(``PaddedBatches``: generate's 2-D attention mask and positions, transformers' ``create_causal_mask``):

    KVCACHE_IMPL=adapters.hf_caches:dynamic_cache_padded pytest -n 0 properties/test_batches.py

No adapter claims input validation, non-finite rejection or binding checks:
transformers has none at this level (those steps are still fed; a call that
raised must have changed nothing).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import transformers
from transformers import DynamicCache, EncoderDecoderCache, LlamaConfig, QuantizedCache, StaticCache
from transformers.cache_utils import Cache, LinearAttentionAndFullAttentionLayer, QuantizedLayer
from transformers.masking_utils import create_causal_mask

from .hf_llama import ATTENTION, DTYPE, Float64Rotary, Layer, llama_attention, llama_config, weights_of, write_weights

CHUNK_HEADROOM = 4  # properties/strategies.py MAX_CHUNK: the most rows one accepted over-capacity call can add
BASE = frozenset({"rope_half_split", "gqa"})  # "float64" is added by adapters whose storage is float64
# DynamicSlidingWindowLayer.crop once the window is full and past states are not recorded: rows are gone.
EVICTED_MESSAGE = "does not track past states, and the sliding window size was already reached"


def _positions(end: int, count: int) -> np.ndarray:
    return np.arange(end - count, end, dtype=np.int64)


def _mask(batch: int, new: int, past: int, kv_length: int, kv_offset: int, window: int | None) -> torch.Tensor | None:
    """Additive mask of ``new`` queries at ``past..`` over ``kv_length`` keys at ``kv_offset..``: q-W < p <= q."""
    keys = torch.arange(kv_offset, kv_offset + kv_length)[None, :]
    queries = torch.arange(past, past + new)[:, None]
    visible = keys <= queries
    if window is not None:
        visible &= keys > queries - window
    if new == 1 and bool(visible.all()):
        return None  # as hf_llama: sdpa without a mask for one query that sees every key
    mask = torch.zeros((new, kv_length), dtype=DTYPE).masked_fill(~visible, -torch.inf)
    return mask.expand(batch, 1, new, kv_length)


@dataclass(eq=False)
class Handle:
    """The transformers cache and what a snapshot needs before its lazily made tensors exist."""

    hf: Any
    batch: int
    kv_heads: int
    head_width: int
    window: int | None
    # generate's 2-D attention mask over the columns the cache holds (1: a row's token, 0: padding); ragged only
    attention_mask: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class Snapshot:
    length: int
    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


class CacheFamilyAdapter:
    """One ``LlamaAttention`` over a transformers cache; subclasses say which cache and how to read it."""

    version = f"transformers {transformers.__version__}, torch {torch.__version__}, {ATTENTION}, float64 RoPE table"
    dtype = "float64"

    def __init__(self, name: str, capabilities: set[str]) -> None:
        self.name = f"hf-{name}"
        self.capabilities = frozenset(BASE | capabilities)

    # -- layers: as hf_llama's, with the float64 RoPE table ------------------------------------------------

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        config = llama_config(weights.heads, weights.kv_heads, weights.wq.shape[1] // weights.heads, rope.base,
                              rope.max_positions)
        return Layer(llama_attention(config, 0, weights), Float64Rotary(config), config, weights.heads,
                     weights.kv_heads)

    def recreate_layer(self, layer: Layer) -> Layer:
        return Layer(llama_attention(layer.config, 0, weights_of(layer.attention, layer.heads, layer.kv_heads)),
                     Float64Rotary(layer.config), layer.config, layer.heads, layer.kv_heads)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        config = llama_config(layer.heads, layer.kv_heads, layer.config.head_dim, rope.base, rope.max_positions)
        return Layer(layer.attention, Float64Rotary(config), config, layer.heads, layer.kv_heads)

    def update_weights(self, layer: Layer, weights: Any) -> None:
        write_weights(layer.attention, weights)

    # -- caches ----------------------------------------------------------------------------------------------

    def create_cache(self, layer: Layer, batch_size: int, capacity: int, window: int | None = None) -> Handle:
        return Handle(self._make(layer.config, capacity, window), batch_size, layer.kv_heads, layer.config.head_dim,
                      window)

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> Any:
        raise NotImplementedError

    def _attention_cache(self, handle: Handle) -> Cache:
        """The cache ``LlamaAttention`` updates (an ``EncoderDecoderCache``'s self-attention part)."""
        return handle.hf

    def _length(self, handle: Handle) -> int:
        return int(self._attention_cache(handle).get_seq_length(0))

    def step(self, layer: Layer, cache: Handle, x: np.ndarray) -> np.ndarray:
        return self._forward(layer, cache, x)

    def append(self, layer: Layer, cache: Handle, x: np.ndarray) -> np.ndarray:
        """``chunked_append``: every class here takes T rows in one ``update``."""
        return self._forward(layer, cache, x)

    def _forward(self, layer: Layer, handle: Handle, x: np.ndarray) -> np.ndarray:
        hidden = torch.from_numpy(x)
        batch, new = hidden.shape[0], hidden.shape[1]
        attention_cache = self._attention_cache(handle)
        past = self._length(handle)
        kv_length, kv_offset = attention_cache.get_mask_sizes(new, 0)
        positions = torch.arange(past, past + new)[None].expand(batch, new)
        with torch.no_grad():
            cos_sin = layer.rotary(hidden, positions)
            mask = _mask(batch, new, past, kv_length, kv_offset, handle.window)
            output, _ = layer.attention(hidden, cos_sin, mask, cache=attention_cache)
        return output.numpy()

    def reset(self, cache: Handle) -> None:
        cache.hf.reset()

    def snapshot(self, cache: Handle) -> Snapshot:
        length = self._length(cache)
        layers = self._attention_cache(cache).layers
        held = self._held(layers[0]) if layers and layers[0].is_initialized else None
        if held is None:
            empty = np.zeros((cache.batch, cache.kv_heads, 0, cache.head_width))
            return Snapshot(length, empty, empty.copy(), _positions(length, 0))
        keys, values = (t.detach().numpy().copy() for t in held)
        return Snapshot(length, keys, values, _positions(length, keys.shape[2]))

    def _held(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rows the layer holds, oldest first, ending at its length (the newest row)."""
        return layer.keys, layer.values

    def error_kind(self, error: BaseException) -> str | None:
        return None


class TruncateByCrop:
    """``truncate(n)`` as ``crop(n - length)``; a window layer's refusal to crop past the window is ``evicted``."""

    skip_crop_of_unwritten_layer = False  # the glue's way around DynamicSlidingWindowLayer's AttributeError

    def truncate(self, cache: Handle, n: int) -> None:
        length = self._length(cache)  # type: ignore[attr-defined]
        if self.skip_crop_of_unwritten_layer and n == length == 0:
            return  # truncate(0) of an empty cache is a no-op; the layer's crop would raise AttributeError
        cache.hf.crop(n - length)

    def error_kind(self, error: BaseException) -> str | None:
        if isinstance(error, RuntimeError) and EVICTED_MESSAGE in str(error):
            return "evicted"
        return None


class ReorderAndFork:
    """``reorder_cache`` (beam search) and ``copy.deepcopy`` (transformers' documented way to copy a cache)."""

    def reorder(self, cache: Handle, indices: Any) -> None:
        cache.hf.reorder_cache(torch.as_tensor(np.asarray(indices)))

    def fork(self, cache: Handle) -> Handle:
        return copy.deepcopy(cache)


class SelectAndRepeat:
    """``batch_select_indices`` (finished sequences leave) and ``batch_repeat_interleave`` (beam expansion), the
    batch-size operations of ``Cache``; the handle remembers the batch size for an empty snapshot."""

    def select(self, cache: Handle, indices: Any) -> None:
        cache.hf.batch_select_indices(torch.as_tensor(np.asarray(indices)))
        cache.batch = len(indices)

    def repeat_interleave(self, cache: Handle, repeats: Any) -> None:
        cache.hf.batch_repeat_interleave(repeats)
        cache.batch *= int(repeats)


@dataclass(frozen=True, eq=False)
class PaddedRow:
    """One row of a padded batch as docs/spec.md §13.8 shows it: its own tokens' keys and values, no padding."""

    keys: np.ndarray
    values: np.ndarray


class PaddedBatches:
    """Ragged batches as ``generate`` runs them (docs/spec.md §13.8, ``ragged_rows``): every chunk goes into the
    cache whole, padding columns included, so every row holds the same number of columns; which of them are a
    row's tokens is generate's 2-D ``attention_mask`` (kept on the handle, extended by each chunk's left padding,
    as ``_update_model_kwargs_for_generation`` extends it). Each forward is the one ``LlamaModel.forward`` makes:
    positions ``cumsum(mask) - 1`` with padding at 0 (``_prepare_position_ids_for_generation``), the last T of
    them; the 4-D mask from transformers' own ``create_causal_mask`` (sized by the cache's ``get_mask_sizes``);
    then ``LlamaAttention`` with the cache's own ``update``. A row's snapshot is its masked-in columns.

    The batch-size operations are the cache's own, each applied to the mask's rows as generate applies it to its
    ``attention_mask``: ``batch_select_indices`` (select, and filter: "only keep the indices in the batch
    dimension"), ``batch_repeat_interleave`` (repeat). There is no merge nor extract in 5.24's cache API (nor a
    per-row crop: ``crop`` removes the last columns of every row), so neither those nor truncate are declared.
    """

    skip_empty_batch = False  # the glue's way around LlamaAttention's RuntimeError on a batch of no rows

    def create_ragged_cache(self, layer: Layer, batch_size: int, capacity: int) -> Handle:
        handle = self.create_cache(layer, batch_size, capacity)  # type: ignore[attr-defined]
        handle.attention_mask = torch.zeros((batch_size, 0), dtype=torch.long)
        return handle

    def append_ragged(self, layer: Layer, cache: Handle, x: np.ndarray, lengths: Any) -> np.ndarray:
        hidden = torch.from_numpy(np.asarray(x))
        batch, new = hidden.shape[0], hidden.shape[1]
        if self.skip_empty_batch and batch == 0:
            return np.zeros(hidden.shape)  # no row appends anything; LlamaAttention's view(..., -1, dh) would raise
        chunk = torch.zeros((batch, new), dtype=torch.long)  # generate's padding: 0 before a row's tokens
        for b in range(batch):
            chunk[b, new - int(lengths[b]):] = 1
        mask = torch.cat([cache.attention_mask, chunk], dim=1)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -new:]
        attention_cache = self._attention_cache(cache)  # type: ignore[attr-defined]
        with torch.no_grad():
            cos_sin = layer.rotary(hidden, positions)
            causal = create_causal_mask(config=layer.config, inputs_embeds=hidden, attention_mask=mask,
                                        cache=attention_cache, position_ids=positions)
            output, _ = layer.attention(hidden, cos_sin, causal, cache=attention_cache)
        cache.attention_mask = mask
        return output.numpy()

    def ragged_snapshot(self, cache: Handle) -> list[PaddedRow]:
        mask = cache.attention_mask
        layers = self._attention_cache(cache).layers  # type: ignore[attr-defined]
        held = self._held(layers[0]) if layers and layers[0].is_initialized else None  # type: ignore[attr-defined]
        rows = []
        for b in range(mask.shape[0]):
            columns = torch.nonzero(mask[b]).reshape(-1)
            if held is None:
                empty = np.zeros((cache.kv_heads, len(columns), cache.head_width))
                rows.append(PaddedRow(empty, empty.copy()))
                continue
            keys, values = (t[b][:, columns].detach().numpy().copy() for t in held)
            rows.append(PaddedRow(keys, values))
        return rows

    def truncate(self, cache: Handle, n: int) -> None:
        """``crop(n - longest)``: every row drops the last ``longest - n`` columns, as assisted decoding rolls back its
        rejected candidates (``ragged_truncate = "columns"`` where declared); the mask's rows alike."""
        mask = cache.attention_mask
        if mask is None:  # a layer cache of the same adapter: the class's own crop
            super().truncate(cache, n)  # type: ignore[misc]
            return
        longest = int(mask.sum(dim=1).max()) if mask.numel() else 0
        cache.hf.crop(n - longest)  # 5.24's crop takes the (negative) count of columns to remove
        cache.attention_mask = mask[:, :mask.shape[1] - (longest - n)]

    def reset(self, cache: Handle) -> None:
        cache.hf.reset()
        if cache.attention_mask is not None:
            cache.attention_mask = cache.attention_mask[:, :0]

    def select(self, cache: Handle, indices: Any) -> None:
        kept = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        cache.hf.batch_select_indices(kept)
        if cache.attention_mask is not None:
            cache.attention_mask = cache.attention_mask[kept]
        cache.batch = len(kept)

    def filter(self, cache: Handle, rows: Any) -> None:
        self.select(cache, rows)

    def repeat_interleave(self, cache: Handle, repeats: Any) -> None:
        cache.hf.batch_repeat_interleave(repeats)
        if cache.attention_mask is not None:
            cache.attention_mask = cache.attention_mask.repeat_interleave(repeats, dim=0)
        cache.batch *= int(repeats)


def _windowed_config(config: LlamaConfig, window: int | None) -> LlamaConfig:
    """The same layer's config, as the ``sliding_attention`` layer type when a window is asked for."""
    if window is None:
        return config
    return LlamaConfig(hidden_size=config.hidden_size, num_attention_heads=config.num_attention_heads,
                       num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
                       num_hidden_layers=1, intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
                       max_position_embeddings=config.max_position_embeddings, attention_bias=False,
                       rope_parameters=config.rope_parameters, attn_implementation=ATTENTION, bos_token_id=None,
                       eos_token_id=None, pad_token_id=None, sliding_window=window, layer_types=["sliding_attention"])


# -- DynamicCache: DynamicLayer, and DynamicSlidingWindowLayer with a window ---------------------------------

class DynamicCacheAdapter(TruncateByCrop, ReorderAndFork, CacheFamilyAdapter):
    """``DynamicCache(config=...)``: a ``DynamicLayer``, or with ``window`` a ``DynamicSlidingWindowLayer``
    (holding the last W-1 rows; ``crop`` past a full window raises unless past states are recorded).

    ``skip_empty_crop``: truncating an empty cache to 0 does not call ``crop``, whose window layer raises
    AttributeError when it has never been written (finding 6 of docs/hf-transformers/README.md): the variants
    that set it judge what that bug would otherwise hide, and say so in their names.
    """

    def __init__(self, name: str = "dynamic-cache-operations", record_past: bool = False,
                 skip_empty_crop: bool = False) -> None:
        super().__init__(name, {"float64", "chunked_append", "truncate", "batch_reorder", "fork",
                                "sliding_window_layer"})
        self.record_past, self.skip_crop_of_unwritten_layer = record_past, skip_empty_crop

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> DynamicCache:
        cache = DynamicCache(config=_windowed_config(config, window))
        if self.record_past:
            cache.activate_past_recording()  # the window layer keeps every row until the next crop
        return cache


class DynamicBatchSizeAdapter(SelectAndRepeat, DynamicCacheAdapter):
    """``DynamicCache`` whose batch shrinks and grows: select and repeat_interleave declared, chunks not. Its
    window layer's refusal of every crop once the window is reached is declared (window_truncates_until_full,
    README finding 8.1), and windows of 1 are left out (finding 7), so that neither hides the batch operations."""

    layer_limits: ClassVar[dict[str, int]] = {"min_window": 2}

    def __init__(self) -> None:
        super().__init__("dynamic-cache-batch-size", skip_empty_crop=True)
        self.capabilities = (self.capabilities - {"chunked_append"}) | {"batch_select", "batch_repeat",
                                                                         "window_truncates_until_full"}


# -- StaticCache: StaticLayer, and StaticSlidingWindowLayer with a window ------------------------------------

class StaticCacheAdapter(TruncateByCrop, ReorderAndFork, CacheFamilyAdapter):
    """``StaticCache(config=..., max_cache_len=...)``: a ``StaticLayer``, or with ``window`` a
    ``StaticSlidingWindowLayer`` (a ring of min(W, capacity) rows, rolled once full).

    The buffers get ``CHUNK_HEADROOM`` rows beyond the suite's capacity, and ``fixed_capacity`` is not
    claimed: a write past ``max_cache_len`` moves the length before raising (finding 2, judged by
    ``hf_llama:static_cache*``), which would otherwise be the first failure of every run here and hide the
    operations. An accepted write past the suite's capacity is not judged (its cache is replaced).
    """

    def __init__(self) -> None:
        super().__init__("static-cache-operations", {"float64", "chunked_append", "truncate", "batch_reorder",
                                                      "fork", "sliding_window_layer"})

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> StaticCache:
        return StaticCache(config=_windowed_config(config, window), max_cache_len=capacity + CHUNK_HEADROOM)

    def _held(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """A full layer's first ``length`` slots. A window layer's ring holds min(length, W) slots, oldest first
        once rolled, which its own ``get_mask_sizes`` reads as the rows ending at the length; of those, the W-1
        newest are what the next query sees, and all a snapshot shows (the oldest slot is never read again)."""
        length = int(layer.get_seq_length())
        held = max(min(length, layer.max_cache_len), 0)
        keys, values = layer.keys[:, :, :held], layer.values[:, :, :held]
        if getattr(layer, "is_sliding", False):
            seen = min(held, layer.max_cache_len - 1)
            keys, values = keys[:, :, held - seen:], values[:, :, held - seen:]
        return keys, values


# -- QuantizedCache -------------------------------------------------------------------------------------------

class Fp8CacheAdapter(ReorderAndFork, CacheFamilyAdapter):
    """``QuantizedCache('fp8')``: ``Fp8QuantizedLayer``, float8_e4m3fn rows under a per-tensor scale frozen at
    the first update. Full attention only, not croppable (``is_croppable`` is False): no truncate, no window.
    Not ``float64``: its rows are stored in 8 bits; ``storage`` says how, for the suite's quantized rule."""

    storage: ClassVar[dict[str, Any]] = {"format": "float8_e4m3fn", "scale": "per_tensor", "update": "frozen"}

    def __init__(self) -> None:
        super().__init__("quantized-cache-fp8", {"chunked_append", "batch_reorder", "fork"})

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> QuantizedCache:
        return QuantizedCache("fp8", config)

    def _held(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return layer._dequantize(layer._quantized_keys), layer._dequantize(layer._quantized_values)


HQQ_BITS, HQQ_GROUP, HQQ_RESIDUAL = 4, 4, 2
HQQ_MIN_STEP = 1e-4  # HQQ's guards: a group's range <= 1e-4 gets scale 1, and 1 / scale is clamped at 5e-5


class HqqCacheAdapter(ReorderAndFork, CacheFamilyAdapter):
    """``QuantizedCache('hqq')``: ``HQQQuantizedLayer``, KIVI-style: up to ``residual_length`` newest rows in full
    precision, the rest 4-bit in groups of ``q_group_size``, re-quantized from the dequantized rows at every
    flush. A residual of 2 makes drawn programs quantize.

    Declared as affine per-group storage (docs/spec.md §13.6): ``uint4`` in groups of 4 features of each token,
    with HQQ's ``axis=1`` (its default ``axis=0`` groups run across tokens, heads and batch rows: no per-token
    rule describes them), and a smallest step of 1e-4, HQQ's guards for near-constant groups; heads of 8.
    HQQ's optimiser moves each zero point off the closed form; docs/hf-transformers/README.md says by how much.
    """

    storage: ClassVar[dict[str, Any]] = {"format": f"uint{HQQ_BITS}", "scale": "per_group", "group": HQQ_GROUP,
                                         "min_step": HQQ_MIN_STEP}
    # Two groups a token: HQQ packs two 4-bit groups a byte along the groups, and a tensor of an odd number of
    # groups (one token of one group) dequantizes to garbage or raises (hf README, finding 12)
    layer_limits: ClassVar[dict[str, int]] = {"head_width_multiple": 2 * HQQ_GROUP}

    def __init__(self) -> None:
        super().__init__("quantized-cache-hqq", {"chunked_append", "batch_reorder", "fork"})

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> QuantizedCache:
        return QuantizedCache("hqq", config, nbits=HQQ_BITS, q_group_size=HQQ_GROUP, residual_length=HQQ_RESIDUAL,
                              axis_key=1, axis_value=1)

    def _held(self, layer: QuantizedLayer) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = layer._dequantize(layer._quantized_keys), layer._dequantize(layer._quantized_values)
        keys, values = layer._apply_pending_reorder(keys, values)  # a reorder reaches quantized rows lazily
        if layer.keys is not None and layer.keys.dim() == 4:
            keys, values = torch.cat([keys, layer.keys], dim=-2), torch.cat([values, layer.values], dim=-2)
        return keys, values


# -- EncoderDecoderCache's self-attention cache ---------------------------------------------------------------

class EncoderDecoderCacheAdapter(TruncateByCrop, ReorderAndFork, CacheFamilyAdapter):
    """``EncoderDecoderCache(DynamicCache, DynamicCache)``, as a decoder's self-attention drives it: attention
    updates ``self_attention_cache``; crop, reorder, reset and fork go through the wrapper (crop reaches the
    self-attention part only; reorder and reset both parts). The cross-attention part stays empty."""

    def __init__(self) -> None:
        super().__init__("encoder-decoder-cache", {"float64", "chunked_append", "truncate", "batch_reorder", "fork"})

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> EncoderDecoderCache:
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))

    def _attention_cache(self, handle: Handle) -> Cache:
        return handle.hf.self_attention_cache


# -- a hybrid layer type's attention part ----------------------------------------------------------------------

class HybridLayerAdapter(ReorderAndFork, CacheFamilyAdapter):
    """``Cache(layers=[LinearAttentionAndFullAttentionLayer()])``: the "hybrid" layer type (a linear-attention
    state beside a ``DynamicLayer``), driven by attention alone. No truncate: its ``crop`` needs recorded
    linear-attention states, which an attention-only layer never has (it raises RuntimeError)."""

    def __init__(self) -> None:
        super().__init__("hybrid-layer", {"float64", "chunked_append", "batch_reorder", "fork"})

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> Cache:
        return Cache(layers=[LinearAttentionAndFullAttentionLayer()])


def dynamic_cache_operations() -> DynamicCacheAdapter:
    """DynamicCache: DynamicLayer, and DynamicSlidingWindowLayer (crop past a full window raises: evicted)."""
    return DynamicCacheAdapter()


def dynamic_cache_batch_size() -> DynamicCacheAdapter:
    """DynamicCache with ``batch_select_indices`` and ``batch_repeat_interleave`` beside reorder, truncate and fork;
    one row at a time (no ``chunked_append``: finding 5, a malformed chunk kept by the first write, comes first)."""
    return DynamicBatchSizeAdapter()


def dynamic_window_skip_empty_crop() -> DynamicCacheAdapter:
    """As ``dynamic_cache_operations``, without calling ``crop`` on an empty cache (finding 6)."""
    return DynamicCacheAdapter("dynamic-cache-skip-empty-crop", skip_empty_crop=True)


def dynamic_window_past_recording() -> DynamicCacheAdapter:
    """DynamicCache after ``activate_past_recording()``: the window layer keeps rows until crop, to restore them;
    without calling ``crop`` on an empty cache (finding 6)."""
    return DynamicCacheAdapter("dynamic-cache-past-recording", record_past=True, skip_empty_crop=True)


def static_cache_operations() -> StaticCacheAdapter:
    """StaticCache: StaticLayer, and StaticSlidingWindowLayer."""
    return StaticCacheAdapter()


def quantized_cache_fp8() -> Fp8CacheAdapter:
    return Fp8CacheAdapter()


def quantized_cache_hqq() -> HqqCacheAdapter:
    return HqqCacheAdapter()


def encoder_decoder_cache() -> EncoderDecoderCacheAdapter:
    return EncoderDecoderCacheAdapter()


def hybrid_layer() -> HybridLayerAdapter:
    return HybridLayerAdapter()


# -- padded batches as generate runs them (docs/spec.md §13.8; docs/hf-transformers/README.md, "Padded batches") ----

PADDED = {"float64", "ragged_rows"}
# generate sizes a StaticCache to the padded prompt plus max_new_tokens; here every chunk adds its T columns to
# every row, padding included, whatever the suite's per-row capacity: a program of the thorough profile (80 steps,
# chunks of up to 5 columns) needs at most 400. No `full` is declared (§13.8 does not draw it yet)
PADDED_STATIC_COLUMNS = 400


class DynamicPaddedAdapter(PaddedBatches, DynamicCacheAdapter):
    """``DynamicCache`` under left-padded batches, with select, repeat and filter by its batch methods; with
    ``crop``, truncate by ``crop`` too, declared as what it is on a left-padded cache: every row drops the same last
    columns (``ragged_truncate = "columns"``, docs/spec.md §13.8)."""

    def __init__(self, skip_empty_batch: bool = False, crop: bool = False) -> None:
        super().__init__("dynamic-cache-padded-crop" if crop else
                         "dynamic-cache-padded-skip-empty-batch" if skip_empty_batch else "dynamic-cache-padded")
        self.capabilities = frozenset(BASE | PADDED | {"batch_select", "batch_repeat", "batch_filter"} |
                                      ({"truncate"} if crop else set()))
        self.skip_empty_batch = skip_empty_batch
        if crop:
            self.ragged_truncate = "columns"


class StaticPaddedAdapter(PaddedBatches, StaticCacheAdapter):
    """``StaticCache`` under left-padded batches: no batch-size operation (``StaticLayer`` has none: its batch is
    its buffers' first dimension, fixed at the first update)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "hf-static-cache-padded"
        self.capabilities = frozenset(BASE | PADDED)

    def _make(self, config: LlamaConfig, capacity: int, window: int | None) -> StaticCache:
        return StaticCache(config=_windowed_config(config, window), max_cache_len=PADDED_STATIC_COLUMNS)


class HqqPaddedAdapter(PaddedBatches, HqqCacheAdapter):
    """``QuantizedCache('hqq')`` under left-padded batches, with its declared storage: per-group scales, each
    token's own, so §13.8 judges each row by the storage rule (a scale over the batch would be skipped)."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "hf-quantized-cache-hqq-padded"
        self.capabilities = frozenset(BASE | {"ragged_rows"})


def dynamic_cache_padded() -> DynamicPaddedAdapter:
    """DynamicCache driven as generate drives a left-padded batch; select, repeat, filter."""
    return DynamicPaddedAdapter()


def dynamic_cache_padded_skip_empty_batch() -> DynamicPaddedAdapter:
    """As ``dynamic_cache_padded``, without calling ``LlamaAttention`` on a batch of no rows (after a filter to none),
    which raises RuntimeError: to judge what that hides."""
    return DynamicPaddedAdapter(skip_empty_batch=True)


def dynamic_cache_padded_crop() -> DynamicPaddedAdapter:
    """As ``dynamic_cache_padded_skip_empty_batch``, declaring truncate by ``crop`` with ``ragged_truncate =
    "columns"``: the crop of the glue's padded layout, whose rows may hold padding after their tokens."""
    return DynamicPaddedAdapter(skip_empty_batch=True, crop=True)


def static_cache_padded() -> StaticPaddedAdapter:
    """StaticCache driven as generate drives a left-padded batch."""
    return StaticPaddedAdapter()


def quantized_cache_hqq_padded() -> HqqPaddedAdapter:
    """QuantizedCache('hqq') driven as generate drives a left-padded batch, judged by its declared storage."""
    return HqqPaddedAdapter()
