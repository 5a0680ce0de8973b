"""The one strict JSON reading every kvsched input file goes through
(:mod:`kvsched.files` reads the file, within its size bound).

Python's ``json.loads`` keeps the last of two equal keys (the first is
dropped unread), accepts ``NaN`` and ``Infinity``, and fails on a deep
nesting with ``RecursionError``. :func:`strict_loads` refuses a repeated key
and turns every failure into a ``ValueError`` with a one-line reason; the
caller adds the file (and line) it read.
"""

from __future__ import annotations

import json
from typing import Any

from kvsched.errors import UserInputError
from kvsched.files import read_text


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice."""


def show(value: object, limit: int = 60) -> str:
    """``value`` for an error message, the one formatter every input check
    uses: huge integers by their length, lists and objects of more than 8
    items by their size (never a repr of a million items), long reprs cut."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"{'-' if value < 0 else ''}<a {len(str(abs(value)))}-digit integer>"
    if isinstance(value, list | dict) and len(value) > 8:
        return f"<a {type(value).__name__} of {len(value)} items>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} characters)"


def field_mismatch(data: dict[str, Any], expected: set[str] | frozenset[str],
                   optional: set[str] | frozenset[str] = frozenset()) -> str:
    """What an object's keys get wrong against the fields a record takes
    (``"missing a, b; unknown c"``), or ``""`` when nothing: one wording for
    every file reader that checks a record's keys."""
    missing = sorted(expected - data.keys() - optional)
    unknown = sorted(data.keys() - expected)
    return "; ".join(part for part in (f"missing {', '.join(missing)}" if missing else "",
                                       f"unknown {', '.join(unknown)}" if unknown else "") if part)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a repeated key."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                raise DuplicateKeyError(f"duplicate key {show(key)} (values {show(seen[key])} and "
                                        f"{show(value)}); JSON readers differ on which counts: keep one")
            seen[key] = value
    return obj


class DuplicateKeys(dict[str, Any]):
    """A JSON object that named a key twice, read by :func:`strict_loads`
    with ``mark_duplicates=True``: the later value kept, ``duplicate`` the
    first repeated key and its two values, for a reader that reports it with
    the object's path (a scenario's ``requests[1].request_id``)."""

    duplicate: tuple[str, Any, Any]


def mark_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` returning a :class:`DuplicateKeys` for an object
    that repeats a key (the caller must look for it)."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            marked = DuplicateKeys(obj)
            marked.duplicate = (key, seen[key], value)
            return marked
        seen[key] = value
    raise AssertionError("mark_duplicates: fewer keys than pairs without a repeat")  # pragma: no cover


def _no_constant(name: str) -> object:
    raise UserInputError(f"{name} is not a JSON number; give a finite number")


def strict_loads(text: str, *, constants: bool = True, mark_duplicates_for_caller: bool = False) -> Any:
    """``json.loads`` refusing repeated keys (and, with ``constants=False``,
    NaN and Infinity). Every failure is a ValueError: JSONDecodeError for
    bad syntax (its msg, line and column), DuplicateKeyError, or one naming
    an over-long integer or a nesting too deep. With
    ``mark_duplicates_for_caller`` a repeated key is not an error here: its
    object comes back as a :class:`DuplicateKeys` for the caller to refuse
    with the object's path."""
    hook = mark_duplicates if mark_duplicates_for_caller else unique_keys
    try:
        if constants:
            return json.loads(text, object_pairs_hook=hook)
        return json.loads(text, object_pairs_hook=hook, parse_constant=_no_constant)
    except RecursionError:
        raise UserInputError("nested too deeply") from None


def number_problem(e: ValueError) -> str:
    """A parser's ValueError in words: Python's limit on integer digits."""
    text = str(e)
    return "a number has more than 4,300 digits" if text.startswith("Exceeds the limit") else text


def json_problem(e: ValueError) -> str:
    """One line for a :func:`strict_loads` failure, without the file."""
    if isinstance(e, json.JSONDecodeError):
        return f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    if isinstance(e, DuplicateKeyError):
        return str(e)
    return f"not valid JSON ({number_problem(e)[:200]})"  # digits, NaN, nesting


def read_json_file(path: str, limit: int, what: str, *, fix: str, label: str) -> Any:
    """The strict JSON value of the file at ``path`` (at most ``limit``
    bytes): the one reader of kvsched's own JSON files (host terms, step
    profiles, roofline factors). ``what`` and ``fix`` as for
    :func:`kvsched.files.read_text`; ``label`` names the file in the error
    when it is not JSON (``"calibration file 'x.json'"``)."""
    text = read_text(path, limit, what, fix=fix)
    try:
        return strict_loads(text)
    except ValueError as e:
        raise UserInputError(f"{label} is not JSON: {json_problem(e)}") from None

