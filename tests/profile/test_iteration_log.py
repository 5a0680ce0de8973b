"""vLLM's iteration log line, parsed (the format of vllm/v1/metrics/loggers.py, 0.32)."""

from __future__ import annotations

from kvsched.profile.iteration_log import IterationLine, parse_iteration_line, parse_kv_cache_tokens

# As the facts file quotes it, and as the server printed it on this machine.
FACTS = ("Engine 000: Iteration(3): 2 context requests, 511 context tokens, 1 generation requests, "
         "1 generation tokens, iteration elapsed time: 102.96 ms, CPU KV cache usage: 1.5%")
SERVER = ("(APIServer pid=25350) INFO 11-26 11:41:37 [loggers.py:199] Engine 000: Iteration(1): 0 context "
          "requests, 0 context tokens, 1 generation requests, 1 generation tokens, iteration elapsed "
          "time: 23.01 ms, CPU KV cache usage: 0.1%\n")


def test_facts_line() -> None:
    assert parse_iteration_line(FACTS) == IterationLine(3, 2, 511, 1, 1, 102.96, engine=0)


def test_server_line_with_its_logger_prefix() -> None:
    assert parse_iteration_line(SERVER) == IterationLine(1, 0, 0, 1, 1, 23.01, engine=0)


def test_gpu_line_with_encoder_suffix_and_other_engine() -> None:
    line = ("Engine 003: Iteration(12045): 0 context requests, 0 context tokens, 64 generation requests, "
            "64 generation tokens, iteration elapsed time: 7.5 ms, GPU KV cache usage: 12.0%, encoder "
            "inputs: 1, encoder output embeddings: 576")
    assert parse_iteration_line(line) == IterationLine(12045, 0, 0, 64, 64, 7.5, engine=3)


def test_dummy_and_other_lines_are_none() -> None:
    dummy = ("Engine 001: Iteration(7): 0 context requests, 0 context tokens, 0 generation requests, "
             "0 generation tokens, iteration elapsed time: 1.20 ms (dummy), GPU KV cache usage: 0.0%")
    assert parse_iteration_line(dummy) is None
    assert parse_iteration_line("INFO: Application startup complete.") is None
    assert parse_iteration_line("Engine 000: Avg prompt throughput: 10.0 tokens/s") is None


def test_kv_cache_size_line() -> None:
    line = ("(EngineCore pid=25620) INFO 11-26 11:41:15 [kv_cache_utils.py:2327] CPU KV cache size: "
            "131,072 tokens, Maximum concurrency for 4,096 tokens per request: 32.00x")
    assert parse_kv_cache_tokens(line) == 131072
    assert parse_kv_cache_tokens("GPU KV cache size: 2,456,736 tokens") == 2456736
    assert parse_kv_cache_tokens(SERVER) is None
