"""Benchmarks that print numbers (never timed tests): medians, and ratios from one run.

    python bench/run.py                       # step, suite, mutants
    python bench/run.py --only step           # a subset
    python bench/run.py --only power --seeds 5 --mutants reorder_along_the_head_axis

- step: the reference ``forward_incremental`` (B 1, H 8, dh 64, D 512) at
  lengths 256..4096, against recomputing the full prefix with the same
  implementation and against numpy copying the K/V bytes the step reads
  (the memory-bandwidth floor).
- suite: the main job as users run it, ``pytest -n 2 properties/`` with random seeds and the example
  database on: median wall and CPU seconds of 3 runs.
- prefill: a 1,024-token prompt through the decode session in one chunk,
  against feeding it token by token through Python (same results?).
- store: prefix-store query time against the cut for a 2,048-token query.
- mutants: for each mutant, the example at which the ``ci`` machine first
  failed, runs including shrinking, and the shrunk program's length.
- tolerance: the float32 example adapter on 3,000 random layers (~13,000
  steps): its error in ulps at the output's magnitude, and its error as a
  fraction of the low-precision budget -- the rule's (2 x the estimated
  rounding error any evaluation may have) and the former one (2 x the naive
  evaluation's error) -- with no floor, a 1-ulp and the 8-ulp floor.
- mixed: the float32-RoPE-table, -softmax, -rotation and -transcendentals example adapters (float64
  otherwise, ``mixed_precision`` declared) on 1,000 random layers at
  positions 0..10 and 300 at positions up to 62: error / (2 x naive + 1e-12)
  (median, max, steps over 1), the ulp floor that would take, and error / the
  mixed-precision rule's tolerance, for outputs and cached keys.
- first-failure: for each mutant, the wall time of ``pytest -x properties/``
  (default profile, one process, its database emptied first) until it
  stops at the first failure -- with the regression corpus (run first) and
  with the machines alone (``-k "not test_trace_replays"``); median, worst.
- operations: spec §13 on the reference at length 2,048 (H 8, dh 64, D 512):
  truncating 4 drafted rows and re-appending 4 against recomputing the
  prefix; reordering 8 beams against one copy of both buffers; a window
  step at steady state against a plain step over as many rows.
- storage: the quantized reference adapters (fp8 per-tensor frozen, int8
  per-channel recomputed, float16, uint4 in affine groups of 4) on 400 random
  layers: error / the storage rule's tolerance, error / (k x naive), and the
  floor it takes; for the affine groups also a cache attending its newest 2
  rows exact (residual rows).
- traces: every trace of ``properties/regressions`` replayed against the mutant
  it was recorded from (must diverge at the recorded step) and against the
  reference adapter it mutates (must conform), seconds per replay (median of 3).
- shipped: KV-cache bugs that shipped in real releases (bench/shipped/catalogue.toml), the plain command on the
  last release with each and the first with its fix, each in a cached environment: caught, quiet on the fix,
  seconds, the shrunk trace's steps (bench/shipped/runner.py; hours cold; only with --only).
- margins: the float32 family (tests/float32_family.py: correct float32 layer caches and whole models differing
  in summation order, blocking and fusion) under --seeds random seeds each (dev profile, no example database, as
  users run): per member and rule, runs, failing seeds, the worst error / tolerance, CPU seconds.
- storage-margins (also printed after margins): the storage rules' margins, each honest storage declaration (a whole
  model's kv_storage, docs/spec.md §15.6; a layer's storage, §13.6) under --seeds random seeds of its machine.
- causes: a mutant with three bugs (two failing one claimed check in two ways, one behind them) under the
  plain command on the window operations property: the causes each of 3 runs finds, with their traces.
- chains: the model machine with the reference's full declaration, 20 random dev runs: each chain case's
  count per run (min, median, runs under 3), and the largest share of a run's steps one rule took.
- power: every mutant under ``--seeds N`` random seeds (default 20) at its ci budget, no shrinking: its kill
  rate, median and worst example, weakest first, and the CPU seconds (``--mutants a,b`` for a subset; hours for
  all: only with --only).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from impl import AttentionLayer, DecodeSession, LayerKvCache, RopeConfig  # noqa: E402
from impl.conformance import make_adapter  # noqa: E402
from impl.prefix_store import PrefixStore  # noqa: E402
from kvcache_conformance.oracle import DecoderConfig, random_decoder_weights  # noqa: E402


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
            cache.truncate(length)  # rewind so every repeat runs at this length

        step_s = median_seconds(step, 60)
        full_s = median_seconds(lambda: layer.forward_full(x[:, :length + 1]), 3 if length >= 2048 else 7)
        keys, values, _ = cache.held_rows()
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


def bench_suite(runs: int = 3) -> None:
    """The main job as users run it: ``pytest -n 2 properties/``, default profile, random seeds, the example
    database on; the median of ``runs`` runs, wall and CPU seconds (the CPU of every process it started)."""
    print(f"pytest -n 2 properties/, profile dev, random seeds, example database on, reference implementation "
          f"({runs} runs)")
    environment = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "KVCACHE_IMPL")}
    walls, cpus = [], []
    for run in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                                 "properties"], cwd=ROOT, env=environment, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        status = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-200:]
        print(f"  run {run + 1}: {walls[-1]:6.1f} s wall, {cpus[-1]:6.1f} s CPU   {status}")
    print(f"  median: {statistics.median(walls):.1f} s wall, {statistics.median(cpus):.1f} s CPU")


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


def _cpu_seconds() -> float:
    """CPU seconds of this process and of the children it waited for (an isolated adapter's engine)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_power(seeds: int = 20, names: list[str] | None = None) -> None:
    """Each visible mutant (tests/mutants.py) under ``seeds`` random seeds at its ci budget (the ci profile, its own
    max_examples, random instead of derandomised; no shrinking: only the kill is measured): how often it is
    killed, and at which example (summed over its machine runs, as ``kill`` runs them), weakest first. A check
    that kills a mutant in 17 seeds of 20 passes CI or not by the luck of its seed: raise it by a hard case."""
    from hypothesis import Phase

    import conftest  # noqa: F401  (registers the Hypothesis profiles)
    from kvcache_conformance.judge.failures import NonConformance
    from kvcache_conformance.run import profiles, selection
    from kvcache_conformance.run.runner import run_machine
    from tests.mutants import MUTANTS, build, runs_for

    chosen = [m for m in MUTANTS if names is None or m.name in names]
    unknown = set(names or ()) - {m.name for m in chosen}
    if unknown:
        raise SystemExit(f"no such mutant: {', '.join(sorted(unknown))}")
    print(f"power: {len(chosen)} mutants x {seeds} random seeds at each one's ci budget (no shrinking)")
    directory = Path(tempfile.mkdtemp())
    cpu_before = _cpu_seconds()
    rows = []
    for mutant in chosen:
        spec = build(mutant, directory)
        adapter: Any = selection.load_adapter(spec)
        searching = profiles.settings_for("ci", derandomize=False, database=None, report_multiple_bugs=False,
                                          print_blob=False, max_examples=mutant.examples,
                                          phases=(Phase.explicit, Phase.generate))
        start, kills = time.perf_counter(), []
        for _ in range(seeds):
            examples = 0
            for family, machine, parameters in runs_for(mutant):
                result = run_machine(machine, adapter, property_id=f"{machine}[{family}]", parameters=parameters,
                                     settings=searching)
                if isinstance(result.failure, NonConformance):
                    kills.append(examples + (result.first_failing or result.runs))
                    break
                if result.failure is not None:
                    raise result.failure
                examples += result.runs
        rows.append((mutant.name, mutant.examples, kills, time.perf_counter() - start))
        print(f"  {mutant.name}: killed {len(kills)}/{seeds}" + (f", median example {statistics.median(kills):g}"
                                                                if kills else ""), flush=True)
    cpu = _cpu_seconds() - cpu_before
    rows.sort(key=lambda row: (len(row[2]), -(statistics.median(row[2]) if row[2] else 0.0)))
    print(f"\n{'mutant (weakest first)':44} {'budget':>6} {'killed':>7} {'rate':>5} {'median':>6} {'max':>5} "
          f"{'seconds':>7}")
    for name, budget, kills, seconds in rows:
        median = f"{statistics.median(kills):6g}" if kills else f"{'-':>6}"
        most = f"{max(kills):5}" if kills else f"{'-':>5}"
        print(f"{name:44} {budget:6} {len(kills):3}/{seeds:<3} {len(kills) / seeds:5.2f} {median} {most} "
              f"{seconds:7.1f}")
    print(f"total CPU {cpu:.0f} s ({cpu / max(1, len(chosen) * seeds):.1f} s a mutant and seed)")


def bench_first_failure() -> None:
    import shutil

    from tests.mutants import MUTANTS, build

    directory = Path(tempfile.mkdtemp())
    began = time.perf_counter()
    print("time to first failure: pytest -x properties/ against each mutant (dev profile, random seeds, its "
          "database emptied first, -n 0)")
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
    print(f"(the benchmark took {time.perf_counter() - began:.0f} s)")


def bench_tolerance() -> None:
    from examples.minimal_adapter import make_float32_adapter
    from kvcache_conformance.judge.tolerance import FACTOR, FLOOR_ULPS
    from kvcache_conformance.oracle import (
        AttentionWeights,
        RopeConfig,
        full_prefix_attention,
        numpy_precision,
        rounding_errors,
    )

    f32, eps, adapter, rng = numpy_precision("float32"), 2.0**-23, make_float32_adapter(), np.random.default_rng(0)
    ulps, naive_ulps, estimate_ulps = [], [], []
    for _ in range(3000):
        heads, dh, width, length = (int(v) for v in (rng.integers(1, 5), 2 * rng.integers(1, 5),
                                                     rng.integers(1, 9), rng.integers(1, 9)))
        shapes = [(width, heads * dh)] * 3 + [(heads * dh, width)]
        weights = AttentionWeights(*(rng.uniform(-1, 1, shape) for shape in shapes), heads=heads, kv_heads=heads)
        rope = RopeConfig("interleaved", float(rng.choice([2.0, 10.0, 1e4, 5e5])), dh, 64)
        x = rng.uniform(-1, 1, (int(rng.integers(1, 4)), length, width))
        truth = full_prefix_attention(x, weights, rope).outputs
        naive = full_prefix_attention(x, weights, rope, numbers=f32).outputs
        estimate = full_prefix_attention(x, weights, rope, numbers=rounding_errors("float32")).outputs
        layer = adapter.create_layer(weights, rope)
        cache = adapter.create_cache(layer, x.shape[0], 64)
        for t in range(length):
            out = adapter.step(layer, cache, x[:, t:t + 1].copy()).astype(np.float64)
            scale = eps * max(1.0, float(np.abs(truth[:, t]).max()))
            ulps.append(float(np.abs(out[:, 0] - truth[:, t]).max()) / scale)
            naive_ulps.append(float(np.abs(naive[:, t] - truth[:, t]).max()) / scale)
            estimate_ulps.append(float(estimate[:, t].max()) / scale)
    error, naive, estimated = np.array(ulps), np.array(naive_ulps), np.array(estimate_ulps)
    print(f"float32 example adapter, {len(error)} steps: error in ulps at the output's magnitude: median "
          f"{np.median(error):.2f}, 99.9% {np.quantile(error, 0.999):.2f}, max {error.max():.2f}; the estimated "
          f"rounding error (the rule's err): median {np.median(estimated):.2f}, max {estimated.max():.2f} ulps")
    for name, baseline in (("naive", naive), ("err", estimated)):  # the former rule, and §8.3's
        for floor in (0.0, 1.0, FLOOR_ULPS):
            ratio = error / (FACTOR * baseline + floor)
            print(f"  error / ({FACTOR:g} x {name} + {floor:g} ulps): max {ratio.max():.2f}, steps over 1: "
                  f"{int((ratio > 1).sum())}")


def bench_mixed(only: str | None = None) -> None:
    import examples.minimal_adapter as example
    from examples.minimal_adapter import (
        make_float32_rope_adapter,
        make_float32_rotation_adapter,
        make_float32_softmax_adapter,
        make_float32_transcendentals_adapter,
    )
    from kvcache_conformance.judge.tolerance import _EPS, ABSOLUTE, FACTOR, Judge
    from kvcache_conformance.oracle import FLOAT64, AttentionWeights, RopeConfig, full_prefix_attention


    def result_rounded(function: Any, dtype: str | None) -> Any:  # float32 accuracy without rounding the argument
        return function if dtype is None else lambda x: function(x).astype(dtype).astype(np.asarray(x).dtype)

    # (layers, first checked position at most): the documented ranges (the layer machine's capacity is 8,
    # a decoder's sequence 12), then deeper positions, where the RoPE angle errors grow
    makers = (make_float32_rope_adapter, make_float32_softmax_adapter, make_float32_rotation_adapter,
              make_float32_transcendentals_adapter)
    styles = {"argument rounded": example.function_in, "result rounded": result_rounded}
    runs = [(make, style) for make in makers if only is None or only in make.__name__
            for style in (styles if "transcendentals" in make.__name__ else ["argument rounded"])]
    for (make, style), (layers, deepest) in ((run, size) for run in runs for size in ((1000, 4), (300, 56))):
        example.function_in = styles[style]
        try:
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
            print(f"{adapter.name} ({style}), {len(bare['output'])} steps from positions 0..{deepest + 6}, "
                  f"{judge.rule}")
            for what in bare:
                plain, rule = np.array(bare[what]), np.array(ruled[what])
                print(f"  {what:6}: error / ({FACTOR:g} x naive + {ABSOLUTE:.0e}): median {np.median(plain):.2f}, "
                      f"max {plain.max():.2f}, over 1: {int((plain > 1).sum())}; the floor that takes: "
                      f"{max(0.0, max(needed[what])):.2f} ulps; error / tolerance: median {np.median(rule):.3f}, "
                      f"max {rule.max():.3f}")

        finally:
            example.function_in = styles["argument rounded"]

def bench_traces() -> None:
    from kvcache_conformance.run import selection
    from kvcache_conformance.traces import codec as trace
    from kvcache_conformance.traces import replay
    from tests.mutants import build, recorded_mutant

    directory = Path(tempfile.mkdtemp())
    print("regression traces: replay against the recording mutant, then the reference (median of 3 each)")
    print(f"{'trace':58} {'steps':>5} {'diverges at':>11} {'mutant s':>9} {'reference s':>11}")
    rows = []
    for path in sorted((ROOT / "properties" / "regressions").glob("*.json")):
        document = trace.load(path)
        recorded = recorded_mutant(document)
        mutant = selection.load_adapter(build(recorded, directory))
        reference = selection.load_adapter(f"impl.conformance:{recorded.factory}")  # the adapter it mutates
        verdicts: dict[str, list[replay.Verdict]] = {"mutant": [], "reference": []}
        for _ in range(3):
            verdicts["mutant"].append(replay.replay(document, mutant, out=lambda line: None))
            verdicts["reference"].append(replay.replay(document, reference, out=lambda line: None))
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




def _bench_layer(longest: int, seed: int = 0) -> tuple[AttentionLayer, np.ndarray]:
    heads, head_width, model_width = 8, 64, 512
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(model_width)
    layer = AttentionLayer.from_arrays(*(rng.uniform(-scale, scale, (model_width, model_width)) for _ in range(4)),
                                       heads=heads, kv_heads=heads,
                                       rope=RopeConfig("half_split", 10000.0, head_width, longest + 64))
    return layer, rng.uniform(-1, 1, (8, longest + 64, model_width))


def bench_operations() -> None:
    """spec §13's operations on the reference, B 1 (reorder: B 8), H 8, dh 64, D 512, at length 2048."""
    length, drafted = 2048, 4
    layer, x = _bench_layer(length)
    print(f"cache operations, reference, H 8, dh 64, D 512, length {length} (medians; numpy's BLAS threads as "
          f"set by OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')})")
    cache = LayerKvCache(layer, 1, length + 64)
    layer.forward_chunk(x[:1, :length], cache)

    def rollback() -> None:  # speculative decoding: reject the 4 drafted rows, append 4 others
        cache.truncate(length - drafted)
        layer.forward_chunk(x[:1, length - drafted:length], cache)

    rollback_s = median_seconds(rollback, 30)
    recompute_s = median_seconds(lambda: layer.forward_full(x[:1, :length]), 3)
    print(f"  truncate {drafted} + re-append {drafted} as a chunk: {rollback_s * 1e3:8.2f} ms; recompute the "
          f"prefix: {recompute_s * 1e3:8.1f} ms; ratio {recompute_s / rollback_s:6.0f}x")
    beams = LayerKvCache(layer, 8, length)
    layer.forward_chunk(x[:, :length], beams)
    order = np.array([3, 3, 0, 1, 7, 2, 2, 5])
    reorder_s = median_seconds(lambda: beams.reorder(order), 30)
    keys, values = beams.key_storage, beams.value_storage
    key_copy, value_copy = np.empty_like(keys), np.empty_like(values)

    def copy() -> None:
        np.copyto(key_copy, keys)
        np.copyto(value_copy, values)

    copy_s = median_seconds(copy, 30)
    fork_s = median_seconds(beams.fork, 30)
    print(f"  reorder B 8 (gather in place): {reorder_s * 1e3:8.2f} ms; one copy of both buffers: "
          f"{copy_s * 1e3:8.2f} ms; reorder / copy {reorder_s / copy_s:5.2f}; fork: {fork_s * 1e3:8.2f} ms")
    window = 1024
    ringed = LayerKvCache(layer, 1, length + 64, window=window)
    plain = LayerKvCache(layer, 1, length + 64)
    layer.forward_chunk(x[:1, :length], ringed)  # wrapped: steady state, every step evicts one row
    layer.forward_chunk(x[:1, :window], plain)
    times = []
    for t in range(length, length + 60):  # consecutive steps: a truncation would leave the ring short of a row
        start = time.perf_counter()
        layer.forward_incremental(x[:1, t:t + 1], ringed)
        times.append(time.perf_counter() - start)
    window_s = statistics.median(times)

    def plain_step() -> None:
        layer.forward_incremental(x[:1, length:length + 1], plain)
        plain.truncate(window)

    plain_s = median_seconds(plain_step, 60)
    print(f"  window {window} step at steady state (ring wrapped): {window_s * 1e3:7.3f} ms; a plain step over "
          f"{window} rows: {plain_s * 1e3:7.3f} ms; window / plain {window_s / plain_s:5.2f}")


def bench_storage() -> None:
    """The storage rule's budget (spec §13.6), measured on the reference's quantized adapters: each step's
    output and cached rows against k x the naive stored computation's error + a floor of format units."""
    from impl.conformance import make_float16_adapter, make_fp8_adapter, make_int8_adapter, make_uint4_group_adapter
    from kvcache_conformance.judge.tolerance import ABSOLUTE, FACTOR, STORAGE_FLOOR_UNITS, Judge
    from kvcache_conformance.oracle import FLOAT64, AttentionWeights, RopeConfig, full_prefix_attention

    floors = (0.0, 0.5, STORAGE_FLOOR_UNITS)
    for make in (make_fp8_adapter, make_int8_adapter, make_float16_adapter, make_uint4_group_adapter):
        adapter, rng = make(), np.random.default_rng(0)
        storage = Judge.for_adapter(adapter, FLOAT64).storage
        assert storage is not None
        ratios: dict[str, dict[float, list[float]]] = {"output": {f: [] for f in floors},
                                                       "rows": {f: [] for f in floors}}
        if storage.group:  # affine groups: also a cache that attends its newest RESIDUAL rows exact (HQQ, KIVI)
            ratios["output, newest 2 rows exact"] = {f: [] for f in floors}
        quantized = tensors = 0
        for _ in range(400):
            heads, dh, width, length = (int(v) for v in (rng.integers(1, 5), 2 * rng.integers(1, 5),
                                                         rng.integers(1, 9), rng.integers(1, 9)))
            dh = storage.group * int(rng.integers(1, 3)) if storage.group else dh
            shapes = [(width, heads * dh)] * 3 + [(heads * dh, width)]
            weights = AttentionWeights(*(rng.uniform(-1, 1, shape) for shape in shapes), heads=heads, kv_heads=heads)
            rope = RopeConfig("half_split", float(rng.choice([10.0, 1e4])), dh, 64)
            x = rng.uniform(-1, 1, (int(rng.integers(1, 4)), length, width))
            first = full_prefix_attention(x[:, :1], weights, rope)
            calibration = (first.keys, first.values) if storage.update == "frozen" else (None, None)
            if storage.update == "frozen":  # as the machine draws them: within the frozen scale's range
                limits = [storage.scale_of(c) * storage.largest for c in calibration]  # type: ignore[arg-type]
                for t in range(1, length):
                    rows = full_prefix_attention(x[:, :t + 1], weights, rope)
                    over = max(float(np.max(np.abs(getattr(rows, n)[:, :, t:]) / limit))
                               for n, limit in zip(("keys", "values"), limits))
                    if over > 0.99:
                        x[:, t] *= 0.99 / over
            layer = adapter.create_layer(weights, rope)
            cache = adapter.create_cache(layer, x.shape[0], 64)
            outputs = [adapter.step(layer, cache, x[:, t:t + 1].copy())[:, 0] for t in range(length)]
            stored = adapter.snapshot(cache)

            def held(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                return storage.stored(keys, calibration[0]), storage.stored(values, calibration[1])

            def residual(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
                stored_keys, stored_values = held(keys, values)
                stored_keys[:, :, -2:], stored_values[:, :, -2:] = keys[:, :, -2:], values[:, :, -2:]
                return stored_keys, stored_values

            truth = full_prefix_attention(x, weights, rope)
            naive = full_prefix_attention(x, weights, rope, storage=held)
            styles = [("output", np.stack(outputs, axis=1))]
            if storage.group:
                styles.append(("output, newest 2 rows exact",
                               full_prefix_attention(x, weights, rope, storage=residual).outputs))
            for what, got_outputs in styles:
                for t in range(length):
                    error = float(np.abs(got_outputs[:, t] - truth.outputs[:, t]).max())
                    budget = FACTOR * float(np.abs(naive.outputs[:, t] - truth.outputs[:, t]).max()) + ABSOLUTE
                    unit = storage.unit * max(1.0, float(np.abs(truth.outputs[:, t]).max()))
                    for floor in floors:
                        ratios[what][floor].append(error / (budget + floor * unit))
            for name in ("keys", "values"):
                exact, got, naive_rows = getattr(truth, name), getattr(stored, name), getattr(naive, name)
                steps = storage.steps(exact, calibration[name == "values"])
                tensors, quantized = tensors + 1, quantized + int(np.any(naive_rows != exact))
                error, budget = np.abs(got - exact), FACTOR * np.abs(naive_rows - exact) + ABSOLUTE
                for floor in floors:
                    ratios["rows"][floor].append(float((error / (budget + floor * steps)).max()))
        print(f"{adapter.name}: {len(ratios['output'][0.0])} steps on 400 random layers ({quantized} of {tensors} "
              f"cached tensors differ from the exact rows); one unit: {storage.unit:.3g}"
              + (" of the scale's amax" if storage.format.startswith("int") else " of the group's range"
                 if storage.group else " relative (an ulp at 1)"))
        for what, by_floor in ratios.items():
            cells = []
            for floor, values in by_floor.items():
                array = np.array(values)
                cells.append(f"+ {floor:g} units: max {array.max():.3f}, over 1 in {int((array > 1).sum())}")
            print(f"  {what:6} error / ({FACTOR:g} x naive " + "; ".join(cells) + ")")


def bench_causes(runs: int = 3) -> None:
    """A mutant shaped like a library's cache with three bugs -- two failing one claimed check in two ways (the
    length moved, the key rows overwritten by a call that raised) and a window chunk mask behind them -- under the
    plain command (profile dev, random seeds, a fresh example database each run): the causes each run finds."""
    from tests.mutants import MUTANTS, build
    from tests.test_causes import BEHIND, PAIR

    chosen = {m.name: m for m in MUTANTS}
    directory = Path(tempfile.mkdtemp())
    spec = build(chosen[PAIR[0]], directory / "mutants", chosen[PAIR[1]], chosen[BEHIND])
    environment = {k: v for k, v in os.environ.items() if k not in ("HYPOTHESIS_PROFILE", "KVCACHE_IMPL")}
    environment["PYTHONPATH"] = f"{directory / 'mutants'}{os.pathsep}{ROOT}"
    print(f"{' + '.join((*PAIR, BEHIND))}: pytest -n 0 -k 'test_cache_operations_conform and window', profile dev "
          f"({runs} runs)")
    for run in range(runs):
        report = directory / f"report-{run}.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", f"--kv-impl={spec}",
                        f"--kv-report={report}", f"--kv-traces={directory / f'traces-{run}'}",
                        f"--kv-examples={directory / f'examples-{run}'}", "-k",
                        "test_cache_operations_conform and window", "properties/test_cache_operations.py"],
                       cwd=ROOT, env=environment, capture_output=True, text=True)
        wall = time.perf_counter() - start
        entry = next(e for e in json.loads(report.read_text())["properties"] if e["property"].endswith("[window]"))
        found, search = entry.get("causes", []), entry.get("cause_search", {})
        print(f"  run {run + 1}: {len(found)} causes in {wall:.0f} s wall; search: {search.get('stopped')}")
        for cause in found:
            steps = len(json.loads(Path(cause["trace"]).read_text())["steps"]) - 1 if cause.get("trace") else "-"
            print(f"    {cause['label'][:70]:70} rule {cause['rule']}; trace of {steps} steps")


def bench_margins(seeds: int = 20) -> None:
    """Each member of the float32 family (``tests/float32_family.py``) under ``seeds`` searches of its machine, each
    with a fresh random seed (the dev profile, no example database): how close the precision rule comes to failing
    a correct float32 implementation (issue 36). A failing search stops at its first failure (shrunk for 2 s)."""
    from kvcache_conformance.run import profiles
    from tests.float32_family import MEMBERS, run_member

    directory = Path(tempfile.mkdtemp())
    settings = profiles.settings_for("dev", database=None)
    print(f"the float32 family, {seeds} random seeds per member (profile dev: {settings.max_examples} examples of up "
          f"to {settings.stateful_step_count} steps a search); margin = worst error / tolerance over every search; "
          f"median: of the seeds' margins")
    for kind, members in MEMBERS.items():
        rule = ""
        print(f"{'rule':6} {'member':22} {'runs':>6} {'failed':>6} {'margin':>7} {'median':>7} {'error':>9} "
              f"{'tolerance':>9} {'CPU s':>7}  first failure")
        for name in members:
            row, rule = _margin_row(seeds, lambda seed, kind=kind, name=name: run_member(
                kind, name, settings, trace_dir=directory / f"{kind}-{name}-{seed}", shrink_seconds=2.0))
            print(f"{kind:6} {name:22} {row}")
        print(f"  ({kind} rule: {rule})")
    print(f"(failing runs' traces under {directory})")
    bench_storage_margins(seeds)


def _margin_row(seeds: int, run_one: Any) -> tuple[str, str]:
    """``run_one(seed)`` for each seed: the row of a margins table (runs, failing seeds, worst and median error /
    tolerance, worst error and its tolerance, CPU seconds, the first failure) and the rule judged."""
    runs = failed = 0
    worst, first, cpu, margins, rule = (0.0, 1.0), "", time.process_time(), [], ""
    for seed in range(seeds):
        result = run_one(seed)
        runs, rule = runs + result.runs, result.rule or rule
        worst = max(worst, result.worst, key=lambda pair: pair[0] / pair[1])
        margins.append(result.worst[0] / result.worst[1])
        if result.failure is not None:
            failed += 1
            first = first or str(result.failure).splitlines()[0][:100]
    return (f"{runs:6} {failed:6} {worst[0] / worst[1]:7.3f} {statistics.median(margins):7.3f} {worst[0]:9.2e} "
            f"{worst[1]:9.2e} {time.process_time() - cpu:7.1f}  {first}"), rule


# the honest storage declarations of tests/lattice.py: a whole model's kv_storage (docs/spec.md §15.6's estimate)
STORAGE_MODEL_VARIANTS = ("model-float32-kv-float16", "model-float32-kv-q8_0", "model-float32-kv-q4_0",
                          "model-float32-kv-q8_0-row", "model-float32-kv-q4_0-row", "model-float32-kv-uint4-groups",
                          "model-float32-kv-uint4-extreme")
# and a layer's storage (§13.6's naive baseline), the reference's quantized caches and the lattice's
STORAGE_LAYER_VARIANTS = ("make_fp8_adapter", "make_int8_adapter", "make_float16_adapter", "make_uint4_group_adapter",
                          "storage-uint4-groups-of-32", "storage-uint4-zero-point-level",
                          "storage-uint4-zero-point-extreme")


def bench_storage_margins(seeds: int = 20, names: tuple[str, ...] | None = None) -> None:
    """The storage rules' margins: each honest storage declaration under ``seeds`` searches (dev profile, random
    seeds, no example database) of the model machine (a whole model's ``kv_storage``) or the layer cache machine
    (a layer's ``storage``): runs, failing seeds, worst and median error / tolerance, CPU seconds."""
    import impl.conformance
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine
    from tests.lattice import variant

    chosen = names or (*STORAGE_MODEL_VARIANTS, *STORAGE_LAYER_VARIANTS)
    directory = Path(tempfile.mkdtemp())
    print(f"storage rules, {seeds} random seeds per declaration (profile dev, no example database)")
    print(f"{'machine':12} {'declaration':32} {'runs':>6} {'failed':>6} {'margin':>7} {'median':>7} {'error':>9} "
          f"{'tolerance':>9} {'CPU s':>7}  first failure")
    settings = profiles.settings_for("dev", database=None, derandomize=False, deadline=None)
    for name in chosen:
        machine = "model" if name.startswith("model-") else "layer_cache"

        def run_one(seed: int, machine: str = machine, name: str = name) -> Any:
            adapter = getattr(impl.conformance, name)() if name.startswith("make_") else variant(name)
            return run_machine(machine, adapter, property_id=f"bench::storage::{name}::{seed}", settings=settings,
                               trace_dir=directory / f"{name}-{seed}", shrink_seconds=2.0)
        row, rule = _margin_row(seeds, run_one)
        print(f"{machine:12} {name:32} {row}", flush=True)
        print(f"  ({rule})")
    print(f"(failing runs' traces under {directory})")


def bench_chains(seeds: int = 20) -> None:
    """The model machine as users run it (profile dev, random seeds) with the reference's full declaration: each
    chain case's count per run (tests/test_model_chains.py states them for a derandomised run), and the share of
    the steps taken by the rule that ran most."""
    from impl.conformance import make_full_declaration_adapter
    from kvcache_conformance.run import profiles
    from kvcache_conformance.run.runner import run_machine
    from tests.test_model_chains import CHAINS

    counts: dict[str, list[int]] = {case: [] for case in CHAINS}
    most: list[float] = []
    start = time.process_time()
    for seed in range(seeds):
        settings = profiles.settings_for("dev", database=None, derandomize=False, deadline=None)
        result = run_machine("model", make_full_declaration_adapter(), property_id=f"bench::chains::{seed}",
                             settings=settings)
        for case, rule in CHAINS.items():
            counts[case].append(result.exercise.counts.get((rule, case), 0))
        steps = [times for (_, what), times in result.exercise.counts.items() if what == "ran"]
        most.append(max(steps) / sum(steps))
    print(f"model machine, {seeds} random dev runs (100 examples each), {time.process_time() - start:.0f} CPU s: "
          f"the rule that ran most took at most {max(most):.2f} of a run's steps")
    print(f"  {'case':68} {'min':>4} {'median':>6} {'runs under 3':>12}")
    for case, found in counts.items():
        print(f"  {case:68} {min(found):4} {int(np.median(found)):6} {sum(1 for n in found if n < 3):12}")


def bench_shipped() -> None:
    """bench/shipped/runner.py on every runnable entry of the catalogue, with its defaults."""
    from bench.shipped import runner

    runner.main([])


BENCHES = {"step": bench_step, "prefill": bench_prefill, "store": bench_store, "suite": bench_suite,
           "mutants": bench_mutants, "first-failure": bench_first_failure, "tolerance": bench_tolerance,
           "mixed": bench_mixed, "traces": bench_traces, "operations": bench_operations, "storage": bench_storage,
           "causes": bench_causes, "margins": bench_margins,
           "storage-margins": bench_storage_margins, "chains": bench_chains, "shipped": bench_shipped,
           "power": bench_power}
ON_REQUEST = ("shipped", "power")  # hours, not minutes: only with --only


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(name for name in BENCHES if name not in ON_REQUEST),
                        help=f"comma-separated: {', '.join(BENCHES)} (by default all but {', '.join(ON_REQUEST)})")
    parser.add_argument("--seeds", type=int, default=20, help="margins, chains, power: random seeds (default 20)")
    parser.add_argument("--mutants", default=None, help="power: comma-separated mutant names (default: all)")
    arguments = parser.parse_args()
    for name in arguments.only.split(","):
        name = name.strip()
        if name == "power":
            bench_power(arguments.seeds, arguments.mutants.split(",") if arguments.mutants else None)
        else:
            BENCHES[name](**({"seeds": arguments.seeds} if name in ("margins", "chains", "storage-margins") else {}))
        print()


if __name__ == "__main__":
    main()
