"""transformers' LlamaForCausalLM as a whole-model adapter (adapters/hf_model.py) against the float64 oracle."""

from __future__ import annotations

import numpy as np
import pytest

from kvcache_conformance.oracle.model import full_model
from kvcache_conformance.oracle.model_config import ContextConfig, ModelBatch, ModelConfig, random_model_weights

pytest.importorskip("torch")
pytest.importorskip("transformers")

from adapters import hf_model

FACTORIES = ["dynamic_cache", "static_cache", "dynamic_cache_crop", "static_cache_crop", "static_cache_no_roll_back",
             "dynamic_cache_rows", "dynamic_cache_stock", "dynamic_cache_padded"]
# A width other than heads x head width (6 = 2 x 3, head width 4), GQA, tied and untied.
CONFIGS = [ModelConfig(vocab=11, model_width=6, layers=2, heads=2, kv_heads=1, head_width=4, ffn_width=7,
                       rope_style="half_split", rope_base=100.0, tied_output=tied) for tied in (False, True)]
TOKENS = [3, 10, 0, 7, 7, 1]


@pytest.mark.parametrize("factory", FACTORIES)
def test_factories_load(factory: str) -> None:
    adapter = getattr(hf_model, factory)()
    assert {"whole_model", "rope_half_split", "gqa"} <= adapter.capabilities
    assert "rope_interleaved" not in adapter.capabilities
    assert ("fixed_capacity" in adapter.capabilities) == factory.startswith("static")


def test_a_width_that_is_no_multiple_of_the_heads_is_declared_outside_and_refused_by_the_config() -> None:
    from kvcache_conformance.protocol.model import ModelLimits

    odd = ModelConfig(vocab=11, model_width=5, layers=1, heads=2, kv_heads=1, head_width=4, ffn_width=7,
                      rope_style="half_split")
    assert ModelLimits.of(hf_model.dynamic_cache()).model_problem(odd)
    with pytest.raises(Exception, match="not a multiple of the number of attention heads"):
        hf_model.llama_config(odd)  # huggingface_hub's StrictDataclassClassValidationError


@pytest.mark.parametrize("config", CONFIGS, ids=["untied", "tied"])
@pytest.mark.parametrize("factory", ["dynamic_cache", "static_cache"])
def test_weights_reproduce_the_float64_oracle(factory: str, config: ModelConfig) -> None:
    weights = random_model_weights(config, 7)
    adapter = getattr(hf_model, factory)()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=16, max_sequences=2, unified=False))
    expected = full_model(TOKENS, config, weights)
    prompt = adapter.decode_batch(context, ModelBatch.of_sequence(0, TOKENS[:4], 0))  # a prompt, then one by one
    rest = [adapter.decode_batch(context, ModelBatch.of_sequence(0, [t], 4 + i)) for i, t in enumerate(TOKENS[4:])]
    got = np.concatenate([prompt, *rest])
    assert got.dtype == np.float64 and got.shape == (len(TOKENS), config.vocab)
    assert np.max(np.abs(got - expected)) < 1e-12
    assert (adapter.seq_pos_min(context, 0), adapter.seq_pos_max(context, 0)) == (0, len(TOKENS) - 1)
    assert adapter.seq_pos_max(context, 1) == -1


def test_stock_numerics_are_not_float64() -> None:
    """transformers' float32 RMSNorm and RoPE table, measured: far above 1e-12, below 1e-5."""
    config, weights = CONFIGS[0], random_model_weights(CONFIGS[0], 7)
    adapter = hf_model.dynamic_cache_stock()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=16, max_sequences=2, unified=False))
    error = np.max(np.abs(adapter.decode_batch(context, ModelBatch.of_sequence(0, TOKENS, 0))
                          - full_model(TOKENS, config, weights)))
    assert 1e-12 < error < 1e-5


def test_a_batch_mixing_sequences_and_a_crop() -> None:
    config, weights = CONFIGS[0], random_model_weights(CONFIGS[0], 3)
    adapter = hf_model.dynamic_cache_crop()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=16, max_sequences=2, unified=False))
    batch = ModelBatch((1, 5, 2, 6), (0, 2, 1, 3), (0, 1, 0, 1), (True, True, True, True))  # seq 1 starts at 2
    got = adapter.decode_batch(context, batch)
    assert np.max(np.abs(got[[0, 2]] - full_model([1, 2], config, weights))) < 1e-12
    adapter.seq_remove(context, 0, 1, -1)  # the last row: crop(-1)
    assert adapter.seq_pos_max(context, 0) == 0
    again = adapter.decode_batch(context, ModelBatch.of_sequence(0, [4], 1))
    assert np.max(np.abs(again - full_model([1, 4], config, weights)[1:])) < 1e-12
    with pytest.raises(hf_model.CropRefused) as refused:
        adapter.seq_remove(context, 0, 0, 1)  # the first of two rows: nothing in transformers does it
    assert adapter.error_kind(refused.value) == "refused" and adapter.model_policy["removal"] == "end_only"
    assert adapter.seq_pos_min(context, 0) == 0


def test_a_static_cache_past_its_room_is_full_and_changes_nothing() -> None:
    config, weights = CONFIGS[0], random_model_weights(CONFIGS[0], 3)
    adapter = hf_model.static_cache()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=6, max_sequences=2, unified=False))  # 3 cells each
    adapter.decode_batch(context, ModelBatch.of_sequence(0, [1, 2], 0))
    with pytest.raises(Exception) as raised:
        adapter.decode_batch(context, ModelBatch.of_sequence(0, [3, 4], 2))
    assert adapter.error_kind(raised.value) == "full"
    assert adapter.seq_pos_max(context, 0) == 1
    got = adapter.decode_batch(context, ModelBatch.of_sequence(0, [3], 2))
    assert np.max(np.abs(got - full_model([1, 2, 3], config, weights)[2:])) < 1e-12


def test_a_static_state_loaded_into_a_roomier_context_gets_its_room() -> None:
    config, weights = CONFIGS[0], random_model_weights(CONFIGS[0], 3)
    adapter = hf_model.static_cache()
    model = adapter.create_model(config, weights)
    small = adapter.create_context(model, ContextConfig(cells=6, max_sequences=2, unified=False))  # 3 cells each
    adapter.decode_batch(small, ModelBatch.of_sequence(0, [1, 2, 3], 0))
    state = adapter.save_sequence(small, 0)
    roomy = adapter.create_context(model, ContextConfig(cells=8, max_sequences=2, unified=False))  # 4 cells each
    adapter.load_sequence(roomy, 1, state)
    got = adapter.decode_batch(roomy, ModelBatch.of_sequence(1, [4], 3))  # the saved cache had room for 3
    assert np.max(np.abs(got - full_model([1, 2, 3, 4], config, weights)[3:])) < 1e-12
    adapter.clear(roomy)
    adapter.decode_batch(roomy, ModelBatch.of_sequence(1, [1, 2, 3, 4], 0))
    tight = adapter.create_context(model, ContextConfig(cells=4, max_sequences=2, unified=False))  # 2 cells each
    with pytest.raises(Exception) as raised:
        adapter.load_sequence(tight, 0, state)
    assert adapter.error_kind(raised.value) == "full"


def test_rows_of_one_cache_a_padded_batch_and_a_reorder() -> None:
    config, weights = CONFIGS[1], random_model_weights(CONFIGS[1], 5)
    adapter = hf_model.dynamic_cache_rows()
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=12, max_sequences=3, unified=False))
    adapter.decode_batch(context, ModelBatch.of_sequence(0, [1, 2, 3], 0))  # rows 1 and 2: three padding slots
    got = adapter.decode_batch(context, ModelBatch((4, 9, 8), (3, 0, 1), (0, 1, 1), (True, True, True)))
    assert np.max(np.abs(got[0] - full_model([1, 2, 3, 4], config, weights)[3])) < 1e-12
    assert np.max(np.abs(got[1:] - full_model([9, 8], config, weights))) < 1e-12
    adapter.seq_copy(context, 1, 2, -1, -1)  # reorder_cache([0, 1, 1])
    assert (adapter.seq_pos_min(context, 2), adapter.seq_pos_max(context, 2)) == (0, 1)
    again = adapter.decode_batch(context, ModelBatch.of_sequence(2, [7], 2))
    assert np.max(np.abs(again - full_model([9, 8, 7], config, weights)[2:])) < 1e-12


def test_rows_left_padded_as_generate_pads_them_and_numbered_from_the_mask() -> None:
    config, weights = CONFIGS[1], random_model_weights(CONFIGS[1], 5)
    adapter = hf_model.dynamic_cache_padded()
    assert adapter.model_policy["positions"] == "from_zero"  # generate numbers positions from its mask
    context = adapter.create_context(adapter.create_model(config, weights),
                                     ContextConfig(cells=12, max_sequences=3, unified=False))
    adapter.decode_batch(context, ModelBatch.of_sequence(0, [1, 2, 3], 0))  # rows 1 and 2: three padding columns
    assert context.valid[1] == [False] * 3
    got = adapter.decode_batch(context, ModelBatch((4, 9, 8), (3, 0, 1), (0, 1, 1), (True, True, True)))
    assert context.valid[0][3:] == [False, True]  # row 0's one token is left-padded to the batch's two
    assert np.max(np.abs(got[0] - full_model([1, 2, 3, 4], config, weights)[3])) < 1e-12
    assert np.max(np.abs(got[1:] - full_model([9, 8], config, weights))) < 1e-12
    adapter.seq_copy(context, 1, 2, -1, -1)  # reorder_cache([0, 1, 1])
    again = adapter.decode_batch(context, ModelBatch.of_sequence(2, [7], 2))
    assert np.max(np.abs(again - full_model([9, 8, 7], config, weights)[2:])) < 1e-12
