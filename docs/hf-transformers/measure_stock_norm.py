"""How the error of transformers' float64 LlamaForCausalLM (stock: float32 RoPE table and RMSNorm) compares with the
baseline of each mixed_precision declaration (finding 3 of model-level.md).

    PYTHONPATH=. python docs/hf-transformers/measure_stock_norm.py     # torch + transformers 5.24.0

For 6 random models of width 8, 12 tokens: the error from the float64 oracle, the floor (8 float32 ulps at the
logits' magnitude), and for ``{"rope"}`` and ``{"rope", "norm"}`` the baseline's own error and the share of the
tolerance ``2 x baseline + floor + 1e-12`` the error takes.
"""

import numpy as np

from adapters import hf_model
from kvcache_conformance.oracle import mixed_precision
from kvcache_conformance.oracle.model import full_model
from kvcache_conformance.oracle.model_config import ContextConfig, ModelBatch, ModelConfig, random_model_weights

eps = float(np.finfo(np.float32).eps)
rows = []
for seed in range(6):
    config = ModelConfig(vocab=11, model_width=8, layers=2, heads=2, kv_heads=1, head_width=4, ffn_width=7,
                         rope_style="half_split", rope_base=10000.0, tied_output=bool(seed % 2))
    weights = random_model_weights(config, seed)
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, 11, 12)]
    adapter = hf_model.dynamic_cache_stock()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=16, max_sequences=2, unified=False))
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, tokens, 0))
    truth = np.array(full_model(tokens, config, weights))
    err = np.abs(got - truth).max()
    floor = 8 * eps * max(1.0, np.abs(truth).max())
    out = [err, floor]
    for comp in ({"rope": "float32"}, {"rope": "float32", "norm": "float32"}):
        base = np.array(full_model(tokens, config, weights, numbers=mixed_precision(comp)))
        b = np.abs(base - truth).max()
        out += [b, err / (2 * b + floor + 1e-12)]
    rows.append(out)
    print("err {:.2e} floor {:.2e} | rope: base {:.2e} share {:.2f} | rope+norm: base {:.2e} share {:.2f}".format(*out))
rows = np.array(rows)
print(f"max share rope-only {rows[:, 3].max():.2f}, rope+norm {rows[:, 5].max():.2f}; "
      f"err/(2*base_rope) max {(rows[:, 0] / (2 * rows[:, 2])).max():.1f}")
