"""A cache ``update`` that raises still moves the length, in every layer type that counts it before writing.

    python docs/hf-transformers/repro_rejected_update_moves_length.py      # torch + transformers 5.24.0 only

``StaticLayer`` (finding 2 of README.md: past ``max_cache_len``), ``StaticSlidingWindowLayer``,
``DynamicSlidingWindowLayer``, ``Fp8QuantizedLayer`` and ``QuantizedLayer`` add the new rows to their length
counter first and write (``index_copy_`` / ``torch.cat``) second. When the write raises -- here, a row of
another batch size -- the cache is left claiming rows it does not hold: every later position (RoPE, mask)
is off. ``DynamicLayer`` derives its length from the tensor and is unaffected.
"""

import torch
from transformers import DynamicCache, LlamaConfig, QuantizedCache, StaticCache


def config(**window) -> LlamaConfig:
    return LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4, num_hidden_layers=1,
                       intermediate_size=4, vocab_size=2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                       **window)


window = {"sliding_window": 3, "layer_types": ["sliding_attention"]}
caches = {
    "DynamicLayer": DynamicCache(config=config()),
    "StaticLayer": StaticCache(config=config(), max_cache_len=8),
    "DynamicSlidingWindowLayer": DynamicCache(config=config(**window)),
    "StaticSlidingWindowLayer": StaticCache(config=config(**window), max_cache_len=8),
    "Fp8QuantizedLayer": QuantizedCache("fp8", config()),
}
for name, cache in caches.items():
    cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)  # batch 1
    try:
        cache.update(torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4), 0)  # batch 2: rejected
    except (RuntimeError, IndexError) as error:
        outcome = f"raised {type(error).__name__}"
    else:
        outcome = "accepted"
    length = int(cache.get_seq_length())
    print(f"{name:26} {outcome}; length now {length} ({'unchanged' if length == 1 else 'MOVED'})")
