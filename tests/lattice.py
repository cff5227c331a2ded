"""The declaration lattice: the reference, wrapped to claim less or to choose differently, each declared honestly.

Every variant must conform -- the whole suite, properties and corpus, passing with only skips -- because the
suite judges only what the spec requires and the adapter declares (``tests/test_lattice.py``). Each twin makes
one design choice but declares another, and must fail, so that the lattice is not vacuous.

A variant is named by ``KVCACHE_LATTICE=<name>`` and loaded with ``--kv-impl tests.lattice:from_environment``
(or built with ``variant(name)``). It offers only the methods of what it declares: a suite that called
another would fail it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from examples.minimal_adapter import (
    make_float32_rope_adapter,
    make_float32_rotation_adapter,
    make_float32_softmax_adapter,
    make_float32_transcendentals_adapter,
)
from impl.cache import LayerKvCache, RaggedKvCache
from impl.conformance import (
    CachedFirstPagedAdapter,
    ColumnsTruncateAdapter,
    KeepsEveryRowAdapter,
    NodeLruPagedAdapter,
    PaddingPagePagedAdapter,
    PrefillWithinWindowAdapter,
    QuantizedReferenceAdapter,
    ReferenceAdapter,
    RegisteredDuplicatesPagedAdapter,
    SinksRingAdapter,
    UncheckedCapacityAdapter,
    WindowUntilFullAdapter,
)
from impl.errors import CacheFull, InvalidIndices, InvalidLength, SequenceOperationRefused
from impl.layered_cache import LayeredKvCache
from impl.model import ModelContext
from impl.model_conformance import (
    EndOnlyRemovalModelAdapter,
    GrowingModelAdapter,
    LowPrecisionModelAdapter,
    ModelReferenceAdapter,
    PositionsFromZeroModelAdapter,
    RingModelAdapter,
    WindowedStoreModelAdapter,
    make_end_only_removal_model_adapter,
    make_float32_norm_model_adapter,
    make_gelu_table_model_adapter,
    make_gemma3_model_adapter,
    make_growing_model_adapter,
    make_micro_batch_model_adapter,
    make_model_adapter,
    make_positions_from_zero_model_adapter,
    make_ring_model_adapter,
    make_swa_pattern_6_model_adapter,
    make_uint4_extreme_model_adapter,
    make_uint4_groups_model_adapter,
    make_unbounded_shift_model_adapter,
    make_windowed_store_model_adapter,
)
from impl.paged_cache import PoolState
from impl.storage import StorageRule
from kvcache_conformance.protocol.declarations import METHODS_OF, required_methods
from kvcache_conformance.protocol.kinds import declared
from kvcache_conformance.protocol.paged import PagedPolicy
from tests.accepting import UNCLAIMED, AcceptsWhatItDoesNotClaim, ReportsTheCellsAskedFor, RoundsCellsUp

REFERENCE = declared(ReferenceAdapter.capabilities) - {"input_validation"}  # the shorthand spelled out
EVERY_METHOD = frozenset(m for methods in METHODS_OF.values() for m in methods) | {"paged_fork", "paged_truncate"}
DECODER = {"float64", "gqa", "positions_sinusoidal", "positions_rope", "rope_interleaved", "rope_half_split"}
# Declarations that cannot stand without another (the loader refuses them): removing one removes these too.
DEPENDS = {"physical_storage": {"reset_keeps_bytes", "reset_keeps_buffers", "reset_zeroes"},
           "reset_keeps_buffers": {"reset_keeps_bytes"}, "sliding_window_layer": {"attention_sinks"},
           "ragged_rows": {"batch_merge", "batch_extract", "batch_filter"},
           "sliding_window": {"interleaved_windows"},
           "whole_model": {"seq_remove", "seq_copy", "seq_keep", "seq_shift", "seq_divide", "seq_state",
                           "multi_sequence_tokens", "interleaved_windows"}}


class Declared:
    """``inner`` as an adapter declaring ``capabilities`` (and ``attributes``), offering only the methods they
    call for; every call goes to ``inner``."""

    def __init__(self, name: str, capabilities: set[str] | frozenset[str], inner: Any = None,
                 layer_caches: bool | None = None, **attributes: Any) -> None:
        self.name, self.version = f"lattice-{name}", "1"
        self.capabilities = frozenset(capabilities)
        self._inner = inner if inner is not None else ReferenceAdapter()
        for key, value in attributes.items():
            setattr(self, key, value)
        methods = set(required_methods(self.capabilities, layer_caches=layer_caches))
        if "paged_prefix_sharing" in self.capabilities:
            methods |= set(PagedPolicy.of(self).methods())  # the declared policy's, else the inner adapter's
        self._methods = frozenset(methods)

    def __getattr__(self, name: str) -> Any:
        if name in EVERY_METHOD and name not in self._methods:
            raise AttributeError(f"{self.name} has no {name}: it does not declare what needs it")
        return getattr(self._inner, name)


def _claims_only(error: BaseException) -> str | None:
    """An adapter that maps only what it still claims: a pool's ``full`` (claimed by ``paged_prefix_sharing``)
    and a window's ``evicted`` (by ``truncate``); every validation error unmapped."""
    kind = ReferenceAdapter().error_kind(error)
    return kind if kind in ("full", "evicted") else None


def _without(capability: str) -> Declared:
    removed = {capability} | DEPENDS.get(capability, set())
    return Declared(f"without-{capability}", REFERENCE - removed)


class CompilesPerShape(ReferenceAdapter):
    """A JIT framework's cache: each new shape of layer and cache compiles at its first step, and after ``limit``
    shapes of an attention kind a new one is refused (as a recompilation limit that raises). A step into a cache of
    another layer's geometry is rejected before anything compiles."""

    def __init__(self, limit: int = 2) -> None:
        super().__init__()
        self.limit, self.compiled = limit, set[tuple[int, ...]]()

    def _compile(self, layer: Any, cache: Any) -> None:
        if (cache.kv_heads, cache.head_width) != (layer.kv_heads, layer.head_width):
            return  # rejected as a geometry mismatch: nothing to compile
        shape = (layer.kv_heads < layer.heads, layer.model_width, layer.heads, layer.kv_heads, layer.head_width,
                 cache.batch_size, cache.capacity)
        if shape not in self.compiled and sum(s[0] == shape[0] for s in self.compiled) >= self.limit:
            raise RuntimeError(f"recompilation limit ({self.limit}) reached: one more shape {shape[1:]}")
        self.compiled.add(shape)

    def step(self, layer: Any, cache: Any, x: Any) -> Any:
        self._compile(layer, cache)
        return super().step(layer, cache, x)

    def append(self, layer: Any, cache: Any, x: Any) -> Any:
        self._compile(layer, cache)
        return super().append(layer, cache, x)


# -- behaviours the reference does not have, each the design of some real cache --------------------------------

class ZeroingReset(ReferenceAdapter):
    """Reset zeroes both buffers (transformers' StaticCache)."""

    def reset(self, cache: LayerKvCache) -> None:
        cache.reset(zero_storage=True)


class Handle:
    """An adapter's handle on a library cache it may replace."""

    def __init__(self, cache: LayerKvCache, layer: Any, window: int | None) -> None:
        self.cache, self.layer, self.window = cache, layer, window


def _library_cache(handle: Any) -> Any:
    """The library's cache a handle holds; a ragged batch or a layered cache (docs/spec.md §13.8, §13.9) is the
    reference's own, no handle."""
    return handle.cache if isinstance(handle, Handle) else handle


def _gelu_table_over_a_float32_cache() -> Any:
    """The float16 GELU table's engine with its cache in float32."""
    adapter = make_gelu_table_model_adapter()
    adapter.kv_storage = "float32"
    return adapter

class ResetByReplacement(ReferenceAdapter):
    """A library with no reset: the adapter's cache handle holds the library's cache, and reset puts a new, empty
    one in. It keeps the old one's binding (docs/spec.md §6.1: a stale cache stays stale) -- here a copy emptied;
    a library cache bound at creation would need the handle to remember the layer's versions. Buffers are
    replaced, so it claims nothing of what reset does to them."""

    def create_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None,
                     sinks: int = 0) -> Handle:
        return Handle(super().create_cache(layer, batch_size, capacity, window, sinks), layer, window)

    def reset(self, handle: Handle) -> None:
        if not isinstance(handle, Handle):  # a ragged batch (docs/spec.md §13.8): the reference's own
            return super().reset(handle)
        handle.cache = handle.cache.fork()  # new buffers, the same binding
        handle.cache.truncate(0)
        return None

    def step(self, layer: Any, handle: Handle, x: Any) -> Any:
        return super().step(layer, handle.cache, x)

    def append(self, layer: Any, handle: Handle, x: Any) -> Any:
        return super().append(layer, handle.cache, x)

    def truncate(self, handle: Handle, n: Any) -> None:
        super().truncate(_library_cache(handle), n)

    def reorder(self, handle: Handle, indices: Any) -> None:
        super().reorder(_library_cache(handle), indices)

    def select(self, handle: Handle, indices: Any) -> None:
        super().select(_library_cache(handle), indices)

    def repeat_interleave(self, handle: Handle, repeats: Any) -> None:
        super().repeat_interleave(_library_cache(handle), repeats)

    def fork(self, handle: Handle) -> Any:
        if not isinstance(handle, Handle):  # a ragged batch (docs/spec.md §13.8): the reference's own
            return super().fork(handle)
        return Handle(handle.cache.fork(), handle.layer, handle.window)

    def snapshot(self, handle: Handle) -> Any:
        return super().snapshot(handle.cache)


class NoFixedCapacity(ResetByReplacement):
    """No fixed capacity either: a cache takes rows past the capacity asked for (as far as its RoPE positions
    go), which it does not claim to refuse; and it has no physical buffers of that capacity to show."""

    def create_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None,
                     sinks: int = 0) -> Handle:
        room = max(capacity, min(layer.rope.max_positions, 4 * capacity))
        return Handle(LayerKvCache(layer, batch_size, room, window, sinks=sinks), layer, window)


class SinksIgnored(ReferenceAdapter):
    """A window cache that takes ``sinks`` and keeps none: a plain window."""

    def create_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None,
                     sinks: int = 0) -> LayerKvCache:
        return super().create_cache(layer, batch_size, capacity, window)


class TiedGeometry(ReferenceAdapter):
    """Refuses layers whose model width is not heads x head width, or of more than two heads."""

    def create_layer(self, weights: Any, rope: Any) -> Any:
        if weights.model_width != weights.heads * weights.head_width or weights.heads > 2:
            raise ValueError(f"model width {weights.model_width} != {weights.heads} x {weights.head_width}")
        return super().create_layer(weights, rope)


class WideHeads(ReferenceAdapter):
    """Refuses head widths below 4, not a multiple of 4, or a model width not divisible by the heads."""

    def create_layer(self, weights: Any, rope: Any) -> Any:
        if weights.head_width < 4 or weights.head_width % 4 or weights.model_width % weights.heads:
            raise ValueError(f"head width {weights.head_width}, model width {weights.model_width}")
        return super().create_layer(weights, rope)


class SmallOnly(ReferenceAdapter):
    """Refuses a layer of more than one head or a model width above 3, a rotary width above 2, a cache of batch
    above 1, capacity above 5 or a window below 2."""

    def create_layer(self, weights: Any, rope: Any) -> Any:
        if weights.heads > 1 or weights.model_width > 3 or (rope is not None and rope.rotary_width > 2):
            raise ValueError("too big for this cache")
        return super().create_layer(weights, rope)

    def create_cache(self, layer: Any, batch_size: int, capacity: int, window: int | None = None,
                     sinks: int = 0) -> Any:
        sizes = [v for v in (batch_size, capacity) if isinstance(v, int) and not isinstance(v, bool)]
        if len(sizes) == 2 and (batch_size > 1 or capacity > 5 or (window is not None and window < 2)):
            raise ValueError("too big for this cache")  # (what is not a size at all, the library rejects)
        return super().create_cache(layer, batch_size, capacity, window, sinks)


class NoTruncation(ReferenceAdapter):
    """A pool without truncation."""

    def paged_truncate(self, pool: Any, sequence: Any, length: Any) -> None:
        raise NotImplementedError("this pool cannot truncate a sequence")


class TilingRepeat(ReferenceAdapter):
    """repeat_interleave that repeats the whole batch (np.tile: rows 0, 1, 0, 1) instead of each row in a row."""

    def repeat_interleave(self, cache: Any, repeats: Any) -> None:
        batch = cache.batch_size
        super().repeat_interleave(cache, repeats)
        if isinstance(repeats, int) and not isinstance(repeats, bool) and repeats >= 1:
            super().reorder(cache, [(j % batch) * repeats for j in range(batch * repeats)])


class ClampingBuffer(UncheckedCapacityAdapter):
    """A preallocated buffer whose write past its end is clamped to the last slot (JAX's dynamic_update_slice): the
    step is accepted and overwrites the last row held. Not conforming, whatever it declares (docs/spec.md §5.5)."""

    def step(self, layer: Any, cache: Any, x: Any) -> Any:
        if cache.window is None and cache.length >= cache.capacity:
            cache.truncate(cache.capacity - 1)  # the write lands on row C - 1
        return super().step(layer, cache, x)


def _paged(policy: dict[str, Any]) -> Any:
    """The reference's pool under another declared policy (it implements every one)."""
    class Policy(ReferenceAdapter):
        paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, **policy}
    return Policy()


POLICIES = {
    "hash-scope-only": {"hash_keys": ["scope"]}, "hash-signature-only": {"hash_keys": ["signature"]},
    "hash-nothing": {"hash_keys": []}, "evict-all-at-once": {"eviction": "all_at_once"},
    "hit-before-last-full-block": {"hit_limit": "before_last_full_block"}, "no-truncate": {"truncate": False},
    "hash-request-keys": {"hash_keys": ["scope", "signature", "lora", "multimodal", "salt"]},
    "hash-salt-only": {"hash_keys": ["signature", "salt"]},
    "duplicates-registered": {"duplicates": "registered"},
    "fork-re-add": {"fork": "re_add"}, "fork-none": {"fork": "none"}, "hit-drops-last": {"hit_limit": "drops_last_hit"},
}
LAYER_ONLY = {c for c in REFERENCE if c not in {"decode_session", "prefix_store", "paged_prefix_sharing",
                                                 "sliding_window", "positions_sinusoidal", "positions_rope"}}

# -- whole models (docs/spec.md §15.7): the reference's model under each ModelPolicy declaration ---------------

def _model(policy: dict[str, Any], base: type = ReferenceAdapter) -> Any:
    """The reference's whole model under another policy (it implements each copy rule and both context kinds)."""
    class Policy(base):  # type: ignore[valid-type, misc]
        model_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.model_policy, **policy}
    return Policy()


MODEL_POLICIES = {
    "copy-replace": {"copy_unified": "replace", "copy_per_sequence": "replace"},
    "copy-whole-only": {"copy_unified": "whole_only", "copy_per_sequence": "whole_only"},
    "copy-per-sequence-whole-only": {"copy_per_sequence": "whole_only"},  # llama.cpp's
    "copies-duplicated": {"shared_copies": False},
}


class OneContextKind(ReferenceAdapter):
    """Creates contexts of one kind only (an engine built for one layout of its cache)."""

    def __init__(self, unified: bool) -> None:
        self.unified = unified

    def create_context(self, model: Any, config: Any) -> ModelContext:
        if config.unified != self.unified:
            raise SequenceOperationRefused("create_context", "only one kind of context")
        return super().create_context(model, config)


class NoNegativeShift(ReferenceAdapter):
    """Refuses a shift that would take a cell below position 0, instead of removing the cell."""

    def seq_shift(self, context: ModelContext, seq: int, p0: int, p1: int, delta: int) -> None:
        if 0 <= seq < context.sequences:
            stream = context.stream(seq)
            held = context.positions[stream][context.members[stream, :, seq]]
            if any(p + delta < 0 for p in held if p >= max(p0, 0) and (p1 < 0 or p < p1)):
                raise SequenceOperationRefused("seq_shift", "a cell would go below position 0")
        super().seq_shift(context, seq, p0, p1, delta)


class VocabFromThree(ReferenceAdapter):
    """Refuses a model of fewer than three tokens (llama.cpp's SPM vocabulary needs its unknown, begin and end
    tokens)."""

    def create_model(self, config: Any, weights: Any) -> Any:
        if config.vocab < 3:
            raise ValueError(f"a vocabulary of {config.vocab} tokens: at least 3 (unknown, begin, end)")
        return super().create_model(config, weights)


class WidthByHeads(ReferenceAdapter):
    """Refuses a model whose width is not a multiple of its heads (transformers' LlamaConfig, head_dim given or
    not)."""

    def create_model(self, config: Any, weights: Any) -> Any:
        if config.model_width % config.heads:
            raise ValueError(f"hidden size {config.model_width} is not a multiple of {config.heads} heads")
        return super().create_model(config, weights)


class FirstSequenceOnly(ReferenceAdapter):
    """Hands its engine each token's first sequence alone (an adapter writing llama.cpp's ``n_seq_id`` as 1): a
    token naming several sequences becomes a cell of the first."""

    def decode_batch(self, context: ModelContext, batch: Any) -> Any:
        firsts = tuple(s[0] if isinstance(s, tuple) else s for s in batch.sequences)
        return super().decode_batch(context, type(batch)(batch.tokens, batch.positions, firsts, batch.logits))


MODEL_ONLY = declared(ModelReferenceAdapter.capabilities) - {"float64"}
SHARED_TOKENS = {"multi_sequence_tokens"}  # the accepting engine (tests/accepting.py) takes one sequence a token


def _low_precision(kv_storage: str, stored: str = "float16") -> Declared:
    """float32 computation over a cache of ``stored`` (float16: llama.cpp's default), declaring it ``kv_storage``;
    head widths of whole blocks of 32 where either is a block format (q8_0, q4_0)."""
    blocks = {"model_limits": {"head_width_multiple": 32}} if {kv_storage, stored} & {"q8_0", "q4_0"} else {}
    return Declared(f"model-float32-kv-{kv_storage}", MODEL_ONLY, LowPrecisionModelAdapter("float32", stored),
                    layer_caches=False, dtype="float32", kv_storage=kv_storage, **blocks)


def _row_blocks(format: str, *, engine_along_row: bool = True) -> Declared:
    """float32 computation over a block-format cache declared with its blocks cut from each token's whole kv row
    (``kv_width_multiple`` 32: heads of 16 drawn, two to a block); the engine cuts them so, or from each head."""
    return Declared(f"model-float32-kv-{format}-row", MODEL_ONLY,
                    LowPrecisionModelAdapter("float32", format, along_row=engine_along_row), layer_caches=False,
                    dtype="float32", kv_storage={"format": format, "along": "row"},
                    model_limits={"kv_width_multiple": 32})


def _affine_cache(zero_point: str = "minimum", declared: StorageRule | None = None) -> Declared:
    """float32 computation over affine 4-bit groups of 4 (``zero_point``), declared as ``declared`` (default: what
    it stores) in ``kv_storage``; heads the group divides."""
    engine = make_uint4_groups_model_adapter() if zero_point == "minimum" else make_uint4_extreme_model_adapter()
    rule = declared or StorageRule("uint4", "per_group", group=4, zero_point=zero_point)
    return Declared(f"model-float32-kv-uint4-{zero_point}", MODEL_ONLY, engine, layer_caches=False,
                    dtype="float32", kv_storage=rule.declared(), model_limits={"head_width_multiple": rule.group})


class UniformWindows(ModelReferenceAdapter):
    """Builds every model with its window in every layer and one RoPE base: an engine without per-layer window
    patterns (docs/spec.md §15.1)."""

    name = "lattice-uniform-windows"

    def create_model(self, config: Any, weights: Any) -> Any:
        return super().create_model(dataclasses.replace(config, window_pattern="all", local_rope_base=None), weights)


class LlamaOnly(ModelReferenceAdapter):
    """Runs every model as a Llama: the Gemma switches, and the norms they bring, ignored."""

    name = "lattice-llama-only"

    def create_model(self, config: Any, weights: Any) -> Any:
        plain = dataclasses.replace(config, embedding_scale=False, qk_norm=False, post_norms=False, activation="silu")
        layers = tuple(dataclasses.replace(layer, q_norm=None, k_norm=None, post_attention_norm=None,
                                           post_ffn_norm=None) for layer in weights.layers)
        return super().create_model(plain, dataclasses.replace(weights, layers=layers))


INTERLEAVED = {"float64", "interleaved_windows"}  # MODEL_ONLY leaves float64 out
GEMMA3 = {"architectures": ["llama", "gemma3"]}
MODEL_VARIANTS: dict[str, Callable[[], Any]] = {
    **{f"model-{name}": (lambda name=name, policy=policy: Declared(
        f"model-{name}", REFERENCE, _model(policy), model_policy={**ReferenceAdapter.model_policy, **policy}))
       for name, policy in MODEL_POLICIES.items()},
    "model-unified-only": lambda: Declared("model-unified-only", REFERENCE, OneContextKind(True), model_policy={
        **ReferenceAdapter.model_policy, "contexts": ["unified"]}),
    "model-per-sequence-only": lambda: Declared("model-per-sequence-only", REFERENCE, OneContextKind(False),
                                                model_policy={**ReferenceAdapter.model_policy,
                                                              "contexts": ["per_sequence"]}),
    "model-negative-shift-not-drawn": lambda: Declared("model-negative-shift-not-drawn", REFERENCE, NoNegativeShift(),
                                                       model_policy={**ReferenceAdapter.model_policy,
                                                                     "negative_shift": "not_drawn"}),
    "model-float32-kv-float16": lambda: _low_precision("float16"),
    "model-float32-kv-float32": lambda: _low_precision("float32", "float32"),  # docs/spec.md §8.3's rule throughout
    "model-float32-kv-q8_0": lambda: _low_precision("q8_0", "q8_0"),
    "model-float32-kv-q4_0": lambda: _low_precision("q4_0", "q4_0"),
    # blocks cut from each token's whole kv row, as an engine lays its cache out: heads of 16 judged too
    "model-float32-kv-q8_0-row": lambda: _row_blocks("q8_0"),
    "model-float32-kv-q4_0-row": lambda: _row_blocks("q4_0"),
    # affine groups as the model's cache (HQQ's and KIVI's kind; mlx-lm's QuantizedKVCache with the larger extreme)
    "model-float32-kv-uint4-groups": lambda: _affine_cache(),
    "model-float32-kv-uint4-extreme": lambda: _affine_cache("extreme"),
    # refuses a removal that would leave cells after its range (llama.h's seq_rm returning false; transformers' crop)
    "model-removal-end-only": lambda: Declared("model-removal-end-only", MODEL_ONLY,
                                               make_end_only_removal_model_adapter(), layer_caches=False,
                                               model_policy=EndOnlyRemovalModelAdapter.model_policy),
    "model-vocab-from-three": lambda: Declared("model-vocab-from-three", REFERENCE, VocabFromThree(),
                                               model_limits={"min_vocab": 3}),
    # every RMSNorm in float32 inside a float64 model (transformers' LlamaRMSNorm), declared
    "model-norm-float32": lambda: Declared("model-norm-float32", MODEL_ONLY, make_float32_norm_model_adapter(),
                                           layer_caches=False, mixed_precision={"norm": "float32"}),
    "model-width-divisible-by-heads": lambda: Declared("model-width-divisible-by-heads", REFERENCE, WidthByHeads(),
                                                       model_limits={"model_width_divisible_by_heads": True}),
    # does a shift past max_positions, as llama.cpp's seq_add does (the reference refuses it): outside the model,
    # judged by §5.1 alone, so both conform declaring nothing (docs/spec.md §15.4); no twin, as nothing is declared
    "model-shifts-past-the-model": lambda: Declared("model-shifts-past-the-model", MODEL_ONLY,
                                                    make_unbounded_shift_model_adapter(), layer_caches=False),
    # claims no batch or sequence-operation validation and no fixed capacity, and accepts every such input (§5.5)
    "model-accepts-unclaimed": lambda: Declared("model-accepts-unclaimed", MODEL_ONLY - UNCLAIMED - SHARED_TOKENS,
                                                AcceptsWhatItDoesNotClaim(), layer_caches=False),
    # more cells per store than asked (llama.cpp pads n_ctx), reported (§15.2)
    "model-cells-rounded-up": lambda: Declared("model-cells-rounded-up", MODEL_ONLY, RoundsCellsUp(),
                                               layer_caches=False),
    # takes no position from the caller: numbers each sequence on from its largest position, an empty one from 0
    "model-positions-from-zero": lambda: Declared("model-positions-from-zero", MODEL_ONLY,
                                                  make_positions_from_zero_model_adapter(), layer_caches=False,
                                                  model_policy=PositionsFromZeroModelAdapter.model_policy),
    # takes one sequence per token, and does not declare multi_sequence_tokens
    "model-one-sequence-per-token": lambda: Declared("model-one-sequence-per-token",
                                                     REFERENCE - {"multi_sequence_tokens"}, FirstSequenceOnly()),
    # computes a batch in parts of 3 tokens, all or nothing (llama.cpp with n_ubatch 3); no twin: the declaration
    # only makes longer batches drawn, and a correct engine passes whatever micro-batch it declares
    "model-micro-batch-3": lambda: Declared("model-micro-batch-3", MODEL_ONLY, make_micro_batch_model_adapter(),
                                            layer_caches=False, model_limits={"micro_batch": 3}),
    # no capacity limit: grows past the cells asked for, never full
    "model-capacity-grows": lambda: Declared("model-capacity-grows", MODEL_ONLY - {"fixed_capacity"},
                                             make_growing_model_adapter(), layer_caches=False,
                                             model_policy=GrowingModelAdapter.model_policy),
}
# the widened model (issue 37): per-layer window patterns and a local RoPE base, Gemma 3's architecture beside
# Llama's; llama.cpp's gemma3 (every sixth layer global, a local base of 10000, models of six and seven layers)
MODEL_VARIANTS |= {
    "model-interleaved-gemma3": lambda: Declared("model-interleaved-gemma3", MODEL_ONLY | INTERLEAVED,
                                                 make_gemma3_model_adapter(), layer_caches=False, model_limits=GEMMA3),
    "model-gemma3-swa-pattern-6": lambda: Declared(
        "model-gemma3-swa-pattern-6", MODEL_ONLY | INTERLEAVED, make_swa_pattern_6_model_adapter(),
        layer_caches=False, model_limits={"architectures": ["gemma3"], "window_pattern": 6,
                                          "local_rope_base": 10000.0}),
    # an engine of uniform windows, and one that runs only Llamas, each declaring no more
    "model-uniform-windows": lambda: Declared("model-uniform-windows", MODEL_ONLY | {"float64"}, UniformWindows(),
                                              layer_caches=False),
    "model-llama-only": lambda: Declared("model-llama-only", MODEL_ONLY | INTERLEAVED, LlamaOnly(),
                                         layer_caches=False),
    # float32 over a float16 cache (llama.cpp's default) through every new operation: the precision rule covers them
    "model-float32-gemma3": lambda: Declared("model-float32-gemma3", MODEL_ONLY | {"interleaved_windows"},
                                             LowPrecisionModelAdapter("float32", "float16"), layer_caches=False,
                                             dtype="float32", kv_storage="float16", model_limits=GEMMA3),
    # the gate activation read from a float16 table (ggml's CPU GELU, which llama.cpp's gemma3 runs), declared
    "model-float32-gelu-float16-table": lambda: Declared(
        "model-float32-gelu-float16-table", MODEL_ONLY | {"interleaved_windows"}, make_gelu_table_model_adapter(),
        layer_caches=False, dtype="float32", kv_storage="float16", model_limits=GEMMA3, activation_table="float16"),
}
# -- windowed stores (docs/spec.md §15.2, §15.4, §15.7): eviction, rings, kept sink tokens --
SINKS = {"attention_sinks"}


class IgnoresSinks(ModelReferenceAdapter):
    """Handed kept sink tokens, computes as if it were handed none: past its window a token no longer sees them."""

    def create_context(self, model: Any, config: Any) -> ModelContext:
        return super().create_context(model, dataclasses.replace(config, sinks=0))


MODEL_VARIANTS.update({
    # keeps only the cells its window still sees, evicting lazily (llama.cpp's SWA cache without swa_full)
    "model-window-cells-visible": lambda: Declared(
        "model-window-cells-visible", MODEL_ONLY | SINKS, make_windowed_store_model_adapter(), layer_caches=False,
        model_policy=WindowedStoreModelAdapter.model_policy),
    # and refuses a removal to the end once a sequence has held W tokens (a ring)
    "model-window-removal-until-full": lambda: Declared(
        "model-window-removal-until-full", MODEL_ONLY | SINKS, make_ring_model_adapter(), layer_caches=False,
        model_policy=RingModelAdapter.model_policy),
    # keeps sink tokens, every cell kept
    "model-attention-sinks": lambda: Declared("model-attention-sinks", MODEL_ONLY | SINKS, make_model_adapter(),
                                              layer_caches=False),
})
MODEL_TWINS: dict[str, tuple[Callable[[], Any], str, dict[str, Any], str]] = {
    # uniform windows claiming interleaved_windows: a global layer windowed, a local base ignored
    "model-uniform-windows-claims-interleaved": (lambda: Declared(
        "twin-uniform-windows", MODEL_ONLY | INTERLEAVED, UniformWindows(), layer_caches=False), "model", {}, ""),
    # a GELU read from a float16 table over a float16 cache, undeclared: up to 2.6 x the float32 rule's budget
    # over a float32 cache: over a float16 one the storage estimate (§15.6) bounds the table's rounding as well
    "model-gelu-float16-table-undeclared": (lambda: Declared(
        "twin-gelu-float16-table", MODEL_ONLY | {"interleaved_windows"}, _gelu_table_over_a_float32_cache(),
        layer_caches=False, dtype="float32", kv_storage="float32", model_limits=GEMMA3, activation_table=None),
        "model", {}, ""),
    # a Llama-only engine claiming gemma3: the switches ignored
    "model-llama-only-claims-gemma3": (lambda: Declared(
        "twin-llama-only", MODEL_ONLY | INTERLEAVED, LlamaOnly(), layer_caches=False, model_limits=GEMMA3),
        "model", {}, ""),
    # evicts, declaring every cell kept: seq_pos_min moves up (wrong positions), or a batch the reference calls
    # full is done
    "model-window-cells-visible-claims-all": (lambda: Declared(
        "twin-window-cells-visible", MODEL_ONLY | SINKS, make_windowed_store_model_adapter(), layer_caches=False,
        model_policy=ModelReferenceAdapter.model_policy), "model", {}, ""),
    "model-window-removal-until-full-undeclared": (lambda: Declared(
        "twin-window-removal-until-full", MODEL_ONLY | SINKS, make_ring_model_adapter(), layer_caches=False,
        model_policy=WindowedStoreModelAdapter.model_policy), "model", {}, "expected success, got refused"),
    # declares attention_sinks, but ignores the sinks it is handed: logits past 1e-12
    "model-attention-sinks-ignored": (lambda: Declared(
        "twin-attention-sinks-ignored", MODEL_ONLY | SINKS, IgnoresSinks(), layer_caches=False), "model", {}, ""),
    **{f"model-{name}-undeclared": (lambda name=name, policy=policy: Declared(
        f"twin-model-{name}", REFERENCE, _model(policy), model_policy=ReferenceAdapter.model_policy), "model", {}, "")
       for name, policy in MODEL_POLICIES.items()},
    "model-unified-only-claims-both": (lambda: Declared("twin-model-unified-only", REFERENCE, OneContextKind(True)),
                                       "model", {}, ""),
    "model-per-sequence-only-claims-both": (
        lambda: Declared("twin-model-per-sequence-only", REFERENCE, OneContextKind(False)), "model", {}, ""),
    "model-negative-shift-claims-removed": (lambda: Declared("twin-model-no-negative-shift", REFERENCE,
                                                             NoNegativeShift()), "model", {}, "expected success"),
    "model-float16-kv-claims-float32": (lambda: _low_precision("float32"), "model", {}, ""),
    "model-q8_0-kv-claims-float16": (lambda: _low_precision("float16", "q8_0"), "model", {}, ""),
    "model-q4_0-kv-claims-q8_0": (lambda: _low_precision("q8_0", "q4_0"), "model", {}, ""),
    # affine groups of 4 bits declared as 8 bits: every group's step 17 x the declared one
    "model-uint4-groups-claims-uint8": (
        lambda: _affine_cache(declared=StorageRule("uint8", "per_group", group=4)), "model", {}, ""),
    # blocks cut from each head's row, declared along the kv row: a head of 16 drawn, which it refuses
    "model-q8_0-per-head-claims-row": (lambda: _row_blocks("q8_0", engine_along_row=False), "model", {},
                                       "unexpected exception"),
    "model-removal-end-only-undeclared": (lambda: Declared(
        "twin-removal-end-only", MODEL_ONLY, make_end_only_removal_model_adapter(), layer_caches=False,
        model_policy=ModelReferenceAdapter.model_policy), "model", {}, "expected success, got refused"),
    "model-vocab-from-three-undeclared": (lambda: Declared("twin-vocab-from-three", REFERENCE, VocabFromThree()),
                                          "model", {}, "unexpected exception"),  # a 2-token model refused
    "model-norm-float32-undeclared": (
        lambda: Declared("twin-norm-float32", MODEL_ONLY | {"float64"}, make_float32_norm_model_adapter(),
                         layer_caches=False, mixed_precision={}), "model", {}, ""),  # logits past 1e-12
    "model-width-divisible-by-heads-undeclared": (
        lambda: Declared("twin-width-by-heads", REFERENCE, WidthByHeads()), "model", {}, "unexpected exception"),
    # accepts what it claims to reject: a malformed batch, an unknown sequence, a batch past the room
    "model-accepts-unclaimed-claims-validation": (lambda: Declared(
        "twin-accepts-claims-validation", MODEL_ONLY - SHARED_TOKENS, AcceptsWhatItDoesNotClaim(), layer_caches=False),
        "model", {},
        "expected"),
    # rounds up but reports the cells asked for: a batch past that room is accepted
    "model-cells-rounded-up-reports-the-cells-asked": (lambda: Declared(
        "twin-reports-the-cells-asked", MODEL_ONLY, ReportsTheCellsAskedFor(), layer_caches=False), "model", {},
        "expected full, got success"),
    # an empty sequence started at 1-3 is held from 0; positions that do not run on are numbered, not refused
    "model-positions-from-zero-undeclared": (lambda: Declared(
        "twin-positions-from-zero", MODEL_ONLY, make_positions_from_zero_model_adapter(), layer_caches=False,
        model_policy=ModelReferenceAdapter.model_policy), "model", {}, ""),
    # takes one sequence per token, but declares multi_sequence_tokens: a shared prompt is held by its first alone
    "model-one-sequence-per-token-claims-several": (
        lambda: Declared("twin-one-sequence-per-token", REFERENCE, FirstSequenceOnly()), "model", {}, ""),
    # grows, but claims fixed_capacity of a fixed store: a batch past the room is accepted where full is claimed
    "model-capacity-grows-claims-fixed": (lambda: Declared(
        "twin-capacity-grows", MODEL_ONLY, make_growing_model_adapter(), layer_caches=False,
        model_policy=ModelReferenceAdapter.model_policy), "model", {}, ""),
}


VARIANTS: dict[str, Callable[[], Any]] = {
    **{f"without-{c}": (lambda c=c: _without(c)) for c in sorted(REFERENCE)},
    "paged-only": lambda: Declared("paged-only", DECODER | {"paged_prefix_sharing", "validates_tokens",
                                                             "validates_length", "binding_checks"}),
    "session-only": lambda: Declared("session-only", DECODER | {"decode_session", "sliding_window",
                                                                 "validates_tokens", "binding_checks",
                                                                 "fixed_capacity"}),
    "store-only": lambda: Declared("store-only", DECODER | {"prefix_store", "sliding_window", "validates_tokens"}),
    "nothing-validated": lambda: Declared("nothing-validated", {
        c for c in REFERENCE if not c.startswith("validates_") and c not in {
            "non_finite_rejection", "binding_checks", "fixed_capacity", "creation_errors"}},
        error_kind=_claims_only),
    "reset-zeroes": lambda: Declared("reset-zeroes", (REFERENCE - {"reset_keeps_bytes"}) | {
        "reset_keeps_buffers", "reset_zeroes"}, ZeroingReset()),
    "reset-keeps-buffers": lambda: Declared("reset-keeps-buffers", (REFERENCE - {"reset_keeps_bytes"}), ZeroingReset()),
    "reset-by-replacement": lambda: Declared("reset-by-replacement", LAYER_ONLY - {
        "reset_keeps_bytes", "reset_keeps_buffers"}, ResetByReplacement()),
    "no-reset-no-fixed-capacity": lambda: Declared("no-reset-no-fixed-capacity", LAYER_ONLY - {
        "fixed_capacity", "physical_storage", "reset_keeps_bytes", "reset_keeps_buffers", "creation_errors"},
        NoFixedCapacity()),
    **{f"policy-{name}": (lambda name=name, policy=policy: Declared(
        f"policy-{name}", REFERENCE, _paged(policy), paged_policy={**ReferenceAdapter.paged_policy, **policy}))
       for name, policy in POLICIES.items()},
    "limits-tied-two-heads": lambda: Declared("limits-tied-two-heads", REFERENCE, TiedGeometry(), layer_limits={
        "model_width_is_heads_times_head_width": True, "max_heads": 2}),
    "limits-wide-heads": lambda: Declared("limits-wide-heads", REFERENCE, WideHeads(), layer_limits={
        "min_head_width": 4, "head_width_multiple": 4, "model_width_divisible_by_heads": True}),
    "limits-small": lambda: Declared("limits-small", REFERENCE, SmallOnly(), layer_limits={
        "max_heads": 1, "max_batch": 1, "max_capacity": 5, "max_model_width": 3, "max_rotary_width": 2,
        "min_window": 2}),
    # layers of two shapes per attention kind all run long, as for a JIT framework (the reference compiles nothing:
    # CompilesPerShape is judged by the layer machine alone, tests/test_few_shapes.py)
    "limits-few-shapes": lambda: Declared("limits-few-shapes", REFERENCE, layer_limits={"max_shapes": 2}),
    "positionless-only": lambda: Declared("positionless-only", LAYER_ONLY - {  # no with_rope: never called
        "rope_interleaved", "rope_half_split", "keys_unrotated", "partial_rotary"}),
    "keeps-every-row": lambda: Declared("keeps-every-row", REFERENCE, KeepsEveryRowAdapter()),
    "window-truncates-until-full": lambda: Declared("window-truncates-until-full", REFERENCE | {
        "window_truncates_until_full"}, WindowUntilFullAdapter()),
    "mixed-rope-float32": lambda: Declared("mixed-rope-float32", {"rope_interleaved"}, make_float32_rope_adapter(),
                                           mixed_precision={"rope": "float32"}),
    "mixed-rotation-float32": lambda: Declared("mixed-rotation-float32", {"rope_interleaved"},
                                               make_float32_rotation_adapter(),
                                               mixed_precision={"rotation": "float32"}),
    "mixed-softmax-float32": lambda: Declared("mixed-softmax-float32", {"rope_interleaved"},
                                              make_float32_softmax_adapter(), mixed_precision={"softmax": "float32"}),
    "mixed-transcendentals-float32": lambda: Declared("mixed-transcendentals-float32", {"rope_interleaved"},
                                                      make_float32_transcendentals_adapter(),
                                                      mixed_precision={"transcendentals": "float32"}),
    # affine groups of 32 features (HQQ's smallest usual size): heads of 32 drawn, the group implying the limit
    "storage-uint4-groups-of-32": lambda: Declared("storage-uint4-groups-of-32", QuantizedReferenceAdapter.capabilities,
                                                   _affine("uint4", 32), storage=_affine("uint4", 32).storage),
    # a coarse guard for near-constant groups (HQQ's is 1e-4; 0.1 shows in every program): declared min_step
    "storage-uint4-min-step": lambda: Declared("storage-uint4-min-step", QuantizedReferenceAdapter.capabilities,
                                               _affine("uint4", 4, 0.1), storage=_affine("uint4", 4, 0.1).storage),
    # a window with sinks full at W + S rows (a ring of W + S slots): it refuses truncation from there on
    "window-full-counts-sinks": lambda: Declared("window-full-counts-sinks", REFERENCE | {
        "window_truncates_until_full", "window_full_counts_sinks"}, SinksRingAdapter()),
    # affine groups with the zero point on a level (0 exact, the range widened to hold it): declared zero_point
    "storage-uint4-zero-point-level": lambda: Declared(
        "storage-uint4-zero-point-level", QuantizedReferenceAdapter.capabilities,
        _affine("uint4", 4, zero_point="level"), storage=_affine("uint4", 4, zero_point="level").storage),
    # affine groups as mlx stores them (the larger extreme exact, 0 on a level, the range not widened): declared
    "storage-uint4-zero-point-extreme": lambda: Declared(
        "storage-uint4-zero-point-extreme", QuantizedReferenceAdapter.capabilities,
        _affine("uint4", 4, zero_point="extreme"), storage=_affine("uint4", 4, zero_point="extreme").storage),
    # a windowed session that refuses a prefill of more than W tokens (litgpt from 0.5.13), declared
    "prefill-within-window": lambda: Declared("prefill-within-window", REFERENCE | {"prefill_within_window"},
                                              PrefillWithinWindowAdapter()),
    # a preallocated buffer without a full check: a write past its end raises IndexError, unmapped, unclaimed
    "unchecked-capacity": lambda: Declared("unchecked-capacity", REFERENCE - {"fixed_capacity"},
                                           UncheckedCapacityAdapter()),
}


def _affine(format: str, group: int, min_step: float = 0.0, zero_point: str = "minimum") -> QuantizedReferenceAdapter:
    return QuantizedReferenceAdapter(StorageRule(format, "per_group", group=group, min_step=min_step,
                                                 zero_point=zero_point))


# Each twin makes a design choice of a variant above, but declares the reference's: the machine named must fail
# it, with a failure kind starting so -- the lattice's properties are not vacuous.
# The failure kind a twin is caught by: a prefix, or any of several (a wrong declaration may show in more than one
# way, and which one a run meets first is its seed's).
TWINS: dict[str, tuple[Callable[[], Any], str, dict[str, Any], str | tuple[str, ...]]] = {
    "reset-zeroes-claims-keeps-bytes": (lambda: Declared("twin-reset-zeroes", REFERENCE, ZeroingReset()),
                                        "layer_cache", {}, "reset changed the storage"),
    "reset-by-replacement-claims-keeps-buffers": (
        lambda: Declared("twin-reset-by-replacement", LAYER_ONLY, ResetByReplacement()), "layer_cache", {},
        "reset"),
    "no-fixed-capacity-claims-fixed-capacity": (
        lambda: Declared("twin-no-fixed-capacity", LAYER_ONLY - {"physical_storage", "reset_keeps_bytes",
                                                                 "reset_keeps_buffers", "creation_errors"},
                         NoFixedCapacity()), "layer_cache", {}, "expected full"),
    "nothing-validated-claims-validation": (
        lambda: Declared("twin-nothing-validated", REFERENCE, error_kind=_claims_only), "layer_cache", {},
        "unexpected exception"),
    **{f"policy-{name}-undeclared": (lambda name=name, policy=policy: Declared(
        f"twin-policy-{name}", REFERENCE, _paged(policy), paged_policy=ReferenceAdapter.paged_policy), "paged", {},
        "") for name, policy in POLICIES.items() if name != "no-truncate"},
    "policy-no-truncate-claims-truncate": (lambda: Declared("twin-no-truncate", REFERENCE, NoTruncation()), "paged",
                                           {}, "unexpected exception"),
    "policy-shared-fork-claims-re-add": (lambda: Declared("twin-claims-re-add", REFERENCE, paged_policy={
        **ReferenceAdapter.paged_policy, "fork": "re_add"}), "paged", {}, ""),
    "repeat-tiles-claims-batch-repeat": (lambda: Declared("twin-repeat-tiles", REFERENCE, TilingRepeat()),
                                         "cache_operations", {}, ""),
    "limits-tied-two-heads-undeclared": (lambda: Declared("twin-tied", REFERENCE, TiedGeometry()), "layer_cache", {},
                                         "unexpected exception"),
    "limits-wide-heads-undeclared": (lambda: Declared("twin-wide-heads", REFERENCE, WideHeads()), "layer_cache", {},
                                     "unexpected exception"),
    "limits-small-undeclared": (lambda: Declared("twin-small", REFERENCE, SmallOnly()), "layer_cache", {},
                                "unexpected exception"),
    "limits-few-shapes-undeclared": (lambda: Declared("twin-compiles-per-shape", REFERENCE, CompilesPerShape(2)),
                                     "layer_cache", {}, "unexpected exception"),
    "window-truncates-until-full-undeclared": (
        lambda: Declared("twin-window-until-full", REFERENCE, WindowUntilFullAdapter()), "cache_operations",
        {"windowed": True}, "expected success, got evicted"),
    "prefill-within-window-undeclared": (
        lambda: Declared("twin-prefill-within-window", REFERENCE, PrefillWithinWindowAdapter()), "session", {},
        "expected success, got refused"),
    "window-truncates-until-full-claimed-by-the-reference": (
        lambda: Declared("twin-claims-until-full", REFERENCE | {"window_truncates_until_full"}), "cache_operations",
        {"windowed": True}, "expected evicted, got success"),
    "sinks-claimed-by-a-plain-window": (lambda: Declared("twin-sinks-ignored", REFERENCE, SinksIgnored()),
                                        "cache_operations", {"windowed": True}, ""),  # a row missing, or its output
    "mixed-rope-float32-undeclared": (
        lambda: Declared("twin-rope-float32", {"float64", "rope_interleaved"}, make_float32_rope_adapter(),
                         mixed_precision={}), "layer_cache", {}, ""),
    "mixed-rotation-float32-undeclared": (
        lambda: Declared("twin-rotation-float32", {"float64", "rope_interleaved"}, make_float32_rotation_adapter(),
                         mixed_precision={}), "layer_cache", {}, ""),
    "mixed-softmax-float32-undeclared": (
        lambda: Declared("twin-softmax-float32", {"float64", "rope_interleaved"}, make_float32_softmax_adapter(),
                         mixed_precision={}), "layer_cache", {}, ""),
    "storage-uint4-claims-uint8": (
        lambda: Declared("twin-uint4-claims-uint8", QuantizedReferenceAdapter.capabilities, _affine("uint4", 8),
                         storage=_affine("uint8", 8).storage), "layer_cache", {}, ""),
    "storage-uint4-min-step-undeclared": (
        lambda: Declared("twin-min-step-undeclared", QuantizedReferenceAdapter.capabilities, _affine("uint4", 4, 0.1),
                         storage=_affine("uint4", 4).storage), "layer_cache", {}, ""),
    "mixed-transcendentals-float32-undeclared": (
        lambda: Declared("twin-transcendentals-float32", {"float64", "rope_interleaved"},
                         make_float32_transcendentals_adapter(), mixed_precision={}), "layer_cache", {}, ""),
    # the ring of W + S slots declaring only window_truncates_until_full: judged to refuse from W rows on
    "window-full-counts-sinks-undeclared": (
        lambda: Declared("twin-full-counts-sinks", REFERENCE | {"window_truncates_until_full"}, SinksRingAdapter()),
        "cache_operations", {"windowed": True}, "expected evicted, got success"),
    # the zero point on a level declared as the group's minimum: a group of one sign has a coarser step than that
    "storage-uint4-zero-point-undeclared": (
        lambda: Declared("twin-zero-point-undeclared", QuantizedReferenceAdapter.capabilities,
                         _affine("uint4", 4, zero_point="level"), storage=_affine("uint4", 4).storage),
        "cache_operations", {}, ""),
    # PyTorch's groups (the range widened to hold 0) declared as mlx's: a group of one sign, in [a, b] above 0, is
    # stored at the widened range's step, b / (b - a) times mlx's. (mlx's groups declared as the minimum's cannot
    # fail: the far end errs under levels / (levels + 1) of the minimum's step, its whole floor -- spec §13.6.)
    "storage-uint4-zero-point-level-declared-extreme": (
        lambda: Declared("twin-zero-point-level-declared-extreme", QuantizedReferenceAdapter.capabilities,
                         _affine("uint4", 4, zero_point="level"),
                         storage=_affine("uint4", 4, zero_point="extreme").storage),
        "layer_cache", {}, ""),
    # the buffer without a full check claiming one: what it raises past the end (IndexError, or RoPE's error where
    # the capacity is the RoPE range) is not full; nor is a refusal of another kind (non_finite, of a row whose score
    # overflows) where it checks that before its room
    "unchecked-capacity-claims-fixed-capacity": (
        lambda: Declared("twin-unchecked-capacity", REFERENCE, UncheckedCapacityAdapter()), "layer_cache", {},
        ("unexpected exception", "expected full")),
    # not a wrong declaration but a design no declaration makes conform: honestly declared (no fixed_capacity),
    # the write clamped onto the last row held fails all the same -- accepted, or raised after it (which of the two
    # a run meets first depends on its programs: the second since the layer machines' hard cases of 2026-12-06)
    "clamping-buffer-without-fixed-capacity": (
        lambda: Declared("twin-clamping-buffer", REFERENCE - {"fixed_capacity"}, ClampingBuffer()), "layer_cache",
        {}, ("an accepted call changed a row held before it", "state changed by a call that raised")),
}


# -- paged declarations: hits of cached copies, node eviction, opaque block ids (#23) -----------------------------

class OpaqueBlockIds(ReferenceAdapter):
    """A pool whose block ids are strings ("page-1", ...), its pages numbered from 1: ids are any hashables."""

    padding_page: ClassVar[bool] = True

    def paged_state(self, pool: Any) -> Any:
        state = super().paged_state(pool)
        return _renamed(state, lambda sequence, block: f"page-{block}")


class BlockIdsPerTable(ReferenceAdapter):
    """A pool that names each block after the table holding it: one block, two names, its sharing hidden."""

    def paged_state(self, pool: Any) -> Any:
        state = super().paged_state(pool)
        return _renamed(state, lambda sequence, block: f"{sequence}:{block}")


def _renamed(state: Any, name: Callable[[Any, int], Any]) -> Any:
    """``state`` with each held block named ``name(sequence, block)`` and each cached one ``name(None, block)``."""
    tables = {sequence: tuple(name(sequence, b) for b in table) for sequence, table in state.tables.items()}
    references: dict[Any, int] = {}
    for table in tables.values():
        for block in table:
            references[block] = references.get(block, 0) + 1
    return PoolState(state.total, state.free, tuple(name(None, b) for b in state.cached), references, tables)


VARIANTS.update({
    "policy-hit-copy-cached-first": lambda: Declared("policy-hit-copy-cached-first", REFERENCE,
                                                     CachedFirstPagedAdapter(),
                                                     paged_policy=CachedFirstPagedAdapter.paged_policy),
    "policy-evict-lru-nodes": lambda: Declared("policy-evict-lru-nodes", REFERENCE, NodeLruPagedAdapter(),
                                               paged_policy=NodeLruPagedAdapter.paged_policy),
    "paged-pages-from-one": lambda: Declared("paged-pages-from-one", REFERENCE, PaddingPagePagedAdapter()),
    "paged-block-ids-opaque": lambda: Declared("paged-block-ids-opaque", REFERENCE, OpaqueBlockIds()),
})
TWINS.update({
    # hits any copy (the first registered), declares that it hits cached copies first
    "policy-any-copy-claims-cached-first": (lambda: Declared(
        "twin-claims-cached-first", REFERENCE, RegisteredDuplicatesPagedAdapter(),
        paged_policy=CachedFirstPagedAdapter.paged_policy), "paged", {}, ""),  # the copy taken, or full not raised
    # evicts whole nodes, declares block-exact lru: the radix cache, failed inside add
    "policy-evict-lru-nodes-claims-lru": (lambda: Declared(
        "twin-nodes-claim-lru", REFERENCE, NodeLruPagedAdapter(), paged_policy=ReferenceAdapter.paged_policy),
        "paged", {}, "eviction against the declared policy"),
    # ids are opaque, but an id names one block: named per table, a shared block is counted twice
    "paged-block-ids-per-table": (lambda: Declared("twin-block-ids-per-table", REFERENCE, BlockIdsPerTable()),
                                  "paged", {}, ""),
})
# -- ragged batches (docs/spec.md §13.8): another layout, and a filter that cannot leave no rows -----------------

class PerRowCaches:
    """A ragged batch as a server keeps one: a one-row ``LayerKvCache`` per request, each at its own offsets
    (no padding anywhere), merged, extracted and filtered as lists. The reference's generic methods (reset,
    truncate, select, repeat_interleave, merge, extract, filter, and the snapshot's ``row``) reach it by duck
    typing; only the append is the adapter's own."""

    def __init__(self, layer: Any, batch_size: int, capacity: int, rows: list[LayerKvCache] | None = None,
                 binding: LayerKvCache | None = None, window: int | None = None) -> None:
        self.layer, self.capacity, self.window = layer, capacity, window
        # under a window, each row a ring of min(C, W) slots that lets its oldest tokens go
        self.rows = rows if rows is not None else [LayerKvCache(layer, 1, capacity, window)
                                                   for _ in range(batch_size)]
        # the batch's own binding: a batch of no rows is still bound (a stale one stays stale, docs/spec.md §13.8)
        self.binding = binding if binding is not None else LayerKvCache(layer, 1, 1)

    @property
    def batch_size(self) -> int:
        return len(self.rows)

    def row(self, index: int) -> tuple[Any, ...]:
        row = self.rows[index]
        return (row.keys()[0], row.values()[0]) + ((row.positions(),) if self.window is not None else ())

    def reset(self) -> None:
        for row in self.rows:
            row.reset()

    def truncate(self, n: Any) -> None:
        longest = max((row.length for row in self.rows), default=0)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= longest:
            _probe(self.layer).truncate(n)  # raises its InvalidLength (nothing is valid above 0 there)
        for row in self.rows:
            row.truncate(min(n, row.length))

    def _picked(self, rows: Any) -> None:
        self.rows = [self.rows[int(b)].fork() for b in rows]

    def select(self, indices: Any) -> None:
        probe = _probe(self.layer, self.batch_size)
        probe.select(indices)  # its validation, nothing else
        self._picked(np.asarray(indices))

    def repeat_interleave(self, repeats: Any) -> None:
        _probe(self.layer, self.batch_size).repeat_interleave(repeats)
        self._picked(np.repeat(np.arange(self.batch_size), int(repeats)))

    def filter(self, rows: Any) -> None:
        _probe(self.layer, max(1, self.batch_size), self.batch_size).filter(rows)
        self._picked(np.asarray(rows, dtype=np.int64).reshape(-1))

    def extract(self, row: Any) -> PerRowCaches:
        _probe(self.layer, max(1, self.batch_size), self.batch_size).extract(row)
        return PerRowCaches(self.layer, 1, self.capacity, [self.rows[int(row)].fork()], self.binding, self.window)

    def merge(self, other: PerRowCaches) -> None:
        self.binding.check_binding_of(other.binding)
        self.rows = [*self.rows, *(row.fork() for row in other.rows)]

    def reorder(self, indices: Any) -> None:
        _probe(self.layer, max(1, self.batch_size), self.batch_size).reorder(indices)
        self._picked(np.asarray(indices, dtype=np.int64).reshape(-1))

    def fork(self) -> PerRowCaches:
        return PerRowCaches(self.layer, 0, self.capacity, [row.fork() for row in self.rows], self.binding,
                            self.window)


def _probe(layer: Any, batch_size: int = 1, rows: int | None = None, capacity: int = 1) -> RaggedKvCache:
    """An empty ragged cache of ``rows`` rows (0 allowed), only to check an argument as the reference does."""
    probe = RaggedKvCache(layer, batch_size, capacity)
    if rows is not None and rows != batch_size:
        probe.filter(list(range(rows)))
    return probe


class PerRowRaggedAdapter(ReferenceAdapter):
    """Ragged batches kept as one cache per row (a serving engine's layout): conforms, nothing to declare. The
    call's own checks are the reference's, on a probe of the batch's size holding nothing; then every row's binding
    and room, every row computed before any is written."""

    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        RaggedKvCache(layer, batch_size, capacity, window=window)  # the creation checks
        return PerRowCaches(layer, batch_size, capacity, window=window)

    def append_ragged(self, layer: Any, cache: Any, x: Any, lengths: Any) -> Any:
        probe = _probe(layer, max(1, cache.batch_size), cache.batch_size, capacity=layer.rope.max_positions)
        layer.forward_ragged(x, lengths, probe)
        counts = probe.lengths  # the lengths, checked: what the probe appended
        for row in (cache.binding, *cache.rows):
            row.check_binding(layer)
        for row, count in zip(cache.rows, counts):
            if row.length + int(count) > row.capacity:
                raise CacheFull(row.capacity)
        tokens, output = x.shape[1], np.zeros(x.shape)
        prepared = [(b, row, layer.prepare(np.ascontiguousarray(x[b:b + 1, tokens - count:]), row))
                    for b, (row, count) in enumerate(zip(cache.rows, counts)) if count]
        for b, row, rows in prepared:
            output[b, tokens - rows.output.shape[1]:] = rows.output[0]
            row.commit(rows.keys, rows.values)
        return output


class FilterRefusesNone(RaggedKvCache):
    """A ragged cache whose filter refuses to leave no rows (a library that drops its batch instead)."""

    def filter(self, rows: object) -> None:
        if len(np.asarray(rows).reshape(-1)) == 0:
            raise InvalidIndices("a filter keeps at least one row")
        super().filter(rows)


class FilterRefusesNoneAdapter(ReferenceAdapter):
    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        return FilterRefusesNone(layer, batch_size, capacity, window=window)


class ScaledOverTheBatch(RaggedKvCache):
    """A ragged cache storing each chunk at one int4 scale over the whole batch (padding included): what a row
    stores depends on the other rows."""

    def commit(self, keys: Any, values: Any, counts: Any) -> None:
        rule = StorageRule("int4", "per_tensor")
        super().commit(rule.round(keys, rule.scale_for(keys)), rule.round(values, rule.scale_for(values)), counts)


class RaggedScaledOverTheBatch(QuantizedReferenceAdapter):
    """Layer caches in affine uint4 groups of 4, as declared; ragged batches at a scale over the batch. Honest
    without the ragged capabilities (docs/spec.md §13.8: such a scale is not a row's)."""

    def __init__(self) -> None:
        super().__init__(StorageRule("uint4", "per_group", group=4))

    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        return ScaledOverTheBatch(layer, batch_size, capacity, window=window)


class RaggedWindowIgnored(ReferenceAdapter):
    """Window layer caches as the reference's, but ragged batches that attend to every token of a row whatever
    the window asked for: honest without sliding_window_layer (its windows are then never asked for)."""

    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        return RaggedKvCache(layer, batch_size, capacity)


class RaggedRowsGrow(ReferenceAdapter):
    """Ragged rows that grow past the capacity asked for (a cache that reallocates): honest without
    fixed_capacity, an append past a row's room accepted (docs/spec.md §13.8)."""

    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        cache = RaggedKvCache(layer, batch_size, capacity, window=window)
        cache.capacity = 1 << 40
        return cache


class MergeUnchecked(RaggedKvCache):
    """A ragged cache whose merge takes a batch bound to any layer of the same geometry."""

    def merge(self, other: RaggedKvCache) -> None:
        other._binding = self._binding
        super().merge(other)


class MergeUncheckedAdapter(ReferenceAdapter):
    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        return MergeUnchecked(layer, batch_size, capacity, window=window)


class RaggedForkShared(ReferenceAdapter):
    """Layer caches fork, but a ragged batch's fork is the batch itself: honest without fork (it is drawn on both
    kinds of cache where declared)."""

    def fork(self, cache: Any) -> Any:
        return cache if isinstance(cache, RaggedKvCache) else super().fork(cache)


class ReorderKeepsLengths(RaggedKvCache):
    """A ragged cache whose reorder moves the rows' slots but keeps each place's old length."""

    def reorder(self, indices: object) -> None:
        RaggedKvCache.reorder(self.fork(), indices)  # the reference's checks, on a copy
        rows, real = np.asarray(indices, dtype=np.int64).reshape(-1), self._real()
        self._relayout(self._keys[rows], self._values[rows], real)


class RaggedReorderKeepsLengths(ReferenceAdapter):
    """Layer caches reorder, but a ragged batch's reorder keeps each place's length: honest without
    batch_reorder."""

    def create_ragged_cache(self, layer: Any, batch_size: int, capacity: int, window: Any = None) -> Any:
        return ReorderKeepsLengths(layer, batch_size, capacity, window=window)


class CreationUnchecked(RaggedKvCache):
    """A ragged cache whose creation checks nothing of its own: a bad size fails as numpy makes it fail (a raw
    error), or is taken (a bool, zero rows, any capacity)."""

    def __init__(self, layer: Any, batch_size: Any, capacity: Any, window: Any = None) -> None:
        super().__init__(layer, 1, 1, window=window)
        empty = np.zeros((batch_size, self.kv_heads, 0, self.head_width))
        self._set(empty, empty.copy(), np.zeros(batch_size, dtype=np.int64))
        self.capacity = capacity


class RaggedCreationUnchecked(ReferenceAdapter):
    """Honest without creation_errors."""

    def create_ragged_cache(self, layer: Any, batch_size: Any, capacity: Any, window: Any = None) -> Any:
        return CreationUnchecked(layer, batch_size, capacity, window)


VARIANTS.update({
    # one cache per row, each at its own offsets: another layout of the same rows (nothing to declare)
    "ragged-per-row-caches": lambda: Declared("ragged-per-row-caches", REFERENCE, PerRowRaggedAdapter()),
    # a filter that cannot leave no rows: honest without batch_filter (merge and extract still judged)
    "ragged-filter-refuses-none": lambda: Declared("ragged-filter-refuses-none", REFERENCE - {"batch_filter"},
                                                   FilterRefusesNoneAdapter()),
    # rows that grow past their room, a merge that checks no binding, a fork that is the batch itself, a reorder
    # that keeps each place's length, a creation that checks nothing: each honest without what it does not do
    "ragged-rows-grow": lambda: Declared("ragged-rows-grow", REFERENCE - {"fixed_capacity"}, RaggedRowsGrow()),
    "ragged-merge-unchecked": lambda: Declared("ragged-merge-unchecked", REFERENCE - {"binding_checks"},
                                               MergeUncheckedAdapter()),
    "ragged-fork-shared": lambda: Declared("ragged-fork-shared", REFERENCE - {"fork"}, RaggedForkShared()),
    "ragged-reorder-keeps-lengths": lambda: Declared("ragged-reorder-keeps-lengths", REFERENCE - {"batch_reorder"},
                                                     RaggedReorderKeepsLengths()),
    "ragged-creation-unchecked": lambda: Declared("ragged-creation-unchecked", REFERENCE - {"creation_errors"},
                                                  RaggedCreationUnchecked()),
    # ragged batches that ignore the window: honest without sliding_window_layer (and what needs it)
    "ragged-window-ignored": lambda: Declared("ragged-window-ignored", REFERENCE - {"sliding_window_layer"} - DEPENDS[
        "sliding_window_layer"], RaggedWindowIgnored()),
    # ragged batches truncated by columns (transformers' crop of a left-padded cache), declared so
    "ragged-truncate-by-columns": lambda: Declared("ragged-truncate-by-columns", REFERENCE, ColumnsTruncateAdapter(),
                                                   ragged_truncate="columns"),
    # ragged batches stored at a scale over the batch, beside uint4 groups as declared: honest without ragged rows
    "storage-ragged-scaled-over-the-batch": lambda: Declared(
        "storage-ragged-scaled-over-the-batch", QuantizedReferenceAdapter.capabilities - BATCHES_CAPABILITIES,
        RaggedScaledOverTheBatch(), storage=RaggedScaledOverTheBatch().storage),
})
TWINS.update({
    # the same cache declaring batch_filter: a filter to no rows must succeed (docs/spec.md §13.8)
    "ragged-filter-refuses-none-claims-batch-filter": (
        lambda: Declared("twin-filter-refuses-none", REFERENCE, FilterRefusesNoneAdapter()), "batches", {},
        "expected success"),
    "ragged-rows-grow-claims-fixed-capacity": (
        lambda: Declared("twin-ragged-rows-grow", REFERENCE, RaggedRowsGrow()), "batches", {}, "expected full"),
    "ragged-merge-unchecked-claims-binding-checks": (
        lambda: Declared("twin-ragged-merge-unchecked", REFERENCE, MergeUncheckedAdapter()), "batches", {},
        # expected layer_mismatch, revision_mismatch or rope_mismatch, got success; or, merging a batch of another
        # geometry it never compared, the concatenation's own error, unmapped
        ("expected ", "unexpected exception")),
    "ragged-fork-shared-claims-fork": (
        lambda: Declared("twin-ragged-fork-shared", REFERENCE, RaggedForkShared()), "batches", {},
        "fork not independent"),
    "ragged-reorder-keeps-lengths-claims-batch-reorder": (
        lambda: Declared("twin-ragged-reorder-keeps-lengths", REFERENCE, RaggedReorderKeepsLengths()), "batches",
        {}, "wrong row length"),
    # the same declaring ragged rows: its uint4 groups are judged on each row's own tokens, and int4 over the batch
    # is coarser than them
    "storage-ragged-scaled-over-the-batch-claims-ragged-rows": (
        lambda: Declared("twin-ragged-scaled-over-the-batch", QuantizedReferenceAdapter.capabilities,
                         RaggedScaledOverTheBatch(), storage=RaggedScaledOverTheBatch().storage), "batches", {}, ""),
    # the same truncating by columns, declaring the default (each row its first n tokens; the inner cache's own
    # declaration would reach through)
    "ragged-truncate-by-columns-claims-per-row": (
        lambda: Declared("twin-ragged-truncate-by-columns", REFERENCE, ColumnsTruncateAdapter(),
                         ragged_truncate="per_row"), "batches", {},
        "wrong row length"),
    "ragged-window-ignored-claims-sliding-window-layer": (
        lambda: Declared("twin-ragged-window-ignored", REFERENCE, RaggedWindowIgnored()), "batches", {}, ""),
    "ragged-creation-unchecked-claims-creation-errors": (
        lambda: Declared("twin-ragged-creation-unchecked", REFERENCE, RaggedCreationUnchecked()), "batches", {},
        ""),  # either face: a raw error (negative, a float, None) or an acceptance (a bool, zero rows)
})


# -- the caches of a model's layers (docs/spec.md §13.9): another layout, and transformers' crop over a layer never
# written ---------------------------------------------------------------------------------------------------------

class EagerLayers:
    """A layered cache that builds every layer's cache at creation (a static cache's layout): no layer is ever
    "never written" inside, and every operation is the layer caches' own, one layer after another -- all or nothing
    because every layer checks the same argument against the same batch before the first changes."""

    def __init__(self, layers: list[Any], batch_size: int, capacity: int) -> None:
        self.layers = list(layers)
        self.caches = [LayerKvCache(layer, batch_size, capacity) for layer in layers]

    def append(self, index: Any, x: Any) -> Any:
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.caches):
            raise InvalidIndices(f"layer {index!r}")
        return self.layers[index].forward_chunk(x, self.caches[index])

    def layer_rows(self, index: int) -> tuple[Any, Any]:
        return self.caches[index].keys(), self.caches[index].values()

    def reset(self) -> None:
        for cache in self.caches:
            cache.reset()

    def truncate(self, n: Any) -> None:
        longest = max(cache.length for cache in self.caches)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= longest:
            raise InvalidLength(n, longest)
        for cache in self.caches:
            cache.truncate(min(n, cache.length))

    def reorder(self, indices: Any) -> None:
        for cache in self.caches:
            cache.reorder(indices)

    def select(self, indices: Any) -> None:
        for cache in self.caches:
            cache.select(indices)

    def repeat_interleave(self, repeats: Any) -> None:
        for cache in self.caches:
            cache.repeat_interleave(repeats)


class EagerLayersAdapter(ReferenceAdapter):
    def create_layered_cache(self, layers: Any, batch_size: int, capacity: int) -> Any:
        return EagerLayers(layers, batch_size, capacity)


class CropsUpToANeverWrittenLayer(LayeredKvCache):
    """transformers' ``DynamicCache.crop`` over a lazily initialised layer (issue 38): the layers before a layer
    never written are cropped, then the crop raises there (``None`` has no keys to slice)."""

    def truncate(self, length: object) -> None:
        longest = max(self.lengths)
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= longest:
            raise InvalidLength(length, longest)
        for index in range(len(self.layers)):
            cache = self.cache_of(index)
            if cache is None:
                raise TypeError("'NoneType' object is not subscriptable")
            cache.truncate(min(length, cache.length))


class CropsUpToANeverWrittenLayerAdapter(ReferenceAdapter):
    def create_layered_cache(self, layers: Any, batch_size: int, capacity: int) -> Any:
        return CropsUpToANeverWrittenLayer(layers, batch_size, capacity)


VARIANTS.update({
    # every layer's cache built at creation: another layout of the same layers (nothing to declare)
    "layered-eager-layers": lambda: Declared("layered-eager-layers", REFERENCE, EagerLayersAdapter()),
    # the crop that raises at a layer never written: honest without layered_cache (its layer caches still judged)
    "layered-crop-raises-at-a-layer-never-written": lambda: Declared(
        "layered-crop-raises-at-a-layer-never-written", REFERENCE - {"layered_cache"},
        CropsUpToANeverWrittenLayerAdapter()),
})
TWINS.update({
    # the same cache declaring layered_cache: a valid crop must succeed over a layer never written (§13.9)
    "layered-crop-raises-at-a-layer-never-written-claims-layered-cache": (
        lambda: Declared("twin-crop-raises-at-a-layer-never-written", REFERENCE,
                         CropsUpToANeverWrittenLayerAdapter()), "layered_cache", {}, "unexpected exception"),
})
VARIANTS.update(MODEL_VARIANTS)
TWINS.update(MODEL_TWINS)


# -- what a variant's difference can reach -----------------------------------------------------------------
# A variant that differs from the reference only in one area read by one machine alone (the whole model, the pool,
# the cache operations of section 13, the prefix store) can change no verdict but that machine's property: it runs
# that property alone (every other one would judge the reference again: 40 of the 93 variants, most of the lattice's
# CI time). ``differences`` says where a variant differs; a difference outside every area runs the whole suite.

MODEL_CAPABILITIES = frozenset({"whole_model", "validates_model_batch", "validates_sequence_ops"} | set(
    DEPENDS["whole_model"]))
PAGED_CAPABILITIES = frozenset({"paged_prefix_sharing"})
OPERATIONS_CAPABILITIES = frozenset({"chunked_append", "truncate", "batch_reorder", "fork", "batch_select",
                                     "batch_repeat"})
BATCHES_CAPABILITIES = frozenset({"ragged_rows", "batch_merge", "batch_extract", "batch_filter"})
LAYERED_CAPABILITIES = frozenset({"layered_cache"})
AREAS = {  # area: (its capabilities, its declarations, its methods), and the property that judges it
    "model": (MODEL_CAPABILITIES, {"model_policy", "model_limits"},
              {m for c in MODEL_CAPABILITIES for m in METHODS_OF.get(c, ())}, "properties/test_whole_model.py"),
    "paged": (PAGED_CAPABILITIES, {"paged_policy"},
              {*METHODS_OF["paged_prefix_sharing"], "paged_fork", "paged_truncate"}, "properties/test_paged_cache.py"),
    # the cache operations of §13 that only the cache-operations machine reads (properties/machines/operations.py)
    "operations": (OPERATIONS_CAPABILITIES, set(), {m for c in OPERATIONS_CAPABILITIES for m in METHODS_OF[c]},
                   "properties/test_cache_operations.py"),
    "prefix store": (frozenset({"prefix_store"}), set(), set(), "properties/test_prefix_store.py"),
    # ragged batches (§13.8), read by the batches machine alone (properties/machines/batches.py)
    "batches": (BATCHES_CAPABILITIES, set(), {m for c in BATCHES_CAPABILITIES for m in METHODS_OF[c]},
                "properties/test_batches.py"),
    # the caches of a model's layers (§13.9), read by the layered-cache machine alone (properties/machines/layered.py)
    "layered": (LAYERED_CAPABILITIES, set(), {m for c in LAYERED_CAPABILITIES for m in METHODS_OF[c]},
                "properties/test_layered_cache.py"),
}
DECLARATION_NAMES = ("model_policy", "model_limits", "paged_policy", "layer_limits", "dtype", "storage", "kv_storage",
                     "mixed_precision", "error_kind")


def differences(adapter: Any) -> set[str]:
    """Where ``adapter`` (a lattice variant) differs from the reference: capabilities, declarations and methods
    it overrides, by name."""
    reference = ReferenceAdapter()
    found = set(declared(adapter.capabilities) ^ REFERENCE)
    found |= {name for name in DECLARATION_NAMES if name != "error_kind" and
              getattr(adapter, name, None) != getattr(reference, name, None)}
    inner = getattr(adapter, "_inner", adapter)
    for cls in type(inner).__mro__:
        if cls is ReferenceAdapter or not issubclass(cls, ReferenceAdapter):
            break
        found |= {name for name, value in vars(cls).items() if callable(value) and not name.startswith("__")}
    return found


def scope(name: str) -> str:
    """The properties that can tell lattice variant ``name`` from the reference: one file, or all of them."""
    return scope_of(variant(name))


def scope_of(adapter: Any) -> str:
    found = differences(adapter)
    for capabilities, declarations, methods, tests in AREAS.values():
        if found and found <= capabilities | declarations | methods:
            return tests
    return "properties"


def variant(name: str) -> Any:
    if name not in VARIANTS:
        raise KeyError(f"no lattice variant {name!r}; the variants: {', '.join(sorted(VARIANTS))}")
    return VARIANTS[name]()


def from_environment() -> Any:
    """The variant named by ``KVCACHE_LATTICE`` (``--kv-impl tests.lattice:from_environment``)."""
    return variant(os.environ["KVCACHE_LATTICE"])
