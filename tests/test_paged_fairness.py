"""Fair verdicts for paged caches: each declared policy is judged as declared, and is not vacuous.

Each adapter is the reference paged cache built with one policy and declaring one: the behaviour passes
under its own declaration and fails under another. A call that raises must change nothing, whatever the
adapter declares; an operation not declared (truncate) is never drawn.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase

from impl.paged_cache import BlocksExhausted, PagedPool
from impl.paged_conformance import make_paged_adapter
from kvcache_conformance.judge.failures import STATE_CHANGED, NonConformance
from kvcache_conformance.run import profiles
from kvcache_conformance.run.runner import run_machine

pytestmark = pytest.mark.slow  # whole machine runs

PASSING = profiles.settings_for("ci", database=None, max_examples=40)
FAILING = profiles.settings_for("ci", database=None, report_multiple_bugs=False, print_blob=False,
                                phases=(Phase.explicit, Phase.generate))  # the verdict only: no shrinking
REFERENCE = {"hash_keys": ["scope", "signature"], "eviction": "lru", "hit_limit": "before_last_token",
             "truncate": True}
TRANSFORMERS = {"hash_keys": [], "eviction": "all_at_once", "hit_limit": "before_last_token", "truncate": False}


def _adapter(behaves: dict[str, Any], declares: dict[str, Any], name: str) -> Any:
    """The reference paged cache built with the policy ``behaves``, declaring ``declares``."""
    base = type(make_paged_adapter())

    class Adapter(base):  # type: ignore[misc, valid-type]
        paged_policy = declares

        def create_pool(self, config: Any, block_size: int, num_blocks: int) -> PagedPool:
            return PagedPool(config.blocks, config.kv_heads, config.head_width, block_size, num_blocks,
                             hash_keys=behaves["hash_keys"], eviction=behaves["eviction"],
                             hit_limit=behaves["hit_limit"])

    Adapter.name = f"test-paged-{name}"
    if not declares["truncate"]:
        del_truncate = Adapter.paged_truncate

        def refuse(self: Any, pool: Any, sequence: Any, length: Any) -> None:
            raise AssertionError("truncate is not declared: the machine must never call it")

        Adapter.paged_truncate = refuse  # type: ignore[method-assign]
        assert del_truncate is not refuse
    return Adapter()


def _run(adapter: Any, settings: Any) -> Any:
    return run_machine("paged", adapter, property_id=f"fairness-{adapter.name}", settings=settings)


@pytest.mark.parametrize("policy", [
    REFERENCE, TRANSFORMERS, {**REFERENCE, "hash_keys": ["signature"]},
    {**REFERENCE, "hit_limit": "before_last_full_block"}, {**REFERENCE, "eviction": "all_at_once"},
    {**REFERENCE, "eviction": "lru_nodes"},
], ids=["reference", "transformers", "scope-not-hashed", "before-last-full-block", "all-at-once", "lru-nodes"])
def test_each_policy_conforms_as_declared(policy: dict[str, Any]) -> None:
    result = _run(_adapter(policy, policy, "as-declared"), PASSING)
    assert result.failure is None, result.failure


@pytest.mark.parametrize(("behaves", "declares", "why"), [
    (REFERENCE, {**REFERENCE, "hash_keys": ["signature"]}, "declared to share across scopes, but does not"),
    ({**REFERENCE, "hash_keys": ["signature"]}, REFERENCE, "shares across scopes, declared not to"),
    (REFERENCE, {**REFERENCE, "eviction": "all_at_once"}, "evicts the shortfall, declared all at once"),
    ({**REFERENCE, "eviction": "all_at_once"}, REFERENCE, "evicts all at once, declared lru"),
    (REFERENCE, {**REFERENCE, "hit_limit": "before_last_full_block"}, "reuses more than declared"),
    ({**REFERENCE, "hit_limit": "before_last_full_block"}, REFERENCE, "reuses less than declared"),
    ({**REFERENCE, "eviction": "lru_nodes"}, REFERENCE, "evicts whole nodes, declared lru"),
    ({**REFERENCE, "eviction": "all_at_once"}, {**REFERENCE, "eviction": "lru_nodes"},
     "evicts every cached block, declared whole nodes"),
], ids=["scope-kept-apart", "scope-shared", "lru-as-all", "all-as-lru", "hit-longer", "hit-shorter", "nodes-as-lru",
        "all-as-nodes"])
def test_a_policy_judged_under_another_declaration_fails(behaves: dict[str, Any], declares: dict[str, Any],
                                                         why: str) -> None:
    result = _run(_adapter(behaves, declares, "misdeclared"), FAILING)
    assert isinstance(result.failure, NonConformance), f"{why}: not caught ({result.failure})"


def test_block_exact_lru_is_one_way_of_evicting_whole_nodes() -> None:
    """Exactly the shortfall, each release's tail first: within what lru_nodes allows (docs/spec.md §14.6)."""
    result = _run(_adapter(REFERENCE, {**REFERENCE, "eviction": "lru_nodes"}, "lru-as-nodes"), PASSING)
    assert result.failure is None, result.failure


def test_transformers_policy_fails_where_weights_share_a_pool() -> None:
    """Without the signature in the hash, one pool per computation is declared: under the reference's
    declaration, the machine mixes weights in one pool, and rows of other weights are reused."""
    result = _run(_adapter(TRANSFORMERS, {**REFERENCE, "eviction": "all_at_once", "truncate": False},
                           "signature-not-hashed"), FAILING)
    assert isinstance(result.failure, NonConformance), result.failure


def test_a_call_that_preempts_and_then_raises_fails_whatever_is_declared() -> None:
    base = type(_adapter(TRANSFORMERS, TRANSFORMERS, "preempts"))

    class Preempts(base):  # type: ignore[misc, valid-type]
        """When full, frees the oldest live sequence (a preemption) and raises anyway."""

        def paged_add(self, pool: PagedPool, decoder: Any, scope: str, tokens: Any) -> Any:
            try:
                return super().paged_add(pool, decoder, scope, tokens)
            except BlocksExhausted:
                if pool.state().tables:
                    pool.free(min(pool.state().tables))
                raise

    result = _run(Preempts(), FAILING)
    assert isinstance(result.failure, NonConformance), result.failure
    assert result.failure.kind == STATE_CHANGED and result.failure.check == "full", result.failure


def test_an_unclaimed_invalid_length_may_be_accepted() -> None:
    base = type(_adapter(REFERENCE, REFERENCE, "clamps-lengths"))

    class ClampsLengths(base):  # type: ignore[misc, valid-type]
        """Claims no validation: truncates to the nearest valid length instead of rejecting."""

        capabilities = frozenset(c for c in base.capabilities if c not in ("input_validation", "validates_length")
                                 and not c.startswith("validates_"))

        def paged_truncate(self, pool: PagedPool, sequence: Any, length: Any) -> None:
            try:
                length = int(length)
            except ValueError:
                length = 0
            pool.truncate(sequence, min(max(length, 0), len(pool.tokens(sequence))))

    result = _run(ClampsLengths(), PASSING)
    assert result.failure is None, result.failure
