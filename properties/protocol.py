"""The adapter protocol: the only way the suite reaches an implementation.

An adapter is any object with the attributes and methods of ``KvCacheAdapter``
(structural typing: nothing needs to be imported or subclassed). Layers and
caches are opaque handles the suite passes back to the adapter. Error kinds
and capabilities are plain strings, listed in ``ErrorKind`` and ``Capability``,
so an adapter need not import this module. See ``docs/adapters.md`` for a
minimal complete example.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import numpy as np

from oracle import AttentionWeights, DecoderConfig, DecoderWeights, RopeConfig

__all__ = ["CLAIMED_BY", "LAYER_CONVENTIONS", "METHODS_OF", "VALIDATIONS", "AttentionWeights", "BlockState",
           "CacheOperations", "CacheSnapshot", "Capability", "DecoderAdapter", "DecoderConfig", "DecoderWeights",
           "ErrorKind", "KvCacheAdapter", "LayerLimits", "RopeConfig", "StoreEntry", "StoreResult", "declared",
           "required_methods"]


class ErrorKind(str, Enum):
    """What a rejected call was rejected for; adapters map their exceptions onto these.

    A step is validated in this order, and the first failing check decides the
    kind: dtype, rank, token count, batch, width, geometry, layer identity,
    parameter revision, RoPE configuration, free capacity, non-finite values.
    """

    DTYPE = "dtype"  # the input is not a float64 array
    RANK = "rank"  # the input is not [B, 1, D]-ranked
    TOKEN_COUNT = "token_count"  # not exactly one new token
    BATCH_MISMATCH = "batch_mismatch"  # input batch != cache batch
    WIDTH_MISMATCH = "width_mismatch"  # input width != model width
    GEOMETRY_MISMATCH = "geometry_mismatch"  # cache built for other widths or head counts
    LAYER_MISMATCH = "layer_mismatch"  # cache built for other parameter objects
    REVISION_MISMATCH = "revision_mismatch"  # parameters written in place since the cache was built
    ROPE_MISMATCH = "rope_mismatch"  # cache built under another RoPE configuration
    FULL = "full"  # no free row
    NON_FINITE = "non_finite"  # the input, a projection, the scores or the output is inf/NaN
    INVALID_TOKENS = "invalid_tokens"  # not a non-empty 1-D sequence of int ids in [0, vocab)
    # cache creation
    INVALID_ARGUMENT = "invalid_argument"  # batch or capacity not an int (a bool is not), or negative
    ZERO_BATCH = "zero_batch"
    ZERO_CAPACITY = "zero_capacity"
    CAPACITY_EXCEEDS_POSITIONS = "capacity_exceeds_positions"
    ELEMENT_COUNT_OVERFLOW = "element_count_overflow"  # more bytes than an array can index
    ALLOCATION_FAILED = "allocation_failed"  # addressable, but the memory cannot be had
    # cache operations (docs/spec.md §13)
    INVALID_LENGTH = "invalid_length"  # truncate(n): n not an int (a bool is not), negative, or above the length
    EVICTED = "evicted"  # truncate(n) of a window cache needs rows it no longer holds
    INVALID_INDICES = "invalid_indices"  # reorder: not B int indices, each in [0, B)


class Capability(str, Enum):
    """What an implementation claims; properties needing an absent one are skipped."""

    FLOAT64 = "float64"  # computes in float64: judged at 1e-12 absolute
    # Validation, one kind at a time: the error kind of such an input is judged only where claimed.
    VALIDATES_DTYPE = "validates_dtype"  # rejects anything but a float64 ndarray
    VALIDATES_RANK = "validates_rank"  # rejects inputs that are not 3-D
    VALIDATES_TOKEN_COUNT = "validates_token_count"  # rejects steps of other than one token
    VALIDATES_BATCH = "validates_batch"  # rejects an input batch other than the cache's
    VALIDATES_WIDTH = "validates_width"  # rejects an input width other than the model's
    VALIDATES_TOKENS = "validates_tokens"  # rejects invalid token sequences (sessions, stores)
    INPUT_VALIDATION = "input_validation"  # shorthand: all six above (not validates_length / _indices)
    NON_FINITE_REJECTION = "non_finite_rejection"  # rejects inf/NaN inputs and overflowing steps
    BINDING_CHECKS = "binding_checks"  # rejects other geometry, identity, revision, RoPE; stale sessions
    FIXED_CAPACITY = "fixed_capacity"  # preallocated capacity; a full cache (or session) rejects with FULL
    CREATION_ERRORS = "creation_errors"  # typed errors for bad batch/capacity/size at creation
    GQA = "gqa"  # kv_heads may divide heads (GQA, MQA), not only equal them
    ROPE_INTERLEAVED = "rope_interleaved"
    ROPE_HALF_SPLIT = "rope_half_split"
    PARTIAL_ROTARY = "partial_rotary"  # rotary width may be below head width
    PHYSICAL_STORAGE = "physical_storage"  # snapshots expose [B, KV, C, dh] buffers and their identity
    # What reset does to the storage (observable with physical_storage); none declared: only length 0 is judged.
    RESET_KEEPS_BUFFERS = "reset_keeps_buffers"  # the same buffers afterwards (contents unspecified)
    RESET_KEEPS_BYTES = "reset_keeps_bytes"  # the same buffers, every byte as it was (ch. 37; implies the above)
    RESET_ZEROES = "reset_zeroes"  # every byte of both buffers 0 afterwards (the same buffers or new ones)
    # Position conventions of a layer cache (besides rope_interleaved / rope_half_split, keys cached rotated).
    KEYS_UNROTATED = "keys_unrotated"  # keys cached before RoPE, rotated when read
    POSITIONLESS = "positionless"  # layers without RoPE (no positional dependence): handed rope=None
    # Cache operations beyond the one-row step (docs/spec.md §13), each an optional adapter method.
    CHUNKED_APPEND = "chunked_append"  # append(layer, cache, x [B, T, D]): T rows at once, all or none
    TRUNCATE = "truncate"  # truncate(cache, n): keep the first n rows (speculative decoding's rollback)
    BATCH_REORDER = "batch_reorder"  # reorder(cache, indices): gather batch rows (beam search)
    FORK = "fork"  # fork(cache): an independent copy (parallel sampling)
    SLIDING_WINDOW_LAYER = "sliding_window_layer"  # create_cache(..., window=W); snapshots name positions
    VALIDATES_LENGTH = "validates_length"  # truncate rejects an invalid n with invalid_length
    VALIDATES_INDICES = "validates_indices"  # reorder rejects invalid indices with invalid_indices
    # the decoder of docs/spec.md §9-10 (``DecoderAdapter``)
    DECODE_SESSION = "decode_session"  # prefill + decode over one cache per block, all or nothing
    PREFIX_STORE = "prefix_store"  # the longest-common-prefix store of spec §10
    PAGED_PREFIX_SHARING = "paged_prefix_sharing"  # a paged pool sharing hash-chained full blocks (spec §14)
    SLIDING_WINDOW = "sliding_window"  # decoders with a sliding attention window
    POSITIONS_SINUSOIDAL = "positions_sinusoidal"  # absolute sinusoids added to the embedding
    POSITIONS_ROPE = "positions_rope"  # RoPE inside attention


VALIDATIONS = {  # each claimed validation and the error kind it decides
    Capability.VALIDATES_DTYPE: ErrorKind.DTYPE, Capability.VALIDATES_RANK: ErrorKind.RANK,
    Capability.VALIDATES_TOKEN_COUNT: ErrorKind.TOKEN_COUNT, Capability.VALIDATES_BATCH: ErrorKind.BATCH_MISMATCH,
    Capability.VALIDATES_WIDTH: ErrorKind.WIDTH_MISMATCH, Capability.VALIDATES_TOKENS: ErrorKind.INVALID_TOKENS,
    Capability.VALIDATES_LENGTH: ErrorKind.INVALID_LENGTH, Capability.VALIDATES_INDICES: ErrorKind.INVALID_INDICES,
}
CLAIMED_BY: dict[ErrorKind, Capability] = {  # the claim under which each error kind of a call is judged
    **{kind: capability for capability, kind in VALIDATIONS.items()},
    ErrorKind.GEOMETRY_MISMATCH: Capability.BINDING_CHECKS, ErrorKind.LAYER_MISMATCH: Capability.BINDING_CHECKS,
    ErrorKind.REVISION_MISMATCH: Capability.BINDING_CHECKS, ErrorKind.ROPE_MISMATCH: Capability.BINDING_CHECKS,
    ErrorKind.FULL: Capability.FIXED_CAPACITY, ErrorKind.NON_FINITE: Capability.NON_FINITE_REJECTION,
    ErrorKind.EVICTED: Capability.TRUNCATE,
}
_SHORTHAND_VALIDATIONS = (  # what input_validation stands for: the checks of a step and of token sequences
    Capability.VALIDATES_DTYPE, Capability.VALIDATES_RANK, Capability.VALIDATES_TOKEN_COUNT,
    Capability.VALIDATES_BATCH, Capability.VALIDATES_WIDTH, Capability.VALIDATES_TOKENS)
_IMPLIES = {
    Capability.INPUT_VALIDATION.value: {c.value for c in _SHORTHAND_VALIDATIONS},
    Capability.RESET_KEEPS_BYTES.value: {Capability.RESET_KEEPS_BUFFERS.value},
}


# An adapter declaring one of these drives layer caches (and has KvCacheAdapter's methods); one declaring none
# drives only a decoder, a store or a paged pool.
LAYER_CONVENTIONS = frozenset({Capability.ROPE_INTERLEAVED.value, Capability.ROPE_HALF_SPLIT.value,
                               Capability.POSITIONLESS.value})
# The methods each capability adds to an adapter (besides name, version, capabilities and error_kind).
METHODS_OF = {
    "layer caches": ("create_layer", "recreate_layer", "with_rope", "update_weights", "create_cache", "step", "reset",
                     "snapshot"),
    Capability.CHUNKED_APPEND.value: ("append",), Capability.TRUNCATE.value: ("truncate",),
    Capability.BATCH_REORDER.value: ("reorder",), Capability.FORK.value: ("fork",),
    Capability.DECODE_SESSION.value: ("create_decoder", "update_block_weights", "create_session", "prefill", "decode",
                                      "reset_session", "session_state"),
    Capability.PREFIX_STORE.value: ("create_decoder", "update_block_weights", "create_store", "store_prefill",
                                    "store_query", "store_entries"),
    Capability.PAGED_PREFIX_SHARING.value: ("create_decoder", "update_block_weights", "create_pool", "paged_add",
                                            "paged_append", "paged_fork", "paged_free", "paged_rows", "paged_state"),
    # paged_truncate only where the paged_policy declares truncate (properties/paged_protocol.py)
}


def required_methods(capabilities: Any) -> list[str]:
    """The methods an adapter declaring ``capabilities`` must have, in a stable order."""
    names = declared(capabilities)
    wanted = ["error_kind"]
    groups = (["layer caches"] if names & LAYER_CONVENTIONS else []) + sorted(names & set(METHODS_OF))
    for group in groups:
        wanted += [method for method in METHODS_OF[group] if method not in wanted]
    return wanted


def declared(capabilities: Any) -> frozenset[str]:
    """An adapter's capabilities with the shorthands spelled out (``input_validation`` = every validation)."""
    names = {str(getattr(c, "value", c)) for c in capabilities}
    for shorthand, meaning in _IMPLIES.items():
        if shorthand in names:
            names |= meaning
    return frozenset(names)


@dataclass(frozen=True)
class LayerLimits:
    """The geometries an implementation can build (an adapter's optional ``layer_limits``, a mapping).

    The suite draws only layers within them, and the report says so. Every
    field is optional; the defaults are the suite's own ranges.
    """

    model_width_is_heads_times_head_width: bool = False  # D == H * dh (most model code assumes it)
    max_heads: int | None = None
    max_head_width: int | None = None
    max_model_width: int | None = None
    max_batch: int | None = None
    max_capacity: int | None = None
    min_window: int | None = None  # the smallest sliding window a window cache is built with (sliding_window_layer)

    @classmethod
    def of(cls, adapter: Any) -> LayerLimits:
        given = getattr(adapter, "layer_limits", None) or {}
        if isinstance(given, LayerLimits):
            return given
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"layer_limits: unknown limit {', '.join(map(repr, unknown))}; known: {sorted(known)}")
        for name, value in given.items():
            wanted = bool if name == "model_width_is_heads_times_head_width" else int
            if not isinstance(value, wanted) or (wanted is int and (isinstance(value, bool) or value < 1)):
                raise TypeError(f"layer_limits[{name!r}] must be {'a bool' if wanted is bool else 'an int >= 1'}, "
                                f"got {value!r}")
        return cls(**given)

    def described(self) -> dict[str, Any]:
        """The limits that differ from the suite's defaults (for reports)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}


@dataclass(frozen=True, eq=False)
class CacheSnapshot:
    """Everything observable about a cache, as copies the suite may keep.

    ``keys`` (rotated) and ``values`` (unrotated) are the logical prefix
    ``[B, KV, length, dh]``; a sliding-window cache gives the rows it holds,
    ``[B, KV, n, dh]``, oldest first, and their absolute ``positions [n]``
    (docs/spec.md §13.5; None elsewhere). With ``physical_storage``, ``physical_keys`` and
    ``physical_values`` are copies of the whole buffers ``[B, KV, C, dh]`` and
    ``buffer_identity`` is any hashable that changes iff a buffer is
    reallocated (e.g. the buffers' addresses); otherwise all three are None.
    """

    length: int
    keys: np.ndarray
    values: np.ndarray
    physical_keys: np.ndarray | None = None
    physical_values: np.ndarray | None = None
    buffer_identity: Hashable | None = None
    positions: np.ndarray | None = None


@runtime_checkable
class KvCacheAdapter(Protocol):
    """Drives one KV-cache implementation for the suite.

    Every array the suite passes is float64 unless a test says otherwise; the
    adapter may keep it but must not write into it. ``step`` returns the
    layer output ``[B, 1, D]``. Exceptions the implementation raises on
    purpose must be mapped by ``error_kind``; returning None marks an
    exception as unexpected. An optional ``dtype`` attribute (``"float64"``,
    the default, ``"float32"``, ``"float16"``, ``"bfloat16"``) chooses the
    tolerance rule (``properties/tolerance.py``).
    """

    name: str  # implementation id: names its example database and reports
    version: str
    capabilities: frozenset[str]

    def create_layer(self, weights: AttentionWeights, rope: RopeConfig) -> Any:
        """A new layer owning new parameters with these values."""

    def recreate_layer(self, layer: Any) -> Any:
        """A new layer with new parameter objects holding equal values and the same RoPE."""

    def with_rope(self, layer: Any, rope: RopeConfig) -> Any:
        """A layer sharing ``layer``'s parameter objects, under another RoPE configuration."""

    def update_weights(self, layer: Any, weights: AttentionWeights) -> None:
        """Write new values into ``layer``'s parameters in place, as an optimiser step does."""

    def create_cache(self, layer: Any, batch_size: int, capacity: int) -> Any:
        """A new empty cache bound to ``layer``."""

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        """One incremental step: attend ``x [B, 1, D]`` over the cache, append its K/V row."""

    def reset(self, cache: Any) -> None:
        """Empty the cache's logical prefix."""

    def snapshot(self, cache: Any) -> CacheSnapshot:
        """Copies of the cache's observable state: a ``CacheSnapshot`` or any object with its fields."""

    def error_kind(self, error: BaseException) -> str | None:
        """The ``ErrorKind`` value of an exception the implementation raised, or None."""


@runtime_checkable
class CacheOperations(Protocol):
    """Optional operations of a layer cache (docs/spec.md §13), each under its own capability.

    An adapter has only the methods whose capability it declares; with
    ``sliding_window_layer`` its ``create_cache`` also takes ``window=W`` and
    its snapshots give ``positions``.
    """

    def append(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        """``chunked_append``: attend ``x [B, T, D]`` (T >= 1) causally over the cache and itself at positions
        ``length .. length+T-1``; append all T rows, or none. Returns ``[B, T, D]``."""

    def truncate(self, cache: Any, n: int) -> None:
        """``truncate``: keep the first ``n`` rows; the next row is appended at position ``n``."""

    def reorder(self, cache: Any, indices: np.ndarray) -> None:
        """``batch_reorder``: batch row ``b`` becomes the old row ``indices[b]`` (repeats and drops allowed)."""

    def fork(self, cache: Any) -> Any:
        """``fork``: an independent copy; writes to either never show in the other."""


@dataclass(frozen=True, eq=False)
class BlockState:
    """One block's cache: rows held ``keys`` (rotated) and ``values`` ``[KV, n, dh]`` at ``positions [n]``."""

    keys: np.ndarray
    values: np.ndarray
    positions: np.ndarray


@dataclass(frozen=True, eq=False)
class StoreResult:
    """A store call: ``logits [len - cut, vocab]`` of the positions computed, what was reused, row counts."""

    logits: np.ndarray
    cut: int
    rows_computed: int  # blocks * 3 * (len(tokens) - cut)
    full_rows: int  # blocks * 3 * len(tokens)
    entry: int | None  # index in store_entries() (oldest first) of the entry reused; None if none


@dataclass(frozen=True, eq=False)
class StoreEntry:
    """A stored prefill, as copies: scope, tokens, per-block rows and ``next_position``."""

    scope: str
    tokens: tuple[int, ...]
    blocks: tuple[BlockState, ...]
    next_position: int


@runtime_checkable
class DecoderAdapter(Protocol):
    """The decoder half of an adapter (capabilities ``decode_session`` / ``prefix_store``).

    Token sequences are handed over exactly as the suite built them -- valid
    or not (``[1.0, 2]``, ``[True]``, ``[]``) -- and must be rejected with
    ``invalid_tokens`` when invalid. Results may be any objects with the fields
    of ``StoreResult``, ``StoreEntry`` and ``BlockState``.
    """

    def create_decoder(self, config: DecoderConfig, weights: DecoderWeights) -> Any:
        """A new decoder owning new parameters with these values."""

    def update_block_weights(self, decoder: Any, block: int, weights: AttentionWeights) -> None:
        """Write new values into block ``block``'s four parameters in place (one layer's optimiser step)."""

    def create_session(self, decoder: Any, capacity: int) -> Any:
        """A decode session of at most ``capacity`` tokens, one cache per block."""

    def prefill(self, session: Any, tokens: Any) -> np.ndarray:
        """Process tokens in one step; logits ``[T, vocab]`` of their positions."""

    def decode(self, session: Any, token: Any) -> np.ndarray:
        """Process one token; logits ``[vocab]``."""

    def reset_session(self, session: Any) -> None:
        """Empty every block's cache."""

    def session_state(self, session: Any) -> tuple[BlockState, ...]:
        """Copies of every block's cache, and nothing else."""

    def create_store(self, capacity: int) -> Any:
        """An empty prefix store keeping at most ``capacity`` entries."""

    def store_prefill(self, store: Any, decoder: Any, scope: str, tokens: Any) -> StoreResult:
        """Compute ``tokens`` and store them (evicting the oldest entry when full); computing from scratch
        or first reusing a stored prefix by the query's rules are both conforming (docs/spec.md §10.7)."""

    def store_query(self, store: Any, decoder: Any, scope: str, tokens: Any) -> StoreResult:
        """Compute ``tokens`` reusing the longest usable stored prefix; store nothing."""

    def store_entries(self, store: Any) -> list[StoreEntry]:
        """Copies of the entries, oldest first."""
