"""The oracle checks itself: float64 against mpmath, and the implementation against mpmath.

On the documented ranges the float64 oracle agrees with 40-digit mpmath within
1e-13, and the implementation's cached steps agree with mpmath within the
suite's 1e-12 -- so a 1e-12 verdict against the float64 oracle is about the
implementation, not about the oracle's own rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcache_conformance import generate as s
from kvcache_conformance.generate.needs import DECODER_POSITIONS, LAYER_CONVENTION, Needs
from kvcache_conformance.judge.calls import call
from kvcache_conformance.judge.checks import assert_close, expect_success
from kvcache_conformance.oracle import (
    FLOAT64,
    full_decoder,
    full_prefix_attention,
    mpmath_precision,
    random_decoder_weights,
)
from kvcache_conformance.protocol.declarations import LayerLimits
from kvcache_conformance.protocol.decoder import longest_prefill
from kvcache_conformance.protocol.kinds import Capability, declared
from kvcache_conformance.run import selection

ORACLE_AGREEMENT = 1e-13
MPMATH = mpmath_precision(40)
# mpmath is slow: a quarter of the profile's examples, at least 10.
FEW = settings(settings.default, max_examples=max(10, settings.default.max_examples // 4))


EVERY_LAYER = frozenset({"gqa", "rope_interleaved", "rope_half_split", "positionless", "partial_rotary"})
IMPLEMENTATION = Needs.of(Capability.FLOAT64, alternatives=[("layer convention", LAYER_CONVENTION)],
                          families=((None, None),))
SESSION = Needs.of(Capability.FLOAT64, Capability.DECODE_SESSION,
                   alternatives=[("decoder position convention", DECODER_POSITIONS)])


@st.composite
def prefixes(draw: st.DrawFn, of_the_adapter: bool = False) -> tuple[s.LayerConfig, np.ndarray]:
    """A layer and rows to feed it: any layer the oracle takes, or one the adapter can build."""
    capabilities, limits = EVERY_LAYER, LayerLimits()
    if of_the_adapter:
        adapter = selection.selected()
        capabilities, limits = declared(adapter.capabilities), LayerLimits.of(adapter)
    families = tuple(s.layer_families(capabilities, limits))
    config = draw(s.layer_configs(capabilities, limits=limits, families=families))
    tokens = draw(st.integers(1, config.capacity), label="tokens")
    x = draw(s.bounded_arrays((config.batch_size, tokens, config.model_width), s.INPUT_BOUND), label="x")
    return config, x


def _gate(needs: Needs) -> None:
    problem = needs.problem(selection.selected())
    if problem is not None:
        pytest.skip(problem)


@pytest.mark.kv_suite_check("the float64 oracle against mpmath: no adapter code runs")
@FEW
@given(case=prefixes())
def test_float64_oracle_agrees_with_mpmath(case: tuple) -> None:
    config, x = case
    fast = full_prefix_attention(x, config.weights, config.oracle_rope, numbers=FLOAT64)
    exact = full_prefix_attention(x, config.weights, config.oracle_rope, numbers=MPMATH)
    for name in ("outputs", "keys", "values"):
        assert_close(getattr(fast, name), getattr(exact, name), tolerance=ORACLE_AGREEMENT,
                     what=f"float64 oracle {name} against mpmath (a suite bug if this fails)")


@pytest.fixture(scope="module")
def implementation() -> None:
    _gate(IMPLEMENTATION)


@pytest.fixture(scope="module")
def session() -> None:
    _gate(SESSION)


@FEW
@given(case=st.deferred(lambda: prefixes(of_the_adapter=True)))
def test_implementation_agrees_with_mpmath(implementation: None, case: tuple) -> None:
    adapter = selection.selected()
    config, x = case
    exact = full_prefix_attention(x, config.weights, config.oracle_rope, numbers=MPMATH)
    layer = expect_success(call(adapter, "create a layer",
                                lambda: adapter.create_layer(config.weights, config.rope)), "create a layer")
    cache = expect_success(call(adapter, "create a cache",
                                lambda: adapter.create_cache(layer, config.batch_size, config.capacity)),
                           "create a cache")
    for t in range(x.shape[1]):
        what = f"step at position {t}"
        output = expect_success(call(adapter, what, lambda: adapter.step(layer, cache, x[:, t:t + 1].copy())), what)
        assert_close(output, exact.outputs[:, t:t + 1], tolerance=s.TOLERANCE, what=f"{what} against mpmath",
                     axes=("batch", "step row", "feature"))


@st.composite
def decoder_cases(draw: st.DrawFn, capabilities: frozenset[str]) -> tuple:
    config = draw(s.decoder_configs(capabilities))
    weights = random_decoder_weights(config, draw(st.integers(0, 2**32 - 1), label="seed"))
    tokens = draw(s.token_lists(config.vocab, 1, s.MAX_SEQUENCE), label="tokens")
    return config, weights, tokens


EVERY_DECODER = frozenset({"gqa", "sliding_window", "positions_sinusoidal", "positions_rope", "rope_interleaved",
                           "rope_half_split"})


@pytest.mark.kv_suite_check("the float64 decoder oracle against mpmath: no adapter code runs")
@FEW
@given(case=decoder_cases(EVERY_DECODER))
def test_float64_decoder_oracle_agrees_with_mpmath(case: tuple) -> None:
    config, weights, tokens = case
    fast = full_decoder(tokens, config, weights, numbers=FLOAT64)
    exact = full_decoder(tokens, config, weights, numbers=MPMATH)
    assert_close(fast.logits, exact.logits, tolerance=ORACLE_AGREEMENT,
                 what="float64 decoder oracle logits against mpmath (a suite bug if this fails)",
                 axes=("row", "vocab id"))


@FEW
@given(case=st.deferred(lambda: decoder_cases(declared(selection.selected().capabilities))))
def test_session_agrees_with_mpmath(session: None, case: tuple) -> None:
    adapter = selection.selected()
    config, weights, tokens = case
    decoder = expect_success(call(adapter, "create a decoder", lambda: adapter.create_decoder(config, weights)),
                             "create a decoder")
    session = expect_success(call(adapter, "create a session", lambda: adapter.create_session(decoder, len(tokens))),
                             "create a session")
    size = longest_prefill(declared(adapter.capabilities), config.window) or len(tokens)  # §9.4: W may be the most
    logits = np.concatenate([expect_success(call(adapter, f"prefill {chunk}", lambda: adapter.prefill(session, chunk)),
                                            f"prefill {chunk}")
                             for chunk in (list(tokens[i:i + size]) for i in range(0, len(tokens), size))])
    exact = full_decoder(tokens, config, weights, numbers=MPMATH)
    assert_close(np.asarray(logits), exact.logits, tolerance=s.TOLERANCE, what=f"prefill {tokens} against mpmath",
                 axes=("row", "vocab id"))
