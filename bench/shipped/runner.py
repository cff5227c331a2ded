"""The shipped-bug benchmark: the plain command on the last release with each bug and the first with its fix.

    python bench/run.py --only shipped                       # every runnable entry of catalogue.toml
    python -m bench.shipped.runner --bug hf-dynamic-reset-keeps-rows --bug litgpt-prefill-overwrites-ring
    python -m bench.shipped.runner --library transformers --reuse   # keep the reports already made
    python -m bench.shipped.runner --table                   # only print the table of the reports kept

Each release runs in its own cached environment (``environments.py``) with ``HYPOTHESIS_PROFILE=ci`` (and the
entry's ``run.env``, e.g. ``KERAS_BACKEND=torch``), one process, the entry's adapter and properties, a report of
its own, and the trace corpus left out (the corpus holds traces of bugs this suite found in these libraries
itself: it would answer for the machines). What is judged,
from the two reports alone:

- **caught**: a cause of the buggy release's report is the entry's ``cause`` (property, kind, and the rule and
  check where given: ``CausePattern``). Not caught at ``ci``, the buggy release runs again under ``thorough``
  within a 10-minute ``--kv-budget`` ("only thorough" if that finds it). An entry without a cause (a miss) counts
  as caught when a cause of the buggy release is gone on the fixed one: a miss the suite did not miss, to triage.
- **quiet on the fix**: the fixed release's report has no cause that is the bug's, and none that is new -- not
  on the buggy release (same property, kind, check, what changed, and a rule in common) and not one of the
  entry's ``run.known`` (other findings, each with its reason). A report lists the causes its search reached
  first, so a cause of the fixed release missing from the buggy one's report is replayed, from its shrunk trace,
  on the buggy release: if it fails there the same way (kind, check, what changed), it is on both releases, not
  new (``on both by replay`` in the table's notes). Likewise an entry without a cause: a cause of the buggy
  release that the fixed release's report lacks counts only if its trace does not fail alike on the fixed release.
- an **error** is a run that judged nothing: it could not start, a collection error, a suite error, no property
  ran, or it timed out. It is no verdict either way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file by bench/run.py's path juggling
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.shipped import catalogue, environments
from bench.shipped.catalogue import Bug

ROOT = environments.ROOT
PROFILE, STRONGER = "ci", "thorough"
STRONGER_BUDGET = "10m"  # --kv-budget of a thorough rerun: its 1,000 examples a property can take hours
TIMEOUT = 30 * 60  # seconds of one release's run; then it is interrupted (the report is still written)
LEFT_OUT = "not test_trace_replays"


@dataclass
class ReleaseRun:
    """What the plain command did on one release."""

    version: str
    profile: str
    seconds: float = 0.0  # the pytest run's wall time
    built_seconds: float = 0.0  # building its environment (0: cached)
    error: str | None = None  # why it judged nothing, if it did not
    causes: list[dict[str, Any]] = field(default_factory=list)
    properties: dict[str, dict[str, Any]] = field(default_factory=dict)  # outcome and seconds of each
    report: str | None = None


def _release_key(bug: Bug, version: str, profile: str) -> dict[str, Any]:
    assert bug.run is not None
    key = {"adapter": bug.run.adapter, "install": list(bug.run.install), "tests": list(bug.run.tests),
           "version": version, "profile": profile}
    key |= {"budget": STRONGER_BUDGET} if profile == STRONGER else {}
    return key | ({"env": dict(bug.run.env)} if bug.run.env else {})  # without one, the keys kept stay valid


def _judged_nothing(report: dict[str, Any]) -> str | None:
    if report.get("collection_errors"):
        return f"collection errors: {report['collection_errors']}"
    if report.get("suite_errors"):
        return f"suite errors: {[e['message'] for e in report['suite_errors']]}"
    summary = report.get("summary", {})
    if not summary.get("passed") and not summary.get("failed"):
        return f"no property passed or failed: {summary}"
    return None


def _selection(bug: Bug, profile: str) -> str:
    """pytest's -k: the corpus left out; a thorough rerun runs only the property the bug's cause is in."""
    if profile == STRONGER and bug.cause is not None:
        return f"{LEFT_OUT} and {bug.cause.property}"
    return LEFT_OUT


def run_release(bug: Bug, version: str, profile: str, out: Path, reuse: bool, timeout: float) -> ReleaseRun:
    """The plain command on ``bug``'s library at ``version``, its report in ``out``."""
    assert bug.run is not None
    key = _release_key(bug, version, profile)
    kept = out / "run.json"
    if reuse and kept.is_file():
        previous = json.loads(kept.read_text())
        if previous.get("key") == key:
            return ReleaseRun(**previous["run"])
    result = ReleaseRun(version, profile)
    try:
        env = environments.release(bug.library, version, list(bug.run.install), bug.run.python, bug.run.torch,
                                   dict(bug.run.env))
    except environments.EnvironmentBuildError as error:
        result.error = f"environment: {error}"
        return result
    result.built_seconds = round(env.built_seconds, 1)
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("report.json", "pytest.log"):
        (out / stale).unlink(missing_ok=True)
    command = [str(env.python), "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", *bug.run.tests,
               "-k", _selection(bug, profile), f"--kv-impl={bug.run.adapter}", f"--kv-report={out / 'report.json'}",
               f"--kv-traces={out / 'traces'}", f"--kv-examples={out / 'examples'}",
               *([f"--kv-budget={STRONGER_BUDGET}"] if profile == STRONGER else [])]
    started = time.monotonic()
    with (out / "pytest.log").open("w") as log:
        variables = {"HYPOTHESIS_PROFILE": profile, **dict(bug.run.env)}
        log.write(f"$ {' '.join(f'{name}={value}' for name, value in variables.items())} {' '.join(command)}\n")
        log.flush()
        child = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 env={**os.environ, **variables})
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGINT)  # the plugin writes the report of what ran
            try:
                child.wait(timeout=120)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            result.error = f"timed out after {timeout:g} s"
    result.seconds = round(time.monotonic() - started, 1)
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        result.error = result.error or f"no report (pytest exited {child.returncode}; see {out / 'pytest.log'})"
    else:
        result.report = str(out / "report.json")
        result.error = result.error or _judged_nothing(report)
        result.causes = report["causes"]
        result.properties = {e["property"]: {"outcome": e["outcome"], "seconds": round(e.get("seconds", 0.0), 1),
                                             "runs": e.get("runs")} for e in report["properties"]}
    kept.write_text(json.dumps({"key": key, "run": asdict(result)}, indent=1))
    return result


def replay_on(bug: Bug, version: str, traces: list[str], out: Path) -> list[dict[str, Any]]:
    """Each trace replayed on ``bug``'s library at ``version`` (its environment, adapter and ``run.env``): the
    replay's verdicts (``python -m properties.replay --json``), or one verdict of status "error" a trace."""
    assert bug.run is not None
    out.mkdir(parents=True, exist_ok=True)
    verdicts, log = out / "verdicts.json", out / "replay.log"
    verdicts.unlink(missing_ok=True)
    try:
        env = environments.release(bug.library, version, list(bug.run.install), bug.run.python, bug.run.torch,
                                   dict(bug.run.env))
    except environments.EnvironmentBuildError as error:
        return [{"trace": trace, "status": "error", "message": f"environment: {error}"} for trace in traces]
    command = [str(env.python), "-m", "properties.replay", "--quiet", f"--json={verdicts}",
               f"--kv-impl={bug.run.adapter}", *traces]
    with log.open("w") as written:
        done = subprocess.run(command, cwd=ROOT, stdout=written, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, **dict(bug.run.env)}, timeout=TIMEOUT)
    try:
        return list(json.loads(verdicts.read_text()))
    except (OSError, ValueError):
        return [{"trace": trace, "status": "error", "message": f"replay exited {done.returncode}; see {log}"}
                for trace in traces]


def fails_alike(cause: dict[str, Any], verdict: dict[str, Any]) -> bool:
    """Whether a replayed trace failed as ``cause`` did: it diverged with the same kind, check and what changed."""
    return verdict.get("status") == "diverges" and (verdict.get("kind"), verdict.get("check"),
                                                    verdict.get("changed") or []) == \
        (cause["kind"], cause.get("check"), cause.get("changed") or [])


def same_cause(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """One cause seen in two reports: the same property, kind, check and what changed, met in a rule in common
    (a search may reach a cause first through another rule of the same program)."""
    return (a["property"], a["kind"], a.get("check"), a.get("changed") or []) == \
        (b["property"], b["kind"], b.get("check"), b.get("changed") or []) and \
        bool(set(a.get("rules") or [a.get("rule")]) & set(b.get("rules") or [b.get("rule")]))


@dataclass
class Outcome:
    bug: str
    library: str
    releases: str
    expected: str  # "caught" or "miss"
    caught: str  # "yes", "only thorough", "no", "error"
    quiet: str  # "yes", "no", "error"
    seconds: float | None  # the catching property's time on the buggy release (search, shrinking, causes)
    trace_steps: int | None  # the shrunk trace of the bug's cause
    cause: str | None  # the cause that is the bug, as the report says it
    new_on_fix: list[str]  # causes on the fixed release that are neither the buggy release's nor known
    on_both_by_replay: list[str]  # fixed-only causes in the reports whose traces fail alike on the buggy release
    errors: list[str]
    buggy: ReleaseRun
    fixed: ReleaseRun
    stronger: ReleaseRun | None = None


def _label(cause: dict[str, Any], rule: str | None = None) -> str:
    """The cause as the table says it: its property, the rule (the pattern's, where it names one: the cause may
    have been found first in another), what failed."""
    return f"{cause['property'].rsplit('::', 1)[-1]}: {rule or cause.get('rule')}: {cause['label']}"


def gone_candidates(bug: Bug, buggy: ReleaseRun, fixed: ReleaseRun) -> list[dict[str, Any]]:
    """For an entry without a cause pattern (a miss): the buggy release's causes that the fixed release's report
    lacks and that are not known -- the bug, if the suite did not miss it, or what the fixed release's search did
    not reach (its replay on the fixed release tells)."""
    known = bug.run.known if bug.run else ()
    return [c for c in buggy.causes if not any(same_cause(c, f) for f in fixed.causes)
            and not any(k.matches(c) for k in known)]


def _bug_cause(bug: Bug, buggy: ReleaseRun, fixed: ReleaseRun,
               replayed: dict[str, dict[str, Any]] | None = None) -> dict[str, Any] | None:
    if bug.cause is not None:
        return next((c for c in buggy.causes if bug.cause.matches(c)), None)
    return next((c for c in gone_candidates(bug, buggy, fixed)
                 if not _fails_alike_there(c, replayed or {}, fixed.version)), None)


def _fails_alike_there(cause: dict[str, Any], replayed: dict[str, dict[str, Any]], version: str) -> bool:
    """Whether one of ``cause``'s traces, replayed on the release ``version``, failed there as it did here."""
    return any(fails_alike(cause, replayed[t]) for t in cause.get("traces") or ()
               if t in replayed and replayed[t].get("on") == version)


def _trace_steps(cause: dict[str, Any]) -> int | None:
    for trace in cause.get("traces") or ():
        try:
            return len(json.loads(Path(trace).read_text())["steps"])
        except (OSError, ValueError, KeyError):
            continue
    return None


def _seconds(run: ReleaseRun, cause: dict[str, Any]) -> float | None:
    instances = cause.get("instances") or []
    found = [run.properties[name]["seconds"] for name in instances if name in run.properties]
    return min(found) if found else None


def unexplained(bug: Bug, buggy: ReleaseRun, fixed: ReleaseRun) -> list[dict[str, Any]]:
    """The fixed release's causes that its report alone cannot explain: not on the buggy release's report and not
    known (the bug's own cause, still there, is judged apart)."""
    assert bug.run is not None
    return [c for c in fixed.causes if not any(same_cause(c, b) for b in buggy.causes)
            and not any(k.matches(c) for k in bug.run.known) and not (bug.cause and bug.cause.matches(c))]


def judge(bug: Bug, buggy: ReleaseRun, fixed: ReleaseRun, stronger: ReleaseRun | None,
          replayed: dict[str, dict[str, Any]] | None = None) -> Outcome:
    """The outcome from the reports and ``replayed``: the verdicts, by trace path, of traces replayed on the other
    release (``replay_causes``)."""
    assert bug.run is not None
    replayed = replayed or {}
    errors = [f"{run.version} ({run.profile}): {run.error}" for run in (buggy, fixed, stronger)
              if run is not None and run.error]
    cause = None if buggy.error else _bug_cause(bug, buggy, fixed, replayed)
    caught_by = buggy
    if cause is None and stronger is not None and not stronger.error:
        cause, caught_by = _bug_cause(bug, stronger, fixed, replayed), stronger
    caught = "error" if buggy.error else "yes" if caught_by is buggy and cause else \
        f"only {STRONGER}" if cause else "no"
    unexplained_causes = [] if fixed.error or buggy.error else unexplained(bug, buggy, fixed)
    on_both = [c for c in unexplained_causes if _fails_alike_there(c, replayed, buggy.version)]
    new = [_label(c) for c in unexplained_causes if c not in on_both]
    still = bug.cause is not None and any(bug.cause.matches(c) for c in fixed.causes)
    quiet = "error" if fixed.error else "no" if new or still else "yes"
    return Outcome(bug.id, bug.library, f"{bug.buggy.version} -> {bug.fixed.version}", bug.expect["outcome"],
                   caught, quiet, _seconds(caught_by, cause) if cause else None,
                   _trace_steps(cause) if cause else None,
                   _label(cause, bug.cause.rule if bug.cause else None) if cause else None,
                   new + (["the bug's cause is still there"] if still else []), [_label(c) for c in on_both], errors,
                   buggy, fixed, stronger)


def replay_causes(bug: Bug, runs: list[ReleaseRun], fixed: ReleaseRun, out: Path,
                  replayed: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``replayed`` and the traces a judgement from the reports alone could get wrong, replayed on the other release:
    the fixed release's causes the buggy release's report lacks, on the buggy release; for an entry without a
    cause pattern, the causes of each of ``runs`` (the buggy release, at ci or thorough) that the fixed release's
    report lacks, on the fixed release. Kept in ``out/replayed.json``: a trace is named by the digest of its
    steps, so its verdict on a release holds as long as the entry's adapter does."""
    buggy = runs[0]
    if buggy.error or fixed.error:
        return replayed
    wanted = {buggy.version: [t for c in unexplained(bug, buggy, fixed) for t in c.get("traces") or ()],
              fixed.version: [t for run in runs if bug.cause is None and not run.error
                              for c in gone_candidates(bug, run, fixed) for t in c.get("traces") or ()]}
    for version, traces in wanted.items():
        todo = [t for t in traces if t not in replayed]
        if todo:
            replayed |= {v["trace"]: {**v, "on": version}
                         for v in replay_on(bug, version, todo, out / "replay" / version)}
    if replayed:
        (out / "replayed.json").write_text(json.dumps(replayed, indent=1))
    return replayed


def _kept_replays(out: Path) -> dict[str, dict[str, Any]]:
    kept = out / "replayed.json"
    return dict(json.loads(kept.read_text())) if kept.is_file() else {}


def run_bug(bug: Bug, out: Path, reuse: bool, stronger: bool, timeout: float) -> Outcome:
    buggy = run_release(bug, bug.buggy.version, PROFILE, out / bug.id / "buggy", reuse, timeout)
    fixed = run_release(bug, bug.fixed.version, PROFILE, out / bug.id / "fixed", reuse, timeout)
    replayed = replay_causes(bug, [buggy], fixed, out / bug.id, _kept_replays(out / bug.id) if reuse else {})
    strong = None
    if stronger and not buggy.error and _bug_cause(bug, buggy, fixed, replayed) is None:
        strong = run_release(bug, bug.buggy.version, STRONGER, out / bug.id / "buggy-thorough", reuse, timeout)
        replayed = replay_causes(bug, [buggy, strong], fixed, out / bug.id, replayed)
    return judge(bug, buggy, fixed, strong, replayed)


def table(outcomes: list[Outcome]) -> str:
    lines = [f"{'bug':44} {'library':16} {'releases':17} {'expected':8} {'caught':13} {'quiet on fix':12} "
             f"{'first failure s':>15} {'steps':>5}"]
    for o in outcomes:
        lines.append(f"{o.bug:44} {o.library:16} {o.releases:17} {o.expected:8} {o.caught:13} {o.quiet:12} "
                     f"{'' if o.seconds is None else f'{o.seconds:.0f}':>15} {o.trace_steps or '':>5}")
    judged = [o for o in outcomes if o.caught != "error"]
    caught = sum(o.caught != "no" for o in judged)
    quiet = [o for o in outcomes if o.quiet != "error"]
    lines.append(f"recall: {caught}/{len(judged)} caught ({sum(o.caught == 'yes' for o in judged)} at {PROFILE}); "
                 f"quiet on the fix: {sum(o.quiet == 'yes' for o in quiet)}/{len(quiet)} "
                 f"({sum(o.quiet == 'no' for o in quiet)} false alarm(s)); "
                 f"errors: {sum(o.caught == 'error' or o.quiet == 'error' for o in outcomes)}")
    for o in outcomes:
        for said in ([f"cause: {o.cause}"] if o.cause else []) + [f"new on the fix: {n}" for n in o.new_on_fix] + \
                [f"on both by replay: {n}" for n in o.on_both_by_replay] + [f"error: {e}" for e in o.errors]:
            lines.append(f"  {o.bug}: {said}")
    return "\n".join(lines)


def markdown(outcomes: list[Outcome]) -> str:
    """The table of docs/shipped-bugs.md."""
    lines = ["| bug | library | releases | expected | caught | quiet on the fix | first failure s | steps | cause |",
             "|---|---|---|---|---|---|---|---|---|"]
    for o in outcomes:
        lines.append(f"| `{o.bug}` | {o.library} | {o.releases} | {o.expected} | {o.caught} | {o.quiet} | "
                     f"{'' if o.seconds is None else f'{o.seconds:.0f}'} | {o.trace_steps or ''} | "
                     f"{(o.cause or '').replace('|', '/')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shipped.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bug", action="append", default=None, help="only this entry (repeatable)")
    parser.add_argument("--library", default=None, help="only this library's entries")
    parser.add_argument("--out", type=Path, default=environments.cache_root() / "runs",
                        help="where each release's report, traces and examples go")
    parser.add_argument("--reuse", action="store_true", help="keep a release's report made for the same entry")
    parser.add_argument("--table", action="store_true", help="run nothing: the table of the reports kept")
    parser.add_argument("--no-stronger", action="store_true", help=f"no {STRONGER} run where {PROFILE} misses")
    parser.add_argument("--timeout", type=float, default=TIMEOUT, help="seconds per release's run")
    parser.add_argument("--markdown", action="store_true", help="print the table as docs/shipped-bugs.md has it")
    options = parser.parse_args(argv)
    bugs = [bug for bug in catalogue.load() if (options.bug is None or bug.id in options.bug)
            and options.library in (None, bug.library)]
    if options.bug and len(bugs) != len(set(options.bug)):
        parser.error(f"unknown entries: {sorted(set(options.bug) - {bug.id for bug in bugs})}")
    runnable = [bug for bug in bugs if bug.run is not None]
    outcomes = []
    for bug in runnable:
        if options.table:
            kept = _from_kept(bug, options.out)
            outcomes += [kept] if kept is not None else []
            continue
        started = time.monotonic()
        outcomes.append(run_bug(bug, options.out, options.reuse, not options.no_stronger, options.timeout))
        print(f"{bug.id}: caught {outcomes[-1].caught}, quiet {outcomes[-1].quiet} "
              f"({time.monotonic() - started:.0f} s)", flush=True)
    if not options.table:
        _keep_outcomes(options.out / "outcomes.json", outcomes)
    if runnable:
        print(table(outcomes))
        if options.markdown:
            print(markdown(outcomes))
    unrun = [bug for bug in bugs if bug.run is None]
    if unrun:  # recall counts only entries run; these are listed with why, never counted as misses or catches
        print(f"not runnable here ({len(unrun)}), not in the figures above:" if runnable else
              f"nothing runnable selected; not runnable here ({len(unrun)}):")
        for bug in unrun:
            print(f"  {bug.id}: {textwrap.shorten(bug.status['run'], 160)}")
    return 0


def _keep_outcomes(path: Path, outcomes: list[Outcome]) -> None:
    """``outcomes`` into ``path``, by entry: a run of some entries replaces theirs and keeps the others'."""
    kept = {o["bug"]: o for o in json.loads(path.read_text())} if path.is_file() else {}
    kept |= {o.bug: asdict(o) for o in outcomes}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(kept.values()), indent=1))


def _from_kept(bug: Bug, out: Path) -> Outcome | None:
    """The outcome of the reports kept for ``bug``, or None if a release has none."""
    runs = {}
    for which in ("buggy", "fixed", "buggy-thorough"):
        kept = out / bug.id / which / "run.json"
        runs[which] = ReleaseRun(**json.loads(kept.read_text())["run"]) if kept.is_file() else None
    if runs["buggy"] is None or runs["fixed"] is None:
        return None
    return judge(bug, runs["buggy"], runs["fixed"], runs["buggy-thorough"], _kept_replays(out / bug.id))


if __name__ == "__main__":
    raise SystemExit(main())
