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

from ..generate.needs import Needs
from ..oracle import FLOAT64, NumberSystem
from .layer_steps import LayerSteps, layer_needs


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
