"""Inside one shard's pytest process (``-p kvcache_conformance.campaign.plugin``): its example budget and the
shared database.

A shard is an ordinary pytest run of one property, so its verdict is
pytest's and the per-call watchdog (SIGALRM) has a main thread. What this
plugin changes, after ``conftest.py`` has chosen the implementation and
registered the profiles: the example budget (``--kv-shard-examples``) and a
shared database the run may save to, never delete from (``write``), or, for
``python -m properties.campaign prune``, replay and delete from (``prune``:
only the saved examples are run).
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

import pytest
from hypothesis import Phase, settings

from ..run import databases, profiles, selection

PROFILE = "campaign-shard"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache-campaign", "a shard of a campaign (set by python -m properties.campaign)")
    group.addoption("--kv-shard-db", default=None, metavar="URL", help="the shared database this shard uses")
    group.addoption("--kv-shard-role", default="write", choices=("write", "prune"),
                    help="write: save to the shared database, never delete; prune: replay saved examples only, "
                         "delete those that no longer fail")
    group.addoption("--kv-shard-examples", type=int, default=None, metavar="N", help="the shard's example budget")
    group.addoption("--kv-shard-unpublished", default=None, metavar="PATH",
                    help="where examples the shared database refused are kept")
    group.addoption("--kv-shard-parent", type=int, default=None, metavar="PID",
                    help="end this run when process PID (the Dask task that started it) dies")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:  # after every pytest_configure, conftest's included
    config = session.config
    parent = config.getoption("--kv-shard-parent")
    if parent is not None:
        _end_with_parent(parent)
    name = profiles.load(config.getoption("hypothesis_profile", None))
    problem = profiles.shared_database_problem(name)
    url = config.getoption("--kv-shard-db")
    role = config.getoption("--kv-shard-role")
    if problem and (url or role == "prune"):
        raise pytest.UsageError(problem)
    database = settings.default.database
    if url:
        unpublished = config.getoption("--kv-shard-unpublished")
        scope = databases.SharedScope.of(selection.selected(), selection.oracle_name())
        try:
            shared = databases.open_shared(url, scope, strict=role == "prune",
                                           unpublished=Path(unpublished) if unpublished else None)
        except databases.SharedDatabaseError as error:
            raise pytest.UsageError(str(error)) from None
        database = databases.SuiteDatabase(None if role == "prune" else database, shared, role)
        config.stash[_SHARED] = shared
    elif role == "prune":
        raise pytest.UsageError("--kv-shard-role prune needs --kv-shard-db")
    examples = config.getoption("--kv-shard-examples") or settings.default.max_examples
    phases = (Phase.explicit, Phase.reuse) if role == "prune" else settings.default.phases
    settings.register_profile(PROFILE, parent=settings.get_profile(name), max_examples=examples, database=database,
                              phases=phases)
    settings.load_profile(PROFILE)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    shared = terminalreporter.config.stash.get(_SHARED, None)
    if shared is None:
        return
    connection = shared.connection
    terminalreporter.write_line(f"kvcache shared database {connection.where}: {connection.saved} saved, "
                                f"{connection.deleted} deleted, {connection.kept_back} kept back"
                                + (f" (unreachable: {connection.lost})" if connection.lost else ""))


_SHARED = pytest.StashKey[databases.SharedExamples]()


def _end_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent dies (Linux), so a killed worker leaves no orphan shard behind."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it died before we asked
        os.kill(os.getpid(), signal.SIGTERM)
