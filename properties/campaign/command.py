"""``python -m properties.campaign``: hours of search spread over Dask workers, counterexamples shared through Redis.

Dask distributed schedules the shards (``campaign_shard``: one property, an
example budget, each a pytest process of its own) on an embedded
``LocalCluster`` or on ``--scheduler tcp://HOST:PORT``, and reschedules a
shard whose worker died; Redis (``--db``, Hypothesis's
``RedisExampleDatabase``) keeps every counterexample a worker finds for
everyone (docs/campaigns.md). The campaign stops at its time budget, at the
first failure if asked, or at Ctrl-C / SIGTERM, and always writes one merged
report (``campaign_report``) and every trace.

    python -m properties.campaign --kv-impl pkg.module:factory --minutes 60 [--db redis://127.0.0.1:6379/0]
    python -m properties.campaign prune --db redis://127.0.0.1:6379/0 --kv-impl pkg.module:factory
    python -m properties.campaign publish counterexamples/campaign-X/unpublished.jsonl --db redis://...
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..run import databases, profiles, selection
from ..run.provenance import environment_facts, implementation_facts, suite_paths, working_directory
from . import report as campaign_report
from .shard import Shard, ShardRequest, ShardResult, collect, run_shard

SEARCH_PROFILES = ("dev", "thorough")  # ci is derandomised (every shard would draw alike); replay draws nothing
MIN_SHARD_EXAMPLES = 10
PROGRESS_EVERY = 10.0  # seconds between progress lines
TERMINAL = ("failed", "xfailed", "xpassed", "skipped")  # a property whose shard ended so gets no more shards


class CampaignError(RuntimeError):
    """The campaign cannot start (not a verdict): a wrong option, a missing extra, an unreachable server."""


@dataclass
class Progress:
    """What the campaign has done so far, for the progress lines and the report."""

    started: float = field(default_factory=time.monotonic)
    results: list[ShardResult] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)  # shard name -> times a worker started it
    outcome: dict[str, str] = field(default_factory=dict)  # property -> its verdict so far, once decided

    def examples(self) -> int:
        return sum(int((campaign_report.shard_entry(r).get("runs")) or 0) for r in self.results)

    def line(self, running: int) -> str:
        elapsed = time.monotonic() - self.started
        examples = self.examples()
        failing = sum(1 for o in self.outcome.values() if o in ("failed", "xpassed"))
        return (f"[{elapsed / 60:5.1f} min] shards: {len(self.results)} done, {running} running; {examples} examples, "
                f"{examples / elapsed if elapsed else 0:.1f} examples/s; failing properties: {failing}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and argv[0] in ("run", "prune", "publish") else "run"
    rest = argv[1:] if argv and argv[0] == command else argv
    try:
        if command == "prune":
            return prune(_prune_parser().parse_args(rest))
        if command == "publish":
            options = _publish_parser().parse_args(rest)
            count = databases.publish(options.file, _required_db(options.db))
            print(f"published {count} examples to {options.db}")
            return 0
        return run(_run_parser().parse_args(rest))
    except (CampaignError, databases.SharedDatabaseError, selection.AdapterLoadError) as error:
        print(f"campaign: {error}", file=sys.stderr)
        return 4


# -- run ------------------------------------------------------------------------------------------------------------

def _run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m properties.campaign", description=__doc__.split("\n\n")[0])
    parser.add_argument(selection.OPTION, dest="spec", default=None, metavar="MODULE:FACTORY",
                        help=f"the implementation (default: ${selection.ENV_VAR} or {selection.DEFAULT_SPEC}); "
                             "importable on every worker")
    parser.add_argument("--minutes", type=float, default=60.0, help="time budget: no shard starts after it")
    parser.add_argument("--grace", type=float, default=None, metavar="SECONDS",
                        help="shards still running this long after the budget are stopped (default: 30 s or 5%%)")
    parser.add_argument("--shards-per-property", type=int, default=None, metavar="K",
                        help="at most K shards of each property (default: as many as the time allows)")
    parser.add_argument("--shard-examples", type=int, default=None, metavar="N",
                        help="a shard's example budget at most (default: no limit but --shard-seconds); a property's "
                             "first shard runs the profile's max_examples, and measures its rate")
    parser.add_argument("--shard-seconds", type=float, default=60.0, metavar="SECONDS",
                        help="size later shards to run about this long at the property's measured rate, and "
                             "never past the time budget (default: %(default)s)")
    parser.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                        help="an existing Dask scheduler (default: a LocalCluster on this machine)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="LocalCluster worker processes, one shard each (default: %(default)s)")
    parser.add_argument("--resources", default=None, metavar="NAME=N[,NAME=N]",
                        help="Dask resources each shard needs, e.g. GPU=1 (workers started with --resources GPU=1)")
    parser.add_argument("--db", default=None, metavar="redis://HOST:PORT/N",
                        help=f"the shared example database (default: ${databases.SHARED_ENV_VAR}; none: each "
                             "worker's local database only)")
    parser.add_argument("--profile", default="dev", choices=SEARCH_PROFILES,
                        help="Hypothesis profile of every shard (program length, phases; default: %(default)s)")
    parser.add_argument("-x", "--exitfirst", action="store_true", help="stop at the first failing property")
    parser.add_argument("-k", dest="select", default=None, metavar="EXPRESSION",
                        help="only the properties pytest's -k EXPRESSION selects")
    parser.add_argument("--oracle", default="float64", choices=selection.ORACLES)
    parser.add_argument("--kv-call-timeout", dest="call_timeout", type=float, default=None, metavar="SECONDS")
    parser.add_argument("--kv-xfails", dest="known_failures", type=Path, default=None, metavar="FILE")
    parser.add_argument("--out", type=Path, default=None,
                        help="report, traces and kept-back examples (default: counterexamples/campaign-<UTC time>)")
    return parser


def run(options: argparse.Namespace) -> int:
    spec = selection.spec_from(options.spec)
    db = databases.shared_url(options.db)
    out = (options.out or Path("counterexamples") / f"campaign-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}").resolve()
    if db is not None:  # a clear error now rather than one per shard
        databases.open_shared(db, databases.SharedScope("-", "-", "-", "-"))
    distributed = _distributed()
    resources = _resources(options.resources)
    first = int(profiles.PROFILES[options.profile]["max_examples"])  # type: ignore[call-overload]
    examples = options.shard_examples or 10**9
    grace = options.grace if options.grace is not None else max(30.0, 0.05 * options.minutes * 60)
    known_failures = options.known_failures.read_text() if options.known_failures else None
    client, cluster = _client(distributed, options, resources)
    stop_name, queue_name = f"kvcache-stop-{uuid.uuid4().hex}", f"kvcache-started-{uuid.uuid4().hex}"
    stop, started = distributed.Event(stop_name, client=client), distributed.Queue(queue_name, client=client)
    progress, stopped, properties = Progress(), None, []
    interrupted = _Interrupted()
    try:
        try:
            properties = client.submit(collect, spec, options.select, options.oracle, pure=False,
                                       resources=resources).result(timeout=600)
        except Exception as error:  # raised on the worker: the implementation does not load there, say
            raise CampaignError(str(error)) from None
        print(f"campaign: {len(properties)} properties of {spec} on {_cluster_name(client)}, profile "
              f"{options.profile}, {options.minutes:g} min; report in {out}", flush=True)
        request = ShardRequest(Shard("", 0, 0), spec, options.profile, db, options.oracle, options.call_timeout,
                               known_failures, stop_name, queue_name)
        stopped = _schedule(client, distributed, progress, properties, request, resources, interrupted, stop,
                            started, examples=examples, first=min(first, examples),
                            shard_seconds=options.shard_seconds, deadline=progress.started + options.minutes * 60,
                            grace=grace, per_property=options.shards_per_property, exitfirst=options.exitfirst)
    finally:
        interrupted.restore()
        document = _write(out, progress, properties, stopped or interrupted.reason, spec, db, options,
                          _cluster_name(client))
        client.close()
        if cluster is not None:
            cluster.close()
    summary = document["summary"]
    print(f"campaign: {', '.join(f'{n} {o}' for o, n in summary.items() if n)}; "
          f"{'complete' if document['complete'] else 'INCOMPLETE (' + _why_incomplete(document) + ')'}; "
          f"report: {out / 'report.json'} and {out / 'report.md'}", flush=True)
    if document["campaign"]["unpublished"]:
        print(f"campaign: {document['campaign']['unpublished']} examples could not reach {db}; kept in "
              f"{document['campaign']['unpublished_file']}: python -m properties.campaign publish FILE --db URL",
              file=sys.stderr)
    if summary["failed"] or summary["xpassed"]:
        return 1
    return 0 if document["complete"] else 2


def _why_incomplete(document: dict[str, Any]) -> str:
    summary = document["summary"]
    return str(document["stopped"] or f"{summary['unfinished']} unfinished, {summary['not run']} not run "
                                      "in the time budget")


def _schedule(client: Any, distributed: Any, progress: Progress, properties: list[str], template: ShardRequest,
              resources: dict[str, float] | None, interrupted: _Interrupted, stop: Any, started: Any, *,
              examples: int, first: int, shard_seconds: float, deadline: float, grace: float,
              per_property: int | None, exitfirst: bool) -> str | None:
    """Keep every worker thread busy with shards until the budget, a failure (``exitfirst``) or an interrupt;
    return why the campaign stopped early (None: it ran its course)."""
    slots = max(1, sum(client.nthreads().values()))
    shards = _shards(properties, progress, per_property)
    in_flight: dict[Any, ShardRequest] = {}
    stopped: str | None = None
    stop_set_at: float | None = None
    last_line = time.monotonic()
    while True:
        now = time.monotonic()
        if stopped is None and interrupted.reason is not None:
            stopped = interrupted.reason
        if stop_set_at is None and (stopped is not None or now > deadline + grace):
            stop.set()  # running shards are stopped; each writes its report, marked incomplete
            stop_set_at = now
        while stopped is None and now < deadline and len(in_flight) < slots:
            shard = next(shards, None)
            if shard is None:
                break
            budget = _budget(shard.property, progress, examples, first, min(shard_seconds, deadline - now))
            if budget is None:
                break
            request = ShardRequest(**{**template.__dict__, "shard": Shard(shard.property, shard.index, budget)})
            future = client.submit(run_shard, request, key=f"shard-{uuid.uuid4().hex}", pure=False, retries=1,
                                   resources=resources)
            in_flight[future] = request
        if not in_flight:
            return stopped
        if stop_set_at is not None and now - stop_set_at > 90:  # the shards had STOP_GRACE to answer: give up
            for future, request in in_flight.items():
                future.cancel()
                progress.results.append(ShardResult(request, "unknown", "unknown", 0.0, -1, True, None,
                                                    output="no answer from its worker after the stop"))
            return stopped or "stopped"
        _drain(started, progress)
        time.sleep(0.5)
        for future in [f for f in in_flight if f.done()]:
            request = in_flight.pop(future)
            result = _result(future, request)
            progress.results.append(result)
            entry = campaign_report.shard_entry(result)
            _decide(progress, entry)
            print(f"  {request.shard.name} ({request.shard.examples} examples) on "
                  f"{result.worker}: {entry['outcome']}, {entry.get('runs', 0)} runs in {result.seconds:.1f} s"
                  + (f" -- {entry.get('reason')}" if entry["outcome"] not in ("passed",) and entry.get("reason")
                     else ""), flush=True)
            if exitfirst and stopped is None and entry["outcome"] in ("failed", "xpassed"):
                stopped = f"first failure (--exitfirst): {request.shard.property}"
            last_line = 0.0  # a progress line after every shard
        if time.monotonic() - last_line > PROGRESS_EVERY:
            print(progress.line(len(in_flight)), flush=True)
            last_line = time.monotonic()


def _shards(properties: list[str], progress: Progress, per_property: int | None) -> Iterator[Shard]:
    """Round robin over the undecided properties: every property's shard k before any property's shard k+1."""
    for index in itertools.count() if per_property is None else range(per_property):
        pending = [p for p in properties if p not in progress.outcome]
        if not pending:
            return
        for nodeid in pending:
            if nodeid not in progress.outcome:
                yield Shard(nodeid, index, 0)


def _budget(nodeid: str, progress: Progress, examples: int, first: int, seconds: float) -> int | None:
    """The shard's example budget: ``first`` until the property's rate is known, then what fits in ``seconds``
    (at most ``examples``); None if not even MIN_SHARD_EXAMPLES fit."""
    done = [r for r in progress.results if r.request.shard.property == nodeid]
    runs = sum(int(campaign_report.shard_entry(r).get("runs") or 0) for r in done)
    spent = sum(r.seconds for r in done)
    if not runs or spent <= 0:
        return first
    fits = int(0.9 * seconds * runs / spent)
    return min(examples, fits) if fits >= MIN_SHARD_EXAMPLES else None


def _decide(progress: Progress, entry: dict[str, Any]) -> None:
    if entry["outcome"] in TERMINAL:
        previous = progress.outcome.get(entry["property"])
        if previous is None or campaign_report.PRECEDENCE.index(entry["outcome"]) < \
                campaign_report.PRECEDENCE.index(previous):
            progress.outcome[entry["property"]] = entry["outcome"]


def _result(future: Any, request: ShardRequest) -> ShardResult:
    try:
        result: ShardResult = future.result()
        return result
    except Exception as error:  # KilledWorker (its workers kept dying), or a bug of the task itself
        return ShardResult(request, "unknown", "unknown", 0.0, -1, False, None,
                           output=f"the shard's task failed: {type(error).__name__}: {error}")


def _drain(queue: Any, progress: Progress) -> None:
    try:
        messages = queue.get(batch=True)
    except Exception:
        return
    for message in messages:
        attempt = progress.attempts[message["shard"]] = progress.attempts.get(message["shard"], 0) + 1
        print(f"  {message['shard']} started on {message['worker']}"
              + (f" again (attempt {attempt}: its worker died)" if attempt > 1 else ""), flush=True)


def _write(out: Path, progress: Progress, properties: list[str], stopped: str | None, spec: str, db: str | None,
           options: argparse.Namespace, cluster: str) -> dict[str, Any]:
    """Every trace, every kept-back example and the merged report, under ``out``."""
    traces: dict[str, str] = {}
    unpublished = ""
    for result in progress.results:
        for name, text in result.traces.items():
            path = out / "traces" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            traces[name] = str(path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path)
        unpublished += result.unpublished
    if unpublished:
        out.mkdir(parents=True, exist_ok=True)
        (out / "unpublished.jsonl").write_text(unpublished)
    seconds = time.monotonic() - progress.started
    total = progress.examples()
    profile = profiles.PROFILES[options.profile]
    campaign = {
        "cluster": cluster, "minutes": options.minutes, "db": databases.without_password(db) if db
        else None, "shards_done": len(progress.results), "examples": total, "seconds": round(seconds, 3),
        "examples_per_second": total / seconds if seconds > 0 else 0.0,
        "attempts": {name: n for name, n in progress.attempts.items() if n > 1},
        "unpublished": sum(1 for line in unpublished.splitlines() if line.strip()),
        "unpublished_file": str(out / "unpublished.jsonl") if unpublished else None,
        "profile": {"name": options.profile, "max_examples": max((r.request.shard.examples for r in progress.results),
                                                                  default=profile["max_examples"]),
                    "stateful_step_count": profile["stateful_step_count"], "derandomize": False},
    }
    document = campaign_report.merge(progress.results, properties, stopped=stopped, campaign=campaign,
                                     header=_header(spec, options.oracle), traces=traces)
    document["profile"] = campaign.pop("profile")
    campaign_report.write(document, out / "report.json")
    return document


def _header(spec: str, oracle: str) -> dict[str, Any]:
    """The report's sections about the implementation and the suite, from this machine (when no shard wrote any)."""
    facts = environment_facts()
    try:
        adapter = selection.load_adapter(spec)
        implementation, rule = implementation_facts(adapter, spec), "see the shards' reports"
    except selection.AdapterLoadError as error:
        implementation = {"implementation": spec, "implementation_version": "unknown", "spec": spec,
                          "dtype": "unknown", "capabilities": [], "layer_limits": None}
        rule = f"unknown: the implementation does not load here ({error})"
    return {"suite": {"version": facts["suite_version"], "commit": facts["suite_commit"]},
            "implementation": implementation,
            "environment": {k: facts[k] for k in ("python", "numpy", "hypothesis")},
            "oracle": oracle, "rule": rule, "known_failures": None}


def _distributed() -> Any:
    try:
        import distributed
    except ImportError:
        raise CampaignError(f"campaigns need the optional extra 'campaign' (dask distributed, redis): "
                            f"{databases.CAMPAIGN_EXTRA}") from None
    return distributed


def _client(distributed: Any, options: argparse.Namespace, resources: dict[str, float] | None) -> tuple[Any, Any]:
    if options.scheduler:
        try:
            return distributed.Client(options.scheduler, timeout=30), None
        except OSError as error:
            raise CampaignError(f"--scheduler {options.scheduler}: cannot connect ({error}); start one with "
                                "scripts/dask-local start, or leave --scheduler out for a LocalCluster") from None
    # Ctrl-C reaches the whole foreground process group: the workers must outlive it, so that the stopped shards
    # can hand back their reports. They inherit an ignored SIGINT; the campaign handles it (_Interrupted).
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        cluster = distributed.LocalCluster(n_workers=options.workers, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None, resources=resources)
    finally:
        signal.signal(signal.SIGINT, previous)
    return distributed.Client(cluster), cluster


def _cluster_name(client: Any) -> str:
    try:
        workers = client.scheduler_info()["workers"]
        return f"{client.scheduler.address} ({len(workers)} workers)"
    except Exception:
        return "an unreachable cluster"


def _resources(text: str | None) -> dict[str, float] | None:
    if not text:
        return None
    try:
        return {name.strip(): float(amount) for name, amount in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise CampaignError(f"--resources {text!r}: expected NAME=N[,NAME=N], e.g. GPU=1") from None


class _Interrupted:
    """Ctrl-C or SIGTERM: remembered, so that the campaign stops its shards and writes its report."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.reason is not None:  # a second Ctrl-C: no more waiting for the shards
            raise KeyboardInterrupt
        self.reason = "SIGTERM" if signum == signal.SIGTERM else "KeyboardInterrupt (SIGINT, Ctrl-C)"
        print(f"campaign: {self.reason}: stopping the shards, then writing the report", file=sys.stderr, flush=True)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


# -- prune and publish ----------------------------------------------------------------------------------------------

def _prune_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m properties.campaign prune",
        description="Replay every counterexample saved in the shared database for the implementation (any of its "
                    "versions) against the version installed here; delete those that no longer fail. Examples of "
                    "other implementations, suite versions, Hypothesis majors or oracles are not touched.")
    parser.add_argument(selection.OPTION, dest="spec", default=None, metavar="MODULE:FACTORY")
    parser.add_argument("--db", default=None, metavar="redis://HOST:PORT/N")
    parser.add_argument("--profile", default="dev", choices=SEARCH_PROFILES,
                        help="the program length the examples were saved with (default: %(default)s)")
    parser.add_argument("--oracle", default="float64", choices=selection.ORACLES)
    parser.add_argument("-k", dest="select", default=None, metavar="EXPRESSION")
    parser.add_argument("--out", type=Path, default=Path("counterexamples") / "prune",
                        help="traces of the examples that still fail (default: %(default)s)")
    return parser


def prune(options: argparse.Namespace) -> int:
    """One local pytest run of every property, replaying saved examples only, with deletion allowed."""
    db = _required_db(options.db)
    arguments = [sys.executable, "-m", "pytest", *suite_paths(),
                 "-p", "kvcache_conformance.campaign.plugin", "-p", "no:cacheprovider", "-q", "-rfs",
                 f"--kv-impl={selection.spec_from(options.spec)}", f"--hypothesis-profile={options.profile}",
                 f"--oracle={options.oracle}", "--kv-shard-role=prune", f"--kv-shard-db={db}",
                 f"--kv-traces={options.out.resolve()}", f"--kv-report={options.out.resolve() / 'report.json'}"]
    if options.select:
        arguments += ["-k", options.select]
    print("prune: failed = a counterexample that still fails (kept); passed = the saved examples no longer fail "
          "(deleted); skipped = nothing saved", flush=True)
    environment = {k: v for k, v in os.environ.items() if k != databases.SHARED_ENV_VAR}
    code = subprocess.call(arguments, cwd=working_directory(), env=environment)
    return 0 if code in (0, 1, 5) else code


def _publish_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m properties.campaign publish",
                                     description="Save examples kept back while the shared database was away.")
    parser.add_argument("file", type=Path, help="an unpublished.jsonl a campaign wrote")
    parser.add_argument("--db", default=None, metavar="redis://HOST:PORT/N")
    return parser


def _required_db(option: str | None) -> str:
    url = databases.shared_url(option)
    if url is None:
        raise CampaignError(f"needs --db redis://HOST:PORT/N (or ${databases.SHARED_ENV_VAR})")
    return url


if __name__ == "__main__":
    sys.exit(main())
