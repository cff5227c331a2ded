"""Layers and their caches, drawn within the documented ranges (docs/spec.md §8.1).

The 1e-12 absolute tolerance is a claim about these ranges: input rows in
``[-1, 1]``, weights in ``[-1, 1]``, model width <= 8, head width <= 8, at
most 4 heads, so scores stay below ~200 and outputs below ~100. Only
geometries, position conventions and RoPE configurations the adapter
declares are drawn (``layer_configs``), within its ``layer_limits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..oracle import ROPE_STYLES, AttentionWeights, DecoderConfig, RopeConfig
from ..protocol.declarations import LayerLimits
from ..protocol.kinds import Capability

TOLERANCE = 1e-12  # absolute, float64 implementations, on the ranges above
INPUT_BOUND = 1.0
WEIGHT_BOUND = 1.0
MAX_BATCH, MAX_HEADS, MAX_HEAD_WIDTH, MAX_MODEL_WIDTH, MAX_CAPACITY = 3, 4, 8, 8, 8


NO_LIMITS = LayerLimits()
NO_ROPE_POSITIONS = 1 << 62  # a positionless layer's oracle: rotary width 0, positions practically unbounded


@dataclass(frozen=True, eq=False)
class LayerConfig:
    """One layer and the shape of the cache the machine builds for it (``rope`` None: positionless)."""

    weights: AttentionWeights
    rope: RopeConfig | None
    batch_size: int
    capacity: int

    @property
    def model_width(self) -> int:
        return self.weights.model_width

    @property
    def oracle_rope(self) -> RopeConfig:
        """What the oracle computes with: a positionless layer is RoPE of rotary width 0."""
        return self.rope if self.rope is not None else RopeConfig("interleaved", 10000.0, 0, NO_ROPE_POSITIONS)


def requirements_of(value: object) -> set[str]:
    """The capabilities an implementation must declare to be offered ``value`` (a drawn configuration)."""
    if isinstance(value, LayerConfig):
        if value.rope is None:
            return {Capability.POSITIONLESS.value} | requirements_of(value.weights)
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


def position_styles(capabilities: frozenset[str]) -> list[str]:
    """The position conventions an implementation's layers support: RoPE pairings, and "none"."""
    styles = [style for style in ROPE_STYLES if f"rope_{style}" in capabilities]
    return styles + (["none"] if Capability.POSITIONLESS.value in capabilities else [])


@st.composite
def layer_configs(draw: st.DrawFn, capabilities: frozenset[str], *, style: str | None = None,
                  grouped: bool | None = None, limits: LayerLimits = NO_LIMITS, min_capacity: int = 1) -> LayerConfig:
    """A geometry, position convention, weights and cache shape the implementation claims to support.

    ``style`` fixes the convention (a RoPE pairing, or ``"none"``: a positionless
    layer); ``grouped`` asks for GQA/MQA (``True``: fewer kv heads than heads) or
    for MHA (``False``). Only geometries within ``limits`` are drawn.
    """
    styles = [c for c in position_styles(capabilities) if style in (None, c)]
    if not styles:
        raise ValueError(f"the adapter declares no position convention{f' {style!r}' if style else ''} "
                         "(rope_interleaved, rope_half_split or positionless)")
    max_heads = min(MAX_HEADS, limits.max_heads or MAX_HEADS)
    head_widths = [w for w in range(2, min(MAX_HEAD_WIDTH, limits.max_head_width or MAX_HEAD_WIDTH) + 1, 2)]
    max_width = min(MAX_MODEL_WIDTH, limits.max_model_width or MAX_MODEL_WIDTH)
    if limits.model_width_is_heads_times_head_width:  # only (H, dh) with H * dh within the width limit
        pairs = [(h, w) for h in range(1, max_heads + 1) for w in head_widths if h * w <= max_width]
        if grouped:
            pairs = [(h, w) for h, w in pairs if h >= 2]
        if not pairs:
            raise ValueError(f"layer_limits leave no geometry to draw: {limits.described()}")
        heads, head_width = draw(st.sampled_from(pairs), label="heads, head_width")
    else:
        if grouped and max_heads < 2:
            raise ValueError(f"layer_limits leave no grouped geometry to draw: {limits.described()}")
        heads = draw(st.integers(2 if grouped else 1, max_heads), label="heads")
        head_width = draw(st.sampled_from(head_widths), label="head_width")
    if grouped:
        kv_heads = draw(st.sampled_from([d for d in range(1, heads) if heads % d == 0]), label="kv_heads")
    elif grouped is None and Capability.GQA.value in capabilities:
        kv_heads = draw(st.sampled_from([d for d in range(1, heads + 1) if heads % d == 0]), label="kv_heads")
    else:
        kv_heads = heads
    if limits.model_width_is_heads_times_head_width:
        model_width = heads * head_width
    else:
        model_width = draw(st.integers(1, max_width), label="model_width")
    max_capacity = min(MAX_CAPACITY, limits.max_capacity or MAX_CAPACITY)
    capacity = draw(st.integers(min(min_capacity, max_capacity), max_capacity), label="capacity")
    chosen = draw(st.sampled_from(styles), label="positions")
    rope = None if chosen == "none" else draw(rope_configs(capabilities, head_width, min_positions=capacity,
                                                           style=chosen))
    weights = draw(attention_weights(model_width, heads, kv_heads, head_width))
    batch_size = draw(st.integers(1, min(MAX_BATCH, limits.max_batch or MAX_BATCH)), label="batch_size")
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


@st.composite
def weight_updates(draw: st.DrawFn, weights: AttentionWeights) -> AttentionWeights:
    """New values for the same parameters: a small optimiser-like step, or the same values rewritten."""
    old = (weights.wq, weights.wk, weights.wv, weights.wo)
    if draw(st.booleans(), label="rewrite identical values"):
        new = [w.copy() for w in old]
    else:
        new = [np.clip(w + draw(seeded_arrays(w.shape, 0.25)), -WEIGHT_BOUND, WEIGHT_BOUND) for w in old]
    return AttentionWeights(*new, heads=weights.heads, kv_heads=weights.kv_heads)
