"""Stand-in for ``mypy_extensions.mypyc_attr`` where mypy is not installed:
its flags only matter to the compiled build (setup.py), which has mypy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import IdentityFunction


def mypyc_attr(*attrs: str, **kwattrs: object) -> IdentityFunction:
    """Leaves the class as it is."""
    def keep(cls: Any) -> Any:
        return cls
    return keep
