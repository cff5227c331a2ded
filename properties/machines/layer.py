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
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from .. import generate as g
from ..generate.needs import Needs
from ..oracle import FLOAT64, NumberSystem
from ..traces.recording import Draws, NotApplicable
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
        rope = config.rope
        shapes = [shape for shape in g.geometries(self.capabilities, self.limits, grouped=True, rope=rope is not None)
                  if 2 <= shape[1] < shape[0] and (rope is None or rope.rotary_width <= shape[2])]
        shapes = [shape for shape in shapes if shape[2] == weights.head_width] or shapes
        if not shapes or data.optional(g.on_purpose(*GROUPINGS), "grouping", GROUPINGS[0]) == GROUPINGS[0]:
            return config
        heads, kv_heads, head_width, widths = data.draw(st.sampled_from(shapes), label="grouped geometry")
        if rope is not None and rope.rotary_width == weights.head_width:
            rope = replace(rope, rotary_width=head_width)  # still every feature: partial rotary only where declared
        if self.limits.cache_problem(config.batch_size, config.capacity,
                                     None if rope is None else rope.rotary_width) is not None:
            return config
        width = data.draw(st.sampled_from(widths), label="model_width")
        outside = self.limits.geometry_problem(width, heads, head_width)
        if outside:  # (only a replayed geometry can be: the draw stays within the limits)
            raise NotApplicable(f"the recorded grouped geometry is outside this implementation's layer_limits: "
                                f"{outside}")
        return replace(config, weights=data.draw(g.attention_weights(width, heads, kv_heads, head_width)), rope=rope)
