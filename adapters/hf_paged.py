"""transformers' paged cache (``PagedAttentionCache``, continuous batching) driven through the paged protocol.

    KVCACHE_IMPL=adapters.hf_paged:paged_attention_cache pytest -n 2 properties/test_paged_cache.py

docs/paged.md (capability ``paged_prefix_sharing``); verdicts in docs/hf-transformers/paged.md. Factories:

- ``paged_attention_cache``: transformers as is; ``LlamaRotaryEmbedding`` computes cos/sin in float32, declared
  as ``mixed_precision = {"rope": "float32"}`` (docs/spec.md §8.4).
- ``paged_attention_cache_ids_checked``: the glue rejects token ids that are not ints in [0, vocab) before the
  request reaches the cache (transformers checks none, and makes room before it fails: finding P1), so that
  the rest is judged.
- ``paged_attention_cache_ids_checked_float64_rope``: the same with the RoPE table in float64 (1e-12 rule).
- ``paged_attention_cache_evict_first``: ids checked, room made in the engine's own order (every cached block
  evicted as soon as an operation does not fit in the free blocks, whether or not it then fits: finding P2).

Route 1 of issue #10: the suite's decoder (docs/spec.md §9) built from one
``LlamaAttention`` per block in float64 (``adapters.hf_llama``), over one
``PagedAttentionCache`` made on CPU from a ``ContinuousBatchingConfig``
(``page_size`` = the suite's block size, ``num_blocks``), a non-distributed
``DistributedHelper`` and its own memory handler, in float64. The attention
modules call ``cache.update(k, v, layer_idx, kwargs=...)`` themselves, with
the keyword arguments continuous batching builds for a batch of one request:
``read_index`` / ``write_index`` (one tensor per allocator, from the cache's
own ``extend_read_and_write_indices``; an empty read index for a request
with nothing cached, the engine's write-only path), ``cu_seq_lens_k`` /
``max_length_k`` keyed by layer type, and the additive mask of
``continuous_batching.utils.build_attention_mask``.

The glue does what the engine's scheduler and batch processor do around the
cache, in their order, with the cache's own methods:

- add: ``search_prefix_match`` (shares the matched registered blocks), then
  ``can_store_request_tokens``; when that fails, ``evict_cached_blocks`` (what
  ``OffloadingManager.offload_requests`` does first when nothing can be
  scheduled) and again ``can_store_request_tokens``; ``count_new_complete_blocks``
  before the forward, ``mark_complete_blocks`` after it (registration, or
  the swap of a duplicate for the registered block). A forward that raises
  frees the request, as ``handle_batch_error`` does.
- append (teacher-forced decode or chunk): the same without the prefix match.
- fork: ``prepare_fork_request`` + ``perform_cache_copy``; a child that does
  not fit becomes, as in ``update_batch``, ``create_equivalent_initial_request``
  prefilled from scratch (through the add path above: prefix match, eviction).
- free: ``free_blocks`` (``finish_request``).

Two decisions are the glue's own, and are what the suite's protocol has that
the engine does not: (1) an operation that cannot fit even after evicting
every cached block raises ``PoolFull`` (kind ``full``) before any eviction,
undoing its prefix match with ``free_blocks``; the engine would evict the
cached blocks anyway, then preempt running requests or keep the request
waiting (``paged_attention_cache_evict_first`` does that eviction).
(2) The exact block count: sectors are ``lcm(bytes per block, 128)`` bytes, so
transformers rounds ``num_blocks`` up to whole sectors; the excess blocks
(fewer than one sector's) are taken from the pool's free list once, at
creation, and held by no request ("ballast"), so that exactly ``num_blocks``
blocks serve the suite's sequences. The accounting read back is transformers'
own: free = free blocks of allocated sectors + blocks of free sectors; cached =
the ledger's ``cached_blocks``; reference counts = the ledger's
``shared_ref_counts`` (a count of 1 is implicit there); tables = the
allocator's ``block_table``. Block ids are renumbered densely (the allocator's
ids start after its two trash sectors).

Declared policy, from the source of 5.24 (``cache_allocators/cache_allocator.py``):
the block hash is ``blake2b(parent hash, tokens)`` only (``hash_keys: []``);
``evict_cached_blocks`` evicts every cached block (``all_at_once``);
``match_prefix_blocks`` looks at ``(len - 1) // page_size`` blocks at most
(``before_last_token``); there is no truncation of a request's cache
(``truncate: False``). No input validation, no binding checks: not claimed.

Safety margin: the scheduler also evicts every cached block before a batch whenever the free capacity is
below ``safety_margin`` (FIFO's default 0.15), needed or not; the suite's vocabulary has no such policy, so the
glue runs with the margin of ``PrefillFirstScheduler`` (0.0), under which eviction happens only when an
operation does not fit.

Page sizes: the suite draws block sizes 1-3; the engine's config resolution
(``check_cb_values_bounds``) refuses ``page_size < 4``, the cache class does not
check it. The cache is built directly, so sizes 1-3 are accepted here.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import transformers
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.generation.continuous_batching.distributed import DistributedHelper
from transformers.generation.continuous_batching.requests import RequestState, RequestStatus
from transformers.generation.continuous_batching.utils import build_attention_mask

from .hf_llama import ATTENTION, DTYPE, BlockRows, Decoder, LlamaDecoderAdapter, LlamaLayerAdapter, llama_config

FULL = "full_attention"
MAX_BATCH_TOKENS = 16  # the suite's sequences have at most 10 tokens; only sizes the memory handler's estimate


class PoolFull(RuntimeError):
    """The operation's blocks are neither free nor evictable (kind ``full``)."""


@dataclass(frozen=True, eq=False)
class Added:
    sequence: int
    logits: np.ndarray
    reused: int


@dataclass(frozen=True)
class State:
    total: int
    free: int
    cached: tuple[int, ...]
    references: dict[int, int]
    tables: dict[Hashable, tuple[int, ...]]


@dataclass(eq=False)
class Pool:
    """One ``PagedAttentionCache`` and the engine-side bookkeeping: each sequence's ``RequestState``."""

    hf: PagedAttentionCache
    kv_heads: int
    head_width: int
    ballast: tuple[int, ...]  # allocator block ids held by no request: the rounding beyond num_blocks
    ids: dict[int, int]  # allocator block id -> the suite's id, 0..num_blocks-1
    requests: dict[int, RequestState] = field(default_factory=dict)
    decoders: dict[int, Decoder] = field(default_factory=dict)
    next_id: int = 0

    @property
    def allocator(self) -> Any:
        return self.hf.cache_allocators[FULL]

    def free_count(self) -> int:
        """Free blocks: those of allocated sectors, plus every block of a free sector."""
        allocator = self.allocator
        return self.hf.pool.count_free_blocks(allocator.index) + self.hf.pool.num_free_sectors * \
            allocator.blocks_per_sector


def _make_cache(config: Any, block_size: int, num_blocks: int) -> Pool:
    hf_config = llama_config(config.heads, config.kv_heads, config.head_width, config.rope_base, config.max_positions,
                             blocks=config.blocks, vocab=config.vocab)
    cb_config = ContinuousBatchingConfig(page_size=block_size, num_blocks=num_blocks, max_batch_tokens=MAX_BATCH_TOKENS,
                                         max_memory_percent=0.6, max_blocks_per_request=0, allow_block_sharing=True,
                                         safety_margin=0.0)
    cache = PagedAttentionCache(hf_config, cb_config, "cpu", DistributedHelper(None, None), dtype=DTYPE)
    if set(cache.cache_allocators) != {FULL} or not cache.use_prefix_sharing:
        raise RuntimeError(f"expected one full-attention allocator with prefix sharing, got "
                           f"{list(cache.cache_allocators)} (sharing {cache.use_prefix_sharing})")
    allocator = cache.cache_allocators[FULL]
    every = range(2 * allocator.blocks_per_sector, (cache.num_sectors + 2) * allocator.blocks_per_sector)
    if allocator.num_blocks != len(every):
        raise RuntimeError(f"allocator has {allocator.num_blocks} blocks, expected {len(every)}")
    excess = allocator.num_blocks - num_blocks
    ballast: list[int] = []
    if excess > 0:  # fewer than one sector's blocks: take one sector, and keep `excess` of its blocks out of use
        cache.pool.allocate_sector(allocator.index)
        ballast = cache.pool.get_free_blocks(allocator.index, excess)
    ids = {block: index for index, block in enumerate(b for b in every if b not in set(ballast))}
    return Pool(cache, config.kv_heads, config.head_width, tuple(ballast), ids)


class PagedAttentionCacheAdapter(LlamaLayerAdapter):
    """The suite's decoder from ``LlamaAttention`` blocks over transformers' ``PagedAttentionCache``.

    The layer methods the suite's loader asks of every adapter are ``hf_llama``'s (``LlamaAttention`` over a
    ``DynamicCache``); only ``properties/test_paged_cache.py`` is meant for this adapter."""

    paged_policy: ClassVar[dict[str, Any]] = {"hash_keys": [], "eviction": "all_at_once",
                                              "hit_limit": "before_last_token", "truncate": False}
    dtype = "float64"

    def __init__(self, float64_rope: bool = False, check_ids: bool = False, evict_first: bool = False) -> None:
        super().__init__(static=False, float64_rope=float64_rope)
        self.check_ids, self.evict_first = check_ids, evict_first
        self.name = "hf-paged-attention-cache" + ("-ids-checked" if check_ids else "") + \
            ("-float64-rope" if float64_rope else "") + ("-evict-first" if evict_first else "")
        rope = "float64 RoPE table" if float64_rope else "float32 RoPE table"
        self.version = f"transformers {transformers.__version__}, torch {torch.__version__}, {ATTENTION}, {rope}"
        # transformers' LlamaRotaryEmbedding computes cos/sin in float32 (docs/hf-transformers/README.md, finding 1)
        self.mixed_precision: dict[str, str] = {} if float64_rope else {"rope": "float32"}
        declared = {"rope_half_split", "gqa", "positions_rope", "paged_prefix_sharing"}
        self.capabilities = frozenset(declared | ({"float64"} if float64_rope else set()))
        self._decoders = LlamaDecoderAdapter(float64_rope=float64_rope)

    # -- decoders --------------------------------------------------------------------------------------------

    def create_decoder(self, config: Any, weights: Any) -> Decoder:
        return self._decoders.create_decoder(config, weights)

    def update_block_weights(self, decoder: Decoder, block: int, weights: Any) -> None:
        self._decoders.update_block_weights(decoder, block, weights)

    def _forward(self, pool: Pool, decoder: Decoder, state: RequestState, tokens: list[Any]) -> np.ndarray:
        """One request's forward pass of ``tokens`` after its ``position_offset`` cached rows, as a batch of one
        (input preparation as ``ContinuousBatchingIOs.prepare_batch_tensors`` does it); logits ``[T, vocab]``."""
        past, count = state.position_offset, len(tokens)
        ids = torch.tensor(tokens, dtype=torch.int32)  # the engine's input_ids
        write: list[list[int]] = [[]]
        read: list[list[int]] | None = None if past == 0 else [[]]
        pool.hf.extend_read_and_write_indices(state.request_id, past, count, read, write)
        seqlen_k = pool.allocator.get_seqlen_k(past, count)
        mask = torch.empty((1, 1, count, seqlen_k), dtype=DTYPE)
        build_attention_mask(mask, [0, count], [0, seqlen_k])
        state.position_offset += count
        kwargs = {
            "read_index": [torch.tensor(read[0], dtype=torch.int64) if read else torch.empty(0, dtype=torch.int64)],
            "write_index": [torch.tensor(write[0], dtype=torch.int64)],
            "cu_seq_lens_q": torch.tensor([0, count], dtype=torch.int32),
            "max_length_q": count,
            "cu_seq_lens_k": {FULL: torch.tensor([0, seqlen_k], dtype=torch.int32)},
            "max_length_k": {FULL: seqlen_k},
            "is_causal": False,  # sdpa / eager: the mask is passed
        }
        hidden = decoder.embedding[ids.long()][None]  # [1, T, D]
        positions = torch.arange(past, past + count)[None]
        with torch.no_grad():
            cos_sin = decoder.rotary(hidden, positions)
            for block in decoder.blocks:
                output, _ = block(hidden, cos_sin, mask, cache=pool.hf, **kwargs)
                hidden = hidden + torch.tanh(output)
            return (hidden[0] @ decoder.embedding.T).numpy()

    # -- room: the engine's order, with the glue's one check (module docstring) ---------------------------------

    def _make_room(self, pool: Pool, state: RequestState, length: int) -> None:
        """Allocate the blocks ``length`` new tokens need: free ones, else after evicting every cached block; raise
        ``PoolFull`` (having changed nothing) if even that is not enough."""
        pool.hf.pool.try_to_free_sectors()  # what the scheduler does before each batch
        if pool.hf.can_store_request_tokens(state, length):
            return
        needed = pool.allocator.needs_new_blocks(state.request_id, state.current_len(), length)
        if self.evict_first:  # the engine's order: evict every cached block, then see whether the request fits
            pool.hf.evict_cached_blocks()
            pool.hf.pool.try_to_free_sectors()
        if needed > pool.free_count() + len(pool.allocator.ledger.cached_blocks):
            raise PoolFull(f"{needed} blocks needed, {pool.free_count()} free, "
                           f"{len(pool.allocator.ledger.cached_blocks)} cached")
        pool.hf.evict_cached_blocks()  # OffloadingManager.offload_requests, when nothing could be scheduled
        pool.hf.pool.try_to_free_sectors()
        if not pool.hf.can_store_request_tokens(state, length):
            raise RuntimeError(f"can_store_request_tokens refused {needed} blocks after eviction, with "
                               f"{pool.free_count()} free")

    # -- the paged protocol --------------------------------------------------------------------------------------

    def create_pool(self, config: Any, block_size: int, num_blocks: int) -> Pool:
        return _make_cache(config, block_size, num_blocks)

    def _new_id(self, pool: Pool) -> tuple[int, str]:
        sequence = pool.next_id
        pool.next_id += 1
        return sequence, f"request-{sequence}"

    def _prefill(self, pool: Pool, decoder: Decoder, state: RequestState) -> tuple[np.ndarray, int]:
        """A pending request, as the scheduler and the batch processor handle it; (logits, tokens reused)."""
        reused = 0
        if pool.hf.use_prefix_sharing:
            reused = pool.hf.search_prefix_match(state.request_id, state.remaining_prefill_tokens)
            if reused > 0:
                state.status = RequestStatus.PREFILLING
                state.remaining_prefill_tokens = state.remaining_prefill_tokens[reused:]
                state.position_offset += reused
        tokens = state.remaining_prefill_tokens
        try:
            self._make_room(pool, state, len(tokens))
        except PoolFull:
            pool.hf.free_blocks(state.request_id)  # gives back what the prefix match took
            raise
        complete = pool.hf.count_new_complete_blocks(state, len(tokens))
        state.tokens_to_process, state.remaining_prefill_tokens = tokens, []
        state.status = RequestStatus.DECODING
        try:
            logits = self._forward(pool, decoder, state, tokens)
            pool.hf.mark_complete_blocks(state, complete)  # hashes array("i", tokens): raises on non-int tokens
        except BaseException:
            pool.hf.free_blocks(state.request_id)  # the engine's error path: handle_batch_error -> finish_request
            raise
        return logits, reused

    def _checked(self, decoder: Decoder, tokens: Any) -> None:
        """``check_ids``: what transformers does not do -- token ids must be ints in [0, vocab), checked before
        the request touches the cache (else ValueError, not claimed as ``validates_tokens``)."""
        vocab = decoder.embedding.shape[0]
        if isinstance(tokens, (str, bytes)) or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, (bool, np.bool_)) and 0 <= t < vocab
                for t in tokens) or len(tokens) == 0:
            raise ValueError(f"token ids must be ints in [0, {vocab}), at least one: {tokens!r}")

    def paged_add(self, pool: Pool, decoder: Decoder, scope: str, tokens: Any) -> Added:
        if self.check_ids:
            self._checked(decoder, tokens)
        sequence, request_id = self._new_id(pool)
        state = RequestState(request_id=request_id, initial_tokens=list(tokens), max_new_tokens=None)
        logits, reused = self._prefill(pool, decoder, state)
        pool.requests[sequence], pool.decoders[sequence] = state, decoder
        return Added(sequence, logits, reused)

    def paged_append(self, pool: Pool, sequence: int, tokens: Any) -> np.ndarray:
        state, decoder = pool.requests[sequence], pool.decoders[sequence]
        tokens = list(tokens)
        self._make_room(pool, state, len(tokens))
        complete = pool.hf.count_new_complete_blocks(state, len(tokens))
        state.tokens_to_process = tokens
        logits = self._forward(pool, decoder, state, tokens)
        state.generated_tokens.extend(tokens)  # update_and_check_completion, then the blocks are marked
        pool.hf.mark_complete_blocks(state, complete)
        return logits

    def paged_fork(self, pool: Pool, sequence: int) -> int:
        source = pool.requests[sequence]
        child, request_id = self._new_id(pool)
        pool.hf.pool.try_to_free_sectors()
        copies: dict[str, tuple[list[int], list[int]]] = {name: ([], []) for name in pool.hf.cache_allocators}
        if pool.hf.prepare_fork_request(source, [request_id], copies):
            pool.hf.perform_cache_copy(copies)
            state = source.fork(request_id)
        else:  # update_batch: a child that does not fit is a new request, prefilled from scratch
            state = source.create_equivalent_initial_request()
            state.request_id = request_id
            self._prefill(pool, pool.decoders[sequence], state)
        pool.requests[child], pool.decoders[child] = state, pool.decoders[sequence]
        return child

    def paged_free(self, pool: Pool, sequence: int) -> None:
        state = pool.requests.pop(sequence)
        pool.decoders.pop(sequence)
        pool.hf.free_blocks(state.request_id)  # Scheduler.finish_request

    def paged_rows(self, pool: Pool, sequence: int) -> tuple[BlockRows, ...]:
        """Each layer's rows, read where the cache's own read indices point."""
        state = pool.requests[sequence]
        length = state.current_len()
        allocator = pool.allocator
        index = torch.tensor(allocator.get_read_indices(state.request_id, length, 0), dtype=torch.int64)
        rows = []
        for layer in allocator.layer_indices:
            k_cache, v_cache = allocator._kv_token_views[layer]  # the views update() writes and reads
            keys, values = (torch.index_select(c, 0, index).transpose(0, 1).numpy().copy() for c in (k_cache, v_cache))
            rows.append(BlockRows(keys, values, np.arange(length)))
        return tuple(rows)

    def paged_state(self, pool: Pool) -> State:
        allocator, ids = pool.allocator, pool.ids
        ledger = allocator.ledger
        tables = {sequence: tuple(ids[b] for b in allocator.block_table.get(state.request_id, ()))
                  for sequence, state in pool.requests.items()}
        references = {ids[b]: count for b, count in ledger.shared_ref_counts.items()}  # counts >= 2 are stored
        for table in allocator.block_table.values():
            for block in table:
                references.setdefault(ids[block], 1)  # a count of 1 is implicit in the ledger
        return State(len(ids), pool.free_count(), tuple(sorted(ids[b] for b in ledger.cached_blocks)), references,
                     tables)

    def error_kind(self, error: BaseException) -> str | None:
        return "full" if isinstance(error, PoolFull) else None


def paged_attention_cache() -> PagedAttentionCacheAdapter:
    """transformers as is: ``LlamaRotaryEmbedding`` (float32 cos/sin, declared ``mixed_precision``)."""
    return PagedAttentionCacheAdapter()


def paged_attention_cache_ids_checked() -> PagedAttentionCacheAdapter:
    """As ``paged_attention_cache``, with token ids checked by the glue before scheduling (finding P1 stepped
    around, so that the rest is judged)."""
    return PagedAttentionCacheAdapter(check_ids=True)


def paged_attention_cache_ids_checked_float64_rope() -> PagedAttentionCacheAdapter:
    """As ``paged_attention_cache_ids_checked``, with the RoPE table computed in float64 (judged at 1e-12)."""
    return PagedAttentionCacheAdapter(float64_rope=True, check_ids=True)


def paged_attention_cache_evict_first() -> PagedAttentionCacheAdapter:
    """As ``paged_attention_cache_ids_checked``, making room in the engine's order: every cached block is evicted
    whenever an operation does not fit in the free blocks, before knowing whether it then fits (finding P2)."""
    return PagedAttentionCacheAdapter(check_ids=True, evict_first=True)
