"""How close is close enough: one rule per declared dtype, stated in every report.

- ``float64`` (the default): every output and cached row within 1e-12
  absolute of the oracle, on the documented input ranges
  (``strategies.py``). This never loosens.
- ``float32``, ``float16``, ``bfloat16``: FlashAttention's rule instead of a
  guessed constant. The implementation's worst error against the oracle may
  be at most ``FACTOR`` times the worst error of the naive full-prefix
  computation done in the same dtype (the oracle's own code with every
  scalar operation rounded to the dtype, ``oracle.numpy_precision``), plus a
  floor of ``FLOOR_ULPS`` units in the last place of the dtype at the
  expected values' magnitude.

Why the floor is 8 ulps: FlashAttention compares maxima over large tensors,
where a lucky naive result is averaged away; here a step may have a single
output element, and the naive computation is sometimes lucky. Measured by
``python bench/run.py --only tolerance`` (13,489 float32 steps of
``examples/minimal_adapter.py:make_float32_adapter`` on random layers): the
implementation's error reaches 5.3 ulps at the output's magnitude; the
ratio error / (2 x naive + 1 ulp) reaches 1.68, over 1 in 25 steps (a false
alarm every ~500 steps); error / (2 x naive + 8 ulps) reaches 0.43. That
is on the documented input ranges: the layer machine's peaked rows (inputs
up to 60) are drawn for float64 implementations only.

An adapter declares its dtype with an optional ``dtype`` attribute. Ground
truth is the ``--oracle`` (float64 by default: within 1e-13 of mpmath,
``test_precision.py``, far below any low-precision budget).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from oracle import LOW_PRECISIONS, NumberSystem, numpy_precision

from .verdict import NonConformance, assert_close

DTYPES = ("float64", *LOW_PRECISIONS)
ABSOLUTE = 1e-12  # float64, on the documented ranges
FACTOR = 2.0  # FlashAttention's tests: |out - ref| <= 2 |out_naive - ref| (+ a floor)
FLOOR_ULPS = 8.0
_EPS = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Reference(Generic[T]):
    """The oracle's answer, and for low-precision rules the naive same-dtype computation of it."""

    truth: T
    naive: T | None


@dataclass
class Judge:
    """Applies the rule of one dtype; the machines route every numeric comparison through it.

    ``worst`` is the (error, tolerance) of the comparison that came closest to failing.
    """

    dtype: str
    oracle: NumberSystem
    worst: tuple[float, float] = (0.0, ABSOLUTE)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def rule(self) -> str:
        if self.dtype == "float64":
            return f"float64: |error| <= {ABSOLUTE:.0e} absolute against the {self.oracle.name} oracle"
        return (f"{self.dtype}: |error| <= {FACTOR:g} x |error of the naive {self.dtype} full-prefix computation| "
                f"+ {FLOOR_ULPS:g} {self.dtype} ulps at the expected magnitude, against the {self.oracle.name} oracle")

    def reference(self, compute: Callable[[NumberSystem], T]) -> Reference[T]:
        naive = None if self.dtype == "float64" else compute(numpy_precision(self.dtype))
        return Reference(compute(self.oracle), naive)

    def tolerance(self, expected: np.ndarray, naive: np.ndarray | None) -> float:
        if self.dtype == "float64" or naive is None:
            return ABSOLUTE
        scale = float(np.max(np.abs(expected), initial=1.0))
        error = np.abs(np.asarray(naive, dtype=np.float64) - expected)
        budget = float(np.max(np.where(np.isfinite(error), error, np.inf), initial=0.0))
        return FACTOR * budget + FLOOR_ULPS * _EPS[self.dtype] * scale

    def bound(self, reference: Reference[T], select: Callable[[T], np.ndarray]) -> tuple[np.ndarray, float]:
        """The expected array ``select(reference.truth)`` and this rule's tolerance for it."""
        expected = select(reference.truth)
        return expected, self.tolerance(expected, None if reference.naive is None else select(reference.naive))

    def close(self, actual: Any, expected: np.ndarray, tolerance: float, *, what: str,
              axes: Sequence[str] = ("batch", "head", "position", "feature")) -> float:
        """``assert_close`` with this rule's dtype check, remembering the closest call to the tolerance."""
        __tracebackhide__ = True
        try:
            error = assert_close(actual, expected, tolerance=tolerance, what=what, axes=axes,
                                 dtype=np.float64 if self.dtype == "float64" else None)
        except NonConformance:
            if isinstance(actual, np.ndarray) and actual.shape == expected.shape and actual.size:
                self._observe(float(np.nan_to_num(np.abs(actual.astype(np.float64) - expected), nan=np.inf).max()),
                              tolerance)
            raise
        self._observe(error, tolerance)
        return error

    def _observe(self, error: float, tolerance: float) -> None:
        if tolerance > 0:
            self.worst = closer_to_failing((error, tolerance), self.worst)


def closer_to_failing(candidate: tuple[float, float], worst: tuple[float, float]) -> tuple[float, float]:
    """Of two (error, tolerance) pairs, the one with the larger error / tolerance (ties to ``candidate``)."""
    return candidate if candidate[0] / candidate[1] >= worst[0] / worst[1] else worst


def declared_dtype(adapter: Any) -> str:
    return str(getattr(adapter, "dtype", "float64"))
