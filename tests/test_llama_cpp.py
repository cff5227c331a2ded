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


@pytest.mark.parametrize("swa_full", [True, False], ids=["swa_full", "swa_small"])
def test_a_windowed_model_runs_as_gemma3_and_a_load_keeps_the_window(swa_full: bool) -> None:
    from adapters.llama_cpp import LlamaCppConfig

    config = ModelConfig(vocab=16, model_width=8, layers=4, heads=2, kv_heads=1, head_width=4, ffn_width=12,
                         rope_style="half_split", rope_base=1e6, local_rope_base=10000.0, window=3,
                         window_pattern=(True, True, False, True), embedding_scale=True, qk_norm=True,
                         post_norms=True, activation="gelu_tanh", tied_output=True, norm_eps=1e-6)
    adapter, weights = LlamaCppAdapter(LlamaCppConfig(windows=True, swa_full=swa_full)), random_model_weights(config, 5)
    model = adapter.create_model(config, weights)
    context = adapter.create_context(model, ContextConfig(cells=16, max_sequences=2))
    tokens = [3, 10, 7, 14, 5, 8, 1, 12]
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, tokens, 0))
    # llama.cpp's GELU is a float16 table: 1.9e-3 measured against the formula; a wrong window pattern, base or
    # norm is off by 0.3 and more (docs/llama-cpp/windows.md)
    assert np.max(np.abs(got - full_model(tokens, config, weights))) < 1e-2
    fresh = adapter.create_context(model, ContextConfig(cells=16, max_sequences=2))
    adapter.load_sequence(fresh, 1, adapter.save_sequence(context, 0))
    assert (adapter.seq_pos_min(fresh, 1), adapter.seq_pos_max(fresh, 1)) == (5, 7)  # the window, W 3, kept
