"""What a report or a trace says about where it came from: the implementation, the suite, the machine."""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

import hypothesis
import numpy as np

from ..protocol.declarations import LayerLimits
from ..protocol.kinds import Capability
from ..protocol.model import ModelLimits, ModelPolicy, described_kv_storage

SUITE = Path(__file__).resolve().parents[1]  # the suite's package: properties/ in a clone, else kvcache_conformance/
# A clone of the repository (its reference beside the suite), else None: an installed suite has no checkout.
CHECKOUT: Path | None = SUITE.parent if (SUITE.parent / "impl").is_dir() and SUITE.name == "properties" else None


def working_directory() -> Path:
    """Where the suite's own pytest runs (campaigns) start: the clone's root, else the directory run from."""
    return CHECKOUT or Path.cwd()


def suite_paths() -> list[str]:
    """pytest arguments collecting the suite's properties, without the regression corpus."""
    return [str(SUITE), f"--ignore={SUITE / 'test_regressions.py'}"]


def implementation_facts(adapter: Any, spec: str | None) -> dict[str, Any]:
    """What the adapter declares, as a report states it: two declarations never read alike."""
    facts = {"implementation": str(adapter.name), "implementation_version": str(adapter.version),
             "spec": spec, "dtype": str(getattr(adapter, "dtype", "float64")),
             "capabilities": sorted(adapter.capabilities), "layer_limits": LayerLimits.of(adapter).described()}
    if Capability.WHOLE_MODEL.value in adapter.capabilities:  # docs/spec.md §15.6-§15.7
        facts.update(kv_storage=described_kv_storage(adapter), model_policy=ModelPolicy.of(adapter).described(),
                     model_limits=ModelLimits.of(adapter).described())
    return facts


@cache
def environment_facts() -> dict[str, Any]:
    return {"suite_version": suite_version(), "suite_commit": suite_commit(), "python": platform.python_version(),
            "numpy": np.__version__, "hypothesis": hypothesis.__version__}


def suite_version() -> str:
    try:
        return metadata.version("kvcache-conformance")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def suite_commit() -> str | None:
    """The git commit of the suite's checkout, with ``+dirty`` if it has local changes; None outside git (or
    installed: the git repository around a site-packages is someone else's)."""
    if CHECKOUT is None:
        return None
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None
