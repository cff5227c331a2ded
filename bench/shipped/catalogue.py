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


RUN_FIELDS = ("adapter", "install")  # required of a `run` table; tests, torch, python, env, known have defaults
PATTERN_FIELDS = ("property", "kind", "rule", "check", "changed")


class CatalogueError(ValueError):
    """An entry of the catalogue lacks a field or holds one of the wrong kind."""


@dataclass(frozen=True)
class CausePattern:
    """A cause of a report (``--kv-report``'s ``causes``) by its identity, never its message: the property's
    function name (with its parameters, ``test_cache_operations_conform[window]``, to name one of its instances), the
    failure kind, and optionally the rule it was met in, the claimed check and what a call that raised changed."""

    property: str
    kind: str  # alternatives apart by " | ": one bug may fail one call in two ways (a raise that also wrote)
    rule: str | None = None
    check: str | None = None
    # what a call that raised changed, comma-separated as the report lists it; alternatives apart by " | "
    changed: str | None = None
    why: str | None = None  # for a known cause: what it is (a published finding, another bug)

    def matches(self, cause: dict[str, Any]) -> bool:
        return (self._names_property_of(cause) and cause["kind"] in self.kind.split(" | ")
                and (self.rule is None or self.rule in (cause.get("rules") or [cause.get("rule")]))
                and (self.check is None or cause.get("check") == self.check)
                and (self.changed is None or ", ".join(cause.get("changed") or []) in self.changed.split(" | ")))

    def _names_property_of(self, cause: dict[str, Any]) -> bool:
        if "[" not in self.property:  # the function: any of its instances
            return bool(cause["property"].rsplit("::", 1)[-1] == self.property)
        return any(instance.rsplit("::", 1)[-1] == self.property for instance in cause.get("instances") or ())

    def described(self) -> str:
        return " ".join(f"{name} {getattr(self, name)!r}" for name in PATTERN_FIELDS if getattr(self, name))


@dataclass(frozen=True)
class Run:
    """How the benchmark runs an entry: the same for both releases."""

    adapter: str  # module:factory, as for --kv-impl
    install: tuple[str, ...]  # pip requirements of the release's environment, "{version}" filled in per release
    tests: tuple[str, ...] = ("properties",)  # what pytest is given: the plain command's, or the part that applies
    torch: bool = False  # the environment's base has torch 2.13.0
    python: str = "3.11"
    known: tuple[CausePattern, ...] = ()  # causes the fixed release may still show: other findings, not this bug
    # environment variables of both the install and the run, as (name, value) pairs: only what a package needs
    # to install or import at all (hqq 0.2.8.post1's sdist builds CUDA kernels unless DISABLE_CUDA=1)
    env: tuple[tuple[str, str], ...] = ()


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
    run: Run | None = None  # None: the benchmark cannot run it here (status says why)
    cause: CausePattern | None = None  # how a report shows this bug (every runnable entry has one)


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


def _pattern(table: Any, where: str) -> CausePattern:
    if not isinstance(table, dict) or not {"property", "kind"} <= set(table) or \
            not set(table) <= {*PATTERN_FIELDS, "why"}:
        raise CatalogueError(f"{where}: a cause is a table with property and kind, and optionally rule, check, "
                             "changed, why; "
                             f"got {table!r}")
    return CausePattern(**{name: _text(table, name, where) for name in table})


def _run(entry: dict[str, Any], where: str) -> tuple[Run | None, CausePattern | None]:
    """The entry's `run` table, and its `cause` (required of a runnable entry expected caught)."""
    given = entry.get("cause")
    cause = None if given is None else _pattern(given, f"{where}.cause")
    table = entry.get("run")
    if table is None:
        return None, cause
    if not isinstance(table, dict) or not set(RUN_FIELDS) <= set(table):
        raise CatalogueError(f"{where}: `run` must be a table with {', '.join(RUN_FIELDS)}")
    lists = {name: table.get(name, default) for name, default in (("install", None), ("tests", ["properties"]),
                                                                   ("known", []))}
    for name, value in lists.items():
        if not isinstance(value, list) or (name != "known" and not all(isinstance(v, str) and v for v in value)):
            raise CatalogueError(f"{where}: `run.{name}` must be a list" + ("" if name == "known" else " of strings"))
    if not isinstance(table.get("torch", False), bool):
        raise CatalogueError(f"{where}: `run.torch` must be true or false")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(name, str) and name and isinstance(value, str)
                                            for name, value in env.items()):
        raise CatalogueError(f"{where}: `run.env` must be a table of environment variables to strings")
    run = Run(_text(table, "adapter", f"{where}.run"), tuple(lists["install"]), tuple(lists["tests"]),
              table.get("torch", False), str(table.get("python", "3.11")),
              tuple(_pattern(known, f"{where}.run.known") for known in lists["known"]), tuple(sorted(env.items())))
    if cause is None and entry["expect"]["outcome"] == "caught":
        raise CatalogueError(f"{where}: a runnable entry expected caught needs `cause`: how its report shows it")
    return run, cause


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
                  {name: _text(status, name, f"{where}.status") for name in STATUS_FIELDS},
                  *_run(entry, where))
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
