"""The oracle checks itself: float64 against mpmath, and the implementation against mpmath.

On the documented ranges the float64 oracle agrees with 40-digit mpmath within
1e-13, and the implementation's cached steps agree with mpmath within the
suite's 1e-12 -- so a 1e-12 verdict against the float64 oracle is about the
implementation, not about the oracle's own rounding.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle import FLOAT64, full_prefix_attention, mpmath_precision
from properties import selection
from properties import strategies as s
from properties.protocol import Capability
from properties.verdict import assert_close, call, expect_success

ORACLE_AGREEMENT = 1e-13
MPMATH = mpmath_precision(40)
# mpmath is slow: a quarter of the profile's examples, at least 10.
FEW = settings(settings.default, max_examples=max(10, settings.default.max_examples // 4))


@st.composite
def prefixes(draw: st.DrawFn) -> tuple[s.LayerConfig, st.SearchStrategy]:
    config = draw(s.layer_configs(selection.selected().capabilities))
    tokens = draw(st.integers(1, config.capacity), label="tokens")
    x = draw(s.bounded_arrays((config.batch_size, tokens, config.model_width), s.INPUT_BOUND), label="x")
    return config, x


@FEW
@given(case=prefixes())
def test_float64_oracle_agrees_with_mpmath(case: tuple) -> None:
    config, x = case
    fast = full_prefix_attention(x, config.weights, config.rope, numbers=FLOAT64)
    exact = full_prefix_attention(x, config.weights, config.rope, numbers=MPMATH)
    for name in ("outputs", "keys", "values"):
        assert_close(getattr(fast, name), getattr(exact, name), tolerance=ORACLE_AGREEMENT,
                     what=f"float64 oracle {name} against mpmath (a suite bug if this fails)")


@FEW
@given(case=prefixes())
def test_implementation_agrees_with_mpmath(case: tuple) -> None:
    adapter = selection.selected()
    if Capability.FLOAT64.value not in adapter.capabilities:
        pytest.skip(f"{adapter.name} does not declare float64: the 1e-12 rule does not apply")
    config, x = case
    exact = full_prefix_attention(x, config.weights, config.rope, numbers=MPMATH)
    layer = expect_success(call(adapter, "create a layer",
                                lambda: adapter.create_layer(config.weights, config.rope)), "create a layer")
    cache = expect_success(call(adapter, "create a cache",
                                lambda: adapter.create_cache(layer, config.batch_size, config.capacity)),
                           "create a cache")
    for t in range(x.shape[1]):
        what = f"step at position {t}"
        output = expect_success(call(adapter, what, lambda: adapter.step(layer, cache, x[:, t:t + 1].copy())), what)
        assert_close(output, exact.outputs[:, t:t + 1], tolerance=s.TOLERANCE, what=f"{what} against mpmath",
                     axes=("batch", "position", "feature"))
