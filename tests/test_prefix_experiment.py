"""The seed-002 experiment: its table, its evidence directory and the independent audit."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments import audit_prefix_reuse, prefix_reuse

# docs/spec.md §10.8's table: condition -> (query length, cut, rows, full rows), for every seed and both conventions.
SEED_TABLE = {
    "append after the stored prefix": (12, 8, 24, 72),
    "first token edited": (12, 0, 72, 72),
    "fifth token edited": (12, 4, 48, 72),
    "eighth token edited": (12, 7, 30, 72),
    "shortened to the first four tokens": (4, 3, 6, 24),
    "append after the second branch": (12, 8, 24, 72),
    "other scope": (12, 0, 72, 72),
    "sliding-window cache, fifth token edited": (12, 0, 72, 72),
    "sliding-window cache, plain append": (12, 8, 24, 72),
}


@pytest.fixture(scope="module")
def evidence(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("evidence") / "run"
    assert prefix_reuse.main(["--out", str(out)]) == 0
    return out


def test_the_table_is_the_seeds_for_every_seed_and_convention(evidence: Path) -> None:
    cases = json.loads((evidence / "summary.json").read_text())["cases"]
    assert len(cases) == 2 * 3 * 9
    for case in cases:
        row = (case["query_length"], case["cut"], case["rows"], case["full_rows"])
        assert row == SEED_TABLE[case["condition"]], case["condition"]
        assert case["error"] < 1e-12
        assert (case["stale_error"] is not None) == case["partial_reuse"]
    partial = [c for c in cases if c["partial_reuse"]]
    assert len(partial) == 2 * 9 and all(c["stale_error"] > 1e-3 for c in partial)


def test_the_audit_passes_and_the_command_refuses_to_overwrite(evidence: Path) -> None:
    assert audit_prefix_reuse.audit(evidence) == []
    assert prefix_reuse.main(["--out", str(evidence)]) == 2


def test_the_audit_catches_a_changed_array_and_a_changed_cut(evidence: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(evidence, copy)
    summary = json.loads((copy / "summary.json").read_text())
    case = next(c for c in summary["cases"] if c["partial_reuse"])
    logits_path = copy / case["arrays"]["logits"]["file"]
    logits = np.load(logits_path)
    np.save(logits_path, logits + 1e-9)
    case["cut"] += 1
    (copy / "summary.json").write_text(json.dumps(summary))
    problems = "\n".join(audit_prefix_reuse.audit(copy))
    assert "does not match its hash" in problems
    assert "but the rules give" in problems
    assert "recomputed error" in problems
