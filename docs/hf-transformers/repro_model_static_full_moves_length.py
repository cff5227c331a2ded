"""A forward of ``LlamaForCausalLM`` past a ``StaticCache``'s ``max_cache_len`` raises, and leaves the cache longer.

    python docs/hf-transformers/repro_model_static_full_moves_length.py     # torch + transformers 5.24.0 only

The model-level face of repro_rejected_update_moves_length.py: ``StaticLayer.update`` adds the new rows to
``cumulative_length`` before ``index_copy_`` raises ``IndexError``, so after the rejected forward layer 0
claims rows it never wrote (the deeper layers were never reached), ``get_seq_length()`` reports them, and
the next forward that fits -- one token into an empty cache of 3 slots -- is rejected too. The conformance
trace is docs/hf-transformers/traces/hf-llama-model-static-cache-no-roll-back-*.json (docs/spec.md
§15.5: a call that raised must change nothing). Exits 1 while the bug is there, 0 once it is fixed.
"""

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

config = LlamaConfig(hidden_size=4, num_attention_heads=1, num_key_value_heads=1, head_dim=4, num_hidden_layers=2,
                     intermediate_size=4, vocab_size=5, bos_token_id=None, eos_token_id=None, pad_token_id=None)
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
cache = StaticCache(config=config, max_cache_len=3)

with torch.no_grad():
    try:
        model(input_ids=torch.tensor([[1, 2, 3, 4]]), cache=cache, use_cache=True)  # 4 tokens, 3 slots
    except IndexError as error:
        print(f"4 tokens into 3 slots: IndexError ({error})")
    lengths = [int(layer.cumulative_length) for layer in cache.layers]
    print(f"after the rejected forward: get_seq_length() = {int(cache.get_seq_length())}, per layer {lengths}")
    try:
        model(input_ids=torch.tensor([[1]]), cache=cache, use_cache=True)  # 1 token: fits an empty cache
        fits = True
    except IndexError as error:
        print(f"then 1 token: IndexError ({error})")
        fits = False

bug = lengths != [0, 0] or not fits
print("BUG: the rejected forward moved the cache's length" if bug else "fixed: a rejected forward changes nothing")
sys.exit(1 if bug else 0)
