"""transformers: batch_select_indices / batch_repeat_interleave do nothing on a layer cropped to 0 rows.

Both return early when get_seq_length() == 0, but a cropped layer keeps its (B, KV, 0, dh) tensors: the batch
stays B, and the next write of the new batch size raises in torch.cat. Run: python repro_select_after_crop_to_zero.py
"""

import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer


def shape(layer):
    return None if layer.keys is None else tuple(layer.keys.shape)


for layer in (DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=3)):
    rows = torch.ones(2, 1, 1, 2)  # batch 2, one kv head, one row, head width 2
    layer.update(rows, rows)
    layer.crop(-1)  # drop the one row: crop(n - length), as truncate(0) maps to it
    layer.batch_select_indices(torch.tensor([0]))  # keep batch row 0: the batch should be 1
    print(f"{type(layer).__name__}: cropped to 0 rows, row 0 selected: keys {shape(layer)} (batch 1 expected)")
    try:
        layer.update(torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))
        print("  a row of batch 1 is appended:", shape(layer))
    except RuntimeError as error:
        print(f"  a row of batch 1 raises: {error}")
