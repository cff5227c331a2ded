"""The chapter-37 demo prints exactly the seed's report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from impl import ch37_demo

# Copied from seeds/000_3d2acd8704549ca4.txt (the output of `cargo run -p ch37-incremental-attention`).
SEED_REPORT = """\
step=position:0 cache:0->1 shape:[1,2,1,2] max_abs_diff:0.000000000000 output:[1.000000000,0.000000000,1.000000000,0.000000000]
step=position:1 cache:1->2 shape:[1,2,2,2] max_abs_diff:0.000000000000 output:[0.213809009,0.786190991,0.770151153,-0.420735492]
step=position:2 cache:2->3 shape:[1,2,3,2] max_abs_diff:0.000000000000 output:[0.629044078,0.945303958,0.374718490,-0.583589471]
work=full_rows_per_projection:6 incremental_rows_per_projection:3 reused_rows_per_kv_projection:3 avoided_rows_across_kv:6
reset=before:3 after:0 allocation_reused:true storage_unchanged:true replay_identical:true
errors=two_tokens:true full_cache:true model_mismatch:true head_mismatch:true layer_mismatch:true rope_mismatch:true rope_positions_mismatch:true nonfinite_projection:true unchanged:true
"""  # noqa: E501

# The per-head attention weights and stored rows the seed's trace shows for position 2.
SEED_WEIGHTS_POSITION_2 = [[0.333333333333, 0.333333333333, 0.333333333333],
                           [0.054696042457, 0.370955922197, 0.574348035346]]


def test_report_equals_the_seed() -> None:
    assert ch37_demo.report() == SEED_REPORT


def test_the_command_prints_the_report() -> None:
    result = subprocess.run([sys.executable, "-m", "impl.ch37_demo"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent, check=True)
    assert result.stdout == SEED_REPORT


def test_stored_rows_equal_the_seed_trace() -> None:
    layer = ch37_demo.fixture_layer()
    cache = ch37_demo.LayerKvCache(layer, 1, ch37_demo.CAPACITY)
    ch37_demo.run_steps(layer, cache)
    keys, values = cache.keys()[0], cache.values()[0]  # [H, 3, dh]
    assert [f"{v:.9f}" for v in keys[1, 2]] == ["-1.325444263", "0.493150590"]
    assert [f"{v:.9f}" for v in values[0, 2]] == ["-0.416146837", "-0.909297427"]
    assert [f"{v:.9f}" for v in keys[1, 1]] == ["-0.841470985", "0.540302306"]
