"""An adapter that drives litgpt's own attention and ``KVCache`` (litgpt 0.5.13, torch 2.13.0+cpu, float64).

    pip install -e '.[litgpt]'        # litgpt==0.5.13, torch==2.13.0 (CPU), Python 3.11
    KVCACHE_IMPL=adapters.litgpt_kvcache:make_adapter pytest -n 2 properties/

The layer is ``litgpt.model.CausalSelfAttention`` (fused ``qkv`` and ``proj``
``nn.Linear``, litgpt's ``apply_rope`` / ``apply_rope_interleave``, SDPA),
cast to float64, with a ``KVCache`` from its own ``build_kv_cache``
attached. Around each call the adapter does what ``GPT.forward`` does for
a block: cos/sin rows selected from the ``build_rope_cache`` table, the mask
rows ``mask_cache[input_pos][..., :input_pos_maxp1]`` from
``build_mask_cache``, and ``input_pos_maxp1`` = last position + 1. litgpt's
cache holds no length (``generate`` tracks the position); the adapter's
counter plays that role. ``reset`` is what litgpt's chat and generate loops
do between prompts: ``kv_cache.reset_parameters()``, which zeroes both
buffers in place.

What litgpt's ``KVCache`` does, and so what is declared:

- ``[B, KV, C, dh]`` buffers preallocated by ``build_kv_cache``:
  ``fixed_capacity``, ``physical_storage``, ``reset_keeps_buffers``,
  ``reset_zeroes``. Past the capacity litgpt raises from its own index
  selection (``IndexError`` "index out of range in self") or from ``GPT.forward``'s
  check (``ValueError`` "Positions in 'input_pos' must be in"), before
  anything is written: both are mapped to ``full``.
- both RoPE pairings (``rope_interleave``), partial rotary
  (``rope_n_elem``), GQA/MQA (``n_query_groups``): ``rope_half_split``,
  ``rope_interleaved``, ``partial_rotary``, ``gqa``.
- the decoder of docs/spec.md §2.4 (embedding, blocks of litgpt attention
  with ``tanh`` residuals, tied logits; the glue is the embedding, the
  residual and the logits), one ``KVCache`` per block: ``decode_session``,
  ``positions_rope``, and ``sliding_window``: litgpt's sliding-window
  ``KVCache`` is a ring of min(capacity, W) slots, position p in slot p % W.
- no input validation, no non-finite rejection, no binding checks, no typed
  creation errors, no prefix store, no sinusoidal positions: not declared,
  so the suite skips what needs them and judges only what every cache owes.

Precision: ``build_rope_cache`` computes angles, cos and sin in float32
(``base ** (arange(...).float() / n)``; ``GPT.to(torch.float64)`` casts the
finished table), and the rotation runs in float64. ``make_adapter`` declares
exactly that, ``mixed_precision = {"rope": "float32"}`` (docs/spec.md §8.4);
``make_float64_rope_adapter`` builds the table with litgpt's formula in
float64 and claims ``float64`` (docs/spec.md §8.2), to judge the cache at
1e-12 apart from the table's rounding.

Interleaved RoPE: ``apply_rope_interleave`` regroups the rotary features of
queries and keys as [evens | odds] and rotates them ``rotate_half``-style,
so litgpt's cache stores every key with its rotary features permuted. The
scores are unchanged (queries and keys are permuted alike), and the suite's
snapshots speak the model's feature order (docs/spec.md §4.3: a stored
permutation, like a transposition, is a storage layout, not judged), so the
snapshot undoes it, logical and physical rows alike. Values are not permuted.

Sliding window: litgpt refuses a multi-token forward longer than the window
(``ValueError`` "Prefill length ... exceeds the sliding window size ...
Please use chunked prefill with chunk size <= W"). The session's ``prefill``
follows that advice: a prompt longer than the window is fed in chunks of W
tokens, each a litgpt forward with its own ``input_pos``. The finding this
exposes (docs/litgpt/README.md): once the ring has wrapped, a chunk of more
than one token is attended with a mask whose columns are absolute positions,
not ring slots. ``make_no_window_adapter`` does not declare
``sliding_window``, to show that sessions conform without windows.
``make_whole_prompt_adapter`` feeds every prompt in one forward, as litgpt's
``generate`` does, and declares ``prefill_within_window`` (docs/spec.md
§9.4): litgpt's refusal of a longer one is then allowed, as ``refused``,
where it changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version as _version
from typing import Any, ClassVar

import numpy as np
import torch
from litgpt.config import Config
from litgpt.model import CausalSelfAttention, KVCache, batched_index_select, build_mask_cache, build_rope_cache

DTYPE = torch.float64
VERSION = f"litgpt {_version('litgpt')}, torch {torch.__version__}"


def config_fields(heads: int, kv_heads: int, head_width: int, model_width: int, rope: Any,
                  window: int | None = None) -> dict[str, Any]:
    """litgpt's ``Config`` keywords for one attention layer at the suite's widths (bias-free, like the oracle), but
    the RoPE pairing: every release from 0.5.11 on takes these (``rope_interleave`` came in 0.5.13)."""
    return dict(n_embd=model_width, n_head=heads, n_query_groups=kv_heads, head_size=head_width,
                bias=False, attn_bias=False, n_layer=1, block_size=rope.max_positions,
                rotary_percentage=rope.rotary_width / head_width, rope_base=rope.base, vocab_size=1,
                padded_vocab_size=1, sliding_window_size=window,
                sliding_window_indices=None if window is None else [1])


def _interleave_order(head_width: int, rotary_width: int) -> np.ndarray:
    """Where ``apply_rope_interleave`` puts features: stored slot j holds model feature ``order[j]``."""
    return np.concatenate([np.arange(0, rotary_width, 2), np.arange(1, rotary_width, 2),
                           np.arange(rotary_width, head_width)])


def _write(attention: CausalSelfAttention, weights: Any) -> None:
    """The suite's ``x @ W`` matrices into litgpt's ``nn.Linear`` weights (``x @ W.T``), in place."""
    qkv = np.concatenate([weights.wq, weights.wk, weights.wv], axis=1)
    with torch.no_grad():
        attention.qkv.weight.copy_(torch.from_numpy(np.ascontiguousarray(qkv.T)))
        attention.proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(np.asarray(weights.wo).T)))


@dataclass(eq=False)
class Layer:
    attention: CausalSelfAttention
    rope: Any  # the suite's RopeConfig
    cos: torch.Tensor  # [max_positions, rotary width], as GPT.cos after GPT.to(float64)
    sin: torch.Tensor


@dataclass(eq=False)
class Cache:
    kv: KVCache
    mask_cache: torch.Tensor  # build_mask_cache(capacity), as GPT.set_kv_cache makes it
    layer: Layer
    length: int = 0  # the position counter litgpt's generate loop keeps


@dataclass(frozen=True, eq=False)
class Snapshot:
    length: int
    keys: np.ndarray
    values: np.ndarray
    physical_keys: np.ndarray
    physical_values: np.ndarray
    buffer_identity: Any


@dataclass(eq=False)
class Decoder:
    config: Any  # the suite's DecoderConfig
    embedding: torch.Tensor  # [vocab, D], also the output projection
    layers: list[Layer]


@dataclass(eq=False)
class Session:
    decoder: Decoder
    caches: list[Cache]
    mask_cache: torch.Tensor
    capacity: int
    length: int = 0


@dataclass(frozen=True, eq=False)
class BlockRows:
    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


class LitGptAdapter:
    """litgpt as is: the RoPE table in float32, declared as mixed precision."""

    name = "litgpt-kvcache"
    version = VERSION
    dtype = "float64"
    mixed_precision: ClassVar[dict[str, str]] = {"rope": "float32"}
    capabilities = frozenset({
        "rope_half_split", "rope_interleaved", "partial_rotary", "gqa",
        "fixed_capacity", "physical_storage", "reset_keeps_buffers", "reset_zeroes",
        "decode_session", "positions_rope", "sliding_window",
    })
    float64_table = False
    whole_prompts = False  # a prompt longer than the window in chunks of W (litgpt's advice), or in one forward

    # -- layers --------------------------------------------------------------------------------------------------

    def _table(self, config: Config) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.float64_table:
            cos, sin = build_rope_cache(seq_len=config.block_size, n_elem=config.rope_n_elem, base=config.rope_base)
            return cos.to(DTYPE), sin.to(DTYPE)  # what GPT.to(torch.float64) does to its buffers
        n = config.rope_n_elem  # build_rope_cache's formula, every step in float64
        theta = 1.0 / (config.rope_base ** (torch.arange(0, n, 2, dtype=DTYPE) / n))
        angles = torch.outer(torch.arange(config.block_size, dtype=DTYPE), theta).repeat(1, 2)
        return torch.cos(angles), torch.sin(angles)

    def layer_config(self, heads: int, kv_heads: int, head_width: int, model_width: int, rope: Any,
                     window: int | None = None) -> Config:
        """litgpt's ``Config`` for one attention layer (``config_fields``), the pairing as ``rope_interleave``."""
        config = Config(**config_fields(heads, kv_heads, head_width, model_width, rope, window),
                        rope_interleave=rope.style == "interleaved")
        config.rope_n_elem = rope.rotary_width  # int(r / dh * dh) may round down
        return config

    def _layer(self, weights: Any, rope: Any, window: int | None = None) -> Layer:
        heads = weights.heads
        config = self.layer_config(heads, weights.kv_heads, weights.wq.shape[1] // heads, weights.wq.shape[0], rope,
                                   window)
        attention = CausalSelfAttention(config, block_idx=0).to(DTYPE)
        _write(attention, weights)
        return Layer(attention, rope, *self._table(config))

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        return self._layer(weights, rope)

    def recreate_layer(self, layer: Layer) -> Layer:
        attention = CausalSelfAttention(layer.attention.config, block_idx=0).to(DTYPE)
        attention.load_state_dict(layer.attention.state_dict())  # new parameter objects, equal values
        return Layer(attention, layer.rope, layer.cos, layer.sin)

    def with_rope(self, layer: Layer, rope: Any) -> Layer:
        old = layer.attention.config
        config = self.layer_config(old.n_head, old.n_query_groups, old.head_size, old.n_embd, rope)
        attention = CausalSelfAttention(config, block_idx=0).to(DTYPE)
        attention.qkv, attention.proj = layer.attention.qkv, layer.attention.proj  # the same parameter objects
        return Layer(attention, rope, *self._table(config))

    def update_weights(self, layer: Layer, weights: Any) -> None:
        _write(layer.attention, weights)

    # -- caches --------------------------------------------------------------------------------------------------

    def create_cache(self, layer: Layer, batch_size: int, capacity: int) -> Cache:
        config = layer.attention.config
        if capacity > config.block_size:  # GPT.max_seq_length's own check
            raise ValueError(f"Cannot attend to {capacity}, block size is only {config.block_size}.")
        kv = layer.attention.build_kv_cache(batch_size, capacity, rope_cache_length=config.rope_n_elem, dtype=DTYPE)
        return Cache(kv, build_mask_cache(capacity), layer)

    def _forward(self, layer: Layer, kv: KVCache, mask_cache: torch.Tensor, hidden: torch.Tensor,
                 start: int) -> torch.Tensor:
        """One litgpt attention forward of ``hidden [B, T, D]`` at positions ``start..``, as ``GPT.forward``."""
        input_pos = torch.arange(start, start + hidden.shape[1])
        input_pos_maxp1 = start + hidden.shape[1]
        cos = batched_index_select(layer.cos, 0, input_pos).unsqueeze(0)
        sin = batched_index_select(layer.sin, 0, input_pos).unsqueeze(0)
        mask = batched_index_select(mask_cache, 2, input_pos)
        if input_pos_maxp1 > mask_cache.shape[-1]:
            raise ValueError(f"Positions in 'input_pos' must be in [0,{mask_cache.shape[-1]})")
        layer.attention.kv_cache = kv
        return layer.attention(hidden, cos, sin, mask[..., :input_pos_maxp1], input_pos, input_pos_maxp1)

    def step(self, layer: Layer, cache: Cache, x: np.ndarray) -> np.ndarray:
        hidden = torch.tensor(np.array(x, copy=True) if isinstance(x, np.ndarray) else x)
        with torch.no_grad():
            output = self._forward(layer, cache.kv, cache.mask_cache, hidden, cache.length)
        cache.length += hidden.shape[1]
        return output.numpy()

    def reset(self, cache: Cache) -> None:
        cache.kv.reset_parameters()  # what litgpt's chat and generate loops do between prompts
        cache.length = 0

    def snapshot(self, cache: Cache) -> Snapshot:
        keys, values = cache.kv.k.numpy().copy(), cache.kv.v.numpy().copy()
        config = cache.layer.attention.config
        if config.rope_interleave:  # litgpt's storage order -> the model's feature order (docs/spec.md §4.3)
            stored = keys
            keys = np.empty_like(stored)
            keys[..., _interleave_order(config.head_size, config.rope_n_elem)] = stored
        n = cache.length
        return Snapshot(n, keys[:, :, :n].copy(), values[:, :, :n].copy(), keys, values,
                        (cache.kv.k.data_ptr(), cache.kv.v.data_ptr()))

    def error_kind(self, error: BaseException) -> str | None:
        if isinstance(error, IndexError) and "index out of range in self" in str(error):
            return "full"  # a position past the mask or RoPE table
        if isinstance(error, ValueError) and "Positions in 'input_pos' must be in" in str(error):
            return "full"  # GPT.forward's input_pos_maxp1 check
        if isinstance(error, ValueError) and "exceeds the sliding window size" in str(error):
            return "refused"  # KVCache.forward, before its ring write: a prefill longer than the window (0.5.13 on)
        return None

    # -- the decoder of docs/spec.md §2.4: litgpt attention and KVCache per block, glue for the rest -------------

    def create_decoder(self, config: Any, weights: Any) -> Decoder:
        layers = [self._layer(block, config.rope, config.window) for block in weights.blocks]
        return Decoder(config, torch.from_numpy(np.array(weights.embedding, dtype=np.float64)), layers)

    def update_block_weights(self, decoder: Decoder, block: int, weights: Any) -> None:
        _write(decoder.layers[block].attention, weights)

    def create_session(self, decoder: Decoder, capacity: int) -> Session:
        return Session(decoder, [self.create_cache(layer, 1, capacity) for layer in decoder.layers],
                       build_mask_cache(capacity), capacity)

    def prefill(self, session: Session, tokens: Any) -> np.ndarray:
        decoder, start = session.decoder, session.length
        ids = torch.as_tensor(np.asarray(tokens))
        if ids.dim() != 1:
            raise ValueError("tokens must be a 1-D sequence")
        count = ids.shape[0]
        if start + count > session.capacity:
            raise ValueError(f"Positions in 'input_pos' must be in [0,{session.capacity})")
        hidden = torch.nn.functional.embedding(ids, decoder.embedding)[None]  # [1, T, D]; bad ids raise here
        window = decoder.config.window
        size = count if window is None or self.whole_prompts else window  # "chunked prefill with chunk size <= W"
        outputs = []
        with torch.no_grad():
            for first in range(0, count, size):
                chunk = hidden[:, first:first + size]
                for layer, cache in zip(decoder.layers, session.caches):
                    chunk = chunk + torch.tanh(self._forward(layer, cache.kv, session.mask_cache, chunk,
                                                             start + first))
                outputs.append(chunk)
        session.length = start + count
        for cache in session.caches:
            cache.length = session.length
        return (torch.cat(outputs, dim=1)[0] @ decoder.embedding.T).numpy()

    def decode(self, session: Session, token: Any) -> np.ndarray:
        return self.prefill(session, [token])[0]

    def reset_session(self, session: Session) -> None:
        for cache in session.caches:
            self.reset(cache)
        session.length = 0

    def session_state(self, session: Session) -> tuple[BlockRows, ...]:
        rows = []
        for cache in session.caches:
            snapshot = self.snapshot(cache)  # keys in the model's feature order
            window = cache.layer.attention.config.sliding_window_size if cache.kv.is_sliding_window else None
            positions = np.arange(0 if window is None else max(0, session.length - window), session.length)
            slots = positions % cache.kv.max_cache_len  # the ring; without a window, slot = position
            rows.append(BlockRows(snapshot.physical_keys[0][:, slots].copy(),
                                  snapshot.physical_values[0][:, slots].copy(), positions))
        return tuple(rows)


class Float64RopeAdapter(LitGptAdapter):
    """As ``LitGptAdapter``, with litgpt's RoPE formula evaluated in float64: judged at 1e-12."""

    name = "litgpt-kvcache-float64-rope"
    mixed_precision: ClassVar[dict[str, str]] = {}
    capabilities = LitGptAdapter.capabilities | {"float64"}
    float64_table = True


class NoWindowAdapter(LitGptAdapter):
    """As ``LitGptAdapter``, declaring no sliding window: decoders are drawn without one."""

    name = "litgpt-kvcache-no-window"
    capabilities = LitGptAdapter.capabilities - {"sliding_window"}


class WholePromptAdapter(LitGptAdapter):
    """As ``LitGptAdapter``, with every prompt one litgpt forward (as ``generate`` passes it), declaring that a
    prompt longer than the window may be refused (``prefill_within_window``)."""

    name = "litgpt-kvcache-whole-prompt"
    capabilities = LitGptAdapter.capabilities | {"prefill_within_window"}
    whole_prompts = True


def make_adapter() -> LitGptAdapter:
    """litgpt as is (RoPE table in float32, declared as ``mixed_precision``)."""
    return LitGptAdapter()


def make_float64_rope_adapter() -> LitGptAdapter:
    """litgpt with its RoPE table computed in float64 by the adapter; claims ``float64``."""
    return Float64RopeAdapter()


def make_no_window_adapter() -> LitGptAdapter:
    """litgpt as is, without ``sliding_window``: isolates the ring-buffer finding."""
    return NoWindowAdapter()


def make_whole_prompt_adapter() -> LitGptAdapter:
    """litgpt as is, every prompt in one forward: a longer one than the window is refused, as declared."""
    return WholePromptAdapter()
