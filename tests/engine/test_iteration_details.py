"""The per-step details the server logs as vLLM's --enable-logging-iteration-details."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvsched.engine.core import IterationDetails  # noqa: E402
from kvsched.engine.llm import LLM  # noqa: E402
from kvsched.profile.iteration_log import IterationLine, parse_iteration_line  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402


def test_the_log_line_reads_back_with_the_vllm_log_parser() -> None:
    d = IterationDetails(7, 2, 511, 3, 3, 0.10296)
    line = "INFO 2026-11-27 06:40:08,409 " + d.log_line(0.015)
    assert line.endswith("iteration elapsed time: 102.96 ms, CPU KV cache usage: 1.5%")
    assert parse_iteration_line(line) == IterationLine(7, 2, 511, 3, 3, 102.96, engine=0)


def test_context_and_generation_requests_per_step(tiny: Callable[..., Path]) -> None:
    # A 20-token budget: step 1 runs prompt A (12) and the first 8 of B (15);
    # step 2 the rest of B (7) beside A's first decode; then both decode.
    llm = LLM(str(tiny(arch="llama")), max_num_seqs=4, max_num_batched_tokens=20,
              kv_cache_memory="16MiB", enable_prefix_caching=False)
    seen: list[IterationDetails] = []
    llm.engine.iteration_observer = seen.append
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    llm.add_request({"prompt_token_ids": list(range(10, 22))}, params)
    llm.add_request({"prompt_token_ids": list(range(30, 45))}, params)
    while llm.has_unfinished_requests():
        llm.step()
    got = [(d.iteration, d.context_requests, d.context_tokens, d.generation_requests,
            d.generation_tokens) for d in seen]
    assert got == [(1, 2, 20, 0, 0), (2, 1, 7, 1, 1), (3, 0, 0, 2, 2), (4, 0, 0, 1, 1)]
    assert all(d.elapsed_s > 0 for d in seen)
