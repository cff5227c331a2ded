"""transformers' caches under left-padded batches as generate runs them (adapters/hf_caches.py, docs/spec.md §13.8):
each row of a padded chunk computes what the row alone computes, and a row's snapshot shows no padding."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from adapters import hf_caches
from kvcache_conformance.protocol.declarations import declaration_problems

PADDED = ["dynamic_cache_padded", "dynamic_cache_padded_skip_empty_batch", "dynamic_cache_padded_crop",
          "static_cache_padded", "quantized_cache_hqq_padded"]


class Weights:
    def __init__(self, seed: int, heads: int = 2, kv_heads: int = 1, head_width: int = 2) -> None:
        rng = np.random.default_rng(seed)
        width = heads * head_width
        self.heads, self.kv_heads = heads, kv_heads
        self.wq, self.wo = rng.normal(0, 0.7, (width, width)), rng.normal(0, 0.7, (width, width))
        self.wk, self.wv = (rng.normal(0, 0.7, (width, kv_heads * head_width)) for _ in range(2))


class Rope:
    base, max_positions = 100.0, 16


@pytest.mark.parametrize("factory", PADDED)
def test_the_padded_adapters_declare_ragged_rows_and_only_the_batch_methods_their_cache_has(factory: str) -> None:
    adapter = getattr(hf_caches, factory)()
    assert "ragged_rows" in adapter.capabilities
    assert not {"batch_merge", "batch_extract"} & adapter.capabilities  # no such cache method
    has_batch_methods = factory.startswith("dynamic")  # StaticLayer has neither batch_select_indices nor repeat
    assert ({"batch_select", "batch_repeat", "batch_filter"} <= adapter.capabilities) == has_batch_methods
    # DynamicLayer's crop drops every row's last columns: a truncation by columns, declared so (docs/spec.md §13.8)
    assert ("truncate" in adapter.capabilities) == factory.endswith("_crop")
    assert getattr(adapter, "ragged_truncate", None) == ("columns" if factory.endswith("_crop") else None)
    assert (getattr(adapter, "storage", None) is not None) == ("hqq" in factory)
    assert declaration_problems(adapter) == []  # e.g. batch_filter only beside ragged_rows


@pytest.mark.parametrize("factory", ["dynamic_cache_padded", "static_cache_padded"])
def test_a_left_padded_chunk_computes_each_row_as_the_row_alone(factory: str) -> None:
    adapter = getattr(hf_caches, factory)()
    layer = adapter.create_layer(Weights(3), Rope())
    rng = np.random.default_rng(4)
    batch = adapter.create_ragged_cache(layer, 2, 8)
    first, second = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 2, 4))
    out1 = adapter.append_ragged(layer, batch, first, [3, 1])  # row 1: two padding columns, then one token
    out2 = adapter.append_ragged(layer, batch, second, np.array([0, 2]))  # row 0 appends nothing: padding only
    for row, (tokens1, tokens2) in enumerate(((3, 0), (1, 2))):
        alone = adapter.create_ragged_cache(layer, 1, 8)
        expected1 = adapter.append_ragged(layer, alone, first[row:row + 1, 3 - tokens1:], [tokens1])
        np.testing.assert_allclose(out1[row, 3 - tokens1:], expected1[0], atol=1e-12)
        if tokens2:
            expected2 = adapter.append_ragged(layer, alone, second[row:row + 1, 2 - tokens2:], [tokens2])
            np.testing.assert_allclose(out2[row, 2 - tokens2:], expected2[0], atol=1e-12)
        shown, own = adapter.ragged_snapshot(batch)[row], adapter.ragged_snapshot(alone)[0]
        assert shown.keys.shape == (1, tokens1 + tokens2, 2)  # its own tokens, no padding
        np.testing.assert_allclose(shown.keys, own.keys, atol=1e-12)
        np.testing.assert_allclose(shown.values, own.values, atol=1e-12)


def test_a_filter_to_no_rows_is_taken_and_the_next_chunk_raises_in_llama_attention() -> None:
    """README's finding on padded batches: LlamaAttention cannot run a batch of no rows; the variant steps around."""
    plain, stepping = hf_caches.dynamic_cache_padded(), hf_caches.dynamic_cache_padded_skip_empty_batch()
    for adapter in (plain, stepping):
        layer = adapter.create_layer(Weights(5), Rope())
        batch = adapter.create_ragged_cache(layer, 2, 8)
        adapter.append_ragged(layer, batch, np.ones((2, 2, 4)), [2, 1])
        adapter.filter(batch, [])
        assert adapter.ragged_snapshot(batch) == []
        if adapter is plain:
            with pytest.raises(RuntimeError, match="cannot reshape tensor of 0 elements"):
                adapter.append_ragged(layer, batch, np.ones((0, 1, 4)), [])
        else:
            assert adapter.append_ragged(layer, batch, np.ones((0, 1, 4)), []).shape == (0, 1, 4)


def test_crop_is_a_truncation_by_columns_of_generates_layout_and_not_past_padding_after_a_rows_tokens() -> None:
    adapter = hf_caches.dynamic_cache_padded_crop()
    layer = adapter.create_layer(Weights(5), Rope())
    rng = np.random.default_rng(6)

    def lengths_after(chunks: list[list[int]], n: int) -> list[int]:
        batch = adapter.create_ragged_cache(layer, 2, 8)
        for lengths in chunks:
            adapter.append_ragged(layer, batch, rng.normal(size=(2, max(lengths), 4)), lengths)
        before = [row.keys for row in adapter.ragged_snapshot(batch)]
        adapter.truncate(batch, n)
        after = [row.keys for row in adapter.ragged_snapshot(batch)]
        assert all(np.array_equal(a, b[:, :a.shape[1]]) for a, b in zip(after, before))  # each its first tokens
        return [row.shape[1] for row in after]

    # generate's layout (padding before the prompts only, then every row a token per step): rows [4, 2] cut by 3
    assert lengths_after([[3, 1], [1, 1]], 1) == [1, 0]
    # row 1 appends nothing in the second chunk: a column of padding after its tokens, which the crop takes first
    assert lengths_after([[3, 3], [1, 0]], 2) == [2, 2]  # by columns (docs/spec.md §13.8) row 1 keeps 1
