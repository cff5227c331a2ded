"""Run an adapter's engine in a child process, so that an engine that aborts or segfaults fails one call, not the run.

``isolated(factory)`` is an adapter: it builds the real adapter in a child process (multiprocessing's
forkserver context: forked from a clean server that has imported the suite but no engine, so no native state
is inherited, and a restart after a crash costs a fork, not a new interpreter importing numpy) and forwards
every method call to it over a pipe.
What the child returns comes back by value when it is plain data (numbers, strings, arrays, enums, and frozen
dataclasses, named tuples and containers of those) and otherwise as a ``Remote`` handle the suite passes back
(layers, caches, contexts); reading a handle's attribute is forwarded too. An exception the engine raises is
re-raised here, with the kind the child's own ``error_kind`` gave it. The engine's death -- a signal, an exit --
raises ``EngineDied`` (the exit code or signal, and the tail of the child's stderr, where native engines print
their assertion); a call with no answer within ``timeout`` kills the child and raises ``EngineHung``. Both are
``BaseException``s, so that no adapter code catches them on the way; the suite's call harness
(``judge/calls.py``) turns them into the failure kinds "crash" and "hang". The next call after a death starts
a new child; handles of the dead child are refused (``StaleHandle``).

It lives in the protocol, not in ``run/``: it is something an adapter module uses (``make_adapter =
lambda: isolated("my_pkg.adapter:make_adapter")``), with nothing of the runner in it, and the call harness in
``judge/`` must see its error types without importing the runner (which imports the harness).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import itertools
import multiprocessing
import os
import pickle
import signal
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from types import SimpleNamespace
from typing import Any

import numpy as np

STDERR_TAIL = 4000  # characters of the child's stderr a death carries
# The proxy's own names: an adapter attribute of one of these names is not mirrored (error_kind is answered here,
# from the kind the child gave).
RESERVED = frozenset({"alive", "start", "stop", "restart", "restarts", "remote_call", "forget", "error_kind"})


class EngineDied(BaseException):
    """The child process running the engine died during ``call``: ``exitcode`` (negative: killed by signal
    ``-exitcode``), ``signal_name`` and the tail of its stderr."""

    def __init__(self, call: str, exitcode: int | None, stderr_tail: str) -> None:
        self.call, self.exitcode, self.stderr_tail = call, exitcode, stderr_tail
        self.signal_name = _signal_name(exitcode)
        how = f"killed by {self.signal_name}" if self.signal_name else f"exited with code {exitcode}"
        tail = stderr_tail.strip()
        super().__init__(f"{call}: the engine's process died ({how})"
                         + (f"; its stderr ended with:\n{tail}" if tail else "; it wrote nothing to stderr"))

    @property
    def cause(self) -> str:
        """Short and the same for every step: the check a crash failure names."""
        return self.signal_name or f"exit code {self.exitcode}"


class EngineHung(BaseException):
    """No answer to ``call`` within ``seconds``: the child was killed."""

    def __init__(self, call: str, seconds: float, stderr_tail: str) -> None:
        self.call, self.seconds, self.stderr_tail = call, seconds, stderr_tail
        super().__init__(f"{call}: no answer from the engine's process within {seconds:g} s; it was killed")


class StaleHandle(RuntimeError):
    """A handle from a child process that has since died or been restarted."""


class RemoteError(Exception):
    """An exception the engine raised that cannot be rebuilt here (not picklable): its type name and message."""

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name


def _signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


# -- what crosses the pipe ----------------------------------------------------------------------------------------
# A value is sent as ("v", value) when plain, ("h", handle number) when it stays in the child, and containers
# element by element as ("t" | "l", [...]) / ("d", [(key, item), ...]).

_PLAIN = (type(None), bool, int, float, complex, str, bytes, np.generic, enum.Enum)


def _is_plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, np.ndarray):
        return bool(value.dtype != object)
    if isinstance(value, (tuple, list, frozenset, set)):
        return all(_is_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_is_plain(k) and _is_plain(v) for k, v in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        frozen = type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]
        return bool(frozen) and all(_is_plain(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, SimpleNamespace):
        return all(_is_plain(v) for v in vars(value).values())
    return False


class _Child:
    """The child's side: the adapter, and the objects the parent holds handles to."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.objects: dict[int, Any] = {0: adapter}
        self.numbers: dict[int, int] = {id(adapter): 0}  # the same object always gets the same handle
        self.next = itertools.count(1)

    def out(self, value: Any) -> tuple[str, Any]:
        if type(value) is tuple and not _is_plain(value):
            return "t", [self.out(item) for item in value]
        if type(value) is list and not _is_plain(value):
            return "l", [self.out(item) for item in value]
        if type(value) is dict and not _is_plain(value):
            return "d", [(key, self.out(item)) for key, item in value.items()]
        if _is_plain(value):
            return "v", value
        number = self.numbers.get(id(value))
        if number is None:
            number = next(self.next)
            self.objects[number], self.numbers[id(value)] = value, number
        return "h", number

    def into(self, sent: tuple[str, Any]) -> Any:
        tag, body = sent
        if tag == "h":
            return self.objects[body]
        if tag in ("t", "l"):
            items = [self.into(item) for item in body]
            return tuple(items) if tag == "t" else items
        if tag == "d":
            return {key: self.into(item) for key, item in body}
        return body

    def release(self, numbers: list[int]) -> None:
        for number in numbers:
            value = self.objects.pop(number, None)
            if value is not None:
                self.numbers.pop(id(value), None)

    def describe(self) -> dict[str, Any]:
        """The adapter's public surface: its plain attributes by value, and which names are methods."""
        attributes, methods = {}, []
        for name in dir(self.adapter):
            if name.startswith("_") or name in RESERVED:
                continue
            try:
                value = getattr(self.adapter, name)
            except Exception:  # a property that fails to compute is not part of the surface
                continue
            if callable(value):
                methods.append(name)
            else:
                attributes[name] = self.out(value)
        return {"attributes": attributes, "methods": methods}

    def error(self, error: BaseException) -> dict[str, Any]:
        try:
            kind: Any = ("kind", self.adapter.error_kind(error))
        except Exception as failure:  # the parent's error_kind raises it again, as the harness expects
            kind = ("raised", f"{type(failure).__name__}: {failure}")
        rebuilt: bytes | None
        try:
            rebuilt = pickle.dumps(error)
            pickle.loads(rebuilt)
        except Exception:
            rebuilt = None
        return {"kind": kind, "pickled": rebuilt, "type": type(error).__name__, "message": str(error),
                "traceback": "".join(traceback.format_exception(error))}


def _load(factory: str | Callable[[], Any]) -> Any:
    if callable(factory):
        return factory()
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)()


def _serve(connection: Connection, factory: str | Callable[[], Any], stderr_path: str,
           environment: dict[str, str]) -> None:
    """The child's loop: build the adapter, then answer requests until the pipe closes."""
    os.environ.clear()  # the parent's environment now, as spawn would give it, not the server's at its start
    os.environ.update(environment)
    with open(stderr_path, "ab", buffering=0) as stderr:  # native code writes to fd 2: point fd 2 at the file
        os.dup2(stderr.fileno(), 2)
    try:
        child = _Child(_load(factory))
    except BaseException as error:  # a factory that fails is a usage error here, with its traceback
        connection.send(("failed", "".join(traceback.format_exception(error))))
        return
    connection.send(("ready", child.describe()))
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        op, target, name, args, kwargs, released = request
        child.release(released)
        try:
            obj = child.objects[target]
            if op == "call":
                result = getattr(obj, name)(*[child.into(a) for a in args],
                                            **{k: child.into(v) for k, v in kwargs.items()})
            else:
                result = getattr(obj, name)
            connection.send(("ok", child.out(result)))
        except Exception as error:
            connection.send(("error", child.error(error)))


class Remote:
    """A handle to an object that lives in the child: pass it back to the adapter; its attributes are read
    from the child."""

    def __init__(self, owner: Isolated, generation: int, number: int) -> None:
        self._owner, self._generation, self._number = owner, generation, number

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._owner.remote_call("getattr", self, name, (), {})

    def __repr__(self) -> str:
        return f"<Remote #{self._number} of {getattr(self._owner, 'name', 'the isolated adapter')}>"

    def __del__(self) -> None:
        self._owner.forget(self._generation, self._number)


class Isolated:
    """An adapter whose engine runs in a child process (see the module's docstring); built by ``isolated``."""

    def __init__(self, factory: str | Callable[[], Any], *, timeout: float | None = None,
                 start_timeout: float = 300.0) -> None:
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive seconds or None, not {timeout!r}")
        if not callable(factory) and not (isinstance(factory, str) and all(factory.partition(":")[::2])):
            raise ValueError(f"isolated({factory!r}): a factory is a picklable callable or 'module:function'")
        self._factory, self._timeout, self._start_timeout = factory, timeout, start_timeout
        self._context = multiprocessing.get_context("forkserver")
        # The server imports what spawn would import into each child (the main module) and this module (numpy,
        # the oracle); not the engine, which every child loads itself. Taking effect when the server starts.
        self._context.set_forkserver_preload(["__main__", __name__])
        self._process: Any = None
        self._connection: Connection | None = None
        self._stderr_path: str | None = None
        self._generation = 0
        self._handles: dict[int, Remote] = {}
        self._released: list[int] = []
        self._methods: list[str] = []
        self.restarts = 0  # children started after the first
        self.start()

    # -- the child's life ------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> None:
        """Start a child (stopping any running one); every handle of an earlier child becomes stale."""
        if self._process is not None:
            self.stop()
            self.restarts += 1
        self._generation += 1
        self._handles, self._released = {}, []
        fd, self._stderr_path = tempfile.mkstemp(prefix="kvcache-engine-", suffix=".stderr")
        os.close(fd)
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(child, self._factory, self._stderr_path,
                                                                   dict(os.environ)),
                                              daemon=True, name="kvcache-isolated-engine")
        self._process.start()
        child.close()
        self._connection = parent
        status, body = self._answer("start the engine", self._start_timeout)
        if status != "ready":
            self.stop()
            raise RuntimeError(f"isolated({self._factory!r}): the adapter factory failed in the child:\n{body}")
        for name in self._methods:  # a restarted engine may offer other methods: forget the old ones
            self.__dict__.pop(name, None)
        self._methods = list(body["methods"])
        for name, sent in body["attributes"].items():
            setattr(self, name, self._into(sent))
        for name in self._methods:
            setattr(self, name, self._forwarder(name))

    def stop(self) -> None:
        """Stop the child (closing its pipe lets it return; a child that does not is killed)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        if self._process is not None:
            self._process.join(2.0)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        if self._stderr_path is not None and os.path.exists(self._stderr_path):
            os.unlink(self._stderr_path)
        self._stderr_path = None

    def restart(self) -> None:
        self.start()

    def _tail(self) -> str:
        if self._stderr_path is None or not os.path.exists(self._stderr_path):
            return ""
        with open(self._stderr_path, "rb") as stderr:
            stderr.seek(max(0, os.path.getsize(self._stderr_path) - STDERR_TAIL))
            return stderr.read().decode(errors="replace")

    def _answer(self, what: str, seconds: float | None) -> tuple[str, Any]:
        """The child's answer, or its death (``EngineDied``), or its silence for ``seconds`` (``EngineHung``). An
        interruption while waiting (the suite's own time limit, Ctrl-C) kills the child: its answer would
        otherwise be read as the next call's."""
        assert self._connection is not None and self._process is not None
        try:
            ready = wait([self._connection, self._process.sentinel], seconds)
            if self._connection in ready:
                try:
                    return self._connection.recv()  # type: ignore[no-any-return]
                except EOFError:
                    pass  # it died after its last answer: fall through to its exit code
            if not ready:
                tail = self._tail()
                self._kill()
                raise EngineHung(what, seconds or 0.0, tail)
        except BaseException as interruption:
            if not isinstance(interruption, EngineHung):
                self._kill()
            raise
        self._process.join(5.0)
        exitcode, tail = self._process.exitcode, self._tail()
        self._kill()
        raise EngineDied(what, exitcode, tail)

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- forwarding ------------------------------------------------------------------------------------------

    def forget(self, generation: int, number: int) -> None:
        if generation == self._generation:
            self._handles.pop(number, None)
            self._released.append(number)

    def _into(self, sent: tuple[str, Any]) -> Any:
        tag, body = sent
        if tag == "h":
            handle = self._handles.get(body)
            if handle is None:
                handle = self._handles[body] = Remote(self, self._generation, body)
            return handle
        if tag in ("t", "l"):
            items = [self._into(item) for item in body]
            return tuple(items) if tag == "t" else items
        if tag == "d":
            return {key: self._into(item) for key, item in body}
        return body

    def _out(self, value: Any) -> tuple[str, Any]:
        if isinstance(value, Remote):
            if value._owner is not self or value._generation != self._generation:
                raise StaleHandle(f"{value!r} belongs to an engine process that has died or been restarted")
            return "h", value._number
        if type(value) in (tuple, list):
            return ("t" if type(value) is tuple else "l"), [self._out(item) for item in value]
        if type(value) is dict:
            return "d", [(key, self._out(item)) for key, item in value.items()]
        return "v", value

    def _forwarder(self, name: str) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return self.remote_call("call", None, name, args, kwargs)
        forward.__name__ = name
        return forward

    def remote_call(self, op: str, target: Remote | None, name: str, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """Forward one call (``op`` "call") or attribute read ("getattr") to the child; start a new child first
        if the last one died."""
        number = 0 if target is None else self._out(target)[1]
        if not self.alive:
            self.start()
            number = 0 if target is None else self._out(target)[1]  # a handle of the dead child: StaleHandle
        request = (op, number, name, tuple(self._out(a) for a in args), {k: self._out(v) for k, v in kwargs.items()},
                   self._released)
        self._released = []
        what = f"{name}" if target is None else f"{target!r}.{name}"
        assert self._connection is not None
        try:
            self._connection.send(request)
        except (BrokenPipeError, ConnectionResetError, OSError):
            pass  # dead already: its answer (none) says how
        status, body = self._answer(what, self._timeout)
        if status == "ok":
            return self._into(body)
        raise self._rebuilt(body)

    def _rebuilt(self, body: dict[str, Any]) -> BaseException:
        error: BaseException | None = None
        if body["pickled"] is not None:
            try:
                error = pickle.loads(body["pickled"])
                error.isolated_kind = body["kind"]  # type: ignore[union-attr]
            except Exception:
                error = None
        if error is None:
            error = RemoteError(body["type"], body["message"])
            error.isolated_kind = body["kind"]  # type: ignore[attr-defined]
        if hasattr(error, "add_note"):  # Python 3.11+
            error.add_note(f"raised in the engine's process:\n{body['traceback']}")
        return error

    def error_kind(self, error: BaseException) -> str | None:
        """The kind the child's adapter gave ``error``; an exception that did not come from the child has none."""
        kind = getattr(error, "isolated_kind", None)
        if kind is None:
            return None
        how, value = kind
        if how == "raised":
            raise RuntimeError(f"the adapter's error_kind raised in the engine's process: {value}")
        return value  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"isolated({self._factory!r})"

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass


def isolated(factory: str | Callable[[], Any], *, timeout: float | None = None,
             start_timeout: float = 300.0) -> Isolated:
    """An adapter that runs ``factory()`` (a picklable callable, or "module:function") in a child process and
    forwards every call to it. ``timeout``: seconds one call may take before the child is killed (None: the
    suite's per-call limit, --kv-call-timeout, bounds it); ``start_timeout``: for building the adapter."""
    return Isolated(factory, timeout=timeout, start_timeout=start_timeout)
