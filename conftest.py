"""pytest wiring: which implementation, which oracle, which Hypothesis profile.

``--kv-impl module:factory`` (or ``KVCACHE_IMPL``) picks the implementation,
``--oracle float64|mpmath`` the ground truth the machines compare with,
``--hypothesis-profile`` (or ``HYPOTHESIS_PROFILE``) one of
``properties/profiles.py``. Every pytest process -- each xdist worker too --
resolves them here, once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

from properties import profiles, selection
from properties.strategies import TOLERANCE

ROOT = Path(__file__).parent
DATABASE_ROOT = ROOT / ".hypothesis" / "implementations"

profiles.register()
profiles.load()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvcache", "KV-cache conformance suite")
    group.addoption(selection.OPTION, default=None, metavar="MODULE:FACTORY",
                    help=f"adapter factory of the implementation under test "
                         f"(default: ${selection.ENV_VAR} or {selection.DEFAULT_SPEC})")
    group.addoption("--oracle", default="float64", choices=selection.ORACLES,
                    help="ground truth for the machines: float64, or mpmath high precision (slow)")


@pytest.hookimpl(trylast=True)  # after Hypothesis has loaded --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    try:
        adapter = selection.configure(config.getoption(selection.OPTION), config.getoption("--oracle"))
    except selection.AdapterLoadError as error:
        raise pytest.UsageError(str(error)) from None
    profiles.register(DATABASE_ROOT, selection.database_key(adapter))
    profiles.load()


def pytest_report_header(config: pytest.Config) -> list[str]:
    adapter = selection.selected()
    current = settings.default
    return [
        f"kvcache implementation: {adapter.name} {adapter.version} ({selection.selected_spec()})",
        f"kvcache capabilities: {', '.join(sorted(adapter.capabilities))}",
        f"kvcache tolerance: {TOLERANCE:.0e} absolute against the {selection.oracle_name()} oracle",
        f"kvcache hypothesis profile: {settings.get_current_profile_name()} "
        f"(max_examples={current.max_examples}, stateful_step_count={current.stateful_step_count}, "
        f"derandomize={current.derandomize}, database={current.database})",
    ]
