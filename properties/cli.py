"""The ``kvcache-conformance`` command, for people who do not think in pytest.

    kvcache-conformance run --impl MODULE:FACTORY [pytest arguments]   the suite, then where the report went
    kvcache-conformance replay TRACE... [--kv-impl MODULE:FACTORY]     replay counterexample traces
    kvcache-conformance campaign [run|prune|publish] ...               campaigns past one machine (docs/campaigns.md)
    kvcache-conformance rules [--markdown]                             every machine's rule names (for --kv-xfails)

``run`` is ``pytest --pyargs kvcache_conformance --kv-impl MODULE:FACTORY``
from the current directory (an adapter module there is found, as with
``python -m pytest``), with ``--kv-report kvcache-report.json`` unless you name
another; everything else is handed to pytest as it is (``-n auto``, ``-x``,
``--kv-xfails FILE``, ``--hypothesis-profile ci`` ...).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_REPORT = "kvcache-report.json"
PACKAGE = "kvcache_conformance"


def run(argv: list[str]) -> int:
    import pytest

    parser = argparse.ArgumentParser(prog="kvcache-conformance run", add_help=False,
                                     description="run the suite against MODULE:FACTORY; the rest goes to pytest")
    parser.add_argument("--impl", default=None, metavar="MODULE:FACTORY")
    parser.add_argument("--help", "-h", action="store_true")
    options, rest = parser.parse_known_args(argv)
    if options.help:
        print(__doc__.split("\n\n")[1])
        print(__doc__.split("\n\n")[2])
        return 0
    impl = options.impl or os.environ.get("KVCACHE_IMPL")
    if not impl and not any(a.startswith("--kv-impl") for a in rest):
        print("kvcache-conformance run: name the implementation: --impl MODULE:FACTORY (or KVCACHE_IMPL)",
              file=sys.stderr)
        return 4  # pytest's own exit status for a usage error
    report = next((a.split("=", 1)[1] if "=" in a else rest[i + 1] for i, a in enumerate(rest)
                   if a.startswith("--kv-report")), None)
    # This command imported the package before pytest could mark it for assertion rewriting (it is a plugin's
    # distribution), and pytest would warn. Harmless: the test files are rewritten as they are collected, and the
    # rest judges with its own checks, not bare asserts.
    quiet = ["-W", "ignore:Module already imported so cannot be rewritten:pytest.PytestAssertRewriteWarning"]
    arguments = [*quiet, "--pyargs", PACKAGE, *([f"--kv-impl={impl}"] if impl else []), *rest]
    if report is None:
        report = DEFAULT_REPORT
        arguments.append(f"--kv-report={report}")
    status = int(pytest.main(arguments))
    written = Path(report).resolve()
    if written.exists():
        print(f"kvcache-conformance: report {written} and {written.with_suffix('.md')}")
    return status


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = ("run", "replay", "campaign", "rules")
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 4
    command, rest = argv[0], argv[1:]
    if command == "run":
        return run(rest)
    if command == "replay":
        from .traces.replay import main as replay

        return replay(rest)
    if command == "campaign":
        from .campaign.command import main as campaign

        return campaign(rest)
    from .run import catalogue

    print(catalogue.markdown() if "--markdown" in rest else catalogue.plain(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
