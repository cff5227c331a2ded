"""docs/spec.md §14: a paged cache with prefix sharing, driven at random over many sequences, equals full
recomputation after every step, keeps its accounting, shares only equal prefixes and reuses what the
declared rules say it must."""

from __future__ import annotations

from kvcache_conformance.run.runner import PropertyRun


def test_paged_cache_conforms(conformance: PropertyRun) -> None:
    conformance.run("paged")
