"""Under ``-x`` (``--maxfail``): the first failure fast, wherever it is.

In the run order, a failure in the fifth machine waits for four machines to
pass in full first. So before the first machine property runs, each one gets a
short look instead, in the run order: ``LOOK_EXAMPLES`` examples of its main
search, nothing shrunk. The first whose look fails runs at once, in full: its
failing example, saved in the example database under the property's own key
(as a secondary example, so that it is shrunk), is the first it replays
(without a database, a derandomised profile draws it again as the look did).
If no look fails, the run goes on in its order, and the looks cost what they
cost: about a tenth of one pass.

Only in one process: xdist's workers take items as they come, so there is no
"first" to reorder (the plugin does not register this there).
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from hypothesis import Phase
from hypothesis import settings as Settings

from . import budget
from .runner import PropertyRun, RunResult, run_machine

LOOK_EXAMPLES = 10
FIXTURE = "conformance"


class Look(PropertyRun):
    """Stands in for the ``conformance`` fixture during a look: the gate and the main search, briefly; it
    records nothing, writes no trace and never raises what it finds."""

    failed = False
    looks_left = 1  # this one and those after it: under a budget, the looks share a part of it

    def record(self, name: str, value: Any) -> None:
        pass

    def run(self, machine: str, **parameters: Any) -> RunResult:
        searched, left_out = self.plan(machine, parameters)
        current = Settings()
        phases = tuple(p for p in current.phases if p not in (Phase.target, Phase.shrink))
        brief = Settings(current, max_examples=min(LOOK_EXAMPLES, current.max_examples), phases=phases,
                         report_multiple_bugs=False)
        result = run_machine(machine, self.adapter, property_id=self.property_id, parameters=searched,
                             requires=self.required, numbers=self.numbers, spec=self.spec, disabled_rules=left_out,
                             settings=brief, saves_as_secondary=True,
                             budget=budget.CURRENT.look_share(self.property_id, brief.max_examples, self.looks_left))
        self.failed = result.failure is not None
        return result


def _lookable(item: pytest.Item) -> bool:
    """A machine property whose every argument is a parameter or the fixture (and not expected to fail)."""
    if not isinstance(item, pytest.Function) or item.get_closest_marker("xfail") is not None:
        return False
    names = set(item.fixturenames) - {"request"}
    params = set(getattr(getattr(item, "callspec", None), "params", {}))
    return FIXTURE in names and names <= params | {FIXTURE}


def _fails_a_look(item: pytest.Function, looks_left: int = 1) -> bool:
    look = Look(item, None)
    look.looks_left = looks_left
    params = getattr(getattr(item, "callspec", None), "params", {})
    arguments = {name: params[name] for name in inspect.signature(item.obj).parameters if name != FIXTURE}
    try:
        item.obj(**arguments, **{FIXTURE: look})
    except pytest.skip.Exception:
        return False
    except Exception:  # an error of the property itself: the full run shows it
        return True
    return look.failed


class FirstFailure:
    """The plugin part registered under ``-x``."""

    def __init__(self) -> None:
        self.looked = False
        self.ran_ahead: set[str] = set()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        if item.nodeid in self.ran_ahead:
            return True  # already run, and reported
        if self.looked or not _lookable(item):
            return None
        self.looked = True
        items = item.session.items
        index = items.index(item)
        # What the previous item left set up must be part of the one run ahead too (pytest's SetupState).
        kept = set(items[index - 1].listchain()) & set(item.listchain()) if index else set()
        candidates = [i for i in items[index:] if _lookable(i)]
        for number, candidate in enumerate(candidates):
            assert isinstance(candidate, pytest.Function)
            if not _fails_a_look(candidate, len(candidates) - number):
                continue
            if candidate is item or not kept <= set(candidate.listchain()):
                return None
            candidate.ihook.pytest_runtest_protocol(item=candidate, nextitem=item)
            self.ran_ahead.add(candidate.nodeid)
            return True if item.session.shouldfail or item.session.shouldstop else None
        return None
