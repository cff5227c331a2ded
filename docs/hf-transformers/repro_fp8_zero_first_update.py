"""QuantizedCache('fp8'): a first update of zeros freezes a scale of float32 ``tiny``; every later row reads back ~0.

    python docs/hf-transformers/repro_fp8_zero_first_update.py      # torch + transformers 5.24.0 only

``Fp8QuantizedLayer`` calibrates its per-tensor scale on the first update and freezes it (documented). For an
all-zero first update, ``clamp(min=torch.finfo(torch.float32).tiny)`` avoids a zero scale -- but then any later
value v is stored as ``(v / 1.18e-38).to(float8_e4m3fn)``, which saturates at 448, and reads back as
448 * 1.18e-38 = 5.3e-36: keys and values of every later token are zero, silently, and attention is uniform.
"""

import torch
from transformers import LlamaConfig, QuantizedCache

config = LlamaConfig(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, head_dim=4, num_hidden_layers=1,
                     intermediate_size=4, vocab_size=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)
cache = QuantizedCache("fp8", config)
cache.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)  # e.g. a zero embedding row, or zero values
later = torch.full((1, 2, 1, 4), 0.75)
keys, values = cache.update(later, later, 0)
print("scale frozen at", cache.layers[0]._quantized_keys[1].item())
print("stored later key row reads back as", keys[0, 0, 1].tolist(), "instead of", later[0, 0, 0].tolist())
