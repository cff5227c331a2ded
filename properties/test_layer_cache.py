"""docs/spec.md §4-6 and §11: the layer-bound cache, driven at random, agrees with the oracle after every step.

One machine, run once per position convention (the two RoPE pairings, and
"none" for positionless layers) and per attention kind (MHA; GQA/MQA), so
conventions are never mixed within a run and xdist can spread the runs.
"""

from __future__ import annotations

import pytest
from kvcache_conformance.protocol.kinds import Capability
from kvcache_conformance.run.runner import PropertyRun


@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("style", ["interleaved", "half_split", "none"])
def test_layer_cache_conforms(style: str, grouped: bool, conformance: PropertyRun) -> None:
    conformance.require("positionless" if style == "none" else f"rope_{style}", *([Capability.GQA] if grouped else []))
    conformance.run("layer_cache", style=style, grouped=grouped)
