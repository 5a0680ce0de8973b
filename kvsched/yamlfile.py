"""The one YAML reading every kvsched input file goes through (hardware and
efficiency files, ``compare --variants``, ``tune --space``), and the one
reader of a small YAML-or-JSON option file (:func:`read_options_file`).

PyYAML keeps the last of two equal keys (the first is dropped unread),
recurses on deep ``[``/``{`` nesting and raises ``ValueError`` on an integer
of over 4,300 digits. :func:`parse_yaml` refuses a repeated key, bounds the
flow nesting before parsing and turns every failure into one
:class:`UserInputError` line naming the file, the place and the fix.
PyYAML is imported on the first YAML file, so importing kvsched stays
light.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

from kvsched.errors import UserInputError, one_line
from kvsched.files import read_text
from kvsched.jsonfile import json_problem, number_problem, show, strict_loads

# Deeper flow nesting than any real file needs; PyYAML would recurse on it.
MAX_FLOW_DEPTH = 64
# A variants or search-space file is a few kilobytes.
MAX_OPTIONS_FILE_BYTES = 16 * 2**20


def _flow_depth(text: str) -> int:
    """How deep ``[`` / ``{`` nest in ``text`` (quotes not parsed: an upper bound)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}" and depth:
            depth -= 1
    return deepest


@functools.cache
def _strict_loader(yaml: Any) -> Any:
    """A SafeLoader that refuses a mapping with a repeated key."""

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str | int | float | bool):
                    continue  # unhashable: PyYAML's own error follows
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {show(key)}: keep one", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


def parse_yaml(where: str, text: str, fix: str = "fix the file") -> object:
    """The document in ``text`` (read from ``where``, which names it in any
    error); a problem raises UserInputError ``"{where}: not valid YAML[ at
    line L, column C]: {problem}; {fix}"``."""
    if _flow_depth(text) > MAX_FLOW_DEPTH:
        raise UserInputError(f"{where}: not valid YAML: [ or {{ nested more than {MAX_FLOW_DEPTH} "
                             f"deep; {fix}")
    yaml = importlib.import_module("yaml")
    try:
        return yaml.load(text, Loader=_strict_loader(yaml))  # a SafeLoader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise UserInputError(f"{where}: not valid YAML{at}: {one_line(str(problem), 300)}; {fix}") from None
    except RecursionError:
        raise UserInputError(f"{where}: not valid YAML: nested too deeply; {fix}") from None
    except ValueError as err:  # an integer over Python's 4300 digits
        raise UserInputError(f"{where}: not valid YAML: {number_problem(err)}; {fix}") from None


def read_options_file(path: str, flag: str) -> object:
    """The document in ``path``, given as ``flag`` (``--variants``,
    ``--space``): YAML for a .yaml or .yml name, strict JSON otherwise; any
    problem is one UserInputError line naming the flag, the file and, for a
    syntax error, the place."""
    try:
        text = read_text(path, MAX_OPTIONS_FILE_BYTES, "a YAML or JSON file",
                         fix="a variants or space file is a few kilobytes")
    except UserInputError as e:
        raise UserInputError(f"{flag}={e}") from None
    if path.endswith((".yaml", ".yml")):
        return parse_yaml(f"{flag}={path}", text)
    try:
        return strict_loads(text)
    except ValueError as e:
        raise UserInputError(f"{flag}={path}: {json_problem(e)} (a .yaml or .yml file is read as "
                             "YAML)") from None
