"""Rows outside the documented ranges, on purpose, each with its own documented bound.

- **Overflowing rows**: finite entries up to the float64 maximum, built so that
  a projection, a visible score or the output overflows -- whatever the
  summation order -- and the step must be rejected (docs/spec.md §4.5, check 11).
- **Peaked rows**: one entry up to ``PEAK_MAX_INPUT`` in the first row of an
  empty cache, whose lone score is ``±PEAK_SCORE``: only a stable softmax survives.

Each function lists what the given weights allow (possibly nothing).
"""

from __future__ import annotations

import math

import numpy as np

from ..oracle import AttentionWeights

PEAK_SCORE = 750.0  # exp(750) overflows and exp(-750) underflows: only a stable softmax survives
PEAK_MAX_INPUT = 60.0
FLOAT64_MAX = float(np.finfo(np.float64).max)


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
    ``random_matrices`` draws half the time. At position 0 RoPE is the identity,
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
