"""Verdicts about the implementation, kept apart from bugs of the suite itself.

``NonConformance`` is the only exception a property raises about the
implementation under test, and it always says what kind of failure it is:
``kind`` is short and the same for every step (``"output mismatch"``,
``"expected full, got success"``), ``check`` names the check that failed
(the claimed error kind a call was due, or what was compared), and
``changed`` what a call that raised changed. A failure's ``Cause`` is made of
these fields, never of the words of a message: the runner's search for every
cause and the report tell causes apart by it. Anything else escaping a
property is a suite bug (``kind_of``).
"""

from __future__ import annotations

import unittest
from dataclasses import dataclass
from typing import Any

from hypothesis.errors import Flaky

STATE_CHANGED = "state changed by a call that raised"


class NonConformance(AssertionError):
    """The implementation under test did not do what the specification requires."""

    raised = 0  # how many were ever made in this process (the runner tells failing runs apart with it)

    def __init__(self, message: str, *, kind: str, check: str | None = None, changed: tuple[str, ...] = ()) -> None:
        if not kind:
            raise TypeError("a NonConformance needs its kind: the report groups causes by it")
        type(self).raised += 1
        super().__init__(message)
        self.kind, self.check, self.changed = kind, check, tuple(changed)


class SuiteError(Exception):
    """The suite failed while judging (an oracle or harness exception): a bug of the suite, with the trace of the
    run that met it -- never a verdict about the implementation. The report gives it an outcome of its own."""

    def __init__(self, message: str, *, cause: BaseException) -> None:
        super().__init__(message)
        self.kind = kind_of(cause)


def kind_of(error: BaseException) -> str:
    """The failure kind of anything a property raised: a non-conformance's own, else what went wrong in the suite."""
    if isinstance(error, (NonConformance, SuiteError)):
        return error.kind
    if isinstance(error, Flaky):
        return "flaky: the failure did not reproduce"
    if type(error).__name__ == "UsageError":  # pytest's: a known-failures entry that does not fit this machine
        return "usage error"
    return f"suite error ({type(error).__name__})"  # anything but a NonConformance is a bug of the suite


def is_suite_error(error: BaseException) -> bool:
    """Whether ``error`` is a bug of the suite (not a non-conformance, nor a flaky or misused run)."""
    # SkipTest: Hypothesis's own word that it ran nothing (no example to replay): a skip, not an error
    return isinstance(error, Exception) and not isinstance(error, (NonConformance, Flaky, unittest.SkipTest)) and \
        type(error).__name__ != "UsageError"


def check_of(error: BaseException) -> str | None:
    return error.check if isinstance(error, NonConformance) else None


@dataclass(frozen=True)
class Cause:
    """What tells two failures apart: their kind, the check that failed, and what a call that raised changed.

    Two bugs failing one check are two causes when they change different things (one advances the length
    before a write that fails, another writes the rows first); one bug reached through several rules is one.
    ``changed`` holds the kinds of field only (``block rows``, not ``block 3 keys``): which block a program
    happened to touch does not make another bug, and neither does whether a row written showed in its key, its
    value or both -- a key and a value are written together, and a zero written over a zero shows in neither."""

    kind: str
    check: str | None = None
    changed: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """What failed, for people: named by what changed where a call that raised changed something, and by
        the check only where the adapter claims it (an unclaimed check has no name in a verdict)."""
        if self.changed:
            what = f"a call that raised changed {_listed(self.changed)}"
            return f"{what} (claimed check: {self.check})" if self.check else what
        return f"{self.kind} ({self.check})" if self.check else self.kind

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "check": self.check, "changed": list(self.changed), "label": self.label}


def cause_of(error: BaseException) -> Cause:
    if isinstance(error, NonConformance):
        return Cause(error.kind, error.check, tuple(dict.fromkeys(field_kind(name) for name in error.changed)))
    return Cause(kind_of(error))


ROW_FIELDS = ("keys", "values")  # one row, written as a key and a value: what changed names it "rows"


def field_kind(name: str) -> str:
    """An observed field's kind, for a cause's identity: its name without indices, keys and values as rows
    (``block 3 keys`` -> ``block rows``, ``physical values`` -> ``physical rows``)."""
    words = [word for word in name.split() if not word.isdigit()]
    return " ".join([*words[:-1], "rows"] if words and words[-1] in ROW_FIELDS else words)


def _listed(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
