"""``pytest --kv-report PATH``: what the suite found, as JSON for machines and Markdown for people.

Collected on the pytest controller from every test's reports (xdist workers
send theirs, with the ``kv_*`` user properties ``PropertyRun`` records), and
written once the session ends: ``PATH`` (JSON) and ``PATH`` with suffix
``.md`` (a table).

A test's outcome is decided by its call phase, or by a skip or failure in
set-up or teardown; a test that never finished its call is ``unfinished``,
one collected but never started ``not run`` -- never passed. A run stopped
by Ctrl-C or SIGTERM (the plugin makes SIGTERM a KeyboardInterrupt on the
controller) still writes the report, ``"complete": false``, before xdist
tears its workers down.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ..judge.failures import Cause
from ..judge.tolerance import Judge
from . import exercise, selection
from .identity import canonical
from .provenance import environment_facts, implementation_facts

REPORT_FORMAT = "kvcache-conformance-report"
REPORT_VERSION = 5  # 2: outcomes xfailed, xpassed, unfinished, not run; complete, stopped, traces, causes
# 3: the outcome cut short (by --kv-budget) and the budget; 4: exercise, suite_checks (the summary counts only
# verdicts about the implementation); 5: rules (runs per tolerance rule applied: a float64 model's depends on the
# model drawn), each property's too, and a property's rule is its worst comparison's
# "suite error": the suite failed while judging (judge.failures.SuiteError), no verdict about the implementation
OUTCOMES = ("passed", "failed", "suite error", "xfailed", "xpassed", "skipped", "cut short", "unfinished", "not run")
_FINISHED = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.NO_TESTS_COLLECTED)


class ConformanceReport:
    """A pytest plugin: one entry per test, decided by its call phase (or a skip/failure around it)."""

    def __init__(self, path: Path, known_failures: Path | None = None) -> None:
        self.path, self.known_failures = path, known_failures
        self.properties: dict[str, dict[str, Any]] = {}
        self.collected: dict[str, None] = {}  # node ids of the run, in order
        self.stopped: str | None = None  # why the run ended early, if it did
        self.collection_errors: list[str] = []
        self.written = False
        self._terminated = False
        self._installed = False
        self._previous_handler: Any = None

    # -- SIGTERM is a KeyboardInterrupt, so that pytest_sessionfinish runs ---------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._terminate)
            self._installed = True

    def _terminate(self, signum: int, frame: Any) -> None:
        if self._terminated and not self.written:
            return  # a second SIGTERM while the report is written: finish writing it first
        self._terminated = True
        raise KeyboardInterrupt("SIGTERM")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._installed:  # None: a handler not set from Python; the default is the closest we can restore
            signal.signal(signal.SIGTERM, self._previous_handler if self._previous_handler is not None
                          else signal.SIG_DFL)
            self._installed = False

    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        text = str(excinfo.value).strip()
        self.stopped = "SIGTERM" if self._terminated else (text or "KeyboardInterrupt (SIGINT, Ctrl-C)")

    # -- what the run holds, and what became of it -------------------------------------------------------

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:  # (under xdist: each distinct one, as the controller shows it)
            self.collection_errors.append(f"{report.nodeid}: {_first_line(report)}")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected.update(dict.fromkeys(canonical(item.nodeid) for item in session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        self.collected.update(dict.fromkeys(map(canonical, ids)))  # under xdist the controller collects nothing

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        name = canonical(report.nodeid)
        entry = self.properties.setdefault(name, {"property": name, "outcome": "unfinished", "reason": None,
                                                  "seconds": 0.0})
        entry["seconds"] += report.duration
        for name, value in report.user_properties:
            if name.startswith("kv_"):
                entry[name[3:]] = value
        decided = _decided(report)
        if decided is not None and decided[0] == "skipped" and (entry.get("budget") or {}).get("stopped"):
            decided = ("cut short", decided[1])  # by --kv-budget: what ran passed, and that is no pass
        if decided is not None and not (report.when == "teardown" and entry["outcome"] != "passed"):
            entry["outcome"], entry["reason"] = decided
            if decided[0] in ("failed", "skipped") and entry.get("suite_error"):
                entry["outcome"] = "suite error"
            if entry["outcome"] == "xfailed" and getattr(report.longrepr, "reprcrash", None) is not None:
                entry["failure"] = _first_line(report)

    @pytest.hookimpl(tryfirst=True)  # before xdist tears the workers down (a busy one takes seconds)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.stopped is None and exitstatus not in _FINISHED:
            try:
                self.stopped = f"pytest exit status {int(exitstatus)} ({pytest.ExitCode(exitstatus).name})"
            except ValueError:
                self.stopped = f"pytest exit status {exitstatus}"
        if self.stopped is None and (session.shouldfail or session.shouldstop):
            self.stopped = str(session.shouldfail or session.shouldstop)
        if self.stopped is None and self.collection_errors:
            self.stopped = f"{len(self.collection_errors)} error(s) during collection"
        document = self.document(session.config)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _write(self.path, json.dumps(document, indent=1) + "\n")
        _write(self.path.with_suffix(".md"), markdown(document))
        self.written = True

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        state = "" if not self.written or self._complete() else " (incomplete run)"
        terminalreporter.write_line(f"kvcache conformance report{state}: {self.path} and "
                                    f"{self.path.with_suffix('.md')}")

    def _entries(self) -> list[dict[str, Any]]:
        entries = dict(self.properties)
        for nodeid in self.collected:
            entries.setdefault(nodeid, {"property": nodeid, "outcome": "not run", "reason": None, "seconds": 0.0})
        return sorted(entries.values(), key=lambda e: e["property"])

    def _complete(self) -> bool:
        return self.stopped is None and not any(e["outcome"] in ("unfinished", "not run") for e in self._entries())

    def document(self, config: pytest.Config) -> dict[str, Any]:
        adapter = selection.selected()
        current = settings.default
        entries = self._entries()
        verdicts = [e for e in entries if not e.get("suite_check")]  # the suite's self-checks are no verdict
        checks = [e for e in entries if e.get("suite_check")]
        return {
            "format": REPORT_FORMAT,
            "format_version": REPORT_VERSION,
            "complete": self._complete(),
            "stopped": self.stopped,
            "collection_errors": self.collection_errors,
            "suite": {k.removeprefix("suite_"): v for k, v in environment_facts().items() if k.startswith("suite_")},
            "implementation": implementation_facts(adapter, selection.selected_spec()),
            "environment": {"python": platform.python_version(), "platform": platform.platform(),
                            **{k: v for k, v in environment_facts().items() if k in ("numpy", "hypothesis")}},
            "profile": {"name": settings.get_current_profile_name(), "max_examples": current.max_examples,
                        "stateful_step_count": current.stateful_step_count, "derandomize": current.derandomize},
            "oracle": selection.oracle_name(),
            "rule": Judge.for_adapter(adapter, selection.oracle_numbers()).rule,
            "rules": rules_applied(entries),
            "known_failures": str(self.known_failures) if self.known_failures else None,
            "summary": {o: sum(1 for e in verdicts if e["outcome"] == o) for o in OUTCOMES},
            "suite_checks": {o: sum(1 for e in checks if e["outcome"] == o) for o in OUTCOMES},
            "exercise": exercise.summary(verdicts, adapter.capabilities),
            "budget": budget_of(entries),
            "causes": causes(entries),
            "suite_errors": suite_errors(entries),
            "cause_searches_bounded": bounded_searches(entries),
            "traces": sorted({e["trace"] for e in entries if e.get("trace")}),
            "properties": entries,
        }


def budget_of(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``--kv-budget`` as the run had it (None: no budget), and what it cut short: properties whose main search
    stopped before its examples were done, and failures whose cause search it stopped."""
    given = next((e["budget"]["budget"] for e in entries if (e.get("budget") or {}).get("budget")), None)
    if given is None:
        return None
    return {"given": given,
            "cut_short": [e["property"] for e in entries if e["outcome"] == "cut short"],
            "cause_search_cut": [e["property"] for e in entries if e["outcome"] == "failed"
                                 and e.get("budget_cut_searches")]}


def _decided(report: pytest.TestReport) -> tuple[str, str | None] | None:
    """(outcome, reason) if this phase decides the test's outcome: the call always, set-up and teardown
    only by a skip or a failure."""
    known = getattr(report, "wasxfail", None)
    if report.when == "call" and report.passed:
        return ("xpassed", f"a known failure passed: {known}") if known is not None else ("passed", None)
    if report.skipped:
        return ("xfailed", known) if known is not None else ("skipped", _skip_reason(report))
    if report.failed:
        if report.when == "call" and isinstance(report.longrepr, str) and report.longrepr.startswith("[XPASS"):
            return "xpassed", f"a known failure passed (fixed? remove it from the file): {report.longrepr}"
        where = "" if report.when == "call" else f"error in {report.when}: "
        return "failed", where + _first_line(report)
    return None


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    return longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)


def _write(path: Path, text: str) -> None:
    """Replace ``path`` at once: a second signal never leaves half a report."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def rules_applied(entries: list[dict[str, Any]]) -> dict[str, int]:
    """Runs per tolerance rule, over every property: the adapter's rule, and any other a drawn case was judged by
    (docs/spec.md §15.6: a float64 model whose own rounding may come near the absolute bound)."""
    total: Counter[str] = Counter()
    for entry in entries:
        total.update(entry.get("rules") or {})
    return dict(total.most_common())


def causes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Failures grouped into distinct causes: (property without its parameters, rule of the failing step, failure
    kind, claimed check, what a call that raised changed) -- fields the failures carry (``judge.failures.Cause``),
    never the words of their messages; the other rules a cause was met in are listed with it. Known failures
    (xfailed) count too, apart: what the baseline hides stays visible."""
    groups: dict[tuple[str, str, str, str, tuple[str, ...]], dict[str, Any]] = {}
    for entry in entries:
        if entry["outcome"] not in ("failed", "xfailed"):
            continue
        message = entry.get("failure") or entry.get("reason") or ""
        found = entry.get("causes") or [{
            "rule": entry.get("rule_failed"), "check": entry.get("failure_check"), "trace": entry.get("trace"),
            "kind": entry.get("failure_kind") or ("failed outside the property" if entry["outcome"] == "failed"
                                                  else "known failure"), "message": message.split("\n")[0]}]
        # a corpus trace is a cause of its own: its property keeps its parameters (the trace's name)
        function = entry["property"] if entry.get("cause_per_instance") else re.sub(r"\[.*\]$", "", entry["property"])
        for found_cause in found:
            if found_cause.get("suite_error"):  # a bug of the suite: listed apart (suite_errors)
                continue
            changed = tuple(found_cause.get("changed") or ())
            label = found_cause.get("label") or Cause(found_cause["kind"], found_cause.get("check"), changed).label
            key = (function, found_cause.get("rule") or "", found_cause["kind"], found_cause.get("check") or "",
                   changed)
            cause = groups.setdefault(key, {"property": function, "rule": found_cause.get("rule"), "rules": [],
                                            "kind": found_cause["kind"], "check": found_cause.get("check"),
                                            "changed": list(changed), "label": label,
                                            "failed": 0, "known": 0, "instances": [], "traces": [],
                                            "example": found_cause.get("message") or message.split("\n")[0]})
            cause["failed" if entry["outcome"] == "failed" else "known"] += 1
            cause["instances"].append(entry["property"])
            for rule in [found_cause.get("rule"), *found_cause.get("also_in", ())]:
                if rule and rule not in cause["rules"]:
                    cause["rules"].append(rule)
            if found_cause.get("trace"):
                cause["traces"].append(found_cause["trace"])
    return sorted(groups.values(), key=lambda c: (-c["failed"], c["property"], c["rule"] or "", c["kind"],
                                                  c["check"] or "", c["changed"]))


def suite_errors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every suite error met, with its property and trace: bugs of the suite, never counted as the
    implementation's failures."""
    listed = [{"property": e["property"], "kind": cause["kind"], "message": cause.get("message"),
               "trace": cause.get("trace")}
              for e in entries for cause in e.get("causes") or () if cause.get("suite_error")]
    searched = {error["property"] for error in listed}
    return listed + [{"property": e["property"], "kind": e.get("failure_kind") or "suite error",  # (no search: a
                      "message": (e.get("reason") or "").split("\n")[0], "trace": e.get("trace")}  # replayed trace)
                     for e in entries if e["outcome"] == "suite error" and e["property"] not in searched]


def bounded_searches(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failing properties whose search for causes stopped at a bound (more causes may be behind)."""
    return [{"property": e["property"], **e["cause_search"]} for e in entries
            if e.get("cause_search", {}).get("bound")]


def examples_from_statistics(described: str) -> int | None:
    """Examples a ``@given`` test ran, summed over phases, from Hypothesis's statistics text; None if unknown."""
    counts = re.findall(r"(\d+) passing, (\d+) failing, and (\d+) invalid", described)
    return sum(int(p) + int(f) + int(i) for p, f, i in counts) if counts else None


def _first_line(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.splitlines()[0] if text else "failed"


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def markdown(document: dict[str, Any]) -> str:
    impl, env, profile = document["implementation"], document["environment"], document["profile"]
    suite, summary = document["suite"], document["summary"]
    lines = [f"# Conformance of {impl['implementation']} {impl['implementation_version']}", ""]
    if not document["complete"]:
        lines += [f"**Incomplete run** (stopped: {document['stopped'] or 'not every test finished'}): "
                  f"{summary['unfinished']} unfinished, {summary['not run']} not run. The verdicts below cover "
                  "only what finished; an unfinished property is no pass.", ""]
        lines += [f"- collection error: {_cell(error)}" for error in document["collection_errors"]]
        lines += [""] if document["collection_errors"] else []
    counted = [f"{summary[o]} {o}" for o in OUTCOMES if summary.get(o) or o in ("passed", "failed", "skipped")]
    budget = document.get("budget")
    if budget and budget["cut_short"]:
        lines += [f"**Cut short by the budget** (`--kv-budget {budget['given']}`): {len(budget['cut_short'])} "
                  "propert(ies) ran only part of their examples, with no failure among them. They are no passes; "
                  "a larger budget runs more.", ""]
    lines += [
        f"- implementation: `{impl['spec']}`, dtype {impl['dtype']}; capabilities: {', '.join(impl['capabilities'])}"
        + (f"; layers drawn only within {impl['layer_limits']}" if impl.get("layer_limits") else "")
        + (f"; whole models: kv_storage {impl['kv_storage']}, model_policy {impl['model_policy']}, model_limits "
           f"{impl['model_limits'] or 'none'}" if "model_policy" in impl else ""),
        f"- rule: {document['rule']}",
        *[f"- also applied: {rule} ({runs} runs)" for rule, runs in (document.get("rules") or {}).items()
          if rule != document["rule"]],
        f"- suite {suite['version']} at {suite['commit'] or 'an unknown commit'}; Python {env['python']}, "
        f"numpy {env['numpy']}, Hypothesis {env['hypothesis']}",
        f"- profile {profile['name']}: {profile['max_examples']} examples of up to "
        f"{profile['stateful_step_count']} steps{', derandomized' if profile['derandomize'] else ''}",
        *([f"- known failures: `{document['known_failures']}`"] if document["known_failures"] else []),
        *([f"- budget: `--kv-budget {budget['given']}` for the whole run"
           + (f"; it cut short the cause search of {', '.join(f'`{p}`' for p in budget['cause_search_cut'])}"
              if budget["cause_search_cut"] else "")] if budget else []),
        f"- {', '.join(counted)}",
        *_suite_checks(document),
        "",
    ]
    if document["causes"]:
        lines += ["## Distinct causes", "",
                  "| property | what failed | failure kind | claimed check | what changed "
                  "| rule of the failing step (also in) | failed | known | first trace |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for cause in document["causes"]:
            first = f"`{cause['traces'][0]}`" if cause["traces"] else ""
            rules = cause.get("rules") or ([cause["rule"]] if cause.get("rule") else [])
            lines.append(f"| `{cause['property']}` | {_cell(cause.get('label') or cause['kind'])} | "
                         f"{_cell(cause['kind'])} | {_cell(cause.get('check') or '')} | "
                         f"{_cell(', '.join(cause.get('changed') or ()))} | {_cell(', '.join(rules))} | "
                         f"{cause['failed']} | {cause['known']} | {first} |")
        lines.append("")
    if document.get("suite_errors"):
        lines += ["## Suite errors", "",
                  "The suite itself failed while judging: bugs of the suite, not verdicts about the implementation "
                  "(please report them with the trace).", "",
                  "| property | error | trace |", "|---|---|---|"]
        lines += [f"| `{e['property']}` | {_cell(e['kind'])}: {_cell(e['message'])} | "
                  f"{'`' + e['trace'] + '`' if e['trace'] else ''} |" for e in document["suite_errors"]]
        lines.append("")
    if document.get("cause_searches_bounded"):
        lines += ["## Cause searches stopped at a bound", "",
                  "More causes may be behind the ones found: run again with the option named to look further.", "",
                  "| property | causes found | stopped at | seconds | lift it with |", "|---|---|---|---|---|"]
        lines += [f"| `{s['property']}` | {s['causes']} | {s['stopped']} | {s['seconds']} | `{s['lift']}` |"
                  for s in document["cause_searches_bounded"]]
        lines.append("")
    lines += exercise.markdown(document.get("exercise") or {})
    lines += ["## Properties", "",
              "| property | result | runs | worst error / tolerance | trace or reason |",
              "|---|---|---|---|---|"]
    for entry in document["properties"]:
        error = (f"{entry['worst_error']:.2e} / {entry['tolerance']:.1e}" if "worst_error" in entry else "")
        detail = (f"`{entry['trace']}`: " if entry.get("trace") else "") + _cell(entry.get("reason") or "")
        parts = [detail] if detail else []
        if entry.get("failure") and entry["outcome"] == "xfailed":
            parts.append(f"failed with: {_cell(entry['failure'])}")
        if entry.get("rules_left_out"):
            parts.append("rules left out: " + "; ".join(f"`{rule}` ({_cell(why)})"
                                                         for rule, why in entry["rules_left_out"].items()))
        outcome = f"{entry['outcome']} (suite check)" if entry.get("suite_check") else entry["outcome"]
        lines.append(f"| `{entry['property']}` | {outcome} | {entry.get('runs', '')} | {error} | "
                     f"{' -- '.join(parts)} |")
    return "\n".join(lines) + "\n"


def _suite_checks(document: dict[str, Any]) -> list[str]:
    """The line for the properties that check only the suite (its oracle against mpmath): counted apart."""
    checks = document.get("suite_checks") or {}
    counted = [f"{checks[o]} {o}" for o in OUTCOMES if checks.get(o)]
    return [f"- the suite's own checks (no adapter code; not counted above): {', '.join(counted)}"] if counted else []
