"""Replay counterexample traces against any implementation, step by step.

    kvcache-conformance replay TRACE.json [TRACE.json ...] [--kv-impl MODULE:FACTORY] [--oracle mpmath]
    python -m kvcache_conformance.replay ...   (the same; python -m properties.replay in a clone)

The recorded values go back into the same rules of the same machine, now
driving the selected implementation (``--kv-impl``, else ``KVCACHE_IMPL``,
else the reference in a clone); the machine recomputes what the specification expects
from the oracle, as in the original run. Each step's outcome is printed; at
the first divergence, what differed: the error kind expected and got, or the
worst error with its batch, head, position and feature, and the tolerance.

A trace that needs a capability, declaration or claim the implementation does
not make, or was recorded against what it does not show (a context's cells),
is not applicable: it says which, and where; so is one whose replay leaves the
recorded path (a call the implementation does not claim, accepted here). Exit status: 0 if every trace conforms,
1 if one diverges, 2 if one is not applicable or unreadable. ``--json FILE``
also writes each trace's verdict for programs: its status, the step, and a
divergence's cause (kind, check, what a call that raised changed), never to be
read from the message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..generate.needs import Needs, declared_here
from ..judge.calls import AdapterHung
from ..judge.failures import NonConformance, cause_of
from ..judge.policy import Expect
from ..machines import MACHINES
from ..oracle import FLOAT64, NumberSystem
from ..protocol.declarations import LayerLimits
from ..protocol.kinds import declared
from ..run import selection
from . import codec, recording


@dataclass(frozen=True)
class Verdict:
    status: str  # "conforms", "diverges" or "not applicable"
    step: int | None  # where it diverged or stopped applying
    message: str
    seconds: float = 0.0
    kind: str | None = None  # a divergence's cause (judge.failures): its kind, the check that failed, and what a
    check: str | None = None  # call that raised changed, as a report's causes have them
    changed: tuple[str, ...] = ()

    @property
    def conforms(self) -> bool:
        return self.status == "conforms"


def replay(document: dict[str, Any], adapter: Any, *, numbers: NumberSystem = FLOAT64,
           out: Callable[[str], None] = print) -> Verdict:
    """Drive ``adapter`` through the trace; the first non-conformance ends the replay."""
    start = time.perf_counter()

    def verdict(status: str, step: int | None, message: str, failure: BaseException | None = None) -> Verdict:
        cause = cause_of(failure) if failure is not None else None
        return Verdict(status, step, message, time.perf_counter() - start,
                       *((cause.kind, cause.check, cause.changed) if cause is not None else ()))

    cls = MACHINES.get(document.get("machine", ""))
    if cls is None:
        raise codec.TraceError(f"unknown machine {document.get('machine')!r}; known: {sorted(MACHINES)}")
    capabilities = declared(adapter.capabilities)
    parameters = {k: codec.decode(v) for k, v in document.get("parameters", {}).items()}
    # The one gate, as for the properties: what the machine run needs, what the trace says it needed, the
    # declarations its program was drawn under (format 4; older traces: the steps' own checks below), and the
    # claims its later steps relied on (format 5; older traces: read from their steps' expectations).
    try:
        claims = document["claims"] if "claims" in document else recording.claims_relied_on(document["steps"])
        drawn_under = Needs.drawn_under(document.get("declarations", {}), claims)
    except (KeyError, ValueError) as error:  # (UnknownDeclaration too)
        raise codec.TraceError(f"the trace's declarations or claims: {error!s}") from error
    problem = (cls.needs(**parameters).problem(adapter) or Needs.of(*document.get("requires", ())).problem(adapter)
               or drawn_under.problem(adapter))
    if problem is not None:
        return verdict("not applicable", None, problem)
    machine: Any = cls(adapter, numbers=numbers, **parameters)  # type: ignore[call-arg]
    machine.tape = tape = recording.Playback(document["steps"], capabilities, LayerLimits.of(adapter))
    tape.adapter = adapter
    specs, invariants = cls.specs(), recording.invariants_of(cls)
    for index, step in enumerate(document["steps"]):
        name = step["rule"]
        spec = specs.get(name)
        if spec is None or spec.kind == "invariant":
            raise codec.TraceError(f"step {index}: {cls.__name__} has no rule {name!r}")
        arguments = {k: codec.decode(v) for k, v in step.get("arguments", {}).items()}
        if set(arguments) != spec.arguments:
            raise codec.TraceError(f"step {index}: {name} takes {sorted(spec.arguments) or 'no arguments'}, but the "
                                   f"trace gives {sorted(arguments)} (the suite changed)")
        shown = f"step {index}: {name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"
        try:
            missing = machine.missing(spec)
            if missing:
                raise recording.NotApplicable(f"{name} needs {', '.join(sorted(missing))}, which {adapter.name} "
                                          "does not declare")
            if spec.kind == "rule" and not machine.may_run(spec):
                if spec.relies_on:  # name the declarations that decide it (a format 4 trace is gated on them)
                    raise recording.NotApplicable(f"{name} may not run here: that depends on the state and on "
                                                  f"{adapter.name}'s {declared_here(adapter, spec.relies_on)}")
                raise recording.NotApplicable(f"{name} may not run in this state here; the state depends on the "
                                              "implementation's capabilities and dtype")
            getattr(machine, name)(**arguments)
            for check in invariants:
                check(machine)
            tape.finish_step(declared_here(adapter, spec.relies_on) if spec.relies_on else None)
        except recording.NotApplicable as reason:  # a recorded value this implementation is not offered
            out(f"{shown}: NOT APPLICABLE\n    {reason}")
            return verdict("not applicable", index, f"no longer applies at step {index}: {reason}")
        except recording.TraceEnded as reason:  # the recorded failure was inside this step; here it did not happen
            out(f"{shown}: ok as far as recorded\n    {reason}")
            for expectation in machine.tape.steps[-1].expected:
                out(f"    {describe(expectation)}")
            return verdict("conforms", None, f"all {len(document['steps'])} steps conform as far as recorded "
                                             f"(the recorded run stopped inside step {index})")
        except (NonConformance, AdapterHung) as failure:
            out(f"{shown}: DIVERGES")
            expected = machine.tape.steps[-1].expected if machine.tape.steps else []
            for number, expectation in enumerate(expected):  # the last one is where it diverged
                out(f"    {describe(expectation)}{'' if number == len(expected) - 1 else ' -- ok'}")
            out("\n".join(f"    >> {line}" for line in str(failure).splitlines()))
            return verdict("diverges", index, str(failure), failure)
        except Exception as error:  # the suite's own failure -- unless the replay had left the recorded path
            if tape.parted is None:
                raise
            reason = (f"the recorded run's later steps were drawn on another state than this one ({tape.parted}), "
                      "and its recorded values no longer fit the rules here")
            out(f"{shown}: NOT APPLICABLE\n    {reason}\n    ({type(error).__name__}: {error})")
            return verdict("not applicable", index, f"no longer applies at step {index}: {reason}")
        out(f"{shown}: ok")
        for expectation in machine.tape.steps[-1].expected:
            out(f"    {describe(expectation)}")
    return verdict("conforms", None, f"all {len(document['steps'])} steps conform")


def describe(expectation: dict[str, Any]) -> str:
    """One line for a recorded expectation (arrays left out), in any format version's vocabulary."""
    call = expectation["call"]
    expect, kind, claim = expectation.get("expect"), expectation.get("kind"), expectation.get("claim")
    if expect == Expect.REJECTION.value or "rejected" in expectation:  # (format 1 and 2: "rejected")
        return f"{call}: rejected with {kind or expectation['rejected']}, nothing changed"
    if expect == Expect.UNCLAIMED.value or "first_failing_check" in expectation:
        return (f"{call}: first failing check {kind or expectation['first_failing_check']}, not claimed"
                f"{f' ({claim} is not declared)' if claim else ''}: if it raises, nothing changed; if it "
                "accepts, not judged, and replaced")
    if expect == Expect.SUCCESS_OR_REFUSAL.value:
        return f"{call}: success, or rejected with {kind} and nothing changed"
    details = [f"{key} = {codec.decode(value)}" for key, value in expectation.items()
               if key not in ("call", "expect", "output", "tolerance")]
    if "output" in expectation:
        tolerance = np.max(codec.decode(expectation["tolerance"]))  # one number, or one per element
        details.insert(0, f"result within {float(tolerance):.1e} of the oracle")
    elif expect == Expect.SUCCESS.value and not details:
        details.insert(0, "success")
    return f"{call}: {', '.join(details)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcache-conformance replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", type=Path, metavar="TRACE")
    parser.add_argument(selection.OPTION, dest="kv_impl", default=None, metavar="MODULE:FACTORY",
                        help=f"implementation to replay against (default: ${selection.ENV_VAR} or "
                             f"{selection.DEFAULT_SPEC})")
    parser.add_argument("--oracle", default="float64", choices=selection.ORACLES)
    parser.add_argument("--quiet", action="store_true", help="print only each trace's verdict")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE",
                        help="also write each trace's verdict here: status, step, kind, check, changed")
    options = parser.parse_args(argv)
    try:
        adapter = selection.configure(options.kv_impl, options.oracle)
    except selection.AdapterLoadError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    worst = 0
    verdicts: list[dict[str, Any]] = []
    for path in options.traces:
        print(f"== {path} against {adapter.name} {adapter.version} ({selection.selected_spec()})")
        try:
            document = codec.load(path)
            recorded = document.get("failure") or {}
            if recorded and not options.quiet:
                print(f"   recorded: {document['recorded_with']['implementation']} failed at step "
                      f"{recorded.get('step')} ({recorded.get('rule')})")
            result = replay(document, adapter, numbers=selection.oracle_numbers(),
                            out=(lambda line: None) if options.quiet else print)
        except codec.TraceError as error:
            print(f"   unreadable: {error}")
            worst = max(worst, 2)
            verdicts.append({"trace": str(path), "status": "unreadable", "message": str(error)})
            continue
        where = "" if result.step is None else f" at step {result.step}"
        print(f"   {result.status.upper()}{where} ({result.seconds:.2f} s): {result.message.splitlines()[0]}")
        worst = max(worst, {"conforms": 0, "diverges": 1}.get(result.status, 2))
        verdicts.append({"trace": str(path), "status": result.status, "step": result.step, "kind": result.kind,
                         "check": result.check, "changed": list(result.changed), "message": result.message})
    if options.json is not None:
        options.json.write_text(json.dumps(verdicts, indent=1))
    return worst


if __name__ == "__main__":
    sys.exit(main())
