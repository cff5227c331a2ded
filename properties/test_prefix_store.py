"""SPEC §5 and §6: the prefix store, driven at random, reuses exactly what the rules allow and
always equals full recomputation; once with full attention, once with sliding windows."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from properties import selection
from properties.prefix_store import PrefixStoreMachine
from properties.protocol import Capability


@pytest.mark.parametrize("windowed", [False, True], ids=["full-attention", "sliding-window"])
def test_prefix_store_conforms(windowed: bool) -> None:
    adapter = selection.selected()
    required = [Capability.PREFIX_STORE] + ([Capability.SLIDING_WINDOW] if windowed else [])
    missing = [c.value for c in required if c.value not in adapter.capabilities]
    if missing:
        pytest.skip(f"{adapter.name} does not declare {', '.join(missing)}")
    numbers = selection.oracle_numbers()
    run_state_machine_as_test(
        lambda: PrefixStoreMachine(adapter, numbers=numbers, windowed=windowed))  # type: ignore[arg-type]
