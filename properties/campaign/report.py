"""A campaign's one report: its shards' reports merged into the format of ``--kv-report``, plus per-shard statistics.

A property's verdict over its shards is what one pytest run drawing all their
examples would give: failed if any shard failed, a known failure if any
found it, and so on down; a shard stopped before it finished leaves its
property ``unfinished`` unless another shard failed it, and a property no
shard reached is ``not run``. Either makes the report incomplete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..run import exercise
from ..run.report import OUTCOMES, REPORT_FORMAT, REPORT_VERSION, causes, markdown, rules_applied
from .shard import ShardResult

# Which shard outcome decides a property's, first to last.
PRECEDENCE = ("failed", "xfailed", "xpassed", "unfinished", "passed", "skipped", "not run")
_WORST_FIRST = ("failure_kind", "rule_failed", "reason", "failure", "trace")


def merge(results: list[ShardResult], properties: list[str], *, stopped: str | None, campaign: dict[str, Any],
          header: dict[str, Any], traces: dict[str, str]) -> dict[str, Any]:
    """The campaign's report document. ``traces`` maps a shard's trace file name to where the campaign wrote it;
    ``header`` holds the sections a shard report would have had (used when no shard wrote one)."""
    entries = {nodeid: {"property": nodeid, "outcome": "not run", "reason": None, "seconds": 0.0, "runs": 0,
                        "shards": 0} for nodeid in properties}
    shards = []
    reports = [r.report for r in results if r.report is not None]
    for result in results:
        own = shard_entry(result)
        shards.append(_statistics(result, own, traces))
        entry = entries.setdefault(result.request.shard.property, {
            "property": result.request.shard.property, "outcome": "not run", "reason": None, "seconds": 0.0,
            "runs": 0, "shards": 0})
        _fold(entry, own, traces)
    for entry in entries.values():
        if entry["runs"] == 0 and entry["outcome"] in ("skipped", "not run"):
            del entry["runs"]
    listed = sorted(entries.values(), key=lambda e: e["property"])
    first = reports[0] if reports else header
    complete = stopped is None and not any(e["outcome"] in ("unfinished", "not run") for e in listed)
    document = {
        "format": REPORT_FORMAT,
        "format_version": REPORT_VERSION,
        "complete": complete,
        "stopped": stopped,
        "collection_errors": sorted({e for r in reports for e in r.get("collection_errors", [])}),
        **{k: first[k] for k in ("suite", "implementation", "environment", "oracle", "rule", "known_failures")},
        "profile": campaign["profile"],
        "summary": {o: sum(1 for e in listed if e["outcome"] == o) for o in OUTCOMES},
        "rules": rules_applied(listed),
        "causes": causes(listed),
        "exercise": exercise.summary(({"exercise": r.get("exercise")} for r in reports),
                                     first["implementation"]["capabilities"]),
        "traces": sorted({e["trace"] for e in listed if e.get("trace")} | {s["trace"] for s in shards if s["trace"]}),
        "properties": listed,
        "campaign": {**campaign, "shards": shards},
    }
    return document


def shard_entry(result: ShardResult) -> dict[str, Any]:
    """The shard's verdict on its property: its report's entry, or what became of a shard with no report."""
    nodeid = result.request.shard.property
    if result.report is not None:
        for entry in result.report.get("properties", []):
            if entry["property"] == nodeid:
                return dict(entry)
        if result.report.get("collection_errors"):
            return {"property": nodeid, "outcome": "failed", "seconds": result.seconds,
                    "reason": "error in collection: " + "; ".join(result.report["collection_errors"]),
                    "failure_kind": "suite error (collection)"}
        return {"property": nodeid, "outcome": "not run", "seconds": result.seconds, "reason": "not collected"}
    lines = [line for line in result.output.splitlines() if line.strip()]
    why = "stopped by the campaign" if result.stopped else f"pytest exit status {result.exit_code}"
    return {"property": nodeid, "outcome": "unfinished", "seconds": result.seconds,
            "reason": f"{why}, no report written: {lines[-1] if lines else 'no output'}"}


def _fold(entry: dict[str, Any], own: dict[str, Any], traces: dict[str, str]) -> None:
    entry["shards"] += 1
    entry["seconds"] += float(own.get("seconds") or 0.0)
    entry["runs"] = entry.get("runs", 0) + int(own.get("runs") or 0)
    if own.get("rules"):
        entry["rules"] = rules_applied([entry, own])
    if "worst_error" in own and ("worst_error" not in entry or _ratio(own) > _ratio(entry)):
        entry["worst_error"], entry["tolerance"], entry["rule"] = own["worst_error"], own["tolerance"], own.get("rule")
    if PRECEDENCE.index(own["outcome"]) < PRECEDENCE.index(entry["outcome"]):
        entry["outcome"] = own["outcome"]
        for name in _WORST_FIRST:
            entry.pop(name, None)
            if own.get(name) is not None:
                entry[name] = traces.get(Path(own[name]).name, own[name]) if name == "trace" else own[name]
        for name in ("rules_left_out",):
            if name in own:
                entry[name] = own[name]


def _ratio(entry: dict[str, Any]) -> float:
    tolerance = float(entry.get("tolerance") or 0.0)
    return float(entry["worst_error"]) / tolerance if tolerance > 0 else float(entry["worst_error"])


def _statistics(result: ShardResult, own: dict[str, Any], traces: dict[str, str]) -> dict[str, Any]:
    shard = result.request.shard
    runs = int(own.get("runs") or 0)
    trace = own.get("trace")
    return {"property": shard.property, "index": shard.index, "examples": shard.examples,
            "outcome": own["outcome"], "runs": runs, "seconds": round(result.seconds, 3),
            "examples_per_second": round(runs / result.seconds, 2) if result.seconds > 0 else None,
            "worker": result.worker, "host": result.host, "exit_code": result.exit_code,
            "stopped_by_campaign": result.stopped, "trace": traces.get(Path(trace).name, trace) if trace else None,
            "unpublished": sum(1 for line in result.unpublished.splitlines() if line.strip())}


def campaign_markdown(document: dict[str, Any]) -> str:
    """The report's Markdown, then the campaign's own numbers and one line per shard."""
    campaign = document["campaign"]
    lines = [markdown(document), "## Campaign", "",
             f"- {campaign['shards_done']} shards on {campaign['cluster']}, "
             f"{campaign['examples']} examples in {campaign['seconds']:.1f} s "
             f"({campaign['examples_per_second']:.1f} examples/s)",
             f"- shared database: {campaign['db'] or 'none'}"
             + (f"; **{campaign['unpublished']} examples not published**, kept in `{campaign['unpublished_file']}` "
                "(python -m properties.campaign publish)" if campaign.get("unpublished") else ""),
             "", "| property | shard | budget | result | runs | seconds | examples/s | worker | trace |",
             "|---|---|---|---|---|---|---|---|---|"]
    for shard in campaign["shards"]:
        lines.append(f"| `{shard['property']}` | {shard['index']} | {shard['examples']} | "
                     f"{shard['outcome']}{' (stopped)' if shard['stopped_by_campaign'] else ''} | {shard['runs']} | "
                     f"{shard['seconds']:.1f} | {shard['examples_per_second'] or ''} | {shard['worker']} | "
                     f"{'`' + shard['trace'] + '`' if shard['trace'] else ''} |")
    return "\n".join(lines) + "\n"


def write(document: dict[str, Any], path: Path) -> None:
    """``path`` (JSON) and ``path`` with suffix ``.md``, each replaced at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for target, text in ((path, json.dumps(document, indent=1) + "\n"),
                         (path.with_suffix(".md"), campaign_markdown(document))):
        partial = target.with_name(target.name + ".partial")
        partial.write_text(text)
        os.replace(partial, target)
