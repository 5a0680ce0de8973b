"""The one bounded reading of a text input file.

Every file a user hands kvsched (a config.json, a hardware or host-terms
file, a scenario) is read here: never past its size bound (a wrong path to
a multi-gigabyte file is refused after ``limit + 1`` bytes, not read whole),
decoded as UTF-8, and every failure is one ``ValueError`` line naming the
file, what was expected there and the fix. Parsing is the caller's
(:mod:`kvsched.jsonfile` for JSON).
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from kvsched.errors import UserInputError

# Read in pieces: file.read(n) sets aside n bytes before it reads, so one
# read of a large bound would take that memory whatever the file's size.
_CHUNK = 1 << 20


def _read_at_most(file: BinaryIO, size: int) -> bytes:
    """Up to ``size`` bytes of ``file``, never holding more than it read."""
    parts: list[bytes] = []
    left = size
    while left > 0:
        part = file.read(min(left, _CHUNK))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def read_text(path: str | Path, limit: int, what: str, *, fix: str = "check the path",
              encoding: str = "utf-8") -> str:
    """The text of ``path``, at most ``limit`` bytes (it reads no further).

    ``what`` says what the file should be ("a Hugging Face config.json"),
    ``fix`` what to do about a file over the bound. ``encoding`` is
    ``"utf-8"`` or ``"utf-8-sig"`` (a byte-order mark is not data)."""
    if limit < 1:
        raise UserInputError(f"read_text: limit={limit!r}: give a positive number of bytes")
    p = Path(path)
    try:
        with p.open("rb") as file:
            raw = _read_at_most(file, limit + 1)
    except FileNotFoundError:
        raise UserInputError(f"{p}: no such file (expected {what})") from None
    except IsADirectoryError:
        raise UserInputError(f"{p}: is a directory (expected {what})") from None
    except OSError as err:
        raise UserInputError(f"{p}: cannot read: {err.strerror or err} (expected {what})") from None
    if len(raw) > limit:
        raise UserInputError(f"{p}: larger than {limit:,} bytes, too large for {what}; {fix}")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as err:
        raise UserInputError(f"{p}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset "
                         f"{err.start}); save it as UTF-8 (expected {what})") from None
