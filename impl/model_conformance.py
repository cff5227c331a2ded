"""The reference whole model for the conformance suite (capability ``whole_model``, docs/spec.md §15).

``ModelReferenceMethods`` drives ``impl.model`` through the model protocol's methods (by their names:
``impl`` imports no protocol); the default reference mixes it in, and ``ModelReferenceAdapter``
(``make_model_adapter``) is the whole model alone. Its policy is llama.cpp's unified
reading: copies share cells in a unified context and merge into a non-empty destination.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from . import errors
from .model import LlamaModel, ModelContext, SequenceState
from .storage import BLOCK_FORMATS, StorageRule

MODEL_ERROR_KINDS: dict[type[errors.KvCacheError], str] = {
    errors.ContextFull: "full",
    errors.MalformedBatch: "malformed_batch",
    errors.SequenceOperationRefused: "refused",
}


# What the model methods add to an adapter's capabilities (its model's own conventions are declared beside them).
MODEL_CAPABILITIES = frozenset({"whole_model", "seq_remove", "seq_copy", "seq_keep", "seq_shift", "seq_divide",
                                "seq_state", "validates_model_batch", "validates_sequence_ops",
                                "multi_sequence_tokens"})


def kv_format(kv_storage: Any) -> str | None:
    """The element type of a ``kv_storage`` declaration: a name, or a block format's mapping's ``format``
    (None for affine groups: rounded in groups, held in the model's dtype)."""
    if isinstance(kv_storage, dict):
        return None if kv_storage.get("scale") == "per_group" else str(kv_storage["format"])
    return None if kv_storage is None else str(kv_storage)


def kv_groups(kv_storage: Any) -> StorageRule | None:
    """The affine groups a ``kv_storage`` mapping declares (None: none)."""
    if not isinstance(kv_storage, dict) or kv_storage.get("scale") != "per_group":
        return None
    return StorageRule(kv_storage["format"], "per_group", group=kv_storage["group"],
                       min_step=kv_storage.get("min_step", 0.0), zero_point=kv_storage.get("zero_point", "minimum"))


def kv_along_row(kv_storage: Any) -> bool:
    """Whether a ``kv_storage`` declaration cuts its blocks from each token's whole kv row."""
    return isinstance(kv_storage, dict) and kv_storage.get("along") == "row"


class ModelReferenceMethods:
    """The model protocol's methods over ``impl.model``, and the policy they follow, as a mixin: the default
    reference (``impl.conformance.ReferenceAdapter``) exposes the whole model through it, as it exposes its paged
    pool through ``PagedReferenceMethods``. Its ``error_kind`` must map ``MODEL_ERROR_KINDS``."""

    model_policy: ClassVar[dict[str, Any]] = {"contexts": ["unified", "per_sequence"], "shared_copies": True,
                                              "copy_unified": "merge", "copy_per_sequence": "merge"}

    def create_model(self, config: Any, weights: Any) -> LlamaModel:
        return LlamaModel(config, weights, dtype=getattr(self, "dtype", "float64"))

    def create_context(self, model: LlamaModel, config: Any) -> ModelContext:
        copy = self.model_policy.get("copy_unified" if config.unified else "copy_per_sequence", "merge")
        return ModelContext(model, config.cells, config.max_sequences, config.unified,
                            shared_copies=self.model_policy.get("shared_copies", True), copy_into_nonempty=copy,
                            kv_dtype=kv_format(getattr(self, "kv_storage", None)),
                            blocks_along_row=kv_along_row(getattr(self, "kv_storage", None)),
                            kv_groups=kv_groups(getattr(self, "kv_storage", None)),
                            end_only_removal=self.model_policy.get("removal", "any") == "end_only",
                            bounded_shifts=getattr(self, "bounded_shifts", True),
                            numbers_positions=self.model_policy.get("positions", "given") == "from_zero",
                            grows=self.model_policy.get("capacity", "fixed") == "grows",
                            micro_batch=(getattr(self, "model_limits", None) or {}).get("micro_batch"),
                            sinks=getattr(config, "sinks", 0),
                            evicts=self.model_policy.get("window_cells", "all") == "visible",
                            removal_until_full=self.model_policy.get("window_removal", "any") == "until_full")

    def context_cells(self, context: ModelContext) -> int:
        return context.capacity

    def decode_batch(self, context: ModelContext, batch: Any) -> np.ndarray:
        return context.decode(batch.tokens, batch.positions, batch.sequences, batch.logits)

    def clear(self, context: ModelContext) -> None:
        context.clear()

    def seq_pos_min(self, context: ModelContext, seq: int) -> int:
        return context.pos_min(seq)

    def seq_pos_max(self, context: ModelContext, seq: int) -> int:
        return context.pos_max(seq)

    def can_shift(self, context: ModelContext) -> bool:
        return True

    def seq_remove(self, context: ModelContext, seq: int, p0: int, p1: int) -> None:
        context.remove(seq, p0, p1)

    def seq_copy(self, context: ModelContext, src: int, dst: int, p0: int, p1: int) -> None:
        context.copy(src, dst, p0, p1)

    def seq_keep(self, context: ModelContext, seq: int) -> None:
        context.keep(seq)

    def seq_shift(self, context: ModelContext, seq: int, p0: int, p1: int, delta: int) -> None:
        context.shift(seq, p0, p1, delta)

    def seq_divide(self, context: ModelContext, seq: int, p0: int, p1: int, d: int) -> None:
        context.divide(seq, p0, p1, d)

    def save_sequence(self, context: ModelContext, seq: int) -> SequenceState:
        return context.save(seq)

    def load_sequence(self, context: ModelContext, seq: int, state: Any) -> None:
        context.load(seq, state)


class ModelReferenceAdapter(ModelReferenceMethods):
    """The whole model alone (no layer caches, no decoder)."""

    name = "kvcache-reference-model"
    version = "1"
    capabilities = MODEL_CAPABILITIES | {"float64", "gqa", "rope_interleaved", "rope_half_split", "sliding_window",
                                         "fixed_capacity"}
    dtype = "float64"

    def error_kind(self, error: BaseException) -> str | None:
        for error_type, kind in MODEL_ERROR_KINDS.items():
            if isinstance(error, error_type):
                return kind
        return None


def make_model_adapter() -> ModelReferenceAdapter:
    return ModelReferenceAdapter()


class LowPrecisionModelAdapter(ModelReferenceAdapter):
    """The reference computing in ``dtype`` with its cache stored in ``kv_storage`` (llama.cpp's default: float32
    computation, a float16 cache), judged by the precision rule of docs/spec.md §15.6."""

    capabilities = ModelReferenceAdapter.capabilities - {"float64"}

    def __init__(self, dtype: str, kv_storage: str, *, along_row: bool = False) -> None:
        self.dtype = dtype
        self.kv_storage: str | dict[str, str] = {"format": kv_storage, "along": "row"} if along_row else kv_storage
        self.name = f"{ModelReferenceAdapter.name}[{dtype}, kv {kv_storage}{' along the kv row' if along_row else ''}]"
        if kv_storage in BLOCK_FORMATS:  # a head row, or a token's whole kv row, is whole blocks of 32
            self.model_limits: dict[str, Any] = {"kv_width_multiple" if along_row else "head_width_multiple": 32}


def make_q8_0_row_model_adapter() -> LowPrecisionModelAdapter:
    """Float32 computation over a q8_0 cache whose blocks are cut from each token's whole kv row (all kv heads):
    heads of 16 taken, two of them one block."""
    return LowPrecisionModelAdapter("float32", "q8_0", along_row=True)


def make_q4_0_row_model_adapter() -> LowPrecisionModelAdapter:
    """Float32 computation over a q4_0 cache whose blocks are cut from each token's whole kv row."""
    return LowPrecisionModelAdapter("float32", "q4_0", along_row=True)


class AffineCacheModelAdapter(ModelReferenceAdapter):
    """The reference computing in ``dtype`` over a cache of affine groups (``rule``, as a layer's ``storage``
    declares them: mlx-lm's ``QuantizedKVCache`` stores so), declared as ``kv_storage``; heads the group divides."""

    capabilities = ModelReferenceAdapter.capabilities - {"float64"}

    def __init__(self, dtype: str, rule: StorageRule) -> None:
        self.dtype, self.kv_storage = dtype, rule.declared()
        self.model_limits = {"head_width_multiple": rule.group}
        self.name = f"{ModelReferenceAdapter.name}[{dtype}, kv {rule.format} groups of {rule.group}" + (
            f", zero point {rule.zero_point}]" if rule.zero_point != "minimum" else "]")


def make_uint4_groups_model_adapter() -> AffineCacheModelAdapter:
    """Float32 computation over affine 4-bit groups of 4 (the grid from each group's minimum)."""
    return AffineCacheModelAdapter("float32", StorageRule("uint4", "per_group", group=4))


def make_uint4_extreme_model_adapter() -> AffineCacheModelAdapter:
    """Float32 computation over affine 4-bit groups of 4 as mlx's quantizer stores them (the larger extreme exact,
    0 on a level)."""
    return AffineCacheModelAdapter("float32", StorageRule("uint4", "per_group", group=4, zero_point="extreme"))


def make_float32_model_adapter() -> LowPrecisionModelAdapter:
    """Float32 computation, float16 cache: llama.cpp's default configuration."""
    return LowPrecisionModelAdapter("float32", "float16")


def make_float32_cache_model_adapter() -> LowPrecisionModelAdapter:
    """Float32 computation over a float32 cache (llama.cpp's ``--cache-type-k f32``): §8.3's rule throughout."""
    return LowPrecisionModelAdapter("float32", "float32")


def make_q8_0_model_adapter() -> LowPrecisionModelAdapter:
    """Float32 computation over llama.cpp's q8_0 cache (``--cache-type-k q8_0 --cache-type-v q8_0``)."""
    return LowPrecisionModelAdapter("float32", "q8_0")


def make_q4_0_model_adapter() -> LowPrecisionModelAdapter:
    """Float32 computation over llama.cpp's q4_0 cache."""
    return LowPrecisionModelAdapter("float32", "q4_0")


class EndOnlyRemovalModelAdapter(ModelReferenceAdapter):
    """The reference refusing (``refused``) a removal that would leave cells of its sequence after the range, as
    llama.h lets ``llama_memory_seq_rm`` return false "if a partial sequence cannot be removed" and as a cache that
    can only ``crop`` does; it declares ``removal: end_only``."""

    name = f"{ModelReferenceAdapter.name}[removes at the end only]"
    model_policy: ClassVar[dict[str, Any]] = {**ModelReferenceMethods.model_policy, "removal": "end_only"}


def make_end_only_removal_model_adapter() -> EndOnlyRemovalModelAdapter:
    return EndOnlyRemovalModelAdapter()


class PositionsFromZeroModelAdapter(ModelReferenceAdapter):
    """The reference taking no position from the caller: it ignores the batch's positions and numbers each
    sequence's tokens itself, on from the sequence's largest position, an empty sequence from 0 (llama.cpp's
    decode of a batch whose ``pos`` is NULL). It declares ``positions:
    from_zero``; a batch whose positions do not run on is not refused but numbered anew."""

    name = f"{ModelReferenceAdapter.name}[positions from zero]"
    model_policy: ClassVar[dict[str, Any]] = {**ModelReferenceMethods.model_policy, "positions": "from_zero"}


def make_positions_from_zero_model_adapter() -> PositionsFromZeroModelAdapter:
    return PositionsFromZeroModelAdapter()


class GrowingModelAdapter(ModelReferenceAdapter):
    """The reference with no capacity limit: a context short of free cells for a batch, a duplicating copy or a
    load reallocates its stores larger (as transformers' DynamicCache concatenates), never full. It declares
    ``capacity: grows``, and not ``fixed_capacity`` (it is never full); ``context_cells`` reports the cells it has
    now."""

    name = f"{ModelReferenceAdapter.name}[grows]"
    capabilities = ModelReferenceAdapter.capabilities - {"fixed_capacity"}
    model_policy: ClassVar[dict[str, Any]] = {**ModelReferenceMethods.model_policy, "capacity": "grows"}


def make_growing_model_adapter() -> GrowingModelAdapter:
    return GrowingModelAdapter()


class MicroBatchModelAdapter(ModelReferenceAdapter):
    """The reference computing a batch longer than 3 tokens in parts of 3, each committed before the next, and
    undoing them if a later part has no room (llama.cpp with ``n_ubatch`` 3); it declares ``model_limits``
    ``micro_batch: 3``."""

    name = f"{ModelReferenceAdapter.name}[micro-batch 3]"
    model_limits: ClassVar[dict[str, int]] = {"micro_batch": 3}


def make_micro_batch_model_adapter() -> MicroBatchModelAdapter:
    return MicroBatchModelAdapter()


class UnboundedShiftModelAdapter(ModelReferenceAdapter):
    """The reference doing a shift past ``max_positions`` instead of refusing it, as llama.cpp's ``seq_add`` does
    (it bounds no position, and rotates keys at any): outside the model, judged only by §5.1 (docs/spec.md
    §15.4), so it conforms declaring nothing."""

    name = f"{ModelReferenceAdapter.name}[shifts past max_positions]"
    bounded_shifts = False


def make_unbounded_shift_model_adapter() -> UnboundedShiftModelAdapter:
    return UnboundedShiftModelAdapter()


class Float32NormModelAdapter(ModelReferenceAdapter):
    """The float64 reference with every RMSNorm computed in float32 (the input cast, normalised, cast back, then
    weighted in float64: transformers' ``LlamaRMSNorm`` in a float64 model), declaring
    ``mixed_precision = {"norm": "float32"}``."""

    name = f"{ModelReferenceAdapter.name}[norm float32]"
    capabilities = ModelReferenceAdapter.capabilities - {"float64"}
    mixed_precision: ClassVar[dict[str, str]] = {"norm": "float32"}

    def create_model(self, config: Any, weights: Any) -> LlamaModel:
        return LlamaModel(config, weights, dtype="float64", norm_dtype="float32")


def make_float32_norm_model_adapter() -> Float32NormModelAdapter:
    return Float32NormModelAdapter()


class Gemma3ModelAdapter(ModelReferenceAdapter):
    """The reference claiming what it computes past a Llama (docs/spec.md §15.1): per-layer window patterns and a
    local RoPE base (``interleaved_windows``), and Gemma 3's architecture beside Llama's (``model_limits``
    ``architectures``)."""

    name = f"{ModelReferenceAdapter.name}[interleaved windows, gemma3]"
    capabilities = ModelReferenceAdapter.capabilities | {"interleaved_windows"}
    model_limits: ClassVar[dict[str, Any]] = {"architectures": ["llama", "gemma3"]}


def make_gemma3_model_adapter() -> Gemma3ModelAdapter:
    return Gemma3ModelAdapter()


class SwaPattern6ModelAdapter(Gemma3ModelAdapter):
    """The reference declaring what llama.cpp's ``gemma3`` builds: every sixth layer global, the windowed layers'
    RoPE base 10000, the Gemma architecture alone; the suite then draws models of six and seven layers."""

    name = f"{ModelReferenceAdapter.name}[gemma3, window pattern 6, local base 10000]"
    capabilities = ModelReferenceAdapter.capabilities | {"interleaved_windows"}
    model_limits: ClassVar[dict[str, Any]] = {"architectures": ["gemma3"], "window_pattern": 6,
                                              "local_rope_base": 10000.0}


def make_swa_pattern_6_model_adapter() -> SwaPattern6ModelAdapter:
    return SwaPattern6ModelAdapter()


class GeluTableModelAdapter(LowPrecisionModelAdapter):
    """Float32 over a float16 cache, its gate activation read from a float16 table (the argument and the value
    rounded to float16): ggml's CPU GELU (``GGML_GELU_FP16``), which llama.cpp's ``gemma3`` runs; it declares
    ``activation_table = "float16"`` (docs/spec.md §15.6) beside ``interleaved_windows`` and gemma3."""

    capabilities = LowPrecisionModelAdapter.capabilities | {"interleaved_windows"}
    activation_table: str | None = "float16"

    def __init__(self) -> None:
        super().__init__("float32", "float16")
        self.name = f"{self.name}[activation from a float16 table]"
        self.model_limits = {"architectures": ["llama", "gemma3"]}

    def create_model(self, config: Any, weights: Any) -> LlamaModel:
        return LlamaModel(config, weights, dtype=self.dtype, activation_table=self.activation_table)


def make_gelu_table_model_adapter() -> GeluTableModelAdapter:
    return GeluTableModelAdapter()


class WindowedStoreModelAdapter(ModelReferenceAdapter):
    """The reference keeping, in a windowed model, only the cells the window can still see: a batch short of free
    cells overwrites cells no later token of their sequence sees, oldest first, never a sink nor a sequence's last
    cell (llama.cpp's sliding-window cache without ``swa_full``), and ``seq_pos_min`` reports what is held. It
    declares ``window_cells: visible`` and keeps sink tokens (``attention_sinks``)."""

    name = f"{ModelReferenceAdapter.name}[window cells visible]"
    capabilities = ModelReferenceAdapter.capabilities | {"attention_sinks"}
    model_policy: ClassVar[dict[str, Any]] = {**ModelReferenceMethods.model_policy, "window_cells": "visible"}


def make_windowed_store_model_adapter() -> WindowedStoreModelAdapter:
    return WindowedStoreModelAdapter()


class RingModelAdapter(WindowedStoreModelAdapter):
    """The windowed store that, once a sequence has held W tokens (or evicted one), refuses a removal to the end that
    would leave cells of it, as a ring that cannot bring evicted cells back does; removing every cell it holds still
    succeeds. It declares ``window_cells: visible`` and ``window_removal: until_full``."""

    name = f"{ModelReferenceAdapter.name}[ring: removals to the end until full]"
    model_policy: ClassVar[dict[str, Any]] = {**WindowedStoreModelAdapter.model_policy, "window_removal": "until_full"}


def make_ring_model_adapter() -> RingModelAdapter:
    return RingModelAdapter()
