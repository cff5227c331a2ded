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

ROOT = Path(__file__).resolve().parents[2]  # the checkout: properties/run/provenance.py


def implementation_facts(adapter: Any, spec: str | None) -> dict[str, Any]:
    return {"implementation": str(adapter.name), "implementation_version": str(adapter.version),
            "spec": spec, "dtype": str(getattr(adapter, "dtype", "float64")),
            "capabilities": sorted(adapter.capabilities), "layer_limits": LayerLimits.of(adapter).described()}


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
    """The git commit of the suite's checkout, with ``+dirty`` if it has local changes; None outside git."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    try:
        commit = git("rev-parse", "HEAD")
        return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")
    except (OSError, subprocess.SubprocessError):
        return None
