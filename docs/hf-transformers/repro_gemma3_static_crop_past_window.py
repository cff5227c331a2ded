"""transformers 5.24.0: ``StaticCache.crop`` past a sliding layer's ring is accepted and leaves it corrupt.

A Gemma 3 (a sliding layer of window 3, then a full one) over ``StaticCache(config, max_cache_len=8)``: the
sliding layer is a ``StaticSlidingWindowLayer`` ring of 3 slots. After 5 tokens the ring has overwritten
positions 0 and 1; ``crop(-1)`` is accepted anyway (``is_croppable`` is False for it, but ``Cache.crop`` does
not check it; ``StaticSlidingWindowLayer.crop`` says "only correct as long as we never went beyond the window").
Two wrong results follow, each against the same model run from scratch on the 4 kept tokens plus a new one:

1. the next token's logits are wrong (the ring's slots are read as other positions), and
2. after one more crop to 2 tokens, a token that fits is refused with IndexError: once the ring is full its ``update``
   advances only ``cumulative_length_int``, not the tensor ``cumulative_length`` that ``crop`` lowers and the
   in-window write indexes by, so the write index goes negative.

Exits 1 while either is present.
"""

import sys

import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, StaticCache

config = Gemma3TextConfig(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=4, sliding_window=3,
                          layer_types=["sliding_attention", "full_attention"], pad_token_id=None,
                          bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
torch.manual_seed(0)
model = Gemma3ForCausalLM(config).to(torch.float64).eval()
tokens = [1, 2, 3, 4, 5]


def forward(ids, first, cache):
    positions = torch.arange(first, first + len(ids))[None]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), position_ids=positions, cache=cache, use_cache=True).logits[0]


bugs = []
cache = StaticCache(config=config, max_cache_len=8)
forward(tokens, 0, cache)  # 5 tokens: the ring of 3 holds positions 2..4
cache.crop(-1)  # back to 4 tokens: position 3 is needed, 0..3 claimed
print(f"crop(-1) past the ring accepted; lengths {[layer.get_seq_length() for layer in cache.layers]}")
got = forward([9], 4, cache)[-1]
want = forward([*tokens[:4], 9], 0, StaticCache(config=config, max_cache_len=8))[-1]
error = (got - want).abs().max().item()
print(f"next token after the crop: logits off by {error:.3g} from a fresh run")
if error > 1e-9:
    bugs.append("logits wrong after a crop past the ring")

cache.crop(-3)  # 5 tokens -> 2, inside the window again
try:
    forward([9], 2, cache)
    print("a token after a second crop: accepted")
except IndexError as error:
    print(f"a token after a second crop (2 of 8 rows held): IndexError: {error}")
    bugs.append("a token that fits refused with IndexError")
if bugs:
    print("BUG: " + "; ".join(bugs))
    sys.exit(1)
print("ok: the crop was refused or done right")
