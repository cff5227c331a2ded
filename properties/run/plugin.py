"""The pytest plugin of the suite: which implementation, which oracle, which Hypothesis profile.

Registered through the ``pytest11`` entry point, so every pytest run in an
environment with the suite installed loads it; it stays inert unless the run
is the suite's (``_is_the_suite``): an implementation named, or the suite's
own files among what pytest was asked to collect. Nothing is loaded then, no
Hypothesis profile changed.

``--kv-impl module:factory`` (or ``KVCACHE_IMPL``) picks the implementation,
``--oracle float64|mpmath`` the ground truth the machines compare with,
``--hypothesis-profile`` (or ``HYPOTHESIS_PROFILE``) one of
``run/profiles.py``. Every pytest process -- each xdist worker too --
resolves them here, once. ``--kv-traces`` is where counterexample traces go,
``--kv-regressions`` adds trace corpora to replay, ``--kv-examples`` where the
example databases are, ``--kv-call-timeout``
bounds every call into the implementation, ``--kv-report`` writes the
conformance report, ``--kv-xfails`` baselines known failures
(``run/known_failures.py``), ``--kv-db redis://HOST:PORT/N`` (or
``KVCACHE_DB``) replays a shared example database first, read-only
(docs/campaigns.md).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ..judge import calls
from ..judge.failures import SuiteError, check_of, kind_of
from ..judge.tolerance import Judge
from ..machines import MACHINES
from ..protocol.declarations import LayerLimits
from . import budget, databases, exercise, first_failure, known_failures, profiles, runner, selection
from .identity import PACKAGE_DIR, is_suite_file
from .report import ConformanceReport, examples_from_statistics
from .runner import PropertyRun

# Everything a run writes goes under the directory it runs from, never into the installed package.
DATABASES = Path(".hypothesis") / "implementations"
TRACES = Path("counterexamples")
FAST_SHRINK_SECONDS = 5.0  # under -x: the first failure fast, shrunk as far as five seconds go
REGRESSIONS = PACKAGE_DIR / "regressions"  # the suite's own corpus: package data
CHECKOUT = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "impl").is_dir() else None  # a clone of the repository
_ACTIVE = pytest.StashKey[bool]()
SUITE_CHECK = "kv_suite_check"  # the marker of a property that checks only the suite itself


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.register(_Activation(), "kvcache-activation")
    group = parser.getgroup("kvcache", "KV-cache conformance suite")
    group.addoption(selection.OPTION, default=None, metavar="MODULE:FACTORY",
                    help=f"adapter factory of the implementation under test "
                         f"(default: ${selection.ENV_VAR} or {selection.DEFAULT_SPEC})")
    group.addoption("--oracle", default="float64", choices=selection.ORACLES,
                    help="ground truth for the machines: float64, or mpmath high precision (slow)")
    group.addoption("--kv-traces", default=str(TRACES), metavar="DIR",
                    help="where a failing machine writes its counterexample trace (default: %(default)s, under the "
                         "directory pytest runs from)")
    group.addoption("--kv-examples", default=str(DATABASES), metavar="DIR",
                    help="where each implementation's Hypothesis example database goes (default: %(default)s, under "
                         "the directory pytest runs from)")
    group.addoption("--kv-regressions", action="append", default=[], metavar="DIR",
                    help="also replay every trace in DIR (always: the suite's own corpus)")
    group.addoption("--kv-call-timeout", type=float, default=calls.CALL_TIMEOUT, metavar="SECONDS",
                    help="a call into the implementation that takes longer is a non-conformance naming the step "
                         "(default: %(default)s; 0: no limit)")
    group.addoption("--kv-causes", type=int, default=None, metavar="N",
                    help=f"after a property fails, search it again with the causes found set aside, up to N distinct "
                         f"causes in all (default {runner.MAX_CAUSES}; 1 under -x / --maxfail: the first failure "
                         "fast)")
    group.addoption("--kv-cause-seconds", type=float, default=None, metavar="SECONDS",
                    help=f"no new search for a further cause of a failing property starts after this long "
                         f"(default {runner.CAUSE_SECONDS:g}); the report says where each search stopped")
    group.addoption("--kv-shrink-seconds", type=float, default=None, metavar="SECONDS",
                    help=f"stop shrinking a failure after this long; its trace is then the shortest failing run "
                         f"found, and says so (default {runner.SHRINK_SECONDS:g}; {FAST_SHRINK_SECONDS:g} under -x / "
                         "--maxfail)")
    group.addoption(budget.OPTION, default=None, metavar="DURATION",
                    help=f"a time budget for the whole run (90s, 10m, 1h30m), shared by the machine properties and "
                         f"xdist's workers: a property whose share is spent stops before its next example and is "
                         f"reported cut short, never passed (default: none; "
                         f"{budget.describe_seconds(budget.FIRST_FAILURE_BUDGET)} under -x / --maxfail; 0: none)")
    group.addoption("--kv-report", default=None, metavar="PATH",
                    help="write the conformance report to PATH (JSON) and PATH with suffix .md (Markdown)")
    group.addoption(known_failures.OPTION, default=None, metavar="FILE",
                    help="known failures: one 'PROPERTY [:: RULE]  # REASON' a line; a property is expected to "
                         "fail (strict xfail), or a rule of its machine is left out (docs/adapters.md)")
    group.addoption(databases.SHARED_OPTION, default=None, metavar="redis://HOST:PORT/N",
                    help=f"replay the counterexamples of a shared Redis example database first, reading it only; "
                         f"this run's own go to the local one (default: ${databases.SHARED_ENV_VAR}; "
                         f"needs the extra 'campaign'; docs/campaigns.md)")


def _is_the_suite(config: pytest.Config) -> bool:
    """Whether this pytest run is the suite's: an implementation named, or the suite's files (its properties; in a
    clone, anything of the repository) among the paths or ``--pyargs`` modules pytest was asked to collect; or a
    conformance report asked for."""
    if config.getoption(selection.OPTION) or os.environ.get(selection.ENV_VAR) or config.getoption("--kv-report"):
        return True
    where = config.invocation_params.dir
    for argument in config.args:
        name = argument.split("::")[0]
        if config.getoption("pyargs", False) and name.split(".")[0] in ("kvcache_conformance", "properties"):
            return True
        path = (where / name).resolve()
        roots = [PACKAGE_DIR, *([CHECKOUT] if CHECKOUT else [])]
        if any(path == root or path.is_relative_to(root) for root in roots):
            return True
    return False


def _active(config: pytest.Config) -> bool:
    return config.stash.get(_ACTIVE, False)


@pytest.hookimpl(tryfirst=True)  # before Hypothesis loads --hypothesis-profile, which may name one of ours
def pytest_configure(config: pytest.Config) -> None:
    if _is_the_suite(config):
        profiles.register()


class _Activation:
    """The rest of the configuration, after Hypothesis's (a second pytest_configure; registered with the options)."""

    @pytest.hookimpl(trylast=True)  # after Hypothesis has loaded --hypothesis-profile
    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", f"{known_failures.FORMER_IDS}(ids): the parametrised properties this "
                                           "one replaced, {suffix: machine parameters} (run/known_failures.py)")
        config.addinivalue_line("markers", f"{SUITE_CHECK}(why): checks the suite itself and runs no adapter code: "
                                           "reported apart from the implementation's verdict")
        if _is_the_suite(config):
            _activate(config)


def _activate(config: pytest.Config) -> None:
    """Resolve the implementation, the oracle and the profiles, and register the parts of the plugin that run."""
    config.stash[_ACTIVE] = True
    profiles.register()
    profiles.load(config.getoption("hypothesis_profile", None))
    try:
        adapter = selection.configure(config.getoption(selection.OPTION), config.getoption("--oracle"))
    except selection.AdapterLoadError as error:
        raise pytest.UsageError(str(error)) from None
    databases_root = config.invocation_params.dir / config.getoption("--kv-examples")
    profiles.register(databases_root, selection.database_key(adapter), shared=_shared_database(config, adapter))
    profiles.load(config.getoption("hypothesis_profile", None))
    calls.CALL_TIMEOUT = config.getoption("--kv-call-timeout")
    causes = config.getoption("--kv-causes")
    if causes is not None and causes < 1:
        raise pytest.UsageError("--kv-causes must be 1 or more")
    runner.MAX_CAUSES = causes if causes is not None else 1 if config.getoption("maxfail", 0) else runner.MAX_CAUSES
    cause_seconds = config.getoption("--kv-cause-seconds")
    if cause_seconds is not None and cause_seconds < 0:
        raise pytest.UsageError("--kv-cause-seconds must be 0 or more")
    if cause_seconds is not None:
        runner.CAUSE_SECONDS = cause_seconds
    shrink = config.getoption("--kv-shrink-seconds")
    runner.SHRINK_SECONDS = shrink if shrink is not None else FAST_SHRINK_SECONDS if config.getoption(
        "maxfail", 0) else runner.SHRINK_SECONDS
    _budget(config)
    xfails = config.getoption(known_failures.OPTION)
    if xfails:
        specs = [(name, spec.kind) for machine in MACHINES.values() for name, spec in machine.specs().items()]
        try:
            entries = known_failures.load(Path(xfails), rules={name for name, kind in specs if kind == "rule"},
                                          setup_rules={name for name, kind in specs if kind == "initialize"})
        except known_failures.KnownFailuresError as error:
            raise pytest.UsageError(str(error)) from None
        config.pluginmanager.register(known_failures.KnownFailures(Path(xfails), entries), "kvcache-known-failures")
    if config.getoption("maxfail", 0) and not config.getoption("numprocesses", None) and not hasattr(
            config, "workerinput"):
        config.pluginmanager.register(first_failure.FirstFailure(), "kvcache-first-failure")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(CauseSearches(), "kvcache-cause-searches")
        config.pluginmanager.register(SuiteErrors(), "kvcache-suite-errors")
        config.pluginmanager.register(exercise.ExerciseSummary(adapter.capabilities), "kvcache-exercise")
    report = config.getoption("--kv-report")
    if report and not hasattr(config, "workerinput"):  # the controller collects what the workers report
        config.pluginmanager.register(ConformanceReport(Path(report).resolve(), Path(xfails) if xfails else None),
                                      "kvcache-report")


class CauseSearches:
    """At the end of the run, on the terminal: the failing properties whose search for causes stopped at a bound,
    and the option that lifts it (the report lists them too)."""

    def __init__(self) -> None:
        self.bounded: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        search = dict(report.user_properties).get("kv_cause_search")
        if isinstance(search, dict) and search.get("bound"):
            self.bounded[report.nodeid] = search

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.bounded:
            return
        terminalreporter.section("kvcache: cause searches stopped at a bound")
        for nodeid, search in self.bounded.items():
            terminalreporter.write_line(f"{nodeid}: {search['said']}")


class SuiteErrors:
    """At the end of the run, on the terminal: every suite error met (a bug of the suite, counted by pytest as a
    skip, never the implementation's failure; the report lists them in ``suite_errors``)."""

    def __init__(self) -> None:
        self.met: dict[str, str] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and dict(report.user_properties).get("kv_suite_error"):
            longrepr = report.longrepr
            text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.met[report.nodeid] = text.removeprefix("Skipped: ").splitlines()[0]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.met:
            return
        terminalreporter.section("kvcache: suite errors (bugs of the suite, not verdicts about the implementation)")
        for nodeid, text in self.met.items():
            terminalreporter.write_line(f"{nodeid}: {text}")


def _budget(config: pytest.Config) -> None:
    """``--kv-budget``, or under ``-x`` a default one: fixed here on the controller, handed to the workers."""
    try:
        seconds, given = budget.chosen(config.getoption(budget.OPTION), bool(config.getoption("maxfail", 0)))
    except budget.BudgetError as error:
        raise pytest.UsageError(str(error)) from None
    config.pluginmanager.register(budget.BudgetPlugin(config, seconds, given, first_failure.FIXTURE), "kvcache-budget")


def _shared_database(config: pytest.Config, adapter: object) -> databases.SharedExamples | None:
    """``--kv-db``: the shared database, opened once per process; refused under a derandomised profile."""
    url = databases.shared_url(config.getoption(databases.SHARED_OPTION))
    if url is None:
        return None
    problem = profiles.shared_database_problem(profiles.load(config.getoption("hypothesis_profile", None)))
    if problem:
        raise pytest.UsageError(problem)
    try:
        return databases.open_shared(url, databases.SharedScope.of(adapter, selection.oracle_name()))
    except databases.SharedDatabaseError as error:
        raise pytest.UsageError(str(error)) from None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """For ``@given`` properties, the report's ``runs`` come from Hypothesis's own statistics; for every
    failure, its kind (``PropertyRun`` records the machines' own)."""
    outcome = yield
    if not _active(item.config):
        return
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call" and call.excinfo is not None and not any(
            name == "kv_failure_kind" for name, _ in item.user_properties):
        if not isinstance(call.excinfo.value, (pytest.skip.Exception, pytest.fail.Exception)):
            item.user_properties.append(("kv_failure_kind", kind_of(call.excinfo.value)))
            item.user_properties.append(("kv_failure_check", check_of(call.excinfo.value)))
            report.user_properties = list(item.user_properties)
    if report.when == "call" and call.excinfo is not None and isinstance(call.excinfo.value, SuiteError):
        item.user_properties.append(("kv_suite_error", True))  # the report's outcome "suite error"
        report.user_properties = list(item.user_properties)
        # never the implementation's failure, so never the run's: pytest counts it skipped (exit status 0 if
        # nothing else failed); the report and the terminal list it apart (SuiteErrors)
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")
    described = getattr(item, "hypothesis_statistics", None)
    if report.when == "call" and described and not any(name == "kv_runs" for name, _ in item.user_properties):
        runs = examples_from_statistics(described)
        if runs is not None:
            item.user_properties.append(("kv_runs", runs))
            report.user_properties = list(item.user_properties)


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> PropertyRun:
    config = request.config
    if not _active(config):
        raise pytest.UsageError("the conformance fixture outside a run of the suite")
    return PropertyRun(request.node, (config.invocation_params.dir / config.getoption("--kv-traces")).resolve())


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "regression_trace" in metafunc.fixturenames:
        directories = [REGRESSIONS, *map(Path, metafunc.config.getoption("--kv-regressions"))]
        traces = sorted(p for d in directories for p in d.glob("*.json"))
        metafunc.parametrize("regression_trace", traces, ids=[p.stem for p in traces])


# Quickest verdicts first, so that ``-x`` stops early: kept counterexamples replay in milliseconds; then one
# run of each machine, the layer's first (most bugs show there); then the second runs and the short properties,
# whose checks the machines cover in part.
_FIRST = ("test_regressions.py", "test_layer_cache.py", "test_prefix_store_conforms[full-attention]",
          "test_session.py", "test_paged_cache.py", "test_cache_operations_conform[full]",
          "test_cache_operations_conform[window]", "test_prefix_store.py", "test_cache_creation.py",
          "test_precision.py")


@pytest.hookimpl(tryfirst=True)  # before known failures are matched (that plugin registers once active)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _active(config):
        found = next((item.nodeid for item in items if is_suite_file(Path(item.path))), None)
        if found is not None:  # (reached through a path that is not the suite's own: a symlink, --rootdir ...)
            raise pytest.UsageError(f"{found} is one of the suite's properties, collected in a run that is not the "
                                    f"suite's: name the suite (pytest --pyargs kvcache_conformance) or the "
                                    f"implementation ({selection.OPTION})")
        return

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::")[0]
        return next((i for i, part in enumerate(_FIRST) if path.endswith(part) or item.nodeid.endswith(part)),
                    len(_FIRST))

    items.sort(key=rank)  # stable: the order within a file is kept
    for item in items:  # carried to the report with the test's other user properties (from xdist workers too)
        marker = item.get_closest_marker(SUITE_CHECK)
        if marker is not None:
            item.user_properties.append(("kv_suite_check", str(marker.args[0]) if marker.args else True))


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not _active(config):
        return []
    adapter = selection.selected()
    current = settings.default
    return [
        f"kvcache implementation: {adapter.name} {adapter.version} ({selection.selected_spec()})",
        f"kvcache capabilities: {', '.join(sorted(adapter.capabilities))}"
        + (f"; layers drawn only within {limits}" if (limits := LayerLimits.of(adapter).described()) else ""),
        f"kvcache tolerance: {Judge.for_adapter(adapter, selection.oracle_numbers()).rule}",
        f"kvcache hypothesis profile: {settings.get_current_profile_name()} "
        f"(max_examples={current.max_examples}, stateful_step_count={current.stateful_step_count}, "
        f"derandomize={current.derandomize}, database={current.database})",
    ]
