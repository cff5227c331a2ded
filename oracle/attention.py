"""Full-prefix causal attention with RoPE, written to be obviously correct.

Nothing is cached and nothing is vectorised: every position is recomputed
from the whole prefix with explicit loops over Python scalars, so the same
code runs in float64 and in mpmath (see ``numbers.py``). It returns every
position's output together with the rotated keys and unrotated values, so a
cache's contents can be checked as well as its outputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import AttentionWeights, OracleInputError, RopeConfig
from .numbers import FLOAT64, NumberSystem

Vector = list[Any]  # a list of scalars of one number system
Storage = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]  # held keys, values -> as stored


@dataclass(frozen=True, eq=False)
class AttentionTrace:
    """What full-prefix attention computed, rounded to float64.

    ``outputs [B, T, D]``; ``keys`` (rotated) and ``values`` (unrotated)
    ``[B, KV, T, dh]`` -- exactly what a cache holding ``T`` rows must store.
    """

    outputs: np.ndarray
    keys: np.ndarray
    values: np.ndarray


def rope_rotate(vector: Vector, position: int, rope: RopeConfig, numbers: NumberSystem) -> Vector:
    """Rotate one head vector as it sits at absolute ``position``.

    The cos/sin table is computed in ``numbers.component("rope")`` (a mixed
    precision's table dtype), then converted to ``numbers`` and applied there.
    With a ``"rotation"`` component the rotated features are converted to its
    dtype, rotated there (table included) and converted back; the features
    past the rotary width keep their values.
    """
    if not 0 <= position < rope.max_positions:
        raise OracleInputError(f"position {position} outside RoPE range [0, {rope.max_positions})")
    r = rope.rotary_width
    if r > len(vector):
        raise OracleInputError(f"rotary width {r} exceeds head width {len(vector)}")
    rotation = numbers.component("rotation")
    if rotation is not numbers:
        inner = _convert(rope_rotate(_convert(vector[:r], numbers, rotation), position, rope, rotation), rotation,
                         numbers)
        return [*inner, *vector[r:]]
    table = numbers.component("rope")
    rotated = list(vector)
    for i in range(r // 2):
        inverse_frequency = table.number(rope.base) ** (table.number(-2 * i) / r)
        theta = position * inverse_frequency
        cos, sin = table.cos(theta), table.sin(theta)
        if table is not numbers:
            cos, sin = _convert([cos, sin], table, numbers)
        a_index, b_index = rope.pair(i)
        a, b = vector[a_index], vector[b_index]
        rotated[a_index] = a * cos - b * sin
        rotated[b_index] = a * sin + b * cos
    return rotated


def project(row: Vector, matrix: list[Vector]) -> Vector:
    """Row vector times matrix: ``y[c] = sum_d row[d] * matrix[d][c]``, summed in the order of ``d``."""
    return [_dot(row, column) for column in zip(*matrix)]


def softmax(scores: Vector, numbers: NumberSystem) -> Vector:
    """Numerically stable softmax: subtract the row maximum first.

    With a mixed precision's softmax dtype: the scores rounded to it, the
    softmax computed there, the probabilities converted back to ``numbers``.
    """
    inner = numbers.component("softmax")
    if inner is not numbers:
        return _convert(softmax(_convert(scores, numbers, inner), inner), inner, numbers)
    if numbers.softmax is not None:
        return numbers.softmax(list(scores))
    peak = max(scores)
    exps = [numbers.exp(score - peak) for score in scores]
    total = sum(exps[1:], start=exps[0])
    if numbers.within is not None:  # a probability: within [0, 1] however uncertain the scores
        return [numbers.within(e / total, 1.0) for e in exps]
    return [e / total for e in exps]


@dataclass(frozen=True, eq=False)
class ExactAttention:
    """One sequence's attention in the oracle's own scalars (no rounding to float64).

    ``outputs [T][D]``; ``keys`` (rotated) and ``values`` ``[KV][T][dh]``.
    """

    outputs: list[Vector]
    keys: list[list[Vector]]
    values: list[list[Vector]]


def causal_attention(rows: list[Vector], weights: AttentionWeights, rope: RopeConfig, *,
                     window: int | None = None, sinks: int = 0, numbers: NumberSystem = FLOAT64) -> ExactAttention:
    """Causal attention over one sequence ``rows [T][D]`` of ``numbers`` scalars.

    Position ``i`` attends to keys ``0..i`` (with a sliding ``window`` W, to
    ``i-W+1..i``, and with ``sinks`` S besides to the first S keys,
    ``0..min(S, i+1)-1``: StreamingLLM's attention sinks). Scores are
    ``q . k / sqrt(dh)`` with ``q`` and ``k`` rotated at their own absolute
    positions.
    """
    if window is not None and window < 1:
        raise OracleInputError(f"window must be >= 1, got {window}")
    if sinks < 0 or (sinks and window is None):
        raise OracleInputError(f"sinks must be >= 0, and only beside a window; got {sinks} (window {window})")
    kv_heads, dh = weights.kv_heads, weights.head_width
    wq, wk, wv, wo = (_matrix(w, numbers) for w in (weights.wq, weights.wk, weights.wv, weights.wo))
    tokens = len(rows)
    q_rows = [project(row, wq) for row in rows]  # [T][H*dh]
    k_rows = [project(row, wk) for row in rows]  # [T][KV*dh]
    v_rows = [project(row, wv) for row in rows]  # [T][KV*dh]
    # rotated keys and plain values per kv head: [KV][T][dh]
    keys = [[rope_rotate(_head(k_rows[t], g, dh), t, rope, numbers) for t in range(tokens)]
            for g in range(kv_heads)]
    values = [[_head(v_rows[t], g, dh) for t in range(tokens)] for g in range(kv_heads)]
    outputs = [attend_position(i, q_rows[i], keys, values, weights, rope, window, numbers, wo, sinks)
               for i in range(tokens)]
    return ExactAttention(outputs=outputs, keys=keys, values=values)


def attend_position(i: int, q_row: Vector, keys: list[list[Vector]], values: list[list[Vector]],
                    weights: AttentionWeights, rope: RopeConfig, window: int | None, numbers: NumberSystem,
                    wo: list[Vector], sinks: int = 0) -> Vector:
    """The output ``[D]`` at position ``i`` of the query row ``q_row [H*dh]`` (unrotated) over ``keys``
    (rotated) and ``values`` ``[KV][>i][dh]``."""
    heads, dh = weights.heads, weights.head_width
    scale = numbers.sqrt(numbers.number(float(dh)))
    first = 0 if window is None else max(0, i - window + 1)
    seen = [*range(min(sinks, first)), *range(first, i + 1)]  # the sinks before the window, then the window
    merged: Vector = []  # [H*dh], head h owns features [h*dh, (h+1)*dh)
    for h in range(heads):
        g = h // weights.group_size  # the kv head this query head reads
        q = rope_rotate(_head(q_row, h, dh), i, rope, numbers)
        scores = [_dot(q, keys[g][j]) / scale for j in seen]
        attention = softmax(scores, numbers)
        for f in range(dh):
            merged.append(sum((a * values[g][j][f] for a, j in zip(attention, seen)), start=attention[0] * 0))
    return project(merged, wo)


def full_prefix_attention(
    x: np.ndarray,
    weights: AttentionWeights,
    rope: RopeConfig,
    *,
    window: int | None = None,
    sinks: int = 0,
    numbers: NumberSystem = FLOAT64,
    storage: Storage | None = None,
) -> AttentionTrace:
    """``causal_attention`` for every sequence of a float64 batch ``x [B, T, D]``, rounded to float64.

    ``storage``: what a low-precision cache stores of the held keys and values ``[B, KV, t, dh]`` (float64
    arrays in, float64 arrays out, ``oracle.storage``); each position's output is then computed over what
    is stored of the rows held at that point. ``keys`` and ``values`` are returned as stored.
    """
    if not isinstance(x, np.ndarray) or x.dtype != np.float64 or x.ndim != 3:
        raise OracleInputError("x must be a float64 array of shape [B, T, D]")
    if x.shape[2] != weights.model_width:
        raise OracleInputError(f"x width {x.shape[2]} != model width {weights.model_width}")
    batch, tokens, _ = x.shape
    outputs = np.empty(x.shape)
    keys = np.empty((batch, weights.kv_heads, tokens, weights.head_width))
    values = np.empty_like(keys)
    for b in range(batch):
        rows = [[numbers.number(float(v)) for v in x[b, t]] for t in range(tokens)]
        exact = causal_attention(rows, weights, rope, window=window, sinks=sinks, numbers=numbers)
        outputs[b] = _rounded(exact.outputs, numbers)
        keys[b] = [_rounded(head, numbers) for head in exact.keys]
        values[b] = [_rounded(head, numbers) for head in exact.values]
    if storage is None:
        return AttentionTrace(outputs=outputs, keys=keys, values=values)
    wq, wo = _matrix(weights.wq, numbers), _matrix(weights.wo, numbers)
    for i in range(tokens):  # position i reads what is stored of rows 0..i once row i is in
        stored_keys, stored_values = storage(keys[:, :, :i + 1], values[:, :, :i + 1])
        for b in range(batch):
            q_row = project([numbers.number(float(v)) for v in x[b, i]], wq)
            seen_keys = [[[numbers.number(float(v)) for v in row] for row in head] for head in stored_keys[b]]
            seen_values = [[[numbers.number(float(v)) for v in row] for row in head] for head in stored_values[b]]
            outputs[b, i] = [numbers.to_float(v) for v in attend_position(
                i, q_row, seen_keys, seen_values, weights, rope, window, numbers, wo, sinks)]
    stored_keys, stored_values = storage(keys, values)
    return AttentionTrace(outputs=outputs, keys=stored_keys, values=stored_values)


def _convert(values: Vector, source: NumberSystem, target: NumberSystem) -> Vector:
    """Scalars of ``source`` as scalars of ``target``, through float64."""
    return [target.number(source.to_float(v)) for v in values]


def _rounded(rows: list[Vector], numbers: NumberSystem) -> list[list[float]]:
    return [[numbers.to_float(v) for v in row] for row in rows]


def _matrix(array: np.ndarray, numbers: NumberSystem) -> list[Vector]:
    return [[numbers.number(float(v)) for v in row] for row in array]


def _head(row: Sequence[Any], head: int, dh: int) -> Vector:
    return list(row[head * dh:(head + 1) * dh])


def _dot(a: Sequence[Any], b: Sequence[Any]) -> Any:
    """``sum_f a[f] * b[f]``, from a zero of the same number system, in the order of ``f``."""
    return sum(map(operator.mul, a, b), start=a[0] * 0)
