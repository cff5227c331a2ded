"""docs/spec.md §10 and §11: the prefix store, driven at random, reuses exactly what the rules allow and
always equals full recomputation; once with full attention, once with sliding windows."""

from __future__ import annotations

import pytest

from kvcache_conformance.run.runner import PropertyRun


@pytest.mark.parametrize("windowed", [False, True], ids=["full-attention", "sliding-window"])
def test_prefix_store_conforms(windowed: bool, conformance: PropertyRun) -> None:
    conformance.run("prefix_store", windowed=windowed)
