"""The whole-model half of an adapter (capability ``whole_model``, docs/spec.md §15).

An engine such as llama.cpp takes token ids per sequence and returns logits; its KV cache is reached
only through sequence operations. The suite hands the adapter a ``ModelConfig`` and ``ModelWeights``
(matrices ``(out, in)``, as GGUF reads them back), then ``ContextConfig``s and ``ModelBatch``es; models
and contexts are opaque handles it passes back. Each sequence operation is optional, under its own
capability (``SEQUENCE_OPERATIONS``); the names follow llama.h's ``llama_memory_*`` in our words:

=================  ==============================  =====================
method             llama.h                          capability
=================  ==============================  =====================
``decode_batch``   ``llama_decode``                 ``whole_model``
``clear``          ``llama_memory_clear``           ``whole_model``
``seq_pos_min``    ``llama_memory_seq_pos_min``     ``whole_model``
``seq_pos_max``    ``llama_memory_seq_pos_max``     ``whole_model``
``can_shift``      ``llama_memory_can_shift``       ``whole_model``
``seq_remove``     ``llama_memory_seq_rm``          ``seq_remove``
``seq_copy``       ``llama_memory_seq_cp``          ``seq_copy``
``seq_keep``       ``llama_memory_seq_keep``        ``seq_keep``
``seq_shift``      ``llama_memory_seq_add``         ``seq_shift``
``seq_divide``     ``llama_memory_seq_div``         ``seq_divide``
``save_sequence``  ``llama_state_seq_get_data``     ``seq_state``
``load_sequence``  ``llama_state_seq_set_data``     ``seq_state``
=================  ==============================  =====================

A call that does not do what was asked raises, and the adapter's ``error_kind`` maps the exception to
an ``ErrorKind`` value: ``full`` (no room for a batch or a load), ``malformed_batch``, ``refused``. An
engine that reports by return value (``llama_memory_seq_rm`` returning false, ``llama_decode`` returning
1 or -1, ``llama_state_seq_set_data`` returning 0) raises in its adapter. A call that raised changes
nothing (docs/spec.md §5.1, judged by the logits of what comes next).

What an adapter declares besides its capabilities: ``dtype`` (the computation, e.g. ``"float32"``),
``kv_storage`` (the cache's element type: ``"float64"``, ``"float32"``, ``"float16"``, ``"bfloat16"``, or
llama.cpp's block formats ``"q8_0"``, ``"q4_0"``, their blocks cut from each head's row, or as a mapping
``{"format": "q8_0", "along": "row"}`` from each token's whole kv row; default: the dtype), ``model_limits``
(``ModelLimits``) and ``model_policy`` (``ModelPolicy``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..oracle.model_config import ARCHITECTURES, ContextConfig, LayerWeights, ModelBatch, ModelConfig, ModelWeights
from ..oracle.numbers import ACTIVATION_TABLES
from ..oracle.storage import StorageFormat

# The method each sequence operation adds (besides those of whole_model itself).
SEQUENCE_OPERATIONS = {"seq_remove": ("seq_remove",), "seq_copy": ("seq_copy",), "seq_keep": ("seq_keep",),
                       "seq_shift": ("seq_shift",), "seq_divide": ("seq_divide",),
                       "seq_state": ("save_sequence", "load_sequence")}
MODEL_METHODS = ("create_model", "create_context", "context_cells", "decode_batch", "clear", "seq_pos_min",
                 "seq_pos_max", "can_shift")
KV_STORAGES = ("float64", "float32", "float16", "bfloat16", "q8_0", "q4_0")
# judged as a storage format (docs/spec.md §13.6) under the dtype; the block formats store 32 features a scale
NARROW_KV_STORAGES = ("float16", "bfloat16", "q8_0", "q4_0")
BLOCK_KV_STORAGES = {"q8_0": 32, "q4_0": 32}
KV_ALONG = ("head", "row")  # a block format's blocks: cut from each head's row, or from a token's whole kv row

CONTEXT_KINDS = ("unified", "per_sequence")  # ContextConfig.unified True / False
COPIES = ("merge", "replace", "whole_only")  # into a non-empty destination: keep its cells; drop them first; only
# whole-sequence copies are drawn (a range copy is outside what the adapter offers), and they replace
NEGATIVE_SHIFTS = ("removed", "not_drawn")  # a cell shifted below position 0: removed (llama.cpp); never drawn
FLAG_LIMITS = ("model_width_divisible_by_heads",)  # the model_limits that are bools (the others: ints >= 1)
# the model_limits that are neither bools nor ints >= 1: the architectures an engine runs the model as (a non-empty
# list drawn from ARCHITECTURES; default llama alone), the one window pattern it builds (an int k >= 2: an engine
# hard-coding Gemma 3's, every sixth layer global) and the one RoPE base of its windowed layers (a float: Gemma 3's
# 10000); llama.cpp's gemma3 reads both from the GGUF
ARCHITECTURE_LIMITS = ("architectures", "window_pattern", "local_rope_base")
# the suite's batches hold at most 8 tokens: a micro-batch of at most 4 is split at least once by the longest
MAX_MICRO_BATCH = 4
REMOVALS = ("any", "end_only")  # seq_remove of any range; or only of ranges that leave no cell of it after them
# a batch's positions: given by the caller (an empty sequence may start anywhere); or numbered by the engine itself,
# an empty sequence from 0 and each next token at the sequence's largest position + 1 (llama.cpp with batch.pos NULL)
POSITIONS = ("given", "from_zero")
# a store of context_cells cells, past which a batch, duplicating copy or load is full; or no capacity limit
CAPACITIES = ("fixed", "grows")
# a windowed model's store keeps every cell; or only those a later token of its sequence can still see (it may
# evict the others, oldest first, never a sink nor the sequence's last cell: docs/spec.md §15.2)
WINDOW_CELLS = ("all", "visible")
# a removal to the end always done; or refused once the sequence has held W tokens (a ring that cannot un-evict)
WINDOW_REMOVALS = ("any", "until_full")


class ModelPolicyError(TypeError):
    """A ``model_policy`` or ``model_limits`` the suite cannot judge (unknown key or value); a usage error."""


@dataclass(frozen=True)
class ModelPolicy:
    """Where engines legitimately differ, what the adapter declares (its optional ``model_policy`` mapping).

    - ``contexts``: the kinds of context it creates (``"unified"``, ``"per_sequence"``); the suite asks only
      for these.
    - ``shared_copies``: in a unified context, a copy gives the destination *the same cells* (llama.cpp:
      the cell gains a sequence id; no room is used, and a later shift or divide of either sequence moves
      the cell for both) rather than copies of them. Per-sequence contexts always copy.
    - ``copy_unified`` / ``copy_per_sequence``: what a copy into a non-empty destination does, per kind of
      context: ``"merge"`` (the destination keeps its cells and gains the copied ones), ``"replace"`` (its
      cells are removed first), ``"whole_only"`` (only whole-sequence copies, which replace: llama.cpp
      copies a whole store between per-sequence stores).
    - ``negative_shift``: what a shift below position 0 does: ``"removed"`` (the cell leaves its
      sequences: llama.cpp) or ``"not_drawn"`` (the suite never asks).
    - ``refuses_shift``: shifts and divides may be refused with ``refused`` when ``can_shift`` is false
      (a model whose cache cannot be re-rotated); the suite then expects refusal or success.
    - ``removal``: which removals must succeed: ``"any"`` (every range) or ``"end_only"`` (a removal that
      would leave cells of the sequence after the range may be refused with ``refused``, changing nothing:
      llama.h's "Returns false if a partial sequence cannot be removed", transformers' ``crop``); removals to
      the end and of whole sequences must still succeed, and the suite expects refusal or success of the rest.
    - ``positions``: ``"given"`` (the engine takes each token's position from the batch; an empty sequence may
      start at any position) or ``"from_zero"`` (the engine takes no position from the caller: an empty sequence
      starts at 0, each next token at the sequence's largest position + 1). ``from_zero``: the suite starts every
      empty sequence at 0 and draws no batch whose positions do not run on (the engine cannot be handed one).
    - ``capacity``: ``"fixed"`` (a store has ``context_cells`` cells; a batch, a duplicating copy or a load past
      its free cells is ``full``, judged where ``fixed_capacity`` is declared) or ``"grows"`` (no capacity limit:
      none of them is ever full, each must succeed, past the cells the context was asked for too;
      ``context_cells`` reports the cells it has now, an int >= 0, and bounds nothing).
    - ``window_cells`` (a windowed model): ``"all"`` (every cell is kept: docs/spec.md §15.2) or ``"visible"`` (a
      sequence's cells no later token of it can see may be evicted -- oldest first, never a sink nor its last cell
      -- and ``seq_pos_min`` reports what is held; llama.cpp's sliding-window cache without ``swa_full``). The
      suite follows the engine's eviction, judges it legal, and judges everything else over what is held.
    - ``window_removal``: ``"any"`` or ``"until_full"`` (a removal to the end MAY be refused with ``refused`` once
      the sequence has held ``W`` tokens: a ring; the model-level twin of ``window_truncates_until_full``).
    """

    contexts: frozenset[str] = frozenset(CONTEXT_KINDS)
    shared_copies: bool = True
    copy_unified: str = "merge"
    copy_per_sequence: str = "merge"
    negative_shift: str = "removed"
    refuses_shift: bool = False
    removal: str = "any"
    positions: str = "given"
    capacity: str = "fixed"
    window_cells: str = "all"
    window_removal: str = "any"

    @classmethod
    def of(cls, adapter: Any) -> ModelPolicy:
        given = getattr(adapter, "model_policy", None)
        if given is None:
            return cls()
        if not isinstance(given, Mapping):
            raise ModelPolicyError(f"model_policy must be a mapping, got {type(given).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ModelPolicyError(f"model_policy: unknown key {', '.join(map(repr, unknown))}; known: {known}")
        contexts = given.get("contexts", CONTEXT_KINDS)
        if isinstance(contexts, str) or not contexts or not set(contexts) <= set(CONTEXT_KINDS):
            raise ModelPolicyError(f"model_policy['contexts'] must be a non-empty list drawn from "
                                   f"{list(CONTEXT_KINDS)}, got {contexts!r}")
        for name in ("shared_copies", "refuses_shift"):
            if not isinstance(given.get(name, False), bool):
                raise ModelPolicyError(f"model_policy[{name!r}] must be a bool, got {given[name]!r}")
        for name, allowed in (("copy_unified", COPIES), ("copy_per_sequence", COPIES),
                              ("negative_shift", NEGATIVE_SHIFTS), ("removal", REMOVALS),
                              ("positions", POSITIONS), ("capacity", CAPACITIES), ("window_cells", WINDOW_CELLS),
                              ("window_removal", WINDOW_REMOVALS)):
            if name in given and given[name] not in allowed:
                raise ModelPolicyError(f"model_policy[{name!r}] must be one of {list(allowed)}, got {given[name]!r}")
        return cls(**{**{k: v for k, v in given.items() if k != "contexts"}, "contexts": frozenset(contexts)})

    def copy_into_nonempty(self, unified: bool) -> str:
        """What a copy into a non-empty destination does in a context of this kind."""
        return self.copy_unified if unified else self.copy_per_sequence

    def described(self) -> dict[str, Any]:
        """For reports and failure messages."""
        return {"contexts": sorted(self.contexts), "shared_copies": self.shared_copies,
                "copy_unified": self.copy_unified, "copy_per_sequence": self.copy_per_sequence,
                "negative_shift": self.negative_shift, "refuses_shift": self.refuses_shift, "removal": self.removal,
                "positions": self.positions, "capacity": self.capacity, "window_cells": self.window_cells,
                "window_removal": self.window_removal}


@dataclass(frozen=True)
class ModelLimits:
    """The models and contexts an engine can build (an adapter's optional ``model_limits`` mapping); the suite
    draws only within them. Every field is optional (None: the suite's own ranges)."""

    max_vocab: int | None = None
    min_vocab: int | None = None  # llama.cpp's SPM vocabulary needs its unknown, begin and end tokens: 3
    max_model_width: int | None = None
    max_layers: int | None = None
    max_heads: int | None = None
    min_head_width: int | None = None
    max_head_width: int | None = None
    head_width_multiple: int | None = None  # quantized caches store blocks of 32 along a row
    kv_width_multiple: int | None = None  # KV * dh a multiple of it: blocks of 32 along a token's whole kv row
    max_ffn_width: int | None = None
    max_cells: int | None = None
    max_sequences: int | None = None
    max_batch: int | None = None  # tokens of one decode call (llama.cpp's n_batch)
    # the tokens the engine computes at once, splitting a longer batch (llama.cpp's n_ubatch, configured small):
    # the suite then draws batches longer than it, and contexts that hold them
    micro_batch: int | None = None
    # the model width a multiple of the heads (transformers' LlamaConfig refuses another, head_dim given or not)
    model_width_divisible_by_heads: bool = False
    # the architectures the engine runs (docs/spec.md §15.1): llama.cpp's arch names, "llama" and "gemma3"
    architectures: tuple[str, ...] = ("llama",)
    # with interleaved_windows: the only window pattern and local RoPE base the engine builds (None: the suite's own)
    window_pattern: int | None = None
    local_rope_base: float | None = None
    # the smallest sliding window the engine builds (a layer cache's min_window, the same word): transformers'
    # sliding layer of 1 raises on its second forward
    min_window: int | None = None

    @classmethod
    def of(cls, adapter: Any) -> ModelLimits:
        given = getattr(adapter, "model_limits", None) or {}
        if isinstance(given, ModelLimits):
            return given
        if not isinstance(given, Mapping):
            raise ModelPolicyError(f"model_limits must be a mapping, got {type(given).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ModelPolicyError(f"model_limits: unknown limit {', '.join(map(repr, unknown))}; known: {known}")
        given = dict(given)
        if "architectures" in given:
            named = given["architectures"]
            if isinstance(named, str) or not isinstance(named, (list, tuple)) or not named or not set(named) <= set(
                    ARCHITECTURES):
                raise ModelPolicyError(f"model_limits['architectures'] must be a non-empty list drawn from "
                                       f"{list(ARCHITECTURES)}, got {named!r}")
            given["architectures"] = tuple(a for a in ARCHITECTURES if a in named)
        pattern, base = given.get("window_pattern"), given.get("local_rope_base")
        if pattern is not None and (isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 2):
            raise ModelPolicyError(f"model_limits['window_pattern'] must be an int >= 2 (every k-th layer global), "
                                   f"got {pattern!r}")
        if base is not None and not (isinstance(base, float) and math.isfinite(base) and base > 0):
            raise ModelPolicyError(f"model_limits['local_rope_base'] must be a finite positive float, got {base!r}")
        for name, value in given.items():
            if name in ARCHITECTURE_LIMITS:
                continue
            if name in FLAG_LIMITS:
                if not isinstance(value, bool):
                    raise ModelPolicyError(f"model_limits[{name!r}] must be a bool, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ModelPolicyError(f"model_limits[{name!r}] must be an int >= 1, got {value!r}")
        limits = cls(**given)
        if limits.min_vocab is not None and limits.max_vocab is not None and limits.min_vocab > limits.max_vocab:
            raise ModelPolicyError(f"model_limits: min_vocab {limits.min_vocab} > max_vocab {limits.max_vocab}")
        if limits.micro_batch is not None and limits.micro_batch > MAX_MICRO_BATCH:
            raise ModelPolicyError(f"model_limits: micro_batch {limits.micro_batch}: the suite's batches of at most 8 "
                                   f"tokens split only a micro-batch of at most {MAX_MICRO_BATCH}; configure your "
                                   "engine's smaller (llama.cpp: n_ubatch)")
        if limits.micro_batch is not None and limits.max_batch is not None and limits.max_batch <= limits.micro_batch:
            raise ModelPolicyError(f"model_limits: max_batch {limits.max_batch} <= micro_batch {limits.micro_batch}: "
                                   "no batch could be split")
        return limits

    def described(self) -> dict[str, Any]:
        """The limits that differ from the suite's own ranges (for reports)."""
        return {f.name: list(value) if isinstance(value := getattr(self, f.name), tuple) else value
                for f in fields(self) if getattr(self, f.name) != f.default}

    def model_problem(self, config: ModelConfig) -> str | None:
        """Why a model of this configuration is outside the limits (None: inside)."""
        bounds = [("max_vocab", config.vocab), ("max_model_width", config.model_width),
                  ("max_layers", config.layers), ("max_heads", config.heads),
                  ("max_head_width", config.head_width), ("max_ffn_width", config.ffn_width)]
        for name, value in bounds:
            limit = getattr(self, name)
            if limit is not None and value > limit:
                return f"{name.removeprefix('max_').replace('_', ' ')} {value} > {name} {limit}"
        if self.min_vocab is not None and config.vocab < self.min_vocab:
            return f"vocab {config.vocab} < min_vocab {self.min_vocab}"
        if self.min_window is not None and config.window is not None and config.window < self.min_window:
            return f"window {config.window} < min_window {self.min_window}"
        if self.min_head_width is not None and config.head_width < self.min_head_width:
            return f"head width {config.head_width} < min_head_width {self.min_head_width}"
        if self.head_width_multiple is not None and config.head_width % self.head_width_multiple:
            return f"head width {config.head_width} is not a multiple of {self.head_width_multiple}"
        if self.kv_width_multiple is not None and (config.kv_heads * config.head_width) % self.kv_width_multiple:
            return (f"kv row width {config.kv_heads} x {config.head_width} is not a multiple of "
                    f"{self.kv_width_multiple}")
        if self.model_width_divisible_by_heads and config.model_width % config.heads:
            return f"model width {config.model_width} is not a multiple of {config.heads} heads"
        if config.architecture not in self.architectures:
            return (f"a model of architecture {config.architecture or 'none (a mix of Gemma switches)'}, but "
                    f"model_limits architectures are {list(self.architectures)}")
        if self.window_pattern is not None and config.window is not None:
            built = ModelConfig(layers=config.layers, window=config.window, window_pattern=self.window_pattern)
            if [config.layer_window(i) for i in range(config.layers)] != [built.layer_window(i)
                                                                          for i in range(config.layers)]:
                return (f"window pattern {config.window_pattern!r}, but model_limits window_pattern "
                        f"{self.window_pattern}")
        if self.local_rope_base is not None and config.window is not None:
            local = config.rope_base if config.local_rope_base is None else config.local_rope_base
            if local != self.local_rope_base:
                return f"local RoPE base {local}, but model_limits local_rope_base {self.local_rope_base}"
        return None

    def capability_problems(self, capabilities: frozenset[str]) -> list[str]:
        """Limits that contradict the capabilities (a usage error): nothing could be drawn within both."""
        problems = []
        if "gemma3" in self.architectures and "rope_half_split" not in capabilities:
            problems.append("model_limits architectures name gemma3 without rope_half_split: gemma3 rotates halves")
        if (self.window_pattern is not None or self.local_rope_base is not None) and \
                "interleaved_windows" not in capabilities:
            problems.append("model_limits window_pattern or local_rope_base without interleaved_windows, which they "
                            "bound")
        return problems

    def context_problem(self, config: ContextConfig) -> str | None:
        """Why a context of this configuration is outside the limits (None: inside)."""
        if self.max_cells is not None and config.cells > self.max_cells:
            return f"{config.cells} cells > max_cells {self.max_cells}"
        if self.max_sequences is not None and config.max_sequences > self.max_sequences:
            return f"{config.max_sequences} sequences > max_sequences {self.max_sequences}"
        return None


def declared_kv_storage(adapter: Any) -> str:
    """The adapter's ``kv_storage`` format (default: its ``dtype``, itself float64 by default), checked: the dtype
    itself, or float16 / bfloat16 / q8_0 / q4_0 under a wider computation (docs/spec.md §15.6), or a mapping: a
    block format with where its blocks are cut, or affine groups as a layer's ``storage`` declares them. A block
    format needs head widths that are whole blocks (``model_limits`` ``head_width_multiple``), or with its blocks
    along the whole kv row, kv rows that are (``kv_width_multiple``); affine groups, heads their group divides."""
    return _declared_kv(adapter)[0]


def declared_kv_format(adapter: Any) -> StorageFormat | None:
    """The adapter's cache as a storage format, where it is narrower than the computation (None: the dtype)."""
    return _declared_kv(adapter)[1]


def declared_kv_along(adapter: Any) -> str:
    """Where a block format's blocks are cut (``head``: from each head's row, the default; ``row``: from each
    token's whole kv row), as ``kv_storage`` declares it (checked as ``declared_kv_storage`` checks it)."""
    rule = _declared_kv(adapter)[1]
    return "head" if rule is None else rule.along


def described_kv_storage(adapter: Any) -> str | dict[str, Any]:
    """``kv_storage`` as a report states it: the name, or the mapping's keys that differ from their defaults."""
    storage, rule = _declared_kv(adapter)
    if not isinstance(getattr(adapter, "kv_storage", None), Mapping) or rule is None:
        return storage
    if rule.scale == "per_block":
        return {"format": storage, "along": rule.along}
    return {"format": storage, "scale": rule.scale, "group": rule.group,
            **({"min_step": rule.min_step} if rule.min_step else {}),
            **({"zero_point": rule.zero_point} if rule.zero_point != "minimum" else {})}


AFFINE_KV_KEYS = ("format", "scale", "group", "min_step", "zero_point")  # affine groups, as a layer's storage


def _kv_mapping(given: Mapping[str, Any]) -> StorageFormat:
    """A ``kv_storage`` mapping as a storage format: a block format and where its blocks are cut, or affine
    groups (``scale: per_group``) as a layer's ``storage`` declares them."""
    if set(given) == {"format", "along"} and given["along"] in KV_ALONG and str(given["format"]) in BLOCK_KV_STORAGES:
        return StorageFormat(str(given["format"]), "per_block", along=str(given["along"]))
    if "format" in given and given.get("scale") == "per_group" and set(given) <= set(AFFINE_KV_KEYS):
        try:
            return StorageFormat(**{str(k): v if k in ("group", "min_step") else str(v) for k, v in given.items()})
        except (TypeError, ValueError) as error:
            raise ValueError(f"kv_storage {dict(given)!r}: {error}") from None
    raise ValueError(f"kv_storage as a mapping is a block format and where its blocks are cut, {{'format': one of "
                     f"{tuple(BLOCK_KV_STORAGES)}, 'along': one of {KV_ALONG}}}, or affine groups, {{'format': "
                     f"'uint8' | 'uint4' | 'uint3' | 'uint2', 'scale': 'per_group', 'group': int, and optionally "
                     f"'min_step', 'zero_point'}}; got {dict(given)!r}")


def _declared_kv(adapter: Any) -> tuple[str, StorageFormat | None]:
    dtype = str(getattr(adapter, "dtype", "float64"))
    given = getattr(adapter, "kv_storage", None) or dtype
    if isinstance(given, Mapping):
        rule: StorageFormat | None = _kv_mapping(given)
        storage = str(given["format"])
    else:
        storage = str(given)
        if storage not in KV_STORAGES:
            raise ValueError(f"kv_storage must be one of {KV_STORAGES}, got {storage!r}")
        if storage != dtype and storage not in NARROW_KV_STORAGES:
            raise ValueError(f"kv_storage {storage!r} under dtype {dtype!r}: a cache is the dtype itself, or one of "
                             f"{NARROW_KV_STORAGES} under a wider computation")
        rule = None if storage == dtype else StorageFormat(
            storage, "per_block" if storage in BLOCK_KV_STORAGES else "none")
    if rule is not None and rule.scale in ("per_block", "per_group"):
        need = BLOCK_KV_STORAGES[storage] if rule.scale == "per_block" else rule.group
        limit = "kv_width_multiple" if rule.along == "row" else "head_width_multiple"
        multiple = getattr(ModelLimits.of(adapter), limit)
        if multiple is None or multiple % need:
            what = f"blocks of {need} features of a {'kv' if rule.along == 'row' else 'head'} row" if (
                rule.scale == "per_block") else f"groups of {need} features of a head row"
            raise ValueError(f"kv_storage {storage!r} stores {what}: declare model_limits {limit} {need} (or a "
                             f"multiple of it), got {multiple!r}")
    return storage, rule


def declared_activation_table(adapter: Any) -> str | None:
    """The adapter's ``activation_table`` (None: its gate activation computed in its dtype): the dtype of the table
    its gate activation is read from (``"float16"``: ggml's CPU GELU), for a ``float32`` model only."""
    table = getattr(adapter, "activation_table", None)
    if table is None:
        return None
    if table not in ACTIVATION_TABLES:
        raise ValueError(f"activation_table must be one of {ACTIVATION_TABLES}, got {table!r}")
    if str(getattr(adapter, "dtype", "float64")) != "float32":
        raise ValueError(f"activation_table {table!r} is declared by a float32 model only; this one declares dtype "
                         f"{getattr(adapter, 'dtype', 'float64')!r}")
    return str(table)


def model_methods(capabilities: frozenset[str]) -> list[str]:
    """The model methods an adapter declaring ``capabilities`` (spelled out) must have, in a stable order."""
    if "whole_model" not in capabilities:
        return []
    wanted = list(MODEL_METHODS)
    for capability, methods in SEQUENCE_OPERATIONS.items():
        if capability in capabilities:
            wanted += methods
    return wanted


@runtime_checkable
class ModelAdapter(Protocol):
    """Drives one whole-model engine for the suite (capability ``whole_model``).

    A batch's token ids and positions are Python ints or numpy integer scalars (``np.int64``, ``np.int32``:
    both are ints, docs/spec.md §15.3), its sequence ids and every operation's arguments Python ints (as the
    suite built them, valid or not). A range ``p0, p1`` is half-open, ``[p0, p1)``: any negative ``p0``
    means from 0, any negative ``p1`` to the end, and ``p1`` is never in it (docs/spec.md §15.4).
    """

    name: str
    version: str
    capabilities: frozenset[str]

    def create_model(self, config: ModelConfig, weights: ModelWeights) -> Any:
        """A model with these weights (llama.cpp: a GGUF written from them, loaded)."""

    def create_context(self, model: Any, config: ContextConfig) -> Any:
        """A new empty context of ``model``: ``config.cells`` cells, sequence ids ``0 .. max_sequences-1``,
        one store shared by every sequence if ``config.unified``, else one per sequence; ``config.sinks`` kept
        sink tokens (only >= 1 where ``attention_sinks`` is declared, the model windowed)."""

    def context_cells(self, context: Any) -> int:
        """The cells one store of the context really holds (an engine may round ``cells`` up; llama.cpp:
        ``llama_n_ctx_seq``). Unified: every sequence shares them; per-sequence: each sequence has that many."""

    def decode_batch(self, context: Any, batch: ModelBatch) -> np.ndarray:
        """Compute every token of the batch into its sequence's cells, all or none; return the logits of the
        tokens with ``batch.logits[i]`` set, ``[n_wanted, vocab]`` in batch order (any float dtype)."""

    def clear(self, context: Any) -> None:
        """Remove every cell of every sequence."""

    def seq_pos_min(self, context: Any, seq: int) -> int:
        """The smallest position held for ``seq``, -1 if it holds none."""

    def seq_pos_max(self, context: Any, seq: int) -> int:
        """The largest position held for ``seq``, -1 if it holds none."""

    def can_shift(self, context: Any) -> bool:
        """Whether positions can be shifted and divided (llama.cpp: false for M-RoPE and recurrent models)."""

    def seq_remove(self, context: Any, seq: int, p0: int, p1: int) -> None:
        """``seq_remove``: remove ``seq``'s cells at positions in the range (``seq < 0``: of every sequence)."""

    def seq_copy(self, context: Any, src: int, dst: int, p0: int, p1: int) -> None:
        """``seq_copy``: ``src``'s cells at positions in the range join ``dst`` (``model_policy`` says whether
        they are shared and what happens to ``dst``'s own cells)."""

    def seq_keep(self, context: Any, seq: int) -> None:
        """``seq_keep``: remove every cell of every other sequence."""

    def seq_shift(self, context: Any, seq: int, p0: int, p1: int, delta: int) -> None:
        """``seq_shift``: add ``delta`` to the positions of ``seq``'s cells in the range; their keys are rotated
        to the new positions, their values and every deeper layer stay as computed (not a recomputation). A
        shift past ``max_positions`` is outside the model: accepted, or refused changing nothing."""

    def seq_divide(self, context: Any, seq: int, p0: int, p1: int, d: int) -> None:
        """``seq_divide``: positions ``p`` in the range become ``p // d`` (``d >= 1``), keys re-rotated."""

    def save_sequence(self, context: Any, seq: int) -> Any:
        """``seq_state``: ``seq``'s cells, as bytes or any object ``load_sequence`` takes back; self-contained
        (nothing done to ``context`` afterwards changes what it loads)."""

    def load_sequence(self, context: Any, seq: int, state: Any) -> None:
        """``seq_state``: ``seq`` (of this or another context of the same model, of the same kind and sequence
        count, any cell count) holds exactly the saved cells (its own removed first); ``full`` if they do not
        fit."""

    def error_kind(self, error: BaseException) -> str | None:
        """The ``ErrorKind`` value of an exception the engine raised on purpose, or None."""


__all__ = [
    "ARCHITECTURE_LIMITS",
    "CAPACITIES",
    "CONTEXT_KINDS",
    "COPIES",
    "KV_STORAGES",
    "MODEL_METHODS",
    "NEGATIVE_SHIFTS",
    "POSITIONS",
    "REMOVALS",
    "SEQUENCE_OPERATIONS",
    "WINDOW_CELLS",
    "WINDOW_REMOVALS",
    "ContextConfig",
    "LayerWeights",
    "ModelAdapter",
    "ModelBatch",
    "ModelConfig",
    "ModelLimits",
    "ModelPolicy",
    "ModelPolicyError",
    "ModelWeights",
    "declared_activation_table",
    "declared_kv_along",
    "declared_kv_format",
    "declared_kv_storage",
    "described_kv_storage",
    "model_methods",
]
