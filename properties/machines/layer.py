"""The conformance machine of a layer-bound KV cache (docs/spec.md §4-6, §11).

One layer and its cache, driven one row at a time: valid rows in every
layout, peaked, malformed, non-finite and overflowing rows, recreated layers,
other RoPE configurations, caches of other geometry, in-place weight updates,
full caches and resets (the rules of ``layer_steps``). The layer property
runs it once per position convention and attention kind, so a run never
mixes conventions and xdist can spread the runs.
"""

from __future__ import annotations

from typing import Any

from ..oracle import FLOAT64, NumberSystem
from .layer_steps import LayerSteps


class LayerCacheMachine(LayerSteps):
    """Drive one layer and its cache at random; check every step against the oracle."""

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64, style: str | None = None,
                 grouped: bool | None = None) -> None:
        super().__init__(adapter, numbers, style=style, grouped=grouped)
