"""litgpt 0.5.13: chunked prefill into a sliding-window KV cache that has wrapped attends to the wrong keys.

Standalone: needs torch and litgpt only (tested with litgpt 0.5.13, torch 2.13.0+cpu)::

    python ring_window_repro.py

A one-block GPT with sliding window W = 2 is run over six tokens three ways:

- without a KV cache (``model(idx)``): litgpt builds the causal + sliding
  window mask itself; this is the expected result;
- with the KV cache, one token at a time: agrees with the expected result;
- with the KV cache, in chunks of W tokens, as litgpt's error message advises
  for prompts longer than the window: every chunk after the first gives the
  wrong logits at every position but its last.

The cache of a sliding-window layer is a ring of min(max_seq_length, W)
slots (position p in slot p % W), but the mask handed to the attention is
``mask_cache[input_pos][..., :W]``, whose columns are absolute positions 0..W-1,
not ring slots. Once the ring has wrapped, every query of the chunk sees every
slot: the first query of the chunk [4, 5] sees positions 4 and 5 (a later key,
causality broken) instead of 3 and 4 (position 3 was overwritten by 5).

Exit status 1 while the bug is present, 0 once chunked prefill agrees.
"""

from __future__ import annotations

import sys

import torch
from litgpt.config import Config
from litgpt.model import GPT

W = 2  # sliding window
TOKENS = [3, 1, 4, 1, 5, 9]
TOLERANCE = 1e-9  # float64: agreement is at rounding level (about 1e-15)


def fresh_cache(model: GPT) -> None:
    for block in model.transformer.h:
        block.attn.kv_cache.reset_parameters()


def main() -> int:
    torch.manual_seed(0)
    config = Config(n_layer=1, n_embd=8, n_head=2, head_size=4, block_size=8, vocab_size=16, padded_vocab_size=16,
                    sliding_window_size=W, sliding_window_indices=[1], rotary_percentage=1.0, bias=False)
    model = GPT(config).to(torch.float64).eval()
    model.set_kv_cache(batch_size=1, dtype=torch.float64)
    kv = model.transformer.h[0].attn.kv_cache
    n = len(TOKENS)
    idx = torch.tensor([TOKENS])
    print(f"litgpt GPT, 1 block, sliding window W={W}; KV cache ring of {kv.max_cache_len} slots; tokens {TOKENS}")

    with torch.no_grad():
        expected = model(idx)[0]  # no cache: litgpt's own causal + sliding-window mask

        fresh_cache(model)
        one_by_one = torch.cat([model(idx[:, p:p + 1], input_pos=torch.tensor([p]), input_pos_maxp1=p + 1)[0]
                                for p in range(n)])

        fresh_cache(model)
        try:
            model(idx, input_pos=torch.arange(n), input_pos_maxp1=n)
        except ValueError as error:
            print(f"prefill of all {n} tokens at once: ValueError: {str(error)[:150]}...")

        fresh_cache(model)
        chunks = []
        for start in range(0, n, W):  # "chunked prefill with chunk size <= W"
            stop = min(start + W, n)
            chunks.append(model(idx[:, start:stop], input_pos=torch.arange(start, stop), input_pos_maxp1=stop)[0])
        chunked = torch.cat(chunks)

    print("\nmax |logits - expected| per position (expected: one forward without a KV cache)")
    print("position  one token at a time  chunks of W")
    for p in range(n):
        a = (one_by_one[p] - expected[p]).abs().max().item()
        b = (chunked[p] - expected[p]).abs().max().item()
        print(f"{p:8}  {a:19.1e}  {b:11.1e}{'   <-- wrong' if b > TOLERANCE else ''}")

    p = 4  # first position of the chunk [4, 5]
    mask = model.mask_cache[0, 0, p, :W].tolist()  # what the attention gets after mask[..., :actual_kv_len]
    slots = [max(q for q in range(p + W) if q % W == s) for s in range(W)]  # position held by each slot
    print(f"\nchunk [{p}, {p + 1}]: the ring's slots hold positions {slots}; the mask row of query {p} is {mask} "
          f"(columns read as slots),\nso query {p} sees positions {[q for q, m in zip(slots, mask) if m]}; "
          f"it should see {list(range(max(0, p - W + 1), p + 1))}")
    print(f"position {p}: expected {[round(v, 6) for v in expected[p, :4].tolist()]} ...")
    print(f"            chunked  {[round(v, 6) for v in chunked[p, :4].tolist()]} ...")

    wrong = (chunked - expected).abs().amax(-1) > TOLERANCE
    fine = bool(((one_by_one - expected).abs() <= TOLERANCE).all())
    print(f"\none token at a time agrees with the expected logits: {fine}")
    print(f"chunked prefill wrong at positions {wrong.nonzero().flatten().tolist()}"
          if wrong.any() else "chunked prefill agrees: fixed")
    return 1 if wrong.any() else 0


if __name__ == "__main__":
    sys.exit(main())
