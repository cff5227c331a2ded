"""DynamicSlidingWindowLayer.crop raises AttributeError on a layer never written (or reset); DynamicLayer.crop returns.

    python docs/hf-transformers/repro_window_crop_unwritten.py      # torch + transformers 5.24.0 only

A speculative-decoding loop that rolls back (crop) a cache right after creating or resetting it crashes
as soon as the model has a sliding-window layer. DynamicLayer.crop documents the case ("Nothing to do
in these cases: 0 tokens to crop or the layer is not initialized") and returns; the window layer calls
it, then reads ``self.keys.shape``, and ``keys`` is None.
"""

import torch
from transformers import DynamicCache, LlamaConfig

config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4, num_hidden_layers=1,
                     intermediate_size=4, vocab_size=2, sliding_window=3, layer_types=["sliding_attention"],
                     bos_token_id=None, eos_token_id=None, pad_token_id=None)
full = DynamicCache(config=LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4,
                                       num_hidden_layers=1, intermediate_size=4, vocab_size=2, bos_token_id=None,
                                       eos_token_id=None, pad_token_id=None))
full.crop(0)
print("DynamicLayer.crop(0) on a fresh cache: ok, length", full.get_seq_length())

windowed = DynamicCache(config=config)
print(type(windowed.layers[0]).__name__, "fresh, length", windowed.get_seq_length())
for label, prepare in (("fresh", lambda c: None), ("after reset()", lambda c: (c.update(
        torch.randn(1, 2, 2, 4), torch.randn(1, 2, 2, 4), 0), c.reset()))):
    cache = DynamicCache(config=config)
    prepare(cache)
    try:
        cache.crop(0)
        print(f"crop(0) {label}: ok")
    except AttributeError as error:
        print(f"crop(0) {label}: AttributeError: {error}")  # 'NoneType' object has no attribute 'shape'
