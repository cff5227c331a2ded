"""``pytest --kv-report PATH``: what the suite found, as JSON for machines and Markdown for people.

Collected on the pytest controller from every test's reports (xdist workers
send theirs, with the ``kv_*`` user properties ``PropertyRun`` records), and
written once the session ends: ``PATH`` (JSON) and ``PATH`` with suffix
``.md`` (a table).
"""

from __future__ import annotations

import json
import platform
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from . import selection
from .runner import environment_facts, implementation_facts
from .tolerance import Judge, declared_dtype

REPORT_FORMAT = "kvcache-conformance-report"


class ConformanceReport:
    """A pytest plugin: one entry per test, the verdict of its last phase that decided anything."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.properties: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.properties.setdefault(report.nodeid, {"property": report.nodeid, "outcome": "passed",
                                                           "reason": None, "seconds": 0.0})
        entry["seconds"] += report.duration
        for name, value in report.user_properties:
            if name.startswith("kv_"):
                entry[name[3:]] = value
        if report.skipped:
            entry["outcome"] = "skipped"
            longrepr = report.longrepr
            entry["reason"] = longrepr[2].removeprefix("Skipped: ") if isinstance(longrepr, tuple) else str(longrepr)
        elif report.failed:
            entry["outcome"] = "failed"
            entry["reason"] = _first_line(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        document = self.document(session.config)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(document, indent=1) + "\n")
        self.path.with_suffix(".md").write_text(markdown(document))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.write_line(f"kvcache conformance report: {self.path} and {self.path.with_suffix('.md')}")

    def document(self, config: pytest.Config) -> dict[str, Any]:
        adapter = selection.selected()
        current = settings.default
        entries = sorted(self.properties.values(), key=lambda e: e["property"])
        counts = {o: sum(1 for e in entries if e["outcome"] == o) for o in ("passed", "failed", "skipped")}
        return {
            "format": REPORT_FORMAT,
            "format_version": 1,
            "suite": {k.removeprefix("suite_"): v for k, v in environment_facts().items() if k.startswith("suite_")},
            "implementation": implementation_facts(adapter, selection.selected_spec()),
            "environment": {"python": platform.python_version(), "platform": platform.platform(),
                            **{k: v for k, v in environment_facts().items() if k in ("numpy", "hypothesis")}},
            "profile": {"name": settings.get_current_profile_name(), "max_examples": current.max_examples,
                        "stateful_step_count": current.stateful_step_count, "derandomize": current.derandomize},
            "oracle": selection.oracle_name(),
            "rule": Judge(declared_dtype(adapter), selection.oracle_numbers()).rule,
            "summary": counts,
            "properties": entries,
        }


def examples_from_statistics(described: str) -> int | None:
    """Examples a ``@given`` test ran, summed over phases, from Hypothesis's statistics text; None if unknown."""
    counts = re.findall(r"(\d+) passing, (\d+) failing, and (\d+) invalid", described)
    return sum(int(p) + int(f) + int(i) for p, f, i in counts) if counts else None


def _first_line(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text.splitlines()[0] if text else "failed"


def markdown(document: dict[str, Any]) -> str:
    impl, env, profile = document["implementation"], document["environment"], document["profile"]
    suite = document["suite"]
    lines = [
        f"# Conformance of {impl['implementation']} {impl['implementation_version']}",
        "",
        f"- implementation: `{impl['spec']}`, dtype {impl['dtype']}; capabilities: {', '.join(impl['capabilities'])}",
        f"- rule: {document['rule']}",
        f"- suite {suite['version']} at {suite['commit'] or 'an unknown commit'}; Python {env['python']}, "
        f"numpy {env['numpy']}, Hypothesis {env['hypothesis']}",
        f"- profile {profile['name']}: {profile['max_examples']} examples of up to "
        f"{profile['stateful_step_count']} steps{', derandomized' if profile['derandomize'] else ''}",
        f"- {document['summary']['passed']} passed, {document['summary']['failed']} failed, "
        f"{document['summary']['skipped']} skipped",
        "",
        "| property | result | runs | worst error / tolerance | trace or reason |",
        "|---|---|---|---|---|",
    ]
    for entry in document["properties"]:
        error = (f"{entry['worst_error']:.2e} / {entry['tolerance']:.1e}" if "worst_error" in entry else "")
        detail = f"`{entry['trace']}`: " if entry.get("trace") else ""
        detail += (entry.get("reason") or "").replace("|", "\\|")
        lines.append(f"| `{entry['property']}` | {entry['outcome']} | {entry.get('runs', '')} | {error} | "
                     f"{detail} |")
    return "\n".join(lines) + "\n"
