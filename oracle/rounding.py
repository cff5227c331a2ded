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

FUNCTION_ULPS = 4.0  # exp, cos, sin, tanh, sqrt, pow: vectorised float32 library kernels err by up to ~4 ulps
_UNIT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}  # unit roundoff: half an ulp at 1
_TINY = {"float32": 2.0**-150, "float16": 2.0**-25, "bfloat16": 2.0**-134}  # half the smallest subnormal
_LARGEST = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0, "bfloat16": 3.3895313892515355e38}


class _Rounding:
    """The constants of one dtype, shared by its scalars."""

    __slots__ = ("cast", "function", "largest", "tiny", "unit")

    def __init__(self, dtype: str) -> None:
        if dtype == "bfloat16":
            import ml_dtypes

            scalar: Any = ml_dtypes.bfloat16
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
    return _function_result(x, value, value * math.expm1(e))


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


def rounding_errors(dtype: str) -> NumberSystem:
    """The oracle's computation with every scalar carrying the error any ``dtype`` evaluation of it may have;
    its ``to_float`` reads that error (see the module's docstring)."""
    if dtype not in LOW_PRECISIONS:
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
    )
