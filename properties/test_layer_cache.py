"""SPEC §3 and §6: the layer-bound cache, driven at random, agrees with the oracle after every step.

One machine, run once per RoPE pairing and per attention kind (MHA; GQA/MQA),
so the pairings are never mixed within a run and xdist can spread the runs.
"""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from properties import selection
from properties.layer_cache import LayerCacheMachine
from properties.protocol import Capability


@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("style", ["interleaved", "half_split"])
def test_layer_cache_conforms(style: str, grouped: bool) -> None:
    adapter = selection.selected()
    required = [Capability(f"rope_{style}")] + ([Capability.GQA] if grouped else [])
    missing = [c.value for c in required if c.value not in adapter.capabilities]
    if missing:
        pytest.skip(f"{adapter.name} does not declare {', '.join(missing)}")
    numbers = selection.oracle_numbers()
    run_state_machine_as_test(lambda: LayerCacheMachine(adapter, numbers=numbers, style=style, grouped=grouped))
