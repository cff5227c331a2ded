"""scripts/failed-envs.py: what CI's log shows of a failed tox env, whose output is cut to its end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "failed-envs.py"

OUTPUT = """collected 3 items
=================================== FAILURES ===================================
_____________________ test_the_wrongly_declared_twin_fails[x] _____________________

    def test_the_wrongly_declared_twin_fails(name):
>       assert result.failure.kind.startswith(kind), result.failure
E       AssertionError: append past the room: raised RopePositionOutOfRange
E       assert False
""" + "\n".join(f"exercise line {i}" for i in range(100)) + """
=========================== short test summary info ============================
FAILED tests/test_lattice.py::test_the_wrongly_declared_twin_fails[x]
==== 1 failed, 2 passed in 3.00s ====
"""


def test_a_failed_env_shows_each_failing_tests_message_and_the_end_of_its_output(tmp_path: Path) -> None:
    journal = tmp_path / "journal.json"
    journal.write_text(json.dumps({"testenvs": {
        "py311": {"result": {"success": False}, "test": [{"retcode": 1, "command": ["pytest"], "output": OUTPUT}]},
        "lint": {"result": {"success": True}, "test": [{"retcode": 0, "command": ["ruff"], "output": "fine"}]}}}))
    shown = subprocess.run([sys.executable, str(SCRIPT), str(journal)], capture_output=True, text=True,
                           check=True).stdout
    assert "=== py311 failed: pytest (exit 1)" in shown and "lint" not in shown
    assert "E       AssertionError: append past the room: raised RopePositionOutOfRange" in shown
    assert shown.index("RopePositionOutOfRange") < shown.index("exercise line 99")  # before the output's end
    assert "exercise line 50" not in shown  # the middle of the output is left out
    assert "==== 1 failed, 2 passed in 3.00s ====" in shown
