"""After tox: each failed env's failing command and the end of its output, from tox's --result-json journal."""

from __future__ import annotations

import json
import sys

LINES = 40  # per failed env: enough for a traceback or pytest's short summary


def main(journal: str) -> int:
    try:
        document = json.loads(open(journal).read())
    except (OSError, ValueError):
        return 0  # tox stopped before writing it; its own output says why
    for name, env in document.get("testenvs", {}).items():
        if env.get("result", {}).get("success", True):
            continue
        failing = [step for step in env.get("setup", []) + env.get("test", []) if step.get("retcode")]
        for step in failing[-1:]:
            text = (step.get("output") or "") + (step.get("err") or "")
            print(f"\n=== {name} failed: {' '.join(step.get('command', []))} (exit {step.get('retcode')})")
            print("\n".join([line for line in text.splitlines() if line.strip()][-LINES:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
