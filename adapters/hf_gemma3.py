"""Hugging Face transformers' ``Gemma3ForCausalLM`` (text only) as a whole-model adapter: sliding and full layers.

    KVCACHE_IMPL=adapters.hf_gemma3:dynamic_cache pytest -n 0 properties/test_whole_model.py

Issue 37, item 5. The model is transformers' own ``Gemma3ForCausalLM`` (``sdpa``, float64) built from a
``Gemma3TextConfig`` set from the suite's ``ModelConfig`` (its Gemma-3 fields: ``window_pattern``,
``local_rope_base``, ``embedding_scale``, ``qk_norm``, ``post_norms``, ``activation``; docs/spec.md §15.1),
with the suite's float64 weights copied in; nothing is downloaded. The machinery (a cache per sequence,
forwards by ``model(ids, position_ids=..., cache=..., use_cache=True)``, copies and saves by
``copy.deepcopy``, removals at the end by ``crop``, the rows layout) is ``adapters/hf_model.py``'s; this module
adds the architecture and what its sliding layers change. Facts behind every choice, measured:
docs/hf-transformers/gemma3-notes.md.

The model, mapped:

- ``layer_types[i]`` is ``"sliding_attention"`` where ``config.layer_window(i)`` is a window, else
  ``"full_attention"``; ``sliding_window`` is that window (transformers has one for every sliding layer).
  Its mask lets a query at p see p-W+1..p, the suite's window. A model without a window gets only full
  layers (``sliding_window`` is still set, to ``max_positions``: the model builds a sliding mask whether a
  layer uses it or not).
- RoPE per layer type: ``rope_parameters["sliding_attention"]`` has ``local_rope_base`` (or ``rope_base``),
  ``["full_attention"]`` has ``rope_base``; half-split pairs (``rotate_half``), so only ``half_split``.
- ``query_pre_attn_scalar = head_width``: the scale ``1/sqrt(dh)``.
- Norms: transformers' ``Gemma3RMSNorm`` multiplies by ``1 + weight``, the suite's by ``w``: ``w - 1`` is
  copied in. The suite's ``ffn_norm`` is ``pre_feedforward_layernorm``; ``post_attention_norm`` and
  ``post_ffn_norm`` are ``post_attention_layernorm`` and ``post_feedforward_layernorm``.
- transformers has no switch for q/k norms, post norms, the embedding scale or the tanh GELU: only a model
  whose ``architecture`` is ``"gemma3"`` (every switch on, RoPE half_split) is built, any other raises
  ``UnsupportedModel``; ``model_limits["architectures"] = ("gemma3",)`` says so.

Glue the adapter adds, and says so:

- float64: transformers computes every RMSNorm (six a layer) and the RoPE table in float32 in a float64
  model (as for Llama), and keeps the embedding scale ``sqrt(D)`` as a float32 buffer. The ``*`` factories
  replace the norms and the table by the same formulas in float64; every factory sets the scale to the
  float64 ``sqrt(D)`` (``mixed_precision`` has no component for it; ``dynamic_cache_stock`` declares the
  other two).
- All or nothing: a forward that raised is undone by putting back a deep copy of every cache taken before
  the batch (a sliding layer past its window cannot be cropped back; a static ring is written in place).
- ``dynamic_cache_crop`` refuses a removal that would need a cell a sliding layer evicted, before calling
  ``crop``, by transformers' own rule (its layer raises once it has seen W tokens): ``Cache.crop`` crops layer
  by layer and is not atomic when a full layer comes before the sliding one
  (docs/hf-transformers/repro_gemma3_crop_not_atomic.py). ``dynamic_cache_crop_unchecked`` calls ``crop`` and
  maps that RuntimeError to ``refused``, to judge transformers as it is. Removing a whole sequence is
  ``reset()`` (a sliding layer cannot be cropped to 0 once it has evicted).

What the caches do, declared (``model_policy`` keys of issue 37, docs/spec.md §15.7):

- ``DynamicCache(config=...)`` (``dynamic_cache*``), what ``forward`` and ``generate`` give this model:
  ``DynamicSlidingWindowLayer`` for sliding layers (keeps the last W-1 rows: exactly what a later token can
  see) and ``DynamicLayer`` for full ones: ``window_cells: "visible"``; ``seq_pos_min`` is the smallest
  position the sliding layers still hold (llama.cpp's iswa cache reports its sliding store's likewise), read
  from the rows they hold. With removals: ``removal: "end_only"`` and ``window_removal: "until_full"``.
- ``DynamicCache()`` without the config (``full_layers*``): every layer a ``DynamicLayer``, nothing evicted,
  the window is the mask's alone: ``window_cells: "all"``; crops at any length.
- ``StaticCache(config, max_cache_len=cells)`` (``static_cache*``): ``StaticSlidingWindowLayer`` rings of
  ``min(W, cells)`` rows and ``StaticLayer`` of ``cells``: ``window_cells: "visible"`` (the ring keeps one row
  more than a later token sees), ``fixed_capacity`` (the ``IndexError`` of ``StaticLayer.update`` is ``full``).
  Its ``crop`` refuses nothing past the window and leaves the ring's rows standing for other positions
  (layer-level finding 8.3; docs/hf-transformers/repro_gemma3_static_crop_past_window.py): ``static_cache_crop``
  declares what a correct ring would (``removal: "end_only"``, ``window_removal: "until_full"``) and is judged.
- ``dynamic_cache_rows``: the sequences as batch rows of one ``DynamicCache()`` (``HfRowsAdapter``), copies by
  ``reorder_cache``, a mask per layer type (``attention_mask`` a dict ``{"full_attention": ...,
  "sliding_attention": ...}``, which ``Gemma3TextModel`` takes as it is). Not over ``DynamicCache(config)``: a
  sliding layer keeps the last W-1 *slots*, and padding takes slots, so a padded row would lose cells it
  still sees.
- ``model_limits["min_window"] = 2``: with ``sliding_window=1`` the second forward raises in sdpa (layer-level
  finding 7, ``repro_window_of_one.py``).
"""

from __future__ import annotations

import copy
import math
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig

from adapters.hf_model import (
    ATTENTION,
    DTYPE,
    CropRefused,
    Float64RMSNorm,
    Float64Rotary,
    HfModelAdapter,
    HfRowsAdapter,
    Model,
    RowsContext,
    Store,
    set_parameter,
    set_projections,
)
from kvcache_conformance.protocol.model import ModelConfig, ModelWeights

SLIDING, FULL = "sliding_attention", "full_attention"
MIN_WINDOW = 2  # sliding_window=1 raises on the second forward (docs/hf-transformers/repro_window_of_one.py)
ARCHITECTURE = "gemma3"  # the oracle's name (ModelConfig.architecture): every Gemma switch on, RoPE half_split


class UnsupportedModel(ValueError):
    """A ``ModelConfig`` that ``Gemma3ForCausalLM`` cannot be (a usage error: ``model_limits`` says so)."""


def gemma3_problem(config: ModelConfig) -> str | None:
    """Why ``config`` is not a Gemma 3 that transformers can build (None: it is)."""
    if config.architecture != ARCHITECTURE:
        return (f"Gemma3ForCausalLM runs the architecture {ARCHITECTURE!r} (every Gemma switch on, RoPE half_split), "
                f"not {config.architecture!r}")
    windows = {w for w in layer_windows(config) if w is not None}
    if len(windows) > 1:
        return f"transformers has one sliding_window for every sliding layer, not {sorted(windows)}"
    if windows and min(windows) < MIN_WINDOW:
        return f"window {min(windows)} < min_window {MIN_WINDOW}: transformers' sliding layer of 1 never evicts"
    return None


def layer_windows(config: ModelConfig) -> list[int | None]:
    return [config.layer_window(i) for i in range(config.layers)]


def gemma3_config(config: ModelConfig) -> Gemma3TextConfig:
    """transformers' config of the suite's Gemma-3 model (checked by ``gemma3_problem`` first)."""
    windows = layer_windows(config)
    window = next((w for w in windows if w is not None), config.max_positions)
    local = config.local_rope_base if config.local_rope_base is not None else config.rope_base
    return Gemma3TextConfig(
        vocab_size=config.vocab, hidden_size=config.model_width, intermediate_size=config.ffn_width,
        num_hidden_layers=config.layers, num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
        head_dim=config.head_width, hidden_activation="gelu_pytorch_tanh", max_position_embeddings=config.max_positions,
        rms_norm_eps=config.norm_eps, tie_word_embeddings=config.tied_output, query_pre_attn_scalar=config.head_width,
        sliding_window=window, layer_types=[FULL if w is None else SLIDING for w in windows],
        rope_parameters={SLIDING: {"rope_type": "default", "rope_theta": float(local)},
                         FULL: {"rope_type": "default", "rope_theta": float(config.rope_base)}},
        final_logit_softcapping=None, attn_logit_softcapping=None, attn_implementation=ATTENTION,
        pad_token_id=None, bos_token_id=None, eos_token_id=None)


class Float64LayerRotary(nn.Module):
    """``Gemma3RotaryEmbedding``'s default formula per layer type, in float64."""

    def __init__(self, head_dim: int, bases: dict[str, float]) -> None:
        super().__init__()
        self.tables = nn.ModuleDict({kind: Float64Rotary(head_dim, base) for kind, base in bases.items()})

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tables[layer_type](x, position_ids)


def gemma3_model(config: ModelConfig, weights: ModelWeights, *, float64_steps: bool = True) -> Gemma3ForCausalLM:
    """``Gemma3ForCausalLM`` holding exactly ``weights`` in float64 (``float64_steps``: its norms and RoPE table
    too; the embedding scale always)."""
    problem = gemma3_problem(config)
    if problem:
        raise UnsupportedModel(problem)
    torch.manual_seed(0)  # the random initialisation is overwritten; seeded so nothing differs between runs
    model = Gemma3ForCausalLM(gemma3_config(config)).to(DTYPE).eval()
    inner = model.model
    norms = []  # (module holder, attribute, the suite's weight w): transformers holds w - 1
    with torch.no_grad():
        set_parameter(inner.embed_tokens.weight, weights.embedding)
        for layer, w in zip(inner.layers, weights.layers):
            attention = layer.self_attn
            norms += [(layer, "input_layernorm", w.attention_norm), (attention, "q_norm", w.q_norm),
                      (attention, "k_norm", w.k_norm), (layer, "post_attention_layernorm", w.post_attention_norm),
                      (layer, "pre_feedforward_layernorm", w.ffn_norm),
                      (layer, "post_feedforward_layernorm", w.post_ffn_norm)]
            set_projections(layer, w)
        norms.append((inner, "norm", weights.output_norm))
        for holder, name, weight in norms:
            set_parameter(getattr(holder, name).weight, np.asarray(weight) - 1.0)
        if config.tied_output:
            if model.lm_head.weight.data_ptr() != inner.embed_tokens.weight.data_ptr():
                raise ValueError("tie_word_embeddings did not tie lm_head to the embedding")
        else:
            set_parameter(model.lm_head.weight, weights.output)
    # a float32 buffer made at construction, float32(sqrt(D)) even once the model is float64
    inner.embed_tokens.embed_scale = torch.tensor(math.sqrt(config.model_width), dtype=DTYPE)
    if float64_steps:
        for holder, name, weight in norms:
            setattr(holder, name, Float64RMSNorm(weight, config.norm_eps))  # w * x/rms = (1 + (w - 1)) * x/rms
        hf = model.config
        inner.rotary_emb = Float64LayerRotary(config.head_width, {kind: hf.rope_parameters[kind]["rope_theta"]
                                                                   for kind in (SLIDING, FULL)})
    return model


class Gemma3Build:
    """What every Gemma-3 adapter adds to its layout: the model, its capabilities and limits."""

    float64_steps: bool
    gemma3_capabilities: ClassVar[frozenset[str]] = frozenset({"sliding_window", "interleaved_windows"})
    # Gemma3TextConfig refuses hidden_size % num_attention_heads != 0 as LlamaConfig does
    model_limits: ClassVar[dict[str, Any]] = {"model_width_divisible_by_heads": True, "min_window": MIN_WINDOW,
                                              "architectures": (ARCHITECTURE,)}

    def build_model(self, config: ModelConfig, weights: ModelWeights) -> Any:
        return gemma3_model(config, weights, float64_steps=self.float64_steps)


CACHES = ("dynamic", "full_layers", "static")


class HfGemma3Adapter(Gemma3Build, HfModelAdapter):
    """``Gemma3ForCausalLM`` over one transformers cache per sequence (``cache``: ``"dynamic"`` =
    ``DynamicCache(config)``, ``"full_layers"`` = ``DynamicCache()``, ``"static"`` = ``StaticCache``)."""

    def __init__(self, name: str, *, cache: str = "dynamic", float64_steps: bool = True, crop: bool = False,
                 crop_checked: bool = True) -> None:
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {CACHES}, got {cache!r}")
        super().__init__(name, static=cache == "static", float64_steps=float64_steps, crop=crop)
        self.cache, self.crop_checked = cache, crop_checked
        self.capabilities = self.capabilities | self.gemma3_capabilities
        self.model_policy["window_cells"] = "all" if cache == "full_layers" else "visible"
        if crop and cache != "full_layers":
            # DynamicSlidingWindowLayer.crop raises once it evicted; a StaticSlidingWindowLayer ring cannot un-evict
            # either (its is_croppable), though transformers' crop does not refuse
            self.model_policy["window_removal"] = "until_full"

    def _cache(self, context_model: Model, cells: int) -> Any:
        if self.cache == "full_layers":
            return DynamicCache()  # every layer a DynamicLayer: the window is the mask's alone
        return super()._cache(context_model, cells)  # DynamicCache(config=...) / StaticCache(config=...)

    def checkpoint(self, store: Store) -> Any:
        return copy.deepcopy(store.cache)

    def restore(self, store: Store, checkpoint: Any) -> None:
        store.cache = checkpoint

    def seq_pos_min(self, context: Any, seq: int) -> int:
        store = self._store(context, seq)
        return min(store.positions[len(store.positions) - _held(store):], default=-1)

    def crop_refusal(self, store: Store, n: int) -> str | None:
        if not self.crop_checked or _whole(store, n) or self.cache != "dynamic":
            return None
        for index, layer in enumerate(store.cache.layers):
            if getattr(layer, "is_sliding", False) and layer.get_seq_length() >= layer.sliding_window:
                return (f"layer {index}'s DynamicSlidingWindowLayer has seen {layer.get_seq_length()} tokens of a "
                        f"window of {layer.sliding_window}: it evicted, and its crop raises")
        return None

    def crop_rows(self, store: Store, n: int) -> None:
        if _whole(store, n):
            store.cache.reset()  # a sliding layer that evicted cannot be cropped to 0
            store.positions.clear()
            return
        try:
            store.cache.crop(-n)
        except RuntimeError as error:
            if "does not track past states" not in str(error):
                raise
            raise CropRefused(f"transformers' crop: {error}") from error


def _whole(store: Store, n: int) -> bool:
    """Whether removing ``store``'s last ``n`` positions removes the whole sequence: every position, or with every
    layer sliding every position still held (seq_pos_min on; a full layer would keep the evicted ones)."""
    every_layer_sliding = all(getattr(layer, "is_sliding", False) for layer in store.cache.layers)
    return n == len(store.positions) or (every_layer_sliding and n >= _held(store))


def _held(store: Store) -> int:
    """How many of ``store``'s last positions it still holds: its sliding layers' rows (the fewest), else all."""
    return min((_rows_held(layer) for layer in store.cache.layers if getattr(layer, "is_sliding", False)),
               default=len(store.positions))


def _rows_held(layer: Any) -> int:
    """How many of a sliding layer's last rows it still holds (its ring's or its tensor's, not its length)."""
    if not layer.is_initialized:
        return 0
    if hasattr(layer, "cumulative_length_int"):  # StaticSlidingWindowLayer: a ring of max_cache_len rows
        return min(layer.cumulative_length_int, layer.max_cache_len)
    return int(layer.keys.shape[-2])


class HfGemma3RowsAdapter(Gemma3Build, HfRowsAdapter):
    """``Gemma3ForCausalLM`` over one ``DynamicCache()`` whose batch rows are the sequences, a mask per layer type."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.capabilities = self.capabilities | self.gemma3_capabilities
        self.model_policy["window_cells"] = "all"

    def rows_cache(self, model: Model) -> Any:
        return DynamicCache()  # not DynamicCache(config): its sliding layers would evict by slot, padding included

    def attention_mask(self, context: RowsContext, mine: list[list[int]], positions: torch.Tensor) -> Any:
        window = context.model.hf.config.sliding_window
        return {FULL: self.visibility(context, mine, positions, None),
                SLIDING: self.visibility(context, mine, positions, window)}


# -- factories -------------------------------------------------------------------------------------------------

def dynamic_cache() -> HfGemma3Adapter:
    """Gemma3ForCausalLM + DynamicCache(config) per sequence (sliding layers evict), float64 steps: 1e-12."""
    return HfGemma3Adapter("hf-gemma3-model-dynamic-cache")


def dynamic_cache_crop() -> HfGemma3Adapter:
    """As ``dynamic_cache`` + seq_remove by crop: ``removal: end_only``, ``window_removal: until_full``."""
    return HfGemma3Adapter("hf-gemma3-model-dynamic-cache-crop", crop=True)


def dynamic_cache_crop_unchecked() -> HfGemma3Adapter:
    """As ``dynamic_cache_crop``, calling transformers' crop unchecked (its RuntimeError mapped to ``refused``)."""
    return HfGemma3Adapter("hf-gemma3-model-dynamic-cache-crop-unchecked", crop=True, crop_checked=False)


def full_layers() -> HfGemma3Adapter:
    """DynamicCache() per sequence: every layer keeps every row (``window_cells: all``), crop at any length."""
    return HfGemma3Adapter("hf-gemma3-model-full-layers", cache="full_layers", crop=True)


def static_cache() -> HfGemma3Adapter:
    """StaticCache(config, max_cache_len=cells) per sequence: sliding rings and full layers; fixed_capacity."""
    return HfGemma3Adapter("hf-gemma3-model-static-cache", cache="static")


def static_cache_crop() -> HfGemma3Adapter:
    """As ``static_cache`` + seq_remove by crop (``removal: end_only``, ``window_removal: until_full``; transformers
    refuses nothing)."""
    return HfGemma3Adapter("hf-gemma3-model-static-cache-crop", cache="static", crop=True)


def dynamic_cache_rows() -> HfGemma3RowsAdapter:
    """One DynamicCache() whose rows are the sequences (padded batches, a mask per layer type); reorder_cache."""
    return HfGemma3RowsAdapter("hf-gemma3-model-dynamic-cache-rows")


def dynamic_cache_stock() -> HfGemma3Adapter:
    """transformers' float32 norms and RoPE table, declared (the embedding scale still float64: undeclarable)."""
    return HfGemma3Adapter("hf-gemma3-model-dynamic-cache-stock", float64_steps=False)
