"""kvsched.files.read_text: the one bounded reader of input files. Each
failure is one ValueError naming the file, what was expected and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsched.files import read_text

WHAT = "a test file (JSON)"


def test_reads_up_to_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_bytes(b'{"a": "\xc3\xa9"}')  # 12 bytes, an é in UTF-8
    assert read_text(path, 12, WHAT) == '{"a": "é"}'
    assert read_text(str(path), 12, WHAT) == '{"a": "é"}'  # a str path too


def test_one_byte_over_the_bound_is_refused_naming_the_bound_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 1001)
    with pytest.raises(ValueError) as info:
        read_text(path, 1000, WHAT, fix="split it")
    assert str(info.value) == f"{path}: larger than 1,000 bytes, too large for {WHAT}; split it"


def test_an_endless_file_is_not_read_past_the_bound() -> None:
    # /dev/zero never ends: only a reader that stops at the bound returns.
    with pytest.raises(ValueError, match=r"/dev/zero: larger than 4,096 bytes, too large for a test file"):
        read_text("/dev/zero", 4096, WHAT)


def test_missing_file_and_folder_say_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        read_text(tmp_path / "nope.json", 10, WHAT)
    assert str(info.value) == f"{tmp_path / 'nope.json'}: no such file (expected {WHAT})"
    with pytest.raises(ValueError) as info:
        read_text(tmp_path, 10, WHAT)
    assert str(info.value) == f"{tmp_path}: is a directory (expected {WHAT})"


def test_not_utf8_names_the_byte_and_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(ValueError) as info:
        read_text(path, 100, WHAT)
    assert str(info.value) == (f"{path}: not UTF-8 text (byte 0xe9 at offset 7); save it as UTF-8 "
                               f"(expected {WHAT})")


def test_a_byte_order_mark_is_dropped_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_bytes(b"\xef\xbb\xbfa,b\n")
    assert read_text(path, 100, WHAT, encoding="utf-8-sig") == "a,b\n"
    assert read_text(path, 100, WHAT) == "\ufeffa,b\n"


def test_the_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"limit=0: give a positive number of bytes"):
        read_text(tmp_path / "x", 0, WHAT)
