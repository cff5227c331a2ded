"""One property's share of an implementation's example database.

Each implementation has its own database (``.hypothesis/implementations/<name>``,
conftest.py); within it, each machine property keeps its own keys, so that a
failure saved by one property is never replayed -- and deleted -- by another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase

from . import trace


class PropertyDatabase(ExampleDatabase):
    """One property's share of an implementation's example database: every key prefixed with its own digest.

    Hypothesis keys a state machine's examples by a digest of the factory it is
    handed, and ``run_machine`` hands it the same ``build`` every time: without
    this, all machine properties of an implementation shared one key, so a
    failure saved by the store machine was replayed by the layer machine, passed
    there and was deleted. The prefix is a digest of (implementation, property
    id, parameters, rules left out); the last because a choice sequence means
    another program once a rule is no longer drawn.

    A key prefix rather than a directory per property: it wraps whatever
    database the profile or the caller's settings hold (a directory, a
    ``MultiplexedDatabase`` sharing CI's examples, a ``ReadOnlyDatabase``), and
    ``.hypothesis/implementations/<name>`` stays one Hypothesis database.
    """

    def __init__(self, database: ExampleDatabase, prefix: bytes) -> None:
        super().__init__()
        self.database, self.prefix = database, prefix

    def __repr__(self) -> str:
        return f"PropertyDatabase({self.database!r}, {self.prefix!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PropertyDatabase) and (self.database, self.prefix) == (other.database, other.prefix)

    def __hash__(self) -> int:
        return hash(self.prefix)

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(self.prefix + key, value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.database.fetch(self.prefix + key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(self.prefix + key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.database.move(self.prefix + src, self.prefix + dest, value)

    def _start_listening(self) -> None:
        self.database.add_listener(self._forward)

    def _stop_listening(self) -> None:
        self.database.remove_listener(self._forward)

    def _forward(self, event: tuple[str, tuple[bytes, bytes | None]]) -> None:
        what, (key, value) = event
        if key.startswith(self.prefix):
            self._broadcast_change((what, (key[len(self.prefix):], value)))  # type: ignore[arg-type]


def database_prefix(implementation: str, property_id: str, parameters: dict[str, Any],
                    disabled_rules: Iterable[str] = ()) -> bytes:
    """The key prefix of one property's examples (``PropertyDatabase``)."""
    identity = json.dumps([implementation, property_id, {k: trace.encode(v) for k, v in parameters.items()},
                           sorted(disabled_rules)], sort_keys=True)
    return b"kvcache-property:" + hashlib.sha256(identity.encode()).hexdigest()[:20].encode() + b":"


def property_settings(settings: Settings, *, implementation: str, property_id: str, parameters: dict[str, Any],
                      disabled_rules: Iterable[str] = ()) -> Settings:
    """``settings`` with the database narrowed to this property's keys (unchanged without a database)."""
    if settings.database is None:
        return settings
    prefix = database_prefix(implementation, property_id, parameters, disabled_rules)
    return Settings(settings, database=PropertyDatabase(settings.database, prefix))
