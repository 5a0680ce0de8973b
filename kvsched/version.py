"""kvsched's version and build (its own module, so any layer may read them
without importing the package's front door)."""

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

__version__ = "0.1.0"


def build() -> str:
    """'compiled' when the simulator's hot path was built with mypyc
    (``KVSCHED_COMPILE=1``, see setup.py), else 'interpreted'. Read from the
    files Python would import (an extension module beside a ``.py`` wins),
    so it says what actually runs."""
    core = Path(__file__).resolve().parent / "core"
    compiled = any((core / f"scheduler{suffix}").is_file() for suffix in EXTENSION_SUFFIXES)
    return "compiled" if compiled else "interpreted"
