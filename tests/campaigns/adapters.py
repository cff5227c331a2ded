"""Implementations the campaign tests run, importable by spec (``tests.campaigns.adapters:OffOnInterleavedMha``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from impl.conformance import ReferenceAdapter


class OffOnInterleavedMha(ReferenceAdapter):
    """Off by 1e-6 with interleaved RoPE and as many KV heads as heads only: one property of all fails."""

    name = "campaign-test-off-on-interleaved-mha"

    def step(self, layer: Any, cache: Any, x: np.ndarray) -> np.ndarray:
        output = super().step(layer, cache, x)
        if layer.rope.style == "interleaved" and layer.heads == layer.kv_heads:
            return output + 1e-6
        return output


class FixedOffOnInterleavedMha(ReferenceAdapter):
    """The same implementation, a later version that fixed the bug."""

    name = OffOnInterleavedMha.name
    version = "9.9-fixed"
