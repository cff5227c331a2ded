"""The call harness: every adapter call gets a time limit and copies of its inputs, and its exception a kind.

An implementation may keep what it is handed but must not write into it
(docs/spec.md §5.2); it must return within the per-call limit (§5.3); an
exception it raises on purpose is mapped by its ``error_kind`` (§5.4). What
a call owes beyond that -- success, a claimed rejection, nothing changed --
is the call policy's (``policy``).
"""

from __future__ import annotations

import copy
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..generate.layouts import same_layout_copy
from ..protocol.isolation import EngineDied, EngineHung
from ..protocol.kinds import ErrorKind
from ..traces.codec import encode  # the canonical form: arrays by dtype, shape, layout and exact values
from .failures import NonConformance

CALL_TIMEOUT = 60.0  # seconds per adapter call; the plugin sets --kv-call-timeout
CRASH = "crash"  # the failure kind of an isolated engine whose process died in a call


@dataclass(frozen=True)
class Outcome:
    """What one adapter call did: returned ``value``, or raised ``error`` (of ``kind``, once mapped)."""

    value: Any = None
    kind: ErrorKind | None = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None


class AdapterHung(BaseException):
    """An adapter call did not return in time.

    A ``BaseException`` on purpose: Hypothesis shrinks failures by running
    them again, and every rerun would hang as long again. This one passes
    straight through Hypothesis; the runner turns it into a ``NonConformance``
    naming the call, with the (unshrunk) trace.
    """

    def __init__(self, what: str, seconds: float) -> None:
        super().__init__(f"{what}: did not return within {seconds:g} s (per-call timeout, --kv-call-timeout)")


class _Deadline:
    """The call now running under the time limit, if any: SIGALRM's handler is installed once per process, and
    each call only arms and disarms the timer (two system calls: a call is made thousands of times a run)."""

    what: str | None = None
    seconds = 0.0

    @classmethod
    def expire(cls, signum: int, frame: Any) -> None:
        if cls.what is not None:
            raise AdapterHung(cls.what, cls.seconds)


def _arm(what: str, seconds: float) -> tuple[str | None, float] | None:
    """Start the time limit of the call ``what`` (SIGALRM: main thread, POSIX; elsewhere no limit); what
    ``_disarm`` needs to restore the limit of an enclosing call."""
    if seconds <= 0 or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGALRM) is not _Deadline.expire:
        signal.signal(signal.SIGALRM, _Deadline.expire)
    outer = (_Deadline.what, _Deadline.seconds)
    _Deadline.what, _Deadline.seconds = what, seconds
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return outer


def _disarm(outer: tuple[str | None, float] | None) -> None:
    if outer is not None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _Deadline.what, _Deadline.seconds = outer


class Inputs:
    """What one adapter call is handed: copies, checked afterwards against the originals.

    The suite's model, and so the oracle's view, holds the originals.
    """

    def __init__(self) -> None:
        self._handed: list[tuple[str, Any, Any]] = []

    def __call__(self, name: str, value: Any) -> Any:
        given = same_layout_copy(value) if isinstance(value, np.ndarray) else copy.deepcopy(value)
        self._handed.append((name, value, given))
        return given

    def check(self, what: str) -> None:
        for name, original, given in self._handed:
            if encode(given) != encode(original):
                raise NonConformance(f"{what}: the implementation modified its input {name} in place; "
                                     "inputs belong to the caller", kind="input modified in place", check=name)


def run(what: str, action: Callable[[], Any], inputs: Inputs | None = None) -> Outcome:
    """Run one adapter call within the time limit; its exception, if any, unmapped; then check its inputs."""
    armed = _arm(what, CALL_TIMEOUT)
    try:
        outcome = Outcome(value=action())
    except Exception as error:
        outcome = Outcome(error=error)
    except EngineDied as died:  # an isolated engine's death (protocol/isolation.py): shrunk like any failure
        raise NonConformance(f"{what}: {died}", kind=CRASH, check=died.cause) from died
    except EngineHung as hung:  # its own time limit: reported as the suite's is, unshrunk
        raise AdapterHung(what, hung.seconds) from hung
    finally:
        _disarm(armed)
    if inputs is not None:
        inputs.check(what)
    return outcome


def mapped(adapter: Any, what: str, outcome: Outcome) -> Outcome:
    """``outcome`` with its exception mapped to an ``ErrorKind`` by the adapter, or a non-conformance if
    ``error_kind`` maps it to nothing, to an unknown kind, or raises itself."""
    error = outcome.error
    if error is None:
        return outcome
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


def call(adapter: Any, what: str, action: Callable[[], Any], inputs: Inputs | None = None) -> Outcome:
    """``run`` and ``mapped``: a call whose exception must be one the adapter maps."""
    return mapped(adapter, what, run(what, action, inputs))
