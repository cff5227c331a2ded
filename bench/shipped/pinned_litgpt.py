"""``adapters/litgpt_kvcache.py`` pinned to litgpt releases before 0.5.13 (0.5.11, 0.5.12), for the shipped bugs.

    KVCACHE_IMPL=bench.shipped.pinned_litgpt:make_adapter pytest -n 0 properties/test_session.py

The published adapter is written for 0.5.13. Two things of its API are younger:

- ``Config(rope_interleave=...)`` and ``apply_rope_interleave`` are new in 0.5.13: 0.5.11 and 0.5.12 have the
  half-split pairing only. This adapter builds litgpt's ``Config`` without that keyword and does not declare
  ``rope_interleaved``; snapshots need no feature reordering (half-split keys are stored in the model's order).
- ``KVCache(is_sliding_window=..., sliding_window_size=...)`` and ``KVCache.max_cache_len`` are new in 0.5.12
  (the ring). 0.5.11's sliding-window layer has a ``KVCache`` of the whole capacity, position p in slot p, and
  the window only in the mask: its session state shows every row held (positions 0..n-1), which docs/spec.md
  allows ("older ones may be shown too").

Everything else is the published adapter's own code: litgpt's ``CausalSelfAttention``, ``build_kv_cache``,
``build_rope_cache``, ``build_mask_cache`` and ``batched_index_select`` (the same in 0.5.11 to 0.5.13), the mask
rows ``GPT.forward`` selects (its code is the same in the three releases), ``reset_parameters`` for reset, and
prefills longer than the window fed in chunks of W tokens, as the published adapter does (or, in
``make_whole_prompt_adapter``, whole, declaring ``prefill_within_window``). The declarations are
the published ``make_adapter``'s without ``rope_interleaved``, the same on every release this module is run on
(0.5.13 included, where an entry compares it with an older release).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
from litgpt.config import Config

from adapters import litgpt_kvcache as published
from adapters.litgpt_kvcache import BlockRows, Cache, Session, Snapshot


class PreInterleaveAdapter(published.LitGptAdapter):
    """``adapters.litgpt_kvcache.LitGptAdapter`` for litgpt 0.5.11 / 0.5.12: half-split RoPE only."""

    name = "litgpt-kvcache-pre-0.5.13"
    capabilities = published.LitGptAdapter.capabilities - {"rope_interleaved"}
    mixed_precision: ClassVar[dict[str, str]] = {"rope": "float32"}

    def layer_config(self, heads: int, kv_heads: int, head_width: int, model_width: int, rope: Any,
                     window: int | None = None) -> Config:
        """The published ``layer_config`` without ``rope_interleave`` (a keyword 0.5.11 and 0.5.12 do not have)."""
        if rope.style == "interleaved":
            raise ValueError("litgpt before 0.5.13 has no interleaved RoPE (rope_interleaved is not declared)")
        config = Config(**published.config_fields(heads, kv_heads, head_width, model_width, rope, window))
        config.rope_n_elem = rope.rotary_width  # int(r / dh * dh) may round down
        return config

    def snapshot(self, cache: Cache) -> Snapshot:
        keys, values = cache.kv.k.numpy().copy(), cache.kv.v.numpy().copy()  # half-split: the model's order
        n = cache.length
        return Snapshot(n, keys[:, :, :n].copy(), values[:, :, :n].copy(), keys, values,
                        (cache.kv.k.data_ptr(), cache.kv.v.data_ptr()))

    def session_state(self, session: Session) -> tuple[BlockRows, ...]:
        rows = []
        for cache in session.caches:
            snapshot = self.snapshot(cache)
            ring = getattr(cache.kv, "is_sliding_window", False)  # 0.5.12 on; 0.5.11: a cache of every position
            window = cache.layer.attention.config.sliding_window_size if ring else None
            positions = np.arange(0 if window is None else max(0, session.length - window), session.length)
            slots = positions % cache.kv.k.shape[2]  # the ring (0.5.12 on); without one, slot = position
            rows.append(BlockRows(snapshot.physical_keys[0][:, slots].copy(),
                                  snapshot.physical_values[0][:, slots].copy(), positions))
        return tuple(rows)


def make_adapter() -> PreInterleaveAdapter:
    """litgpt 0.5.11 / 0.5.12 as is (RoPE table in float32, declared as ``mixed_precision``), half-split only."""
    return PreInterleaveAdapter()



class WholePromptAdapter(PreInterleaveAdapter):
    """As ``PreInterleaveAdapter``, with every prefill one litgpt forward of the whole prompt, as litgpt's own
    ``generate`` passes it, declaring ``prefill_within_window`` (the published ``make_whole_prompt_adapter``): the
    catalogue's adapter for litgpt-prefill-overwrites-ring. On 0.5.12 a prompt longer than the ring wraps inside one
    write; on 0.5.13 the same prefill is refused with litgpt's ValueError before any write, as declared."""

    name = "litgpt-kvcache-pre-0.5.13-whole-prompt"
    capabilities = PreInterleaveAdapter.capabilities | {"prefill_within_window"}
    whole_prompts = True


def make_whole_prompt_adapter() -> WholePromptAdapter:
    """litgpt 0.5.12 / 0.5.13 with prompts in one forward, a longer one than the window refusable, half-split only."""
    return WholePromptAdapter()
