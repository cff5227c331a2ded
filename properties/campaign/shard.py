"""One shard of a campaign, as a Dask task: a pytest process of its own, on whichever worker runs it.

A shard is one property (a pytest node id), an index and an example
budget: a pytest run of that property drawing at most that many examples
from a random stream of its own. No seed is forced: Hypothesis turns its
database off under ``--hypothesis-seed``, and the database is what makes a
counterexample reach everyone (a failure is reproduced from its trace or
from the database, not from a seed).

Dask runs tasks in threads, and the per-call watchdog
(``verdict._watchdog``) needs SIGALRM on a main thread: so the task starts a
pytest process for the shard, waits for it, and hands back what it wrote --
its report (the format of ``--kv-report``), its traces and any examples the
shared database refused -- so that nothing stays behind on the worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..run.provenance import suite_paths, working_directory

STOP_POLL = 1.0  # seconds between looks at the campaign's stop event
STOP_GRACE = 60.0  # seconds a stopped shard has to write its report before it is killed


@dataclass(frozen=True)
class Shard:
    """The ``index``-th shard of ``property``: at most ``examples`` examples."""

    property: str
    index: int
    examples: int

    @property
    def name(self) -> str:
        return f"{self.property}#{self.index}"


@dataclass(frozen=True)
class ShardRequest:
    """A shard and how the campaign runs it (everything a worker needs: it may be another machine)."""

    shard: Shard
    spec: str  # the implementation's module:factory, importable on the worker
    profile: str
    db: str | None = None
    oracle: str = "float64"
    call_timeout: float | None = None
    known_failures: str | None = None  # the file's text: the driver's path means nothing on a worker
    stop_event: str | None = None  # a distributed.Event: set, the shard is stopped and reports what it has
    started_queue: str | None = None  # a distributed.Queue told when the shard starts (progress, attempts)


@dataclass
class ShardResult:
    request: ShardRequest
    worker: str
    host: str
    seconds: float
    exit_code: int
    stopped: bool  # by the campaign (time budget, first failure, Ctrl-C), not by itself
    report: dict[str, Any] | None  # the shard's --kv-report document, None if it never wrote one
    traces: dict[str, str] = field(default_factory=dict)  # file name -> text
    unpublished: str = ""  # jsonl: examples the shared database refused (databases.publish)
    output: str = ""  # the end of pytest's output


def command(request: ShardRequest, directory: Path) -> list[str]:
    """The shard's pytest command line."""
    shard = request.shard
    arguments = [sys.executable, "-m", "pytest", shard.property, "-p", "kvcache_conformance.campaign.plugin",
                 "-p", "no:cacheprovider", "-q", "-rfE", f"--kv-impl={request.spec}", f"--oracle={request.oracle}",
                 f"--hypothesis-profile={request.profile}", "--hypothesis-show-statistics",
                 f"--kv-shard-examples={shard.examples}", f"--kv-traces={directory / 'traces'}",
                 f"--kv-report={directory / 'report.json'}",
                 f"--kv-shard-parent={os.getpid()}"]
    if request.db:
        arguments += [f"--kv-shard-db={request.db}", f"--kv-shard-unpublished={directory / 'unpublished.jsonl'}"]
    if request.call_timeout is not None:
        arguments.append(f"--kv-call-timeout={request.call_timeout}")
    if request.known_failures is not None:
        (directory / "known-failures.txt").write_text(request.known_failures)
        arguments.append(f"--kv-xfails={directory / 'known-failures.txt'}")
    return arguments


def run_shard(request: ShardRequest) -> ShardResult:
    """The Dask task: run the shard's pytest process to its end, or until the campaign's stop event is set."""
    worker = _worker_address()
    if request.started_queue:
        _tell(request.started_queue, {"shard": request.shard.name, "worker": worker})
    stop = _event(request.stop_event)
    environment = {k: v for k, v in os.environ.items() if k != "KVCACHE_DB"}  # the shard's database is explicit
    with tempfile.TemporaryDirectory(prefix="kvcache-shard-") as temporary:
        directory = Path(temporary)
        started = time.monotonic()
        with (directory / "output.txt").open("w") as output:
            process = subprocess.Popen(command(request, directory), cwd=working_directory(), env=environment,
                                       stdout=output, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # Ctrl-C is the driver's
            stopped = _wait(process, stop)
        seconds = time.monotonic() - started
        report_path = directory / "report.json"
        report = json.loads(report_path.read_text()) if report_path.exists() else None
        traces = {path.name: path.read_text() for path in sorted((directory / "traces").glob("*.json"))}
        unpublished = directory / "unpublished.jsonl"
        text = (directory / "output.txt").read_text()
        return ShardResult(request, worker, socket.gethostname(), seconds, process.returncode, stopped, report,
                           traces, unpublished.read_text() if unpublished.exists() else "", text[-4000:])


def _wait(process: subprocess.Popen[bytes], stop: Any) -> bool:
    """Wait for ``process``; if ``stop`` is set first, SIGTERM it (it writes an incomplete report) and say so."""
    while process.poll() is None:
        try:
            process.wait(timeout=STOP_POLL)
        except subprocess.TimeoutExpired:
            pass
        if process.poll() is None and stop is not None and _is_set(stop):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            return True
    return False


def _worker_address() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except (ImportError, ValueError):
        return "not a Dask worker"


def _event(name: str | None) -> Any:
    if name is None:
        return None
    from distributed import Event

    return Event(name)


def _is_set(event: Any) -> bool:
    try:
        return bool(event.is_set())
    except Exception:  # the scheduler is gone: nobody is left to collect the shard, so finish it
        return False


def _tell(queue: str, message: dict[str, Any]) -> None:
    from distributed import Queue

    try:
        Queue(queue).put(message)
    except Exception:  # progress only: a shard never fails for it
        pass


def collect(spec: str, select: str | None = None, oracle: str = "float64") -> list[str]:
    """The node ids of the properties a campaign runs (collected where the implementation is installed).

    The regression corpus is left out: its traces replay the same way every
    time, and every ordinary run replays them."""
    arguments = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *suite_paths(),
                 f"--kv-impl={spec}", f"--oracle={oracle}"]
    if select:
        arguments += ["-k", select]
    environment = {k: v for k, v in os.environ.items() if k != "KVCACHE_DB"}
    done = subprocess.run(arguments, cwd=working_directory(), env=environment, capture_output=True, text=True,
                          timeout=300)
    found = [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if done.returncode not in (0, 5) or not found:
        raise RuntimeError(f"collecting the properties failed (pytest exit status {done.returncode}):\n"
                           f"{(done.stdout + done.stderr)[-3000:]}")
    return found
