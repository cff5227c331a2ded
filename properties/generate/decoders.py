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
from .layers import SEEDS, random_matrices, rope_bases

MAX_VOCAB, MAX_BLOCKS, MAX_SEQUENCE, MAX_DECODER_WINDOW = 24, 3, 12, 6


def position_conventions(capabilities: frozenset[str]) -> tuple[list[str], list[str]]:
    """The decoders' position conventions an adapter declares, and the RoPE pairings a RoPE decoder may use: RoPE
    positions only with a declared pairing (``generate.needs.DECODER_POSITIONS`` skips what has none)."""
    styles = [style for style in ROPE_STYLES if f"rope_{style}" in capabilities]
    conventions = [c for c in ("sinusoidal", "rope") if f"positions_{c}" in capabilities and (c != "rope" or styles)]
    if not conventions:
        raise ValueError("the adapter declares no decoder position convention (positions_sinusoidal, or "
                         "positions_rope with a RoPE pairing)")
    return conventions, styles or ["interleaved"]  # (a sinusoidal decoder's unused pairing)


@st.composite
def decoder_configs(draw: st.DrawFn, capabilities: frozenset[str], windowed: bool | None = None) -> DecoderConfig:
    """A decoder the implementation claims to support; ``windowed`` forces or forbids a sliding window."""
    conventions, styles = position_conventions(capabilities)
    heads = draw(st.integers(1, 2), label="heads")
    grouped = Capability.GQA.value in capabilities and heads > 1 and draw(st.booleans(), label="grouped")
    window = None
    if windowed or (windowed is None and Capability.SLIDING_WINDOW.value in capabilities
                    and draw(st.booleans(), label="windowed")):
        window = draw(st.integers(1, MAX_DECODER_WINDOW), label="window")
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
    return block, draw(block_updates(weights, block))


@st.composite
def block_updates(draw: st.DrawFn, weights: DecoderWeights, block: int) -> AttentionWeights:
    """New values for block ``block``'s four parameters (an optimiser step on that layer): each entry moved by up
    to 0.1 (``random_matrices``)."""
    old = weights.blocks[block]
    matrices = (old.wq, old.wk, old.wv, old.wo)
    steps = random_matrices(draw(SEEDS, label="seed"), [m.shape for m in matrices], 0.1)
    return AttentionWeights(*(m + step for m, step in zip(matrices, steps)), heads=old.heads, kv_heads=old.kv_heads)


@st.composite
def paged_decoder_configs(draw: st.DrawFn, capabilities: frozenset[str]) -> DecoderConfig:
    """Small decoders without a window: a vocabulary of 2 to 5 ids makes prefixes meet often."""
    conventions, styles = position_conventions(capabilities)
    heads = draw(st.integers(1, 2), label="heads")
    grouped = Capability.GQA.value in capabilities and heads > 1 and draw(st.booleans(), label="grouped")
    head_width = draw(st.sampled_from([2, 4]), label="head_width")
    return DecoderConfig(vocab=draw(st.integers(2, 5), label="vocab"), model_width=heads * head_width,
                         blocks=draw(st.integers(1, 2), label="blocks"), heads=heads, kv_heads=1 if grouped else heads,
                         positions=draw(st.sampled_from(conventions), label="positions"),
                         rope_style=draw(st.sampled_from(styles), label="rope style"),
                         rope_base=draw(rope_bases(), label="base"))
