"""Run the suite against every Hugging Face adapter and check the published verdicts still hold.

    python -m adapters.hf_report --out DIR [--check docs/hf-transformers/outcomes.json] [--write]

For each adapter of ``PLAN``: pytest on the properties that concern it
(``adapters.hf_llama``'s: every property; ``adapters.hf_caches``'s: the
cache-operations property, its full and/or window run, or the batches property; ``adapters.hf_paged``'s:
the paged property; ``adapters.hf_model``'s and ``adapters.hf_gemma3``'s: the whole-model property) with ``--kv-report
DIR/<adapter>.json`` and ``--kv-traces DIR/traces`` (Hypothesis profile
``ci``: derandomised, so the verdicts are repeatable).
Then it prints one line per property and adapter, and wall times. With
``--check``, it exits 1 unless every property's outcome equals the published
one (a finding that disappears, or a new one, is news either way) and every
trace next to it still fails its adapter at the recorded step and passes
the reference; with ``--write`` it rewrites the outcomes instead, and copies
the traces found into the published ones.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PUBLISHED = ROOT / "docs" / "hf-transformers" / "outcomes.json"
OPERATIONS = "properties/test_cache_operations.py"
PAGED = "properties/test_paged_cache.py"
BATCHES = "properties/test_batches.py"
MODEL = "properties/test_whole_model.py"


@dataclass(frozen=True)
class Run:
    """One adapter and the properties run against it (what it does not concern is left out, for CI's time)."""

    key: str  # the name in outcomes.json: the factory's, unless one factory runs twice
    module: str = "adapters.hf_llama"
    tests: tuple[str, ...] = ("properties",)
    select: str | None = None  # pytest -k
    workers: str = "auto"  # "0" where one property runs: two workers would only both import torch
    factory: str | None = None  # default: key
    leave_out: str | None = None  # a --kv-xfails file beside outcomes.json: rules left out, to see past a finding
    in_ci: bool = True  # False: run by a full report only (--ci skips it; its traces are still replayed)


PLAN = (
    # StaticCache by a full report only: ~80 s of CI's budget for the properties DynamicCache runs too (its traces
    # are still replayed)
    Run("dynamic_cache"), Run("static_cache", in_ci=False),
    # the same with a float64 RoPE table: ~180 s that CI's budget does not have (their traces are still replayed)
    Run("dynamic_cache_float64_rope", in_ci=False), Run("static_cache_float64_rope", in_ci=False),
    # DynamicLayer ([full]) and DynamicSlidingWindowLayer ([window]); StaticLayer and StaticSlidingWindowLayer
    Run("dynamic_cache_operations", "adapters.hf_caches", (OPERATIONS,), workers="2"),
    Run("static_cache_operations", "adapters.hf_caches", (OPERATIONS,), "window", "0", in_ci=False),  # ~160 s
    Run("static_cache_operations_full", "adapters.hf_caches", (OPERATIONS,), "full", "0",
        factory="static_cache_operations", in_ci=False),  # passes; ~100 s that CI's budget does not have
    # the dynamic window layer once finding 6 is stepped around, with and without past recording
    Run("dynamic_window_skip_empty_crop", "adapters.hf_caches", (OPERATIONS,), "window", "0"),
    Run("dynamic_window_past_recording", "adapters.hf_caches", (OPERATIONS,), "window", "0", in_ci=False),  # ~110 s
    # batch_select_indices / batch_repeat_interleave (the batch size as state), one row at a time; ~80 s that CI's
    # budget does not have (its traces are still replayed)
    Run("dynamic_cache_batch_size", "adapters.hf_caches", (OPERATIONS,), workers="2", in_ci=False),
    # full attention only
    # in_ci=False while the suite's storage rule (which judges it) is new: its trace is still replayed
    Run("quantized_cache_fp8", "adapters.hf_caches", (OPERATIONS,), "full", "0", in_ci=False),
    Run("quantized_cache_hqq", "adapters.hf_caches", (OPERATIONS,), "full", "0"),
    Run("encoder_decoder_cache", "adapters.hf_caches", (OPERATIONS,), "full", "0", in_ci=False),
    Run("hybrid_layer", "adapters.hf_caches", (OPERATIONS,), "full", "0", in_ci=False),
    # left-padded batches as generate runs them (docs/spec.md §13.8; README.md, "Padded batches"): ~15-40 s each
    Run("dynamic_cache_padded", "adapters.hf_caches", (BATCHES,), workers="0"),
    Run("dynamic_cache_padded_skip_empty_batch", "adapters.hf_caches", (BATCHES,), workers="0"),
    # the same declaring truncate by crop, ragged_truncate = "columns": fails where a row holds padding after its
    # tokens (README.md, "Padded batches"); its trace is still replayed
    Run("dynamic_cache_padded_crop", "adapters.hf_caches", (BATCHES,), workers="0", in_ci=False),
    Run("static_cache_padded", "adapters.hf_caches", (BATCHES,), workers="0"),
    Run("quantized_cache_hqq_padded", "adapters.hf_caches", (BATCHES,), workers="0"),  # per-group storage: judged
    # transformers' PagedAttentionCache (continuous batching), docs/hf-transformers/paged.md
    Run("paged_attention_cache", "adapters.hf_paged", (PAGED,), workers="0"),
    Run("paged_attention_cache_ids_checked", "adapters.hf_paged", (PAGED,), workers="0"),
    Run("paged_attention_cache_ids_checked_float64_rope", "adapters.hf_paged", (PAGED,), workers="0", in_ci=False),
    Run("paged_attention_cache_evict_first", "adapters.hf_paged", (PAGED,), workers="0", in_ci=False),
    # LlamaForCausalLM under the model machine (docs/hf-transformers/model-level.md): by a full report only, 869 s
    # at ci that CI's budget does not have (their traces are still replayed)
    *(Run(f"model_{factory}", "adapters.hf_model", (MODEL,), workers="0", factory=factory, in_ci=False)
      for factory in ("dynamic_cache", "static_cache", "dynamic_cache_rows", "dynamic_cache_stock",
                      "dynamic_cache_crop", "static_cache_crop", "static_cache_no_roll_back", "dynamic_cache_padded")),
    # Gemma3ForCausalLM, sliding and full layers (docs/hf-transformers/gemma3-notes.md, issue 37): by a full report
    # only, 190-450 s each at ci that CI's budget does not have (their traces are still replayed)
    *(Run(f"model_gemma3_{factory}", "adapters.hf_gemma3", (MODEL,), workers="0", factory=factory, in_ci=False)
      for factory in ("dynamic_cache", "dynamic_cache_crop", "dynamic_cache_crop_unchecked", "full_layers",
                      "static_cache", "static_cache_crop", "dynamic_cache_rows", "dynamic_cache_stock")),
)


def run(plan: Run, out: Path) -> tuple[dict[str, str], float]:
    adapter = plan.key
    report = out / f"{adapter}.json"
    command = [sys.executable, "-m", "pytest", "-n", plan.workers, "-q", "-p", "no:cacheprovider", *plan.tests,
               f"--kv-impl={plan.module}:{plan.factory or adapter}", f"--kv-report={report}",
               f"--kv-traces={out / 'traces'}", *(["-k", plan.select] if plan.select else []),
               *([f"--kv-xfails={PUBLISHED.parent / plan.leave_out}"] if plan.leave_out else [])]
    environment = {**os.environ, "HYPOTHESIS_PROFILE": "ci"}
    start = time.perf_counter()
    finished = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if not report.exists():
        raise SystemExit(f"{adapter}: pytest wrote no report (exit {finished.returncode}):\n{finished.stdout[-3000:]}"
                         f"\n{finished.stderr[-3000:]}")
    document = json.loads(report.read_text())
    # The corpus is counted, not listed: its file names change whenever it is regenerated.
    outcomes = {p["property"]: p["outcome"] for p in document["properties"]
                if "test_regressions.py" not in p["property"]}
    corpus = [p["outcome"] for p in document["properties"] if "test_regressions.py" in p["property"]]
    print(f"{adapter}: {document['summary']} in {seconds:.1f} s (regression traces: "
          f"{corpus.count('passed')} passed, {corpus.count('failed')} failed, {corpus.count('skipped')} skipped)")
    for entry in document["properties"]:
        if entry["outcome"] == "skipped" or ("test_regressions.py" in entry["property"]
                                             and entry["outcome"] == "passed"):
            continue
        error = f" worst {entry['worst_error']:.2e}" if "worst_error" in entry else ""
        print(f"  {entry['outcome']:7} {entry['property'].split('::')[1]}{error}"
              + (f"\n          {entry['reason'][:220]}" if entry.get("reason") else ""))
    return outcomes, seconds


def reference_declaring(recorded: Any) -> Any:
    """The reference under the recorded adapter's choices: its paged policy (a trace drawn for a pool whose hash
    leaves out the signature, one computation per pool, replays only where that is declared: docs/spec.md §11.3)
    and, for a whole model, its ``model_policy``, ``model_limits`` and ``interleaved_windows`` (a trace drawn for
    per-sequence contexts with whole copies only, or a width divisible by the heads, reads as drawn only where the
    same is declared: §15.7), and its ``ragged_truncate`` (§13.8). The reference implements every policy value,
    so the correct implementation the trace must pass on is the reference declaring the same."""
    from impl.conformance import make_adapter, make_columns_truncate_adapter
    from kvcache_conformance.protocol.kinds import Capability, declared

    # a ragged batch truncated by columns (docs/spec.md §13.8): the reference doing and declaring the same
    reference = make_columns_truncate_adapter() if getattr(recorded, "ragged_truncate", None) == "columns" \
        else make_adapter()
    policy = getattr(recorded, "paged_policy", None)
    if policy is not None:
        reference.paged_policy = {**reference.paged_policy, **policy}
    if Capability.WHOLE_MODEL.value in declared(recorded.capabilities):
        reference.model_policy = {**reference.model_policy, **(getattr(recorded, "model_policy", None) or {})}
        reference.model_limits = getattr(recorded, "model_limits", None) or {}
        # the reference computes per-layer windows (impl.model_conformance:make_gemma3_model_adapter declares it);
        # a trace drawn for an adapter declaring it reads as drawn only where the reference declares it too
        interleaved = Capability.INTERLEAVED_WINDOWS.value
        if interleaved in declared(recorded.capabilities):
            reference.capabilities = frozenset(declared(reference.capabilities)) | {interleaved}
    return reference


def check_traces(directory: Path) -> list[str]:
    """Every published trace still fails the adapter it was recorded with, at its step, and passes the reference
    declaring what it declared."""
    from kvcache_conformance.run import selection
    from kvcache_conformance.traces import codec as trace
    from kvcache_conformance.traces import replay

    changed = []
    for path in sorted(directory.glob("*.json")):
        try:
            document = trace.load(path)
            recorded = selection.load_adapter(document["recorded_with"]["spec"])
            again = replay.replay(document, recorded, out=lambda line: None)
            reference = replay.replay(document, reference_declaring(recorded), out=lambda line: None)
        except Exception as error:  # a trace that cannot be replayed is a change, not a crash
            print(f"{path.name}: cannot be replayed: {type(error).__name__}: {error}")
            changed.append(f"{path.name}: cannot be replayed ({type(error).__name__})")
            continue
        print(f"{path.name}: {again.status} at step {again.step} against {recorded.name} ({again.seconds:.2f} s), "
              f"{reference.status} against the reference")
        if (again.status, again.step) != ("diverges", document["failure"]["step"]) or not reference.conforms:
            changed.append(f"{path.name}: now {again.status} at step {again.step}, {reference.status} on the reference")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapters.hf_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for reports and traces")
    parser.add_argument("--check", type=Path, default=None, help="published outcomes to compare with")
    parser.add_argument("--write", action="store_true", help="rewrite the published outcomes (--check's file, or "
                        f"{PUBLISHED.relative_to(ROOT)}) and copy the traces found beside them, instead of comparing")
    parser.add_argument("--ci", action="store_true", help="only the runs marked in_ci (the others' outcomes are "
                        "not compared; every published trace is still replayed)")
    parser.add_argument("--only", default=None, metavar="KEY,...", help="just these runs (with --write: their "
                        "outcomes replace theirs, the others' are kept)")
    options = parser.parse_args(argv)
    if options.write and options.ci:
        parser.error("--write needs every run: drop --ci")
    only = set(options.only.split(",")) if options.only else None
    unknown = (only or set()) - {plan.key for plan in PLAN}
    if unknown:
        parser.error(f"no run {', '.join(sorted(unknown))}; runs: {', '.join(plan.key for plan in PLAN)}")
    options.out.mkdir(parents=True, exist_ok=True)
    found, seconds = {}, {}
    for plan in PLAN:
        if (plan.in_ci or not options.ci) and (only is None or plan.key in only):
            found[plan.key], seconds[plan.key] = run(plan, options.out.resolve())
    print("wall time: " + ", ".join(f"{a} {s:.0f} s" for a, s in seconds.items())
          + f"; total {sum(seconds.values()):.0f} s")
    if options.write:
        published = options.check or PUBLISHED
        kept = json.loads(published.read_text()) if only is not None and published.exists() else {}
        published.write_text(json.dumps({**kept, **found}, indent=1, sort_keys=True) + "\n")
        traces = published.parent / "traces"
        traces.mkdir(exist_ok=True)
        for path in sorted((options.out / "traces").glob("*.json")):
            shutil.copyfile(path, traces / path.name)
        print(f"wrote {published} and {len(list((options.out / 'traces').glob('*.json')))} traces into {traces} "
              "(traces found otherwise, e.g. by another profile, are kept: remove those that no longer fail)")
        return 0
    if options.check is None:
        return 0
    published = json.loads(options.check.read_text())
    changed = [f"{adapter} {prop}: published {published.get(adapter, {}).get(prop)}, now {outcome}"
               for adapter, outcomes in found.items() for prop, outcome in outcomes.items()
               if published.get(adapter, {}).get(prop) != outcome]
    changed += check_traces(options.check.parent / "traces")
    for line in changed:
        print(f"CHANGED {line}")
    print("the published verdicts hold" if not changed else f"{len(changed)} verdicts differ from {options.check}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
