"""Verdicts about the implementation, kept apart from bugs of the suite itself.

``NonConformance`` is the only exception a property raises about the
implementation under test, and it always says what kind of failure it is:
``kind`` is short and the same for every step (``"output mismatch"``,
``"expected full, got success"``), ``check`` names the check that failed
(the error kind a call was due, or what was compared). The report groups
failures into causes by these fields, never by the words of a message.
Anything else escaping a property is a suite bug (``kind_of``).
"""

from __future__ import annotations

from hypothesis.errors import Flaky

STATE_CHANGED = "state changed by a call that raised"


class NonConformance(AssertionError):
    """The implementation under test did not do what the specification requires."""

    raised = 0  # how many were ever made in this process (the runner tells failing runs apart with it)

    def __init__(self, message: str, *, kind: str, check: str | None = None) -> None:
        if not kind:
            raise TypeError("a NonConformance needs its kind: the report groups causes by it")
        type(self).raised += 1
        super().__init__(message)
        self.kind, self.check = kind, check


def kind_of(error: BaseException) -> str:
    """The failure kind of anything a property raised: a non-conformance's own, else what went wrong in the suite."""
    if isinstance(error, NonConformance):
        return error.kind
    if isinstance(error, Flaky):
        return "flaky: the failure did not reproduce"
    if type(error).__name__ == "UsageError":  # pytest's: a known-failures entry that does not fit this machine
        return "usage error"
    return f"suite error ({type(error).__name__})"  # anything but a NonConformance is a bug of the suite


def check_of(error: BaseException) -> str | None:
    return error.check if isinstance(error, NonConformance) else None
