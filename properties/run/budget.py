"""``--kv-budget``: one time budget for a whole run, shared by its machine properties; and progress on the terminal.

The deadline is fixed once, where the run starts (the pytest controller), and handed to xdist's workers
(``pytest_configure_node``, ``workerinput``): wall-clock time, the one clock separate processes share. Each
machine property, when it starts, gets a share of what is left: what is left divided by the machine properties
this process still expects to run (those it collected, divided among the workers, less those it has run). What
one property leaves unspent goes to the ones after it.

A machine run stops at the end of its share, before its next example: ``Share.before_example``, called by the
runner's machine factory, raises ``BudgetSpent``, a ``KeyboardInterrupt``. That is the one exception Hypothesis's
engine lets through as an interruption: it saves nothing for the example it interrupts and records nothing of
it (any other exception is saved as a failure, or taken for flaky data generation). So the example database
stays right -- nothing is saved for a run cut short, and a saved example is deleted only once it has replayed in
full and passed -- and nothing is shrunk. ``run_machine`` catches it at once. The budget never stops an example
halfway, never before the first example of a search (a saved counterexample replays first), and never once an
example has failed: shrinking has its own bound (``--kv-shrink-seconds``). An example the search for a further
cause discards, because it failed by a cause already found, is no failure of that search. A run may overrun its
budget by about one example per process, plus the shrinking and the cause search of a failure.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import reporting
from hypothesis.errors import UnsatisfiedAssumption

OPTION = "--kv-budget"
WORKER_KEY = "kv_budget_deadline"  # in xdist's workerinput: the controller's deadline, wall clock
FIRST_FAILURE_BUDGET = 10 * 60.0  # seconds; -x without --kv-budget: bounded even when nothing fails
LOOK_FRACTION = 0.25  # under -x, the looks at every machine may spend this much of what is left, together
PROGRESS_AFTER = 60.0  # seconds into the run before progress lines start
PROGRESS_EVERY = 30.0  # seconds between two progress lines of one property
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0}
_NO_BUDGET = ("0", "none", "off")


class BudgetError(ValueError):
    """A ``--kv-budget`` value that is not a duration."""


class BudgetSpent(KeyboardInterrupt):  # not an error: the property's time is up
    """Raised before an example once a property's share is spent; ``run_machine`` catches it. A KeyboardInterrupt,
    so that Hypothesis's engine treats it as an interruption: nothing saved, nothing shrunk, nothing recorded."""


def parse_duration(text: str) -> float | None:
    """Seconds in ``text``: ``"90"``, ``"90s"``, ``"10m"``, ``"1h30m"``, ``"2.5m"``; None for ``0``, ``none``,
    ``off`` (no budget). Anything else is a ``BudgetError`` saying what is accepted."""
    given = text.strip().lower()
    if given in _NO_BUDGET:
        return None
    if re.fullmatch(r"\d+(\.\d+)?", given):
        seconds = float(given)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", given)
        if not parts or "".join(f"{number}{unit}" for number, unit in parts) != given:
            raise BudgetError(f"{OPTION} {text!r}: expected a duration such as 90s, 10m, 1h30m or plain seconds "
                              f"(0, none or off: no budget)")
        seconds = sum(float(number) * _UNITS[unit] for number, unit in parts)
    if seconds <= 0 or not math.isfinite(seconds):
        raise BudgetError(f"{OPTION} {text!r}: a budget must be more than 0 seconds (0, none or off: no budget)")
    return seconds


def chosen(given: str | None, first_failure: bool) -> tuple[float | None, str]:
    """The run's budget in seconds (None: none) and how to name it: ``--kv-budget`` as given, else under ``-x``
    (``first_failure``) ``FIRST_FAILURE_BUDGET``, so that a run with no failure to stop at still ends."""
    if given is not None:
        return parse_duration(given), given
    if first_failure:
        return FIRST_FAILURE_BUDGET, f"{describe_seconds(FIRST_FAILURE_BUDGET)} (the default under -x)"
    return None, ""


def describe_seconds(seconds: float) -> str:
    """``75`` -> ``"1m15s"``: for people."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


@dataclass
class Progress:
    """Progress lines for runs longer than a minute: per property, examples done and time left."""

    speak: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)  # the run's start in this process
    after: float = PROGRESS_AFTER
    every: float = PROGRESS_EVERY
    label: str = ""  # the worker's name under xdist

    def due(self, last: float | None, now: float) -> bool:
        return now - self.started >= self.after and (last is None or now - last >= self.every)


@dataclass
class Share:
    """One property's share of the run's budget (``seconds`` None: no budget), and what its searches did."""

    property_id: str
    seconds: float | None
    max_examples: int
    given: str = ""  # the budget as the user wrote it, for messages
    progress: Progress | None = None
    started: float = field(default_factory=time.monotonic)
    examples: int = 0  # examples of the search in progress (or the last one)
    stopped: bool = False  # a search was cut short by the budget
    failed: bool = False  # an example of the search in progress failed: the budget no longer stops it
    spent_before_start: bool = False  # nothing was left for this property
    _said: float | None = None

    def start_search(self) -> None:
        self.examples, self.failed = 0, False

    def left(self, now: float | None = None) -> float | None:
        if self.seconds is None:
            return None
        return self.seconds - ((time.monotonic() if now is None else now) - self.started)

    def before_example(self, done: int, failed: bool = False) -> None:
        """Called before each example with the examples done so far in this search: raise ``BudgetSpent`` once the
        share is spent (never before the first, never after a failure); say how far it is, now and then."""
        self.examples = done
        self.failed = self.failed or failed
        now = time.monotonic()
        if self.progress is not None and done and self.progress.due(self._said, now):
            self._said = now
            self.progress.speak(self.progress_line(now))
        left = self.left(now)
        if left is not None and left <= 0 and done >= 1 and not self.failed:
            self.stopped = True
            raise BudgetSpent(self.property_id)

    def watch(self, machine: Any) -> None:
        """Note a failure of any kind (a suite error too) in ``machine``'s run, which Hypothesis then shrinks: its
        ``teardown`` runs while the exception propagates."""
        teardown = machine.teardown

        def noting_failures() -> None:
            error = sys.exc_info()[1]
            if isinstance(error, Exception) and not isinstance(error, UnsatisfiedAssumption):
                self.failed = True
            teardown()

        machine.teardown = noting_failures

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """Hypothesis reports an interrupted run's seed "to reproduce this failure": a budget stop is no failure."""
        report = reporting.current_reporter()

        def reporter(text: object) -> None:
            if not (self.stopped and str(text).lstrip().startswith("You can reproduce this failure")):
                report(text)

        with reporting.with_reporter(reporter):
            yield

    def progress_line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        done = self.examples
        pace = elapsed / done if done else None
        expected = None if pace is None else pace * max(0, self.max_examples - done)
        left = self.left(now)
        if left is not None:
            ends = (f"{describe_seconds(max(left, 0))} of its {describe_seconds(self.seconds or 0)} share left"
                    + ("" if expected is None or expected > left else
                       f" (about {describe_seconds(expected)} needed at this pace)"))
        else:
            ends = "time left unknown" if expected is None else f"about {describe_seconds(expected)} left at this pace"
        where = f"[{self.progress.label}] " if self.progress and self.progress.label else ""
        return (f"kvcache {where}{self.property_id.rpartition('::')[2]}: {done}/{self.max_examples} examples in "
                f"{describe_seconds(elapsed)}, {ends}")

    def facts(self, examples: int | None = None) -> dict[str, Any]:
        """What the report keeps (``kv_budget``)."""
        return {"budget": self.given or None, "share_seconds": None if self.seconds is None else round(self.seconds, 1),
                "examples": self.examples if examples is None else examples, "max_examples": self.max_examples,
                "seconds": round(time.monotonic() - self.started, 1), "stopped": self.stopped,
                "spent_before_start": self.spent_before_start}

    def verdict(self, examples: int) -> str:
        """Why a property cut short is no pass, for the terminal and the report."""
        if self.spent_before_start:
            return (f"not started: the run's budget ({OPTION} {self.given}) was spent before its turn -- not a pass "
                    f"(a larger budget runs it)")
        return (f"cut short by the run's budget ({OPTION} {self.given}): {examples} of {self.max_examples} examples in "
                f"{describe_seconds(time.monotonic() - self.started)}, no failure among them -- not a full pass "
                "(a larger budget runs more)")


@dataclass
class RunBudget:
    """The run's budget in this process: the deadline (wall clock; None: no budget) and the properties to share it."""

    deadline: float | None = None
    given: str = ""
    workers: int = 1
    expected: int = 0  # machine properties this process collected
    started: int = 0  # machine properties this process has given a share
    progress: Progress | None = None

    @classmethod
    def starting_now(cls, seconds: float | None, given: str, **values: Any) -> RunBudget:
        return cls(deadline=None if seconds is None else time.time() + seconds, given=given, **values)

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()

    def share(self, property_id: str, max_examples: int) -> Share:
        """The next property's share: what is left over what this process still expects to run."""
        self.started += 1
        left = self.left()
        if left is None:
            return Share(property_id, None, max_examples, self.given, self.progress)
        remaining = max(1, math.ceil(self.expected / max(1, self.workers)) - (self.started - 1))
        share = Share(property_id, max(0.0, left) / remaining, max_examples, self.given, self.progress)
        share.spent_before_start = share.stopped = left <= 0
        return share

    def look_share(self, property_id: str, max_examples: int, looks_left: int) -> Share:
        """Under ``-x``: a look's share, so that the looks at every machine together spend at most
        ``LOOK_FRACTION`` of what is left (the property runs after them share the rest)."""
        left = self.left()
        seconds = None if left is None else max(0.0, left) * LOOK_FRACTION / max(1, looks_left)
        return Share(property_id, seconds, max_examples, self.given, self.progress)


CURRENT = RunBudget()  # this process's; the plugin installs the run's


def install(budget: RunBudget) -> None:
    global CURRENT
    CURRENT = budget


def summary_lines(given: str, cut: list[tuple[str, dict[str, Any]]], properties: int,
                  causes_cut: Sequence[str] = ()) -> list[str]:
    """The terminal's account of the budget: which properties it cut short, with what they ran, and which failures'
    cause search it stopped (their other causes may be unfound)."""
    also = [f"budget {given} ({OPTION}) stopped the cause search of {nodeid}: it may have more causes"
            for nodeid in causes_cut]
    if not cut:
        return [f"budget {given} ({OPTION}): every machine property that ran finished its examples", *also]
    lines = [f"budget {given} ({OPTION}): {len(cut)} of {properties} machine properties cut short -- not full passes:"]
    for nodeid, facts in cut:
        done = ("not started" if facts.get("spent_before_start") else
                f"{facts.get('examples')} of {facts.get('max_examples')} examples in "
                f"{describe_seconds(facts.get('seconds') or 0)}")
        lines.append(f"  {nodeid}: {done}")
    lines.append(f"a larger {OPTION} runs more of them; docs/adapters.md \"Sizing a run\" says how to choose it")
    return lines + also


class BudgetPlugin:
    """The pytest side: the deadline fixed once and handed to xdist's workers, each process's count of machine
    properties, progress lines, and the terminal's summary (on the controller)."""

    def __init__(self, config: Any, seconds: float | None, given: str, fixture: str) -> None:
        self.config, self.fixture = config, fixture
        worker = getattr(config, "workerinput", None)
        progress = Progress(self._speak, label=str(worker.get("workerid", "")) if worker else "")
        if worker is not None:  # the controller's deadline, not one of our own
            install(RunBudget(deadline=worker.get(WORKER_KEY), given=given, workers=int(worker.get("workercount", 1)),
                              progress=progress))
        else:
            install(RunBudget.starting_now(seconds, given, progress=progress))
        self.cut: dict[str, dict[str, Any]] = {}
        self.causes_cut: set[str] = set()
        self.ran: set[str] = set()

    def _speak(self, text: str) -> None:
        capture = self.config.pluginmanager.getplugin("capturemanager")
        terminal = self.config.pluginmanager.getplugin("terminalreporter")
        with capture.global_and_fixture_disabled() if capture is not None else _nothing():
            if terminal is not None and not hasattr(self.config, "workerinput"):
                terminal.write_line(text)
            else:  # an xdist worker's stderr is the terminal's
                sys.stderr.write(text + "\n")
                sys.stderr.flush()

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:  # xdist, on the controller: the one deadline
        node.workerinput[WORKER_KEY] = CURRENT.deadline

    def pytest_collection_finish(self, session: Any) -> None:
        CURRENT.expected = sum(1 for item in session.items if self.fixture in getattr(item, "fixturenames", ()))

    def pytest_runtest_logreport(self, report: Any) -> None:
        recorded = dict(report.user_properties)
        facts = recorded.get("kv_budget")
        if recorded.get("kv_budget_cut_searches") and report.failed:
            self.causes_cut.add(report.nodeid)
        if facts is not None:
            self.ran.add(report.nodeid)
            if facts.get("stopped"):
                self.cut[report.nodeid] = facts

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if CURRENT.deadline is None or hasattr(self.config, "workerinput"):
            return
        terminalreporter.write_sep("-", "kvcache budget")
        for line in summary_lines(CURRENT.given, sorted(self.cut.items()), len(self.ran), sorted(self.causes_cut)):
            terminalreporter.write_line(line)


@contextmanager
def _nothing() -> Iterator[None]:
    yield
