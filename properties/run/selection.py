"""Which implementation is under test: resolved once, in this one place.

``--kv-impl module:factory`` wins over ``KVCACHE_IMPL=module:factory``; in a
clone of the suite's repository the default is its reference implementation,
and an installed suite has none (it must be told). The plugin calls
``configure`` in every pytest process that runs the suite (xdist workers
included, as they get the same options and environment); code outside pytest
gets the same answer from ``selected()``.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path
from typing import Any

from ..oracle import FLOAT64, NumberSystem, mpmath_precision
from ..protocol.declarations import (
    DTYPES,
    declaration_problems,
    declared_precision,
    declared_storage,
    drives_layer_caches,
    required_methods,
)
from ..protocol.kinds import Capability, declared
from ..protocol.layer import KvCacheAdapter
from ..protocol.paged import PAGED_PREFIX_SHARING, PagedPolicy, PolicyError

ENV_VAR = "KVCACHE_IMPL"
CHECKOUT = Path(__file__).resolve().parents[2]  # a clone's root (properties/run/selection.py); else site-packages
OPTION = "--kv-impl"
DEFAULT_SPEC = "impl.conformance:make_adapter"
ORACLES = ("float64", "mpmath")
MPMATH_DIGITS = 40

_selected: tuple[str, KvCacheAdapter] | None = None
_oracle = "float64"


class AdapterLoadError(RuntimeError):
    """The implementation named by --kv-impl / KVCACHE_IMPL cannot be used (not a conformance verdict)."""


def spec_from(option: str | None) -> str:
    """The implementation spec: the option, else the environment, else the reference (in a clone only)."""
    spec = option or os.environ.get(ENV_VAR)
    if spec:
        return spec
    if not (CHECKOUT / "impl" / "conformance.py").is_file():
        raise AdapterLoadError(f"no implementation named: pass {OPTION} MODULE:FACTORY or set {ENV_VAR} "
                               "(docs/adapters.md; the reference implementation is in the suite's repository only)")
    return DEFAULT_SPEC


def _import_module(name: str) -> Any:
    """Import ``name``; failing that, from the directory the run started in, as ``python -m pytest`` would
    find it (the bare ``pytest`` and ``kvcache-conformance`` commands do not put that directory on the path).
    It goes last, so it never shadows an installed module."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        here = os.getcwd()
        if error.name != name.partition(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        return importlib.import_module(name)


def load_adapter(spec: str) -> KvCacheAdapter:
    """Import ``module:factory``, call the factory, check the result is an adapter."""
    where = f"{OPTION} / {ENV_VAR}={spec!r}"
    module_name, _, factory_name = spec.partition(":")
    if not module_name or not factory_name:
        raise AdapterLoadError(f"{where}: expected 'package.module:factory'")
    try:
        module = _import_module(module_name)
    except Exception as error:
        raise AdapterLoadError(f"{where}: cannot import module {module_name!r}: {error!r}") from error
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise AdapterLoadError(f"{where}: module {module_name!r} has no callable {factory_name!r}")
    try:
        adapter = factory()
    except Exception as error:
        raise AdapterLoadError(f"{where}: factory {factory_name!r} raised {error!r}") from error
    missing = [name for name in ("name", "version", "capabilities") if not hasattr(adapter, name)]
    if missing:
        raise AdapterLoadError(f"{where}: the adapter lacks {', '.join(missing)} (see docs/adapters.md)")
    unknown = set(adapter.capabilities) - {c.value for c in Capability}
    if unknown:
        raise AdapterLoadError(f"{where}: unknown capabilities {sorted(unknown)}; "
                               f"known: {sorted(c.value for c in Capability)}")
    wanted = required_methods(adapter.capabilities, layer_caches=drives_layer_caches(adapter))
    if PAGED_PREFIX_SHARING in declared(adapter.capabilities):
        try:
            wanted += PagedPolicy.of(adapter).methods()
        except PolicyError as error:
            raise AdapterLoadError(f"{where}: {error}") from error
    missing = [name for name in wanted if not callable(getattr(adapter, name, None))]
    if missing:
        raise AdapterLoadError(f"{where}: the adapter lacks {', '.join(missing)}, which what it declares needs "
                               "(see docs/adapters.md)")
    try:
        storage = declared_storage(adapter)
    except ValueError as error:
        raise AdapterLoadError(f"{where}: {error}") from error
    if storage is not None and Capability.FLOAT64.value in adapter.capabilities:
        raise AdapterLoadError(f"{where}: declares {storage.format} storage and the float64 capability (1e-12 "
                               "everywhere); which is it?")
    dtype = getattr(adapter, "dtype", "float64")
    if dtype not in DTYPES:
        raise AdapterLoadError(f"{where}: dtype {dtype!r} is not one of {DTYPES}")
    if dtype != "float64" and Capability.FLOAT64.value in adapter.capabilities:
        raise AdapterLoadError(f"{where}: declares dtype {dtype} and the float64 capability; which is it?")
    try:
        _, mixed = declared_precision(adapter)  # mixed_precision: known components, low dtypes, float64 only
    except ValueError as error:
        raise AdapterLoadError(f"{where}: {error}") from error
    if mixed and Capability.FLOAT64.value in adapter.capabilities:
        raise AdapterLoadError(f"{where}: declares mixed_precision {mixed} and the float64 capability "
                               "(1e-12 everywhere); which is it?")
    for problem in declaration_problems(adapter):
        raise AdapterLoadError(f"{where}: {problem}")
    return adapter


def configure(option: str | None = None, oracle: str = "float64") -> KvCacheAdapter:
    """Resolve and remember the implementation under test, and the oracle, for this process."""
    global _selected, _oracle
    if oracle not in ORACLES:
        raise ValueError(f"--oracle must be one of {ORACLES}, got {oracle!r}")
    spec = spec_from(option)
    _selected, _oracle = (spec, load_adapter(spec)), oracle
    return _selected[1]


def selected() -> KvCacheAdapter:
    if _selected is None:
        return configure()
    return _selected[1]


def selected_spec() -> str:
    selected()
    assert _selected is not None
    return _selected[0]


def oracle_name() -> str:
    return _oracle


def oracle_numbers() -> NumberSystem:
    """The number system the machines run the oracle in: float64, or mpmath at MPMATH_DIGITS."""
    return FLOAT64 if _oracle == "float64" else mpmath_precision(MPMATH_DIGITS)


def database_key(adapter: KvCacheAdapter) -> str:
    """A file-name-safe id: one Hypothesis example database per implementation."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(adapter.name)) or "unnamed"
