"""How far HQQ's optimiser moves stored elements off the closed-form affine grid (finding 10).

    python docs/hf-transformers/hqq_fitted_zero_points.py      # torch, hqq 0.2.8.post1

transformers quantizes with HQQ's defaults (``optimize=True``): a half-quadratic solver moves each group's zero
point. This measures each stored element's error in units of the closed-form step ``max(range / 15, 1e-4)``
(docs/spec.md §13.6, ``min_step`` 1e-4), after one quantization and after ``k`` re-quantizations of the
dequantized rows (as each flush of ``HQQQuantizedLayer`` does). The closed form's worst is 0.5; the rule
allows 1 plus twice the closed form's own error.
"""

import numpy as np
import torch
from hqq.core.quantize import Quantizer

rng = np.random.default_rng(0)
for rounds in (1, 2, 5, 10):
    worst = 0.0
    for _ in range(2000 if rounds == 1 else 500):
        x = torch.tensor(rng.normal(size=(1, 2, 4, 8)) * 10 ** rng.uniform(-6, 3), dtype=torch.float64)
        stored = x
        for _ in range(rounds):
            q, meta = Quantizer.quantize(stored, nbits=4, group_size=4, axis=1, compute_dtype=torch.float64,
                                         device="cpu")
            stored = Quantizer.dequantize(q, meta).reshape(x.shape).double()
        groups = x.reshape(-1, 4)
        step = torch.clamp((groups.max(1, keepdim=True).values - groups.min(1, keepdim=True).values) / 15, min=1e-4)
        worst = max(worst, float(((stored.reshape(-1, 4) - groups).abs() / step).max()))
    print(f"{rounds} quantization(s): worst element error {worst:.2f} of a closed-form step")
