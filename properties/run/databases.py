"""Example databases: one property's share of an implementation's, and the shared one beside it.

Each implementation has its own database (``.hypothesis/implementations/<name>``,
conftest.py); within it, each machine property keeps its own keys, so that a
failure saved by one property is never replayed -- and deleted -- by another.
With ``--kv-db redis://HOST:PORT/N`` a shared Redis database stands beside it:
ordinary runs read it, campaign workers save to it, and only ``prune``
deletes from it (docs/campaigns.md, "Database semantics").
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase, MultiplexedDatabase, ReadOnlyDatabase

from ..traces import codec
from .provenance import suite_release


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
                    disabled_rules: Iterable[str] = (), set_aside: Iterable[str] = ()) -> bytes:
    """The key prefix of one property's examples (``PropertyDatabase``). A search with causes set aside keeps
    its own (Hypothesis deletes a saved example that no longer fails: there, the example of a cause set aside)."""
    identity = _identity(implementation, property_id, parameters, disabled_rules, set_aside)
    return b"kvcache-property:" + hashlib.sha256(identity.encode()).hexdigest()[:20].encode() + b":"


def property_seed(implementation: str, property_id: str, parameters: dict[str, Any],
                  disabled_rules: Iterable[str] = (), set_aside: Iterable[str] = ()) -> int:
    """The seed of one property's derandomised (``ci``) search: of what its database keys are of, and the suite's
    release -- never of any function's source (``runner.MachineFactory``). Another release may draw other
    programs; an edit of the runner may not."""
    identity = _identity(implementation, property_id, parameters, disabled_rules, set_aside)
    digest = hashlib.sha256(f"kvcache-seed:{suite_release()}:{identity}".encode()).digest()
    return int.from_bytes(digest[:16], "big")


def _identity(implementation: str, property_id: str, parameters: dict[str, Any], disabled_rules: Iterable[str],
              set_aside: Iterable[str]) -> str:
    """(implementation, property id, parameters, rules left out, causes set aside), as one text: the
    last two because a choice sequence means another program once a rule is no longer drawn or an example
    meeting a known cause is discarded."""
    key: list[Any] = [implementation, property_id, {k: codec.encode(v) for k, v in parameters.items()},
                      sorted(disabled_rules)]
    aside = sorted(set_aside)
    return json.dumps([*key, aside] if aside else key, sort_keys=True)


def property_settings(settings: Settings, *, implementation: str, property_id: str, parameters: dict[str, Any],
                      disabled_rules: Iterable[str] = (), set_aside: Iterable[str] = ()) -> Settings:
    """``settings`` with the database narrowed to this property's keys (unchanged without a database).

    A ``SuiteDatabase`` narrows its shared part too, by the program length as
    well: a choice sequence means another program under another
    ``stateful_step_count``."""
    if settings.database is None:
        return settings
    prefix = database_prefix(implementation, property_id, parameters, disabled_rules, set_aside)
    if isinstance(settings.database, SuiteDatabase):
        return Settings(settings, database=settings.database.for_property(prefix, settings.stateful_step_count))
    return Settings(settings, database=PropertyDatabase(settings.database, prefix))



class _Wrapping(ExampleDatabase):
    """A database that changes how another is written to: equal when of one kind around equal databases."""

    def __init__(self, database: ExampleDatabase) -> None:
        super().__init__()
        self.database = database

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.database!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.database == other.database  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.database))


class SecondaryOnly(_Wrapping):
    """A database whose saves go to Hypothesis's secondary corpus of each key (reads and deletes unchanged).

    For a run that does not shrink (the look of ``first_failure.py``): Hypothesis takes an interesting example
    from the primary corpus for an already shrunk one and skips shrinking it; from the secondary corpus it
    replays the example and shrinks it."""

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(key if key.endswith(_SUB_KEYS) else key + b".secondary", value)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.database.fetch(key)

    def delete(self, key: bytes, value: bytes) -> None:
        self.database.delete(key, value)

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.database.move(src, dest, value)


_SUB_KEYS = (b".secondary", b".pareto")  # Hypothesis's own sub-keys of a test's key

# -- The shared database (``--kv-db redis://HOST:PORT/N``, docs/campaigns.md) ------------------------------------

SHARED_OPTION = "--kv-db"
SHARED_ENV_VAR = "KVCACHE_DB"
CAMPAIGN_EXTRA = 'pip install -e ".[campaign]"'
KEY_ROOT = b"kvcache-conformance:"  # every key this suite writes to a shared store starts with it
NEVER = timedelta(days=36500)  # RedisExampleDatabase expires keys after 8 idle days by default: only prune deletes
ROLES = ("read", "write", "prune")
_PARETO = b".pareto"  # Hypothesis's sub-key of the examples it keeps for targeting


class SharedDatabaseError(RuntimeError):
    """The shared database cannot be used: a bad URL, the extra not installed, the server unreachable."""


class SharedDatabaseWarning(UserWarning):
    """The shared database went away during a run: the run goes on with its local database."""


@dataclass(frozen=True)
class SharedScope:
    """What names an example in the shared database, besides its property: whose judgement it was.

    The implementation's version is part of every key, and reads span every
    version of the same implementation seen under this suite version (a fix
    replays the counterexamples of the version it fixes); the suite version,
    Hypothesis's major version and the oracle are not spanned: under another
    one, the same choices may mean another program, or another verdict.
    """

    implementation: str
    implementation_version: str
    suite_version: str
    hypothesis_major: str
    oracle: str = "float64"

    @classmethod
    def of(cls, adapter: Any, oracle: str = "float64", suite_version: str | None = None) -> SharedScope:
        import hypothesis

        from .provenance import suite_version as installed

        return cls(str(adapter.name), str(adapter.version), suite_version or installed(),
                   hypothesis.__version__.split(".")[0], oracle)

    def lineage(self) -> bytes:
        parts = (self.suite_version, f"h{self.hypothesis_major}", self.oracle, self.implementation)
        return KEY_ROOT + b":".join(quote(part, safe="").encode() for part in parts) + b":"

    def versions_key(self) -> bytes:
        return self.lineage() + b"versions"

    def prefix(self, version: str, property_part: bytes) -> bytes:
        return self.lineage() + quote(version, safe="").encode() + b":" + property_part + b":"


@dataclass
class _Connection:
    """One shared store and what became of it, shared by every property's view of it."""

    store: ExampleDatabase
    where: str  # the URL without a password, for messages
    errors: tuple[type[BaseException], ...]
    strict: bool  # raise when the store fails (prune), instead of going on locally
    unpublished: Path | None  # where saves the store refused are kept (campaign workers)
    lost: str | None = None
    deleted: int = 0
    saved: int = 0
    kept_back: int = 0

    def failed(self, error: BaseException, doing: str) -> None:
        if self.strict:
            raise SharedDatabaseError(f"the shared example database {self.where} failed while {doing}: "
                                      f"{error!r}") from error
        if self.lost is None:
            self.lost = repr(error)
            kept = (f"counterexamples found from now on are kept locally and in {self.unpublished} "
                    "(publish them later: python -m properties.campaign publish)" if self.unpublished
                    else "counterexamples found from now on are kept in the local database only")
            warnings.warn(SharedDatabaseWarning(
                f"the shared example database {self.where} is unreachable ({error!r}) while {doing}; this run "
                f"goes on with its local database: {kept}"), stacklevel=4)

    def keep_back(self, key: bytes, value: bytes, versions_key: bytes, version: str) -> None:
        self.kept_back += 1
        if self.unpublished is not None:
            line = json.dumps({"key": _text(key), "value": _text(value), "versions_key": _text(versions_key),
                               "version": version})
            with self.unpublished.open("a") as file:
                file.write(line + "\n")


class SharedExamples(ExampleDatabase):
    """An implementation's examples in the shared store (narrowed to one property by ``for_property``).

    Wrapped in ``ReadOnlyDatabase`` for ordinary runs and in ``SaveOnlyDatabase``
    for campaign workers (``SuiteDatabase`` does); bare, for ``prune``, it
    deletes what Hypothesis deletes: an example it replayed and that passed.
    Saves go under the current version's key; fetches read every version of
    the implementation; deletes reach every version. A move is only a save:
    Hypothesis moves a failing example it has shrunk further to the secondary
    key, and it still fails. Hypothesis's pareto front (examples kept for
    ``target()``, not failures) is not shared: it would cost a round trip for
    many passing examples, and nothing would ever delete it. If the store
    fails, a non-strict view warns once, then answers from nothing and keeps
    saves back.
    """

    def __init__(self, connection: _Connection, scope: SharedScope, property_part: bytes = b"-") -> None:
        super().__init__()
        self.connection, self.scope, self.property_part = connection, scope, property_part

    @classmethod
    def over(cls, store: ExampleDatabase, scope: SharedScope, *, where: str,
             errors: tuple[type[BaseException], ...] = (OSError,), strict: bool = False,
             unpublished: Path | None = None) -> SharedExamples:
        """A view of ``store`` (any Hypothesis database) for ``scope``; ``errors``: what an unreachable one raises."""
        return cls(_Connection(store, where, errors, strict, unpublished), scope)

    def __repr__(self) -> str:
        return f"SharedExamples({self.connection.where}, {self._key(self.scope.implementation_version, b'')!r})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SharedExamples) and self.connection is other.connection
                and (self.scope, self.property_part) == (other.scope, other.property_part))

    def __hash__(self) -> int:
        return hash((self.scope, self.property_part))

    def for_property(self, property_prefix: bytes, steps: int | None) -> SharedExamples:
        part = property_prefix.removeprefix(b"kvcache-property:").rstrip(b":") + (b":s%d" % steps if steps else b"")
        return SharedExamples(self.connection, self.scope, part)

    def _key(self, version: str, key: bytes) -> bytes:
        return self.scope.prefix(version, self.property_part) + key

    def versions(self) -> list[str]:
        """The current version first, then every other version of the implementation saved under this scope."""
        current = self.scope.implementation_version
        seen = {value.decode() for value in self.connection.store.fetch(self.scope.versions_key())}
        return [current, *sorted(seen - {current})]

    def fetch(self, key: bytes) -> Iterable[bytes]:
        if self.connection.lost is not None or key.endswith(_PARETO):
            return []
        try:
            found: dict[bytes, None] = {}
            for version in self.versions():
                found.update(dict.fromkeys(self.connection.store.fetch(self._key(version, key))))
            return list(found)
        except self.connection.errors as error:
            self.connection.failed(error, "fetching examples")
            return []

    def save(self, key: bytes, value: bytes) -> None:
        if key.endswith(_PARETO):
            return
        full = self._key(self.scope.implementation_version, key)
        if self.connection.lost is None:
            try:
                self.connection.store.save(full, value)
                self.connection.store.save(self.scope.versions_key(), self.scope.implementation_version.encode())
                self.connection.saved += 1
                return
            except self.connection.errors as error:
                self.connection.failed(error, "saving an example")
        self.connection.keep_back(full, value, self.scope.versions_key(), self.scope.implementation_version)

    def delete(self, key: bytes, value: bytes) -> None:
        if self.connection.lost is not None or key.endswith(_PARETO):
            return
        try:
            for version in self.versions():
                full = self._key(version, key)
                if value in set(self.connection.store.fetch(full)):
                    self.connection.store.delete(full, value)
                    self.connection.deleted += 1
        except self.connection.errors as error:
            self.connection.failed(error, "deleting an example")

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.save(dest, value)

    def _start_listening(self) -> None:  # nobody here listens for changes
        pass

    def _stop_listening(self) -> None:
        pass


class SaveOnlyDatabase(_Wrapping):
    """A campaign worker's view of the shared database: it reads and saves, and never deletes.

    Hypothesis deletes an example that no longer fails on replay, and moves a
    failing example it has shrunk further to the secondary key; here a delete
    does nothing and a move only saves at its destination, so a counterexample
    leaves the shared database only through ``prune``.
    """

    def fetch(self, key: bytes) -> Iterable[bytes]:
        return self.database.fetch(key)

    def save(self, key: bytes, value: bytes) -> None:
        self.database.save(key, value)

    def delete(self, key: bytes, value: bytes) -> None:
        pass

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        self.save(dest, value)

    def _start_listening(self) -> None:
        pass

    def _stop_listening(self) -> None:
        pass


class SuiteDatabase(MultiplexedDatabase):
    """The local directory database beside the shared one, in one ``role``:

    - ``read``: ordinary runs; the shared one through Hypothesis's ``ReadOnlyDatabase``;
    - ``write``: campaign workers; the shared one through ``SaveOnlyDatabase``;
    - ``prune``: the explicit clean-up; the shared one alone, deletes included.

    ``property_settings`` narrows both to one property.
    """

    def __init__(self, local: ExampleDatabase | None, shared: SharedExamples, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if role == "prune" and local is not None:
            raise ValueError("prune works on the shared database alone")
        guarded = {"read": ReadOnlyDatabase, "write": SaveOnlyDatabase, "prune": lambda db: db}[role](shared)
        super().__init__(*([local] if local is not None else []), guarded)
        self.local, self.shared, self.role = local, shared, role

    def __repr__(self) -> str:
        return f"SuiteDatabase({self.local!r}, {self.shared!r}, role={self.role!r})"

    def __hash__(self) -> int:
        return hash((self.shared, self.role))

    def for_property(self, prefix: bytes, steps: int | None) -> SuiteDatabase:
        local = PropertyDatabase(self.local, prefix) if self.local is not None else None
        return SuiteDatabase(local, self.shared.for_property(prefix, steps), self.role)


def shared_url(option: str | None) -> str | None:
    """The shared database's URL: ``--kv-db``, else ``$KVCACHE_DB``, else none."""
    return option or os.environ.get(SHARED_ENV_VAR) or None


def open_shared(url: str, scope: SharedScope, *, strict: bool = False,
                unpublished: Path | None = None) -> SharedExamples:
    """Connect to the Redis server at ``url`` (and check it answers) through Hypothesis's ``RedisExampleDatabase``."""
    where = without_password(url)
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise SharedDatabaseError(f"{SHARED_OPTION} / {SHARED_ENV_VAR}={where!r}: expected redis://HOST:PORT/N")
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as error:
        raise SharedDatabaseError(f"{SHARED_OPTION} needs the optional extra 'campaign' (redis): "
                                  f"{CAMPAIGN_EXTRA} ({error})") from None
    client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=10)
    try:
        client.ping()
    except (redis.RedisError, OSError) as error:
        raise SharedDatabaseError(f"{SHARED_OPTION} {where}: cannot reach Redis ({error}); start one on this machine "
                                  f"with scripts/redis-local, or leave {SHARED_OPTION} out") from None
    store = RedisExampleDatabase(client, expire_after=NEVER, key_prefix=b"", listener_channel="kvcache-conformance")
    return SharedExamples.over(store, scope, where=where, errors=(redis.RedisError, OSError), strict=strict,
                               unpublished=unpublished)


def publish(path: Path, url: str) -> int:
    """Save the examples a worker kept back while the shared database was away (``unpublished``); how many."""
    shared = open_shared(url, SharedScope("-", "-", "-", "-"), strict=True)
    count = 0
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            key, value, versions_key = (base64.b64decode(entry[name]) for name in ("key", "value", "versions_key"))
            version = str(entry["version"]).encode()
        except (ValueError, KeyError, TypeError) as error:
            raise SharedDatabaseError(f"{path}:{number}: not a kept-back example ({error!r})") from None
        if not (key.startswith(KEY_ROOT) and versions_key.startswith(KEY_ROOT)):
            raise SharedDatabaseError(f"{path}:{number}: a key outside {KEY_ROOT!r}")
        try:
            shared.connection.store.save(key, value)
            shared.connection.store.save(versions_key, version)
        except shared.connection.errors as error:
            raise SharedDatabaseError(f"publishing to {shared.connection.where}: {error!r}") from error
        count += 1
    return count


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode()


def without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{parts.hostname}:{parts.port}"))
