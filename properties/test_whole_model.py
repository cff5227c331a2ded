"""docs/spec.md §15: a whole model's batches and sequence operations, driven at random over several sequences,
equal the oracle's cell model after every step."""

from __future__ import annotations

from kvcache_conformance.run.runner import PropertyRun


def test_whole_model_conforms(conformance: PropertyRun) -> None:
    conformance.run("model")
