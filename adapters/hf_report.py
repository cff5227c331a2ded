"""Run the suite against every Hugging Face adapter and check the published verdicts still hold.

    python -m adapters.hf_report --out DIR [--check docs/hf-transformers/outcomes.json] [--write]

For each adapter of ``adapters.hf_llama``: ``pytest -n auto properties/``
with ``--kv-report DIR/<adapter>.json`` and ``--kv-traces DIR/traces``
(Hypothesis profile ``ci``: derandomised, so the verdicts are repeatable).
Then it prints one line per property and adapter, and wall times. With
``--check``, it exits 1 unless every property's outcome equals the published
one (a finding that disappears, or a new one, is news either way) and every
trace next to it still fails its adapter at the recorded step and passes
the reference; with ``--write`` it rewrites the outcomes instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("dynamic_cache", "static_cache", "dynamic_cache_float64_rope", "static_cache_float64_rope")


def run(adapter: str, out: Path) -> tuple[dict[str, str], float]:
    report = out / f"{adapter}.json"
    command = [sys.executable, "-m", "pytest", "-n", "auto", "-q", "-p", "no:cacheprovider", "properties",
               f"--kv-impl=adapters.hf_llama:{adapter}", f"--kv-report={report}", f"--kv-traces={out / 'traces'}"]
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


def check_traces(directory: Path) -> list[str]:
    """Every published trace still fails the adapter it was recorded with, at its step, and passes the reference."""
    from impl.conformance import make_adapter
    from properties import replay, selection, trace

    changed = []
    for path in sorted(directory.glob("*.json")):
        document = trace.load(path)
        recorded = selection.load_adapter(document["recorded_with"]["spec"])
        again = replay.replay(document, recorded, out=lambda line: None)
        reference = replay.replay(document, make_adapter(), out=lambda line: None)
        print(f"{path.name}: {again.status} at step {again.step} against {recorded.name} ({again.seconds:.2f} s), "
              f"{reference.status} against the reference")
        if (again.status, again.step) != ("diverges", document["failure"]["step"]) or not reference.conforms:
            changed.append(f"{path.name}: now {again.status} at step {again.step}, {reference.status} on the reference")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m adapters.hf_report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for reports and traces")
    parser.add_argument("--check", type=Path, default=None, help="published outcomes to compare with")
    parser.add_argument("--write", action="store_true", help="rewrite --check's file instead of comparing")
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    found = {adapter: run(adapter, options.out.resolve())[0] for adapter in ADAPTERS}
    if options.check is None:
        return 0
    if options.write:
        options.check.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        print(f"wrote {options.check}")
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
