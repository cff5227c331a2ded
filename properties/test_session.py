"""SPEC §4 and §6: the decode session, driven at random, equals full recomputation after every step."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from properties import selection
from properties.protocol import Capability
from properties.session import SessionMachine


def test_decode_session_conforms() -> None:
    adapter = selection.selected()
    if Capability.DECODE_SESSION.value not in adapter.capabilities:
        pytest.skip(f"{adapter.name} does not declare {Capability.DECODE_SESSION.value}")
    numbers = selection.oracle_numbers()
    run_state_machine_as_test(lambda: SessionMachine(adapter, numbers=numbers))  # type: ignore[arg-type]
