"""vLLM's engine flags are one definition shared by every command: the same
default and help wherever a command takes the flag as one value."""

from __future__ import annotations

import argparse

import pytest

from kvsched.cli import build_parser


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _action(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((a for a in parser._actions if flag in a.option_strings), None)


@pytest.mark.parametrize("flag, default", [
    # None: the release's default, resolved for the deployment
    # (kvsched.scheduler_defaults.resolve_cache_defaults).
    ("--block-size", None),
    ("--gpu-memory-utilization", None),
])
def test_one_definition_serves_every_command(flag: str, default: object) -> None:
    commands = _subparsers()
    seen = {}
    for name in ("simulate", "compare", "tune", "generate", "calibrate"):
        action = _action(commands[name], flag)
        assert action is not None, f"{name} lacks {flag}"
        seen[name] = action
    assert {a.default for a in seen.values()} == {default}
    # The help text comes from the one definition (simulate/compare/tune/calibrate
    # share simulate's wording; generate words its scope on its own).
    helps = {name: a.help for name, a in seen.items() if name != "generate"}
    assert len(set(helps.values())) == 1, helps


def test_tune_takes_the_shared_settings_as_single_values() -> None:
    tune = _subparsers()["tune"]
    for flag in ("--max-model-len", "--dtype", "--async-scheduling", "--speculative-config"):
        action = _action(tune, flag)
        assert action is not None and action.nargs in (None, 0), flag
    # The searched ones stay lists.
    seqs = _action(tune, "--max-num-seqs")
    assert seqs is not None and seqs.nargs == "+"
