"""The reference's paged-cache methods for the conformance suite (docs/spec.md §14), as a mixin.

``PagedReferenceMethods`` adds the ``PagedCacheAdapter`` methods and the
declared policy to an adapter whose ``create_decoder`` builds ``impl``
decoders (``ReferenceAdapter``); its ``error_kind`` maps the errors raised
here, which all subclass ``impl.errors`` kinds. ``make_paged_adapter`` is the
reference adapter with the mixin, for running the paged machine alone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .decoder import Decoder
from .paged_cache import AddResult, LayerRows, PagedPool, PoolState

PAGED_CAPABILITY = "paged_prefix_sharing"


class PagedReferenceMethods:
    """``create_pool``, ``paged_add``, ``paged_append``, ``paged_fork``, ``paged_truncate``, ``paged_free``,
    ``paged_rows``, ``paged_state`` over ``impl.paged_cache.PagedPool``, and the policy they follow."""

    # The reference's policy: what its block hash covers, how it makes room, how far an add may reuse.
    paged_policy: ClassVar[dict[str, Any]] = {"hash_keys": ["scope", "signature"], "eviction": "lru",
                                              "hit_limit": "before_last_token", "truncate": True, "fork": "shared"}
    padding_page: ClassVar[bool] = False  # page 0 reserved for padding, the blocks numbered from 1 (not declared:
    # block ids are opaque, docs/spec.md §14.1)

    def create_pool(self, config: Any, block_size: int, num_blocks: int) -> PagedPool:
        policy = self.paged_policy
        return PagedPool(config.blocks, config.kv_heads, config.head_width, block_size, num_blocks,
                         hash_keys=policy["hash_keys"], eviction=policy["eviction"], hit_limit=policy["hit_limit"],
                         fork=policy["fork"], duplicates=policy.get("duplicates", "private_or_swap"),
                         hit_copy=policy.get("hit_copy", "any"), padding_page=self.padding_page)

    def paged_add(self, pool: PagedPool, decoder: Decoder, scope: str, tokens: Any, keys: Any = None) -> AddResult:
        return pool.add(decoder, scope, tokens, keys)

    def paged_append(self, pool: PagedPool, sequence: int, tokens: Any) -> Any:
        return pool.append(sequence, tokens)

    def paged_fork(self, pool: PagedPool, sequence: int) -> int:
        return pool.fork(sequence)

    def paged_truncate(self, pool: PagedPool, sequence: int, length: Any) -> None:
        pool.truncate(sequence, length)

    def paged_free(self, pool: PagedPool, sequence: int) -> None:
        pool.free(sequence)

    def paged_rows(self, pool: PagedPool, sequence: int) -> tuple[LayerRows, ...]:
        return pool.rows(sequence)

    def paged_state(self, pool: PagedPool) -> PoolState:
        return pool.state()


def make_paged_adapter() -> Any:
    """``ReferenceAdapter`` with the paged methods and capability, keeping the reference's name (which a mutant's
    copy of ``impl`` rewrites). Imported here, not at the top: ``impl.conformance`` mixes this module's class in."""
    from .conformance import ReferenceAdapter

    class PagedReferenceAdapter(ReferenceAdapter, PagedReferenceMethods):  # this order also once merged
        capabilities = ReferenceAdapter.capabilities | {PAGED_CAPABILITY}

    return PagedReferenceAdapter()
