"""Benchmarks that print numbers (never timed tests): medians, and ratios from one run.

    python bench/run.py                       # step, suite, mutants
    python bench/run.py --only step           # a subset

- step: the reference ``forward_incremental`` (B 1, H 8, dh 64, D 512) at
  lengths 256..4096, against recomputing the full prefix with the same
  implementation and against numpy copying the K/V bytes the step reads
  (the memory-bandwidth floor).
- suite: wall time of ``pytest properties/`` with ``-n 0`` and ``-n 2``.
- prefill: a 1,024-token prompt through the decode session in one chunk,
  against feeding it token by token through Python (same results?).
- store: prefix-store query time against the cut for a 2,048-token query.
- mutants: for each mutant, the example at which the ``ci`` machine first
  failed, runs including shrinking, and the shrunk program's length.
- tolerance: the float32 example adapter on 3,000 random layers (~13,000
  steps): its error in ulps at the output's magnitude, and its error as a
  fraction of the low-precision budget with a 1-ulp and with the 8-ulp floor.
- mixed: the float32-RoPE-table and float32-softmax example adapters (float64
  otherwise, ``mixed_precision`` declared) on 1,000 random layers at
  positions 0..10 and 300 at positions up to 62: error / (2 x naive + 1e-12)
  (median, max, steps over 1), the ulp floor that would take, and error / the
  mixed-precision rule's tolerance, for outputs and cached keys.
- first-failure: for each mutant, the wall time of ``pytest -x properties/``
  (default profile, one process, its database emptied first) until it
  stops at the first failure -- with the regression corpus (run first) and
  with the machines alone (``-k "not test_trace_replays"``); median, worst.
- traces: every trace of ``tests/regressions`` replayed against the mutant
  it was recorded from (must diverge at the recorded step) and against the
  reference (must conform), seconds per replay (median of 3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from impl import AttentionLayer, DecodeSession, LayerKvCache, RopeConfig  # noqa: E402
from impl.conformance import make_adapter  # noqa: E402
from impl.prefix_store import PrefixStore  # noqa: E402
from oracle import DecoderConfig, random_decoder_weights  # noqa: E402


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_step() -> None:
    heads, head_width, model_width, longest = 8, 64, 512, 4096
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(model_width)
    layer = AttentionLayer.from_arrays(*(rng.uniform(-scale, scale, (model_width, model_width)) for _ in range(4)),
                                       heads=heads, kv_heads=heads,
                                       rope=RopeConfig("half_split", 10000.0, head_width, longest + 1))
    x = rng.uniform(-1, 1, (1, longest + 1, model_width))
    cache = LayerKvCache(layer, 1, longest + 1)
    print("reference forward_incremental, B 1, H 8, dh 64, D 512 (medians)")
    print(f"{'len':>6} {'step ms':>9} {'full ms':>10} {'full/step':>10} {'copy ms':>9} {'step/copy':>10} {'x prev':>7}")
    previous = None
    for length in (256, 512, 1024, 2048, 4096):
        while cache.length < length:
            layer.forward_incremental(x[:, cache.length:cache.length + 1], cache)
        row = x[:, length:length + 1]

        def step() -> None:
            layer.forward_incremental(row, cache)
            cache._length -= 1  # benchmark only: rewind so every repeat runs at this length
            cache._next_position -= 1

        step_s = median_seconds(step, 60)
        full_s = median_seconds(lambda: layer.forward_full(x[:, :length + 1]), 3 if length >= 2048 else 7)
        keys, values, _ = cache._prefix()
        key_copy, value_copy = np.empty_like(keys), np.empty_like(values)

        def copy() -> None:
            np.copyto(key_copy, keys)
            np.copyto(value_copy, values)

        copy_s = median_seconds(copy, 60)
        growth = f"{step_s / previous:7.2f}" if previous else f"{'':>7}"
        print(f"{length:>6} {step_s * 1e3:9.3f} {full_s * 1e3:10.1f} {full_s / step_s:10.0f} "
              f"{copy_s * 1e3:9.3f} {step_s / copy_s:10.2f} {growth}")
        previous = step_s
    print("(x prev: step time over the previous length's; linear growth is 2.0 per doubling)")


def bench_suite() -> None:
    # dev is not derandomised: without one seed for both runs, they would test different random programs
    print("pytest properties/, profile dev, --hypothesis-seed 0, reference implementation (wall seconds)")
    environment = {**os.environ, "HYPOTHESIS_PROFILE": "dev"}
    walls = {}
    for workers in ("0", "2"):
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
                                 "--hypothesis-seed", "0", "properties"],
                                cwd=ROOT, env=environment, capture_output=True, text=True)
        walls[workers] = time.perf_counter() - start
        status = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-200:]
        print(f"  -n {workers}: {walls[workers]:6.1f} s   {status}")
    print(f"  speed-up of -n 2 over -n 0: {walls['0'] / walls['2']:.2f}x")


def bench_mutants() -> None:
    import conftest  # noqa: F401  (registers the Hypothesis profiles)
    from tests.mutants import MUTANTS, kill

    print("mutants under the ci profile")
    print(f"{'mutant':36} {'family':18} {'example':>7} {'runs':>5} {'steps':>5} {'seconds':>7}  first line")
    directory = Path(tempfile.mkdtemp())
    survivors = []
    for mutant in MUTANTS:
        start = time.perf_counter()
        caught = kill(mutant, directory)
        seconds = time.perf_counter() - start
        if caught is None:
            survivors.append(mutant.name)
            print(f"{mutant.name:36} SURVIVED ({seconds:.1f} s)")
            continue
        print(f"{mutant.name:36} {caught.family:18} {caught.examples:7} {caught.total_runs:5} "
              f"{caught.shrunk_steps:5} {seconds:7.1f}  {caught.message[:90]}")
    print(f"killed {len(MUTANTS) - len(survivors)} of {len(MUTANTS)}"
          + (f"; survived: {survivors}" if survivors else ""))


def bench_first_failure() -> None:
    import shutil

    from tests.mutants import MUTANTS, build

    directory = Path(tempfile.mkdtemp())
    print("time to first failure: pytest -x properties/ against each mutant (dev profile, -n 0)")
    print(f"{'mutant':36} {'with corpus s':>13} {'machines only s':>15}")
    times: dict[str, list[float]] = {"corpus": [], "machines": []}
    for mutant in MUTANTS:
        spec = build(mutant, directory)
        row = []
        for mode, extra in (("corpus", []), ("machines", ["-k", "not test_trace_replays"])):
            shutil.rmtree(ROOT / ".hypothesis" / "implementations" / f"impl-mutant-{mutant.name}", ignore_errors=True)
            environment = {**os.environ, "PYTHONPATH": str(directory), "HYPOTHESIS_PROFILE": "dev"}
            start = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0",
                                     f"--kv-impl={spec}", f"--kv-traces={directory / 'traces'}", *extra, "properties"],
                                    cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1800)
            seconds = time.perf_counter() - start
            if result.returncode != 1:  # 1: a test failed, as it must
                seconds = float("nan")
            times[mode].append(seconds)
            row.append(seconds)
        print(f"{mutant.name:36} {row[0]:13.1f} {row[1]:15.1f}")
    for mode, values in times.items():
        found = [v for v in values if v == v]
        print(f"{mode}: median {statistics.median(found):.1f} s, worst {max(found):.1f} s, "
              f"{len(values) - len(found)} not caught")


def bench_tolerance() -> None:
    from examples.minimal_adapter import make_float32_adapter
    from oracle import AttentionWeights, RopeConfig, full_prefix_attention, numpy_precision
    from properties.tolerance import FACTOR, FLOOR_ULPS

    f32, eps, adapter, rng = numpy_precision("float32"), 2.0**-23, make_float32_adapter(), np.random.default_rng(0)
    ulps, naive_ulps = [], []
    for _ in range(3000):
        heads, dh, width, length = (int(v) for v in (rng.integers(1, 5), 2 * rng.integers(1, 5),
                                                     rng.integers(1, 9), rng.integers(1, 9)))
        shapes = [(width, heads * dh)] * 3 + [(heads * dh, width)]
        weights = AttentionWeights(*(rng.uniform(-1, 1, shape) for shape in shapes), heads=heads, kv_heads=heads)
        rope = RopeConfig("interleaved", float(rng.choice([2.0, 10.0, 1e4, 5e5])), dh, 64)
        x = rng.uniform(-1, 1, (int(rng.integers(1, 4)), length, width))
        truth = full_prefix_attention(x, weights, rope).outputs
        naive = full_prefix_attention(x, weights, rope, numbers=f32).outputs
        layer = adapter.create_layer(weights, rope)
        cache = adapter.create_cache(layer, x.shape[0], 64)
        for t in range(length):
            out = adapter.step(layer, cache, x[:, t:t + 1].copy()).astype(np.float64)
            scale = eps * max(1.0, float(np.abs(truth[:, t]).max()))
            ulps.append(float(np.abs(out[:, 0] - truth[:, t]).max()) / scale)
            naive_ulps.append(float(np.abs(naive[:, t] - truth[:, t]).max()) / scale)
    error, naive = np.array(ulps), np.array(naive_ulps)
    print(f"float32 example adapter, {len(error)} steps: error in ulps at the output's magnitude: median "
          f"{np.median(error):.2f}, 99.9% {np.quantile(error, 0.999):.2f}, max {error.max():.2f}")
    for floor in (1.0, FLOOR_ULPS):
        ratio = error / (FACTOR * naive + floor)
        print(f"  error / ({FACTOR:g} x naive + {floor:g} ulps): max {ratio.max():.2f}, steps over 1: "
              f"{int((ratio > 1).sum())}")


def bench_mixed() -> None:
    from examples.minimal_adapter import make_float32_rope_adapter, make_float32_softmax_adapter
    from oracle import FLOAT64, AttentionWeights, RopeConfig, full_prefix_attention
    from properties.tolerance import _EPS, ABSOLUTE, FACTOR, Judge

    # (layers, first checked position at most): the documented ranges (the layer machine's capacity is 8,
    # a decoder's sequence 12), then deeper positions, where the RoPE angle errors grow
    for make in (make_float32_rope_adapter, make_float32_softmax_adapter):
        for layers, deepest in ((1000, 4), (300, 56)):
            adapter, rng = make(), np.random.default_rng(0)
            judge = Judge.for_adapter(adapter, FLOAT64)
            bare: dict[str, list[float]] = {"output": [], "keys": []}  # error / (2 x naive + 1e-12)
            ruled: dict[str, list[float]] = {"output": [], "keys": []}  # error / the rule's tolerance
            needed: dict[str, list[float]] = {"output": [], "keys": []}  # floor it takes, in float32 ulps
            for _ in range(layers):
                heads, dh, width = (int(v) for v in (rng.integers(1, 5), 2 * rng.integers(1, 5), rng.integers(1, 9)))
                shapes = [(width, heads * dh)] * 3 + [(heads * dh, width)]
                weights = AttentionWeights(*(rng.uniform(-1, 1, shape) for shape in shapes), heads=heads,
                                           kv_heads=heads)
                rope = RopeConfig("interleaved", float(rng.choice([2.0, 10.0, 1e4, 5e5])), dh, 64)
                first, length = int(rng.integers(0, deepest)), int(rng.integers(1, 9))
                x = rng.uniform(-1, 1, (int(rng.integers(1, 4)), first + length, width))
                reference = judge.reference(lambda numbers: full_prefix_attention(x, weights, rope, numbers=numbers))
                layer = adapter.create_layer(weights, rope)
                cache = adapter.create_cache(layer, x.shape[0], 64)
                for t in range(first + length):
                    out = adapter.step(layer, cache, x[:, t:t + 1].copy())
                    if t < first:
                        continue
                    keys = adapter.snapshot(cache).keys
                    for what, actual, select in (("output", out[:, 0], lambda a: a.outputs[:, t]),
                                                 ("keys", keys, lambda a: a.keys[:, :, :t + 1])):
                        expected, tolerance = judge.bound(reference, select)
                        error = float(np.abs(actual - expected).max())
                        naive = float(np.abs(select(reference.naive) - expected).max())
                        bare[what].append(error / (FACTOR * naive + ABSOLUTE))
                        ruled[what].append(error / tolerance)
                        scale = max(1.0, float(np.abs(expected).max()))
                        needed[what].append((error - FACTOR * naive - ABSOLUTE) / (_EPS["float32"] * scale))
            print(f"{adapter.name}, {len(bare['output'])} steps from positions 0..{deepest + 6}, {judge.rule}")
            for what in bare:
                plain, rule = np.array(bare[what]), np.array(ruled[what])
                print(f"  {what:6}: error / ({FACTOR:g} x naive + {ABSOLUTE:.0e}): median {np.median(plain):.2f}, "
                      f"max {plain.max():.2f}, over 1: {int((plain > 1).sum())}; the floor that takes: "
                      f"{max(0.0, max(needed[what])):.2f} ulps; error / tolerance: median {np.median(rule):.3f}, "
                      f"max {rule.max():.3f}")


def bench_traces() -> None:
    from impl.conformance import ReferenceAdapter
    from properties import replay, selection, trace
    from tests.mutants import MUTANTS, build

    directory = Path(tempfile.mkdtemp())
    print("regression traces: replay against the recording mutant, then the reference (median of 3 each)")
    print(f"{'trace':58} {'steps':>5} {'diverges at':>11} {'mutant s':>9} {'reference s':>11}")
    rows = []
    for path in sorted((ROOT / "tests" / "regressions").glob("*.json")):
        document = trace.load(path)
        name = document["recorded_with"]["implementation"].removeprefix("impl-mutant-")
        mutant = selection.load_adapter(build(next(m for m in MUTANTS if m.name == name), directory))
        verdicts: dict[str, list[replay.Verdict]] = {"mutant": [], "reference": []}
        for _ in range(3):
            verdicts["mutant"].append(replay.replay(document, mutant, out=lambda line: None))
            verdicts["reference"].append(replay.replay(document, ReferenceAdapter(), out=lambda line: None))
        against_mutant, against_reference = verdicts["mutant"][-1], verdicts["reference"][-1]
        same_step = (against_mutant.status, against_mutant.step) == ("diverges", document["failure"]["step"])
        seconds = [statistics.median(v.seconds for v in verdicts[k]) for k in ("mutant", "reference")]
        rows.append((same_step and against_reference.conforms, *seconds))
        print(f"{path.stem[:58]:58} {len(document['steps']):5} "
              f"{(str(against_mutant.step) if same_step else 'NO'):>11} {seconds[0]:9.3f} "
              f"{seconds[1] if against_reference.conforms else float('nan'):11.3f}")
    print(f"{sum(ok for ok, *_ in rows)} of {len(rows)} traces fail their mutant at the recorded step and pass the "
          f"reference; slowest replay {max(max(m, r) for _, m, r in rows):.3f} s, median "
          f"{statistics.median([t for _, m, r in rows for t in (m, r)]):.3f} s")


def seed_decoder(max_positions: int) -> tuple[DecoderConfig, object]:
    """The seed's decoder (vocab 32, width 16, 2 blocks, 1 head), RoPE, long enough for the benchmark."""
    config = DecoderConfig(positions="rope", max_positions=max_positions)
    return config, make_adapter().create_decoder(config, random_decoder_weights(config, 7))


def bench_prefill() -> None:
    config, decoder = seed_decoder(1024)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, config.vocab, 1024)]
    chunked, stepped = [], []

    def prefill() -> None:
        chunked.append(DecodeSession(decoder, 1024).prefill(tokens))  # type: ignore[arg-type]

    def token_by_token() -> None:
        session = DecodeSession(decoder, 1024)  # type: ignore[arg-type]
        stepped.append(np.stack([session.decode(t) for t in tokens]))

    prefill_s, stepped_s = median_seconds(prefill, 5), median_seconds(token_by_token, 3)
    error = float(np.abs(chunked[-1] - stepped[-1]).max())
    print("decode session, seed decoder with RoPE, a 1,024-token prompt (medians)")
    print(f"  prefill in one chunk: {prefill_s * 1e3:8.1f} ms")
    print(f"  token by token:       {stepped_s * 1e3:8.1f} ms   ({stepped_s / prefill_s:.1f}x slower)")
    print(f"  max |logit difference|: {error:.2e}")


def bench_store() -> None:
    config, decoder = seed_decoder(2048)
    rng = np.random.default_rng(2)
    tokens = [int(t) for t in rng.integers(0, config.vocab, 2048)]
    print("prefix store, seed decoder with RoPE, a 2,048-token query (medians)")
    print(f"{'cut':>6} {'query ms':>9} {'rows':>6} {'full rows':>9}")
    for cut in (0, 512, 1024, 2047):
        store = PrefixStore()
        if cut:
            store.prefill(decoder, "bench", tokens[:cut])  # type: ignore[arg-type]
        results = []
        seconds = median_seconds(lambda: results.append(store.query(decoder, "bench", tokens)), 5)  # type: ignore[arg-type]
        result = results[-1]
        assert result.cut == cut
        print(f"{cut:>6} {seconds * 1e3:9.1f} {result.rows_computed:>6} {result.full_rows:>9}")


BENCHES = {"step": bench_step, "prefill": bench_prefill, "store": bench_store, "suite": bench_suite,
           "mutants": bench_mutants, "first-failure": bench_first_failure, "tolerance": bench_tolerance,
           "mixed": bench_mixed, "traces": bench_traces}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(BENCHES), help="comma-separated: " + ", ".join(BENCHES))
    for name in parser.parse_args().only.split(","):
        BENCHES[name.strip()]()
        print()


if __name__ == "__main__":
    main()
