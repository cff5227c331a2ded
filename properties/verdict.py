"""Verdicts about the implementation, kept apart from bugs of the suite itself.

``NonConformance`` is the only exception a property raises about the
implementation under test. Anything else escaping a property (an
``OracleInputError``, a ``TypeError`` in the suite) is a suite bug.
"""

from __future__ import annotations

import copy
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .layouts import same_layout_copy
from .protocol import AttentionWeights, CacheSnapshot, DecoderWeights, ErrorKind, KvCacheAdapter


class NonConformance(AssertionError):
    """The implementation under test did not do what the specification requires.

    ``kind`` is a short, step-independent name of what went wrong (``"expected full, got accepted"``,
    ``"output mismatch"``): the report groups failures into distinct causes by it. The shared
    checks below set it; elsewhere the report derives it from the message (``runner.failure_kind``).
    """

    raised = 0  # how many were ever made in this process (the mutant report counts with it)

    def __init__(self, message: str, *, kind: str | None = None) -> None:
        type(self).raised += 1
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Outcome:
    """What one adapter call did: returned ``value``, or raised an error of ``kind``."""

    value: Any = None
    kind: ErrorKind | None = None
    error: BaseException | None = None


class AdapterHung(BaseException):
    """An adapter call did not return in time.

    A ``BaseException`` on purpose: Hypothesis shrinks failures by running
    them again, and every rerun would hang as long again. This one passes
    straight through Hypothesis; ``runner.run_machine`` turns it into a
    ``NonConformance`` naming the call, with the (unshrunk) trace.
    """

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"{what}: did not return within {seconds:g} s (per-call timeout, --kv-call-timeout)")


CALL_TIMEOUT = 60.0  # seconds per adapter call; conftest sets --kv-call-timeout


@contextmanager
def _watchdog(what: str, seconds: float) -> Iterator[None]:
    """Interrupt the current call after ``seconds`` (SIGALRM: main thread, POSIX; elsewhere no limit)."""
    if seconds <= 0 or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise AdapterHung(what, seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Inputs:
    """What one adapter call is handed: copies, checked afterwards against the originals.

    An implementation may keep what it is given, but must not write into it:
    the suite's model, and so the oracle's view, holds the originals.
    """

    def __init__(self) -> None:
        self._handed: list[tuple[str, Any, Any]] = []

    def __call__(self, name: str, value: Any) -> Any:
        given = same_layout_copy(value) if isinstance(value, np.ndarray) else copy.deepcopy(value)
        self._handed.append((name, value, given))
        return given

    def check(self, what: str) -> None:
        from .trace import encode  # the canonical form: arrays by dtype, shape and exact values

        for name, original, given in self._handed:
            if encode(given) != encode(original):
                raise NonConformance(f"{what}: the implementation modified its input {name} in place; "
                                     "inputs belong to the caller", kind="input modified in place")


def _run(what: str, action: Callable[[], Any], inputs: Inputs | None) -> Outcome:
    try:
        with _watchdog(what, CALL_TIMEOUT):
            outcome = Outcome(value=action())
    except Exception as error:
        outcome = Outcome(error=error)
    if inputs is not None:
        inputs.check(what)
    return outcome


def attempt(adapter: KvCacheAdapter, what: str, action: Callable[[], Any], inputs: Inputs | None = None, *,
            judged: bool) -> Outcome:
    """``call`` for an input whose error kind is judged only where the adapter claims it.

    With ``judged`` False, any exception -- mapped or not -- is an outcome with ``error`` set and no
    ``kind``: only what every implementation owes is judged afterwards (a call that raised changed
    nothing).
    """
    return call(adapter, what, action, inputs) if judged else _run(what, action, inputs)


def call(adapter: KvCacheAdapter, what: str, action: Callable[[], Any], inputs: Inputs | None = None) -> Outcome:
    """Run one adapter call; map a raised exception to its kind or call it non-conformance.

    The call gets ``CALL_TIMEOUT`` seconds; afterwards whatever ``inputs``
    handed it must be as it was.
    """
    outcome = _run(what, action, inputs)
    if outcome.error is None:
        return outcome
    error = outcome.error
    try:
        kind = adapter.error_kind(error)
    except Exception as failure:
        raise NonConformance(f"{what}: raised {type(error).__name__}: {error}, and the adapter's error_kind "
                             f"raised {type(failure).__name__}: {failure} on it",
                             kind="unexpected exception (error_kind raised)") from failure
    if kind is None:
        raise NonConformance(f"{what}: raised {type(error).__name__}: {error} -- "
                             "an exception the adapter does not map to an error kind",
                             kind=f"unexpected exception ({type(error).__name__})") from error
    try:
        return Outcome(kind=ErrorKind(kind), error=error)
    except ValueError:
        raise NonConformance(f"{what}: the adapter mapped {type(error).__name__} to unknown "
                             f"kind {kind!r}", kind="unknown error kind") from error


def fields(value: Any, names: Sequence[str], what: str) -> tuple[Any, ...]:
    """``value``'s attributes ``names``, or a non-conformance naming the missing one."""
    try:
        return tuple(getattr(value, name) for name in names)
    except AttributeError as error:
        raise NonConformance(f"{what}: the result lacks a field: {error}", kind="malformed result") from error


def expect_rejection(outcome: Outcome, expected: ErrorKind, what: str) -> None:
    __tracebackhide__ = True
    if outcome.kind is None:
        raise NonConformance(f"{what}: succeeded, but should be rejected with {expected.value}",
                             kind=f"expected {expected.value}, got success")
    if outcome.kind != expected:
        raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), "
                             f"but should be rejected with {expected.value}",
                             kind=f"expected {expected.value}, got {outcome.kind.value}")


def expect_success(outcome: Outcome, what: str) -> Any:
    __tracebackhide__ = True
    if outcome.kind is not None:
        raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), "
                             "but should succeed", kind=f"expected success, got {outcome.kind.value}")
    return outcome.value


def assert_close(actual: Any, expected: np.ndarray, *, tolerance: float | np.ndarray, what: str,
                 axes: Sequence[str] = ("batch", "head", "position", "feature"),
                 dtype: type[np.floating[Any]] | None = np.float64) -> tuple[float, float]:
    """Raise unless ``actual`` is an array of ``expected``'s shape (and of ``dtype``, unless None:
    then of any real floating dtype) agreeing within ``tolerance`` (one number, or one per element).

    Returns (error, tolerance) of the element closest to failing. The message names where it is: one index
    per axis, with the names in ``axes`` (the last ``ndim`` of them are used).
    """
    __tracebackhide__ = True
    compared = "cached rows" if "cached" in what else "output"  # the machines say "cached ..." of stored K/V
    if not isinstance(actual, np.ndarray):
        raise NonConformance(f"{what}: expected a numpy array of shape {expected.shape}, "
                             f"got {type(actual).__name__}", kind=f"{compared}: not an array")
    if actual.shape != expected.shape:
        raise NonConformance(f"{what}: shape {actual.shape}, but should be {expected.shape}",
                             kind=f"{compared}: wrong shape")
    if (actual.dtype != dtype) if dtype is not None else (actual.dtype.kind != "f" and actual.dtype.name != "bfloat16"):
        raise NonConformance(f"{what}: dtype {actual.dtype}, but should be "
                             f"{np.dtype(dtype) if dtype is not None else 'a real floating type'}",
                             kind=f"{compared}: wrong dtype")
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
        bound = f"its tolerance {worst_limit:.3e}" if per_element else f"tolerance {worst_limit:.0e}"
        raise NonConformance(f"{what}: |error| {worst_error:.3e} at {where} exceeds {bound} "
                             f"({mismatched} of {error.size} elements); got {actual[worst]!r}, "
                             f"should be {expected[worst]!r}", kind=f"{compared} mismatch")
    return worst_error, worst_limit


def read_snapshot(adapter: KvCacheAdapter, cache: Any, what: str, *, physical: bool,
                  positions: bool = False) -> CacheSnapshot:
    """The adapter's snapshot, checked for type, as a ``CacheSnapshot`` (``positions``: a window cache's)."""
    raw = call(adapter, f"{what}: snapshot", lambda: adapter.snapshot(cache))
    snapshot = expect_success(raw, f"{what}: snapshot")
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


def update_block_weights(adapter: Any, decoder: Any, weights: DecoderWeights, block: int,
                         new: AttentionWeights, what: str) -> DecoderWeights:
    """Write block ``block``'s parameters in place through the adapter (which must succeed); the decoder's
    weights afterwards."""
    handed = Inputs()
    given = handed("weights", new)
    expect_success(call(adapter, what, lambda: adapter.update_block_weights(decoder, block, given), handed), what)
    blocks = list(weights.blocks)
    blocks[block] = new
    return replace(weights, blocks=tuple(blocks))  # type: ignore[misc]


def same_state(before: CacheSnapshot, after: CacheSnapshot, what: str, rule: str) -> None:
    """Raise unless nothing observable changed: length, logical K/V, storage bytes, buffers."""
    __tracebackhide__ = True
    kind = "state changed by a rejected call" if "rejected" in rule else f"state changed ({rule})"
    if after.length != before.length:
        raise NonConformance(f"{what}: cache length changed {before.length} -> {after.length}, but {rule}", kind=kind)
    for name in ("keys", "values", "positions", "physical_keys", "physical_values"):
        old, new = getattr(before, name), getattr(after, name)
        if old is None:
            continue
        if old.shape != new.shape or old.tobytes() != new.tobytes():
            raise NonConformance(f"{what}: {name.replace('_', ' ')} changed, but {rule}", kind=kind)
    if before.buffer_identity != after.buffer_identity:
        raise NonConformance(f"{what}: storage buffers were replaced, but {rule}", kind=kind)
