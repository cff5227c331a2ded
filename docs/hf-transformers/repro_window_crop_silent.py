"""Cropping a sliding-window layer past what it holds is silently wrong, in two of transformers' three ways.

    python docs/hf-transformers/repro_window_crop_silent.py      # torch + transformers 5.24.0 only

Rows 0..4 are fed to a window of 2 (the next query at position p sees p-1 and itself), then the cache
is rolled back. After a rollback to length n the cache must hold the row at n-1 -- or refuse.

1. DynamicSlidingWindowLayer without past recording refuses (RuntimeError): right, nothing changed.
2. DynamicSlidingWindowLayer after ``activate_past_recording()``: the first crop restores rows on purpose,
   but a second crop (no forward in between) slices past the rows it kept, loses row n-1, and says
   nothing; the next forward then fails in attention (mask and keys disagree).
3. StaticSlidingWindowLayer (``max_cache_len`` > window, so ``is_croppable`` is False -- but ``crop`` does not
   check it): the length goes down, the ring stays as it was, and its slots are now read as other positions.
"""

import torch
from transformers import DynamicCache, LlamaConfig, StaticCache

config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4, num_hidden_layers=1,
                     intermediate_size=4, vocab_size=2, sliding_window=2, layer_types=["sliding_attention"],
                     bos_token_id=None, eos_token_id=None, pad_token_id=None)


def row(position: int) -> torch.Tensor:
    """A key/value row whose every entry is its position, so the cache shows which rows it holds."""
    return torch.full((1, 2, 1, 4), float(position))


def fill(cache) -> None:
    for position in range(5):
        cache.update(row(position), row(position), 0)


plain = DynamicCache(config=config)
fill(plain)
try:
    plain.crop(-2)
except RuntimeError as error:
    print("1. dynamic, no recording: crop(-2) refused:", str(error)[:80], "...")

recording = DynamicCache(config=config)
recording.activate_past_recording()
fill(recording)
recording.crop(-1)
layer = recording.layers[0]
print(f"2. dynamic, recording: crop(-1) -> length {recording.get_seq_length()}, holds rows "
      f"{layer.keys[0, 0, :, 0].tolist()} (needs [3.0])")
recording.crop(-1)
print(f"   crop(-1) again  -> length {recording.get_seq_length()}, holds rows "
      f"{layer.keys[0, 0, :, 0].tolist()} (needs [2.0]): no error")

static = StaticCache(config=config, max_cache_len=8)
fill(static)
layer = static.layers[0]
print(f"3. static window: length {static.get_seq_length()}, ring slots {layer.keys[0, 0, :, 0].tolist()}, "
      f"is_croppable {static.is_croppable}")
static.crop(-3)
kv_length, kv_offset = static.get_mask_sizes(1, 0)
print(f"   crop(-3) -> length {static.get_seq_length()}, slots {layer.keys[0, 0, :, 0].tolist()} (needs [1.0]): no "
      "error")
keys, _ = static.update(row(2), row(2), 0)
print(f"   next forward: keys {keys[0, 0, :, 0].tolist()} read as positions {kv_offset}..{kv_offset + kv_length - 1} "
      "(should be [1.0, 2.0])")
