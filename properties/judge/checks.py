"""Checks of what an adapter returned: well-formed answers (docs/spec.md §5.3), and numbers within a tolerance.

Each raises a ``NonConformance`` with its kind; the message says what was
expected and what came, and where the worst error is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..protocol.kinds import ErrorKind
from ..protocol.layer import CacheSnapshot
from .calls import Outcome, call
from .failures import NonConformance


def fields(value: Any, names: Sequence[str], what: str) -> tuple[Any, ...]:
    """``value``'s attributes ``names``, or a non-conformance naming the missing one."""
    try:
        return tuple(getattr(value, name) for name in names)
    except AttributeError as error:
        raise NonConformance(f"{what}: the result lacks a field: {error}", kind="malformed result") from error


def expect_success(outcome: Outcome, what: str) -> Any:
    __tracebackhide__ = True
    if outcome.kind is not None:
        raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), but should succeed",
                             kind=f"expected success, got {outcome.kind.value}", check="success")
    return outcome.value


def expect_rejection(outcome: Outcome, expected: ErrorKind, what: str) -> None:
    __tracebackhide__ = True
    if outcome.kind is None:
        raise NonConformance(f"{what}: succeeded, but should be rejected with {expected.value}",
                             kind=f"expected {expected.value}, got success", check=expected.value)
    if outcome.kind != expected:
        raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), "
                             f"but should be rejected with {expected.value}",
                             kind=f"expected {expected.value}, got {outcome.kind.value}", check=expected.value)


def assert_close(actual: Any, expected: np.ndarray, *, tolerance: float | np.ndarray, what: str,
                 check: str = "output", axes: Sequence[str] = ("batch", "head", "row", "feature"),
                 dtype: type[np.floating[Any]] | None = np.float64) -> tuple[float, float]:
    """Raise unless ``actual`` is an array of ``expected``'s shape (and of ``dtype``, unless None:
    then of any real floating dtype) agreeing within ``tolerance`` (one number, or one per element).

    ``check`` names what is compared ("output", "logits", "cached keys", ...): the failure's kind
    starts with it. Returns (error, tolerance) of the element closest to failing; the message names
    where it is, one index per axis, with the names in ``axes`` (the last ``ndim`` of them).
    """
    __tracebackhide__ = True
    if not isinstance(actual, np.ndarray):
        raise NonConformance(f"{what}: expected a numpy array of shape {expected.shape}, "
                             f"got {type(actual).__name__}", kind=f"{_family(check)}: not an array", check=check)
    if actual.shape != expected.shape:
        raise NonConformance(f"{what}: shape {actual.shape}, but should be {expected.shape}",
                             kind=f"{_family(check)}: wrong shape", check=check)
    if (actual.dtype != dtype) if dtype is not None else (actual.dtype.kind != "f" and actual.dtype.name != "bfloat16"):
        raise NonConformance(f"{what}: dtype {actual.dtype}, but should be "
                             f"{np.dtype(dtype) if dtype is not None else 'a real floating type'}",
                             kind=f"{_family(check)}: wrong dtype", check=check)
    per_element = np.ndim(tolerance) > 0
    limit = np.broadcast_to(np.asarray(tolerance, dtype=np.float64), expected.shape)
    if actual.size == 0:
        return 0.0, float(np.max(limit, initial=0.0)) if per_element else float(tolerance)
    actual = actual.astype(np.float64)
    error = np.abs(actual - expected)
    error[~np.isfinite(actual)] = np.inf
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(limit > 0, error / limit, np.where(error > 0, np.inf, 0.0))
    worst = np.unravel_index(int(np.argmax(ratio)), error.shape)
    worst_error, worst_limit = float(error[worst]), float(limit[worst])
    if not worst_error <= worst_limit:
        names = list(axes)[-actual.ndim:] if actual.ndim <= len(axes) else [f"axis{i}" for i in range(actual.ndim)]
        where = ", ".join(f"{name}={int(i)}" for name, i in zip(names, worst))
        mismatched = int(np.count_nonzero(~(error <= limit)))
        bound = f"its tolerance {worst_limit:.3e}" if per_element else f"tolerance {worst_limit:.4g}"
        raise NonConformance(f"{what}: |error| {worst_error:.3e} at {where} exceeds {bound} "
                             f"({mismatched} of {error.size} elements); got {actual[worst]!r}, "
                             f"should be {expected[worst]!r}", kind=f"{_family(check)} mismatch", check=check)
    return worst_error, worst_limit


def _family(check: str) -> str:
    """Failure kinds name two families of comparison: what a call returned ("output") and what a cache holds
    ("cached rows"), whatever the tensor."""
    return "cached rows" if check.startswith(("cached", "physical", "held")) else "output"


def read_snapshot(adapter: Any, cache: Any, what: str, *, physical: bool, positions: bool = False) -> CacheSnapshot:
    """The adapter's snapshot, checked for type, as a ``CacheSnapshot`` (``positions``: a window cache's)."""
    snapshot = expect_success(call(adapter, f"{what}: snapshot", lambda: adapter.snapshot(cache)), f"{what}: snapshot")
    try:
        result = CacheSnapshot(
            length=snapshot.length, keys=snapshot.keys, values=snapshot.values,
            physical_keys=getattr(snapshot, "physical_keys", None) if physical else None,
            physical_values=getattr(snapshot, "physical_values", None) if physical else None,
            buffer_identity=getattr(snapshot, "buffer_identity", None) if physical else None,
            positions=getattr(snapshot, "positions", None) if positions else None)
    except AttributeError as error:
        raise NonConformance(f"{what}: snapshot lacks a field: {error}", kind="malformed snapshot") from error
    arrays = [result.keys, result.values] + ([result.physical_keys, result.physical_values] if physical else [])
    if not isinstance(result.length, (int, np.integer)) or not all(isinstance(a, np.ndarray) for a in arrays):
        raise NonConformance(f"{what}: snapshot must hold an int length and numpy arrays", kind="malformed snapshot")
    if positions and not (isinstance(result.positions, np.ndarray) and result.positions.ndim == 1
                          and result.positions.dtype.kind in "iu"):
        raise NonConformance(f"{what}: a sliding-window cache's snapshot must give the held rows' positions as a 1-D "
                             f"integer array, got {result.positions!r}", kind="malformed snapshot")
    return result


def seen_by_next(length: int, window: int, sinks: int = 0) -> list[int]:
    """The positions of the rows a query at ``length`` sees besides its own: the window's
    ``length - window + 1 .. length - 1``, and the first ``sinks`` (docs/spec.md §13.5)."""
    first = max(0, length - window + 1)
    return [*range(min(sinks, first)), *range(first, length)]


def window_positions(positions: Sequence[int], length: int, window: int, what: str, *, sinks: int = 0) -> None:
    """The rows a window cache (or a session's block) shows, docs/spec.md §9.1 and §13.5: increasing positions
    of rows fed, with at least every row the next query sees (``seen_by_next``); older rows besides are
    allowed, never required (no query sees them again)."""
    __tracebackhide__ = True
    shown = list(positions)
    if shown != sorted(set(shown)) or any(not 0 <= p < length for p in shown):
        raise NonConformance(f"{what} shows rows at positions {shown}: not increasing positions of rows fed "
                             f"(0 .. {length - 1})", kind="window: wrong positions", check="held positions")
    missing = sorted(set(seen_by_next(length, window, sinks)) - set(shown))
    if missing:
        raise NonConformance(f"{what} of {length} rows (window {window}"
                             + (f", {sinks} sinks" if sinks else "") + f") shows positions {shown}, without "
                             f"{missing}, which the next row attends to",
                             kind="window: rows the next row sees are missing", check="held positions")
