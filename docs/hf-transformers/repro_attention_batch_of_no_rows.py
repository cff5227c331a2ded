"""``LlamaAttention`` cannot run a batch of no rows: ``view(*input_shape, -1, head_dim)`` is ambiguous at 0 elements.

    python docs/hf-transformers/repro_attention_batch_of_no_rows.py      # torch + transformers 5.24.0 only

A server keeps one cache for its running batch and drops finished requests with ``batch_select_indices``; when
every request has finished, the batch has no rows (docs/spec.md §13.8: a filter to no rows must succeed, and the
next chunk, of shape [0, T, D], must be taken). The cache takes the filter, but the next forward raises
``RuntimeError: cannot reshape tensor of 0 elements into shape [0, 1, -1, 2]`` in the query projection's ``view``,
before the cache is touched. The same ``hidden_shape = (*input_shape, -1, self.head_dim)`` is in most
``modeling_*.py``; ``(*input_shape, num_heads, head_dim)`` would take a batch of 0. Exits 1 while it raises.
"""

import sys

import torch
from transformers import DynamicCache, LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

config = LlamaConfig(hidden_size=4, num_attention_heads=2, num_key_value_heads=1, head_dim=2, num_hidden_layers=1,
                     intermediate_size=4, vocab_size=2, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                     attn_implementation="sdpa")
attention, rotary = LlamaAttention(config, layer_idx=0).eval(), LlamaRotaryEmbedding(config)
cache = DynamicCache(config=config)


def forward(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One step as LlamaModel.forward makes it for generate: positions from the 2-D mask, transformers' 4-D mask."""
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -hidden.shape[1]:]
    causal = create_causal_mask(config=config, inputs_embeds=hidden, attention_mask=mask, cache=cache,
                                position_ids=positions)
    with torch.no_grad():
        return attention(hidden, rotary(hidden, positions), causal, cache=cache)[0]


mask = torch.tensor([[0, 1], [1, 1]])  # two prompts, the first left-padded
forward(torch.randn(2, 2, 4), mask)
cache.batch_select_indices(torch.tensor([], dtype=torch.long))  # every request finished
mask = mask[torch.tensor([], dtype=torch.long)]
print(f"after a filter to no rows: cache keys {tuple(cache.layers[0].keys.shape)}, mask {tuple(mask.shape)}")
try:
    output = forward(torch.randn(0, 1, 4), torch.cat([mask, torch.ones(0, 1, dtype=torch.long)], dim=1))
except RuntimeError as error:
    print(f"a step of a batch of no rows raises RuntimeError: {error}")
    sys.exit(1)
print(f"a step of a batch of no rows returns {tuple(output.shape)}")
