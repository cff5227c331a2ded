"""The reference implementation's adapter for the conformance suite.

It satisfies ``properties.protocol.KvCacheAdapter`` structurally (``impl``
never imports the suite): layers and caches are ``impl`` objects, error kinds
are the protocol's strings. Select it with
``KVCACHE_IMPL=impl.conformance:make_adapter`` (the default).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from . import __version__, errors
from .attention import AttentionLayer
from .cache import LayerKvCache, RaggedKvCache
from .decoder import Decoder, DecodeSession
from .functions import Functions
from .layered_cache import LayeredKvCache
from .model_conformance import MODEL_CAPABILITIES, MODEL_ERROR_KINDS, ModelReferenceMethods
from .paged_conformance import PagedReferenceMethods
from .prefix_store import BlockRows, PrefixStore, QueryResult
from .rope import RopeConfig
from .storage import StorageRule

ERROR_KINDS: dict[type[errors.KvCacheError], str] = {
    errors.InputDtypeError: "dtype",
    errors.InputRankError: "rank",
    errors.TokenCountError: "token_count",
    errors.InputBatchMismatch: "batch_mismatch",
    errors.InputWidthMismatch: "width_mismatch",
    errors.CacheGeometryMismatch: "geometry_mismatch",
    errors.CacheLayerMismatch: "layer_mismatch",
    errors.CacheLayerRevisionMismatch: "revision_mismatch",
    errors.CacheRopeMismatch: "rope_mismatch",
    errors.CacheFull: "full",
    errors.NonFiniteError: "non_finite",
    errors.InvalidTokens: "invalid_tokens",
    errors.InvalidCacheArgument: "invalid_argument",
    errors.ZeroBatchSize: "zero_batch",
    errors.ZeroCapacity: "zero_capacity",
    errors.CapacityExceedsPositions: "capacity_exceeds_positions",
    errors.ElementCountOverflow: "element_count_overflow",
    errors.AllocationFailed: "allocation_failed",
    errors.InvalidLength: "invalid_length",
    errors.RowsEvicted: "evicted",
    errors.InvalidIndices: "invalid_indices",
    errors.PrefillLongerThanWindow: "refused",
    **MODEL_ERROR_KINDS,
}


@dataclass(frozen=True, eq=False)
class Snapshot:
    """The fields of the suite's ``CacheSnapshot``, without importing the suite."""

    length: int
    keys: np.ndarray
    values: np.ndarray
    physical_keys: np.ndarray
    physical_values: np.ndarray
    buffer_identity: Hashable
    positions: np.ndarray


RAGGED_BATCHES = frozenset({"ragged_rows", "batch_merge", "batch_extract", "batch_filter"})


@dataclass(frozen=True, eq=False)
class RowState:
    """The fields of the suite's ``RowSnapshot``: one ragged row's own keys and values ``[KV, n, dh]``."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray | None = None  # None: every token, at 0 .. n - 1 (the reference keeps them all)


@dataclass(frozen=True, eq=False)
class LayerState:
    """The fields of the suite's ``LayerState``: one layer's keys and values ``[B, KV, n, dh]``."""

    keys: np.ndarray
    values: np.ndarray


class ReferenceAdapter(PagedReferenceMethods, ModelReferenceMethods):
    name = "impl-reference"
    version = __version__
    capabilities = frozenset({
        "float64", "input_validation", "non_finite_rejection", "binding_checks", "fixed_capacity",
        "creation_errors", "gqa", "rope_interleaved", "rope_half_split", "partial_rotary",
        "physical_storage", "reset_keeps_bytes", "positionless", "decode_session", "prefix_store",
        "sliding_window", "positions_sinusoidal", "positions_rope",
        "chunked_append", "truncate", "batch_reorder", "batch_select", "batch_repeat", "fork",
        "sliding_window_layer", "attention_sinks",
        "validates_length", "validates_indices", "paged_prefix_sharing",
        "ragged_rows", "batch_merge", "batch_extract", "batch_filter", "layered_cache",
    }) | MODEL_CAPABILITIES  # the whole model (docs/spec.md §15): impl.model_conformance

    def create_layer(self, weights: Any, rope: Any) -> AttentionLayer:
        return AttentionLayer.from_arrays(weights.wq, weights.wk, weights.wv, weights.wo,
                                          heads=weights.heads, kv_heads=weights.kv_heads, rope=_rope(rope))

    def recreate_layer(self, layer: AttentionLayer) -> AttentionLayer:
        return AttentionLayer.from_arrays(*(p.value for p in layer.parameters),
                                          heads=layer.heads, kv_heads=layer.kv_heads, rope=layer.rope)

    def with_rope(self, layer: AttentionLayer, rope: Any) -> AttentionLayer:
        return layer.with_rope(_rope(rope))

    def update_weights(self, layer: AttentionLayer, weights: Any) -> None:
        for parameter, values in zip(layer.parameters, (weights.wq, weights.wk, weights.wv, weights.wo)):
            parameter.assign(values)

    def create_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                     window: int | None = None, sinks: int = 0) -> LayerKvCache:
        return LayerKvCache(layer, batch_size, capacity, window, sinks=sinks)

    def step(self, layer: AttentionLayer, cache: LayerKvCache, x: np.ndarray) -> np.ndarray:
        return layer.forward_incremental(x, cache)

    # -- cache operations (spec §13) --------------------------------------------------------------------

    def append(self, layer: AttentionLayer, cache: LayerKvCache, x: np.ndarray) -> np.ndarray:
        return layer.forward_chunk(x, cache)

    def truncate(self, cache: LayerKvCache, n: int) -> None:
        cache.truncate(n)

    def reorder(self, cache: LayerKvCache, indices: Any) -> None:
        cache.reorder(indices)

    def select(self, cache: LayerKvCache, indices: Any) -> None:
        cache.select(indices)

    def repeat_interleave(self, cache: LayerKvCache, repeats: Any) -> None:
        cache.repeat_interleave(repeats)

    def fork(self, cache: LayerKvCache) -> LayerKvCache:
        return cache.fork()

    # -- ragged batches, merged and split (spec §13.8) ----------------------------------------------------

    def create_ragged_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                            window: int | None = None) -> RaggedKvCache:
        return RaggedKvCache(layer, batch_size, capacity, window=window)

    def append_ragged(self, layer: AttentionLayer, cache: RaggedKvCache, x: np.ndarray, lengths: Any) -> np.ndarray:
        return layer.forward_ragged(x, lengths, cache)

    def ragged_snapshot(self, cache: RaggedKvCache) -> list[RowState]:
        return [RowState(*cache.row(b)) for b in range(cache.batch_size)]

    def merge(self, cache: RaggedKvCache, other: RaggedKvCache) -> None:
        cache.merge(other)

    def extract(self, cache: RaggedKvCache, row: Any) -> RaggedKvCache:
        return cache.extract(row)

    def filter(self, cache: RaggedKvCache, rows: Any) -> None:
        cache.filter(rows)

    # -- the caches of a model's layers, operated at once (spec §13.9): reset, truncate, reorder, select and
    # repeat_interleave above take a LayeredKvCache too ---------------------------------------------------

    def create_layered_cache(self, layers: Any, batch_size: int, capacity: int) -> LayeredKvCache:
        return LayeredKvCache(layers, batch_size, capacity)

    def layered_append(self, cache: LayeredKvCache, layer: Any, x: np.ndarray) -> np.ndarray:
        return cache.append(layer, x)

    def layered_snapshot(self, cache: LayeredKvCache) -> list[LayerState]:
        return [LayerState(*cache.layer_rows(index)) for index in range(len(cache.layers))]

    def reset(self, cache: LayerKvCache) -> None:
        cache.reset()

    def snapshot(self, cache: LayerKvCache) -> Snapshot:
        keys, values = cache.key_storage, cache.value_storage
        return Snapshot(
            length=cache.length, keys=cache.keys(), values=cache.values(),
            physical_keys=keys.copy(), physical_values=values.copy(),
            buffer_identity=(keys.__array_interface__["data"][0], values.__array_interface__["data"][0]),
            positions=cache.positions())

    # -- the decoder (spec §9-10) ----------------------------------------------------------------------

    def create_decoder(self, config: Any, weights: Any) -> Decoder:
        rope = config.rope
        return Decoder.from_arrays(weights.embedding, [(b.wq, b.wk, b.wv, b.wo) for b in weights.blocks],
                                   heads=config.heads, kv_heads=config.kv_heads,
                                   rope=RopeConfig(rope.style, rope.base, rope.rotary_width, rope.max_positions),
                                   positions=config.positions, window=config.window,
                                   sinusoid_base=config.sinusoid_base)

    def update_block_weights(self, decoder: Decoder, block: int, weights: Any) -> None:
        self.update_weights(decoder.blocks[block], weights)

    def create_session(self, decoder: Decoder, capacity: int) -> DecodeSession:
        return DecodeSession(decoder, capacity)

    def prefill(self, session: DecodeSession, tokens: Any) -> np.ndarray:
        return session.prefill(tokens)

    def decode(self, session: DecodeSession, token: Any) -> np.ndarray:
        return session.decode(token)

    def reset_session(self, session: DecodeSession) -> None:
        session.reset()

    def session_state(self, session: DecodeSession) -> tuple[BlockRows, ...]:
        return tuple(BlockRows(c.keys()[0], c.values()[0], c.positions()) for c in session.caches)

    def create_store(self, capacity: int) -> PrefixStore:
        return PrefixStore(capacity)

    def store_prefill(self, store: PrefixStore, decoder: Decoder, scope: str, tokens: Any) -> QueryResult:
        return store.prefill(decoder, scope, tokens)

    def store_query(self, store: PrefixStore, decoder: Decoder, scope: str, tokens: Any) -> QueryResult:
        return store.query(decoder, scope, tokens)

    def store_entries(self, store: PrefixStore) -> list[Any]:
        return store.entries()

    def error_kind(self, error: BaseException) -> str | None:
        for error_type, kind in ERROR_KINDS.items():
            if isinstance(error, error_type):
                return kind
        return None


def _rope(rope: Any) -> RopeConfig:
    if rope is None:  # a positionless layer: RoPE of rotary width 0 rotates nothing, at any position
        return RopeConfig("interleaved", 10000.0, 0, 1 << 62)
    return RopeConfig(rope.style, rope.base, rope.rotary_width, rope.max_positions)


def make_adapter() -> ReferenceAdapter:
    return ReferenceAdapter()


_ZERO_POINT_NAMES = {"minimum": "", "level": ",zero point on a level", "extreme": ",larger extreme exact"}


class QuantizedReferenceAdapter(ReferenceAdapter):
    """The reference with K/V rows stored rounded (docs/spec.md §13.6): computation in float64, storage
    declared, so the suite judges it by the storage rule."""

    # its rows are not judged at 1e-12; ragged batches only where each token has its own scale (spec §13.8);
    # layered caches under a declared storage are not judged yet (spec §13.9)
    capabilities = ReferenceAdapter.capabilities - {"float64", "layered_cache"}

    def __init__(self, rule: StorageRule) -> None:
        self.rule = rule
        self.storage = rule.declared()
        if rule.scale not in ("none", "per_group"):  # a scale over the batch: no ragged batches
            self.capabilities = self.capabilities - RAGGED_BATCHES
        self.name = (f"{ReferenceAdapter.name}[{rule.format},groups of {rule.group}"
                     f"{_ZERO_POINT_NAMES[rule.zero_point]}]" if rule.scale == "per_group"
                     else f"{ReferenceAdapter.name}[{rule.format},{rule.scale},{rule.update}]")

    def create_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                     window: int | None = None, sinks: int = 0) -> LayerKvCache:
        return LayerKvCache(layer, batch_size, capacity, window, storage=self.rule, sinks=sinks)

    def create_ragged_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                            window: int | None = None) -> RaggedKvCache:
        return RaggedKvCache(layer, batch_size, capacity, storage=self.rule, window=window)


class ColumnsTruncateAdapter(ReferenceAdapter):
    """The reference whose ragged batches truncate by columns, declared (``ragged_truncate``, docs/spec.md §13.8):
    ``truncate(n)`` keeps the left-padded layout's first ``n`` columns, so every row drops its last ``longest - n``
    tokens (transformers' ``DynamicCache.crop`` under generate's layout; assisted decoding's rollback)."""

    name = f"{ReferenceAdapter.name}[ragged truncate by columns]"
    ragged_truncate = "columns"

    def create_ragged_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                            window: int | None = None) -> RaggedKvCache:
        return RaggedKvCache(layer, batch_size, capacity, window=window, truncation="columns")


def make_columns_truncate_adapter() -> ColumnsTruncateAdapter:
    return ColumnsTruncateAdapter()


class WindowUntilFullAdapter(ReferenceAdapter):
    """The reference whose window caches truncate only while they hold fewer than W rows, and refuse with
    ``evicted`` from then on (transformers' DynamicSlidingWindowLayer without recording), declared."""

    name = f"{ReferenceAdapter.name}[window truncates until full]"
    capabilities = ReferenceAdapter.capabilities | {"window_truncates_until_full"}

    def create_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                     window: int | None = None, sinks: int = 0) -> LayerKvCache:
        return LayerKvCache(layer, batch_size, capacity, window, truncates_until_full=window is not None,
                            sinks=sinks)


def make_window_until_full_adapter() -> WindowUntilFullAdapter:
    return WindowUntilFullAdapter()


class SinksRingAdapter(ReferenceAdapter):
    """The reference whose window caches refuse every truncation once full, where a cache with S sinks is full at
    W + S rows (a ring of W + S slots: the sinks' and the window's), declared."""

    name = f"{ReferenceAdapter.name}[window full at W + S]"
    capabilities = ReferenceAdapter.capabilities | {"window_truncates_until_full", "window_full_counts_sinks"}

    def create_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                     window: int | None = None, sinks: int = 0) -> LayerKvCache:
        return LayerKvCache(layer, batch_size, capacity, window, sinks=sinks, full_counts_sinks=window is not None)


def make_sinks_ring_adapter() -> SinksRingAdapter:
    return SinksRingAdapter()


class UncheckedCapacityAdapter(ReferenceAdapter):
    """The reference as a preallocated buffer without a full check: a step past its capacity is not refused with
    ``full`` but fails at the write, an IndexError before anything is written; it does not declare
    ``fixed_capacity``. A window cache, a ring, takes such a step (its positions are bounded by RoPE only)."""

    name = f"{ReferenceAdapter.name}[no full check]"
    capabilities = ReferenceAdapter.capabilities - {"fixed_capacity"}

    def create_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                     window: int | None = None, sinks: int = 0) -> LayerKvCache:
        return LayerKvCache(layer, batch_size, capacity, window, sinks=sinks, checks_room=False)


def make_unchecked_capacity_adapter() -> UncheckedCapacityAdapter:
    return UncheckedCapacityAdapter()


class KeepsEveryRowAdapter(ReferenceAdapter):
    """The reference whose window caches and sessions never evict: C slots, the window a mask only. They show
    more rows than the next query sees (docs/spec.md §9.1, §13.5 allow it), and nothing needs declaring."""

    name = f"{ReferenceAdapter.name}[keeps every row]"

    def create_cache(self, layer: AttentionLayer, batch_size: int, capacity: int,
                     window: int | None = None, sinks: int = 0) -> LayerKvCache:
        return LayerKvCache(layer, batch_size, capacity, window, keeps_every_row=True, sinks=sinks)

    def create_session(self, decoder: Decoder, capacity: int) -> DecodeSession:
        return DecodeSession(decoder, capacity, keeps_every_row=True)


def make_keeps_every_row_adapter() -> KeepsEveryRowAdapter:
    return KeepsEveryRowAdapter()


class PrefillWithinWindowAdapter(ReferenceAdapter):
    """The reference whose windowed sessions refuse a prefill of more than W tokens with ``refused``, before any
    block is prepared (litgpt from 0.5.13), declared."""

    name = f"{ReferenceAdapter.name}[prefill within the window]"
    capabilities = ReferenceAdapter.capabilities | {"prefill_within_window"}

    def create_session(self, decoder: Decoder, capacity: int) -> DecodeSession:
        return DecodeSession(decoder, capacity, prefill_within_window=True)


def make_prefill_within_window_adapter() -> PrefillWithinWindowAdapter:
    return PrefillWithinWindowAdapter()


class ReAddForkAdapter(ReferenceAdapter):
    """The reference whose paged pool forks by adding the parent's tokens again in its scope, as engines do for
    parallel sampling: registered blocks reused up to the hit limit, the rest computed anew; declared."""

    name = f"{ReferenceAdapter.name}[fork re-adds]"
    paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, "fork": "re_add"}


def make_re_add_fork_adapter() -> ReAddForkAdapter:
    return ReAddForkAdapter()


class EaglePagedAdapter(ReferenceAdapter):
    """The reference whose paged pool drops the last matched block of every hit, as vLLM does with an EAGLE draft
    head (its hidden states must be recomputed); declared."""

    name = f"{ReferenceAdapter.name}[hit drops the last block]"
    paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, "hit_limit": "drops_last_hit"}


def make_eagle_paged_adapter() -> EaglePagedAdapter:
    return EaglePagedAdapter()


class RequestKeysPagedAdapter(ReferenceAdapter):
    """The reference whose paged blocks are hashed with the request keys too -- a LoRA adapter's name, multimodal
    hashes, a salt -- each tagged with its name (vLLM's extra keys); declared."""

    name = f"{ReferenceAdapter.name}[request keys hashed]"
    paged_policy: ClassVar[dict[str, Any]] = {
        **ReferenceAdapter.paged_policy, "hash_keys": ["scope", "signature", "lora", "multimodal", "salt"]}


def make_request_keys_paged_adapter() -> RequestKeysPagedAdapter:
    return RequestKeysPagedAdapter()


class RegisteredDuplicatesPagedAdapter(ReferenceAdapter):
    """The reference whose paged pool does not de-duplicate: a block that fills with registered content is
    registered too, several blocks per hash, each evicted on its own (vLLM v1's BlockPool); declared."""

    name = f"{ReferenceAdapter.name}[duplicates registered]"
    paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, "duplicates": "registered"}


def make_registered_duplicates_paged_adapter() -> RegisteredDuplicatesPagedAdapter:
    return RegisteredDuplicatesPagedAdapter()


class CachedFirstPagedAdapter(ReferenceAdapter):
    """The reference whose pool registers duplicates and, of several copies, hits a cached one first, so that the
    outcome of every add is fixed: which copy, and ``full`` exactly when that leaves too few blocks; declared."""

    name = f"{ReferenceAdapter.name}[hits cached copies first]"
    paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, "duplicates": "registered",
                                              "hit_copy": "cached_first"}


def make_cached_first_paged_adapter() -> CachedFirstPagedAdapter:
    return CachedFirstPagedAdapter()


class NodeLruPagedAdapter(ReferenceAdapter):
    """The reference whose pool evicts whole least recently cached nodes, as a radix-tree prefix cache evicts
    leaves: asked for one block it may free every block of a run one release cached; declared."""

    name = f"{ReferenceAdapter.name}[evicts whole nodes]"
    paged_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.paged_policy, "eviction": "lru_nodes"}


def make_node_lru_paged_adapter() -> NodeLruPagedAdapter:
    return NodeLruPagedAdapter()


class PaddingPagePagedAdapter(ReferenceAdapter):
    """The reference whose pool reserves page 0 for padding and numbers its blocks from 1 (a radix-tree engine's
    page table); nothing to declare: block ids are opaque."""

    name = f"{ReferenceAdapter.name}[pages from 1]"
    padding_page: ClassVar[bool] = True


def make_padding_page_paged_adapter() -> PaddingPagePagedAdapter:
    return PaddingPagePagedAdapter()


class FullDeclarationAdapter(ReferenceAdapter):
    """The reference with every declaration it honours at once beside the layer capabilities it always declares:
    request keys hashed, hits that drop the last matched block, registered duplicates. What a pool declaring
    everything is judged by; a rule that reaches its case only under a narrower declaration is caught here."""

    name = f"{ReferenceAdapter.name}[everything declared]"
    paged_policy: ClassVar[dict[str, Any]] = {
        **ReferenceAdapter.paged_policy, "hash_keys": ["scope", "signature", "lora", "multimodal", "salt"],
        "hit_limit": "drops_last_hit", "duplicates": "registered"}


def make_full_declaration_adapter() -> FullDeclarationAdapter:
    return FullDeclarationAdapter()


class EndOnlyRemovalAdapter(ReferenceAdapter):
    """The default reference whose whole model removes only to the end of a sequence (``removal: end_only``; the
    model alone: ``impl.model_conformance:make_end_only_removal_model_adapter``); its model mutants run behind it."""

    name = f"{ReferenceAdapter.name}[removes at the end only]"
    model_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.model_policy, "removal": "end_only"}


def make_end_only_removal_adapter() -> EndOnlyRemovalAdapter:
    return EndOnlyRemovalAdapter()


class PositionsFromZeroAdapter(ReferenceAdapter):
    """The default reference whose whole model numbers positions itself, ignoring the batch's (``positions:
    from_zero``; the model alone: ``impl.model_conformance:make_positions_from_zero_model_adapter``); its model
    mutants run behind it."""

    name = f"{ReferenceAdapter.name}[positions from zero]"
    model_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.model_policy, "positions": "from_zero"}


def make_positions_from_zero_adapter() -> PositionsFromZeroAdapter:
    return PositionsFromZeroAdapter()


class GrowingAdapter(ReferenceAdapter):
    """The default reference whose whole model has no capacity limit (``capacity: grows``; the model alone:
    ``impl.model_conformance:make_growing_model_adapter``); its model mutants run behind it."""

    name = f"{ReferenceAdapter.name}[grows]"
    model_policy: ClassVar[dict[str, Any]] = {**ReferenceAdapter.model_policy, "capacity": "grows"}


def make_growing_adapter() -> GrowingAdapter:
    return GrowingAdapter()


class MicroBatchAdapter(ReferenceAdapter):
    """The default reference whose whole model computes a batch in parts of 3 tokens (``model_limits``
    ``micro_batch: 3``; the model alone: ``impl.model_conformance:make_micro_batch_model_adapter``); its model
    mutants run behind it."""

    name = f"{ReferenceAdapter.name}[micro-batch 3]"
    model_limits: ClassVar[dict[str, int]] = {"micro_batch": 3}


def make_micro_batch_adapter() -> MicroBatchAdapter:
    return MicroBatchAdapter()


class Float32TranscendentalsAdapter(ReferenceAdapter):
    """The reference's layer caches attending with exp, cos and sin of float32's accuracy inside float64
    arithmetic, declared (docs/spec.md §8.4: the ``transcendentals`` component). Layer caches only: the decoder,
    the paged pool and the whole model compute their own functions in float64."""

    name = f"{ReferenceAdapter.name}[transcendentals float32]"
    capabilities = ReferenceAdapter.capabilities - {
        "float64", "decode_session", "prefix_store", "sliding_window", "positions_sinusoidal", "positions_rope",
        "paged_prefix_sharing"} - MODEL_CAPABILITIES
    mixed_precision: ClassVar[dict[str, str]] = {"transcendentals": "float32"}
    functions = Functions("float32")

    def create_layer(self, weights: Any, rope: Any) -> AttentionLayer:
        return AttentionLayer.from_arrays(weights.wq, weights.wk, weights.wv, weights.wo, heads=weights.heads,
                                          kv_heads=weights.kv_heads, rope=_rope(rope), functions=self.functions)

    def recreate_layer(self, layer: AttentionLayer) -> AttentionLayer:
        return AttentionLayer.from_arrays(*(p.value for p in layer.parameters), heads=layer.heads,
                                          kv_heads=layer.kv_heads, rope=layer.rope, functions=self.functions)


def make_float32_transcendentals_adapter() -> Float32TranscendentalsAdapter:
    return Float32TranscendentalsAdapter()


def make_fp8_adapter() -> QuantizedReferenceAdapter:
    """float8_e4m3fn with one scale per tensor, frozen at the first update (transformers' fp8 rule)."""
    return QuantizedReferenceAdapter(StorageRule("float8_e4m3fn", "per_tensor", "frozen"))


def make_int8_adapter() -> QuantizedReferenceAdapter:
    """int8 with one scale per kv head and feature, recomputed from every row held."""
    return QuantizedReferenceAdapter(StorageRule("int8", "per_channel", "recomputed"))


def make_uint4_group_adapter() -> QuantizedReferenceAdapter:
    """Affine 4-bit rows, one scale and zero point for each group of 4 features of each token (HQQ's kind;
    heads of 4 and 8 drawn)."""
    return QuantizedReferenceAdapter(StorageRule("uint4", "per_group", group=4))


def make_uint4_zero_point_adapter() -> QuantizedReferenceAdapter:
    """Affine 4-bit groups of 4 with the zero point on a level, so that 0 is exact (PyTorch's asymmetric rule)."""
    return QuantizedReferenceAdapter(StorageRule("uint4", "per_group", group=4, zero_point="level"))


def make_uint4_extreme_adapter() -> QuantizedReferenceAdapter:
    """Affine 4-bit groups of 4 as mlx's quantizer stores them: the value of larger magnitude exact, 0 on a level,
    the range not widened."""
    return QuantizedReferenceAdapter(StorageRule("uint4", "per_group", group=4, zero_point="extreme"))


def make_float16_adapter() -> QuantizedReferenceAdapter:
    """Rows stored in float16, no scale."""
    return QuantizedReferenceAdapter(StorageRule("float16"))
