"""``kvsched serve``'s flags: bad ones are one clear error before anything loads."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from kvsched import cli
from kvsched.serve.metrics import token_buckets


@pytest.mark.parametrize(("argv", "words"), [
    (["serve"], "no model"),
    (["serve", "a", "--model", "b"], "differ"),
    (["serve", "a", "--max-pending-requests", "0"], "--max-pending-requests=0"),
    (["serve", "a", "--port", "70000"], "--port=70000"),
    (["serve", "a", "--api-key", ""], "--api-key"),
])
def test_bad_flags(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert words in capsys.readouterr().err


def test_a_port_in_use_fails_before_the_model_loads(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        # No checkpoint at the path: the port is what fails.
        code = cli.main(["serve", str(tmp_path / "none"), "--host", "127.0.0.1", "--port", str(port)])
    assert code == cli.EXIT_BAD_INPUT
    assert "cannot listen there" in capsys.readouterr().err


def test_the_serve_command_has_vllms_flags() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["serve", "m", "--max-num-seqs", "8", "--max-num-batched-tokens", "64",
                              "--dtype", "float32", "--block-size", "32", "--no-enable-prefix-caching",
                              "--async-scheduling", "--served-model-name", "x", "--port", "9"])
    assert (args.max_num_seqs, args.max_num_batched_tokens, args.dtype, args.block_size) == (
        8, 64, "float32", 32)
    assert (args.enable_prefix_caching, args.async_scheduling, args.served_model_name) == (
        False, True, "x")


def test_token_buckets_are_vllms_1_2_5_series() -> None:
    assert token_buckets(60) == [1, 2, 5, 10, 20, 50]
    assert token_buckets(1000)[-3:] == [200, 500, 1000]
