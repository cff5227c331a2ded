"""How far any evaluation in a low-precision dtype may be from the exact value: an estimate from every
step's condition, not one evaluation that may have been lucky.

The naive baseline (``numbers.numpy_precision``) is one evaluation: one summation order, one rounding of each
operation. Another correct implementation sums in another order, blocks, fuses or rescales, and its rounding
errors land elsewhere: a naive float32 evaluation that happened to err by 1.4e-7 on a logit that other
correct float32 models missed by 2.5e-6 failed them (docs/spec.md §8.3). ``rounding_errors(dtype)`` runs the
oracle's own code over scalars that carry, beside their value, the size of the error any evaluation of them
in ``dtype`` may have -- running error analysis (Higham, *Accuracy and Stability of Numerical Algorithms*,
ch. 3) with rounding errors combined as independent random quantities (Higham and Mary's probabilistic
analysis, SIAM J. Sci. Comput. 41(5), 2019), so that it grows like sqrt(n), as real errors do:

- an input is cast to the dtype: its error is that cast's, exactly (every implementation casts alike);
- ``a * b``, ``a / b``, ``exp``, ``sqrt``, ``cos``, ... : the operands' errors through the operation's
  derivative, plus one rounding of the result -- ``u |result|``, ``u`` the dtype's unit roundoff, or
  ``FUNCTION_ULPS`` ulps for a library function -- plus half the smallest subnormal (underflow);
- a sum of ``n`` terms is charged ``sqrt(n - 1) u sum|term|`` when its value is used: every partial sum of
  any order, tree or blocking is at most ``sum|term|``, so no order is favoured (a fused multiply-add that
  never rounds a product only makes an implementation's error smaller).

``to_float`` reads the *error*, not the value: the oracle's readout of every compared array (logits,
outputs, cached rows) is then the array of estimated errors, where the naive baseline's readout is its
values. Only the pure dtype computation runs here: no mixed-precision components, no storage formats (their
conversions go through ``to_float``). Overflow of the dtype makes the error infinite (nothing is judged
there, as a naive evaluation that overflowed judged nothing). ``python bench/run.py --only margins``
measures it against correct float32 implementations of other orders, blockings and fusions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .numbers import LOW_PRECISIONS, NumberSystem
from .storage import BLOCK, FLOAT16_UNIT, StorageFormat

FUNCTION_ULPS = 4.0  # exp, cos, sin, tanh, sqrt, pow: vectorised float32 library kernels err by up to ~4 ulps
_UNIT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "float64": 2.0**-53}  # half an ulp at 1
_TINY = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134, "float64": 2.0**-1075}  # half the
# smallest subnormal
_LARGEST = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0, "bfloat16": 3.3895313892515355e38,
            "float64": float(np.finfo(np.float64).max)}


class _Rounding:
    """The constants of one dtype, shared by its scalars."""

    __slots__ = ("cast", "function", "largest", "tiny", "unit")

    def __init__(self, dtype: str) -> None:
        if dtype == "bfloat16":
            import ml_dtypes

            scalar: Any = ml_dtypes.bfloat16
        elif dtype == "float64":
            scalar = float
        else:
            scalar = getattr(np, dtype)
        self.cast: Callable[[float], float] = lambda x: float(scalar(x))
        self.unit, self.tiny, self.largest = _UNIT[dtype], _TINY[dtype], _LARGEST[dtype]
        self.function = FUNCTION_ULPS * 2 * self.unit  # an ulp is two unit roundoffs


class Estimated:
    """A value (float64, close to exact) with the error any evaluation of it in the dtype may have.

    A sum keeps its terms apart until its value is used (``terms``, ``mass = sum |term| + their errors``):
    its rounding is charged once, for any order (``settled``).
    """

    __slots__ = ("error", "mass", "rounding", "terms", "value")

    def __init__(self, value: float, error: float, rounding: _Rounding, terms: int = 1,
                 mass: float | None = None) -> None:
        self.value, self.error, self.rounding, self.terms = value, error, rounding, terms
        self.mass = abs(value) + error if mass is None else mass

    def settled(self) -> float:
        """This value's error, its pending sum's rounding charged."""
        if self.terms == 1:
            return self.error
        r = self.rounding
        return math.hypot(self.error, math.sqrt(self.terms - 1) * (r.unit * self.mass + r.tiny))

    def _result(self, value: float, error: float, relative: float | None = None) -> Estimated:
        """One rounded operation's result: ``error`` propagated from the operands, plus its own rounding (``relative``
        to the result: half an ulp, ``unit``, unless a library function's)."""
        r = self.rounding
        if value == 0 and error == 0:  # an exact zero (sum's start=x * 0) rounds to itself
            return Estimated(0.0, 0.0, r)
        if not abs(value) + error <= r.largest:  # overflow (or NaN): nothing to judge
            return Estimated(value, math.inf, r)
        own = (r.unit if relative is None else relative) * abs(value) + r.tiny
        return Estimated(value, math.hypot(error, own), r)

    def _of(self, other: Any) -> Estimated:
        if isinstance(other, Estimated):
            return other
        value = float(other)
        return Estimated(value, abs(self.rounding.cast(value) - value), self.rounding)

    # -- sums: kept apart, charged when used --------------------------------------------------------------------

    def __add__(self, other: Any) -> Estimated:
        term = self._of(other)
        if term.value == 0 and term.error == 0:  # sum's start=0
            return self
        if self.value == 0 and self.error == 0:
            return term
        return Estimated(self.value + term.value, math.hypot(self.error, term.error), self.rounding,
                         self.terms + term.terms, self.mass + term.mass)

    __radd__ = __add__

    def __neg__(self) -> Estimated:
        return Estimated(-self.value, self.error, self.rounding, self.terms, self.mass)

    def __sub__(self, other: Any) -> Estimated:
        return self + -self._of(other)

    def __rsub__(self, other: Any) -> Estimated:
        return self._of(other) + -self

    # -- products, quotients, powers ---------------------------------------------------------------------------

    def __mul__(self, other: Any) -> Estimated:
        other = self._of(other)
        a, b = self.settled(), other.settled()
        return self._result(self.value * other.value, math.hypot(abs(self.value) * b, abs(other.value) * a) + a * b)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Estimated:
        other = self._of(other)
        a, b = self.settled(), other.settled()
        quotient = self.value / other.value
        room = abs(other.value) - b  # |a'/b' - a/b| = |b ea - a eb| / (|b| |b'|): the two terms independent
        return self._result(quotient, math.hypot(a, abs(quotient) * b) / room if room > 0 else math.inf)

    def __rtruediv__(self, other: Any) -> Estimated:
        return self._of(other) / self

    def __pow__(self, other: Any) -> Estimated:
        other = self._of(other)
        a, b = self.settled(), other.settled()
        power = self.value ** other.value  # a positive base (RoPE's): d/da = y p / a, d/dy = p ln a
        error = abs(power) * math.hypot(abs(other.value) * a / abs(self.value), math.log(self.value) * b)
        return _function_result(self, power, error)

    # -- order: by value ----------------------------------------------------------------------------------------

    def __lt__(self, other: Any) -> bool:
        return self.value < self._of(other).value

    def __gt__(self, other: Any) -> bool:
        return self.value > self._of(other).value

    def __le__(self, other: Any) -> bool:
        return self.value <= self._of(other).value

    def __ge__(self, other: Any) -> bool:
        return self.value >= self._of(other).value

    def __repr__(self) -> str:
        return f"Estimated({self.value!r} +- {self.settled():.3g})"


def _function_result(x: Estimated, value: float, propagated: float) -> Estimated:
    """A library function's result: ``FUNCTION_ULPS`` of rounding instead of half an ulp."""
    return x._result(value, propagated, x.rounding.function)


def _exp(x: Estimated) -> Estimated:
    e = x.settled()
    value = math.exp(x.value)
    return _function_result(x, value, value * math.expm1(min(e, 709.0)) if e < 709.0 else math.inf)


def _sqrt(x: Estimated) -> Estimated:
    e = x.settled()
    value = math.sqrt(x.value)
    # |sqrt(a') - sqrt(a)| <= |a' - a| / (sqrt(a') + sqrt(a)), and always <= sqrt(|a' - a|)
    return _function_result(x, value, min(e / value if value > 0 else math.inf, math.sqrt(e)))


def _slope_at_most_one(function: Callable[[float], float]) -> Callable[[Estimated], Estimated]:
    """cos, sin, tanh: derivatives of magnitude at most 1."""

    def bounded(x: Estimated) -> Estimated:
        return _function_result(x, function(x.value), x.settled())

    return bounded


def _within(x: Estimated, radius: Estimated | float) -> Estimated:
    """``x``, which every evaluation puts within ``[-radius, radius]`` (an RMSNorm's output, a probability): its
    error is at most ``|x| + radius``, however large the first-order estimate (an RMSNorm of a state near zero, a
    softmax over scores as uncertain as a quantized key makes them)."""
    reach = abs(radius.value) + radius.settled() if isinstance(radius, Estimated) else abs(radius)
    error = x.settled()
    if error <= abs(x.value) + reach:
        return x
    return Estimated(x.value, abs(x.value) + reach, x.rounding)


class EstimatedStorage:
    """What a cache of ``storage`` holds of a row of ``Estimated`` scalars, for any correct store: each element's
    error gains the error any correct store of the row may have there (``StorageFormat.error_bounds``), times
    ``sqrt(times)`` for a row quantized ``times`` times (a key re-quantized at each move, as llama.cpp's K-shift
    dequantizes, re-rotates and quantizes it again), the quantizations independent. ``whole_row``: called on a
    token's whole kv row (blocks along the row). For a block format, ``query`` does the same to a query head row
    as a ``q8_0`` block (ggml quantizes the query to ``q8_0`` for its dot products with a block-format key)."""

    requantizes = True

    def __init__(self, storage: StorageFormat, *, whole_row: bool = False) -> None:
        self.storage, self.whole_row = storage, whole_row
        self.queries = StorageFormat("q8_0", "per_block") if storage.scale == "per_block" else None

    def __call__(self, row: list[Any], times: int = 1) -> list[Any]:
        return _widened(row, self.storage, math.sqrt(times))

    def query(self, row: list[Any]) -> list[Any]:
        """The query head row as a block-format dot product reads it (unchanged for another format); a row
        shorter than a block, or not a whole number of them, is one block."""
        if self.queries is None:
            return row
        if len(row) % BLOCK:
            values = np.array([v.value for v in row])
            bounds = np.full(len(row), np.max(np.abs(values), initial=0.0) / 254.0 * (1 + FLOAT16_UNIT))
            return [_with_error(v, float(b)) for v, b in zip(row, bounds)]
        return _widened(row, self.queries, 1.0)


def _softmax(scores: list[Estimated]) -> list[Estimated]:
    """A softmax over uncertain scores, its probabilities' errors from its derivative rather than operation by
    operation: ``dp_i = p_i (ds_i - sum_j p_j ds_j)``, the scores' errors independent, each taken as
    ``expm1(|ds|)`` (at least ``|ds|``: the exponential's growth where the scores are far off), so that
    ``sqrt(((1 - p_i) D_i)^2 + sum_{j != i} (p_j D_j)^2) p_i``; a probability's error is at most ``max(p, 1 - p)``
    (it lies in [0, 1]). Plus the rounding of the computation itself, on the scores as given: the operations'
    estimate with the scores' errors left out. The operation by operation estimate takes the row maximum's error
    into every term and the quotient's terms as independent, where they cancel: over keys as uncertain as a
    quantized cache makes them, that multiplies the estimate layer after layer."""
    rounding = scores[0].rounding
    peak = max(s.value for s in scores)
    exps = [math.exp(s.value - peak) for s in scores]
    total = math.fsum(exps)
    p = [e / total for e in exps]
    spread = [math.expm1(min(s.settled(), 709.0)) if s.settled() < 709.0 else math.inf for s in scores]
    weighted = math.fsum((q * d) ** 2 for q, d in zip(p, spread))
    exact = [Estimated(s.value, 0.0, rounding) for s in scores]
    top = max(exact)
    shifted = [_exp(s - top) for s in exact]
    own_total = sum(shifted[1:], start=shifted[0])
    own = [(e / own_total).settled() for e in shifted]
    result = []
    for q, d, r in zip(p, spread, own):
        others = max(weighted - (q * d) ** 2, 0.0)
        propagated = q * math.sqrt(((1 - q) * d) ** 2 + others) if math.isfinite(weighted) else math.inf
        result.append(Estimated(q, min(math.hypot(propagated, r), max(q, 1 - q) + r), rounding))
    return result


def _widened(row: list[Any], storage: StorageFormat, times: float) -> list[Any]:
    values = np.array([v.value for v in row], dtype=np.float64)
    bounds = storage.error_bounds(values) * times
    return [_with_error(v, float(b)) for v, b in zip(row, bounds)]


def _with_error(x: Estimated, bound: float) -> Estimated:
    return Estimated(x.value, math.hypot(x.settled(), bound), x.rounding)


def rounding_errors(dtype: str, *, whole_model: bool = False) -> NumberSystem:
    """The oracle's computation with every scalar carrying the error any ``dtype`` evaluation of it may have;
    its ``to_float`` reads that error (see the module's docstring). ``whole_model``: for a whole model's estimate
    (docs/spec.md §15.6: over a cache narrower than the computation, ``EstimatedStorage``, or of a float64 model
    whose own rounding may come near 1e-12): every RMSNorm output and probability bounded by what any evaluation
    of it lies within (``NumberSystem.within``), the softmax's error from its derivative (``_softmax``), and
    ``float64`` taken too. Without those bounds the estimate of a deep model runs away (a 7-layer Gemma 3 in
    float32: an error as large as its logits)."""
    if dtype not in LOW_PRECISIONS and not (whole_model and dtype == "float64"):
        raise ValueError(f"dtype must be one of {LOW_PRECISIONS}, got {dtype!r}")
    rounding = _Rounding(dtype)

    def number(value: float) -> Estimated:
        value = float(value)
        cast = rounding.cast(value)
        return Estimated(value, abs(cast - value) if math.isfinite(cast) else math.inf, rounding)

    return NumberSystem(
        name=f"rounding errors of {dtype}",
        number=number,
        exp=_exp,
        cos=_slope_at_most_one(math.cos),
        sin=_slope_at_most_one(math.sin),
        sqrt=_sqrt,
        tanh=_slope_at_most_one(math.tanh),
        to_float=Estimated.settled,
        is_finite=lambda value: math.isfinite(value.value) and math.isfinite(value.settled()),
        reads_errors=True,
        within=_within if whole_model else None,
        softmax=_softmax if whole_model else None,
    )
