"""A property's id, the same from a clone and from an installed package.

pytest names a test by its path from where it was collected: in a clone
``properties/test_layer_cache.py::test_layer_cache_conforms``, under
``pytest --pyargs kvcache_conformance`` from elsewhere something like
``test_layer_cache.py::...`` or a path into site-packages. The example
databases, the shared campaign database, users' ``--kv-xfails`` files and the
report all key on a property's id, so the suite uses one: the clone's
layout (``properties/<file>::<test>[<parameters>]``), whichever way it was
collected.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # properties/ in a clone, kvcache_conformance/ installed
PREFIX = "properties"
_PACKAGE_NAMES = {"properties", "kvcache_conformance", PACKAGE_DIR.name}


def canonical(nodeid: str) -> str:
    """``nodeid`` with a property file of the suite's own renamed ``properties/<file>``; anything else as it is."""
    path, separator, rest = nodeid.partition("::")
    parts = PurePosixPath(path.replace("\\", "/")).parts
    if not parts or not parts[-1].startswith("test_") or not (PACKAGE_DIR / parts[-1]).is_file():
        return nodeid
    if len(parts) > 1 and parts[-2] not in _PACKAGE_NAMES:
        return nodeid
    return f"{PREFIX}/{parts[-1]}{separator}{rest}"


def is_suite_file(path: Path) -> bool:
    """Whether ``path`` is one of the suite's own property files (wherever it is installed)."""
    try:
        return path.resolve().parent == PACKAGE_DIR and path.name.startswith("test_")
    except OSError:
        return False
