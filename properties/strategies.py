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

from .layouts import ORDERS
from .protocol import Capability, ErrorKind, LayerLimits

TOLERANCE = 1e-12  # absolute, float64 implementations, on the ranges above
INPUT_BOUND = 1.0
WEIGHT_BOUND = 1.0
MAX_BATCH, MAX_HEADS, MAX_HEAD_WIDTH, MAX_MODEL_WIDTH, MAX_CAPACITY = 3, 4, 8, 8, 8
PEAK_SCORE = 750.0  # exp(750) overflows and exp(-750) underflows: only a stable softmax survives
PEAK_MAX_INPUT = 60.0
FLOAT64_MAX = float(np.finfo(np.float64).max)


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


@cache
def rows(batch_size: int, model_width: int) -> st.SearchStrategy[np.ndarray]:
    """One valid new row ``[B, 1, D]`` in the documented input range."""
    return bounded_arrays((batch_size, 1, model_width), INPUT_BOUND)


@cache
def chunks(batch_size: int, tokens: int, model_width: int) -> st.SearchStrategy[np.ndarray]:
    """``tokens`` valid new rows ``[B, T, D]`` at once, in the documented input range."""
    return bounded_arrays((batch_size, tokens, model_width), INPUT_BOUND)


MAX_CHUNK = 4


@dataclass(frozen=True)
class Argument:
    """An argument of a cache operation, and the error kind it must be rejected with (None: valid)."""

    value: object
    problem: str | None  # an ErrorKind value (a plain string: a trace records it as such), or None
    description: str

    @property
    def kind(self) -> ErrorKind | None:
        return None if self.problem is None else ErrorKind(self.problem)


@st.composite
def truncation_lengths(draw: st.DrawFn, length: int, window: int | None = None) -> Argument:
    """``truncate``'s n: mostly valid (0, the length, one below, around a window's edge, or anywhere between);
    else negative, above the length, or not an int (a float, a bool)."""
    if draw(st.integers(0, 3), label="invalid length?") > 0:
        edges = {0, length, length - 1} | ({length - window + d for d in (-1, 0, 1)} if window else set())
        n = draw(st.sampled_from(sorted(e for e in edges if 0 <= e <= length)) | st.integers(0, length), label="n")
        return Argument(n, None, f"n = {n}")
    value = draw(st.sampled_from([-1, -length - 1, length + 1, length + 3, float(length), True, str(length)]),
                 label="invalid n")
    return Argument(value, ErrorKind.INVALID_LENGTH.value, f"n = {value!r}")


@st.composite
def batch_indices(draw: st.DrawFn, batch_size: int) -> Argument:
    """``reorder``'s indices: B ints in [0, B) (repeats, drops, the identity), or one of: a negative index, an
    index of B or more, one index too many or too few, floats, bools."""
    valid = draw(st.lists(st.integers(0, batch_size - 1), min_size=batch_size, max_size=batch_size),
                 label="indices")
    if draw(st.integers(0, 3), label="invalid indices?") > 0:
        as_list = draw(st.booleans(), label="as a list")
        return Argument(valid if as_list else np.array(valid, dtype=np.int64), None, f"indices {valid}")
    problem = draw(st.sampled_from(["negative", "too large", "too many", "too few", "floats", "bools"]),
                   label="problem")
    where = draw(st.integers(0, batch_size - 1), label="where")
    value: object
    if problem in ("negative", "too large"):
        bad = list(valid)
        bad[where] = -1 - where if problem == "negative" else batch_size + where
        value = np.array(bad, dtype=np.int64)
    elif problem == "too many":
        value = np.array([*valid, 0], dtype=np.int64)
    elif problem == "too few":
        value = np.array(valid[:-1], dtype=np.int64)
    elif problem == "floats":
        value = np.array(valid, dtype=np.float64)
    else:
        value = np.array([i % 2 == 0 for i in range(batch_size)])
    return Argument(value, ErrorKind.INVALID_INDICES.value, f"indices {value.tolist()} of {value.dtype} ({problem})")


def layouts() -> st.SearchStrategy[tuple[str, bool]]:
    """(order, writeable) of a valid row: any layout of a float64 array of the right shape is valid."""
    return st.tuples(st.sampled_from(ORDERS), st.booleans())


# The documented order of a step's input checks (docs/spec.md): the first failing one decides the kind.
INPUT_CHECKS = (ErrorKind.DTYPE, ErrorKind.RANK, ErrorKind.TOKEN_COUNT, ErrorKind.BATCH_MISMATCH,
                ErrorKind.WIDTH_MISMATCH)
NOT_FLOAT64 = ("float32", "float16", "bool", "int8", "int64", "uint8", "complex64", "complex128", "object")
NOT_ARRAYS = ("list", "tuple", "python float", "numpy float64 scalar")


@dataclass(frozen=True, eq=False)
class MalformedRow:
    """An input a step must reject, with every problem it has, in the order they are checked."""

    value: object
    problems: tuple[str, ...]  # ErrorKind values (plain strings: a trace records them as such)
    description: str

    @property
    def kind(self) -> ErrorKind:
        """The kind the first failing check decides."""
        return ErrorKind(self.problems[0])


@st.composite
def malformed_rows(draw: st.DrawFn, batch_size: int, model_width: int, *, chunked: bool = False) -> MalformedRow:
    """A step's input with one or several of: not a float64 ndarray, not 3-D, not one token, another batch
    (0 included), another width (0 included); values in [-1, 1]. ``chunked``: a chunk's input, for which
    any token count >= 1 is valid and only 0 tokens is wrong."""
    kinds = draw(st.sets(st.sampled_from(INPUT_CHECKS), min_size=1), label="problems")
    if ErrorKind.RANK in kinds:  # batch, tokens and width are the axes of a 3-D input only
        kinds -= {ErrorKind.TOKEN_COUNT, ErrorKind.BATCH_MISMATCH, ErrorKind.WIDTH_MISMATCH}
        shape = draw(hnp.array_shapes(min_dims=0, max_dims=5, min_side=0, max_side=2).filter(lambda s: len(s) != 3),
                     label="shape")
    else:
        batch = batch_size if ErrorKind.BATCH_MISMATCH not in kinds else draw(
            st.sampled_from([b for b in range(MAX_BATCH + 2) if b != batch_size]), label="batch")
        if chunked:
            tokens = 0 if ErrorKind.TOKEN_COUNT in kinds else draw(st.integers(1, 3), label="tokens")
        else:
            tokens = 1 if ErrorKind.TOKEN_COUNT not in kinds else draw(st.sampled_from([0, 2, 3]), label="tokens")
        width = model_width if ErrorKind.WIDTH_MISMATCH not in kinds else draw(
            st.sampled_from([w for w in range(MAX_MODEL_WIDTH + 2) if w != model_width]), label="width")
        shape = (batch, tokens, width)
    values = draw(hnp.arrays(np.float64, shape, elements=st.floats(-1.0, 1.0, allow_subnormal=False),
                             fill=st.just(0.5)), label="values")  # a few drawn entries: values decide nothing
    value: object = values
    what = f"float64 array of shape {shape}"
    if ErrorKind.DTYPE in kinds:
        form = draw(st.sampled_from(NOT_FLOAT64 + NOT_ARRAYS), label="not float64")
        if form in ("list", "tuple") and values.ndim == 0:
            form = "python float"  # a 0-d array's tolist() is a scalar
        if form in ("list", "tuple"):
            value = values.tolist() if form == "list" else _tuples(values.tolist())
        elif form == "python float":
            value, kinds = float(values.ravel()[0]) if values.size else 0.5, {ErrorKind.DTYPE}
        elif form == "numpy float64 scalar":
            value, kinds = np.float64(values.ravel()[0] if values.size else 0.5), {ErrorKind.DTYPE}
        elif form.startswith(("int", "uint")):  # unsigned: of |values|, so that nothing wraps out of range
            value = np.asarray(np.rint(np.abs(values) if form.startswith("uint") else values), dtype=form)
        elif form == "bool":
            value = np.asarray(values > 0)
        else:
            value = np.asarray(values, dtype=form)
        what = f"{form} of shape {shape}" if form not in ("python float", "numpy float64 scalar") else form
    problems = tuple(kind.value for kind in INPUT_CHECKS if kind in kinds)
    return MalformedRow(value, problems, f"{what} ({', '.join(problems)})")


def _tuples(value: object) -> object:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


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
    ``max / 1.5``. Needs ``D`` above the other projections' total width. The
    scale is applied last: ``1.25 / |u|^2`` may exceed 1, and ``1.25 / |u|^2 * max``
    would overflow before ``u`` brings it down.

    The terms of ``row . o`` reach ``max / 1.5`` and only cancel in the sum: a
    sum taken in another order can pass through ``max`` on the way to 0 (numpy
    and the oracle did, for 2 rows in 600). Every partial sum lies between minus
    the negative terms' total and the positive terms' total, so a row is kept
    only if both stay below ``max / 1.5`` for every other column: those are then
    finite in any summation order. The target column overflows in any order:
    either a partial sum does, or the result is within ``D * eps`` of ``1.25 max``.
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
            scaled = (1.25 / norm2) * u  # the row in units of max: entries <= 1 / 1.5
            terms = scaled[:, None] * other  # [D, other columns], in units of max
            if max(np.clip(terms, 0.0, None).sum(axis=0).max(initial=0.0),
                   np.clip(-terms, 0.0, None).sum(axis=0).max(initial=0.0)) > 1 / 1.5:
                continue  # a partial sum of another projection could overflow in some order
            rows.append((name, column, scaled * FLOAT64_MAX))
    return rows


SCORE_OVERFLOW = 2.0  # a score-overflowing row's exact score, in float64 maxima (1.5 survives every rounding)
OUTPUT_OVERFLOW = 1.25  # an output-overflowing row's exact output, in float64 maxima


def score_overflows(weights: AttentionWeights) -> list[tuple[int, float, np.ndarray]]:
    """(head, sign, row): finite rows ``[D]`` with finite q, k and v whose score with their own key overflows.

    A row's own key is visible at every position, and RoPE turns its q and k
    by the same angles, so head ``h``'s score with it is ``x M x^T / sqrt(dh)``
    with ``M = Wq_h Wk_g^T`` (``[D, D]``, ``g = h // G``) at any position and
    rotary width, in any cache state. With ``u`` a unit eigenvector of
    ``(M + M^T) / 2`` for its largest eigenvalue (sign +1) or its smallest
    (sign -1) and ``lam = u M u^T``, the row ``t u`` with ``t = sqrt(max) *
    sqrt(2 sqrt(dh) / |lam|)`` has the exact score ``sign * 2 max``: +inf or -inf
    (scaled in this order: ``2 max / |lam|`` itself may overflow). A -inf among
    finite scores gets weight 0 and leaves the output finite: only a check of
    the scores rejects it. Kept only with margins that hold in any summation
    order, for any rotation formula and a ``1/sqrt(dh)`` applied to q, k or the score:

    - ``t <= max / 1.5``: the row's entries stay below ``max / 1.5``;
    - with ``A_c = sum_d |u_d W[d, c]|``, ``t A_c <= max / 4`` for every column of
      Wq, Wk and Wv: no partial sum of a projection passes ``max / 4``, no rotated
      entry (``|a cos - b sin| <= |a| + |b|``) ``max / 2``: q, k, v are finite;
    - ``|lam| >= 2**-20 * alpha * beta``, with ``alpha``, ``beta`` the sums of ``A_c``
      over head ``h``'s query columns and kv head ``g``'s key columns. Every
      rounding (the row, the projections, the rotation, the products, their sum)
      moves the score by a few dozen ``eps t**2 alpha beta / sqrt(dh)``, far below
      its ``max / 2`` margin: unless a partial sum already overflowed, the
      computed score is beyond ``1.5 max``. Non-finite either way.

    Only the named head's score is promised to overflow; other heads' may too.
    """
    dh, group = weights.head_width, weights.group_size
    columns = np.abs(np.hstack([weights.wq, weights.wk, weights.wv]))  # [D, every projection column]
    found = []
    for head in range(weights.heads):
        kv = head // group
        wq, wk = weights.wq[:, head * dh:(head + 1) * dh], weights.wk[:, kv * dh:(kv + 1) * dh]
        m = wq @ wk.T  # [D, D]
        _, vectors = np.linalg.eigh((m + m.T) / 2)  # eigenvalues ascending
        for sign, index in ((1.0, -1), (-1.0, 0)):
            u = vectors[:, index]
            lam = float(u @ m @ u)
            if sign * lam <= 0.0:
                continue
            alpha, beta = float((np.abs(u) @ np.abs(wq)).sum()), float((np.abs(u) @ np.abs(wk)).sum())
            if abs(lam) < 2.0 ** -20 * alpha * beta:
                continue  # too much cancellation: rounding could decide
            t = math.sqrt(FLOAT64_MAX) * math.sqrt(SCORE_OVERFLOW * math.sqrt(dh) / abs(lam))
            if t > FLOAT64_MAX / 1.5 or t * float((np.abs(u) @ columns).max()) > FLOAT64_MAX / 4:
                continue  # the row, q, k or v could come too close to max
            found.append((head, sign, t * u))
    return found


def output_overflows(weights: AttentionWeights) -> list[tuple[int, int, np.ndarray]]:
    """(feature, output column, row): rows ``[D]`` that, as the first row of a cache, overflow only the output.

    A row large enough to overflow the output (about ``max``) makes q and k
    about ``max`` too, and their product overflows -- unless every term of every
    score is an exact 0. So only one-hot rows ``s e_j`` qualify, of features
    ``j`` where in every head ``h`` and feature ``f`` ``Wq[j, h f] = 0`` or
    ``Wk[j, g f] = 0`` (``g = h // G``): weights with zeros, which
    ``seeded_arrays`` draws half the time. At position 0 RoPE is the identity,
    so the lone score is exactly 0, its weight exactly 1 and head ``h``'s
    attention output exactly ``s Wv[j, g]``; the output is ``s z`` with
    ``z = [Wv[j, g(h)]]_h @ Wo``. For the column ``o`` of the largest ``|z_o|``,
    ``s = 1.25 max / z_o`` (scaled in this order). Kept only if:

    - ``|z_o| >= 1.25`` (the row is finite) and ``|s W[j, c]| <= max / 1.5`` for
      every column of Wq, Wk and Wv: q, k and v are single products, finite;
    - ``|z_o| >= 2**-20 * sum_c |Wv[j, g(c)] Wo[c, o]|``: rounding the output's
      sum in any order moves it far less than its ``0.25 max`` margin, so
      either a partial sum overflows or the result is ``1.25 max``: inf.

    Only for an empty cache: at a later position RoPE mixes a query's zero
    feature with its non-zero partner, and the huge query's scores against
    stored keys overflow.
    """
    dh, group, width = weights.head_width, weights.group_size, weights.model_width
    read = np.arange(weights.heads) // group  # the kv head each query head reads
    query_used = weights.wq.reshape(width, weights.heads, dh) != 0  # [D, H, dh]
    key_used = weights.wk.reshape(width, weights.kv_heads, dh)[:, read] != 0  # [D, H, dh], as head h reads it
    mixed = weights.wv.reshape(width, weights.kv_heads, dh)[:, read].reshape(width, -1)  # [D, H*dh]
    projections = np.abs(np.hstack([weights.wq, weights.wk, weights.wv]))  # [D, every projection column]
    found = []
    for feature in range(width):
        if np.any(query_used[feature] & key_used[feature]):
            continue  # some score term is not an exact 0
        terms = mixed[feature][:, None] * weights.wo  # [H*dh, D]
        z = terms.sum(axis=0)  # [D]
        column = int(np.argmax(np.abs(z)))
        largest = abs(float(z[column]))
        if largest < OUTPUT_OVERFLOW or largest < 2.0 ** -20 * float(np.abs(terms[:, column]).sum()):
            continue
        scale = math.copysign(OUTPUT_OVERFLOW / largest, float(z[column])) * FLOAT64_MAX
        if abs(scale) * float(projections[feature].max()) > FLOAT64_MAX / 1.5:
            continue  # q, k or v would come too close to max
        row = np.zeros(width)
        row[feature] = scale
        found.append((feature, column, row))
    return found

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


# -- the decoder of spec §9-10 --------------------------------------------------------------------------
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
