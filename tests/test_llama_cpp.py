"""The llama.cpp adapter against the float64 oracle (docs/llama-cpp/NOTES.md): needs the llamacpp extra."""

from __future__ import annotations

import numpy as np
import pytest

from kvcache_conformance.oracle.model import full_model
from kvcache_conformance.oracle.model_config import ContextConfig, ModelBatch, ModelConfig, random_model_weights

pytest.importorskip("llama_cpp")

from adapters.llama_cpp import LlamaCppAdapter

CONFIG = ModelConfig(vocab=32, model_width=32, layers=2, heads=4, kv_heads=2, head_width=8, ffn_width=48,
                     max_positions=128)


@pytest.mark.parametrize("unified", [True, False], ids=["unified", "per_sequence"])
def test_f32_cache_logits_agree_with_the_float64_oracle(unified: bool) -> None:
    adapter, weights = LlamaCppAdapter(), random_model_weights(CONFIG, 1)
    context = adapter.create_context(adapter.create_model(CONFIG, weights),
                                     ContextConfig(cells=64, max_sequences=2, unified=unified))
    tokens = [3, 10, 17, 24, 31, 8]
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, tokens, 0))
    assert got.shape == (6, CONFIG.vocab)
    assert np.max(np.abs(got - full_model(tokens, CONFIG, weights))) < 1e-5  # measured ~8e-7
    assert (adapter.seq_pos_min(context, 0), adapter.seq_pos_max(context, 0)) == (0, 5)


def test_return_codes_become_error_kinds() -> None:
    adapter = LlamaCppAdapter()
    context = adapter.create_context(adapter.create_model(CONFIG, random_model_weights(CONFIG, 1)),
                                     ContextConfig(cells=64, max_sequences=2))
    for batch in (ModelBatch.of_sequence(0, [CONFIG.vocab], 0), ModelBatch((), (), (), ()),
                  ModelBatch.of_sequence(0, [3.0], 0)):
        with pytest.raises(Exception) as raised:
            adapter.decode_batch(context, batch)
        assert adapter.error_kind(raised.value) == "malformed_batch"
    assert adapter.seq_pos_max(context, 0) == -1  # nothing was decoded
