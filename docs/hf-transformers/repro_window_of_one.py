"""DynamicSlidingWindowLayer with sliding_window=1 never evicts: ``keys[:, :, -W + 1:]`` is ``keys[:, :, 0:]``.

    python docs/hf-transformers/repro_window_of_one.py      # torch + transformers 5.24.0 only

A window of W keeps the last W-1 rows (the next query sees W-1 cached rows and itself). For W=1 that is
none, but ``-self.sliding_window + 1`` is ``-0 == 0`` and the slice keeps every row. The layer's own
``get_mask_sizes`` still announces W-1+T = T keys, so the second forward hands attention more keys
than its mask covers (sdpa: "The size of tensor a (3) must match the size of tensor b (2)"), after
``update`` has already grown the cache.
"""

import torch
from transformers import DynamicCache, LlamaConfig

config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4, num_hidden_layers=1,
                     intermediate_size=4, vocab_size=2, sliding_window=1, layer_types=["sliding_attention"],
                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
cache = DynamicCache(config=config)
for step in range(3):
    kv_length, kv_offset = cache.get_mask_sizes(1, 0)  # what a mask built before this forward covers
    keys, _ = cache.update(torch.randn(1, 2, 1, 4), torch.randn(1, 2, 1, 4), 0)
    print(f"step {step}: mask covers {kv_length} keys, update returned {keys.shape[-2]}, "
          f"the layer holds {cache.layers[0].keys.shape[-2]} rows (a window of 1 needs 0)")
assert cache.layers[0].keys.shape[-2] == 0, "sliding_window=1 keeps every row"
