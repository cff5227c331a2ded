"""SPEC §3 and §6: the layer-bound cache, driven at random, agrees with the oracle after every step.

One machine, run once per RoPE pairing and per attention kind (MHA; GQA/MQA),
so the pairings are never mixed within a run and xdist can spread the runs.
"""

from __future__ import annotations

import pytest

from properties.protocol import Capability
from properties.runner import PropertyRun


@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("style", ["interleaved", "half_split"])
def test_layer_cache_conforms(style: str, grouped: bool, conformance: PropertyRun) -> None:
    conformance.require(f"rope_{style}", *([Capability.GQA] if grouped else []))
    conformance.run("layer_cache", style=style, grouped=grouped)
