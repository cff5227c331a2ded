"""The wheel's package list is the checkout's folders: a subpackage left out of pyproject.toml is silently dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_folder_of_the_suite_is_a_listed_package() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {}
    for package, folder in setuptools["package-dir"].items():
        for directory in [ROOT / folder, *(ROOT / folder).rglob("*")]:
            if directory.is_dir() and "__pycache__" not in directory.parts:
                folders[".".join([package, *directory.relative_to(ROOT / folder).parts])] = directory
    assert set(setuptools["packages"]) == set(folders), sorted(set(folders) ^ set(setuptools["packages"]))
    for name, patterns in setuptools["package-data"].items():
        assert all(any(folders[name].glob(pattern)) for pattern in patterns), (name, patterns)
