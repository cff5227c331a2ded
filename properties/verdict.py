"""Verdicts about the implementation, kept apart from bugs of the suite itself.

``NonConformance`` is the only exception a property raises about the
implementation under test. Anything else escaping a property (an
``OracleInputError``, a ``TypeError`` in the suite) is a suite bug.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .protocol import CacheSnapshot, ErrorKind, KvCacheAdapter


class NonConformance(AssertionError):
    """The implementation under test did not do what the specification requires."""

    raised = 0  # how many were ever made in this process (the mutant report counts with it)

    def __init__(self, message: str) -> None:
        type(self).raised += 1
        super().__init__(message)


@dataclass(frozen=True)
class Outcome:
    """What one adapter call did: returned ``value``, or raised an error of ``kind``."""

    value: Any = None
    kind: ErrorKind | None = None
    error: BaseException | None = None


def call(adapter: KvCacheAdapter, what: str, action: Callable[[], Any]) -> Outcome:
    """Run one adapter call; map a raised exception to its kind or call it non-conformance."""
    try:
        return Outcome(value=action())
    except Exception as error:
        kind = adapter.error_kind(error)
        if kind is None:
            raise NonConformance(f"{what}: raised {type(error).__name__}: {error} -- "
                                 "an exception the adapter does not map to an error kind") from error
        try:
            return Outcome(kind=ErrorKind(kind), error=error)
        except ValueError:
            raise NonConformance(f"{what}: the adapter mapped {type(error).__name__} to unknown "
                                 f"kind {kind!r}") from error


def expect_rejection(outcome: Outcome, expected: ErrorKind, what: str) -> None:
    __tracebackhide__ = True
    if outcome.kind is None:
        raise NonConformance(f"{what}: succeeded, but should be rejected with {expected.value}")
    if outcome.kind != expected:
        raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), "
                             f"but should be rejected with {expected.value}")


def expect_success(outcome: Outcome, what: str) -> Any:
    __tracebackhide__ = True
    if outcome.kind is not None:
        raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), "
                             "but should succeed")
    return outcome.value


def assert_close(actual: Any, expected: np.ndarray, *, tolerance: float, what: str,
                 axes: Sequence[str] = ("batch", "head", "position", "feature")) -> float:
    """Raise unless ``actual`` has ``expected``'s shape and agrees within ``tolerance``.

    Returns the worst absolute error. The message names where it is: one index
    per axis, with the names in ``axes`` (the last ``ndim`` of them are used).
    """
    __tracebackhide__ = True
    if not isinstance(actual, np.ndarray):
        raise NonConformance(f"{what}: expected a numpy array of shape {expected.shape}, "
                             f"got {type(actual).__name__}")
    if actual.shape != expected.shape:
        raise NonConformance(f"{what}: shape {actual.shape}, but should be {expected.shape}")
    if actual.size == 0:
        return 0.0
    actual = actual.astype(np.float64)
    error = np.abs(actual - expected)
    error[~np.isfinite(actual)] = np.inf
    worst = np.unravel_index(int(np.argmax(error)), error.shape)
    worst_error = float(error[worst])
    if not worst_error <= tolerance:
        names = list(axes)[-actual.ndim:] if actual.ndim <= len(axes) else [f"axis{i}" for i in range(actual.ndim)]
        where = ", ".join(f"{name}={int(i)}" for name, i in zip(names, worst))
        mismatched = int(np.count_nonzero(~(error <= tolerance)))
        raise NonConformance(f"{what}: |error| {worst_error:.3e} at {where} exceeds tolerance {tolerance:.0e} "
                             f"({mismatched} of {error.size} elements); got {actual[worst]!r}, "
                             f"should be {expected[worst]!r}")
    return worst_error


def read_snapshot(adapter: KvCacheAdapter, cache: Any, what: str, *, physical: bool) -> CacheSnapshot:
    """The adapter's snapshot, checked for shape and type, as a ``CacheSnapshot``."""
    raw = call(adapter, f"{what}: snapshot", lambda: adapter.snapshot(cache))
    snapshot = expect_success(raw, f"{what}: snapshot")
    try:
        result = CacheSnapshot(
            length=snapshot.length, keys=snapshot.keys, values=snapshot.values,
            physical_keys=getattr(snapshot, "physical_keys", None) if physical else None,
            physical_values=getattr(snapshot, "physical_values", None) if physical else None,
            buffer_identity=getattr(snapshot, "buffer_identity", None) if physical else None)
    except AttributeError as error:
        raise NonConformance(f"{what}: snapshot lacks a field: {error}") from error
    arrays = [result.keys, result.values] + ([result.physical_keys, result.physical_values] if physical else [])
    if not isinstance(result.length, (int, np.integer)) or not all(isinstance(a, np.ndarray) for a in arrays):
        raise NonConformance(f"{what}: snapshot must hold an int length and numpy arrays")
    return result


def same_state(before: CacheSnapshot, after: CacheSnapshot, what: str, rule: str) -> None:
    """Raise unless nothing observable changed: length, logical K/V, storage bytes, buffers."""
    __tracebackhide__ = True
    if after.length != before.length:
        raise NonConformance(f"{what}: cache length changed {before.length} -> {after.length}, but {rule}")
    for name in ("keys", "values", "physical_keys", "physical_values"):
        old, new = getattr(before, name), getattr(after, name)
        if old is None:
            continue
        if old.shape != new.shape or old.tobytes() != new.tobytes():
            raise NonConformance(f"{what}: {name.replace('_', ' ')} changed, but {rule}")
    if before.buffer_identity != after.buffer_identity:
        raise NonConformance(f"{what}: storage buffers were replaced, but {rule}")
