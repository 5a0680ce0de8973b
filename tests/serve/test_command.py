"""``kvsched serve``'s flags: bad ones are one clear error before anything loads."""

from __future__ import annotations

import json
import logging
import socket
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from kvsched import cli
from kvsched.profile.iteration_log import parse_iteration_line, parse_kv_cache_tokens
from kvsched.serve.metrics import token_buckets
from tests.serve.conftest import start_server


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


def test_the_server_logs_vllms_kv_size_and_iteration_lines(tiny: Callable[..., Path],
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kvsched.serve")
    running = start_server(tiny(arch="llama"), log_iteration_details=True)
    try:
        req = urllib.request.Request(
            f"{running.url}/v1/completions", method="POST", headers={"content-type": "application/json"},
            data=json.dumps({"model": "tiny", "prompt": [5, 6, 7, 8, 9, 10], "max_tokens": 3,
                             "temperature": 0, "ignore_eos": True}).encode())
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
        assert running.server.engine.wait_idle(60)
    finally:
        running.stop()
    messages = [r.getMessage() for r in caplog.records if r.name == "kvsched.serve"]
    cache = running.server.engine.llm.engine.cache_config
    sizes = [t for t in map(parse_kv_cache_tokens, messages) if t is not None]
    assert sizes == [cache.num_gpu_blocks * cache.block_size]
    steps = [s for s in map(parse_iteration_line, messages) if s is not None]
    # The 6-token prompt in one step, then two single-token decodes.
    assert [(s.iteration, s.context_requests, s.context_tokens, s.generation_requests,
             s.generation_tokens) for s in steps] == [(1, 1, 6, 0, 0), (2, 0, 0, 1, 1), (3, 0, 0, 1, 1)]
