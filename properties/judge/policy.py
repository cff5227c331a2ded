"""The call policy of docs/spec.md §5, written once: every machine and replay judge a call through ``judge_call``.

1. A valid call must succeed; what it returns is the machine's to compare.
2. A call whose first failing check the adapter claims must raise exactly
   that check's kind, mapped by ``error_kind``.
3. Whatever the adapter declares, a call that raises -- typed or not, mapped
   or not -- must change nothing observable (``unchanged``).
4. A call accepted although its first failing check is not claimed is not
   judged: the object it was made on has unspecified contents from then on,
   and is replaced -- but first, where the machine says what it held
   (``Held``), every row held before the call must still be shown, unchanged
   (``kept``): an accepted append never rewrites what other positions rely on.

What the specification expects of each call is recorded in one vocabulary,
``Expect``, which traces hold and replay prints. A call is described by its
``Due``: the kind of its first failing check (None: valid), the capability
that claims it, and, for a valid call that may still be refused (a window
cache asked to truncate past what it evicted), the kind it may refuse with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from ..protocol.kinds import CLAIMED_BY, ErrorKind
from .calls import Inputs, mapped, run
from .checks import expect_rejection
from .failures import STATE_CHANGED, NonConformance

Observed = Mapping[str, Any]  # everything observable that a call must not change, by name: arrays or plain values
Record = Callable[..., None]  # the tape's ``expect``: writes what was expected of a call into the trace


class Expect(str, Enum):
    """What the specification expects of one call: the vocabulary of traces and of replay's output."""

    SUCCESS = "success"  # must return; the result is judged against the oracle
    REJECTION = "rejection"  # its first failing check is claimed: must raise that kind, and change nothing
    UNCLAIMED = "unclaimed"  # not claimed: if it raises, nothing changed; if it accepts, rows held kept, replaced
    SUCCESS_OR_REFUSAL = "success or refusal"  # may raise ``kind`` with nothing changed, or succeed and be judged
    STATE = "state"  # after a step: what everything observable must be


@dataclass(frozen=True)
class Due:
    """What the specification says of one call, before asking the adapter."""

    kind: ErrorKind | None = None  # the first failing check's kind; None: the call is valid
    claim: str | None = None  # the capability under which ``kind`` is judged
    may_refuse: ErrorKind | None = None  # a valid call that may still refuse with this kind, changing nothing

    @classmethod
    def check(cls, kind: ErrorKind | None, claim: str | None = None) -> Due:
        """The due of a call whose first failing check decides ``kind`` (None: valid), judged under ``claim``
        (by default the capability ``CLAIMED_BY`` names)."""
        if kind is None:
            return VALID
        return cls(kind, claim or CLAIMED_BY[kind].value)

    @classmethod
    def outside(cls, kind: ErrorKind) -> Due:
        """The due of a call outside what the specification judges (a whole model's shift past its positions):
        no capability claims it, so it is judged as an unclaimed check -- a refusal, any exception, changes
        nothing; an acceptance is not judged and its object is replaced. ``kind``: what a refusal would be."""
        return cls(kind, None)

    def expect(self, capabilities: frozenset[str]) -> Expect:
        if self.kind is None:
            return Expect.SUCCESS if self.may_refuse is None else Expect.SUCCESS_OR_REFUSAL
        return Expect.REJECTION if self.claim in capabilities else Expect.UNCLAIMED


VALID = Due()


@dataclass(frozen=True)
class Judged:
    """What became of a call: its value if it returned; ``replaced`` if it was accepted without a claim (the
    caller's object was replaced, and the value is not to be judged); ``refused`` if it raised as it was
    allowed to, changing nothing."""

    value: Any = None
    replaced: bool = False
    refused: bool = False

    @property
    def to_judge(self) -> bool:
        """Whether the call returned a result the machine must now compare with the oracle."""
        return not (self.replaced or self.refused)


def expected_entry(what: str, due: Due, capabilities: frozenset[str], **details: Any) -> dict[str, Any]:
    """The trace's record of what was expected of the call ``what`` (details: an output and its tolerance...)."""
    entry: dict[str, Any] = {"expect": due.expect(capabilities).value}
    kind = due.kind or due.may_refuse
    if kind is not None:
        entry["kind"] = kind.value
    if due.claim is not None:
        entry["claim"] = due.claim
    return {**entry, **details}


def judge_call(adapter: Any, capabilities: frozenset[str], record: Record, what: str, action: Callable[[], Any], *,
               due: Due = VALID, inputs: Inputs | None = None, observe: Callable[[], Observed] | None = None,
               replace: Callable[[], None] | None = None, held: Held | None = None, **details: Any) -> Judged:
    """Make one adapter call and judge it by §5 (the module's rules 1-4).

    ``observe`` reads what the call must not change if it raises (needed unless the call is valid);
    ``replace`` replaces the object of a call accepted without a claim (needed where the due check is not
    claimed); ``held``, what such a call must keep all the same. ``details`` go into the trace with the
    expectation."""
    __tracebackhide__ = True
    expect = due.expect(capabilities)
    record(what, **expected_entry(what, due, capabilities, **details))
    if expect is Expect.SUCCESS:
        outcome = mapped(adapter, what, run(what, action, inputs))
        if outcome.kind is not None:
            raise NonConformance(f"{what}: rejected with {outcome.kind.value} ({outcome.error}), but should succeed",
                                 kind=f"expected success, got {outcome.kind.value}", check="success")
        return Judged(outcome.value)
    assert observe is not None, f"{what}: a call that may raise needs what it must not change"
    before = observe()
    raw = run(what, action, inputs)
    if expect is Expect.UNCLAIMED:  # any exception will do, mapped or not; accepting is not judged
        if not raw.raised:
            assert replace is not None, f"{what}: an unclaimed check needs a way to replace what accepted it"
            if held is not None:
                kept(held, before, observe(), what)
            replace()
            return Judged(raw.value, replaced=True)
    else:
        outcome = mapped(adapter, what, raw)
        if expect is Expect.REJECTION:
            assert due.kind is not None
            expect_rejection(outcome, due.kind, what)
        elif not outcome.raised:
            return Judged(outcome.value)
        elif outcome.kind != due.may_refuse:
            assert due.may_refuse is not None
            raise NonConformance(f"{what}: rejected with {outcome.kind.value if outcome.kind else '?'} "
                                 f"({outcome.error}), but the only refusal allowed is {due.may_refuse.value}",
                                 kind=f"expected success or {due.may_refuse.value}, got "
                                      f"{outcome.kind.value if outcome.kind else '?'}", check=due.may_refuse.value)
    # The claimed check a refusal was judged under names the cause; an unclaimed one does not (the adapter never
    # said it makes that check): such a cause is named by what the call changed alone.
    checked = due.may_refuse if expect is Expect.SUCCESS_OR_REFUSAL else due.kind if expect is Expect.REJECTION \
        else None
    unchanged(before, observe(), what, check=checked.value if checked is not None else None)
    return Judged(refused=True)


def unchanged(before: Observed, after: Observed, what: str, *, kind: str = STATE_CHANGED,
              because: str = "a call that raised must change nothing", check: str | None = None) -> None:
    """Raise unless everything observed is as before: arrays byte for byte (shape and dtype too), the rest equal.

    The failure names every field that changed (``changed``, part of its cause), not only the first."""
    __tracebackhide__ = True
    differ = [name for name in dict.fromkeys([*before, *after])
              if not _same(before.get(name, _ABSENT), after.get(name, _ABSENT))]
    if differ:
        shown = "; ".join(_shown(name, before.get(name, _ABSENT), after.get(name, _ABSENT)) for name in differ)
        raise NonConformance(f"{what}: {shown}, but {because}", kind=kind, check=check, changed=tuple(differ))


def _shown(name: str, old: Any, new: Any) -> str:
    if not isinstance(old, np.ndarray) and not isinstance(new, np.ndarray) and len(repr(old)) + len(repr(new)) < 160:
        return f"{name} {old!r} -> {new!r}"
    return f"{name} changed"


_ABSENT = object()


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        return (isinstance(old, np.ndarray) and isinstance(new, np.ndarray) and old.shape == new.shape
                and old.dtype == new.dtype and old.tobytes() == new.tobytes())
    return bool(old == new)


ACCEPTED_CHANGED_HELD = "an accepted call changed a row held before it"


@dataclass(frozen=True)
class Held:
    """What a call accepted without the claim of its first failing check must keep all the same (docs/spec.md
    §5.5): ``rows`` names the rows an observation shows (by position, say); ``evicts``: a window may let rows go,
    but never change one it still shows."""

    rows: Callable[[Observed], Observed]
    evicts: bool = False


def kept(held: Held, before: Observed, after: Observed, what: str) -> None:
    """Raise unless every row held before an accepted unclaimed call is shown after it, byte for byte (but one a
    window let go)."""
    __tracebackhide__ = True
    old, new = held.rows(before), held.rows(after)
    for name, row in old.items():
        if name not in new and held.evicts:
            continue
        if name not in new or not _same(row, new[name]):
            raise NonConformance(f"{what}: accepted although its check is not claimed, and the {name} it held "
                                 f"before is {'gone' if name not in new else 'changed'}, but an accepted call must "
                                 "keep every row held before it", kind=ACCEPTED_CHANGED_HELD, check="rows held")
