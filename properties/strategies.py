"""Every Hypothesis strategy of the suite, with its documented bounds.

The 1e-12 absolute tolerance is a claim about these ranges: input rows in
``[-1, 1]``, weights in ``[-1, 1]``, model width <= 8, head width <= 8, at
most 4 heads, so scores stay below ~200 and outputs below ~100. Two rules
go outside them on purpose, each with its own documented bound:
overflowing rows (entries up to float64 max, which must be rejected) and
peaked rows (one entry up to ``PEAK_MAX_INPUT``, whose lone score is
``±PEAK_SCORE``, only ever the first row of a cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from oracle import ROPE_STYLES, AttentionWeights, DecoderConfig, DecoderWeights, RopeConfig

from .protocol import Capability

TOLERANCE = 1e-12  # absolute, float64 implementations, on the ranges above
INPUT_BOUND = 1.0
WEIGHT_BOUND = 1.0
MAX_BATCH, MAX_HEADS, MAX_HEAD_WIDTH, MAX_MODEL_WIDTH, MAX_CAPACITY = 3, 4, 8, 8, 8
PEAK_SCORE = 750.0  # exp(750) overflows and exp(-750) underflows: only a stable softmax survives
PEAK_MAX_INPUT = 60.0
FLOAT64_MAX = float(np.finfo(np.float64).max)


@dataclass(frozen=True, eq=False)
class LayerConfig:
    """One layer and the shape of the cache the machine builds for it."""

    weights: AttentionWeights
    rope: RopeConfig
    batch_size: int
    capacity: int

    @property
    def model_width(self) -> int:
        return self.weights.model_width


def requirements_of(value: object) -> set[str]:
    """The capabilities an implementation must declare to be offered ``value`` (a drawn configuration)."""
    if isinstance(value, LayerConfig):
        needs = {f"rope_{value.rope.style}"} | requirements_of(value.weights)
        if value.rope.rotary_width < value.weights.head_width:
            needs.add(Capability.PARTIAL_ROTARY.value)
        return needs
    if isinstance(value, AttentionWeights):
        return {Capability.GQA.value} if value.kv_heads < value.heads else set()
    if isinstance(value, DecoderConfig):
        needs = {f"positions_{value.positions}"}
        if value.positions == "rope":
            needs.add(f"rope_{value.rope_style}")
        if value.window is not None:
            needs.add(Capability.SLIDING_WINDOW.value)
        if value.kv_heads < value.heads:
            needs.add(Capability.GQA.value)
        return needs
    return set()


@cache  # strategies are immutable; building them anew in every rule is slow
def bounded_arrays(shape: tuple[int, ...], bound: float) -> st.SearchStrategy[np.ndarray]:
    """Element by element (Hypothesis shrinks each entry): for inputs, small and readable."""
    elements = st.floats(-bound, bound, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    return hnp.arrays(np.float64, shape, elements=elements)


@st.composite
def seeded_arrays(draw: st.DrawFn, shape: tuple[int, ...], bound: float) -> np.ndarray:
    """Uniform in ``[-bound, bound]`` from a drawn seed; half the time about half the entries are 0.

    For weights: a seed is one choice for Hypothesis to draw and shrink
    instead of hundreds, and the zeros give rank-deficient matrices too.
    """
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    sparse = draw(st.booleans(), label="sparse")
    rng = np.random.default_rng(seed)
    values = rng.uniform(-bound, bound, shape)
    if sparse:
        values[rng.random(shape) < 0.5] = 0.0
    return values


@st.composite
def attention_weights(draw: st.DrawFn, model_width: int, heads: int, kv_heads: int,
                      head_width: int) -> AttentionWeights:
    query, kv = heads * head_width, kv_heads * head_width
    return AttentionWeights(
        wq=draw(seeded_arrays((model_width, query), WEIGHT_BOUND), label="wq"),
        wk=draw(seeded_arrays((model_width, kv), WEIGHT_BOUND), label="wk"),
        wv=draw(seeded_arrays((model_width, kv), WEIGHT_BOUND), label="wv"),
        wo=draw(seeded_arrays((query, model_width), WEIGHT_BOUND), label="wo"),
        heads=heads, kv_heads=kv_heads)


def rope_bases() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([10000.0, 500000.0, 10.0, 2.0]),
                     st.floats(1.5, 1e6, allow_nan=False, allow_infinity=False))


@st.composite
def layer_configs(draw: st.DrawFn, capabilities: frozenset[str], *, style: str | None = None,
                  grouped: bool | None = None) -> LayerConfig:
    """A geometry, RoPE configuration, weights and cache shape the implementation claims to support.

    ``style`` fixes the RoPE pairing; ``grouped`` asks for GQA/MQA (``True``:
    fewer kv heads than heads) or for MHA (``False``).
    """
    if grouped:
        heads = draw(st.integers(2, MAX_HEADS), label="heads")
        kv_heads = draw(st.sampled_from([d for d in range(1, heads) if heads % d == 0]), label="kv_heads")
    elif grouped is None and Capability.GQA.value in capabilities:
        heads = draw(st.integers(1, MAX_HEADS), label="heads")
        kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]), label="kv_heads")
    else:
        heads = kv_heads = draw(st.integers(1, MAX_HEADS), label="heads")
    head_width = draw(st.sampled_from(range(2, MAX_HEAD_WIDTH + 1, 2)), label="head_width")
    model_width = draw(st.integers(1, MAX_MODEL_WIDTH), label="model_width")
    capacity = draw(st.integers(1, MAX_CAPACITY), label="capacity")
    rope = draw(rope_configs(capabilities, head_width, min_positions=capacity, style=style))
    weights = draw(attention_weights(model_width, heads, kv_heads, head_width))
    batch_size = draw(st.integers(1, MAX_BATCH), label="batch_size")
    return LayerConfig(weights=weights, rope=rope, batch_size=batch_size, capacity=capacity)


@st.composite
def rope_configs(draw: st.DrawFn, capabilities: frozenset[str], head_width: int,
                 min_positions: int, style: str | None = None) -> RopeConfig:
    styles = [s for s in ROPE_STYLES if f"rope_{s}" in capabilities and style in (None, s)]
    if not styles:
        raise ValueError("the adapter declares no RoPE style (rope_interleaved / rope_half_split)")
    if Capability.PARTIAL_ROTARY.value in capabilities:
        rotary_width = draw(st.sampled_from(range(head_width, 0, -2)), label="rotary_width")
    else:
        rotary_width = head_width
    max_positions = draw(st.one_of(st.integers(min_positions, min_positions + 8),
                                   st.integers(min_positions, 1 << 20)), label="max_positions")
    return RopeConfig(style=draw(st.sampled_from(styles), label="style"), base=draw(rope_bases(), label="base"),
                      rotary_width=rotary_width, max_positions=max_positions)


@cache
def rows(batch_size: int, model_width: int) -> st.SearchStrategy[np.ndarray]:
    """One valid new row ``[B, 1, D]`` in the documented input range."""
    return bounded_arrays((batch_size, 1, model_width), INPUT_BOUND)


@st.composite
def weight_updates(draw: st.DrawFn, weights: AttentionWeights) -> AttentionWeights:
    """New values for the same parameters: a small optimiser-like step, or the same values rewritten."""
    old = (weights.wq, weights.wk, weights.wv, weights.wo)
    if draw(st.booleans(), label="rewrite identical values"):
        new = [w.copy() for w in old]
    else:
        new = [np.clip(w + draw(seeded_arrays(w.shape, 0.25)), -WEIGHT_BOUND, WEIGHT_BOUND) for w in old]
    return AttentionWeights(*new, heads=weights.heads, kv_heads=weights.kv_heads)


def overflow_targets(weights: AttentionWeights) -> list[tuple[str, int, float]]:
    """Projection columns a finite row can overflow for certain: ``sum |W[:, c]| >= 1.5``.

    The row ``(1.5 / sum|W[:, c]|) * max * sign(W[:, c])`` makes every term of
    that column's dot product the same sign, so any summation order reaches
    1.5x the float64 maximum: the projection is inf, whatever the order.
    """
    targets = []
    for name, matrix in (("query", weights.wq), ("key", weights.wk), ("value", weights.wv)):
        for column, total in enumerate(np.abs(matrix).sum(axis=0)):
            if total >= 1.5:
                targets.append((name, column, float(total)))
    return targets


def overflowing_row(weights: AttentionWeights, name: str, column: int) -> np.ndarray:
    """The same-sign row ``[D]`` of ``overflow_targets``; finite, overflowing that column."""
    matrix = {"query": weights.wq, "key": weights.wk, "value": weights.wv}[name]
    total = float(np.abs(matrix[:, column]).sum())
    return (1.5 / total) * FLOAT64_MAX * np.sign(matrix[:, column])


def isolated_overflows(weights: AttentionWeights) -> list[tuple[str, int, np.ndarray]]:
    """Finite rows ``[D]`` that overflow one column of one projection and leave the others finite.

    Key against value, value against key, and the query against both (so that
    nothing to be stored overflows, only what is computed from it). With ``w``
    the target column and ``u`` its part orthogonal to every column of the
    other projections, the row ``1.25 * max * u / |u|^2`` has ``row . w =
    1.25 max`` (up to a relative ``D * eps * |w| / |u|``, kept tiny by requiring
    ``|u| >= |w| / 10``) and ``row . o = 0`` for each other column ``o`` (up to
    rounding far below the float64 maximum); every entry of the row stays below
    ``max / 1.5``. Needs ``D`` above the other projections' total width.
    """
    rows = []
    for name, matrix, other in (("key", weights.wk, weights.wv), ("value", weights.wv, weights.wk),
                                ("query", weights.wq, np.hstack([weights.wk, weights.wv]))):
        for column in range(matrix.shape[1]):
            w = matrix[:, column]
            u = w - other @ np.linalg.lstsq(other, w, rcond=None)[0]
            norm2 = float(u @ u)
            if norm2 == 0.0 or norm2 < float(w @ w) / 100 or 1.25 * 1.5 * np.abs(u).max() > norm2:
                continue  # no usable orthogonal part, or the row would not stay below max / 1.5
            rows.append((name, column, (1.25 / norm2) * FLOAT64_MAX * u))
    return rows


def peak_features(weights: AttentionWeights) -> list[tuple[int, float]]:
    """Features ``j`` whose one-hot row ``c * e_j`` gives a lone score of ``±PEAK_SCORE``.

    At position 0 RoPE is the identity, so head ``h``'s score is
    ``c**2 * (Wq[j, h] . Wk[j, h // G]) / sqrt(dh)``; ``c`` is chosen for the
    largest head and must stay within ``PEAK_MAX_INPUT``.
    """
    dh, group = weights.head_width, weights.group_size
    features = []
    for j in range(weights.model_width):
        query = weights.wq[j].reshape(weights.heads, dh)  # [H, dh]
        key = weights.wk[j].reshape(weights.kv_heads, dh)  # [KV, dh]
        strongest = max(abs(float(query[h] @ key[h // group])) for h in range(weights.heads)) / math.sqrt(dh)
        if strongest > 0.0:
            scale = math.sqrt(PEAK_SCORE / strongest)
            if scale <= PEAK_MAX_INPUT:
                features.append((j, scale))
    return features


# -- the decoder of SPEC §4-5 -------------------------------------------------------------------------
# Small untrained decoders (embedding ~ N(0, 1), projections ~ N(0, 1/D)): logits stay below ~50, so
# 1e-12 absolute holds with the same margin as above.

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
