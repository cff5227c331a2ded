"""docs/spec.md §9 and §11: the decode session, driven at random, equals full recomputation after every step."""

from __future__ import annotations

from kvcache_conformance.run.runner import PropertyRun


def test_decode_session_conforms(conformance: PropertyRun) -> None:
    conformance.run("session")
