"""Campaigns for real: a LocalCluster, a scheduler with two worker processes over TCP on loopback, a Redis server.

Each test starts what it needs (tests/campaigns/conftest.py) and stops it,
and every subprocess has a time limit. The implementation under attack is
``tests.campaigns.adapters:OffOnInterleavedMha`` (one property of all fails)
or a mutant of the reference (tests/mutants.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import Phase

from kvcache_conformance.judge.failures import NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.databases import SharedScope, SuiteDatabase, open_shared, publish
from kvcache_conformance.run.runner import run_machine
from tests.campaigns.adapters import OffOnInterleavedMha
from tests.campaigns.conftest import ROOT, free_port, start_redis, stop_redis
from tests.mutants import MUTANTS, build

pytestmark = [pytest.mark.slow, pytest.mark.campaign]

OFF = "tests.campaigns.adapters:OffOnInterleavedMha"
FAILING = "properties/test_layer_cache.py::test_layer_cache_conforms"  # one property, every layer family
LOCAL_DATABASE = ROOT / ".hypothesis" / "implementations" / OffOnInterleavedMha.name


def _campaign(*arguments: str, env: dict[str, str] | None = None, timeout: float = 240) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "properties.campaign", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return done.returncode, done.stdout + done.stderr


def _pytest(*arguments: str, report: Path) -> tuple[dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *arguments,
                           f"--kv-report={report}"], cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={k: v for k, v in os.environ.items() if k != "KVCACHE_DB"})
    output = done.stdout + done.stderr
    assert report.exists(), output
    return json.loads(report.read_text()), output


def _entry(document: dict[str, Any], nodeid: str) -> dict[str, Any]:
    return next(e for e in document["properties"] if e["property"] == nodeid)


@pytest.fixture
def clean_local_database() -> Any:
    """The test implementation's local database, which workers and ordinary runs on this machine write."""
    shutil.rmtree(LOCAL_DATABASE, ignore_errors=True)
    yield
    shutil.rmtree(LOCAL_DATABASE, ignore_errors=True)


def test_a_campaign_on_a_local_cluster_finds_a_mutant_and_writes_its_trace(campaign_extra: None,
                                                                           tmp_path: Path) -> None:
    mutant = next(m for m in MUTANTS if m.name == "full_check_off_by_one")
    spec = build(mutant, tmp_path / "mutants")
    out = tmp_path / "campaign"
    code, output = _campaign(f"--kv-impl={spec}", "--workers=2", "--minutes=3", "--shards-per-property=1",
                             "--shard-examples=300", "-k",
                             "test_layer_cache_conforms or test_decode_session_conforms",
                             f"--out={out}",
                             env={"PYTHONPATH": str(tmp_path / "mutants")})
    assert code == 1, output  # a failure found
    document = json.loads((out / "report.json").read_text())
    entry = _entry(document, FAILING)
    assert entry["outcome"] == "failed" and entry["failure_kind"], output
    trace = ROOT / entry["trace"] if not Path(entry["trace"]).is_absolute() else Path(entry["trace"])
    assert trace.exists() and trace.parent == out / "traces"
    assert json.loads(trace.read_text())["recorded_with"]["implementation"] == f"impl-mutant-{mutant.name}"
    assert document["complete"] and document["summary"]["failed"] >= 1
    assert len(document["campaign"]["shards"]) == 2 and "LocalCluster" not in document["campaign"]["cluster"]
    assert "## Campaign" in (out / "report.md").read_text()
    assert "examples/s" in output and "shards:" in output  # live progress


def test_a_workers_counterexample_reaches_a_fresh_pytest_and_survives_everything_else(
        redis_server: tuple[str, int, Path], dask_cluster: tuple[str, Path], tmp_path: Path,
        clean_local_database: None) -> None:
    url, _, _ = redis_server
    scheduler, _ = dask_cluster
    code, output = _campaign(f"--kv-impl={OFF}", f"--scheduler={scheduler}", f"--db={url}", "--minutes=3",
                             "--shards-per-property=1", "--shard-examples=200", "-k",
                             "test_layer_cache_conforms",
                             f"--out={tmp_path / 'campaign'}")
    assert code == 1, output
    document = json.loads((tmp_path / "campaign" / "report.json").read_text())
    assert _entry(document, FAILING)["outcome"] == "failed"
    assert {s["worker"] for s in document["campaign"]["shards"]} <= set(_workers(scheduler)), "not on the cluster"
    shutil.rmtree(LOCAL_DATABASE, ignore_errors=True)  # what this machine's workers kept: only Redis has it now

    # It survives runs with every right to delete (no read-only wrapper) of every other property, of another
    # implementation, and of a version that passes it under another suite version: passing runs, which would
    # delete it had they replayed it.
    from impl.conformance import ReferenceAdapter
    from tests.campaigns.adapters import FixedOffOnInterleavedMha
    from tests.test_example_databases import OTHERS

    adapter: Any = OffOnInterleavedMha()
    reference: Any = ReferenceAdapter()
    fixed: Any = FixedOffOnInterleavedMha()
    same = (FAILING, "layer_cache", {})
    runs = [(adapter, SharedScope.of(adapter), other) for other in OTHERS]
    runs += [(reference, SharedScope.of(reference), same),
             (fixed, SharedScope.of(fixed, suite_version="0.0.0-another"), same)]
    saved = _contents(url)
    assert saved
    for who, scope, (property_id, machine, parameters) in runs:
        deleting = SuiteDatabase(None, open_shared(url, scope, strict=True), "prune")
        chosen = profiles.settings_for("dev", max_examples=5, database=deleting, report_multiple_bugs=False,
                                       phases=[Phase.reuse, Phase.generate])
        result = run_machine(machine, who, property_id=property_id, parameters=parameters, settings=chosen)
        assert result.failure is None, (property_id, who.name, scope, result.failure)
        assert _contents(url) >= saved, f"{property_id} of {who.name} under {scope} deleted a shared example"

    replayed, text = _pytest(FAILING, f"--kv-impl={OFF}", "--hypothesis-profile=replay", f"--kv-db={url}",
                             "--kv-causes=1",  # the runs counted are then the first cause's only
                             f"--kv-traces={tmp_path / 'traces'}", report=tmp_path / "replayed.json")
    entry = _entry(replayed, FAILING)
    assert entry["outcome"] == "failed", text
    assert entry["runs"] <= 2, entry  # the first example it ran failed (then Hypothesis ran it once more to report)
    shutil.rmtree(LOCAL_DATABASE, ignore_errors=True)  # that run kept it locally, as ordinary runs do
    alone, text = _pytest(FAILING, f"--kv-impl={OFF}", "--hypothesis-profile=replay",
                          report=tmp_path / "alone.json")
    assert _entry(alone, FAILING)["outcome"] == "skipped", text  # without --kv-db: nothing to replay
    dev, text = _pytest(FAILING, f"--kv-impl={OFF}", "--hypothesis-profile=dev", f"--kv-db={url}",
                        f"--kv-traces={tmp_path / 'traces'}", report=tmp_path / "dev.json")
    assert _entry(dev, FAILING)["outcome"] == "failed", text  # an ordinary run replays it first too


def test_killing_a_worker_mid_shard_does_not_lose_the_campaign(dask_cluster: tuple[str, Path],
                                                               tmp_path: Path) -> None:
    scheduler, directory = dask_cluster
    out = tmp_path / "campaign"
    process = subprocess.Popen([sys.executable, "-m", "properties.campaign", f"--scheduler={scheduler}",
                                "--minutes=3", "--shards-per-property=1", "--shard-examples=150", "-k",
                                "test_decode_session_conforms or test_layer_cache_conforms",
                                f"--out={out}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("campaign: 2 properties"), first
        started = []  # kill once both shards are known to run (150 examples take ~20 s): a fixed sleep was too
        while len(started) < 2:  # long on an idle machine, where 30 examples were done in 4 s
            line = process.stdout.readline()
            assert line, "the campaign ended before both shards started"
            first += line
            started += [line] if " started on " in line else []
        victim = int((directory / "worker-1.pid").read_text())
        os.killpg(victim, signal.SIGKILL)  # the worker, its nanny: gone without a word
        rest, _ = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = first + rest
    assert process.returncode == 0, output
    document = json.loads((out / "report.json").read_text())
    assert document["complete"] and document["summary"]["passed"] == 2, output
    assert list(document["campaign"]["attempts"].values()) == [2], output  # one shard ran again, elsewhere
    assert "again (attempt 2: its worker died)" in output
    time.sleep(1)
    orphans = subprocess.run(["pgrep", "-f", f"kv-shard-parent=.*{out.name}|kv-shard-examples=150"],
                             capture_output=True, text=True).stdout.split()
    assert not orphans, "a shard outlived its worker"


@pytest.mark.parametrize("how", ["SIGTERM to the campaign", "SIGINT to the group"])
def test_an_interrupted_campaign_writes_its_report_marked_incomplete(campaign_extra: None, tmp_path: Path,
                                                                      how: str) -> None:
    out = tmp_path / "campaign"
    # The first shard's budget is its profile's: thorough's 1,000 examples of 80 steps take a minute, so the
    # signal lands inside it (dev's 100 took under 5 s once the machines got faster, and passed before it).
    process = subprocess.Popen([sys.executable, "-m", "properties.campaign", "--workers=1", "--minutes=5",
                                "--profile=thorough", "--shard-examples=100000", "-k", "test_decode_session_conforms",
                                f"--out={out}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True,  # its own process group, as a terminal's foreground job
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith("campaign: 1 properties"), first
        first += process.stdout.readline()
        assert "#0 started on" in first, first
        time.sleep(2)  # inside its pytest run
        if how == "SIGTERM to the campaign":
            process.send_signal(signal.SIGTERM)
        else:
            os.killpg(process.pid, signal.SIGINT)
        rest, _ = process.communicate(timeout=150)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    output = first + rest
    assert process.returncode == 2, output
    document = json.loads((out / "report.json").read_text())
    assert document["complete"] is False, output
    assert document["stopped"] == ("SIGTERM" if "SIGTERM" in how else "KeyboardInterrupt (SIGINT, Ctrl-C)")
    entry = _entry(document, "properties/test_session.py::test_decode_session_conforms")
    assert entry["outcome"] == "unfinished", (entry, output)  # never a pass
    assert [s["stopped_by_campaign"] for s in document["campaign"]["shards"]] == [True], output  # it handed it back
    assert "**Incomplete run**" in (out / "report.md").read_text()


def test_an_unreachable_redis_is_a_clear_error(campaign_extra: None, tmp_path: Path) -> None:
    nobody = f"redis://127.0.0.1:{free_port()}/0"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--kv-db", nobody,
                           "--hypothesis-profile=dev", "properties/test_session.py"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 4 and f"--kv-db {nobody}: cannot reach Redis" in done.stderr, done.stderr
    code, output = _campaign(f"--db={nobody}", "--minutes=1", f"--out={tmp_path}")
    assert code == 4 and "cannot reach Redis" in output, output
    ci = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--kv-db", nobody,
                         "--hypothesis-profile=ci", "properties/test_session.py"], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
    assert ci.returncode == 4 and "--hypothesis-profile replay" in ci.stderr, ci.stderr


def test_redis_going_away_mid_run_keeps_the_counterexample_and_says_so(campaign_extra: None, tmp_path: Path) -> None:
    port, directory = free_port(), tmp_path / "redis"
    url = start_redis(port, directory)
    adapter: Any = OffOnInterleavedMha()
    try:
        kept = tmp_path / "unpublished.jsonl"
        shared = open_shared(url, SharedScope.of(adapter), unpublished=kept)
        local = tmp_path / "local"
        from hypothesis.database import DirectoryBasedExampleDatabase

        database = SuiteDatabase(DirectoryBasedExampleDatabase(local), shared, "write")
        stop_redis(port, directory)  # gone before the run has saved anything
        chosen = profiles.settings_for("dev", max_examples=30, stateful_step_count=12, database=database,
                                       report_multiple_bugs=False)
        with pytest.warns(UserWarning, match="is unreachable .* kept locally and in .*unpublished.jsonl"):
            found = run_machine("layer_cache", adapter, property_id=FAILING,
                                parameters={}, settings=chosen)
        assert isinstance(found.failure, NonConformance)
        assert kept.read_text().strip(), "nothing kept back"

        start_redis(port, directory)  # back: publish what was kept, and a fresh reader replays it first
        assert publish(kept, url) >= 1
        reader = SuiteDatabase(None, open_shared(url, SharedScope.of(adapter), strict=True), "prune")
        replay = profiles.settings_for("dev", stateful_step_count=12, database=reader, report_multiple_bugs=False,
                                       phases=[Phase.reuse])
        again = run_machine("layer_cache", adapter, property_id=FAILING,
                            parameters={}, settings=replay)
        assert isinstance(again.failure, NonConformance) and again.first_failing == 1
    finally:
        stop_redis(port, directory)


def _contents(url: str) -> set[tuple[bytes, bytes]]:
    """Every (key, value) this suite keeps in the Redis database at ``url``."""
    import redis

    client = redis.Redis.from_url(url)
    return {(key, value) for key in client.scan_iter(match=b"kvcache-conformance:*") for value in
            client.smembers(key)}


def _workers(scheduler: str) -> list[str]:
    from distributed import Client

    with Client(scheduler, timeout=30) as client:
        return list(client.scheduler_info()["workers"])
