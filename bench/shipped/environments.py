"""One Python environment per (library, release), built once and cached, for the shipped-bug benchmark.

A release's environment holds only what the release itself needs (``pip install transformers==5.17.0``). Its
interpreter also sees a *base* environment, shared by every release of the same kind: the suite (editable,
from this checkout) with its own dependencies, and torch 2.13.0 where the release needs torch. The base is
joined by a ``.pth`` file that calls ``site.addsitedir``, so it comes after the release's own packages: a
release that needs another numpy or tokenizers gets its own, and pip leaves the base's alone ("outside
environment"). torch, the largest by far, is unpacked once instead of once per release.

Environments are kept per checkout of the suite (a hash of its path), so that clones never rebuild each
other's. Everything lives under ``cache_root()``: ``$KVCACHE_SHIPPED_CACHE``, else ``$XDG_CACHE_HOME`` or ``~/.cache``,
then ``kvcache-conformance/shipped``. An environment is ready when its ``ready.json`` matches what it was asked
to hold; a build that fails leaves no ``ready.json`` and raises ``EnvironmentBuildError`` with pip's log.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout whose suite the bases install
TORCH = "torch==2.13.0"  # the CPU build on these machines' disk; any other pin pulls a CUDA build
READY = "ready.json"
# Environments of one checkout: two clones (worktrees) of the suite never rebuild each other's base.
CHECKOUT = hashlib.sha1(str(ROOT).encode()).hexdigest()[:8]


class EnvironmentBuildError(RuntimeError):
    """An environment could not be built: the command, and where pip's output is."""


def cache_root() -> Path:
    given = os.environ.get("KVCACHE_SHIPPED_CACHE")
    if given:
        return Path(given)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvcache-conformance" / "shipped"


def interpreter(python: str) -> str:
    """The interpreter for a ``major.minor`` version: this one if it matches, else ``pythonX.Y`` on PATH."""
    if python == f"{sys.version_info.major}.{sys.version_info.minor}":
        return sys.executable
    found = shutil.which(f"python{python}")
    if found is None:
        raise EnvironmentBuildError(f"no python{python} on PATH (pyenv: put its versions/*/bin on PATH)")
    return found


@dataclass(frozen=True)
class Environment:
    path: Path
    built_seconds: float  # 0.0: it was ready in the cache

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"


def _site_packages(env: Path) -> Path:
    found = sorted((env / "lib").glob("python*/site-packages"))
    if len(found) != 1:
        raise EnvironmentBuildError(f"{env}: expected one lib/python*/site-packages, found {found}")
    return found[0]


def _run(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("a") as out:
        out.write("$ " + "".join(f"{name}={value} " for name, value in (env or {}).items()) + " ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, **env} if env else None)
    if done.returncode != 0:
        raise EnvironmentBuildError(f"`{' '.join(command)}` exited {done.returncode}; its output: {log}")


def _ready(env: Path, wanted: dict[str, object]) -> bool:
    marker = env / READY
    try:
        return json.loads(marker.read_text()) == wanted
    except (OSError, ValueError):
        return False


def _build(env: Path, python: str, wanted: dict[str, object], steps: list[list[str]],
           join: Path | None = None, variables: dict[str, str] | None = None) -> Environment:
    """``env`` as ``wanted`` says, from scratch unless it is ready: a venv that sees ``join`` (a base's
    site-packages, after its own), then each pip step (with ``variables`` in its environment)."""
    if _ready(env, wanted):
        return Environment(env, 0.0)
    started = time.monotonic()
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    log = env.parent / f"{env.name}.log"
    log.write_text("")
    _run([interpreter(python), "-m", "venv", str(env)], log)
    if join is not None:
        (_site_packages(env) / "kvcache-base.pth").write_text(f"import site; site.addsitedir({str(join)!r})\n")
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    for step in steps:
        _run(pip + step, log, variables)
    (env / READY).write_text(json.dumps(wanted, indent=1, sort_keys=True))
    return Environment(env, time.monotonic() - started)


def base(python: str, torch: bool) -> Environment:
    """The suite from this checkout (editable) with its dependencies, and torch if asked."""
    name = f"base-py{python}" + ("-torch" if torch else "") + f"-{CHECKOUT}"
    wanted = {"kind": "base", "python": python, "suite": str(ROOT), "torch": TORCH if torch else None}
    steps = ([[TORCH]] if torch else []) + [["-e", str(ROOT)]]
    return _build(cache_root() / "envs" / name, python, wanted, steps)


def release(library: str, version: str, install: list[str], python: str, torch: bool,
            variables: dict[str, str] | None = None) -> Environment:
    """``library`` at ``version``: ``install`` (pip requirements, ``{version}`` filled in) over its base, pip run
    with ``variables`` in its environment (a package that needs one to install)."""
    shared = base(python, torch)
    pins = [requirement.format(version=version) for requirement in install]
    wanted = {"kind": "release", "library": library, "version": version, "install": pins, "python": python,
              "base": str(shared.path)}
    if variables:
        wanted["env"] = dict(sorted(variables.items()))
    name = f"{library}-{version}-py{python}-{CHECKOUT}"
    if variables or pins != [f"{library}=={version}"]:  # more than the release alone: an environment of its own
        name += "-" + hashlib.sha1(json.dumps([pins, wanted.get("env")]).encode()).hexdigest()[:6]
    built = _build(cache_root() / "envs" / name, python, wanted, [pins], join=_site_packages(shared.path),
                   variables=variables)
    return Environment(built.path, built.built_seconds + shared.built_seconds)
