"""transformers 5.24.0: ``Cache.crop`` on a model whose first layer is full and a later one sliding is not atomic.

``DynamicCache.crop(-1)`` crops its layers in order. Once a ``DynamicSlidingWindowLayer`` has held
``sliding_window`` tokens its ``crop`` raises RuntimeError ("does not track past states"), but the full
layers before it have already been cropped: after the exception the cache's layers disagree on the length
(here 3 and 2), and the next forward computes with a full layer missing a token. Layer patterns with full
layers first are released configurations (Qwen2/Qwen3 with ``use_sliding_window``: the layers below
``max_window_layers`` are full). Gemma 3's own pattern puts a sliding layer first, so its crop raises before
anything changed. Exits 1 while the bug is present.
"""

import sys

import torch
from transformers import DynamicCache, Gemma3ForCausalLM, Gemma3TextConfig

config = Gemma3TextConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=4, sliding_window=2,
                          layer_types=["full_attention", "sliding_attention"], pad_token_id=None,
                          bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
torch.manual_seed(0)
model = Gemma3ForCausalLM(config).eval()
cache = DynamicCache(config=config)
with torch.no_grad():
    model(input_ids=torch.tensor([[1, 2, 3]]), cache=cache, use_cache=True)  # 3 tokens: past the window of 2
before = [layer.get_seq_length() for layer in cache.layers]
try:
    cache.crop(-1)
    print("crop(-1) succeeded")
except RuntimeError as error:
    print(f"crop(-1) raised RuntimeError: {str(error)[:90]}...")
after = [layer.get_seq_length() for layer in cache.layers]
print(f"layer lengths before {before}, after {after}")
if after != before and len(set(after)) > 1:
    print("BUG: the call raised, yet the full layer lost a token: the layers now disagree on the length")
    sys.exit(1)
print("ok: the cache is as before, or cropped as a whole")
