"""What a run exercised: per machine and rule, how often each ran, how its judged calls ended, and the interesting
cases it met -- so that a pass says what it was a pass of.

The counting is the machine base's (``machines.base.ConformanceMachine.call`` sees every judged call, and rules
note their cases with ``exercised``); here it is added up: over every example of a property run (``Tally``, fed by
the runner with each machine Hypothesis built), carried in the property's ``kv_exercise`` user property (JSON, so
that xdist takes it to the controller), merged over properties in the report (``summary``) and on the terminal
(``ExerciseSummary``). A declared capability that no rule needing it ran and no rejection it claims was met is
listed as never exercised.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from ..machines import MACHINES
from ..machines.base import CALL_OUTCOMES
from ..protocol.kinds import CLAIMED_BY, declared
from ..traces.recording import TracedMachine

RAN = "ran"
OUTCOMES = (RAN, *CALL_OUTCOMES)  # the columns every rule has; the rest are the rules' own cases
# what a property's run can tell it exercised: a capability some rule needs, or one that claims a check
EXERCISABLE = frozenset({c for cls in MACHINES.values() for spec in cls.specs().values() for c in spec.requires}
                        | {claim.value for claim in CLAIMED_BY.values()})


class Tally:
    """One property's counts, over every machine (example) it built."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()  # (rule, outcome or case) -> times
        self.capabilities: Counter[str] = Counter()  # capability -> rules run needing it, and rejections it claims

    def add(self, machine: TracedMachine) -> None:
        specs = machine.specs()
        for step in machine.tape.steps:
            self.counts[(step.rule, RAN)] += 1
            spec = specs.get(step.rule)
            self.capabilities.update(spec.requires if spec is not None else ())
        self.counts.update(getattr(machine, "exercise", {}))
        self.capabilities.update(getattr(machine, "claims_rejected", {}))

    def __bool__(self) -> bool:
        return bool(self.counts)

    def to_json(self, machine: str) -> dict[str, Any]:
        rules: dict[str, dict[str, int]] = {}
        for (rule, what), times in sorted(self.counts.items()):
            rules.setdefault(rule, {})[what] = times
        return {"machine": machine, "rules": rules, "capabilities": dict(sorted(self.capabilities.items()))}


def merged(documents: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """Several ``to_json`` documents (or merged ones) as one: ``{"machines": {machine: {rule: {what: times}}},
    "capabilities": {capability: times}}``."""
    machines: dict[str, dict[str, Counter[str]]] = {}
    capabilities: Counter[str] = Counter()
    for document in documents:
        if not document:
            continue
        if "machines" in document:  # merged already
            parts = [(name, rules) for name, rules in document["machines"].items()]
        else:
            parts = [(str(document["machine"]), document["rules"])]
        for name, rules in parts:
            for rule, counts in rules.items():
                machines.setdefault(name, {}).setdefault(rule, Counter()).update(counts)
        capabilities.update(document.get("capabilities", {}))
    return {"machines": {name: {rule: dict(sorted(counts.items())) for rule, counts in sorted(rules.items())}
                         for name, rules in sorted(machines.items())},
            "capabilities": dict(sorted(capabilities.items()))}


def summary(entries: Iterable[Mapping[str, Any]], declared_capabilities: Iterable[str]) -> dict[str, Any]:
    """The report's exercise section: every property's counts merged, and the declared capabilities never
    exercised (only where some property ran a machine: a run of other tests says nothing of them)."""
    total = merged(entry.get("exercise") for entry in entries)
    ran = bool(total["machines"])
    never = sorted((declared(declared_capabilities) & EXERCISABLE) - set(total["capabilities"])) if ran else []
    return {**total, "never_exercised": never}


def never_ran(machine: str, rules: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The rules of ``machine`` no example ran (a rule the declarations never allow is one of them)."""
    cls = MACHINES.get(machine)
    return [] if cls is None else sorted(name for name, spec in cls.specs().items() if spec.kind == "rule"
                                         and not rules.get(name, {}).get(RAN))


def cases(rules: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The interesting cases any of ``rules`` met, in a stable order."""
    return sorted({what for counts in rules.values() for what in counts if what not in OUTCOMES})


def markdown(section: Mapping[str, Any]) -> list[str]:
    """The exercise tables: one per machine, a row per rule, a column per call outcome and per case met."""
    if not section.get("machines"):
        return []
    lines = ["## What the run exercised", "",
             "Per machine and rule, over every example: how often it ran (runs: a rule that sets up a chain makes "
             "several calls in one run), how its judged calls ended (rejected: a claimed check raised its kind; "
             "refused: an allowed refusal; raised: an unclaimed check raised; replaced: an unclaimed input "
             "accepted, the object replaced), and the interesting cases it met.", ""]
    for machine, rules in section["machines"].items():
        columns = [*OUTCOMES, *cases(rules)]
        headers = ["runs", *(f"calls {o}" for o in CALL_OUTCOMES), *(f"met: {c}" for c in cases(rules))]
        lines += [f"### `{machine}`", "", "| rule | " + " | ".join(headers) + " |",
                  "|---|" + "---|" * len(columns)]
        lines += [f"| `{rule}` | " + " | ".join(str(counts.get(c, 0) or "") for c in columns) + " |"
                  for rule, counts in rules.items()]
        lines += [f"| `{rule}` | 0 |" + " |" * (len(columns) - 1) for rule in never_ran(machine, rules)
                  if rule not in rules]
        lines.append("")
    if section.get("never_exercised"):
        lines += ["**Declared but never exercised** (no rule needing it ran, no rejection it claims was met): "
                  + ", ".join(f"`{c}`" for c in section["never_exercised"]), ""]
    return lines


def terminal_lines(section: Mapping[str, Any]) -> list[str]:
    """A short summary: per machine, the steps run and the calls by outcome, the cases met, and what was never
    exercised."""
    lines = []
    for machine, rules in section.get("machines", {}).items():
        totals: Counter[str] = Counter()
        for counts in rules.values():
            totals.update(counts)
        calls = ", ".join(f"{totals[o]} {o}" for o in CALL_OUTCOMES if totals[o])
        met = ", ".join(f"{what} {totals[what]}" for what in cases(rules))
        idle = never_ran(machine, rules)
        shown = ", ".join(idle) if len(idle) <= 3 else f"{', '.join(idle[:3])} and {len(idle) - 3} more"
        lines.append(f"{machine}: {totals[RAN]} steps of {sum(1 for c in rules.values() if c.get(RAN))} rules"
                     + (f" (never ran: {shown})" if idle else "") + f"; calls {calls or 'none'}"
                     + (f"; met: {met}" if met else ""))
    if section.get("never_exercised"):
        lines.append(f"declared but never exercised: {', '.join(section['never_exercised'])}")
    return lines


class ExerciseSummary:
    """On the controller: every property's exercise counts, as its reports arrive (from xdist workers too), and
    a short summary at the end of the run."""

    def __init__(self, capabilities: Iterable[str]) -> None:
        self.capabilities = frozenset(capabilities)
        self.by_property: dict[str, Mapping[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        found = dict(report.user_properties).get("kv_exercise")
        if isinstance(found, Mapping):
            self.by_property[report.nodeid] = found  # the last report's: the property's whole run

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        lines = terminal_lines(summary(({"exercise": e} for e in self.by_property.values()), self.capabilities))
        if lines:
            terminalreporter.section("kvcache: what the run exercised")
            for line in lines:
                terminalreporter.write_line(line)
