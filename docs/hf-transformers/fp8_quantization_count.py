"""Do drawn programs really quantize in ``QuantizedCache('fp8')``? Count the steps whose stored rows differ.

    python docs/hf-transformers/fp8_quantization_count.py [--programs 200]

Random programs shaped like the suite's (1-4 heads, GQA, head widths 2-8, batch 1-3, chunks of 1-4 rows in
the documented input range), fed to ``adapters.hf_caches``' fp8 adapter and, in lockstep, to its float64
``DynamicCache`` adapter. After every step it compares the rows the fp8 layer stores (dequantized) with the
rows ``DynamicCache`` stores, and counts the steps where they differ, and by how much relative to the
per-tensor scale of the first update (one float8_e4m3fn step at 1 is 0.125).
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np

from adapters.hf_caches import dynamic_cache_operations, quantized_cache_fp8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=200)
    options = parser.parse_args()
    random = np.random.default_rng(0)
    fp8, exact = quantized_cache_fp8(), dynamic_cache_operations()
    steps = differing = saturated = 0
    worst = 0.0
    for _ in range(options.programs):
        kv_heads = int(random.integers(1, 3))
        heads, head_width, batch = kv_heads * int(random.integers(1, 3)), int(random.choice([2, 4, 6, 8])), \
            int(random.integers(1, 4))
        width = int(random.integers(1, 9))
        weights = SimpleNamespace(wq=random.normal(0, 0.5, (width, heads * head_width)),
                                  wk=random.normal(0, 0.5, (width, kv_heads * head_width)),
                                  wv=random.normal(0, 0.5, (width, kv_heads * head_width)),
                                  wo=random.normal(0, 0.5, (heads * head_width, width)), heads=heads, kv_heads=kv_heads)
        rope = SimpleNamespace(base=10000.0, max_positions=64)
        layers = fp8.create_layer(weights, rope), exact.create_layer(weights, rope)
        caches = fp8.create_cache(layers[0], batch, 64), exact.create_cache(layers[1], batch, 64)
        first_amax = None
        for _ in range(int(random.integers(1, 8))):
            x = random.uniform(-1.0, 1.0, (batch, int(random.integers(1, 5)), width))
            fp8.append(layers[0], caches[0], x)
            exact.append(layers[1], caches[1], x)
            stored, truth = fp8.snapshot(caches[0]), exact.snapshot(caches[1])
            if first_amax is None:
                first_amax = max(np.abs(truth.keys).max(), np.abs(truth.values).max(), 1e-300)
            error = max(np.abs(stored.keys - truth.keys).max(), np.abs(stored.values - truth.values).max())
            steps += 1
            differing += bool(error > 0)
            saturated += bool(max(np.abs(truth.keys).max(), np.abs(truth.values).max()) > first_amax)
            worst = max(worst, error / first_amax)
    print(f"{options.programs} programs, {steps} steps: stored rows differ from the unquantized ones after "
          f"{differing} steps ({100 * differing / steps:.1f} %); worst |stored - exact| / first update's amax "
          f"{worst:.3g}; steps with a row beyond the first update's amax (the frozen scale saturates): {saturated}")


if __name__ == "__main__":
    main()
