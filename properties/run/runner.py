"""Running one conformance machine: Hypothesis's search, then a portable trace of what it found.

``run_machine`` is shared by the pytest properties, the mutant self-tests and
the benchmarks. It never hides a failure: it returns it, with the numbers of
the run and the path of the trace it wrote (``traces``); callers
re-raise it. Hypothesis replays the minimal failing program last, so the last
machine built holds the shrunk run.
"""

from __future__ import annotations

import inspect
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, reporting, seed
from hypothesis import settings as Settings
from hypothesis.errors import Unsatisfiable
from hypothesis.internal.conjecture import engine, providers
from hypothesis.stateful import run_state_machine_as_test

from ..generate.needs import Needs, declared_values
from ..judge.calls import AdapterHung
from ..judge.failures import Cause, NonConformance, SuiteError, cause_of, check_of, is_suite_error, kind_of
from ..judge.tolerance import closer_to_failing
from ..machines import MACHINES
from ..oracle import FLOAT64, NumberSystem
from ..protocol.layer import KvCacheAdapter
from ..traces import codec, recording
from . import budget as run_budget
from . import known_failures, selection
from .databases import SecondaryOnly, property_seed, property_settings
from .exercise import Tally, merged
from .identity import canonical
from .provenance import environment_facts, implementation_facts

SHRINK_SECONDS = 30.0  # after the first failure of a run; the plugin sets --kv-shrink-seconds
MAX_CAUSES = 4  # distinct causes a failing property is searched for (the plugin sets --kv-causes)
CAUSE_SECONDS = 300.0  # no new search for a further cause starts once this is spent (--kv-cause-seconds)


@contextmanager
def _shrinking_for(seconds: float) -> Iterator[None]:
    """Hypothesis stops shrinking, keeping the shortest failing example found, after its engine's
    ``MAX_SHRINKING_SECONDS`` (five minutes): this run's budget instead. The one private name of Hypothesis's the
    suite sets (tests/test_traces.py fails loudly if it moves; pyproject pins Hypothesis below its next major)."""
    previous, report = engine.MAX_SHRINKING_SECONDS, reporting.current_reporter()

    def reporter(text: str) -> None:  # its warning speaks of five minutes and asks for a bug report: not ours
        if not text.lstrip().startswith(_SHRINK_WARNINGS):
            report(text)

    engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        with reporting.with_reporter(reporter):
            yield
    finally:
        engine.MAX_SHRINKING_SECONDS = previous


_SHRINK_WARNINGS = ("WARNING: Hypothesis has spent more than", "PLEASE REPORT THIS",
                    "This test function exited early because it took too long to shrink")


@contextmanager
def without_local_constants() -> Iterator[None]:
    """Hypothesis draws, one draw in twenty, a constant found in the source of any local module imported so far
    (outside site-packages and the standard library): the suite's own in a clone, a test's, an adapter's. A
    derandomised (ci) program then changed with any literal anywhere -- two mutants of machines no edit touched
    survived an edit of others' strings -- and differed between a clone and an installed suite, inside pytest and
    outside. Machine runs draw without them: the same programs wherever they run, whatever code is around them.
    Hypothesis's own constants (boundaries, nasty floats) stay. The second private name of Hypothesis's the suite
    sets, beside ``MAX_SHRINKING_SECONDS`` (tests/test_strategies.py fails loudly if it moves)."""
    if not hasattr(providers, "_get_local_constants"):  # moved by a later Hypothesis: run as it draws, not stop
        yield
        return
    previous = providers._get_local_constants
    providers._get_local_constants = providers.Constants  # an empty set of constants of each type
    providers.CONSTANTS_CACHE.cache.clear()  # what each draw's constraints admit of them, cached
    try:
        yield
    finally:
        providers._get_local_constants = previous
        providers.CONSTANTS_CACHE.cache.clear()


class MachineFactory:
    """What Hypothesis is handed to build each example's machine: an object, where it was ``run_machine``'s
    inner function.

    Hypothesis keys a stateful test's examples, and seeds a derandomised (ci) search, by a digest of its
    factory's source (``function_digest``): every edit of that function moved every ci program of the suite and
    every saved example's key. An object has no source (``inspect.getsource`` refuses it), so its digest is the
    same however the machine is built. A property's identity goes where it belongs instead: its database keys'
    prefix (``databases.property_settings``), and the seed of a derandomised search (``databases.property_seed``,
    through Hypothesis's public ``seed``, which overrides ``derandomize``'s digest of the source)."""

    # Hypothesis hashes the signature too: the same whatever ``__call__`` is annotated with.
    __signature__ = inspect.Signature()

    def __init__(self, build: Callable[[], recording.TracedMachine]) -> None:
        self.build = build

    def __call__(self) -> recording.TracedMachine:
        return self.build()

    @classmethod
    def of(cls, build: Callable[[], recording.TracedMachine], settings: Settings,
           identity: dict[str, Any]) -> MachineFactory:
        """``build`` as a factory; seeded by the property's identity when ``settings`` derandomise (where no
        database is kept: Hypothesis refuses one under derandomize). A random search keeps Hypothesis's seed."""
        factory = cls(build)
        if settings.derandomize:
            factory = seed(property_seed(**identity))(factory)
        return factory


@dataclass
class RunResult:
    runs: int = 0  # machines Hypothesis built: examples, plus replays and shrinking after a failure
    first_failing: int | None = None  # the run in which the first non-conformance was raised
    worst: tuple[float, float] = (0.0, 1.0)  # (error, tolerance) closest to failing, over all runs
    rule: str = ""  # the tolerance rule of the comparison closest to failing (of the failing one, on failure)
    rules: Counter[str] = field(default_factory=Counter)  # runs per tolerance rule applied (a model's may vary)
    failure: BaseException | None = None
    failing_step: int | None = None  # index in the trace's steps
    steps: int = 0  # rules in the shrunk failing program, set-up not counted
    trace: Path | None = None
    families: Counter[str] = field(default_factory=Counter)  # runs per layer family drawn (layer machines)
    shrinking_stopped: bool = False  # the shrink budget ran out: the trace is the shortest failing run found
    met_again: Counter[tuple[Cause, str]] = field(default_factory=Counter)  # examples discarded: (cause, rule)
    stopped_by_budget: bool = False  # --kv-budget: cut short before an example, with no failure (not a full pass)
    exercise: Tally = field(default_factory=Tally)  # what every machine built ran and met


def run_machine(machine: str, adapter: KvCacheAdapter, *, property_id: str, parameters: dict[str, Any] | None = None,
                requires: tuple[str, ...] = (), numbers: NumberSystem = FLOAT64, trace_dir: Path | None = None,
                settings: Settings | None = None, spec: str | None = None,
                disabled_rules: frozenset[str] = frozenset(), shrink_seconds: float | None = None,
                saves_as_secondary: bool = False, set_aside: frozenset[Cause] = frozenset(),
                budget: run_budget.Share | None = None) -> RunResult:
    """Search with the current Hypothesis profile (or ``settings``); on failure write the shrunk run's trace.

    ``disabled_rules`` are never drawn (known failures narrowed to a rule: a machine whose state has
    diverged cannot go on judging); an example failing with a cause in ``set_aside`` (found already) is
    discarded, and the search goes on. Shrinking stops ``shrink_seconds`` after the first failure (default
    ``SHRINK_SECONDS``), with the shortest failing run found as the verdict. ``saves_as_secondary``: for a run
    that does not shrink, so that the next run shrinks what it saved (``databases.SecondaryOnly``). ``budget``:
    the property's share of ``--kv-budget``, which may stop the search before an example (``run/budget.py``)."""
    shrink_seconds = SHRINK_SECONDS if shrink_seconds is None else shrink_seconds
    parameters = parameters or {}
    cls = MACHINES[machine]
    unknown = sorted(disabled_rules - {name for name, s in cls.specs().items() if s.kind == "rule"})
    if unknown:
        raise ValueError(f"{cls.__name__} has no rule {', '.join(unknown)} to leave out")
    result = RunResult()
    last: list[recording.TracedMachine] = []
    raised_before = NonConformance.raised
    failed_at: list[float] = []

    def failed() -> bool:
        """Whether an example of this search has failed: a failure with a cause set aside (its example discarded)
        is none -- the search for the next cause meets the known ones all the time, and must still stop where its
        budget is spent."""
        met_again = sum(result.met_again.values()) + (len(last[0].met_again) if last else 0)
        return NonConformance.raised - raised_before > met_again

    def build() -> recording.TracedMachine:
        if budget is not None:  # may raise BudgetSpent: before the example, never after a failure
            budget.before_example(result.runs, failed=failed())
        # this search's own failure, not an example discarded for a cause set aside: the shrink budget counts
        # from it, as Hypothesis's does (a discarded example is no failure to it)
        if result.first_failing is None and failed():
            result.first_failing = result.runs
            failed_at.append(time.monotonic())
        result.runs += 1
        if last:
            _keep_worst(result, last[0])
            result.met_again.update(last[0].met_again)
        last[:] = [cls(adapter, numbers=numbers, **parameters)]  # type: ignore[call-arg]
        last[0].disabled_rules = disabled_rules
        last[0].set_aside = set_aside
        last[0].targeting = targeting  # type: ignore[attr-defined]
        if budget is not None:
            budget.watch(last[0])
        return last[0]

    # report_multiple_bugs=False (callers' own settings aside): Hypothesis tells bugs apart by exception
    # type and raise site, and every NonConformance comes from a few shared checks in verdict.py -- a wrong
    # output after a reset and one after an in-place weight update would be one "bug" to it. So we stop at
    # the first failure, shrink it and write its trace; the report tells causes apart by (property, rule of
    # the failing step, failure kind), and the next bug behind a known one is found by leaving its rule
    # out (--kv-xfails PROPERTY :: RULE, which reaches here as disabled_rules).
    identity: dict[str, Any] = {
        "implementation": str(adapter.name), "property_id": property_id, "parameters": parameters,
        "disabled_rules": disabled_rules,
        "set_aside": [json.dumps(cause.to_json(), sort_keys=True) for cause in set_aside]}
    chosen = property_settings(settings or Settings(report_multiple_bugs=False), **identity)
    if set_aside:  # most examples may meet a cause already found: discarding them is the point
        chosen = Settings(chosen, suppress_health_check=[*chosen.suppress_health_check, HealthCheck.filter_too_much])
    if saves_as_secondary and chosen.database is not None:
        chosen = Settings(chosen, database=SecondaryOnly(chosen.database))
    targeting = Phase.target in chosen.phases  # hill-climbing reads the machines' target(); elsewhere it only costs
    if budget is not None:
        budget.start_search()
    try:
        with _shrinking_for(shrink_seconds), without_local_constants(), \
                budget.quiet() if budget is not None else nullcontext():
            run_state_machine_as_test(MachineFactory.of(build, chosen, identity), settings=chosen)
    except run_budget.BudgetSpent:  # what ran passed; nothing saved, nothing shrunk
        result.stopped_by_budget = True
    except AdapterHung as hung:  # not shrunk: every rerun would hang as long again
        result.failure = NonConformance(f"{hung} -- the run stopped there, unshrunk", kind="hang")
    except Exception as error:  # returned to the caller, who re-raises it
        result.failure = error
        if failed_at and time.monotonic() - failed_at[0] >= shrink_seconds and isinstance(error, NonConformance):
            result.shrinking_stopped = True
            error.args = (f"{error.args[0]}\n(shrinking stopped after {shrink_seconds:g} s, --kv-shrink-seconds: the "
                          "trace is the shortest failing run found by then)", *error.args[1:])
    if last:
        _keep_worst(result, last[0])
        result.met_again.update(last[0].met_again)
        if result.failure is not None:
            result.rule = last[0].judge.rule  # type: ignore[attr-defined]
    if result.failure is not None and last and last[0].tape.steps:
        tape = last[0].tape
        result.failing_step = len(tape.steps) - 1
        result.steps = sum(1 for step in tape.steps if step.rule not in recording.initializers_of(cls))
        if trace_dir is not None:
            document = _document(machine, adapter, spec, property_id, parameters, requires, numbers, last[0], result)
            name = f"{adapter.name}-{property_id.rpartition('::')[2]}"
            stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:120].strip("_")
            result.trace = codec.write(document, trace_dir, stem)
            _point_to(result.failure, result.trace)
    return result


def _keep_worst(result: RunResult, machine: Any) -> None:
    """Fold one run into ``result``: its worst comparison, the rule that judged it, what it exercised."""
    rule, worst = machine.judge.rule, machine.judge.worst
    result.rules[rule] += 1
    if closer_to_failing(worst, result.worst) is worst or not result.rule:  # ties go to the later run
        result.rule = rule
    result.worst = closer_to_failing(worst, result.worst)
    result.exercise.add(machine)
    family = getattr(machine, "family", None) if hasattr(machine, "config") else None
    if family is not None:
        result.families[family] += 1


def _document(machine: str, adapter: KvCacheAdapter, spec: str | None, property_id: str, parameters: dict[str, Any],
              requires: tuple[str, ...], numbers: NumberSystem, instance: recording.TracedMachine,
              result: RunResult) -> dict[str, Any]:
    tape = instance.tape
    relied_on = MACHINES[machine].relied_on(step.rule for step in tape.steps)
    drawn_under = declared_values(adapter, relied_on)
    steps = [step.to_json() for step in tape.steps]
    return {
        "format": codec.FORMAT,
        "format_version": codec.FORMAT_VERSION,
        "property": property_id,
        "machine": machine,
        "parameters": {k: codec.encode(v) for k, v in parameters.items()},
        "requires": sorted(requires),
        # what the program's draws relied on besides capabilities: replayed only where these admit it
        "declarations": {name: {"value": drawn_under[name], "relied_on_by": rules}
                         for name, rules in relied_on.items()},
        # the claims its later steps relied on: a rejection under one, an acceptance without one (format 5)
        "claims": recording.claims_relied_on(steps),
        "recorded_with": {
            **implementation_facts(adapter, spec), "oracle": numbers.name, "rule": result.rule, **environment_facts()},
        "failure": {"step": result.failing_step, "rule": tape.steps[-1].rule, "kind": kind_of(result.failure),
                    "check": check_of(result.failure), "changed": list(cause_of(result.failure).changed),
                    "message": str(result.failure).split("\n\ncounterexample trace:")[0]},
        "steps": steps,
    }


def _point_to(failure: BaseException, path: Path) -> None:
    """Name the trace in the failure message itself (pytest prints it first)."""
    where = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    pointer = (f"\n\ncounterexample trace: {where}\n"
               f"replay it: kvcache-conformance replay {where} [--kv-impl MODULE:FACTORY]")
    if isinstance(failure, NonConformance) and failure.args:
        failure.args = (f"{failure.args[0]}{pointer}", *failure.args[1:])
    elif hasattr(failure, "add_note"):
        failure.add_note(pointer.strip())


class PropertyRun:
    """A property test's handle on the suite: the adapter, skipping, and running a machine.

    What it measures goes to the test's ``user_properties`` (xdist carries
    them to the controller), where ``--kv-report`` collects them.
    """

    def __init__(self, node: Any, trace_dir: Path | None) -> None:
        self.node, self.trace_dir = node, trace_dir
        self.property_id = canonical(node.nodeid)  # keys its examples; the same from a clone and installed
        self.adapter, self.spec = selection.selected(), selection.selected_spec()
        self.numbers = selection.oracle_numbers()
        self.required: tuple[str, ...] = ()
        self.share: run_budget.Share | None = None  # of --kv-budget, for the main search and the cause search

    def record(self, name: str, value: Any) -> None:
        self.node.user_properties.append((f"kv_{name}", value))

    def require(self, needs: Needs) -> None:
        """Skip, with the reason, unless the implementation has what ``needs`` names (for a property that runs
        no machine: a machine's own needs are asked in ``run``)."""
        problem = needs.problem(self.adapter)
        if problem is not None:
            pytest.skip(problem)

    def run(self, machine: str, **parameters: Any) -> RunResult:
        """Run ``machine``, without the rules a ``--kv-xfails`` entry leaves out; raise its failure.

        A property that replaced parametrised ones (``known_failures.former_ids``) first replays what
        Hypothesis saved under their node ids, and honours entries naming them: a part expected to fail is
        left out of the draws and run on its own, strictly; a rule left out of one part is left out there only
        (the machine takes ``left_out_families`` and ``family_rules``)."""
        searched, left_out = self.plan(machine, parameters)
        self.share = run_budget.CURRENT.share(self.property_id, Settings().max_examples)
        if self.share.spent_before_start:
            self.record("budget", self.share.facts(0))
            pytest.skip(self.share.verdict(0))
        former = known_failures.former_ids(self.node)
        known = known_failures.families_known(self.node)
        narrowed = known_failures.family_rules(self.node)
        for suffix, old in former.items():  # what was saved under the former ids, replayed by the property now
            if suffix not in known:
                self._replay_saved(machine, f"{self.property_id}[{suffix}]", old, left_out | {
                    rule for (part, rule) in narrowed if part == suffix})
        for suffix, entry in known.items():
            self._known_part(machine, suffix, former[suffix], entry, left_out)
        result = self._search(machine, self.property_id, searched, left_out)
        self.record("budget", self.share.facts(result.runs))
        causes = self._causes(machine, searched, left_out, result, hunt=MAX_CAUSES)
        if causes:
            verdicts = [failure for _, failure in causes if not is_suite_error(failure)]
            if verdicts:  # the implementation's failure; a suite error met while searching is listed apart
                raise verdicts[0]
            raise suite_error(causes[0][1], causes[0][0]["trace"])
        if result.stopped_by_budget:  # what ran passed: no full pass, so no pass at all
            pytest.skip(self.share.verdict(result.runs))
        return result

    def plan(self, machine: str, parameters: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]]:
        """The gate (skip, with the reason), then what the main search runs: the machine's parameters with the
        former parts a ``--kv-xfails`` entry names, and the rules it leaves out."""
        problem = MACHINES[machine].needs(**parameters).problem(self.adapter)  # the one gate
        if problem is not None:
            pytest.skip(problem)
        self.required = tuple(sorted(MACHINES[machine].needs(**parameters).capabilities))
        rules = {name for name, spec in MACHINES[machine].specs().items() if spec.kind == "rule"}
        left_out = known_failures.left_out(self.node)
        narrowed = known_failures.family_rules(self.node)
        for name, entry in [*left_out.items(), *((rule, entry) for (_, rule), entry in narrowed.items())]:
            if name not in rules:
                raise pytest.UsageError(f"{known_failures.OPTION} {entry.where}: {self.property_id} runs the "
                                        f"{machine} machine, which has no rule {name!r}; its rules: "
                                        f"{', '.join(sorted(rules))}")
        if known_failures.former_ids(self.node):
            known = known_failures.families_known(self.node)
            parameters = {**parameters, **({"left_out_families": sorted(known)} if known else {}),
                          **({"family_rules": sorted(narrowed)} if narrowed else {})}
        return parameters, frozenset(left_out)

    def _causes(self, machine: str, parameters: dict[str, Any], left_out: frozenset[str], first: RunResult, *,
                hunt: int | None = None) -> list[tuple[dict[str, Any], BaseException]]:
        """Every cause in one run: after a failure, search again with the causes found so far set aside (an
        example that meets one is discarded, in whatever rule), until ``hunt`` causes are found, a search
        finds no other, or ``CAUSE_SECONDS`` are spent. Causes are told apart by ``Cause`` (kind, claimed check,
        what a raising call changed), never by rule: one cause reached through several rules is one, seen there
        too. Where every example meets a cause already found, its rules are left out instead (as ``--kv-xfails
        PROPERTY :: RULE`` would), and so they are where a search that found nothing discarded a quarter of its
        examples for them. Each cause keeps its own shrunk trace; the first is the property's failure,
        the others are listed with it; where the search stopped is recorded (``cause_search``). ``hunt`` None:
        the first cause only, not searched past (a replayed saved example)."""
        found: dict[Cause, tuple[dict[str, Any], BaseException]] = {}
        setup = recording.initializers_of(MACHINES[machine])
        started, result = time.monotonic(), first
        stopped = "passed"  # why the search ended: the last search found nothing new
        while True:
            _note_met_again(found, result)
            if isinstance(result.failure, Unsatisfiable):  # every example met a cause already found
                rules = {cause["rule"] for cause, _ in found.values()} - setup - {None} - left_out
                if not rules:
                    stopped = "every example met a cause already found"
                    break
                left_out |= rules
                result = self._search(machine, self.property_id, parameters, left_out, set_aside=frozenset(found))
                continue
            if result.failure is None:
                if result.stopped_by_budget:
                    stopped = "budget"
                    break
                # A search that discarded a quarter of its examples or more for causes already found was a weak
                # one: a bug behind them may need the programs it threw away. Leave out the rules they were met
                # in, and search again (as where every example met one).
                rules = {rule for cause, _ in found.values() for rule in (cause["rule"], *cause["also_in"])}
                rules -= setup | {None} | left_out
                if rules and 4 * sum(result.met_again.values()) >= result.runs and \
                        time.monotonic() - started <= CAUSE_SECONDS:
                    left_out |= rules
                    result = self._search(machine, self.property_id, parameters, left_out,
                                          set_aside=frozenset(found))
                    continue
                break
            rule, cause = failing_rule(result), cause_of(result.failure)
            if cause in found:  # (a search with a cause's rule left out can still meet it elsewhere)
                found[cause][0]["also_in"].append(rule)
                stopped = "a search met only a cause already found"
                break
            found[cause] = ({"rule": rule, **cause.to_json(), "suite_error": is_suite_error(result.failure),
                             "trace": str(result.trace) if result.trace else None,
                             "message": str(result.failure).split("\n")[0], "runs": result.runs,
                             "shrinking_stopped": result.shrinking_stopped, "rules_left_out": sorted(left_out),
                             "also_in": []}, result.failure)
            if not isinstance(result.failure, NonConformance):
                stopped = "a suite error"
                break
            if rule in setup:  # every example runs its set-up: nothing behind this cause can be reached
                stopped = "a set-up rule failed"
                break
            if hunt is None or len(found) >= hunt:
                stopped = "cause bound"
                break
            if time.monotonic() - started > CAUSE_SECONDS:
                stopped = "time bound"
                break
            result = self._search(machine, self.property_id, parameters, left_out, set_aside=frozenset(found))
        causes = list(found.values())
        if causes:
            first_cause, failure = causes[0]
            self.record("failure_kind", first_cause["kind"])
            self.record("failure_check", first_cause["check"])
            if first_cause["rule"] is not None:
                self.record("rule_failed", first_cause["rule"])
            if first_cause["trace"] is not None:
                self.record("trace", first_cause["trace"])
            self.record("causes", [cause for cause, _ in causes])
            search = cause_search(stopped, len(causes), hunt, time.monotonic() - started) if hunt else None
            if search is not None:
                self.record("cause_search", search)
            if isinstance(failure, NonConformance) and failure.args and search is not None:
                others = "\n".join(f"  - {c['rule']}: {c['label']}: {c['message']}"
                                   + (f" [{c['trace']}]" if c["trace"] else "") for c, _ in causes[1:])
                more = (f"\n\n{len(causes) - 1} more cause(s), each found with the causes before it set aside:\n"
                        f"{others}") if len(causes) > 1 else ""
                failure.args = (f"{failure.args[0]}{more}\n{search['said']}", *failure.args[1:])
        return causes

    def _search(self, machine: str, property_id: str, parameters: dict[str, Any], left_out: frozenset[str],
                settings: Settings | None = None, set_aside: frozenset[Cause] = frozenset()) -> RunResult:
        result = run_machine(machine, self.adapter, property_id=property_id, parameters=parameters,
                             requires=self.required, numbers=self.numbers, trace_dir=self.trace_dir,
                             spec=self.spec, disabled_rules=left_out, settings=settings, set_aside=set_aside,
                             budget=self.share)
        if result.stopped_by_budget:
            self.record("budget_cut_searches", dict(self.node.user_properties).get("kv_budget_cut_searches", 0) + 1)
        self.record("runs", result.runs + dict(self.node.user_properties).get("kv_runs", 0))
        if result.families:
            self.record("families", dict(sorted(result.families.items())))
        if result.exercise:  # added to the searches before (the causes'), over every example
            self.record("exercise", merged([dict(self.node.user_properties).get("kv_exercise"),
                                            result.exercise.to_json(machine)]))
        self.record("worst_error", result.worst[0])
        self.record("tolerance", result.worst[1])
        self.record("rule", result.rule)
        applied = Counter(dict(self.node.user_properties).get("kv_rules", {})) + result.rules  # the causes' too
        self.record("rules", dict(applied.most_common()))
        return result

    def _replay_saved(self, machine: str, former_id: str, parameters: dict[str, Any], left_out: frozenset[str]) -> None:
        """Replay, first, the examples Hypothesis saved under a former node id (nothing is drawn)."""
        current = Settings()
        if current.database is None or Phase.reuse not in current.phases:
            return
        replaying = Settings(current, phases=(Phase.explicit, Phase.reuse), report_multiple_bugs=False)
        result = run_machine(machine, self.adapter, property_id=former_id, parameters=parameters,
                             requires=self.required, numbers=self.numbers, trace_dir=self.trace_dir,
                             spec=self.spec, disabled_rules=left_out, settings=replaying)
        if isinstance(result.failure, NonConformance):  # (nothing saved: Hypothesis says it ran no test case)
            self._causes(machine, parameters, left_out, result)  # (the saved example is the cause; not hunted)
            raise result.failure

    def _known_part(self, machine: str, suffix: str, parameters: dict[str, Any], entry: known_failures.Entry,
                    left_out: frozenset[str]) -> None:
        """A former part expected to fail: run on its own; its failure is known, its passing an error (strict)."""
        result = run_machine(machine, self.adapter, property_id=f"{self.property_id}[{suffix}]",
                             parameters=parameters, requires=self.required, numbers=self.numbers,
                             trace_dir=self.trace_dir, spec=self.spec, disabled_rules=left_out)
        if result.failure is None:
            raise NonConformance(f"{suffix}: a known failure passed ({entry.describe()}): the bug is fixed, remove "
                                 "the line", kind="known failure passed", check=suffix)
        if not isinstance(result.failure, NonConformance):
            raise result.failure
        self.record(f"known_{suffix}", {"reason": entry.describe(), "failure_kind": kind_of(result.failure),
                                        "trace": str(result.trace) if result.trace else None})


def suite_error(error: BaseException, trace: str | None) -> SuiteError:
    """A bug of the suite met while judging, as the property's error: what it was, and the trace of the run."""
    where = f"; the run that met it: {trace} (replay it to see the steps)" if trace else ""
    failure = SuiteError(f"SUITE ERROR, not a verdict about the implementation: {type(error).__name__}: {error}"
                         f"{where}. Please report it to the suite's maintainers with the trace.", cause=error)
    failure.__cause__ = error
    return failure


def cause_search(stopped: str, causes: int, hunt: int, seconds: float) -> dict[str, Any]:
    """Where a property's search for causes stopped, and the option that lifts a bound (report and terminal)."""
    lift = {"cause bound": f"--kv-causes {hunt + 4}", "time bound": f"--kv-cause-seconds {2 * CAUSE_SECONDS:g}",
            "budget": f"a larger {run_budget.OPTION}"}
    told = {"passed": "no further cause: the last search, with every cause found set aside, passed",
            "cause bound": f"stopped at the cause bound ({hunt}, --kv-causes): more may be behind them",
            "time bound": f"stopped at the time bound ({CAUSE_SECONDS:g} s, --kv-cause-seconds): more may be "
                          "behind them",
            "budget": f"stopped by the run's time budget ({run_budget.OPTION}): more may be behind them",
            }.get(stopped, f"stopped: {stopped}")
    bound = stopped in lift
    return {"stopped": stopped, "bound": bound, "causes": causes, "seconds": round(seconds, 1),
            "lift": lift.get(stopped), "said": f"cause search: {causes} cause(s); {told}"
            + (f" (lift it: {lift[stopped]})" if bound else "")}


def _note_met_again(found: dict[Cause, tuple[dict[str, Any], BaseException]], result: RunResult) -> None:
    """A cause set aside that a search met again, in a rule: seen there too."""
    for (cause, rule), _ in result.met_again.items():
        if cause in found and rule not in found[cause][0]["also_in"] and rule != found[cause][0]["rule"]:
            found[cause][0]["also_in"].append(rule)


def failing_rule(result: RunResult) -> str | None:
    """The rule of the failing step (after which an invariant failed, for an invariant), from the trace."""
    if result.trace is None or result.failing_step is None:
        return None
    try:
        return str(codec.load(result.trace)["steps"][result.failing_step]["rule"])
    except (codec.TraceError, LookupError, TypeError):
        return None
