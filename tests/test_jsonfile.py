"""kvsched.jsonfile: the one strict JSON parse. Repeated keys are refused
(or, for a reader that reports the key's path itself, marked), NaN and
Infinity are refused where asked, and every failure is a ValueError."""

from __future__ import annotations

import math

import pytest

from kvsched.jsonfile import DuplicateKeyError, DuplicateKeys, json_problem, strict_loads


def test_a_repeated_key_is_refused_with_both_values() -> None:
    with pytest.raises(DuplicateKeyError, match=r"duplicate key 'a' \(values 1 and 2\)"):
        strict_loads('{"a": 1, "a": 2}')


def test_a_repeated_key_is_marked_for_a_caller_that_names_its_path() -> None:
    data = strict_loads('{"x": {"a": 1, "b": 0, "a": 2}, "y": {"c": 3}}', mark_duplicates_for_caller=True)
    inner = data["x"]
    assert isinstance(inner, DuplicateKeys) and inner.duplicate == ("a", 1, 2)
    assert not isinstance(data, DuplicateKeys) and not isinstance(data["y"], DuplicateKeys)
    assert data["y"] == {"c": 3}


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_constants_are_refused_only_when_asked(text: str) -> None:
    value = strict_loads(f"[{text}]")[0]  # accepted by default, as Python's json does
    assert isinstance(value, float) and not math.isfinite(value)
    with pytest.raises(ValueError) as info:
        strict_loads(f"[{text}]", constants=False)
    assert json_problem(info.value) == f"not valid JSON ({text} is not a JSON number; give a finite number)"


def test_syntax_and_nesting_are_one_line_each() -> None:
    with pytest.raises(ValueError) as info:
        strict_loads('{"a": }')
    assert json_problem(info.value) == "not valid JSON (Expecting value at line 1 column 7)"
    with pytest.raises(ValueError) as info:
        strict_loads("[" * 100_000)
    assert json_problem(info.value) == "not valid JSON (nested too deeply)"
