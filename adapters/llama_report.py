"""Run the whole-model property against llama.cpp in each configuration and check the published causes still hold.

    python -m adapters.llama_report --out DIR [--check docs/llama-cpp/outcomes.json] [--write] [--only KEY,...]
                                    [--windows]

For each configuration of ``PLAN``: pytest on ``properties/test_whole_model.py`` against
``adapters.llama_cpp:<factory>`` (each in a child process: an engine abort is a "crash" cause, not the end of the
run), Hypothesis profile ``ci`` (derandomised: the verdicts repeat), with ``--kv-report DIR/<key>.json``. It prints
every cause (its rule, what failed, the shrunk trace) and the wall time. A cause is compared by its identity
(``causes[].label`` and rule), never by message text: with ``--check``, it exits 1 unless each configuration's
outcome and set of causes equal the published ones; ``--write`` rewrites them instead. The windowed models'
configurations (issue 37, docs/llama-cpp/windows.md) run with ``--windows`` (or by name with ``--only``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "docs" / "llama-cpp" / "outcomes.json"
PROPERTY = "properties/test_whole_model.py"


@dataclass(frozen=True)
class Run:
    """One configuration: the adapter factory of adapters/llama_cpp.py that runs it (isolated)."""

    key: str
    factory: str
    in_ci: bool = True  # False: run by a full report only
    # a windowed model's configuration (issue 37): run with --windows (or by name with --only)
    windows: bool = False
    # --kv-causes: the distinct causes searched (None: the suite's default, 4); the windowed configurations meet
    # A-K of the Llama runs first, and their own causes only behind them
    causes: int | None = None


PLAN = (
    Run("f32", "make_isolated_adapter"),  # f32 cache, flash attention off, both context kinds: exact mode
    Run("f16", "make_isolated_f16_adapter", in_ci=False),  # llama.cpp's default cache type, as a storage format
    Run("flash", "make_isolated_flash_adapter", in_ci=False),  # flash attention: an f32 cache computed in f16
    Run("unified", "make_isolated_unified_adapter", in_ci=False),
    Run("per_sequence", "make_isolated_per_sequence_adapter", in_ci=False),
    Run("q8_0", "make_isolated_q8_0_adapter", in_ci=False),  # block formats (flash attention), head width 32
    Run("q4_0", "make_isolated_q4_0_adapter", in_ci=False),
    Run("q8_0_no_rotation", "make_isolated_q8_0_no_rotation_adapter", in_ci=False),  # LLAMA_ATTN_ROT_DISABLE=1
    Run("micro_batch", "make_isolated_micro_batch_adapter", in_ci=False),  # f32, n_ubatch 3: batches split
    # windowed models as gemma3 over llama.cpp's two stores (docs/llama-cpp/windows.md): swa_full on (llama.cpp's
    # default) and off; at the suite's sizes both stores have 256 cells, so off differs from on only past them
    Run("windows", "make_isolated_windows_adapter", in_ci=False, windows=True, causes=10),
    Run("windows_swa_small", "make_isolated_windows_swa_small_adapter", in_ci=False, windows=True, causes=10),
    Run("windows_f16", "make_isolated_windows_f16_adapter", in_ci=False, windows=True, causes=10),
    Run("windows_flash", "make_isolated_windows_flash_adapter", in_ci=False, windows=True, causes=10),
    Run("windows_unified", "make_isolated_windows_unified_adapter", in_ci=False, windows=True, causes=10),
    Run("windows_per_sequence", "make_isolated_windows_per_sequence_adapter", in_ci=False, windows=True, causes=10),
)


def run(plan: Run, out: Path) -> tuple[dict[str, Any], float]:
    report = out / f"{plan.key}.json"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROPERTY,
               f"--kv-impl=adapters.llama_cpp:{plan.factory}", f"--kv-report={report}",
               f"--kv-traces={out / 'traces'}", *([f"--kv-causes={plan.causes}"] if plan.causes else [])]
    start = time.perf_counter()
    finished = subprocess.run(command, cwd=ROOT, env={**os.environ, "HYPOTHESIS_PROFILE": "ci"},
                              capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not report.exists():
        raise SystemExit(f"{plan.key}: pytest wrote no report (exit {finished.returncode}):\n"
                         f"{finished.stdout[-3000:]}\n{finished.stderr[-3000:]}")
    entry = next(p for p in json.loads(report.read_text())["properties"] if p["property"].startswith(PROPERTY))
    causes = sorted({(c["rule"] or "", c["label"]) for c in entry.get("causes", [])})
    print(f"{plan.key}: {entry['outcome']} in {seconds:.0f} s, {entry.get('runs', 0)} examples"
          + (f"; {entry['reason'][:200]}" if entry.get("reason") else ""))
    for cause in entry.get("causes", []):
        print(f"  {cause['rule']}: {cause['label']} -- {cause['message'][:160]}\n    {cause['trace']}")
    return {"outcome": entry["outcome"], "causes": [list(c) for c in causes]}, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapters.llama_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for reports and traces")
    parser.add_argument("--check", type=Path, default=None, help="published outcomes to compare with")
    parser.add_argument("--write", action="store_true", help="rewrite the published outcomes (--check's file, or "
                        f"{PUBLISHED.relative_to(ROOT)}) instead of comparing")
    parser.add_argument("--ci", action="store_true", help="only the configurations marked in_ci")
    parser.add_argument("--only", default=None, metavar="KEY,...", help="just these configurations")
    parser.add_argument("--windows", action="store_true", help="also the windowed models' configurations "
                        "(gemma3, docs/llama-cpp/windows.md)")
    options = parser.parse_args(argv)
    only = set(options.only.split(",")) if options.only else None
    unknown = (only or set()) - {plan.key for plan in PLAN}
    if unknown:
        parser.error(f"no configuration {', '.join(sorted(unknown))}; they are: {', '.join(p.key for p in PLAN)}")
    options.out.mkdir(parents=True, exist_ok=True)
    found, seconds = {}, {}
    for plan in PLAN:
        wanted = (plan.in_ci or not options.ci) and (plan.windows <= options.windows or only is not None)
        if wanted and (only is None or plan.key in only):
            found[plan.key], seconds[plan.key] = run(plan, options.out.resolve())
    print("wall time: " + ", ".join(f"{k} {s:.0f} s" for k, s in seconds.items())
          + f"; total {sum(seconds.values()):.0f} s")
    published_path = options.check or PUBLISHED
    if options.write:
        kept = json.loads(published_path.read_text()) if published_path.exists() else {}
        published_path.write_text(json.dumps({**kept, **found}, indent=1, sort_keys=True) + "\n")
        print(f"wrote {published_path}")
        return 0
    if options.check is None:
        return 0
    published = json.loads(options.check.read_text())
    changed = [f"{key}: published {published.get(key)}, now {now}" for key, now in found.items()
               if published.get(key) != now]
    for line in changed:
        print(f"CHANGED {line}")
    print("the published verdicts hold" if not changed else f"{len(changed)} verdicts differ from {options.check}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
