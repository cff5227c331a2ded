"""docs/spec.md §13.9: the caches of a model's layers, written one layer at a time and truncated, reset, reordered,
selected and repeated all at once -- a layer never written included -- show every layer's own rows as the oracle
computes them, after every step; a call that raises changes no layer.

One property, drawing the layers' family per example among those the adapter can build; each operation is drawn
only where its capability is declared.
"""

from __future__ import annotations

from kvcache_conformance.run.runner import PropertyRun


def test_layered_cache_conforms(conformance: PropertyRun) -> None:
    conformance.run("layered_cache")
