"""The layer property replaced six, one per family (``test_layer_cache_conforms[interleaved-mha]`` ...): their node ids
still work in ``--kv-xfails`` files, narrowed to their family, and what Hypothesis saved under them is replayed
by the property that replaced them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis.database import DirectoryBasedExampleDatabase

from impl.conformance import ReferenceAdapter
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine

pytestmark = pytest.mark.slow  # subprocess runs of the suite

ROOT = Path(__file__).resolve().parent.parent
PROPERTY = "properties/test_layer_cache.py::test_layer_cache_conforms"


class OffOnInterleavedMha(ReferenceAdapter):
    """Off by 1e-6 in the interleaved MHA family only (the reference builds a positionless layer as RoPE of rotary
    width 0)."""

    name = "test-former-ids-off-on-interleaved-mha"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        output = super().step(layer, cache, x)
        interleaved = layer.rope.style == "interleaved" and layer.rope.rotary_width > 0
        return output + 1e-6 if interleaved and layer.heads == layer.kv_heads else output


class Fixed(ReferenceAdapter):
    name = "test-former-ids-fixed"


def _pytest(tmp_path: Path, spec: str, xfails: str | None, *options: str) -> dict[str, Any]:
    report = tmp_path / "report.json"
    arguments = [f"--kv-impl={spec}", f"--kv-report={report}", f"--kv-traces={tmp_path / 'traces'}", *options]
    if xfails is not None:
        (tmp_path / "xfails.txt").write_text(xfails)
        arguments.append(f"--kv-xfails={tmp_path / 'xfails.txt'}")
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", PROPERTY, *arguments], cwd=ROOT,
                   env={**os.environ, "HYPOTHESIS_PROFILE": "ci"}, capture_output=True, text=True, timeout=600)
    return next(e for e in json.loads(report.read_text())["properties"] if e["property"] == PROPERTY)


def test_a_former_id_narrows_a_known_failure_to_its_family(tmp_path: Path) -> None:
    spec = "tests.test_former_ids:OffOnInterleavedMha"
    assert _pytest(tmp_path, spec, None)["outcome"] == "failed"
    known = _pytest(tmp_path, spec, f"{PROPERTY}[interleaved-mha]  # off by 1e-6 there (#1)\n")
    assert known["outcome"] == "passed", known  # every other family judged, and passing
    # the other five families are drawn alike; a derandomised run of ~100 examples has met all five or four (under
    # the release's seed of 2026-12-05 half_split-gqa none): what matters is that the one left out is never drawn
    assert "interleaved-mha" not in known["families"] and len(known["families"]) >= 4, known["families"]
    assert known["known_interleaved-mha"]["failure_kind"] == "output mismatch"
    fixed = _pytest(tmp_path, "tests.test_former_ids:Fixed", f"{PROPERTY}[interleaved-mha]  # off by 1e-6 (#1)\n")
    assert fixed["outcome"] == "failed" and fixed["failure_kind"] == "known failure passed"  # strict, as xfail is


def test_a_former_id_narrows_a_left_out_rule_to_its_family(tmp_path: Path) -> None:
    spec = "tests.misbehaving:ResetKeepsTheLength"
    narrowed = _pytest(tmp_path, spec, f"{PROPERTY}[none-gqa] :: reset  # only there (#2)\n")
    assert narrowed["outcome"] == "failed" and narrowed["rule_failed"] == "reset"  # the other families reach it
    assert list(narrowed["rules_left_out_of"]) == ["none-gqa :: reset"]
    everywhere = _pytest(tmp_path, spec, f"{PROPERTY}[*] :: reset  # every family (#2)\n")
    assert everywhere["outcome"] == "passed", everywhere


def test_what_was_saved_under_a_former_id_is_replayed_first(tmp_path: Path) -> None:
    adapter = OffOnInterleavedMha()
    directory = ROOT / ".hypothesis" / "implementations" / adapter.name
    shutil.rmtree(directory, ignore_errors=True)
    try:  # the old parametrised property, as it ran before: its failure saved under its own id
        dev = profiles.settings_for("dev", database=DirectoryBasedExampleDatabase(str(directory)),
                                    report_multiple_bugs=False)
        found = run_machine("layer_cache", adapter, property_id=f"{PROPERTY}[interleaved-mha]",
                            parameters={"style": "interleaved", "grouped": False}, settings=dev)
        assert found.failure is not None
        replayed = _pytest(tmp_path, "tests.test_former_ids:OffOnInterleavedMha", None, "--hypothesis-profile=dev")
        assert replayed["outcome"] == "failed" and "test_layer_cache_conforms_interleaved-mha" in replayed["trace"]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
