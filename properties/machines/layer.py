"""The conformance machine of a layer-bound KV cache (docs/spec.md §4-6, §11).

One layer and its cache, driven one row at a time: valid rows in every
layout, peaked, malformed, non-finite and overflowing rows, recreated layers,
other RoPE configurations, caches of other geometry, in-place weight updates,
full caches and resets (the rules of ``layer_steps``). The layer property
draws the layer's family -- position convention and attention kind -- per
example, among every family the adapter can build; one example never mixes
conventions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import generate as g
from ..generate.needs import Needs
from ..oracle import FLOAT64, NumberSystem
from ..traces.recording import Draws
from .layer_steps import LayerSteps, layer_needs

# A grouped layer's geometry: as drawn (mostly one KV head: MQA), or on purpose query heads grouped over two KV
# heads or more -- a query head reading KV head h % KV instead of h // (H / KV) shows only there.
GROUPINGS = ("the geometry drawn", "two KV heads or more, each shared")


class LayerCacheMachine(LayerSteps):
    """Drive one layer and its cache at random; check every step against the oracle."""

    @classmethod
    def needs(cls, style: str | None = None, grouped: bool | None = None, **_: Any) -> Needs:
        return layer_needs(style, grouped)

    def __init__(self, adapter: Any, numbers: NumberSystem = FLOAT64, style: str | None = None,
                 grouped: bool | None = None, left_out_families: Sequence[str] = (),
                 family_rules: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(adapter, numbers, style=style, grouped=grouped, left_out_families=left_out_families,
                         family_rules=family_rules)

    def hard_config(self, data: Draws, config: g.LayerConfig) -> g.LayerConfig:
        """On purpose (``GROUPINGS``), in place of a grouped layer of one KV head, one whose query heads share each
        of two KV heads or more, of the same head width where one is (never where the adapter draws from few
        shapes: a shape of its own)."""
        weights = config.weights
        if self.limits.max_shapes is not None or not 1 == weights.kv_heads < weights.heads:
            return config
        shapes = self.shapes_for(config, grouped=True, keep=lambda shape: 2 <= shape[1] < shape[0])
        if not shapes or data.optional(g.on_purpose(*GROUPINGS), "grouping", GROUPINGS[0]) == GROUPINGS[0]:
            return config
        return self.with_geometry(data, config, shapes, "grouped geometry")
