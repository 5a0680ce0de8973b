"""No traceback reaches a user: a library error is one ``kvsched: error:``
line and exit status 2; any other exception is a bug, one ``kvsched:
internal error:`` line saying where to report it and status 3; ``--debug``
(before the command) shows the traceback instead; Ctrl-C is one line and 130."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from kvsched import cli
from kvsched.commands import simulate as command
from kvsched.errors import CannotServe, UserInputError


def failing(exc: BaseException) -> object:
    def run(args: argparse.Namespace) -> int:
        raise exc

    return run


def one_line_of(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("exc, words", [
    (TypeError("unsupported operand"), ["TypeError", "unsupported operand"]),
    (KeyError("a"), ["KeyError", "'a'"]),
    (ZeroDivisionError("float division by zero"), ["ZeroDivisionError"]),
    (AttributeError("'NoneType' object has no attribute 'x'"), ["AttributeError"]),
    (RecursionError("maximum recursion depth exceeded"), ["RecursionError"]),
    (MemoryError(), ["out of memory", "MemoryError"]),
    (AssertionError("line one\nline two"), ["AssertionError", "line one line two"]),
    # A ValueError or RuntimeError that is not a UserInputError is kvsched's own
    # (an unguarded int(), a broken invariant): never blamed on the user.
    (ValueError("invalid literal for int() with base 10: 'x'"), ["ValueError", "invalid literal"]),
    (RuntimeError("the scheduler and the runner are out of step"), ["RuntimeError", "out of step"]),
])
def test_an_unexpected_exception_is_one_internal_error_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        exc: BaseException, words: list[str]) -> None:
    monkeypatch.setattr(command, "run_simulate", failing(exc))
    assert cli.main(["simulate"]) == cli.EXIT_INTERNAL_ERROR == 3
    line = one_line_of(capsys)
    assert line.startswith("kvsched: internal error: ")
    for word in [*words, "please report it with the command line at the kvsched issue tracker",
                 "--debug"]:
        assert word in line, (word, line)


def test_the_internal_error_line_says_where_it_was_raised(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    def run(args: argparse.Namespace) -> int:
        return len(None)  # type: ignore[arg-type]

    monkeypatch.setattr(command, "run_simulate", run)
    assert cli.main(["simulate"]) == 3
    assert "TypeError at test_cli_errors.py:" in one_line_of(capsys)


@pytest.mark.parametrize("exc", [TypeError("bug"), MemoryError(), RecursionError("deep"),
                                 ValueError("bad flag"), KeyboardInterrupt()])
def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    monkeypatch.setattr(command, "run_simulate", failing(exc))
    with pytest.raises(type(exc)):
        cli.main(["--debug", "simulate"])


def test_debug_is_a_flag_of_kvsched_itself() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["--debug", "simulate"]).debug is True
    assert parser.parse_args(["simulate"]).debug is False


def test_debug_after_the_command_counts_too() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["simulate", "--debug"]).debug is True
    assert parser.parse_args(["tune", "--slo", "ttft:1", "--debug"]).debug is True


@pytest.mark.parametrize("argv", [["simulate", "--num-prom", "10"], ["simulate", "--max-num-s", "4"],
                                  ["compare", "--variant", "a:", "--num-prom", "3"],
                                  ["tune", "--slo", "ttft:1", "--max-gpu", "2"]])
def test_abbreviated_flags_are_refused(argv: list[str]) -> None:
    # vLLM's own parser refuses abbreviations; kvsched took --num-prom as --num-prompts.
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(argv)
    assert exit_info.value.code == 2


@pytest.mark.parametrize("exc, words", [
    (UserInputError("--block-size=0: must be a multiple of 16\n(vLLM's default is 16)"),
     ["--block-size=0: must be a multiple of 16 (vLLM's default is 16)"]),
    (FileNotFoundError(2, "No such file or directory", "t.csv"), ["No such file", "t.csv"]),
    (CannotServe("no request could be scheduled at t=1.000s"), ["no request could be scheduled"]),
    (UserInputError(""), ["UserInputError"]),
])
def test_a_user_input_error_is_one_error_line_and_status_2(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        exc: BaseException, words: list[str]) -> None:
    monkeypatch.setattr(command, "run_simulate", failing(exc))
    assert cli.main(["simulate"]) == 2
    line = one_line_of(capsys)
    assert line.startswith("kvsched: error: ")
    for word in words:
        assert word in line, (word, line)


def test_ctrl_c_is_one_line_and_status_130(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(command, "run_simulate", failing(KeyboardInterrupt()))
    assert cli.main(["simulate"]) == 130
    assert one_line_of(capsys) == "kvsched: interrupted"


def test_a_very_long_message_is_cut(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(command, "run_simulate", failing(UserInputError("x" * 10_000)))
    assert cli.main(["simulate"]) == 2
    line = one_line_of(capsys)
    assert len(line) < 2100 and line.endswith("(10000 characters)")


def test_a_missing_module_outside_the_engine_is_not_blamed_on_torch(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(command, "run_simulate", failing(ModuleNotFoundError("no yaml", name="yaml")))
    assert cli.main(["simulate"]) == 2
    line = one_line_of(capsys)
    assert "yaml" in line and "torch" not in line


def test_a_real_bad_input_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"arrival_time": 0, "input_tokens": 5, "output_tokens": 1}\n\xff\xfe\n')
    assert cli.main(["simulate", "--dataset-name", "jsonl", "--dataset-path", str(path),
                     "--no-progress"]) == 2
    line = one_line_of(capsys)
    assert str(path) in line and "not UTF-8" in line


def test_compare_reports_a_bug_in_one_variant_as_an_internal_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.commands import compare

    real_run = compare.run_prepared

    def run_prepared(prepared: Any, *rest: Any) -> Any:
        if prepared.spec.engine.max_num_seqs == 7:
            raise KeyError("a")
        return real_run(prepared, *rest)

    monkeypatch.setattr(compare, "run_prepared", run_prepared)
    status = cli.main(["compare", "--num-prompts", "4", "--random-input-len", "32", "--random-output-len",
                       "4", "--no-progress", "--step-time-backend", "roofline", "--variant", "a:",
                       "--variant", "b: --max-num-seqs 7"])
    assert status == 3
    err = capsys.readouterr().err.strip().split("\n")
    assert err[0].startswith("kvsched: internal error: variant 'b': KeyError: 'a'; ")
    assert "issue tracker" in err[0]
    assert err[1] == "kvsched: error: 1 of 2 variants failed: 'b'"
