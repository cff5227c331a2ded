"""Memory layouts of valid input rows: C or Fortran order, strided, read-only.

A float64 row of the right shape is valid whatever its layout, so the suite
hands implementations all of them -- and must hand over exactly what it built
(a deep copy would make every array contiguous and writable). Traces record
the layout beside the values.
"""

from __future__ import annotations

import numpy as np

ORDERS = ("C", "F", "strided")


def layout_of(array: np.ndarray) -> tuple[str, bool]:
    """(order, writeable): order "C", "F" (Fortran order, and not also C order) or "strided" (neither)."""
    order = "C" if array.flags.c_contiguous else "F" if array.flags.f_contiguous else "strided"
    return order, bool(array.flags.writeable)


def with_layout(array: np.ndarray, order: str, writeable: bool) -> np.ndarray:
    """A copy of ``array`` laid out as ``order`` says ("strided": every other element of the last axis
    of a buffer of its own), read-only unless ``writeable``."""
    if order not in ORDERS:
        raise ValueError(f"layout order must be one of {ORDERS}, got {order!r}")
    if order == "strided" and array.ndim:
        buffer = np.empty((*array.shape[:-1], 2 * array.shape[-1]), dtype=array.dtype)
        laid = buffer[..., ::2]
        laid[...] = array
    else:
        laid = np.array(array, order="F" if order == "F" else "C", copy=True)
    laid.flags.writeable = writeable
    return laid


def same_layout_copy(array: np.ndarray) -> np.ndarray:
    return with_layout(array, *layout_of(array))
