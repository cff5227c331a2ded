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

from ..oracle import ROPE_STYLES, AttentionWeights, DecoderConfig, ModelConfig, RopeConfig
from ..protocol.declarations import LayerLimits
from ..protocol.kinds import Capability
from .models import model_requirements

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
    if isinstance(value, ModelConfig):
        return model_requirements(value)
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


def limits_problem(value: object, limits: LayerLimits) -> str | None:
    """Why a drawn layer configuration or weights lie outside ``limits`` (None: they do not, or are neither)."""
    if isinstance(value, AttentionWeights):
        return limits.geometry_problem(value.model_width, value.heads, value.head_width)
    if not isinstance(value, LayerConfig):
        return None
    w = value.weights
    return limits.geometry_problem(w.model_width, w.heads, w.head_width) or limits.cache_problem(
        value.batch_size, value.capacity, None if value.rope is None else value.rope.rotary_width)


@cache  # strategies are immutable; building them anew in every rule is slow
def bounded_arrays(shape: tuple[int, ...], bound: float) -> st.SearchStrategy[np.ndarray]:
    """Element by element (Hypothesis shrinks each entry): for inputs, small and readable."""
    elements = st.floats(-bound, bound, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    return hnp.arrays(np.float64, shape, elements=elements)


def random_matrices(seed: int, shapes: list[tuple[int, int]], bound: float) -> list[np.ndarray]:
    """Matrices uniform in ``[-bound, bound]`` from one seed; each, half the time, about half zeros (rank-deficient
    matrices, and the exact zeros some extreme rows need). A seed is one choice for Hypothesis to draw and shrink
    instead of hundreds."""
    rng = np.random.default_rng(seed)
    matrices = []
    for shape in shapes:
        values = rng.uniform(-bound, bound, shape)
        if rng.random() < 0.5:
            values[rng.random(shape) < 0.5] = 0.0
        matrices.append(values)
    return matrices


SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def attention_weights(draw: st.DrawFn, model_width: int, heads: int, kv_heads: int,
                      head_width: int) -> AttentionWeights:
    """The four projections, uniform in ``[-1, 1]`` (``random_matrices``)."""
    query, kv = heads * head_width, kv_heads * head_width
    shapes = [(model_width, query), (model_width, kv), (model_width, kv), (query, model_width)]
    return AttentionWeights(*random_matrices(draw(SEEDS, label="seed"), shapes, WEIGHT_BOUND), heads=heads,
                            kv_heads=kv_heads)


def rope_bases() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([10000.0, 500000.0, 10.0, 2.0]),
                     st.floats(1.5, 1e6, allow_nan=False, allow_infinity=False))


def position_styles(capabilities: frozenset[str]) -> list[str]:
    """The position conventions an implementation's layers support: RoPE pairings, and "none"."""
    styles = [style for style in ROPE_STYLES if f"rope_{style}" in capabilities]
    return styles + (["none"] if Capability.POSITIONLESS.value in capabilities else [])


FAMILIES = tuple((style, grouped) for style in (*ROPE_STYLES, "none") for grouped in (False, True))


def family_name(style: str, grouped: bool) -> str:
    """A layer family's name in reports and known-failures files: convention and attention kind, "half_split-gqa"."""
    return f"{style}-{'gqa' if grouped else 'mha'}"


def head_widths(limits: LayerLimits = NO_LIMITS) -> list[int]:
    """Head widths to draw: even (RoPE turns pairs), 2 to 8 -- or, where the limits ask for wider heads than
    that, only the narrowest they allow (the oracle's cost grows with the width; docs/spec.md §8.1)."""
    def fits(width: int) -> bool:
        return (width >= (limits.min_head_width or 0) and width <= (limits.max_head_width or width)
                and width % (limits.head_width_multiple or 1) == 0)

    widths = [w for w in range(2, MAX_HEAD_WIDTH + 1, 2) if fits(w)]
    if not widths:  # wider heads only: the narrowest the limits allow, if any
        top = limits.max_head_width or 4 * max(limits.min_head_width or 2, limits.head_width_multiple or 2)
        widths = [w for w in range(MAX_HEAD_WIDTH + 2, top + 1, 2) if fits(w)][:1]
    return widths


@cache  # (declarations are frozen: asked every time a machine is built and a layer drawn)
def geometries(capabilities: frozenset[str], limits: LayerLimits = NO_LIMITS, *, grouped: bool | None = None,
               rope: bool = True) -> list[tuple[int, int, int, tuple[int, ...]]]:
    """Every (heads, kv heads, head width, model widths) the adapter can build, simplest first: within its
    ``layer_limits``, grouped-query only if it declares ``gqa`` (``grouped`` True: only GQA/MQA, False: only
    MHA), and for a RoPE layer within its rotary-width limit unless it declares ``partial_rotary``."""
    gqa = Capability.GQA.value in capabilities
    partial = Capability.PARTIAL_ROTARY.value in capabilities
    found = []
    for head_width in head_widths(limits):
        if rope and not partial and limits.max_rotary_width is not None and head_width > limits.max_rotary_width:
            continue  # its one rotary width is the whole head
        for heads in range(1, min(MAX_HEADS, limits.max_heads or MAX_HEADS) + 1):
            if limits.model_width_is_heads_times_head_width:
                widths = [heads * head_width]
            else:
                widths = list(range(1, min(MAX_MODEL_WIDTH, limits.max_model_width or MAX_MODEL_WIDTH) + 1))
            widths = [w for w in widths if limits.geometry_problem(w, heads, head_width) is None]
            if not widths or (limits.model_width_is_heads_times_head_width and limits.max_model_width is None
                              and widths[0] > max(MAX_MODEL_WIDTH, head_width)):
                continue
            for kv_heads in sorted((d for d in range(1, heads + 1) if heads % d == 0), reverse=True):
                is_grouped = kv_heads < heads
                if (is_grouped and not gqa) or (grouped is not None and grouped != is_grouped):
                    continue
                found.append((heads, kv_heads, head_width, tuple(widths)))
    return found


@cache
def layer_families(capabilities: frozenset[str], limits: LayerLimits = NO_LIMITS) -> list[tuple[str, bool]]:
    """The (position convention, grouped) families the adapter can build at least one layer of."""
    return [(style, grouped) for style, grouped in FAMILIES if style in position_styles(capabilities)
            and geometries(capabilities, limits, grouped=grouped, rope=style != "none")]


@dataclass(frozen=True)
class Shape:
    """What a layer and its cache look like to a framework that compiles per shape: every array dimension."""

    heads: int
    kv_heads: int
    head_width: int
    model_width: int
    batch_size: int
    capacity: int
    rotary_width: int  # features rotated, for a RoPE layer (the whole head unless partial_rotary is declared)
    max_positions: int  # a RoPE table's length


@cache
def few_shapes(capabilities: frozenset[str], limits: LayerLimits, grouped: bool) -> tuple[Shape, ...]:
    """The at most ``limits.max_shapes`` shapes of one attention kind (MHA, or GQA/MQA if ``grouped``) that layers
    are drawn from all run long (docs/spec.md §7), simplest first: geometries spread over ``geometries``, the
    batch cycling through its range, the capacity the largest allowed (so every caller's minimum fits), the rotary
    width the widest, or every other shape two narrower where partial rotary is declared. The same for every RoPE
    convention and for positionless layers (chosen among what a RoPE layer can take, where the adapter has one)."""
    rope = any(f"rope_{style}" in capabilities for style in ROPE_STYLES)
    found = geometries(capabilities, limits, grouped=grouped, rope=rope) or geometries(
        capabilities, limits, grouped=grouped, rope=False)
    count = limits.max_shapes or 1
    picks = sorted({round(i * (len(found) - 1) / max(1, count - 1)) for i in range(count)}) if found else []
    capacity = min(MAX_CAPACITY, limits.max_capacity or MAX_CAPACITY)
    batches = min(MAX_BATCH, limits.max_batch or MAX_BATCH)
    partial = Capability.PARTIAL_ROTARY.value in capabilities
    shapes = []
    for number, index in enumerate(picks):
        heads, kv_heads, head_width, widths = found[index]
        widest = min(head_width, limits.max_rotary_width or head_width) if partial else head_width
        widest -= widest % 2
        rotary = widest - 2 if partial and number % 2 and widest > 2 else widest
        shapes.append(Shape(heads, kv_heads, head_width, widths[number % len(widths)], 1 + number % batches,
                            capacity, rotary, capacity + 8 * (number % 2)))
    return tuple(shapes)


@st.composite
def layer_configs(draw: st.DrawFn, capabilities: frozenset[str], *, style: str | None = None,
                  grouped: bool | None = None, limits: LayerLimits = NO_LIMITS, min_capacity: int = 1,
                  families: tuple[tuple[str, bool], ...] | None = None) -> LayerConfig:
    """A geometry, position convention, weights and cache shape the implementation claims to support.

    ``style`` fixes the convention (a RoPE pairing, or ``"none"``: a positionless layer); ``grouped`` asks
    for GQA/MQA (True) or MHA (False); ``families`` draws the (style, grouped) pair from those given, each
    alike. Only geometries within ``limits`` are drawn (``geometries``); a configuration the adapter cannot
    build is never drawn -- the properties' gate skips what has none.
    """
    if families is not None:
        style, grouped = draw(st.sampled_from(families), label="family")
    styles = [c for c in position_styles(capabilities) if style in (None, c)]
    if not styles:
        raise ValueError(f"the adapter declares no position convention{f' {style!r}' if style else ''} "
                         "(rope_interleaved, rope_half_split or positionless)")
    chosen = draw(st.sampled_from(styles), label="positions")
    if limits.max_shapes is not None:
        return draw(_within_few_shapes(capabilities, limits, chosen, grouped))
    shapes = geometries(capabilities, limits, grouped=grouped, rope=chosen != "none")
    if not shapes:
        raise ValueError(f"layer_limits leave no geometry to draw: {limits.described()}")
    heads, kv_heads, head_width, widths = draw(st.sampled_from(shapes), label="geometry")
    model_width = draw(st.sampled_from(widths), label="model_width")
    max_capacity = min(MAX_CAPACITY, limits.max_capacity or MAX_CAPACITY)
    capacity = draw(st.integers(min(min_capacity, max_capacity), max_capacity), label="capacity")
    rope = None if chosen == "none" else draw(rope_configs(capabilities, head_width, min_positions=capacity,
                                                           style=chosen, limits=limits))
    weights = draw(attention_weights(model_width, heads, kv_heads, head_width))
    batch_size = draw(st.integers(1, min(MAX_BATCH, limits.max_batch or MAX_BATCH)), label="batch_size")
    return LayerConfig(weights=weights, rope=rope, batch_size=batch_size, capacity=capacity)


@st.composite
def _within_few_shapes(draw: st.DrawFn, capabilities: frozenset[str], limits: LayerLimits, style: str,
                       grouped: bool | None) -> LayerConfig:
    """A layer and cache of one of ``few_shapes``: only values vary (weights, RoPE base), never an array's shape."""
    kinds = [grouped] if grouped is not None else [False, True]
    shapes = [shape for kind in kinds for shape in few_shapes(capabilities, limits, kind)]
    if not shapes:
        raise ValueError(f"layer_limits leave no geometry to draw: {limits.described()}")
    shape = draw(st.sampled_from(shapes), label="shape")
    rope = None if style == "none" else draw(rope_configs(
        capabilities, shape.head_width, min_positions=shape.max_positions, style=style, limits=limits,
        rotary_width=shape.rotary_width, max_positions=shape.max_positions))
    weights = draw(attention_weights(shape.model_width, shape.heads, shape.kv_heads, shape.head_width))
    return LayerConfig(weights=weights, rope=rope, batch_size=shape.batch_size, capacity=shape.capacity)


@st.composite
def rope_configs(draw: st.DrawFn, capabilities: frozenset[str], head_width: int,
                 min_positions: int, style: str | None = None, limits: LayerLimits = NO_LIMITS,
                 rotary_width: int | None = None, max_positions: int | None = None) -> RopeConfig:
    """A RoPE configuration for heads of ``head_width``: ``rotary_width`` and ``max_positions`` drawn unless given
    (a shape fixed by ``few_shapes``)."""
    styles = [s for s in ROPE_STYLES if f"rope_{s}" in capabilities and style in (None, s)]
    if not styles:
        raise ValueError("the adapter declares no RoPE style (rope_interleaved / rope_half_split)")
    if rotary_width is None and Capability.PARTIAL_ROTARY.value in capabilities:
        widest = min(head_width, limits.max_rotary_width or head_width)
        rotary_width = draw(st.sampled_from(range(widest - widest % 2, 0, -2)), label="rotary_width")
    elif rotary_width is None:
        rotary_width = head_width
    if max_positions is None:
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
        steps = random_matrices(draw(SEEDS, label="seed"), [w.shape for w in old], 0.25)
        new = [np.clip(w + step, -WEIGHT_BOUND, WEIGHT_BOUND) for w, step in zip(old, steps)]
    return AttentionWeights(*new, heads=weights.heads, kv_heads=weights.kv_heads)
