"""docs/spec.md §13: chunked append, truncation, batch reorder and forks, interleaved with every step of the
layer machine, agree with the oracle after every step; and the same on a sliding-window cache.

Two runs: one RoPE pairing with GQA where declared (the operations do not depend on the pairing, which the
layer machine covers), and one windowed. Each operation is drawn only where its capability is declared.
"""

from __future__ import annotations

import pytest
from kvcache_conformance.protocol.kinds import Capability, declared
from kvcache_conformance.run.runner import PropertyRun

OPERATIONS = (Capability.CHUNKED_APPEND, Capability.TRUNCATE, Capability.BATCH_REORDER, Capability.FORK)


@pytest.mark.parametrize("windowed", [False, True], ids=["full", "window"])
def test_cache_operations_conform(windowed: bool, conformance: PropertyRun) -> None:
    capabilities = declared(conformance.adapter.capabilities)
    if windowed:
        conformance.require(Capability.SLIDING_WINDOW_LAYER)
    elif not any(c.value in capabilities for c in OPERATIONS):
        pytest.skip(f"{conformance.adapter.name} declares none of {', '.join(c.value for c in OPERATIONS)}")
    styles = [s for s in ("half_split", "interleaved", "none")
              if (f"rope_{s}" if s != "none" else "positionless") in capabilities]
    if not styles:
        pytest.skip(f"{conformance.adapter.name} drives no layer caches (no RoPE pairing, not positionless)")
    conformance.run("cache_operations", style=styles[0], grouped=None, windowed=windowed)
