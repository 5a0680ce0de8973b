"""What a field's value may be: the one definition every input check uses.

Python counts ``True`` as the integer 1 and JSON's ``true`` loads as it, but
no kvsched field (a count, a size, a token id, a time) takes a boolean: a
``true`` where a number belongs is the user's mistake, named, never read
as 1.
"""

from __future__ import annotations

from typing import TypeGuard


def is_int(value: object) -> TypeGuard[int]:
    """An integer, not a boolean."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An integer or a float, not a boolean (NaN and infinities included:
    the field's range check refuses those)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
