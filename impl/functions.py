"""The elementary functions the reference attends with: float64's own, or of a lower dtype's accuracy.

A framework whose float64 calls float32 kernels for ``exp``, ``cos`` and
``sin`` gives results of float32's accuracy inside float64 arithmetic
(docs/spec.md §8.4, the ``transcendentals`` component). ``Functions("float32")``
is the reference so: each argument rounded to the dtype, the function
computed there, the result back in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class Functions:
    dtype: str | None = None  # None: float64's own

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"functions of dtype {self.dtype!r}: one of {DTYPES}, or None for float64")

    def exp(self, x: np.ndarray) -> np.ndarray:
        return self._of(np.exp, x)

    def cos(self, x: np.ndarray) -> np.ndarray:
        return self._of(np.cos, x)

    def sin(self, x: np.ndarray) -> np.ndarray:
        return self._of(np.sin, x)

    def _of(self, function: np.ufunc, x: np.ndarray) -> np.ndarray:
        if self.dtype is None:
            exact: np.ndarray = function(x)
            return exact
        with np.errstate(over="ignore"):  # an argument past the dtype's range rounds to inf, as its kernel would
            lowered: np.ndarray = function(np.asarray(x).astype(self.dtype)).astype(np.float64)
        return lowered


FLOAT64_FUNCTIONS = Functions()
