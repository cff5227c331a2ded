"""Error kinds and capabilities: the vocabulary an adapter and the suite share.

Both are plain strings (``ErrorKind`` and ``Capability`` list them), so an
adapter need not import anything. A step is validated in the documented order
(docs/spec.md §4.5) and the first failing check decides the kind due;
``CLAIMED_BY`` names the capability under which each kind is judged.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


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
    # whole models (docs/spec.md §15); FULL above is also a context with no room for a batch or a load
    MALFORMED_BATCH = "malformed_batch"  # empty; a token outside [0, vocab); positions not consecutive; unknown seq
    REFUSED = "refused"  # not done: a sequence operation (an argument out of range, or refusable), a long prefill


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
    BATCH_SELECT = "batch_select"  # select(cache, indices): keep some batch rows (finished sequences leave)
    BATCH_REPEAT = "batch_repeat"  # repeat_interleave(cache, repeats): each batch row repeated (beam expansion)
    FORK = "fork"  # fork(cache): an independent copy (parallel sampling)
    SLIDING_WINDOW_LAYER = "sliding_window_layer"  # create_cache(..., window=W); snapshots name positions
    # A window cache that truncates only until it has held W rows, then refuses every truncation with EVICTED
    # (transformers' DynamicSlidingWindowLayer without recording): judged exactly, both ways.
    WINDOW_TRUNCATES_UNTIL_FULL = "window_truncates_until_full"
    # With it and attention_sinks: a cache with S sinks is full at W + S rows, not W (a ring of W + S slots).
    WINDOW_FULL_COUNTS_SINKS = "window_full_counts_sinks"
    # create_cache(..., window=W, sinks=S): the first S positions stay visible to every later query besides its
    # window (StreamingLLM's attention sinks; transformers' SinkCache, a prompt cache's "keep").
    ATTENTION_SINKS = "attention_sinks"
    # Batches as servers run them (docs/spec.md §13.8): rows of their own lengths, merged and split.
    RAGGED_ROWS = "ragged_rows"  # create_ragged_cache, append_ragged(x left-padded, lengths), ragged_snapshot
    BATCH_MERGE = "batch_merge"  # merge(cache, other): other's rows appended after the cache's (continuous batching)
    BATCH_EXTRACT = "batch_extract"  # extract(cache, row): a new cache of that one row; the cache unchanged
    BATCH_FILTER = "batch_filter"  # filter(cache, rows): keep these rows, in this order; none leaves a batch of 0
    # The caches of a model's layers, operated at once (docs/spec.md §13.9): create_layered_cache, layered_append (one
    # layer at a time), layered_snapshot; reset and, where declared, truncate, reorder, select, repeat_interleave
    # over every layer, a layer never written included.
    LAYERED_CACHE = "layered_cache"
    VALIDATES_LENGTH = "validates_length"  # truncate rejects an invalid n with invalid_length
    VALIDATES_INDICES = "validates_indices"  # reorder rejects invalid indices with invalid_indices
    # the decoder of docs/spec.md §9-10 (``DecoderAdapter``)
    DECODE_SESSION = "decode_session"  # prefill + decode over one cache per block, all or nothing
    PREFIX_STORE = "prefix_store"  # the longest-common-prefix store of spec §10
    PAGED_PREFIX_SHARING = "paged_prefix_sharing"  # a paged pool sharing hash-chained full blocks (spec §14)
    SLIDING_WINDOW = "sliding_window"  # decoders with a sliding attention window
    # whole models whose layers differ: a window in some layers only (window_pattern) and another RoPE base in the
    # windowed ones (local_rope_base); needs sliding_window (docs/spec.md §15.1)
    INTERLEAVED_WINDOWS = "interleaved_windows"
    # A windowed session that may refuse a prefill of more than W tokens with REFUSED, changing nothing (litgpt from
    # 0.5.13: "chunked prefill with chunk size <= W"); one of at most W tokens must still succeed.
    PREFILL_WITHIN_WINDOW = "prefill_within_window"
    POSITIONS_SINUSOIDAL = "positions_sinusoidal"  # absolute sinusoids added to the embedding
    POSITIONS_ROPE = "positions_rope"  # RoPE inside attention
    # whole models (``ModelAdapter``, docs/spec.md §15): decode batches over sequences; each operation optional
    WHOLE_MODEL = "whole_model"  # create_model, create_context, decode_batch, clear, seq_pos_min/max, context_cells
    SEQ_REMOVE = "seq_remove"  # seq_remove(ctx, seq, p0, p1): a position range of one sequence (or of all)
    SEQ_COPY = "seq_copy"  # seq_copy(ctx, src, dst, p0, p1): the cells of a range into another sequence
    SEQ_KEEP = "seq_keep"  # seq_keep(ctx, seq): every other sequence removed
    SEQ_SHIFT = "seq_shift"  # seq_shift(ctx, seq, p0, p1, delta): positions moved, keys re-rotated, values kept
    SEQ_DIVIDE = "seq_divide"  # seq_divide(ctx, seq, p0, p1, d): positions integer-divided by d
    SEQ_STATE = "seq_state"  # save_sequence / load_sequence: one sequence's cells out and back in (any context)
    VALIDATES_MODEL_BATCH = "validates_model_batch"  # rejects a malformed batch with malformed_batch
    # a batch token may name several sequences (a tuple of ids): one cell they all hold (llama.cpp's n_seq_id > 1)
    MULTI_SEQUENCE_TOKENS = "multi_sequence_tokens"
    VALIDATES_SEQUENCE_OPS = "validates_sequence_ops"  # rejects an out-of-range operation argument with refused


VALIDATIONS = {  # each claimed validation and the error kind it decides
    Capability.VALIDATES_DTYPE: ErrorKind.DTYPE, Capability.VALIDATES_RANK: ErrorKind.RANK,
    Capability.VALIDATES_TOKEN_COUNT: ErrorKind.TOKEN_COUNT, Capability.VALIDATES_BATCH: ErrorKind.BATCH_MISMATCH,
    Capability.VALIDATES_WIDTH: ErrorKind.WIDTH_MISMATCH, Capability.VALIDATES_TOKENS: ErrorKind.INVALID_TOKENS,
    Capability.VALIDATES_LENGTH: ErrorKind.INVALID_LENGTH, Capability.VALIDATES_INDICES: ErrorKind.INVALID_INDICES,
    Capability.VALIDATES_MODEL_BATCH: ErrorKind.MALFORMED_BATCH,
    Capability.VALIDATES_SEQUENCE_OPS: ErrorKind.REFUSED,
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


def declared(capabilities: Any) -> frozenset[str]:
    """An adapter's capabilities with the shorthands spelled out (``input_validation`` = every validation)."""
    names = {str(getattr(c, "value", c)) for c in capabilities}
    for shorthand, meaning in _IMPLIES.items():
        if shorthand in names:
            names |= meaning
    return frozenset(names)
