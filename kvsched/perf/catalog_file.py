"""A catalog kept in a package data file and read on first use.

The hardware and model catalogs are data (``data/hardware.yaml``,
``data/models.yaml``) that their modules read and check once, on the first
lookup rather than at import, so that importing :mod:`kvsched.perf` does
not import PyYAML. :class:`FileCatalog` is the read-only mapping both
expose; the reading and the checks stay with each catalog's module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

# Where the catalogs' files live (pyproject.toml ships data/*.yaml as
# package data; tests/test_package_data.py checks it).
DATA_DIR = Path(__file__).resolve().parent / "data"

V = TypeVar("V")


class FileCatalog(Mapping[str, V]):
    """The entries ``load`` reads from ``path``, as a read-only mapping.

    ``load`` is its module's ``functools.cache``d reader, so the file is
    read and checked once and every lookup returns the same objects; this
    class holds no state of its own."""

    __slots__ = ("_load", "_path", "_what")

    def __init__(self, load: Callable[[], Mapping[str, V]], path: Path, what: str) -> None:
        self._load = load
        self._path = path
        self._what = what

    def __getitem__(self, key: str) -> V:
        return self._load()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __repr__(self) -> str:
        return f"<{self._what} {self._path}>"
