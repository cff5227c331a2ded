"""How the error of transformers' stock float64 Gemma3ForCausalLM (float32 RMSNorms, six a layer, and RoPE table)
compares with the tolerance of its declaration ``mixed_precision = {"rope": "float32", "norm": "float32"}``, and
with the tolerance the same rule would give a ``norm`` in Gemma's order.

    PYTHONPATH=. python docs/hf-transformers/measure_gemma3_stock_norm.py     # torch + transformers 5.24.0

``norm`` (docs/spec.md §8.4) is LlamaRMSNorm's order: x rounded to float32, normalised there, back to float64,
then times the weight in float64. Gemma3RMSNorm instead multiplies in float32 by ``1 + w`` formed in float32
(``output * (1.0 + self.weight.float())``, then ``type_as``): the weight rounded twice and the product rounded
once more before the cast back. Gemma's order is modelled here by replacing the oracle's ``rms_norm`` in this
process only (a measurement, not a rule). For random Gemma-3 models of sliding and full layers, 8 tokens in one
batch: the stock error from the float64 oracle, and for each order the baseline's own error and the share of
the tolerance ``2 x baseline + 8 float32 ulps x max(1, max|truth|) + 1e-12`` the stock error takes (> 1 fails).
"""

import numpy as np

import kvcache_conformance.oracle.model as oracle_model
from adapters import hf_gemma3
from kvcache_conformance.oracle import mixed_precision
from kvcache_conformance.oracle.model import full_model
from kvcache_conformance.oracle.model_config import ContextConfig, ModelBatch, ModelConfig, random_model_weights

EPS = float(np.finfo(np.float32).eps)
llama_order = oracle_model.rms_norm


def gemma_order(x, weight, eps, numbers):
    """Gemma3RMSNorm in a float64 model: normalised in float32, times float32(1 + float32(w - 1)) in float32."""
    inner = numbers.component("norm")
    if inner is numbers:
        return llama_order(x, weight, eps, numbers)
    low = [inner.number(numbers.to_float(v)) for v in x]
    inverse = inner.number(1.0) / inner.sqrt(sum(v * v for v in low) / inner.number(len(low)) + inner.number(eps))
    scale = [inner.number(1.0) + inner.number(float(w) - 1.0) for w in weight]
    return [numbers.number(inner.to_float(v * inverse * s)) for v, s in zip(low, scale)]


def baseline(tokens, config, weights, order):
    oracle_model.rms_norm = order
    try:
        return np.array(full_model(tokens, config, weights, numbers=mixed_precision({"rope": "float32",
                                                                                      "norm": "float32"})))
    finally:
        oracle_model.rms_norm = llama_order


shares = {"llama": [], "gemma": []}
for seed in range(12):
    pattern = (2, "all", (True, False, True))[seed % 3]
    config = ModelConfig(vocab=11, model_width=8, layers=3, heads=2, kv_heads=1, head_width=4, ffn_width=7,
                         rope_style="half_split", rope_base=10000.0, tied_output=bool(seed % 2), window=2 + seed % 2,
                         window_pattern=pattern, local_rope_base=100.0 if pattern != "all" else None,
                         embedding_scale=True, qk_norm=True, post_norms=True, activation="gelu_tanh")
    weights = random_model_weights(config, seed)
    tokens = [int(t) for t in np.random.default_rng(seed).integers(0, 11, 8)]
    adapter = hf_gemma3.dynamic_cache_stock()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=16, max_sequences=2, unified=False))
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, tokens, 0))
    truth = np.array(full_model(tokens, config, weights))
    error = np.abs(got - truth).max()
    floor = 8 * EPS * max(1.0, np.abs(truth).max())
    line = f"seed {seed:2} pattern {pattern!s:18} stock error {error:.2e} floor {floor:.2e}"
    for name, order in (("llama", llama_order), ("gemma", gemma_order)):
        base = np.abs(baseline(tokens, config, weights, order) - truth).max()
        shares[name].append(error / (2 * base + floor + 1e-12))
        line += f" | {name} order: baseline {base:.2e} share {shares[name][-1]:.2f}"
    print(line)
print(f"worst share: llama order (the declared rule) {max(shares['llama']):.2f}, "
      f"gemma order {max(shares['gemma']):.2f}")
