"""Decoders, token sequences and block updates for the session, store and paged machines (docs/spec.md §9-10, §14).

Small untrained decoders (embedding ~ N(0, 1), projections ~ N(0, 1/D)):
logits stay below ~50, so 1e-12 absolute holds with the same margin as for
layers.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..oracle import ROPE_STYLES, AttentionWeights, DecoderConfig, DecoderWeights
from ..protocol.kinds import Capability
from .layers import rope_bases, seeded_arrays

MAX_VOCAB, MAX_BLOCKS, MAX_SEQUENCE = 24, 3, 12


@st.composite
def decoder_configs(draw: st.DrawFn, capabilities: frozenset[str], windowed: bool | None = None) -> DecoderConfig:
    """A decoder the implementation claims to support; ``windowed`` forces or forbids a sliding window."""
    conventions = [c for c in ("sinusoidal", "rope") if f"positions_{c}" in capabilities]
    if not conventions:
        raise ValueError("the adapter declares no position convention (positions_sinusoidal / positions_rope)")
    heads = draw(st.integers(1, 2), label="heads")
    grouped = Capability.GQA.value in capabilities and heads > 1 and draw(st.booleans(), label="grouped")
    window = None
    if windowed or (windowed is None and Capability.SLIDING_WINDOW.value in capabilities
                    and draw(st.booleans(), label="windowed")):
        window = draw(st.integers(1, 6), label="window")
    styles = [s for s in ROPE_STYLES if f"rope_{s}" in capabilities] or ["interleaved"]
    head_width = draw(st.sampled_from([2, 4, 6]), label="head_width")
    return DecoderConfig(
        vocab=draw(st.integers(2, MAX_VOCAB), label="vocab"), model_width=heads * head_width,
        blocks=draw(st.integers(1, MAX_BLOCKS), label="blocks"), heads=heads, kv_heads=1 if grouped else heads,
        positions=draw(st.sampled_from(conventions), label="positions"), window=window,
        rope_style=draw(st.sampled_from(styles), label="rope style"), rope_base=draw(rope_bases(), label="base"))


def token_lists(vocab: int, min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, vocab - 1), min_size=min_size, max_size=max_size)


def invalid_token_sequences(vocab: int) -> st.SearchStrategy[tuple[str, object]]:
    """(what is wrong, the sequence): each must be rejected with ``invalid_tokens``."""
    return st.sampled_from([
        ("an integral float", [1.0]), ("a bool", [True]), ("an id equal to vocab", [vocab]), ("a negative id", [-1]),
        ("nothing", []), ("a nested list", [[0]]), ("a float array", np.array([0.0, 1.0])),
        ("a 2-D array", np.zeros((1, 2), dtype=np.int64)), ("a string", "01"),
    ])


@st.composite
def block_update(draw: st.DrawFn, weights: DecoderWeights) -> tuple[int, AttentionWeights]:
    """One block and new values for its four parameters (an optimiser step on that layer)."""
    block = draw(st.integers(0, len(weights.blocks) - 1), label="block")
    old = weights.blocks[block]
    new = [w + draw(seeded_arrays(w.shape, 0.1)) for w in (old.wq, old.wk, old.wv, old.wo)]
    return block, AttentionWeights(*new, heads=old.heads, kv_heads=old.kv_heads)


@st.composite
def block_updates(draw: st.DrawFn, weights: DecoderWeights, block: int) -> AttentionWeights:
    """New values for block ``block``'s four parameters (an optimiser step on that layer)."""
    old = weights.blocks[block]
    wq, wk, wv, wo = (w + draw(seeded_arrays(w.shape, 0.1)) for w in (old.wq, old.wk, old.wv, old.wo))
    return AttentionWeights(wq, wk, wv, wo, heads=old.heads, kv_heads=old.kv_heads)


@st.composite
def paged_decoder_configs(draw: st.DrawFn, capabilities: frozenset[str]) -> DecoderConfig:
    """Small decoders without a window: a vocabulary of 2 to 5 ids makes prefixes meet often."""
    conventions = [c for c in ("sinusoidal", "rope") if f"positions_{c}" in capabilities]
    if not conventions:
        raise ValueError("the adapter declares no position convention (positions_sinusoidal / positions_rope)")
    heads = draw(st.integers(1, 2), label="heads")
    grouped = Capability.GQA.value in capabilities and heads > 1 and draw(st.booleans(), label="grouped")
    styles = [style for style in ROPE_STYLES if f"rope_{style}" in capabilities] or ["interleaved"]
    head_width = draw(st.sampled_from([2, 4]), label="head_width")
    return DecoderConfig(vocab=draw(st.integers(2, 5), label="vocab"), model_width=heads * head_width,
                         blocks=draw(st.integers(1, 2), label="blocks"), heads=heads, kv_heads=1 if grouped else heads,
                         positions=draw(st.sampled_from(conventions), label="positions"),
                         rope_style=draw(st.sampled_from(styles), label="rope style"),
                         rope_base=draw(rope_bases(), label="base"))
