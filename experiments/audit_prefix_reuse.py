"""Audit an evidence directory of ``experiments.prefix_reuse``, independently.

    python -m experiments.audit_prefix_reuse evidence/MY-RUN

Uses numpy and this file only: checks every array's SHA-256, recomputes every
error from the saved arrays, recomputes every cut from the saved token
sequences by the store's rules, and every projection-row count from the cut.
Exit status 0 only if everything agrees and every correct path is within the
tolerance while every stale-``next_position`` control is beyond it.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np


def common_prefix(a: list[int], b: list[int]) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def expected_cut(case: dict) -> int:
    """docs/spec.md §10.3: same scope only; a window entry only when all of it matches and the query extends it;
    the longest, newest on ties; never the whole query."""
    query, best = case["query"], 0
    for entry in reversed(case["stored"]):
        if entry["scope"] != case["scope"]:
            continue
        common = common_prefix(entry["tokens"], query)
        if case["windowed"] and not common == len(entry["tokens"]) < len(query):
            continue
        best = max(best, min(common, len(query) - 1))
    return best


def audit(directory: Path) -> list[str]:
    summary = json.loads((directory / "summary.json").read_text())
    tolerance, problems = summary["tolerance"], []
    for case in summary["cases"]:
        name = f"{case['convention']} seed {case['seed']} {case['condition']!r}"
        arrays = {}
        for key, saved in case["arrays"].items():
            path = directory / saved["file"]
            if hashlib.sha256(path.read_bytes()).hexdigest() != saved["sha256"]:
                problems.append(f"{name}: {saved['file']} does not match its hash")
            arrays[key] = np.load(path)
        case["query"] = [int(t) for t in arrays["query"]]
        cut = expected_cut(case)
        rows, full_rows = 3 * case["blocks"] * (len(case["query"]) - cut), 3 * case["blocks"] * len(case["query"])
        if (case["cut"], case["rows"], case["full_rows"]) != (cut, rows, full_rows):
            problems.append(f"{name}: cut/rows/full {case['cut']}/{case['rows']}/{case['full_rows']}, "
                            f"but the rules give {cut}/{rows}/{full_rows}")
        error = float(np.abs(arrays["logits"] - arrays["full_logits"][cut:]).max())
        for block in range(case["blocks"]):
            held = arrays[f"positions_{block}"]
            for kind in ("keys", "values"):
                difference = arrays[f"{kind}_{block}"] - arrays[f"full_{kind}_{block}"][:, held]
                error = max(error, float(np.abs(difference).max()))
        if error != case["error"] or not error < tolerance:
            problems.append(f"{name}: recomputed error {error:.3e} (summary {case['error']:.3e}, "
                            f"tolerance {tolerance:.0e})")
        if case["partial_reuse"]:
            stale = float(np.abs(arrays["stale_logits"] - arrays["full_logits"][cut:]).max())
            if stale != case["stale_error"] or not stale > tolerance:
                problems.append(f"{name}: stale control error {stale:.3e} is not far beyond {tolerance:.0e}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    problems = audit(Path(args[0]))
    for problem in problems:
        print(problem)
    print(f"audit of {args[0]}: {'PASS' if not problems else f'FAIL ({len(problems)} problems)'}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
