"""Servers for the campaign tests, started by the scripts a user runs and always stopped: Redis and a Dask cluster.

Skipped, with the reason, only when the optional extra 'campaign' is not
installed; tox's ``campaign`` env installs it, and ``scripts/redis-local``
installs Debian's redis-server if it is missing.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXTRA = 'needs the optional extra \'campaign\' (pip install -e ".[campaign]"; tox -e campaign)'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def campaign_extra() -> None:
    pytest.importorskip("distributed", reason=EXTRA)
    pytest.importorskip("redis", reason=EXTRA)


@pytest.fixture(scope="session")
def redis_server(campaign_extra: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Path]]:
    """(URL, port, directory) of a fresh Redis server on loopback."""
    port, directory = free_port(), tmp_path_factory.mktemp("redis")
    url = start_redis(port, directory)
    try:
        yield url, port, directory
    finally:
        stop_redis(port, directory)


def start_redis(port: int, directory: Path) -> str:
    done = subprocess.run([str(ROOT / "scripts" / "redis-local"), "start", str(port), str(directory)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def stop_redis(port: int, directory: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "redis-local"), "stop", str(port), str(directory)], capture_output=True,
                   timeout=60)


@pytest.fixture
def dask_cluster(campaign_extra: None, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """(scheduler address, directory with worker-N.pid) of a scheduler and two worker processes on loopback."""
    port = free_port()
    script = [str(ROOT / "scripts" / "dask-local")]
    environment = {**os.environ, "PYTHON": os.environ.get("PYTHON", _python())}
    try:
        done = subprocess.run([*script, "start", "2", str(port), str(tmp_path)], capture_output=True, text=True,
                              timeout=180, env=environment)
        assert done.returncode == 0, done.stdout + done.stderr
        yield done.stdout.strip().splitlines()[-1], tmp_path
    finally:
        subprocess.run([*script, "stop", "2", str(port), str(tmp_path)], capture_output=True, timeout=60)


def _python() -> str:
    import sys

    return sys.executable
