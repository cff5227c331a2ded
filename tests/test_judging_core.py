"""The judging core: the call policy of docs/spec.md §5 written once, failures that always carry their kind, and
traces of every format version replayed by it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from impl.conformance import ReferenceAdapter
from kvcache_conformance.judge.calls import Inputs
from kvcache_conformance.judge.failures import STATE_CHANGED, NonConformance, kind_of
from kvcache_conformance.judge.policy import (
    ACCEPTED_CHANGED_HELD,
    VALID,
    Due,
    Expect,
    Held,
    judge_call,
    kept,
    unchanged,
)
from kvcache_conformance.machines.layer_steps import held_rows
from kvcache_conformance.protocol.kinds import ErrorKind
from kvcache_conformance.run import selection
from kvcache_conformance.run.report import causes
from kvcache_conformance.traces import codec, replay
from tests.mutants import build, recorded_mutant

OLD = sorted((Path(__file__).parent / "old-traces").glob("*.json"))


class Errors:
    """An adapter's ``error_kind``: ``ValueError`` is ``full``, anything else unmapped."""

    name = "test-errors"
    capabilities = frozenset({"fixed_capacity"})

    def error_kind(self, error: BaseException) -> str | None:
        return "full" if isinstance(error, ValueError) else None


def _judge(action: Any, due: Due, state: dict[str, Any], capabilities: frozenset[str] = frozenset({"fixed_capacity"}),
           replaced: list[bool] | None = None) -> tuple[Any, list[dict[str, Any]]]:
    recorded: list[dict[str, Any]] = []
    judged = judge_call(Errors(), capabilities, lambda what, **entry: recorded.append({"call": what, **entry}),
                        "the call", action, due=due, inputs=Inputs(), observe=lambda: dict(state),
                        replace=lambda: None if replaced is None else replaced.append(True))
    return judged, recorded


def test_a_nonconformance_cannot_be_made_without_its_kind() -> None:
    with pytest.raises(TypeError):
        NonConformance("what went wrong")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        NonConformance("what went wrong", kind="")
    assert kind_of(NonConformance("x", kind="output mismatch", check="output")) == "output mismatch"
    assert kind_of(KeyError("a suite bug")) == "suite error (KeyError)"


def test_a_claimed_check_must_raise_its_kind_and_change_nothing() -> None:
    state = {"length": 1}

    def raises() -> None:
        raise ValueError("no room")

    judged, recorded = _judge(raises, Due.check(ErrorKind.FULL), state)
    assert judged.refused and recorded == [{"call": "the call", "expect": Expect.REJECTION.value, "kind": "full",
                                            "claim": "fixed_capacity"}]
    with pytest.raises(NonConformance) as accepted:
        _judge(lambda: None, Due.check(ErrorKind.FULL), state)
    assert accepted.value.kind == "expected full, got success" and accepted.value.check == "full"

    def writes_then_raises() -> None:
        state["length"] = 2
        raise ValueError("no room")

    with pytest.raises(NonConformance) as changed:
        _judge(writes_then_raises, Due.check(ErrorKind.FULL), state)
    assert changed.value.kind == STATE_CHANGED and changed.value.check == "full"


def test_an_unclaimed_check_may_raise_anything_or_accept_and_be_replaced() -> None:
    state: dict[str, Any] = {"keys": np.zeros(2)}

    def unmapped() -> None:
        raise RuntimeError("not mapped")

    judged, recorded = _judge(unmapped, Due.check(ErrorKind.FULL), state, capabilities=frozenset())
    assert judged.refused and recorded[0]["expect"] == Expect.UNCLAIMED.value
    replaced: list[bool] = []
    judged, _ = _judge(lambda: "accepted", Due.check(ErrorKind.FULL), state, capabilities=frozenset(),
                       replaced=replaced)
    assert judged.replaced and not judged.to_judge and replaced == [True]

    def writes_then_raises() -> None:
        state["keys"] = np.ones(2)
        raise RuntimeError("not mapped")

    with pytest.raises(NonConformance) as changed:  # universal: whatever is declared
        _judge(writes_then_raises, Due.check(ErrorKind.FULL), state, capabilities=frozenset())
    assert changed.value.kind == STATE_CHANGED


def test_an_accepted_unclaimed_call_keeps_every_row_held_before_it() -> None:
    state: dict[str, Any] = {"rows": {"row 0": np.zeros(2), "row 1": np.ones(2)}}

    def judge(action: Any, *, evicts: bool = False) -> Any:
        replaced: list[bool] = []
        judged = judge_call(Errors(), frozenset(), lambda what, **entry: None, "the call", action,
                            due=Due.check(ErrorKind.FULL), observe=lambda: {"rows": dict(state["rows"])},
                            replace=lambda: replaced.append(True), held=Held(lambda seen: seen["rows"], evicts))
        return judged, replaced

    def appends() -> None:  # a step past the capacity, taken: a new row, the old ones as they were
        state["rows"] = {**state["rows"], "row 2": np.full(2, 2.0)}

    judged, replaced = judge(appends)
    assert judged.replaced and replaced == [True]

    def clamps() -> None:  # the write at index C lands on C - 1: the last row held is overwritten
        state["rows"] = {**state["rows"], "row 1": np.full(2, 2.0)}

    with pytest.raises(NonConformance) as changed:
        judge(clamps)
    assert changed.value.kind == ACCEPTED_CHANGED_HELD and changed.value.check == "rows held"

    def evicts() -> None:  # a window lets row 0 go: allowed where it evicts, a change where it does not
        state["rows"] = {"row 1": state["rows"]["row 1"], "row 2": np.full(2, 2.0)}

    state["rows"] = {"row 0": np.zeros(2), "row 1": np.ones(2)}
    assert judge(evicts, evicts=True)[0].replaced
    state["rows"] = {"row 0": np.zeros(2), "row 1": np.ones(2)}
    with pytest.raises(NonConformance, match="is gone"):
        judge(evicts)


def test_an_accepted_unclaimed_call_may_leave_fewer_value_rows_than_key_rows() -> None:
    """transformers 5.17's DynamicCache took a row of rank 2 into its keys only: what is shown of the rows held
    before is judged, and the mismatch is no suite error (it was an IndexError)."""
    before = {"keys": np.zeros((1, 1, 1, 2)), "values": np.zeros((1, 1, 1, 2))}
    uneven = {"keys": np.zeros((1, 1, 2, 2)), "values": np.zeros((1, 1, 1, 2))}
    assert set(held_rows(uneven)) == {"key row at position 0", "key row at position 1", "value row at position 0"}
    kept(Held(held_rows), before, uneven, "the call")  # every row held before is shown, as it was
    with pytest.raises(NonConformance) as gone:
        kept(Held(held_rows), before, {**uneven, "values": np.zeros((1, 1, 0, 2))}, "the call")
    assert gone.value.kind == ACCEPTED_CHANGED_HELD


def test_a_valid_call_must_succeed_and_a_refusable_one_may_refuse_only_as_allowed() -> None:
    judged, recorded = _judge(lambda: 42, VALID, {})
    assert judged.value == 42 and judged.to_judge and recorded[0]["expect"] == Expect.SUCCESS.value

    def refuses() -> None:
        raise ValueError("evicted, say")

    with pytest.raises(NonConformance) as refused:
        _judge(refuses, VALID, {})
    assert refused.value.kind == "expected success, got full"
    judged, recorded = _judge(refuses, Due(may_refuse=ErrorKind.FULL), {})
    assert judged.refused and recorded[0]["expect"] == Expect.SUCCESS_OR_REFUSAL.value
    with pytest.raises(NonConformance) as other:
        _judge(refuses, Due(may_refuse=ErrorKind.EVICTED), {})
    assert other.value.kind == "expected success or evicted, got full"


def test_nothing_changed_compares_arrays_bit_for_bit_and_names_what_changed() -> None:
    unchanged({"keys": np.zeros(2), "length": 1}, {"keys": np.zeros(2), "length": 1}, "same")
    for after in ({"keys": np.array([0.0, -0.0]), "length": 1}, {"keys": np.zeros(2, np.float32), "length": 1},
                  {"keys": np.zeros(2), "length": 2}, {"keys": np.zeros(2)}):
        with pytest.raises(NonConformance) as failure:
            unchanged({"keys": np.zeros(2), "length": 1}, after, "what")
        assert failure.value.kind == STATE_CHANGED


def test_the_cause_table_reads_fields_never_messages() -> None:
    entries = [{"property": "p.py::t", "outcome": "failed", "reason": "expected full, got success at step 3"},
               {"property": "p.py::u", "outcome": "failed", "reason": "anything", "failure_kind": "output mismatch",
                "failure_check": "cached keys", "rule_failed": "append_rows"}]
    found = {(c["property"], c["kind"], c["check"]) for c in causes(entries)}
    assert found == {("p.py::t", "failed outside the property", None), ("p.py::u", "output mismatch", "cached keys")}


@pytest.mark.parametrize("path", OLD, ids=[f"format{codec.load(p)['format_version']}-{p.stem[12:50]}" for p in OLD])
def test_traces_of_older_formats_replay(path: Path, tmp_path: Path) -> None:
    """Format 1 (values only) and 2 (layouts): the reference conforms, the mutant that wrote it diverges."""
    document = codec.load(path)
    assert document["format_version"] in (1, 2)
    assert replay.replay(document, ReferenceAdapter(), out=lambda line: None).conforms
    mutant = selection.load_adapter(build(recorded_mutant(document), tmp_path))
    assert replay.replay(document, mutant, out=lambda line: None).status == "diverges"
