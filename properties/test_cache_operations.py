"""docs/spec.md §13: chunked append, truncation, batch reorder and forks, interleaved with every step of the
layer machine, agree with the oracle after every step; and the same on a sliding-window cache.

Two runs, each drawing the layer's family per example among those the adapter can build: one with every
operation it declares, and one on sliding-window caches. Each operation is drawn only where its capability
is declared.
"""

from __future__ import annotations

import pytest

from kvcache_conformance.run.runner import PropertyRun


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
def test_cache_operations_conform(windowed: bool, conformance: PropertyRun) -> None:
    conformance.run("cache_operations", windowed=windowed)
