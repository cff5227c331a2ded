"""HQQ's 4-bit ``axis=1`` packing: a tensor with an odd number of groups cannot be read back (finding 12).

    python docs/hf-transformers/repro_hqq_axis1_odd_groups.py      # torch, transformers 5.24.0, hqq 0.2.8.post1

``QuantizedCache("hqq", axis_key=1, axis_value=1)`` groups ``q_group_size`` consecutive features of each token.
HQQ then packs two 4-bit groups a byte along the groups, so one token of one group packs into nothing:
``dequantize`` raises. 8-bit works at every count.
"""

import torch
from hqq.core.quantize import Quantizer

for nbits in (4, 8):
    for groups in (1, 2, 3, 4):
        x = torch.randn(1, 1, groups, 4, dtype=torch.float64)  # `groups` tokens of one group of 4 each
        q, meta = Quantizer.quantize(x, nbits=nbits, group_size=4, axis=1, compute_dtype=torch.float64, device="cpu")
        try:
            error = float((Quantizer.dequantize(q, meta) - x).abs().max())
            print(f"{nbits}-bit, {groups} group(s): read back, max |error| {error:.3g}")
        except RuntimeError as failure:
            print(f"{nbits}-bit, {groups} group(s): dequantize raises {failure}")
