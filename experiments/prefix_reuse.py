"""Reproduce the prefix-reuse experiment of seed 002: nine conditions x seeds 7, 11, 23.

    python -m experiments.prefix_reuse --out evidence/MY-RUN
    python -m experiments.audit_prefix_reuse evidence/MY-RUN

For both position conventions (the seed's absolute sinusoids, and RoPE),
each case stores the prefixes 1..8 and then the branch 1,2,3,4,5,20,21,22,
queries the store, and compares the suffix it computed with the oracle's full
recomputation (logits, and every block's K/V rows). The negative control
repeats each partial reuse with the cut applied but ``next_position`` left
stale. Everything goes into a new directory (never an existing one): the
arrays as ``.npy`` files and ``summary.json`` with their SHA-256 hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from impl.conformance import make_adapter
from impl.prefix_store import PrefixStore, _continue
from kvcache_conformance.oracle import PRESETS, DecoderConfig, full_decoder, random_decoder_weights

SEEDS = (7, 11, 23)
TOLERANCE = 1e-12
FIRST = tuple(range(1, 9))  # stored first: 1..8
BRANCH = (1, 2, 3, 4, 5, 20, 21, 22)  # stored second
SUFFIX = (9, 10, 11, 12)


@dataclass(frozen=True)
class Condition:
    name: str
    query: tuple[int, ...]
    scope: str = "app"
    windowed: bool = False


CONDITIONS = (
    Condition("append after the stored prefix", FIRST + SUFFIX),
    Condition("first token edited", (20, *FIRST[1:], *SUFFIX)),
    Condition("fifth token edited", (*FIRST[:4], 20, *FIRST[5:], *SUFFIX)),
    Condition("eighth token edited", (*FIRST[:7], 20, *SUFFIX)),
    Condition("shortened to the first four tokens", FIRST[:4]),
    Condition("append after the second branch", BRANCH + SUFFIX),
    Condition("other scope", FIRST + SUFFIX, scope="other"),
    Condition("sliding-window cache, fifth token edited", (*FIRST[:4], 20, *FIRST[5:], *SUFFIX), windowed=True),
    Condition("sliding-window cache, plain append", FIRST + SUFFIX, windowed=True),
)


def preset(convention: str, windowed: bool) -> DecoderConfig:
    return PRESETS[("seed-rope" if convention == "rope" else "seed") + ("-window4" if windowed else "")]


def run_case(convention: str, seed: int, condition: Condition) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    config = preset(convention, condition.windowed)
    weights = random_decoder_weights(config, seed)
    model = make_adapter().create_decoder(config, weights)  # the reference decoder from these weights
    store = PrefixStore(capacity=2)
    for stored in (FIRST, BRANCH):
        store.prefill(model, "app", stored)
    result = store.query(model, condition.scope, condition.query)
    full = full_decoder(condition.query, config, weights)
    arrays = {"query": np.array(condition.query), "logits": result.logits, "full_logits": full.logits}
    for block, rows in enumerate(result.state.blocks):
        arrays[f"keys_{block}"], arrays[f"values_{block}"] = rows.keys, rows.values
        arrays[f"positions_{block}"] = rows.positions
        arrays[f"full_keys_{block}"], arrays[f"full_values_{block}"] = full.keys[block], full.values[block]
    entry = None if result.entry is None else store.entries()[result.entry]
    partial = entry is not None and result.cut < entry.next_position
    if partial:
        assert entry is not None
        stale = _continue(model, np.array(condition.query), entry, result.cut, entry.next_position,
                          condition.scope, "negative control")
        arrays["stale_logits"] = stale.logits
    record: dict[str, object] = {
        "convention": convention, "seed": seed, "condition": condition.name, "scope": condition.scope,
        "windowed": condition.windowed, "stored": [{"scope": "app", "tokens": list(t)} for t in (FIRST, BRANCH)],
        "query_length": len(condition.query), "cut": result.cut, "rows": result.rows_computed,
        "full_rows": result.full_rows, "blocks": config.blocks, "partial_reuse": partial,
        "error": suffix_error(arrays, result.cut, config.blocks),
        "stale_error": float(np.abs(arrays["stale_logits"] - full.logits[result.cut:]).max()) if partial else None,
    }
    return record, arrays


def suffix_error(arrays: dict[str, np.ndarray], cut: int, blocks: int) -> float:
    """Worst |difference| from full recomputation: suffix logits and every held K/V row."""
    worst = float(np.abs(arrays["logits"] - arrays["full_logits"][cut:]).max())
    for block in range(blocks):
        held = arrays[f"positions_{block}"]
        for name in ("keys", "values"):
            worst = max(worst, float(np.abs(arrays[f"{name}_{block}"] - arrays[f"full_{name}_{block}"][:, held]).max()))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="a directory that does not exist yet")
    out: Path = parser.parse_args(argv).out
    if out.exists():
        print(f"refusing to write into {out}: it exists; choose a new directory", file=sys.stderr)
        return 2
    (out / "arrays").mkdir(parents=True)
    cases = []
    ok = True
    for convention in ("sinusoidal", "rope"):
        print(f"\nposition convention: {convention}")
        print(f"{'condition':42} {'query len':>9} {'cut':>4} {'rows':>5} {'full':>5}   errors (seeds {SEEDS})"
              "   stale next_position")
        for condition in CONDITIONS:
            records = []
            for seed in SEEDS:
                record, arrays = run_case(convention, seed, condition)
                record["arrays"] = {}
                for name, array in arrays.items():
                    path = out / "arrays" / f"{convention}-seed{seed}-case{CONDITIONS.index(condition)}-{name}.npy"
                    np.save(path, array)
                    record["arrays"][name] = {"file": str(path.relative_to(out)),  # type: ignore[index]
                                              "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
                records.append(record)
                ok &= record["error"] < TOLERANCE  # type: ignore[operator]
                ok &= record["stale_error"] is None or record["stale_error"] > TOLERANCE  # type: ignore[operator]
            shapes = {(r["query_length"], r["cut"], r["rows"], r["full_rows"]) for r in records}
            ok &= len(shapes) == 1  # the same table for every seed
            length, cut, rows, full = next(iter(shapes))
            errors = " ".join(f"{r['error']:.1e}" for r in records)
            stale = " ".join(f"{r['stale_error']:.3f}" for r in records if r["stale_error"] is not None) or "-"
            print(f"{condition.name:42} {length:>9} {cut:>4} {rows:>5} {full:>5}   {errors}   {stale}")
            cases.extend(records)
    summary = {"tolerance": TOLERANCE, "seeds": list(SEEDS), "cases": cases, "all_conform": bool(ok)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\nevidence written to {out}; every correct path within {TOLERANCE:.0e} and every stale control "
          f"beyond it: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
