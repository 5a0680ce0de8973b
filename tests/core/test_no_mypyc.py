"""The stand-in for mypy_extensions.mypyc_attr keeps a class as it is."""

from __future__ import annotations

from kvsched.core.no_mypyc import mypyc_attr


def test_the_stand_in_returns_the_class_unchanged() -> None:
    class Managed:
        pass

    assert mypyc_attr(allow_interpreted_subclasses=True)(Managed) is Managed
