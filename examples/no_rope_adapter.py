"""A cache for layers without RoPE: the minimal adapter's list-based cache, declared ``positionless``.

Some layers have no positional dependence of their own -- positions come
from elsewhere (absolute embeddings added before the layer) or nowhere. Such
an adapter declares ``positionless`` instead of a RoPE pairing; the suite
then hands ``create_layer`` and ``recreate_layer`` layers with ``rope=None``,
checks outputs against attention without rotation, and never asks about RoPE
configurations or position capacities. Run it with::

    KVCACHE_IMPL=examples.no_rope_adapter:make_adapter pytest -n auto properties/
"""

from __future__ import annotations

from typing import Any

import numpy as np

from examples.minimal_adapter import Cache, Layer, MinimalAdapter


class NoRopeAdapter(MinimalAdapter):
    name = "example-no-rope"
    capabilities = frozenset({"float64", "positionless"})

    def create_layer(self, weights: Any, rope: Any) -> Layer:
        if rope is not None:
            raise ValueError("this cache's layers have no RoPE")
        return super().create_layer(weights, None)

    def step(self, layer: Layer, cache: Cache, x: np.ndarray) -> np.ndarray:
        return super().step(layer, cache, x)  # rotate() is the identity without RoPE


def make_adapter() -> NoRopeAdapter:
    return NoRopeAdapter()
