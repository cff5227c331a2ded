"""Adapters that drive Hugging Face transformers' own Llama attention and KV caches.

    pip install -e '.[hf]'        # torch==2.13.0 (CPU) and transformers, Python 3.11
    KVCACHE_IMPL=adapters.hf_llama:dynamic_cache pytest -n auto properties/
    KVCACHE_IMPL=adapters.hf_llama:static_cache pytest -n auto properties/

The layer is ``LlamaAttention`` with ``LlamaRotaryEmbedding`` (half-split
RoPE) in float64; the cache is ``DynamicCache`` or ``StaticCache``, passed
to the attention's own ``forward``, which calls ``cache.update``. The
decoder of docs/spec.md §9 (embedding, blocks of attention with ``tanh`` residuals,
tied logits) is built from one ``LlamaAttention`` per block over one
``DynamicCache``; its prefix store reuses a stored cache by ``copy.deepcopy``
and ``crop``, as transformers' docs recommend. The glue here only places
tokens (RoPE positions from the cache length, a mask over unused static
slots) and keeps the store's bookkeeping (docs/spec.md §10.3's longest usable prefix).

What transformers does not do is declared absent, so the suite skips it:
no input validation, no non-finite rejection, no binding checks (identity,
revision, RoPE), no typed creation errors, no partial rotary, no
interleaved RoPE, no sliding window. ``StaticCache`` preallocates
``[B, KV, C, dh]`` buffers, so it declares ``fixed_capacity`` (an
``IndexError`` past ``max_cache_len`` is mapped to ``full``) and
``physical_storage``; its ``reset()`` zeroes both buffers in place
(``reset_keeps_buffers``, ``reset_zeroes``).

Llama's config insists on ``hidden_size % heads == 0``; the attention module
itself does not need it, so the four projections are rebuilt at the suite's
model width (still ``nn.Linear``, ``y = x @ W.T``).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transformers
from torch import nn
from transformers import DynamicCache, LlamaConfig, StaticCache
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

DTYPE = torch.float64
ATTENTION = "sdpa"  # transformers' default; "eager" runs softmax in float32 even in a float64 model


class Float64Rotary(nn.Module):
    """``LlamaRotaryEmbedding``'s formula with every step in float64 (transformers runs it in float32).

    For the ``*_float64_rope`` adapters: they isolate the cache's behaviour
    from the RoPE table's rounding, which the plain adapters report.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        dim, base = config.head_dim, config.rope_parameters["rope_theta"]
        self.inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=DTYPE) / dim)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].to(DTYPE) * self.inv_freq  # [B, T, dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def llama_config(heads: int, kv_heads: int, head_width: int, base: float, max_positions: int, blocks: int = 1,
                 vocab: int = 2) -> LlamaConfig:
    return LlamaConfig(hidden_size=heads * head_width, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       head_dim=head_width, num_hidden_layers=blocks, intermediate_size=4, vocab_size=vocab,
                       max_position_embeddings=max_positions, attention_bias=False,
                       rope_parameters={"rope_type": "default", "rope_theta": float(base)},
                       attn_implementation=ATTENTION, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def llama_attention(config: LlamaConfig, index: int, weights: Any) -> LlamaAttention:
    """transformers' module, projections rebuilt at the suite's widths, holding ``weights`` (``x @ W``)."""
    module = LlamaAttention(config, layer_idx=index)
    for name in ("q", "k", "v", "o"):
        w = np.asarray(getattr(weights, f"w{name}"))
        linear = nn.Linear(w.shape[0], w.shape[1], bias=False, dtype=DTYPE)  # float64 before the copy
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w.T.copy()))
        setattr(module, f"{name}_proj", linear)
    return module.to(DTYPE).eval()


def write_weights(module: LlamaAttention, weights: Any) -> None:
    """An in-place optimiser-like write into the same parameter tensors."""
    with torch.no_grad():
        for name in ("q", "k", "v", "o"):
            getattr(module, f"{name}_proj").weight.copy_(torch.from_numpy(np.asarray(getattr(weights, f"w{name}")).T))


def weights_of(module: LlamaAttention, heads: int, kv_heads: int) -> Any:
    from types import SimpleNamespace

    arrays = {f"w{n}": getattr(module, f"{n}_proj").weight.detach().numpy().T.copy() for n in ("q", "k", "v", "o")}
    return SimpleNamespace(**arrays, heads=heads, kv_heads=kv_heads)


def _length(cache: Any, layer: int = 0) -> int:
    return int(cache.get_seq_length(layer))  # a 0-d tensor for StaticCache


def _mask(cache: Any, batch: int, new: int, past: int) -> torch.Tensor | None:
    """Additive causal mask for ``new`` queries after ``past`` cached rows (and unused static slots)."""
    total = cache.layers[0].max_cache_len if isinstance(cache, StaticCache) else past + new
    if new == 1 and total == past + new:
        return None
    mask = torch.full((batch, 1, new, total), -torch.inf, dtype=DTYPE)
    for i in range(new):
        mask[:, :, i, :past + i + 1] = 0.0
    return mask


@dataclass(eq=False)
class Layer:
    attention: LlamaAttention
    rotary: nn.Module
    config: LlamaConfig
    heads: int
    kv_heads: int


@dataclass(eq=False)
class Cache:
    """transformers' cache, and the shape a snapshot has before its lazily made tensors exist."""

    hf: Any  # DynamicCache or StaticCache
    shape: tuple[int, int, int, int]  # [B, KV, C, dh]


@dataclass(frozen=True, eq=False)
class Snapshot:
    length: int
    keys: np.ndarray
    values: np.ndarray
    physical_keys: np.ndarray | None = None
    physical_values: np.ndarray | None = None
    buffer_identity: Any = None


class LlamaLayerAdapter:
    """One ``LlamaAttention`` layer with a ``DynamicCache`` or a ``StaticCache``."""

    version = f"transformers {transformers.__version__}, torch {torch.__version__}, {ATTENTION}"
    dtype = "float64"

    def __init__(self, static: bool, float64_rope: bool = False) -> None:
        self.static, self.float64_rope = static, float64_rope
        self.name = f"hf-llama-{'static' if static else 'dynamic'}-cache" + ("-float64-rope" if float64_rope else "")
        declared = {"float64", "rope_half_split", "gqa"}
        if static:
            declared |= {"fixed_capacity", "physical_storage", "reset_keeps_buffers", "reset_zeroes"}
        self.capabilities = frozenset(declared)

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        config = llama_config(weights.heads, weights.kv_heads, weights.wq.shape[1] // weights.heads, rope.base,
                              rope.max_positions)
        return Layer(llama_attention(config, 0, weights), self._rotary(config), config, weights.heads, weights.kv_heads)

    def _rotary(self, config: LlamaConfig) -> nn.Module:
        return Float64Rotary(config) if self.float64_rope else LlamaRotaryEmbedding(config).to(DTYPE)

    def recreate_layer(self, layer: Layer) -> Layer:
        return Layer(llama_attention(layer.config, 0, weights_of(layer.attention, layer.heads, layer.kv_heads)),
                     self._rotary(layer.config), layer.config, layer.heads, layer.kv_heads)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        config = llama_config(layer.heads, layer.kv_heads, layer.config.head_dim, rope.base, rope.max_positions)
        return Layer(layer.attention, self._rotary(config), config, layer.heads, layer.kv_heads)

    def update_weights(self, layer: Layer, weights: Any) -> None:
        write_weights(layer.attention, weights)

    def create_cache(self, layer: Layer, batch_size: int, capacity: int) -> Cache:
        shape = (batch_size, layer.kv_heads, capacity, layer.config.head_dim)
        if self.static:
            return Cache(StaticCache(config=layer.config, max_cache_len=capacity), shape)
        return Cache(DynamicCache(config=layer.config), shape)

    def step(self, layer: Layer, cache: Cache, x: np.ndarray) -> np.ndarray:
        hidden = torch.from_numpy(x)
        past, batch = _length(cache.hf), hidden.shape[0]
        positions = torch.full((batch, 1), past, dtype=torch.long)
        with torch.no_grad():
            cos_sin = layer.rotary(hidden, positions)
            output, _ = layer.attention(hidden, cos_sin, _mask(cache.hf, batch, 1, past), cache=cache.hf)
        return output.numpy()

    def reset(self, cache: Cache) -> None:
        cache.hf.reset()

    def snapshot(self, cache: Cache) -> Snapshot:
        length = _length(cache.hf)
        keys, values = cache.hf.layers[0].keys, cache.hf.layers[0].values
        if keys is None or keys.numel() == 0:  # not made yet: transformers allocates on the first update
            batch, kv, _, dh = cache.shape
            empty = np.zeros((batch, kv, 0, dh))
            if not self.static:
                return Snapshot(length, empty, empty)
            return Snapshot(length, empty, empty, np.zeros(cache.shape), np.zeros(cache.shape), None)
        k, v = keys.detach().numpy(), values.detach().numpy()
        if not self.static:
            return Snapshot(length, k.copy(), v.copy())
        return Snapshot(length, k[:, :, :length].copy(), v[:, :, :length].copy(), k.copy(), v.copy(),
                        (keys.data_ptr(), values.data_ptr()))

    def error_kind(self, error: BaseException) -> str | None:
        if self.static and isinstance(error, IndexError):
            return "full"  # index_copy_ past max_cache_len
        return None


# -- the decoder of spec §9-10, from Llama attention blocks ----------------------------------------------------

@dataclass(eq=False)
class Decoder:
    config: Any  # the suite's DecoderConfig
    hf: LlamaConfig
    embedding: torch.Tensor  # [vocab, D], also the output projection
    blocks: list[LlamaAttention]
    rotary: nn.Module

    def signature(self) -> str:
        digest = hashlib.sha256(self.embedding.numpy().tobytes())
        for block in self.blocks:
            for name in ("q", "k", "v", "o"):
                digest.update(getattr(block, f"{name}_proj").weight.detach().numpy().tobytes())
        return digest.hexdigest()

    def forward(self, tokens: list[int], cache: DynamicCache) -> np.ndarray:
        """Logits ``[T, vocab]`` of ``tokens``, placed after the cache's rows, which it extends."""
        past = _length(cache)
        hidden = self.embedding[torch.tensor(tokens)][None]  # [1, T, D]
        positions = torch.arange(past, past + len(tokens))[None]
        with torch.no_grad():
            cos_sin = self.rotary(hidden, positions)
            mask = _mask(cache, 1, len(tokens), past)
            for block in self.blocks:
                output, _ = block(hidden, cos_sin, mask, cache=cache)
                hidden = hidden + torch.tanh(output)
            return (hidden[0] @ self.embedding.T).numpy()


@dataclass(eq=False)
class Session:
    decoder: Decoder
    capacity: int
    cache: DynamicCache


@dataclass(eq=False)
class Entry:
    scope: str
    signature: str
    tokens: tuple[int, ...]
    cache: DynamicCache


@dataclass(frozen=True, eq=False)
class BlockRows:
    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


@dataclass(frozen=True, eq=False)
class StoreResult:
    logits: np.ndarray
    cut: int
    rows_computed: int
    full_rows: int
    entry: int | None


@dataclass(frozen=True, eq=False)
class StoreEntry:
    scope: str
    tokens: tuple[int, ...]
    blocks: tuple[BlockRows, ...]
    next_position: int


def _blocks(cache: DynamicCache, count: int) -> tuple[BlockRows, ...]:
    rows = []
    for index in range(count):
        layer = cache.layers[index]
        if layer.keys is None or layer.keys.numel() == 0:
            rows.append(BlockRows(np.zeros((0, 0, 0)), np.zeros((0, 0, 0)), np.zeros(0, dtype=np.int64)))
            continue
        keys, values = layer.keys[0].detach().numpy().copy(), layer.values[0].detach().numpy().copy()
        rows.append(BlockRows(keys, values, np.arange(keys.shape[1])))
    return tuple(rows)


class LlamaDecoderAdapter(LlamaLayerAdapter):
    """The layer adapter plus a decode session and a prefix store over ``DynamicCache``."""

    def __init__(self, float64_rope: bool = False) -> None:
        super().__init__(static=False, float64_rope=float64_rope)
        self.capabilities = self.capabilities | {"decode_session", "prefix_store", "positions_rope"}

    def create_decoder(self, config: Any, weights: Any) -> Decoder:
        hf = llama_config(config.heads, config.kv_heads, config.head_width, config.rope_base, config.max_positions,
                          blocks=config.blocks, vocab=config.vocab)
        blocks = [llama_attention(hf, i, block) for i, block in enumerate(weights.blocks)]
        return Decoder(config, hf, torch.from_numpy(np.array(weights.embedding)), blocks, self._rotary(hf))

    def update_block_weights(self, decoder: Decoder, block: int, weights: Any) -> None:
        write_weights(decoder.blocks[block], weights)

    def create_session(self, decoder: Decoder, capacity: int) -> Session:
        return Session(decoder, capacity, DynamicCache(config=decoder.hf))

    def prefill(self, session: Session, tokens: Any) -> np.ndarray:
        return session.decoder.forward(list(tokens), session.cache)

    def decode(self, session: Session, token: Any) -> np.ndarray:
        return session.decoder.forward([token], session.cache)[-1]

    def reset_session(self, session: Session) -> None:
        session.cache.reset()

    def session_state(self, session: Session) -> tuple[BlockRows, ...]:
        return _blocks(session.cache, len(session.decoder.blocks))

    def create_store(self, capacity: int) -> list[Any]:
        return [capacity]  # [capacity, entries...], oldest first

    def store_prefill(self, store: list[Any], decoder: Decoder, scope: str, tokens: Any) -> StoreResult:
        cache = DynamicCache(config=decoder.hf)
        logits = decoder.forward(list(tokens), cache)
        store.append(Entry(scope, decoder.signature(), tuple(tokens), cache))  # queries fork it with deepcopy
        del store[1:-store[0]]  # evict the oldest beyond capacity
        rows = 3 * len(decoder.blocks) * len(tokens)
        return StoreResult(logits, 0, rows, rows, None)

    def store_query(self, store: list[Any], decoder: Decoder, scope: str, tokens: Any) -> StoreResult:
        tokens = list(tokens)
        signature, best, longest = decoder.signature(), None, 0
        for index, entry in enumerate(store[1:]):  # oldest first: ">=" hands ties to the newest
            if entry.scope != scope or entry.signature != signature:
                continue
            common = 0
            while common < min(len(entry.tokens), len(tokens)) and entry.tokens[common] == tokens[common]:
                common += 1
            if common > 0 and common >= longest:  # the longest common prefix wins; the cap comes after
                best, longest = index, common
        cut = min(longest, len(tokens) - 1)  # at least the last token is recomputed
        best = best if cut > 0 else None
        cache = DynamicCache(config=decoder.hf)
        if best is not None:
            cache = copy.deepcopy(store[1 + best].cache)
            cache.crop(cut - len(store[1 + best].tokens))  # transformers 5: crop(-n) removes n rows
        logits = decoder.forward(tokens[cut:], cache)
        rows = 3 * len(decoder.blocks)
        return StoreResult(logits, cut, rows * (len(tokens) - cut), rows * len(tokens), best)

    def store_entries(self, store: list[Any]) -> list[StoreEntry]:
        return [StoreEntry(e.scope, e.tokens, _blocks(e.cache, len(e.cache.layers)), len(e.tokens))
                for e in store[1:]]


def dynamic_cache() -> LlamaDecoderAdapter:
    """Llama attention + DynamicCache; the decode session and prefix store (by ``crop``) too."""
    return LlamaDecoderAdapter()


def static_cache() -> LlamaLayerAdapter:
    """Llama attention + StaticCache (layer properties only)."""
    return LlamaLayerAdapter(static=True)


def dynamic_cache_float64_rope() -> LlamaDecoderAdapter:
    """As ``dynamic_cache``, with the RoPE table computed in float64 by the adapter."""
    return LlamaDecoderAdapter(float64_rope=True)


def static_cache_float64_rope() -> LlamaLayerAdapter:
    """As ``static_cache``, with the RoPE table computed in float64 by the adapter."""
    return LlamaLayerAdapter(static=True, float64_rope=True)
