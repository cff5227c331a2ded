"""What an adapter declares besides its capabilities, read and checked in one place.

- the methods its capabilities oblige it to have (``required_methods``);
- ``layer_limits``: the geometries its layers can take (``LayerLimits``);
- ``dtype``, ``mixed_precision`` and ``storage``: the precision rule it is
  judged by (``declared_precision``, ``declared_storage``);
- ``ragged_truncate``: which rows a truncation of a ragged batch cuts
  (``declared_ragged_truncate``);
- contradictions and claims that could never be observed
  (``declaration_problems``).

A declaration the suite cannot judge is a usage error when the adapter is
loaded, never a verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..oracle import LOW_PRECISIONS, StorageFormat, mixed_precision
from .kinds import LAYER_CONVENTIONS, Capability, declared
from .model import (
    MODEL_METHODS,
    SEQUENCE_OPERATIONS,
    ModelLimits,
    ModelPolicy,
    declared_activation_table,
    declared_kv_storage,
)

# The methods each capability adds to an adapter (besides name, version, capabilities and error_kind).
METHODS_OF = {
    "layer caches": ("create_layer", "recreate_layer", "update_weights", "create_cache", "step", "reset", "snapshot"),
    "layer caches with RoPE": ("with_rope",),  # never called for positionless layers
    Capability.CHUNKED_APPEND.value: ("append",), Capability.TRUNCATE.value: ("truncate",),
    Capability.BATCH_REORDER.value: ("reorder",), Capability.FORK.value: ("fork",),
    Capability.BATCH_SELECT.value: ("select",), Capability.BATCH_REPEAT.value: ("repeat_interleave",),
    Capability.RAGGED_ROWS.value: ("create_ragged_cache", "append_ragged", "ragged_snapshot"),
    Capability.BATCH_MERGE.value: ("merge",), Capability.BATCH_EXTRACT.value: ("extract",),
    Capability.BATCH_FILTER.value: ("filter",),
    Capability.LAYERED_CACHE.value: ("create_layered_cache", "layered_append", "layered_snapshot"),
    Capability.DECODE_SESSION.value: ("create_decoder", "update_block_weights", "create_session", "prefill", "decode",
                                      "reset_session", "session_state"),
    Capability.PREFIX_STORE.value: ("create_decoder", "update_block_weights", "create_store", "store_prefill",
                                    "store_query", "store_entries"),
    Capability.PAGED_PREFIX_SHARING.value: ("create_decoder", "update_block_weights", "create_pool", "paged_add",
                                            "paged_append", "paged_free", "paged_rows", "paged_state"),
    # and paged_fork / paged_truncate where the paged_policy offers them (PagedPolicy.methods)
    Capability.WHOLE_MODEL.value: MODEL_METHODS,
    **SEQUENCE_OPERATIONS,  # seq_remove, seq_copy, ...: each its method(s) (docs/spec.md §15)
}


LAYER_METHODS = METHODS_OF["layer caches"]


def drives_layer_caches(adapter: Any) -> bool:
    """Whether an adapter drives layer caches: it declares a layer convention and has a layer-cache method. One
    with none of those methods (a serving engine's pool, a decoder) may still declare a RoPE pairing: it then
    names the pairing of its decoders' RoPE."""
    return bool(declared(getattr(adapter, "capabilities", ())) & LAYER_CONVENTIONS) and any(
        callable(getattr(adapter, method, None)) for method in LAYER_METHODS)


def required_methods(capabilities: Any, *, layer_caches: bool | None = None) -> list[str]:
    """The methods an adapter declaring ``capabilities`` must have, in a stable order; the layer-cache methods
    if it declares a layer convention (``layer_caches``: whether it drives layer caches, if known)."""
    names = declared(capabilities)
    layers = bool(names & LAYER_CONVENTIONS) if layer_caches is None else layer_caches
    wanted = ["error_kind"]
    rope = bool(names & {Capability.ROPE_INTERLEAVED.value, Capability.ROPE_HALF_SPLIT.value})
    groups = (["layer caches"] if layers else []) + (["layer caches with RoPE"] if layers and rope else []) + sorted(
        names & set(METHODS_OF) - {"layer caches", "layer caches with RoPE"})
    for group in groups:
        wanted += [method for method in METHODS_OF[group] if method not in wanted]
    return wanted


@dataclass(frozen=True)
class LayerLimits:
    """The geometries an implementation can build (an adapter's optional ``layer_limits``, a mapping).

    The suite draws only layers within them, replays only traces within them, and the report says so. Every
    field is optional; the defaults are the suite's own ranges.
    """

    model_width_is_heads_times_head_width: bool = False  # D == H * dh (most model code assumes it)
    model_width_divisible_by_heads: bool = False  # D % H == 0 (a constructor that splits D into heads)
    max_heads: int | None = None
    min_head_width: int | None = None
    max_head_width: int | None = None
    head_width_multiple: int | None = None  # dh a multiple of it (kernels that need dh % 8 == 0, say)
    max_rotary_width: int | None = None  # the widest rotary width a RoPE layer takes
    max_model_width: int | None = None
    max_batch: int | None = None
    max_capacity: int | None = None
    min_window: int | None = None  # the smallest sliding window a window cache is built with (sliding_window_layer)
    max_shapes: int | None = None  # layers and caches of at most this many shapes per attention kind in a run (JIT)

    @classmethod
    def of(cls, adapter: Any) -> LayerLimits:
        """The adapter's limits; declared ``per_group`` storage adds its own: heads a multiple of the group."""
        limits = cls._given(adapter)
        storage = declared_storage(adapter)
        if storage is None or not storage.group:
            return limits
        multiple = math.lcm(limits.head_width_multiple or 1, storage.group)
        return replace(limits, head_width_multiple=multiple) if multiple > 1 else limits

    @classmethod
    def _given(cls, adapter: Any) -> LayerLimits:
        given = getattr(adapter, "layer_limits", None) or {}
        if isinstance(given, LayerLimits):
            return given
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise TypeError(f"layer_limits: unknown limit {', '.join(map(repr, unknown))}; known: {sorted(known)}")
        for name, value in given.items():
            wanted = bool if isinstance(known[name].default, bool) else int
            if not isinstance(value, wanted) or (wanted is int and (isinstance(value, bool) or value < 1)):
                raise TypeError(f"layer_limits[{name!r}] must be {'a bool' if wanted is bool else 'an int >= 1'}, "
                                f"got {value!r}")
        limits = cls(**given)
        if limits.min_head_width and limits.max_head_width and limits.min_head_width > limits.max_head_width:
            raise TypeError(f"layer_limits: min_head_width {limits.min_head_width} above max_head_width "
                            f"{limits.max_head_width}")
        return limits

    def described(self) -> dict[str, Any]:
        """The limits that differ from the suite's defaults (for reports)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def geometry_problem(self, model_width: int, heads: int, head_width: int) -> str | None:
        """Why a layer of this geometry is outside the limits (None: inside)."""
        checks = [
            (self.model_width_is_heads_times_head_width and model_width != heads * head_width,
             f"model width {model_width} is not heads x head width {heads} x {head_width}"),
            (self.model_width_divisible_by_heads and model_width % heads != 0,
             f"model width {model_width} is not divisible by {heads} heads"),
            (self.max_heads is not None and heads > self.max_heads, f"{heads} heads > max_heads {self.max_heads}"),
            (self.min_head_width is not None and head_width < self.min_head_width,
             f"head width {head_width} < min_head_width {self.min_head_width}"),
            (self.max_head_width is not None and head_width > self.max_head_width,
             f"head width {head_width} > max_head_width {self.max_head_width}"),
            (self.head_width_multiple is not None and head_width % self.head_width_multiple != 0,
             f"head width {head_width} is not a multiple of {self.head_width_multiple}"),
            (self.max_model_width is not None and model_width > self.max_model_width,
             f"model width {model_width} > max_model_width {self.max_model_width}"),
        ]
        return next((why for broken, why in checks if broken), None)

    def cache_problem(self, batch_size: int, capacity: int, rotary_width: int | None = None,
                      window: int | None = None) -> str | None:
        """Why a cache of this shape (of a layer of this rotary width) is outside the limits (None: inside)."""
        checks = [
            (self.max_batch is not None and batch_size > self.max_batch, f"batch {batch_size} > max_batch "
                                                                         f"{self.max_batch}"),
            (self.max_capacity is not None and capacity > self.max_capacity,
             f"capacity {capacity} > max_capacity {self.max_capacity}"),
            (self.max_rotary_width is not None and rotary_width is not None and rotary_width > self.max_rotary_width,
             f"rotary width {rotary_width} > max_rotary_width {self.max_rotary_width}"),
            (self.min_window is not None and window is not None and window < self.min_window,
             f"window {window} < min_window {self.min_window}"),
        ]
        return next((why for broken, why in checks if broken), None)


DTYPES = ("float64", *LOW_PRECISIONS)


def declared_dtype(adapter: Any) -> str:
    return str(getattr(adapter, "dtype", "float64"))


def declared_precision(adapter: Any) -> tuple[str, dict[str, str]]:
    """What ``adapter`` declares: its ``dtype`` and its ``mixed_precision`` components, checked.

    Raises ValueError naming the attribute if the declaration is not one the suite can judge.
    """
    dtype = declared_dtype(adapter)
    return dtype, check_precision(dtype, getattr(adapter, "mixed_precision", None) or {})


STORAGE_KEYS = ("format", "scale", "update", "group", "min_step", "zero_point")
_NUMERIC_STORAGE_KEYS = ("group", "min_step")  # numbers as given; the others are names


def declared_storage(adapter: Any) -> StorageFormat | None:
    """The adapter's ``storage`` declaration as a ``StorageFormat`` (None: rows stored in the dtype).

    Raises ValueError naming what is wrong if the declaration is not one the suite can judge.
    """
    given = getattr(adapter, "storage", None)
    if given is None:
        return None
    if not isinstance(given, Mapping) or "format" not in given or set(given) - set(STORAGE_KEYS):
        raise ValueError(f"storage must map {', '.join(STORAGE_KEYS)} (format required), e.g. "
                         f"{{'format': 'float8_e4m3fn', 'scale': 'per_tensor', 'update': 'frozen'}}; got {given!r}")
    try:
        return StorageFormat(**{str(k): v if k in _NUMERIC_STORAGE_KEYS else str(v) for k, v in given.items()})
    except ValueError as error:
        raise ValueError(f"storage {dict(given)!r}: {error}") from None


def check_precision(dtype: str, components: Any) -> dict[str, str]:
    """``components`` as a plain dict, if ``dtype`` and ``mixed_precision`` make a rule; else ValueError."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not isinstance(components, Mapping):
        raise ValueError(f"mixed_precision must map components to dtypes, e.g. {{'rope': 'float32'}}; "
                         f"got {components!r}")
    if components and dtype != "float64":
        raise ValueError(f"mixed_precision {dict(components)!r} is for float64 adapters only; "
                         f"this one declares dtype {dtype!r}")
    try:
        mixed_precision(components)
    except ValueError as error:
        raise ValueError(f"mixed_precision {dict(components)!r}: {error}") from None
    return {str(name): str(value) for name, value in components.items()}


# How truncate(cache, n) cuts a ragged batch (docs/spec.md §13.8): "per_row", each row keeps its first min(n, n_b)
# tokens; "columns", the crop of a left-padded cache to n of its longest columns: every row drops its last
# longest - n tokens (all of them if it holds fewer), as transformers' DynamicCache.crop under generate's layout.
RAGGED_TRUNCATIONS = ("per_row", "columns")


def declared_ragged_truncate(adapter: Any) -> str:
    """The adapter's ``ragged_truncate`` (``"per_row"`` when absent); ValueError for any other value."""
    given = getattr(adapter, "ragged_truncate", None)
    if given is None:
        return RAGGED_TRUNCATIONS[0]
    if not isinstance(given, str) or given not in RAGGED_TRUNCATIONS:
        raise ValueError(f"ragged_truncate must be one of {RAGGED_TRUNCATIONS}, got {given!r}")
    return given


def declaration_problems(adapter: Any) -> list[str]:
    """Declarations that contradict each other or could never be checked (a verdict must not claim them)."""
    capabilities = declared(adapter.capabilities)
    problems = []
    resets = sorted(c for c in capabilities if c.startswith("reset_"))
    if resets and Capability.PHYSICAL_STORAGE.value not in capabilities:
        problems.append(f"declares {', '.join(resets)}, which only physical_storage lets the suite observe")
    if {Capability.RESET_KEEPS_BYTES.value, Capability.RESET_ZEROES.value} <= capabilities:
        problems.append("declares reset_keeps_bytes and reset_zeroes: reset cannot both keep and zero the bytes")
    until_full = Capability.WINDOW_TRUNCATES_UNTIL_FULL.value
    if until_full in capabilities and not {Capability.TRUNCATE.value, Capability.SLIDING_WINDOW_LAYER.value} <= \
            capabilities:
        problems.append(f"declares {until_full} without truncate and sliding_window_layer, which it is about")
    counts_sinks = Capability.WINDOW_FULL_COUNTS_SINKS.value
    if counts_sinks in capabilities and not {until_full, Capability.ATTENTION_SINKS.value} <= capabilities:
        problems.append(f"declares {counts_sinks} without {until_full} and attention_sinks: it moves the threshold "
                        "of the one by the sinks of the other")
    within_window = Capability.PREFILL_WITHIN_WINDOW.value
    if within_window in capabilities and not {Capability.DECODE_SESSION.value, Capability.SLIDING_WINDOW.value} <= \
            capabilities:
        problems.append(f"declares {within_window} without decode_session and sliding_window, which it is about")
    # sinks are kept beside a window: a layer's (sliding_window_layer), or a whole model's (sliding_window)
    if Capability.ATTENTION_SINKS.value in capabilities and Capability.SLIDING_WINDOW_LAYER.value not in capabilities \
            and not {Capability.WHOLE_MODEL.value, Capability.SLIDING_WINDOW.value} <= capabilities:
        problems.append("declares attention_sinks without sliding_window_layer (or whole_model and sliding_window): "
                        "sinks are kept beside a window")
    splits = sorted(capabilities & {Capability.BATCH_MERGE.value, Capability.BATCH_EXTRACT.value,
                                    Capability.BATCH_FILTER.value})
    if splits and Capability.RAGGED_ROWS.value not in capabilities:
        problems.append(f"declares {', '.join(splits)} without ragged_rows: they work on ragged batches")
    if getattr(adapter, "ragged_truncate", None) is not None:
        try:
            declared_ragged_truncate(adapter)
        except ValueError as error:
            problems.append(str(error))
        if not {Capability.RAGGED_ROWS.value, Capability.TRUNCATE.value} <= capabilities:
            problems.append("declares ragged_truncate without ragged_rows and truncate: it says how a ragged batch "
                            "is truncated")
    if Capability.LAYERED_CACHE.value in capabilities and not capabilities & LAYER_CONVENTIONS:
        problems.append("declares layered_cache without a layer convention (rope_interleaved, rope_half_split or "
                        "positionless): its layers are layer caches")
    if Capability.INTERLEAVED_WINDOWS.value in capabilities and not {
            Capability.WHOLE_MODEL.value, Capability.SLIDING_WINDOW.value} <= capabilities:
        problems.append("declares interleaved_windows without whole_model and sliding_window: it windows some of a "
                        "model's layers")
    if Capability.KEYS_UNROTATED.value in capabilities and not capabilities & {
            Capability.ROPE_INTERLEAVED.value, Capability.ROPE_HALF_SPLIT.value}:
        problems.append("declares keys_unrotated without a RoPE pairing (rope_interleaved / rope_half_split)")
    try:
        LayerLimits.of(adapter)
    except TypeError as error:
        problems.append(str(error))
    operations = sorted(capabilities & {*SEQUENCE_OPERATIONS, Capability.MULTI_SEQUENCE_TOKENS.value})
    if Capability.WHOLE_MODEL.value not in capabilities:
        if operations:
            problems.append(f"declares {', '.join(operations)} without whole_model, the contexts they work on")
        if "norm" in (getattr(adapter, "mixed_precision", None) or {}):
            problems.append("declares mixed_precision 'norm' without whole_model: only a whole model has RMSNorms")
        if getattr(adapter, "activation_table", None) is not None:
            problems.append("declares activation_table without whole_model: only a whole model has a gated "
                            "feed-forward")
        return problems
    for read in (ModelPolicy.of, ModelLimits.of, declared_kv_storage, declared_activation_table):
        try:
            read(adapter)
        except (TypeError, ValueError) as error:
            problems.append(str(error))
    try:
        problems += ModelLimits.of(adapter).capability_problems(capabilities)
    except (TypeError, ValueError):
        pass  # reported above
    return problems
