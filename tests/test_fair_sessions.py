"""Fair verdicts for sessions and stores: what every implementation owes, and what only a claim makes due.

A call that raises -- typed or not, mapped or not -- must change nothing, whatever the adapter declares.
The error kind is judged only where the adapter claims the check; an input it does not claim to check
and accepts is not judged (the machine replaces the session or store). Each adapter below is the
reference with other capabilities or one behaviour changed.
"""

from __future__ import annotations

from typing import Any

import pytest

from impl import errors
from impl.conformance import ReferenceAdapter
from impl.decoder import Decoder, DecodeSession, validate_tokens
from impl.prefix_store import PrefixStore, QueryResult
from kvcache_conformance.judge.failures import STATE_CHANGED, NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine

# Whole machine runs and subprocess runs of the suite: tox runs these once, on Python 3.11 (tox.ini).
pytestmark = pytest.mark.slow

CI = profiles.settings_for("ci", database=None)
FAILING = profiles.settings_for("ci", database=None, report_multiple_bugs=False, print_blob=False)
VALIDATION = {"input_validation", "binding_checks", "fixed_capacity", "non_finite_rejection", "creation_errors"}


def _without(*names: str) -> frozenset[str]:
    """The reference's capabilities without ``names`` (and without any fine-grained validates_*)."""
    return frozenset(c for c in ReferenceAdapter.capabilities if c not in names and not c.startswith("validates_"))


def _cast(tokens: Any) -> Any:
    """Integral floats, bools and digit strings as ints; anything else as it came."""
    try:
        return [int(t) for t in tokens]
    except (TypeError, ValueError):
        return tokens


def _invalid(tokens: Any, vocab: int) -> bool:
    try:
        validate_tokens(tokens, vocab)
    except errors.InvalidTokens:
        return True
    return False


class WritesThenRaises(ReferenceAdapter):
    """Claims no validation; on invalid tokens it processes token 0 first, then raises an unmapped error."""

    name = "test-writes-then-raises"
    capabilities = _without(*VALIDATION)

    def prefill(self, session: DecodeSession, tokens: Any) -> Any:
        if _invalid(tokens, session.model.vocab):
            try:
                session.prefill([0])
            except errors.KvCacheError:
                pass
            raise RuntimeError("cannot read these tokens")
        return super().prefill(session, tokens)

    def decode(self, session: DecodeSession, token: Any) -> Any:
        return self.prefill(session, [token])[-1]


class RaisesUnmapped(ReferenceAdapter):
    """Rejects invalid tokens with an exception ``error_kind`` does not map, before touching anything."""

    name = "test-raises-unmapped"
    capabilities = _without("input_validation")

    def prefill(self, session: DecodeSession, tokens: Any) -> Any:
        if _invalid(tokens, session.model.vocab):
            raise RuntimeError("cannot read these tokens")
        return super().prefill(session, tokens)

    def decode(self, session: DecodeSession, token: Any) -> Any:
        return self.prefill(session, [token])[-1]


class ClaimsButRaisesUnmapped(RaisesUnmapped):
    name = "test-claims-but-raises-unmapped"
    capabilities = ReferenceAdapter.capabilities


class AcceptsInvalidTokens(ReferenceAdapter):
    """Claims no validation; casts what it can (``1.0`` and ``True`` to 1, ``"01"`` to ``[0, 1]``)."""

    name = "test-accepts-invalid-tokens"
    capabilities = _without(*VALIDATION)

    def prefill(self, session: DecodeSession, tokens: Any) -> Any:
        return super().prefill(session, _cast(tokens))

    def decode(self, session: DecodeSession, token: Any) -> Any:
        return super().decode(session, _cast([token])[0])

    def store_prefill(self, store: PrefixStore, decoder: Decoder, scope: str, tokens: Any) -> QueryResult:
        return super().store_prefill(store, decoder, scope, _cast(tokens))

    def store_query(self, store: PrefixStore, decoder: Decoder, scope: str, tokens: Any) -> QueryResult:
        return super().store_query(store, decoder, scope, _cast(tokens))


class GrowsPastCapacity(ReferenceAdapter):
    """No fixed capacity: a session takes as many tokens as the decoder has positions."""

    name = "test-grows-past-capacity"
    capabilities = _without("fixed_capacity")

    def create_session(self, decoder: Decoder, capacity: int) -> DecodeSession:
        return DecodeSession(decoder, decoder.max_positions)


class IgnoresStaleness(ReferenceAdapter):
    """No binding checks: a step after an in-place update computes with the new weights, as most model code does."""

    name = "test-ignores-staleness"
    capabilities = _without("binding_checks")

    def _refresh(self, session: DecodeSession) -> None:
        for block, cache in zip(session.model.blocks, session.caches):
            cache._versions = tuple(p.version for p in block.parameters)

    def prefill(self, session: DecodeSession, tokens: Any) -> Any:
        self._refresh(session)
        return super().prefill(session, tokens)

    def decode(self, session: DecodeSession, token: Any) -> Any:
        self._refresh(session)
        return super().decode(session, token)


def test_a_call_that_writes_then_raises_fails_whatever_is_declared() -> None:
    result = run_machine("session", WritesThenRaises(), property_id="writes-then-raises", settings=FAILING)
    assert isinstance(result.failure, NonConformance), result.failure
    # the check is not claimed: the cause is named by what changed, never by the unclaimed check
    assert result.failure.kind == STATE_CHANGED and result.failure.check is None, result.failure
    assert "block 0 keys" in result.failure.changed, result.failure


def test_an_unmapped_exception_is_judged_only_where_the_kind_is_claimed() -> None:
    unclaimed = run_machine("session", RaisesUnmapped(), property_id="raises-unmapped", settings=CI)
    assert unclaimed.failure is None, unclaimed.failure
    claimed = run_machine("session", ClaimsButRaisesUnmapped(), property_id="claims-but-raises-unmapped",
                          settings=FAILING)
    assert isinstance(claimed.failure, NonConformance), claimed.failure
    assert "does not map to an error kind" in str(claimed.failure)


@pytest.mark.parametrize(("machine", "parameters"), [("session", {}), ("prefix_store", {"windowed": False}),
                                                     ("prefix_store", {"windowed": True})],
                         ids=["session", "store-full", "store-window"])
def test_accepting_invalid_tokens_without_claiming_validation_conforms(machine: str,
                                                                       parameters: dict[str, Any]) -> None:
    result = run_machine(machine, AcceptsInvalidTokens(), property_id=f"accepts-invalid-{machine}",
                         parameters=parameters, settings=CI)
    assert result.failure is None, result.failure


def test_a_session_without_fixed_capacity_may_grow_past_it() -> None:
    result = run_machine("session", GrowsPastCapacity(), property_id="grows-past-capacity", settings=CI)
    assert result.failure is None, result.failure


def test_a_session_without_binding_checks_may_compute_with_new_weights() -> None:
    result = run_machine("session", IgnoresStaleness(), property_id="ignores-staleness", settings=CI)
    assert result.failure is None, result.failure
