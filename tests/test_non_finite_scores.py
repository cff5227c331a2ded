"""The reference rejects a step whose visible scores are not finite, and only those: masking is not overflow."""

from __future__ import annotations

import numpy as np
import pytest

from impl.attention import AttentionLayer
from impl.cache import LayerKvCache
from impl.errors import NonFiniteAttention
from impl.rope import RopeConfig

I2 = np.eye(2)
NO_ROTATION = RopeConfig("interleaved", 10000.0, 0, 16)


def layer(wq: np.ndarray, wk: np.ndarray, rope: RopeConfig = NO_ROTATION) -> AttentionLayer:
    return AttentionLayer.from_arrays(wq, wk, I2, I2, heads=1, kv_heads=1, rope=rope)


@pytest.mark.parametrize("rotary_width", [0, 2])
def test_a_minus_inf_score_beside_finite_ones_is_rejected(rotary_width: int) -> None:
    """q . k = -1e320: softmax would weigh it 0 and return a finite output; nothing may be written."""
    attention = layer(I2, -I2, RopeConfig("interleaved", 10000.0, rotary_width, 16))
    cache = LayerKvCache(attention, 1, 4)
    attention.forward_incremental(np.zeros((1, 1, 2)), cache)
    keys, values = cache.key_storage.copy(), cache.value_storage.copy()
    with pytest.raises(NonFiniteAttention, match="attention score of a visible key") as caught:
        attention.forward_incremental(np.array([[[1e160, 0.0]]]), cache)
    assert caught.value.value == -np.inf
    assert cache.length == 1
    np.testing.assert_array_equal(cache.key_storage, keys)
    np.testing.assert_array_equal(cache.value_storage, values)


# x0 = (a, 0), x1 = (0, a): q0 = 0, k0 = (a, 0), q1 = (a, 0), k1 = 0. Only q1 . k0 = a^2 overflows.
EARLY_KEY_LATE_QUERY = (np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 0.0]]))
# The other way round: only q0 . k1 -- a later key, masked -- overflows.
LATE_KEY_EARLY_QUERY = (I2, np.array([[0.0, 0.0], [1.0, 0.0]]))
ROWS = np.array([[[1e200, 0.0], [0.0, 1e200]]])


def test_a_masked_future_key_may_overflow() -> None:
    attention = layer(*LATE_KEY_EARLY_QUERY)
    with np.errstate(over="ignore"):
        full = attention.forward_full(ROWS)
    prepared = attention.prepare(ROWS, LayerKvCache(attention, 1, 4))  # a two-row chunk, as a prefill
    np.testing.assert_array_equal(prepared.output, full)
    np.testing.assert_array_equal(full, [[[1e200, 0.0], [5e199, 5e199]]])


def test_a_key_out_of_the_window_may_overflow() -> None:
    attention = layer(*EARLY_KEY_LATE_QUERY)
    windowed = LayerKvCache(attention, 1, 4, window=1)
    attention.forward_incremental(ROWS[:, :1], windowed)
    output = attention.forward_incremental(ROWS[:, 1:], windowed)  # q1 . k0 overflows, k0 is out of the window
    np.testing.assert_array_equal(output, [[[0.0, 1e200]]])
    unwindowed = LayerKvCache(attention, 1, 4)
    attention.forward_incremental(ROWS[:, :1], unwindowed)
    with pytest.raises(NonFiniteAttention, match="attention score of a visible key"):
        attention.forward_incremental(ROWS[:, 1:], unwindowed)
    assert unwindowed.length == 1
