"""transformers' Gemma3ForCausalLM as a whole-model adapter (adapters/hf_gemma3.py), sliding and full layers,
checked against the oracle's Gemma-3 model."""

from __future__ import annotations

import numpy as np
import pytest

from kvcache_conformance.oracle.model import full_model
from kvcache_conformance.oracle.model_config import ContextConfig, ModelBatch, ModelConfig, random_model_weights

pytest.importorskip("torch")
pytest.importorskip("transformers")

from adapters import hf_gemma3

FACTORIES = ["dynamic_cache", "dynamic_cache_crop", "dynamic_cache_crop_unchecked", "full_layers", "static_cache",
             "static_cache_crop", "dynamic_cache_rows", "dynamic_cache_stock"]
TOKENS = [3, 10, 0, 7, 7, 1, 9, 4]


def gemma3(**fields: object) -> ModelConfig:
    """A Gemma-3 model of sliding and full layers (layer 1 and 3 global), window 3."""
    shape: dict[str, object] = dict(vocab=11, model_width=8, layers=4, heads=2, kv_heads=1, head_width=4, ffn_width=7,
                                    rope_style="half_split", rope_base=10000.0, tied_output=False, window=3,
                                    window_pattern=2, local_rope_base=100.0, embedding_scale=True, qk_norm=True,
                                    post_norms=True, activation="gelu_tanh")
    return ModelConfig(**{**shape, **fields})  # type: ignore[arg-type]


def context(adapter: hf_gemma3.HfGemma3Adapter, config: ModelConfig, cells: int = 24):
    model = adapter.create_model(config, random_model_weights(config, seed=5))
    return adapter.create_context(model, ContextConfig(cells=cells, max_sequences=2, unified=False))


def decode(adapter, ctx, seq: int, tokens: list[int], first: int) -> np.ndarray:
    positions = list(range(first, first + len(tokens)))
    return adapter.decode_batch(ctx, ModelBatch(tokens=tokens, positions=positions, sequences=[seq] * len(tokens),
                                                logits=[True] * len(tokens)))


@pytest.mark.parametrize("factory", FACTORIES)
def test_factories_declare_windows(factory: str) -> None:
    adapter = getattr(hf_gemma3, factory)()
    assert {"whole_model", "rope_half_split", "sliding_window", "interleaved_windows"} <= adapter.capabilities
    evicts = factory.startswith(("dynamic_cache", "static")) and factory != "dynamic_cache_rows"
    assert adapter.model_policy["window_cells"] == ("visible" if evicts else "all")
    assert (adapter.model_policy.get("window_removal") == "until_full") == factory.startswith(
        ("dynamic_cache_crop", "static_cache_crop"))
    assert adapter.model_limits["min_window"] == 2


def test_a_model_of_another_architecture_is_refused_naming_it() -> None:
    llama = ModelConfig(vocab=11, model_width=8, layers=2, heads=2, kv_heads=1, head_width=4, ffn_width=7,
                        rope_style="half_split")
    problem = hf_gemma3.gemma3_problem(llama)
    assert problem is not None and "not 'llama'" in problem
    with pytest.raises(hf_gemma3.UnsupportedModel):
        hf_gemma3.dynamic_cache().create_model(llama, random_model_weights(llama, seed=0))


@pytest.mark.parametrize("factory", ["dynamic_cache", "full_layers", "static_cache"])
def test_chunks_across_the_window_reproduce_the_oracle(factory: str) -> None:
    config = gemma3()
    adapter = getattr(hf_gemma3, factory)()
    ctx = context(adapter, config)
    got = np.concatenate([decode(adapter, ctx, 0, TOKENS[:3], 0), decode(adapter, ctx, 0, TOKENS[3:5], 3),
                          decode(adapter, ctx, 0, TOKENS[5:], 5)])
    want = full_model(TOKENS, config, random_model_weights(config, seed=5))
    assert np.abs(got - want).max() <= 1e-12
    # the sliding layers of DynamicCache(config) keep the last W-1 rows, a static ring the last W, DynamicCache() all
    assert adapter.seq_pos_min(ctx, 0) == {"dynamic_cache": 6, "static_cache": 5, "full_layers": 0}[factory]
    assert adapter.seq_pos_max(ctx, 0) == 7


def test_a_removal_once_the_window_evicted_is_refused_and_changes_nothing() -> None:
    config = gemma3()
    adapter = hf_gemma3.dynamic_cache_crop()
    ctx = context(adapter, config)
    decode(adapter, ctx, 0, TOKENS[:2], 0)
    adapter.seq_remove(ctx, 0, 1, -1)  # two tokens seen of a window of 3: crop works
    decode(adapter, ctx, 0, TOKENS[1:4], 1)
    with pytest.raises(Exception) as refused:
        adapter.seq_remove(ctx, 0, 3, -1)
    assert adapter.error_kind(refused.value) == "refused"
    want = full_model(TOKENS[:5], config, random_model_weights(config, seed=5))
    assert np.abs(decode(adapter, ctx, 0, [TOKENS[4]], 4) - want[4:]).max() <= 1e-12
    adapter.seq_remove(ctx, 0, -1, -1)  # the whole sequence: reset
    assert adapter.seq_pos_max(ctx, 0) == -1


def test_a_mask_per_layer_type_over_padded_rows() -> None:
    config = gemma3()
    adapter = hf_gemma3.dynamic_cache_rows()
    ctx = context(adapter, config)
    other = [5, 2, 8]
    first = adapter.decode_batch(ctx, ModelBatch(tokens=TOKENS[:5] + other[:2], positions=[0, 1, 2, 3, 4, 0, 1],
                                                 sequences=[0] * 5 + [1] * 2, logits=[True] * 7))
    second = adapter.decode_batch(ctx, ModelBatch(tokens=[TOKENS[5], other[2]], positions=[5, 2], sequences=[0, 1],
                                                  logits=[True, True]))
    weights = random_model_weights(config, seed=5)
    assert np.abs(np.concatenate([first[:5], second[:1]]) - full_model(TOKENS[:6], config, weights)).max() <= 1e-12
    assert np.abs(np.concatenate([first[5:], second[1:]]) - full_model(other, config, weights)).max() <= 1e-12


def test_a_refused_removal_keeps_what_the_windowed_store_evicted() -> None:
    """Found by the published run: layers (sliding W 3, full), 7 tokens at 2..8 (the sliding layer keeps 7, 8),
    then ``remove [6, -1)`` refused. The machine's roll-back of a refused call once forgot ``Cell.window_gone``,
    so the oracle held 6 again and the engine was failed for "holds 7..8, should hold 6..8"."""
    from pathlib import Path

    from kvcache_conformance.traces import codec, replay

    trace = Path(__file__).parent / "replay-cases" / "hf-gemma3-refused-removal-keeps-window-eviction.json"
    verdict = replay.replay(codec.load(trace), hf_gemma3.dynamic_cache_crop(), out=lambda line: None)
    assert verdict.conforms, verdict.message


def test_removing_every_held_position_removes_the_sequence() -> None:
    """Once the sliding layers evicted, the sequence holds seq_pos_min..seq_pos_max: a removal of all of them is a
    whole-sequence removal (must succeed), not a crop past the window (which transformers refuses)."""
    config = gemma3(window_pattern="all")
    adapter = hf_gemma3.dynamic_cache_crop()
    ctx = context(adapter, config)
    decode(adapter, ctx, 0, TOKENS[:6], 0)
    held = adapter.seq_pos_min(ctx, 0)
    assert held == 4  # DynamicSlidingWindowLayer keeps the last W - 1 = 2 rows
    adapter.seq_remove(ctx, 0, held, -1)
    assert (adapter.seq_pos_min(ctx, 0), adapter.seq_pos_max(ctx, 0)) == (-1, -1)
    want = full_model(TOKENS[:3], config, random_model_weights(config, seed=5))
    assert np.abs(decode(adapter, ctx, 0, TOKENS[:3], 0) - want).max() <= 1e-12
