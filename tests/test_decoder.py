"""The small decoder (oracle and impl), the decode session and the prefix store, beyond the machines."""

from __future__ import annotations

import numpy as np
import pytest

from impl import DecodeSession, errors
from impl.conformance import make_adapter
from impl.prefix_store import PrefixStore
from kvcache_conformance.oracle import (
    FLOAT64,
    PRESETS,
    DecoderConfig,
    full_decoder,
    greedy_generate,
    mpmath_precision,
    random_decoder_weights,
    sinusoid,
)

ADAPTER = make_adapter()


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_greedy_generation_with_the_session_equals_full_recomputation(preset: str) -> None:
    config = PRESETS[preset]
    weights = random_decoder_weights(config, 11)
    decoder = ADAPTER.create_decoder(config, weights)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    assert DecodeSession(decoder, 24).generate(prompt, 10) == greedy_generate(prompt, 10, config, weights)
    session = DecodeSession(decoder, 24)
    stepped = np.concatenate([session.prefill(prompt[:3]), *(session.decode(t)[None] for t in prompt[3:])])
    np.testing.assert_allclose(stepped, full_decoder(prompt, config, weights).logits, atol=1e-12, rtol=0)


def test_a_sliding_window_session_keeps_the_last_rows_with_their_positions() -> None:
    config = PRESETS["seed-rope-window4"]
    weights = random_decoder_weights(config, 7)
    session = DecodeSession(ADAPTER.create_decoder(config, weights), 12)
    session.prefill(list(range(1, 10)))
    trace = full_decoder(list(range(1, 10)), config, weights)
    for block, cache in enumerate(session.caches):
        assert cache.positions().tolist() == [5, 6, 7, 8]
        assert cache.key_storage.shape[2] == 4  # W slots, not capacity
        np.testing.assert_allclose(cache.keys()[0], trace.keys[block][:, 5:], atol=1e-12, rtol=0)


def test_a_step_that_fails_in_the_second_block_changes_no_block() -> None:
    config = PRESETS["seed"]
    weights = random_decoder_weights(config, 23)
    decoder = ADAPTER.create_decoder(config, weights)
    session = DecodeSession(decoder, 8)
    session.prefill([1, 2, 3])
    before = [(c.length, c.key_storage.tobytes(), c.value_storage.tobytes()) for c in session.caches]
    ADAPTER.update_block_weights(decoder, 1, weights.blocks[1])  # the same values, rewritten: block 1 is stale
    with pytest.raises(errors.CacheLayerRevisionMismatch):
        session.decode(4)
    assert before == [(c.length, c.key_storage.tobytes(), c.value_storage.tobytes()) for c in session.caches]
    with pytest.raises(errors.CacheFull):
        DecodeSession(decoder, 2).prefill([1, 2, 3])


@pytest.mark.parametrize("tokens", [[1.0], [True], [], [32], [-1], np.array([1.0]), "12", [[1]]])
def test_invalid_tokens_are_rejected_by_session_and_store(tokens: object) -> None:
    config = PRESETS["seed"]
    decoder = ADAPTER.create_decoder(config, random_decoder_weights(config, 7))
    session, store = DecodeSession(decoder, 8), PrefixStore()
    store.prefill(decoder, "app", [1, 2, 3])
    entries = store.entries()
    for call in (lambda: session.prefill(tokens), lambda: store.query(decoder, "app", tokens),  # type: ignore[arg-type]
                 lambda: store.prefill(decoder, "app", tokens)):  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidTokens):
            call()
    assert session.length == 0
    assert [e.tokens for e in store.entries()] == [e.tokens for e in entries]


def test_the_store_copies_and_evicts_the_oldest() -> None:
    config = PRESETS["seed"]
    decoder = ADAPTER.create_decoder(config, random_decoder_weights(config, 7))
    store = PrefixStore(capacity=2)
    for tokens in ([1, 2], [1, 3], [1, 4]):
        store.prefill(decoder, "app", tokens)
    assert [e.tokens for e in store.entries()] == [(1, 3), (1, 4)]
    store.entries()[0].blocks[0].keys[...] = np.nan  # the caller's copy
    assert np.isfinite(store.entries()[0].blocks[0].keys).all()
    result = store.query(decoder, "app", [1, 3, 5])
    assert (result.cut, result.entry, result.rows_computed, result.full_rows) == (2, 0, 6, 18)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_decoder_oracle_agrees_with_itself_in_mpmath(preset: str) -> None:
    config = PRESETS[preset]
    weights = random_decoder_weights(config, 7)
    tokens = [5, 0, 31, 7, 7, 7, 2]
    fast, exact = full_decoder(tokens, config, weights), full_decoder(tokens, config, weights,
                                                                      numbers=mpmath_precision(40))
    np.testing.assert_allclose(fast.logits, exact.logits, atol=1e-13, rtol=0)


def test_sinusoids_are_the_textbook_ones() -> None:
    encoding = sinusoid(3, 4, 10000.0, FLOAT64)
    assert encoding == [np.sin(3.0), np.cos(3.0), np.sin(3 / 100.0), np.cos(3 / 100.0)]


def test_a_window_of_one_makes_each_position_see_only_itself() -> None:
    config = DecoderConfig(window=1)
    weights = random_decoder_weights(config, 7)
    alone = [full_decoder([t], config, weights).logits[0] for t in (4, 4)]
    together = full_decoder([4, 4], config, weights).logits
    np.testing.assert_allclose(together[0], alone[0], atol=1e-15)
    assert not np.allclose(together[1], alone[1])  # same token, other position: sinusoids differ
