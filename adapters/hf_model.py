"""Hugging Face transformers' ``LlamaForCausalLM`` as a whole-model adapter (docs/spec.md §15).

    KVCACHE_IMPL=adapters.hf_model:dynamic_cache pytest -n 0 properties/test_whole_model.py

The model is transformers' own ``LlamaForCausalLM`` (``sdpa`` attention, float64), its config set from the
suite's ``ModelConfig`` and its parameters overwritten with the suite's float64 weights, unchanged: they
are ``(out, in)`` as ``nn.Linear.weight`` is (no transpose); GQA, SwiGLU, RMSNorm, the tied or untied head
and the ``1/sqrt(dh)`` scale are transformers' own. Its RoPE rotates half-split pairs (``rotate_half``),
so ``rope_half_split`` is the pairing declared (interleaved weights could be taken by permuting the rows of
``wq`` and ``wk``, as transformers' conversion script does; not done: transformers has no interleaved RoPE).

A sequence is one cache (``DynamicCache`` or ``StaticCache``, batch 1) driven by
``model(ids, position_ids=..., cache=cache, use_cache=True)``: transformers' caches have one length for
every row of their batch, so sequences of different lengths cannot be rows of one cache, and the context
is ``per_sequence`` only. A batch mixing sequences is one forward per sequence. transformers 5.24
renamed ``past_key_values=`` to ``cache=`` (the old name warns); the causal mask's offset is the cache's
length, and ``position_ids`` only turn RoPE.

What is mapped onto transformers' own operations:

- ``clear``: ``cache.reset()`` of every sequence's cache.
- ``seq_keep``: ``cache.reset()`` of every other sequence's cache (no ``validates_sequence_ops``).
- ``seq_copy``: whole copies only (``copy_per_sequence: whole_only``), ``copy.deepcopy`` of the source's
  cache, as transformers' docs fork a prompt cache.
- ``seq_state``: a save is a ``copy.deepcopy`` of the cache (and the positions it holds); a load puts a
  deep copy of it in place of the sequence's cache.
- ``seq_remove`` only in ``*_crop`` factories: ``cache.crop(-n)`` removes the last ``n`` tokens; a removal
  that would leave rows after the range (from the start or the middle) is refused (``CropRefused``, kind
  ``refused``), changing nothing: transformers has nothing for it, and the factories declare
  ``model_policy["removal"] = "end_only"`` (docs/spec.md §15.7).

Not offered, because transformers does not do it: shifts and divides (keys are cached after RoPE and
there is no re-rotation; ``can_shift`` is false), range copies, unified contexts (one pool of cells for
every sequence), sliding windows (Llama has none), interleaved RoPE, validation of batches or sequence
operations (an id out of the vocabulary raises torch's ``IndexError`` inside the embedding, unmapped;
positions that do not run on are accepted).

``dynamic_cache_rows`` is the other layout: one ``DynamicCache`` whose batch rows are the sequences, as
``generate`` keeps beams. A batch is one forward, shorter rows padded (padding stays in the cache, masked
out), under a 4D mask; a whole copy is ``cache.reorder_cache`` (beam search's reorder). It declares copies
only: a keep or a removal there would be a mask the adapter keeps over rows still in the cache, a load would
need a row put into the cache (no such operation), and ``batch_select_indices`` shrinks the batch.

Glue the adapter adds, and says so:

- Llama's config refuses ``hidden_size % num_attention_heads != 0`` although ``head_dim`` is given: the
  adapter declares ``model_limits = {"model_width_divisible_by_heads": True}``, so the suite draws no other
  width (``head_dim`` still need not be ``hidden_size / heads``).
- All or nothing: a batch is several forwards (one per sequence), and a forward that raises after some
  layers were updated leaves them longer; on any exception every layer of every cache is cropped back to
  its length before the call (``layer.crop``). ``StaticLayer.update`` advances its length *before* the
  write that raises past ``max_cache_len`` (docs/hf-transformers/repro_rejected_update_moves_length.py),
  which the same crop undoes.
- ``*_float64`` factories (the default ones): transformers runs RMSNorm and the RoPE table in float32 even
  in a float64 model. Those two modules are replaced by the same formulas in float64, so the cache and the
  model's plumbing are judged at 1e-12. ``dynamic_cache_stock`` keeps transformers' float32 steps and
  declares both (``mixed_precision = {"rope": "float32", "norm": "float32"}``).

``StaticCache`` (``max_cache_len`` = the store's cells) declares ``fixed_capacity``: the ``IndexError`` its
layer raises from ``index_copy_`` past ``max_cache_len`` is mapped to ``full`` (only that one: the
traceback must end in ``StaticLayer.update``).
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import transformers
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, StaticCache

from kvcache_conformance.protocol.model import ContextConfig, ModelBatch, ModelConfig, ModelWeights

DTYPE = torch.float64
ATTENTION = "sdpa"  # eager runs its softmax in float32 even in a float64 model


class CacheFull(Exception):
    """A StaticCache's ``index_copy_`` past ``max_cache_len`` (an ``IndexError`` from ``StaticLayer.update``)."""


class CropRefused(NotImplementedError):
    """A removal ``crop`` cannot do: it would leave rows after the range (``removal: end_only``, kind ``refused``)."""


class Float64RMSNorm(nn.Module):
    """``LlamaRMSNorm``'s formula with every step in float64 (transformers casts to float32 first)."""

    def __init__(self, weight: np.ndarray, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.from_numpy(np.array(weight, dtype=np.float64)), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


class Float64Rotary(nn.Module):
    """``LlamaRotaryEmbedding``'s default formula (``inv_freq = base^(-2i/dh)``, ``cat(freqs, freqs)``) in float64."""

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        self.inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=DTYPE) / head_dim)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].to(DTYPE) * self.inv_freq  # [B, T, dh/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def llama_config(config: ModelConfig) -> LlamaConfig:
    """transformers' config of the suite's model (its width a multiple of the heads: ``model_limits``)."""
    hf = LlamaConfig(hidden_size=config.model_width, num_attention_heads=config.heads,
                     num_key_value_heads=config.kv_heads, head_dim=config.head_width,
                     num_hidden_layers=config.layers, intermediate_size=config.ffn_width, vocab_size=config.vocab,
                     max_position_embeddings=config.max_positions, rms_norm_eps=config.norm_eps,
                     hidden_act="silu", attention_bias=False, mlp_bias=False,
                     tie_word_embeddings=config.tied_output,
                     rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_base)},
                     attn_implementation=ATTENTION, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return hf


def set_projections(layer: Any, w: Any) -> None:
    """A decoder layer's attention and gated feed-forward matrices (Llama's and Gemma's modules name them alike)."""
    attention, mlp = layer.self_attn, layer.mlp
    for parameter, value in ((attention.q_proj, w.wq), (attention.k_proj, w.wk), (attention.v_proj, w.wv),
                             (attention.o_proj, w.wo), (mlp.gate_proj, w.w_gate), (mlp.up_proj, w.w_up),
                             (mlp.down_proj, w.w_down)):
        set_parameter(parameter.weight, value)


def set_parameter(parameter: torch.Tensor, array: np.ndarray) -> None:
    """Copy a float64 array into a parameter of the same shape (a mismatch is the adapter's error, not the engine's)."""
    value = torch.from_numpy(np.array(array, dtype=np.float64))
    if tuple(parameter.shape) != tuple(value.shape):
        raise ValueError(f"a parameter of shape {tuple(parameter.shape)} given {tuple(value.shape)}")
    parameter.copy_(value)


def llama_model(config: ModelConfig, weights: ModelWeights, *, float64_steps: bool = True) -> LlamaForCausalLM:
    """``LlamaForCausalLM`` holding exactly ``weights`` in float64 (``float64_steps``: RMSNorm and RoPE table too)."""
    if config.rope_style != "half_split":
        raise ValueError(f"transformers' Llama rotates half-split pairs, not {config.rope_style!r}")
    if config.window is not None:
        raise ValueError("LlamaForCausalLM has no sliding window")
    hf = llama_config(config)
    torch.manual_seed(0)  # the random initialisation is overwritten; seeded so nothing differs between runs
    model = LlamaForCausalLM(hf).to(DTYPE).eval()
    inner = model.model
    with torch.no_grad():
        set_parameter(inner.embed_tokens.weight, weights.embedding)
        for layer, w in zip(inner.layers, weights.layers):
            set_parameter(layer.input_layernorm.weight, w.attention_norm)
            set_parameter(layer.post_attention_layernorm.weight, w.ffn_norm)
            set_projections(layer, w)
        set_parameter(inner.norm.weight, weights.output_norm)
        if config.tied_output:
            if model.lm_head.weight.data_ptr() != inner.embed_tokens.weight.data_ptr():
                raise ValueError("tie_word_embeddings did not tie lm_head to the embedding")
        else:
            set_parameter(model.lm_head.weight, weights.output)
    if float64_steps:
        for layer, w in zip(inner.layers, weights.layers):
            layer.input_layernorm = Float64RMSNorm(w.attention_norm, config.norm_eps)
            layer.post_attention_layernorm = Float64RMSNorm(w.ffn_norm, config.norm_eps)
        inner.norm = Float64RMSNorm(weights.output_norm, config.norm_eps)
        inner.rotary_emb = Float64Rotary(config.head_width, config.rope_base)
    return model


@dataclass(eq=False)
class Store:
    """One sequence's cache and the positions of its rows (row i holds ``positions[i]``)."""

    cache: Any
    positions: list[int] = field(default_factory=list)


@dataclass(eq=False)
class Model:
    config: ModelConfig
    hf: LlamaForCausalLM


@dataclass(eq=False)
class Context:
    model: Model
    config: ContextConfig
    stores: list[Store]


def _lengths(store: Store) -> list[int]:
    return [int(layer.get_seq_length()) if layer.is_initialized else 0 for layer in store.cache.layers]


class HfModelAdapter:
    """``LlamaForCausalLM`` over one transformers cache per sequence."""

    version = transformers.__version__
    base_capabilities: ClassVar[frozenset[str]] = frozenset({"whole_model", "gqa", "rope_half_split", "seq_copy",
                                                              "seq_keep", "seq_state"})
    base_policy: ClassVar[dict[str, Any]] = {"contexts": ["per_sequence"], "shared_copies": False,
                                             "copy_per_sequence": "whole_only"}
    # LlamaConfig refuses hidden_size % num_attention_heads != 0, head_dim given or not
    model_limits: ClassVar[dict[str, Any]] = {"model_width_divisible_by_heads": True}

    def __init__(self, name: str, *, static: bool = False, float64_steps: bool = True, crop: bool = False,
                 roll_back: bool = True) -> None:
        self.name, self.static, self.float64_steps, self.crop = name, static, float64_steps, crop
        self.roll_back = roll_back
        self.model_policy: dict[str, Any] = dict(self.base_policy)
        capabilities = set(self.base_capabilities)
        if float64_steps:
            capabilities.add("float64")
        else:
            self.mixed_precision = {"rope": "float32", "norm": "float32"}
        if static:
            capabilities.add("fixed_capacity")
        if crop:
            capabilities.add("seq_remove")
            self.model_policy["removal"] = "end_only"  # crop removes the last rows only
        self.capabilities = frozenset(capabilities)

    # -- model and context -----------------------------------------------------------------------------------

    def create_model(self, config: ModelConfig, weights: ModelWeights) -> Model:
        return Model(config, self.build_model(config, weights))

    def build_model(self, config: ModelConfig, weights: ModelWeights) -> Any:
        """The transformers model holding exactly ``weights`` (an architecture's adapter builds its own)."""
        return llama_model(config, weights, float64_steps=self.float64_steps)

    def _cache(self, context_model: Model, cells: int) -> Any:
        if self.static:
            return StaticCache(config=context_model.hf.config, max_cache_len=cells)
        return DynamicCache(config=context_model.hf.config)

    def create_context(self, model: Model, config: ContextConfig) -> Context:
        if config.unified:
            raise ValueError("transformers' caches hold one sequence per cache here: per-sequence contexts only")
        cells = config.cells // config.max_sequences
        return Context(model, config, [Store(self._cache(model, cells)) for _ in range(config.max_sequences)])

    def context_cells(self, context: Context) -> int:
        return context.config.cells // context.config.max_sequences

    def _store(self, context: Context, seq: Any) -> Store:
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < len(context.stores):
            raise LookupError(f"no sequence {seq!r} in a context of {len(context.stores)}")  # never a negative index
        return context.stores[seq]

    # -- decoding --------------------------------------------------------------------------------------------

    def decode_batch(self, context: Context, batch: ModelBatch) -> np.ndarray:
        order: dict[Any, list[int]] = {}
        for index, seq in enumerate(batch.sequences):
            order.setdefault(seq, []).append(index)
        before = [(store, self.checkpoint(store), list(store.positions)) for store in context.stores]
        logits = np.zeros((len(batch.tokens), context.model.config.vocab))
        try:
            for seq, indices in order.items():
                store = self._store(context, seq)
                ids = torch.tensor([[batch.tokens[i] for i in indices]], dtype=torch.long)
                positions = [batch.positions[i] for i in indices]
                with torch.no_grad():
                    out = context.model.hf(input_ids=ids, position_ids=torch.tensor([positions], dtype=torch.long),
                                           cache=store.cache, use_cache=True)
                store.positions.extend(positions)
                logits[indices] = out.logits[0].detach().numpy()
        except BaseException as error:
            for store, checkpoint, positions in before if self.roll_back else ():
                self.restore(store, checkpoint)
                store.positions = positions
            if self.static and isinstance(error, IndexError) and _raised_in_static_update(error):
                raise CacheFull(f"StaticCache past max_cache_len: {error}") from error
            raise
        return logits[[bool(w) for w in batch.logits]]

    def checkpoint(self, store: Store) -> Any:
        """What ``restore`` needs to put ``store``'s cache back as it is now: here each layer's length."""
        return _lengths(store)

    def restore(self, store: Store, checkpoint: Any) -> None:
        """Undo a forward that raised: crop every layer back to its length (5.24: ``crop(-n)`` removes n rows)."""
        for layer, length in zip(store.cache.layers, checkpoint):
            now = int(layer.get_seq_length()) if layer.is_initialized else 0
            if now != length:
                layer.crop(length - now)

    # -- what every whole model has -------------------------------------------------------------------------

    def clear(self, context: Context) -> None:
        for store in context.stores:
            store.cache.reset()
            store.positions = []

    def seq_pos_min(self, context: Context, seq: int) -> int:
        return min(self._store(context, seq).positions, default=-1)

    def seq_pos_max(self, context: Context, seq: int) -> int:
        return max(self._store(context, seq).positions, default=-1)

    def can_shift(self, context: Context) -> bool:
        return False

    # -- sequence operations ---------------------------------------------------------------------------------

    def seq_keep(self, context: Context, seq: int) -> None:
        for index, store in enumerate(context.stores):
            if index != seq:
                store.cache.reset()
                store.positions = []

    def seq_copy(self, context: Context, src: int, dst: int, p0: int, p1: int) -> None:
        if (p0 >= 0 or p1 >= 0) and not (p0 <= 0 and p1 < 0):
            raise NotImplementedError("transformers copies a whole cache (deepcopy), not a range of it")
        source = self._store(context, src)
        if source is self._store(context, dst):
            return
        context.stores[dst] = Store(copy.deepcopy(source.cache), list(source.positions))

    def seq_remove(self, context: Context, seq: int, p0: int, p1: int) -> None:
        if not self.crop:
            raise NotImplementedError("seq_remove is not declared")
        stores = context.stores if seq < 0 else [self._store(context, seq)]
        low, high = (0 if p0 < 0 else p0), (float("inf") if p1 < 0 else p1)
        plans = []
        for store in stores:
            gone = [low <= p < high for p in store.positions]
            n = sum(gone)
            if n and not all(gone[len(gone) - n:]):
                raise CropRefused(f"removing positions [{p0}, {p1}) of {store.positions[0]}..{store.positions[-1]}: "
                                  "transformers' crop removes the last rows only")
            refusal = self.crop_refusal(store, n) if n else None
            if refusal:
                raise CropRefused(f"removing positions [{p0}, {p1}) of {store.positions[0]}..{store.positions[-1]}: "
                                  f"{refusal}")
            plans.append((store, n))
        for store, n in plans:
            if n:
                self.crop_rows(store, n)
                del store.positions[len(store.positions) - n:]

    def crop_refusal(self, store: Store, n: int) -> str | None:
        """Why removing ``store``'s last ``n`` rows is refused (None: it is done); checked for every store first."""
        return None

    def crop_rows(self, store: Store, n: int) -> None:
        """Remove ``store``'s last ``n`` rows with transformers' own ``crop``."""
        store.cache.crop(-n)

    def save_sequence(self, context: Context, seq: int) -> Any:
        store = self._store(context, seq)
        return copy.deepcopy(store.cache), list(store.positions)

    def load_sequence(self, context: Context, seq: int, state: Any) -> None:
        self._store(context, seq)
        cache, positions = state
        context.stores[seq] = Store(self.loaded_cache(context, cache), list(positions))

    def loaded_cache(self, context: Context, cache: Any) -> Any:
        """A saved cache as a store of ``context``: a deep copy; a ``StaticCache`` saved from a context of another
        capacity is rebuilt at this one's (the saved one's buffers would keep the old room), its rows written in by
        each layer's own ``update``; more rows than a full layer's room is ``full``, changing nothing."""
        fresh = self._cache(context.model, self.context_cells(context)) if self.static else None
        if fresh is None or [layer.max_cache_len for layer in fresh.layers] == [layer.max_cache_len
                                                                               for layer in cache.layers]:
            return copy.deepcopy(cache)
        for saved, layer in zip(cache.layers, fresh.layers):
            rows = static_rows(saved)
            if rows > layer.max_cache_len and not getattr(layer, "is_sliding", False):
                raise CacheFull(f"a saved state of {rows} rows into a StaticCache of {layer.max_cache_len}")
        for saved, layer in zip(cache.layers, fresh.layers):
            rows = static_rows(saved)
            if rows:
                layer.update(saved.keys[:, :, :rows].clone(), saved.values[:, :, :rows].clone())
        return fresh

    def error_kind(self, error: BaseException) -> str | None:
        if isinstance(error, CacheFull):
            return "full"
        return "refused" if isinstance(error, CropRefused) else None


@dataclass(eq=False)
class RowsContext:
    """Every sequence a row of one ``DynamicCache``: all rows have the same slots; a slot of a row is a cell of
    that sequence (``valid``) or padding its batch needed (never seen again), at ``positions``."""

    model: Model
    config: ContextConfig
    cache: Any
    valid: list[list[bool]]
    positions: list[list[int]]


class HfRowsAdapter(HfModelAdapter):
    """``LlamaForCausalLM`` over one ``DynamicCache`` whose batch rows are the sequences (as ``generate`` keeps
    beams): a batch is one forward of ``[sequences, longest]`` tokens, shorter rows padded, with a 4D boolean
    mask (transformers passes a 4D mask through as it is) letting each token see its own row's cells at
    positions up to its own and its row's earlier tokens of the batch; a padding token sees only itself. A
    whole copy is ``cache.reorder_cache(index)`` with ``index[dst] = src`` (beam search's reorder). Nothing
    else: a keep or a removal would be a mask over rows that stay in the cache, and a load would need a row
    put into a cache, which transformers has no operation for; ``batch_select_indices`` shrinks the batch, so
    it serves no sequence operation here either."""

    base_capabilities = frozenset({"whole_model", "gqa", "rope_half_split", "seq_copy"})

    def create_context(self, model: Model, config: ContextConfig) -> RowsContext:
        if config.unified:
            raise ValueError("one row of the cache per sequence: per-sequence contexts only")
        rows = config.max_sequences
        return RowsContext(model, config, self.rows_cache(model), [[] for _ in range(rows)], [[] for _ in range(rows)])

    def rows_cache(self, model: Model) -> Any:
        """The one cache whose batch rows are the sequences."""
        return DynamicCache(config=model.hf.config)

    def _row(self, context: RowsContext, seq: Any) -> int:
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < len(context.valid):
            raise LookupError(f"no sequence {seq!r} in a context of {len(context.valid)}")
        return seq

    def decode_batch(self, context: RowsContext, batch: ModelBatch) -> np.ndarray:
        rows, slots = len(context.valid), len(context.valid[0])
        mine: list[list[int]] = [[] for _ in range(rows)]  # batch indices of each row's tokens, in batch order
        for index, seq in enumerate(batch.sequences):
            mine[self._row(context, seq)].append(index)
        longest = max(map(len, mine), default=0)
        ids = torch.zeros((rows, longest), dtype=torch.long)
        positions = torch.zeros((rows, longest), dtype=torch.long)
        for row, indices in enumerate(mine):
            for j, index in enumerate(indices):
                ids[row, j], positions[row, j] = batch.tokens[index], batch.positions[index]
        out = _forward_rolled_back(context, slots, input_ids=ids, position_ids=positions,
                                   attention_mask=self.attention_mask(context, mine, positions))
        logits = np.zeros((len(batch.tokens), context.model.config.vocab))
        for row, indices in enumerate(mine):
            for j, index in enumerate(indices):
                logits[index] = out.logits[row, j].detach().numpy()
            context.valid[row] += [j < len(indices) for j in range(longest)]
            context.positions[row] += [int(p) for p in positions[row]]
        return logits[[bool(w) for w in batch.logits]]

    def attention_mask(self, context: RowsContext, mine: list[list[int]], positions: torch.Tensor) -> Any:
        """The 4D mask of a batch (``mine``: each row's tokens, at ``positions [rows, longest]``)."""
        return self.visibility(context, mine, positions, None)

    def visibility(self, context: RowsContext, mine: list[list[int]], positions: torch.Tensor,
                   window: int | None) -> torch.Tensor:
        """``[rows, 1, longest, slots + longest]``: a token sees its row's cells at positions up to its own (and
        within ``window``) and its row's earlier tokens of the batch (within ``window``); padding sees itself."""
        rows, longest = positions.shape
        slots = len(context.valid[0])
        mask = torch.zeros((rows, 1, longest, slots + longest), dtype=torch.bool)

        def near(query: int, key: int) -> bool:
            return key <= query and (window is None or query - key < window)

        for row, indices in enumerate(mine):
            for j in range(len(indices)):
                query = int(positions[row, j])
                for t in range(slots):
                    mask[row, 0, j, t] = context.valid[row][t] and near(query, context.positions[row][t])
                for i in range(j + 1):
                    mask[row, 0, j, slots + i] = near(query, int(positions[row, i]))
            for j in range(len(indices), longest):
                mask[row, 0, j, slots + j] = True  # padding sees itself only (no empty softmax)
        return mask

    def clear(self, context: RowsContext) -> None:
        context.cache.reset()
        context.valid = [[] for _ in context.valid]
        context.positions = [[] for _ in context.positions]

    def _held(self, context: RowsContext, seq: int) -> list[int]:
        row = self._row(context, seq)
        return [p for p, v in zip(context.positions[row], context.valid[row]) if v]

    def seq_pos_min(self, context: RowsContext, seq: int) -> int:
        return min(self._held(context, seq), default=-1)

    def seq_pos_max(self, context: RowsContext, seq: int) -> int:
        return max(self._held(context, seq), default=-1)

    def seq_copy(self, context: RowsContext, src: int, dst: int, p0: int, p1: int) -> None:
        if (p0 >= 0 or p1 >= 0) and not (p0 <= 0 and p1 < 0):
            raise NotImplementedError("reorder_cache copies a whole row, not a range of it")
        src, dst = self._row(context, src), self._row(context, dst)
        if src == dst:
            return
        index = list(range(len(context.valid)))
        index[dst] = src
        context.cache.reorder_cache(torch.tensor(index))
        context.valid[dst], context.positions[dst] = list(context.valid[src]), list(context.positions[src])


class HfPaddedRowsAdapter(HfRowsAdapter):
    """As ``HfRowsAdapter``, each batch laid out as ``generate`` lays out a batch of prompts (docs/spec.md §13.8's
    layout at model level): a row's tokens **left**-padded to the batch's longest, generate's 2-D
    ``attention_mask`` over every column the cache holds (1: a token of the row's sequence, 0: padding), handed to
    the model, which builds its 4-D mask with its own ``create_causal_mask``; positions computed from that mask as
    ``_prepare_position_ids_for_generation`` does (``cumsum - 1``, padding at 0), never taken from the batch: the
    engine numbers positions itself, so ``model_policy["positions"] = "from_zero"`` is declared."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model_policy["positions"] = "from_zero"

    def decode_batch(self, context: RowsContext, batch: ModelBatch) -> np.ndarray:
        rows, slots = len(context.valid), len(context.valid[0])
        mine: list[list[int]] = [[] for _ in range(rows)]
        for index, seq in enumerate(batch.sequences):
            mine[self._row(context, seq)].append(index)
        longest = max(map(len, mine), default=0)
        ids = torch.zeros((rows, longest), dtype=torch.long)
        new = torch.zeros((rows, longest), dtype=torch.long)
        for row, indices in enumerate(mine):
            start = longest - len(indices)
            for j, index in enumerate(indices):
                ids[row, start + j], new[row, start + j] = batch.tokens[index], 1
        held = torch.tensor([[int(v) for v in row] for row in context.valid], dtype=torch.long).reshape(rows, slots)
        mask = torch.cat([held, new], dim=1)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, slots:]
        out = _forward_rolled_back(context, slots, input_ids=ids, position_ids=positions, attention_mask=mask)
        logits = np.zeros((len(batch.tokens), context.model.config.vocab))
        for row, indices in enumerate(mine):
            start = longest - len(indices)
            for j, index in enumerate(indices):
                logits[index] = out.logits[row, start + j].detach().numpy()
            context.valid[row] += [bool(v) for v in new[row]]
            context.positions[row] += [int(p) for p in positions[row]]
        return logits[[bool(w) for w in batch.logits]]


def static_rows(layer: Any) -> int:
    """The rows a static layer holds, oldest first from slot 0 (a sliding ring's: at most its length)."""
    if not layer.is_initialized:
        return 0
    return min(int(layer.get_seq_length()), layer.max_cache_len)


def _raised_in_static_update(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return any(frame.name == "update" and frame.filename.endswith("cache_utils.py") for frame in frames[-3:])


# -- factories -------------------------------------------------------------------------------------------------

def dynamic_cache() -> HfModelAdapter:
    """LlamaForCausalLM + DynamicCache per sequence, RMSNorm and RoPE table in float64: judged at 1e-12."""
    return HfModelAdapter("hf-llama-model-dynamic-cache")


def static_cache() -> HfModelAdapter:
    """As ``dynamic_cache`` over StaticCache (max_cache_len = the store's cells): fixed_capacity."""
    return HfModelAdapter("hf-llama-model-static-cache", static=True)


def dynamic_cache_crop() -> HfModelAdapter:
    """As ``dynamic_cache``, declaring seq_remove by crop and ``removal: end_only``: a removal from the start or
    the middle is refused."""
    return HfModelAdapter("hf-llama-model-dynamic-cache-crop", crop=True)


def static_cache_crop() -> HfModelAdapter:
    """As ``static_cache``, declaring seq_remove by crop and ``removal: end_only``."""
    return HfModelAdapter("hf-llama-model-static-cache-crop", static=True, crop=True)


def static_cache_no_roll_back() -> HfModelAdapter:
    """As ``static_cache``, leaving the caches as transformers left them when a forward raised (positions too)."""
    return HfModelAdapter("hf-llama-model-static-cache-no-roll-back", static=True, roll_back=False)


def dynamic_cache_rows() -> HfRowsAdapter:
    """One DynamicCache whose rows are the sequences (padded batches, a 4D mask); copies by reorder_cache."""
    return HfRowsAdapter("hf-llama-model-dynamic-cache-rows")


def dynamic_cache_padded() -> HfPaddedRowsAdapter:
    """One DynamicCache whose rows are the sequences, each batch left-padded under generate's 2-D attention_mask
    and positions (``positions: from_zero``); copies by reorder_cache."""
    return HfPaddedRowsAdapter("hf-llama-model-dynamic-cache-padded")


def dynamic_cache_stock() -> HfModelAdapter:
    """transformers' numerics untouched (float32 RMSNorm and RoPE table), declaring both."""
    return HfModelAdapter("hf-llama-model-dynamic-cache-stock", float64_steps=False)


def _forward_rolled_back(context: Any, slots: int, **inputs: Any) -> Any:
    """The model's forward over the context's cache; where it raises, every layer cropped back to ``slots`` columns
    (a call that raises changes nothing, docs/spec.md §5.1)."""
    try:
        with torch.no_grad():
            return context.model.hf(**inputs, cache=context.cache, use_cache=True)
    except BaseException:
        for layer in context.cache.layers:
            now = int(layer.get_seq_length()) if layer.is_initialized else 0
            if now != slots:
                layer.crop(slots - now)
        raise
