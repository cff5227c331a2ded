"""``--kv-xfails FILE``: known failures, baselined so that everything else is still judged.

One entry a line; blank lines and lines starting with ``#`` are ignored::

    # PROPERTY [:: RULE]  # REASON
    properties/test_prefix_store.py::test_prefix_store_conforms[sliding-window]  # windows not implemented (#12)
    properties/test_layer_cache.py::test_layer_cache_conforms[*] :: reset        # reset zeroes the buffers (#14)

``PROPERTY`` matches every test whose pytest node id contains it, ``*``
standing for any run of characters (brackets are literal: node ids hold
their parameters in them). A property matched without a rule is expected to
fail (pytest's ``xfail``, strict: if it passes, the run fails with XPASS --
the bug is fixed, remove the line). With ``:: RULE``, that rule of the
property's state machine is never drawn and the property is judged as usual
without it: the rest of the machine still finds other failures. The reason
is required. An entry matching no collected test is an error, unless its
``PROPERTY`` starts with the path of a test file (from the suite's root)
that this run did not collect. ``-k``/``-m`` deselection does not count:
entries are matched before it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from .identity import PACKAGE_DIR, PREFIX, canonical

OPTION = "--kv-xfails"
FORMER_IDS = "kv_former_ids"  # a marker: the parametrised properties a property replaced, {suffix: parameters}
LEFT_OUT = pytest.StashKey[dict[str, "Entry"]]()  # on an item: rule name -> the entry leaving it out
FAMILY_RULES = pytest.StashKey[dict[tuple[str, str], "Entry"]]()  # (former id's suffix, rule) -> entry
FAMILIES_KNOWN = pytest.StashKey[dict[str, "Entry"]]()  # former id's suffix -> the entry expecting it to fail
_LINE = re.compile(r"^(?P<property>\S+)(?:\s+::\s+(?P<rule>\S+))?$")


class KnownFailuresError(ValueError):
    """The file cannot be read, or a line of it is malformed (the message names the line)."""


@dataclass(frozen=True)
class Entry:
    pattern: str
    rule: str | None
    reason: str
    where: str  # FILE:LINE

    def matches(self, nodeid: str) -> bool:
        return _regex(self.pattern).search(nodeid) is not None

    @property
    def file(self) -> str | None:
        """The test file the pattern starts with, if it names one exactly (no wildcard before ``::``)."""
        head, separator, _ = self.pattern.partition("::")
        return head if separator and "*" not in head else None

    def describe(self) -> str:
        return f"{self.reason} ({OPTION} {self.where})"


def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def parse(text: str, source: str, rules: Iterable[str] = (), setup_rules: Iterable[str] = ()) -> list[Entry]:
    """The entries of a known-failures file; ``rules`` are the machines' rule names (empty: not checked)."""
    known, setup = frozenset(rules), frozenset(setup_rules)
    entries: list[Entry] = []
    seen: dict[tuple[str, str | None], str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        where = f"{source}:{number}"
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        comment = re.search(r"\s#", line)
        body, reason = (line[:comment.start()], line[comment.end():].strip()) if comment else (line, "")
        if not reason:
            raise KnownFailuresError(f"{where}: {raw.strip()!r}: every entry needs a reason: "
                                     "PROPERTY [:: RULE]  # REASON")
        found = _LINE.match(body.strip())
        if found is None:
            raise KnownFailuresError(f"{where}: {body.strip()!r}: expected PROPERTY or PROPERTY :: RULE "
                                     "(a node id or part of one, * for any characters; no spaces)")
        pattern, rule = found["property"], found["rule"]
        if not pattern.strip("*"):
            raise KnownFailuresError(f"{where}: {pattern!r} would match every test")
        if "::" in pattern and pattern.endswith("::"):
            raise KnownFailuresError(f"{where}: {pattern!r} ends with '::'; a rule is written PROPERTY :: RULE")
        if rule is not None and known:
            if rule in setup:
                raise KnownFailuresError(f"{where}: {rule!r} is a machine's set-up; it cannot be left out")
            if rule not in known:
                raise KnownFailuresError(f"{where}: no machine has a rule {rule!r}; the rules: "
                                         f"{', '.join(sorted(known))}")
        if (pattern, rule) in seen:
            raise KnownFailuresError(f"{where}: repeats {seen[pattern, rule]}")
        seen[pattern, rule] = where
        entries.append(Entry(pattern, rule, reason, where))
    return entries


def load(path: Path, rules: Iterable[str] = (), setup_rules: Iterable[str] = ()) -> list[Entry]:
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise KnownFailuresError(f"{OPTION} {path}: cannot read it: {error}") from error
    return parse(text, str(path), rules, setup_rules)


def left_out(node: Any) -> dict[str, Entry]:
    """The rules a known-failures entry leaves out of this test's machine, by name."""
    return dict(node.stash.get(LEFT_OUT, {}))


def former_ids(node: Any) -> dict[str, dict[str, Any]]:
    """The parametrised properties this test replaced: ``{suffix: machine parameters}`` -- their node ids were
    this test's followed by ``[suffix]``."""
    marker = node.get_closest_marker(FORMER_IDS) if hasattr(node, "get_closest_marker") else None
    return dict(marker.args[0]) if marker is not None else {}


def family_rules(node: Any) -> dict[tuple[str, str], Entry]:
    """(former id's suffix, rule): the rules an entry naming a former id leaves out for that part only."""
    return dict(node.stash.get(FAMILY_RULES, {}))


def families_known(node: Any) -> dict[str, Entry]:
    """Former ids' suffixes an entry expects to fail: left out of the draws, and run on their own (strictly)."""
    return dict(node.stash.get(FAMILIES_KNOWN, {}))


class KnownFailures:
    """A pytest plugin: marks what the entries match, in every process that collects (each xdist worker)."""

    def __init__(self, path: Path, entries: list[Entry]) -> None:
        self.path, self.entries = path, entries

    @pytest.hookimpl(tryfirst=True)  # before -k/-m deselect: an entry for a deselected test is no typo
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        matched: set[Entry] = set()
        errors: list[str] = []
        for item in items:
            name = canonical(item.nodeid)  # entries name properties as the clone does, wherever they were collected
            found = [entry for entry in self.entries if entry.matches(name)]
            matched.update(found)
            former = {f"{name}[{suffix}]": suffix for suffix in former_ids(item)}
            by_former = [(entry, suffix) for entry in self.entries if entry not in found
                         for nodeid, suffix in former.items() if entry.matches(nodeid)]
            matched.update(entry for entry, _ in by_former)
            known = {suffix: entry for entry, suffix in by_former if entry.rule is None}
            whole = [entry for entry in found if entry.rule is None]
            if former and set(known) == set(former.values()):  # every part expected to fail: the whole test
                whole += list(dict.fromkeys(known.values()))
                known = {}
            if whole:
                reason = "; ".join(entry.describe() for entry in whole)
                item.add_marker(pytest.mark.xfail(reason=f"known failure: {reason}", strict=True))
                item.user_properties.append(("kv_known_failure", reason))
            rules = {entry.rule: entry for entry in found if entry.rule is not None}
            narrowed = {(suffix, entry.rule): entry for entry, suffix in by_former if entry.rule is not None}
            if rules or narrowed or known:
                if "conformance" not in getattr(item, "fixturenames", ()):
                    errors += [f"{OPTION} {entry.where}: {name} runs no state machine; only a machine "
                               "property can leave a rule out" for entry in [*rules.values(), *narrowed.values()]]
                item.stash[LEFT_OUT] = rules
                item.stash[FAMILY_RULES] = narrowed
                item.stash[FAMILIES_KNOWN] = known
                if rules:
                    item.user_properties.append(("kv_rules_left_out",
                                                 {rule: entry.describe() for rule, entry in sorted(rules.items())}))
                if narrowed:
                    item.user_properties.append(("kv_rules_left_out_of", {
                        f"{suffix} :: {rule}": entry.describe() for (suffix, rule), entry in sorted(narrowed.items())}))
                if known:
                    item.user_properties.append(("kv_parts_known_to_fail",
                                                 {suffix: entry.describe() for suffix, entry in sorted(known.items())}))
        collected = {canonical(item.nodeid).partition("::")[0] for item in items}
        unmatched = [entry for entry in self.entries if entry not in matched
                     and not (entry.file and entry.file not in collected and _exists(config, entry.file))]
        errors += [f"{OPTION} {entry.where}: {entry.pattern!r} matches no collected test (a typo?)"
                   for entry in unmatched]
        if errors:
            # A collection error, not a UsageError: raised in an xdist worker, that would only kill the
            # worker; a failed collect report reaches the controller, is shown, and nothing runs.
            items[:] = []
            config.hook.pytest_collectreport(report=pytest.CollectReport(
                nodeid=str(self.path), outcome="failed", longrepr="\n".join(dict.fromkeys(errors)), result=[]))


def _exists(config: pytest.Config, file: str) -> bool:
    """Whether an entry's file is a test file of the run's root, or one of the suite's own properties."""
    if (config.rootpath / file).is_file():
        return True
    head, _, name = file.partition("/")
    return head == PREFIX and (PACKAGE_DIR / name).is_file()
