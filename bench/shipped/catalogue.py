"""Read and check the catalogue of shipped KV-cache bugs (bench/shipped/catalogue.toml).

    python -m bench.shipped.catalogue              # one line per bug, then the counts
    python -m bench.shipped.catalogue --library mlx-lm

A malformed entry is a ``CatalogueError`` naming the entry and the field: the runner reads only checked
entries. The fields are described in bench/shipped/README.md.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

CATALOGUE = Path(__file__).with_name("catalogue.toml")
OUTCOMES = ("caught", "miss")  # what the entry expects the plain command to report on the buggy release
RELEASE_FIELDS = ("version", "python", "torch")
STATUS_FIELDS = ("versions", "fix_read", "run")
SECTION = re.compile(r"^\d+(\.\d+)?$")  # a section of docs/spec.md, "13.5" or "6"


class CatalogueError(ValueError):
    """An entry of the catalogue lacks a field or holds one of the wrong kind."""


@dataclass(frozen=True)
class Release:
    version: str
    python: str
    torch: str  # what the release needs of torch (or of its backend), and whether 2.13.0 can serve it


@dataclass(frozen=True)
class Bug:
    id: str
    library: str
    buggy: Release  # the last release with the bug
    fixed: Release  # the first release with the fix
    issue: str
    fix: str
    what: str
    spec: tuple[str, ...]
    expect: dict[str, str]  # outcome "caught" (property, rule, check) or "miss" (why)
    status: dict[str, str]  # versions, fix_read, run: what was verified, honestly


def _text(entry: dict[str, Any], field: str, where: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str) or not value.strip():
        raise CatalogueError(f"{where}: `{field}` must be a non-empty string, got {value!r}")
    return value


def _release(entry: dict[str, Any], field: str, where: str) -> Release:
    table = entry.get(field)
    if not isinstance(table, dict):
        raise CatalogueError(f"{where}: `{field}` must be a table with {', '.join(RELEASE_FIELDS)}")
    return Release(*(_text(table, name, f"{where}.{field}") for name in RELEASE_FIELDS))


def _expect(entry: dict[str, Any], where: str) -> dict[str, str]:
    table = entry.get("expect")
    if not isinstance(table, dict) or table.get("outcome") not in OUTCOMES:
        raise CatalogueError(f"{where}: `expect.outcome` must be one of {', '.join(OUTCOMES)}")
    needed = ("property", "rule", "check") if table["outcome"] == "caught" else ("why",)
    for name in needed:
        _text(table, name, f"{where}.expect")
    return {name: str(value) for name, value in table.items()}


def parse(document: dict[str, Any]) -> list[Bug]:
    """The checked entries of a parsed catalogue, in file order."""
    entries = document.get("bug")
    if not isinstance(entries, list) or not entries:
        raise CatalogueError("the catalogue holds no [[bug]] entries")
    bugs: list[Bug] = []
    for index, entry in enumerate(entries):
        where = f"bug {index + 1} ({entry.get('id', 'no id')})"
        sections = entry.get("spec")
        if not isinstance(sections, list) or not all(isinstance(s, str) and SECTION.match(s) for s in sections):
            raise CatalogueError(f"{where}: `spec` must list sections of docs/spec.md such as \"13.5\" ([] for none)")
        status = entry.get("status")
        if not isinstance(status, dict):
            raise CatalogueError(f"{where}: `status` must be a table with {', '.join(STATUS_FIELDS)}")
        bug = Bug(_text(entry, "id", where), _text(entry, "library", where), _release(entry, "buggy", where),
                  _release(entry, "fixed", where), _text(entry, "issue", where), _text(entry, "fix", where),
                  _text(entry, "what", where), tuple(sections), _expect(entry, where),
                  {name: _text(status, name, f"{where}.status") for name in STATUS_FIELDS})
        if bug.buggy.version == bug.fixed.version:
            raise CatalogueError(f"{where}: the buggy and the fixed release are the same, {bug.buggy.version}")
        bugs.append(bug)
    duplicated = [name for name, count in Counter(bug.id for bug in bugs).items() if count > 1]
    if duplicated:
        raise CatalogueError(f"ids used twice: {', '.join(duplicated)}")
    return bugs


def load(path: Path = CATALOGUE) -> list[Bug]:
    with path.open("rb") as stream:
        return parse(tomllib.load(stream))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shipped.catalogue", description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", default=None, help="only this library's entries")
    options = parser.parse_args(argv)
    bugs = [bug for bug in load() if options.library in (None, bug.library)]
    for bug in bugs:
        sections = ", ".join(f"§{s}" for s in bug.spec) or "no section"
        print(f"{bug.id:46} {bug.library:17} {bug.buggy.version:>7} -> {bug.fixed.version:<7} "
              f"{bug.expect['outcome']:6} {sections:22} run: {bug.status['run'][:60]}")
    libraries = Counter(bug.library for bug in bugs)
    outcomes = Counter(bug.expect["outcome"] for bug in bugs)
    print(f"{len(bugs)} bugs from {len(libraries)} libraries ("
          + ", ".join(f"{name} {count}" for name, count in libraries.most_common())
          + f"); expected: {outcomes['caught']} caught, {outcomes['miss']} missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
