"""Recording one machine run as it is drawn, and playing it back: the rules behind portable traces.

Hypothesis cannot attach ``@example`` to a state machine, and
``@reproduce_failure`` blobs are tied to one Hypothesis version, so the
machines keep their own record. Every rule is declared with this module's
``rule`` (or ``initialize``), which wraps Hypothesis's public decorators: its
arguments and every value it draws are written down as they are drawn
(arrays included, so a trace never depends on numpy's random generator), and
the call policy notes what it expected of each adapter call. Replaying feeds
the same values back into the same rules against any implementation
(``traces.replay``); the files themselves are ``traces.codec``'s.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from hypothesis import reject, stateful
from hypothesis import strategies as st

from ..generate.layers import limits_problem, requirements_of
from ..generate.layouts import same_layout_copy
from ..generate.needs import declaration, observation_problem
from ..judge.failures import Cause, NonConformance, cause_of
from ..judge.policy import Expect
from ..protocol.declarations import LayerLimits
from ..protocol.kinds import CLAIMED_BY, ErrorKind
from .codec import TraceError, decode, encode

_SPEC = "_kvcache_rule"


class TraceEnded(Exception):
    """Replay went past the last value recorded: the run stopped (failed) inside its last step, and the
    implementation replayed got further. Everything recorded was replayed."""


class NotApplicable(Exception):
    """A trace step cannot be replayed against this implementation (a capability it does not declare)."""


# What became of a call whose first failing check was not claimed, as a trace records it (format 5): the later
# steps were drawn on the state it left, unchanged if it raised, a new object if it was accepted.
RAISED, REPLACED = "raised", "replaced"
REJECTION, UNCLAIMED = Expect.REJECTION.value, Expect.UNCLAIMED.value  # as traces hold them


# -- recording and playing back one machine run ---------------------------------------------------------

@dataclass
class Step:
    """One rule of a run: its arguments, every value it drew and what was expected of each adapter call. Values
    are kept as drawn (copies where they could be written to later) and encoded only when the trace is written:
    most runs pass, and are never written."""

    rule: str
    arguments: dict[str, Any]
    draws: list[tuple[str | None, Any]]  # (label, value), in drawing order
    expected: list[dict[str, Any]]  # what the call policy expected of each adapter call
    observed: list[tuple[str, Any]] = field(default_factory=list)  # what the adapter showed that draws depend on

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "arguments": {k: encode(v) for k, v in self.arguments.items()},
                "draws": [{"label": label, "value": encode(value)} for label, value in self.draws],
                "expected": [{k: encode(v) for k, v in expectation.items()} for expectation in self.expected],
                **({"observed": [{"label": label, "value": encode(value)} for label, value in self.observed]}
                   if self.observed else {})}


def _kept(value: Any) -> Any:
    """``value`` as it is now: arrays and lists may be written into after they are drawn."""
    if isinstance(value, np.ndarray):
        return same_layout_copy(value)
    return copy.deepcopy(value) if isinstance(value, (list, dict)) else value


class Tape:
    """The record of one machine run: rules in order, with their arguments, draws and expectations."""

    def __init__(self) -> None:
        self.steps: list[Step] = []

    def begin(self, rule: str, arguments: dict[str, Any]) -> None:
        self.steps.append(Step(rule, dict(arguments), [], []))

    def data(self, data: Any) -> Any:
        return _RecordingData(data, self)

    def drew(self, label: str | None, value: Any) -> None:
        self.steps[-1].draws.append((label, _kept(value)))

    def expect(self, call: str, **outcome: Any) -> None:
        """What the specification requires of the adapter call ``call`` (for readers of the trace)."""
        if self.steps:
            self.steps[-1].expected.append({"call": call, **outcome})

    def judged(self, expect: str, replaced: bool) -> None:
        """What became of the call just expected (``expect``: its ``judge.policy.Expect`` value): for a check not
        claimed, whether it raised or was accepted (and its object replaced) -- the later steps rely on it
        (``claims_relied_on``)."""
        if expect == UNCLAIMED and self.steps and self.steps[-1].expected:
            self.steps[-1].expected[-1]["outcome"] = REPLACED if replaced else RAISED

    def observe(self, label: str, value: Any) -> None:
        """Something the adapter showed that later draws depend on (a context's cells): replay compares it
        (``generate.needs.OBSERVATIONS``)."""
        if self.steps:
            self.steps[-1].observed.append((label, value))


class Draws(Protocol):
    """What a rule draws from: Hypothesis's ``data`` while searching, the trace while replaying."""

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any: ...

    def choose(self, options: Sequence[Any], label: str) -> Any:
        """One of ``options`` (names or numbers); a replayed choice outside them is not applicable."""

    def optional(self, strategy: st.SearchStrategy[Any], label: str, default: Any) -> Any:
        """A draw that traces of an earlier suite do not have: replaying one, ``default`` if the next recorded
        draw is not ``label``."""


class _RecordingData:
    """Hypothesis's ``data`` object, writing down every value as it is drawn."""

    def __init__(self, data: Any, tape: Tape) -> None:
        self._data, self._tape = data, tape

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any:
        value = self._data.draw(strategy, label=label)
        self._tape.drew(label, value)
        return value

    def choose(self, options: Sequence[Any], label: str) -> Any:
        return self.draw(st.sampled_from(list(options)), label)

    def optional(self, strategy: st.SearchStrategy[Any], label: str, default: Any) -> Any:
        return self.draw(strategy, label)


class Playback(Tape):
    """Feeds a recorded run's draws back, in order, checking labels and applicability."""

    def __init__(self, steps: list[dict[str, Any]], capabilities: frozenset[str],
                 limits: LayerLimits | None = None) -> None:
        super().__init__()
        self._recorded = iter(steps)
        self._left = len(steps)  # steps not yet begun
        self._draws: list[dict[str, Any]] = []
        self._step: dict[str, Any] = {}
        self._observed: list[dict[str, Any]] = []
        self.capabilities, self.limits = capabilities, limits or LayerLimits()
        self.adapter: Any = None  # named in what does not apply (replay sets it)
        # where this replay's state parted from the recorded run's, as far as the trace can tell: a call not claimed
        # whose outcome (raised, or accepted and replaced) differs, or is not recorded (formats 1-4)
        self.parted: str | None = None

    def begin(self, rule: str, arguments: dict[str, Any]) -> None:
        super().begin(rule, arguments)
        recorded = next(self._recorded, None)
        if recorded is None or recorded["rule"] != rule:
            raise TraceError(f"replay ran rule {rule}, but the trace has {recorded and recorded['rule']}")
        self._step = recorded
        self._draws = list(recorded["draws"])
        self._observed = list(recorded.get("observed", ()))
        self._left -= 1

    def finish_step(self, declared: str | None = None) -> None:
        """After a step ran: every value recorded for it must have been drawn, or the replay took another path.
        ``declared``: what the adapter declares of the declarations the rule relies on, for the reason."""
        if self._draws:
            why = (self.parted or (f"what it draws depends on the state and on {declared}" if declared else None)
                   or "what a rule draws depends on the adapter: what it declares, what it shows, a context's cells, "
                      "say, and what it does with a call it does not claim")
            raise NotApplicable(f"the step did not draw the recorded {', '.join(repr(d['label']) for d in self._draws)}"
                                f": here it took another path than the recorded run ({why})")

    def judged(self, expect: str, replaced: bool) -> None:
        super().judged(expect, replaced)
        index = len(self.steps[-1].expected) - 1 if self.steps else -1
        recorded = self._step.get("expected", [])
        if expect not in (UNCLAIMED, REJECTION) or self.parted is not None or not 0 <= index < len(recorded):
            return
        entry, here = recorded[index], REPLACED if replaced else RAISED
        rejected = entry.get("expect") == REJECTION or "rejected" in entry  # ("rejected": formats 1 and 2)
        unclaimed = entry.get("expect") == UNCLAIMED or "first_failing_check" in entry
        if not (rejected or unclaimed):
            return
        was = entry.get("outcome") or (RAISED if rejected else None)
        where = f"step {len(self.steps) - 1} ({self.steps[-1].rule}): {entry.get('call')}"
        if was is None:
            self.parted = (f"{where}: {'accepted without a claim' if replaced else 'raised'} here, and the trace "
                           "(of a format before 5) does not say what the recorded run did with it, unclaimed")
        elif was != here:
            recorded_run = "accepted and replaced" if was == REPLACED else "raised, changing nothing,"
            self.parted = (f"{where}: {'accepted without a claim and replaced' if replaced else 'raised'} here, "
                           f"but {recorded_run} in the recorded run")

    def observe(self, label: str, value: Any) -> None:
        super().observe(label, value)
        recorded = next((entry for entry in self._observed if entry["label"] == label), None)
        if recorded is None:  # (formats 1-4, or an object replaced only here)
            return
        self._observed.remove(recorded)
        problem = observation_problem(label, decode(recorded["value"]), value, self.adapter)
        if problem is not None:
            raise NotApplicable(problem)

    def data(self, data: Any) -> Any:
        return self

    def draw(self, strategy: st.SearchStrategy[Any], label: str | None = None) -> Any:
        recorded = self._draws.pop(0) if self._draws else None
        if recorded is None and self._left == 0:
            raise TraceEnded(f"the recorded run stopped inside this step, before drawing {label!r}")
        if recorded is None or recorded["label"] != label:
            raise TraceError(f"the rule drew {label!r}, but the trace has "
                             f"{recorded['label'] if recorded else 'no further draw'!r} (the suite changed)")
        value = decode(recorded["value"])
        missing = requirements_of(value) - self.capabilities
        if missing:
            raise NotApplicable(f"the recorded {label} needs {', '.join(sorted(missing))}")
        outside = limits_problem(value, self.limits)
        if outside:
            raise NotApplicable(f"the recorded {label} is outside this implementation's layer_limits: {outside}")
        self.drew(label, value)
        return value

    def optional(self, strategy: st.SearchStrategy[Any], label: str, default: Any) -> Any:
        if self._draws and self._draws[0]["label"] == label:
            return self.draw(strategy, label)
        return default

    def choose(self, options: Sequence[Any], label: str) -> Any:
        value = self.draw(st.nothing(), label)
        if value not in list(options):
            raise NotApplicable(f"the recorded {label} {value!r} is not among this implementation's options "
                                f"{list(options)}")
        return value


# -- rules: Hypothesis's decorators, plus recording, capability gates and switching rules off -----------

@dataclass(frozen=True)
class RuleSpec:
    """What the suite knows of one rule of a machine (Hypothesis keeps its own record, privately)."""

    name: str
    kind: str  # "rule", "initialize" or "invariant"
    requires: frozenset[str] = frozenset()  # capabilities without which the rule is never drawn
    when: Callable[[Any], bool] | None = None  # the state in which it may be drawn
    arguments: frozenset[str] = frozenset()  # what Hypothesis hands it besides ``data`` (a trace records them)
    relies_on: frozenset[str] = frozenset()  # declarations (generate.needs.DECLARATIONS) its draws or ``when`` read


def _recorded(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` writing its arguments and draws on the machine's tape."""
    takes_data = "data" in inspect.signature(function).parameters

    @functools.wraps(function)
    def run(machine: TracedMachine, **arguments: Any) -> Any:
        machine.tape.begin(function.__name__, {k: v for k, v in arguments.items() if k != "data"})
        if takes_data:
            arguments["data"] = machine.tape.data(arguments.get("data"))
        return function(machine, **arguments)

    return _setting_aside(run)


def _setting_aside(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` discarding the example (Hypothesis's ``reject``) when it fails with a cause the machine was
    told to set aside: the search for the next cause goes on past the ones already found, in every rule."""
    @functools.wraps(function)
    def checked(machine: TracedMachine, **arguments: Any) -> Any:
        try:
            return function(machine, **arguments)
        except NonConformance as error:
            cause = cause_of(error) if machine.set_aside else None
            if cause in machine.set_aside:
                machine.met_again.append((cause, machine.tape.steps[-1].rule if machine.tape.steps
                                          else function.__name__))
                reject()
            raise

    return checked


def rule(*, requires: Iterable[Any] = (), when: Callable[[Any], bool] | None = None, relies_on: Iterable[str] = (),
         **strategies: st.SearchStrategy[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A recorded rule, drawn only when the implementation declares ``requires`` and ``when(machine)`` holds.

    A rule that cannot run is never drawn: it must not return early and count as run. ``relies_on`` names the
    declarations besides capabilities that ``when`` or its draws read: a trace records what they were, and
    replays only where they admit its program (``generate.needs.Needs.drawn_under``).
    """
    needed = frozenset(str(getattr(c, "value", c)) for c in requires)
    relied = _declarations(relies_on)

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        spec = RuleSpec(function.__name__, "rule", needed, when, frozenset(strategies) - {"data"}, relied)
        run = _recorded(function)
        setattr(run, _SPEC, spec)
        return stateful.precondition(lambda machine: machine.may_run(spec))(stateful.rule(**strategies)(run))

    return decorate


def initialize(*, relies_on: Iterable[str] = (),
               **strategies: st.SearchStrategy[Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A recorded set-up rule: runs once, first; not counted as a step of a program. ``relies_on``: as for
    ``rule``."""
    relied = _declarations(relies_on)

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        run = _recorded(function)
        setattr(run, _SPEC, RuleSpec(function.__name__, "initialize", arguments=frozenset(strategies) - {"data"},
                                     relies_on=relied))
        return stateful.initialize(**strategies)(run)

    return decorate


def invariant() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A check after every rule (and after replayed steps)."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        checked = _setting_aside(function)
        setattr(checked, _SPEC, RuleSpec(function.__name__, "invariant"))
        return stateful.invariant()(checked)

    return decorate


class TracedMachine(stateful.RuleBasedStateMachine):
    """A state machine whose rules are all declared with this module's ``rule`` and ``initialize``.

    Subclasses set ``self.capabilities``; ``disabled_rules`` (set by the runner,
    from a known-failures file) are never drawn; an example failing with a cause in ``set_aside`` is discarded.
    """

    capabilities: frozenset[str] = frozenset()
    disabled_rules: frozenset[str] = frozenset()
    set_aside: frozenset[Cause] = frozenset()  # causes already found (set by the runner's search for the next)

    def __init__(self) -> None:
        super().__init__()
        self.tape: Tape = Tape()
        self.met_again: list[tuple[Cause, str]] = []  # (cause set aside, rule) of each example discarded

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hypothesis_rules = {name for name in dir(cls) if _hypothesis_rule(getattr(cls, name, None))}
        untraced = sorted(hypothesis_rules - set(cls.specs()))
        if untraced:
            raise TypeError(f"{cls.__name__}.{untraced[0]} is a rule but not declared with traces.recording.rule: "
                            "its runs could not be replayed")

    @classmethod
    def specs(cls) -> dict[str, RuleSpec]:
        """Every rule, set-up rule and invariant of the machine, by name."""
        found = {}
        for name in dir(cls):
            spec = getattr(getattr(cls, name, None), _SPEC, None)
            if isinstance(spec, RuleSpec):
                found[name] = spec
        return found

    @classmethod
    def relied_on(cls, rules: Iterable[str]) -> dict[str, list[str]]:
        """The declarations a program of ``rules`` relies on (besides capabilities), each with the rules that
        do."""
        specs, found = cls.specs(), dict[str, list[str]]()
        for name in sorted(set(rules)):
            spec = specs.get(name)
            for relied in sorted(spec.relies_on if spec is not None else ()):
                found.setdefault(relied, []).append(name)
        return dict(sorted(found.items()))

    def missing(self, spec: RuleSpec) -> frozenset[str]:
        """The capabilities ``spec`` needs that the implementation does not declare."""
        return spec.requires - self.capabilities

    def may_run(self, spec: RuleSpec) -> bool:
        return (spec.name not in self.disabled_rules and not self.missing(spec)
                and (spec.when is None or bool(spec.when(self))))

    def need(self, capability: Any, situation: str) -> None:
        """Inside a rule: the drawn values have led where only ``capability`` says what must happen.

        While searching, rules draw so that this never happens (a suite bug if
        it does); while replaying, the trace stops applying here.
        """
        name = str(getattr(capability, "value", capability))
        if name not in self.capabilities:
            raise NotApplicable(f"{situation}: only {name} says what must happen, and it is not declared")


def _hypothesis_rule(attribute: Any) -> bool:
    """Whether Hypothesis sees ``attribute`` as a rule. Its markers are private: tests/test_traces.py
    fails loudly if they move (and pyproject pins Hypothesis below its next major)."""
    markers = (getattr(stateful, "RULE_MARKER", None), getattr(stateful, "INITIALIZE_RULE_MARKER", None))
    return any(marker and hasattr(attribute, marker) for marker in markers)


def initializers_of(cls: type[TracedMachine]) -> frozenset[str]:
    """Names of the machine's set-up rules (not counted as steps of a program)."""
    return frozenset(name for name, spec in cls.specs().items() if spec.kind == "initialize")


def invariants_of(cls: type[TracedMachine]) -> list[Callable[[Any], None]]:
    return [getattr(cls, name) for name, spec in cls.specs().items() if spec.kind == "invariant"]


def claims_relied_on(steps: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The claims a trace's later steps relied on, from its recorded steps (any format): every call followed by a
    later step or a later call whose check was claimed and which was rejected (the state left unchanged), and, from
    format 5, every one whose check was not claimed and which was accepted (the state replaced). The checks after a
    step (``Expect.STATE``) read whatever state there is: they rely on nothing. Capability -> {"value": claimed,
    "relied_on_by": ["step 2 (malformed_batch)", ...]}."""
    found: dict[str, dict[str, Any]] = {}
    followed = False  # by a later call of the last step
    for index in reversed(range(len(steps))):
        for entry in reversed(steps[index].get("expected", ())):
            if entry.get("expect") == Expect.STATE.value or ("expect" not in entry and
                                                             entry.get("call") == "after the last step"):
                continue  # (formats 1 and 2 name it only)
            relied, followed = followed or index < len(steps) - 1, True
            if not relied:
                continue
            if entry.get("expect") == REJECTION or "rejected" in entry:  # ("rejected": formats 1 and 2)
                kind = entry.get("kind") or entry.get("rejected")
                claim, claimed = entry.get("claim") or CLAIMED_BY[ErrorKind(kind)].value, True
            elif entry.get("outcome") == REPLACED and entry.get("claim"):  # (a call outside the spec: no claim)
                claim, claimed = entry["claim"], False
            else:
                continue
            where = found.setdefault(claim, {"value": claimed, "relied_on_by": []})["relied_on_by"]
            if f"step {index} ({steps[index]['rule']})" not in where:
                where.insert(0, f"step {index} ({steps[index]['rule']})")
    return dict(sorted(found.items()))


def _declarations(names: Iterable[str]) -> frozenset[str]:
    named = frozenset(names)
    for name in named:
        declaration(name)  # a typo fails at import, not as a trace that replays anywhere
    return named
