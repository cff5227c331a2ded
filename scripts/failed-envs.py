"""After tox: each failed env's failing command and the end of its output, from tox's --result-json journal."""

from __future__ import annotations

import json
import sys

LINES = 40  # per failed env: enough for a traceback or pytest's short summary
WHY_LINES = 60  # per failed env: each failing test's header and pytest's "E" lines (its assertion's message)


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
            why = reasons(text)
            if why:
                print("\n".join(why[:WHY_LINES]))
                print("...")
            print("\n".join([line for line in text.splitlines() if line.strip()][-LINES:]))
    return 0


def reasons(text: str) -> list[str]:
    """From pytest's FAILURES section: each failing test's header line and its "E" lines, which a log cut to its
    last lines loses (the short summary drops a message that does not fit the line)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("=") and " FAILURES " in line)
    except StopIteration:
        return []
    found = []
    for line in lines[start + 1:]:
        if line.startswith("=") and line.endswith("="):  # the next section
            break
        if line.startswith("____") or line.startswith("E "):
            found.append(line[:400])
    return found


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
