"""The server's Prometheus histograms, fed one request's outputs by hand."""

from __future__ import annotations

import pytest

from kvsched.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvsched.serve.metrics import ServerMetrics

LABELS = {"model_name": "m", "engine": "0"}


def _output(tokens: list[int], metrics: RequestMetrics, reason: str | None = None) -> RequestOutput:
    return RequestOutput("r", None, [1, 2, 3], [CompletionOutput(0, "", tokens, None, None, reason)],
                         reason is not None, metrics)


def test_queue_time_runs_from_arrival_to_first_schedule_and_ttft_to_the_first_token() -> None:
    m = ServerMetrics("m", 64)
    times = RequestMetrics(arrival_time=100.0, first_scheduled_time=101.5, first_token_time=102.0)
    m.observe_output(_output([7], times), now=102.25)
    m.observe_output(_output([7, 8], times), now=102.5)
    m.observe_output(_output([7, 8, 9], times, "length"), now=103.0)
    value = m.registry.get_sample_value
    # Queued while WAITING: arrival (100) to the first schedule (101.5).
    assert value("vllm:request_queue_time_seconds_sum", LABELS) == pytest.approx(1.5)
    assert value("vllm:request_queue_time_seconds_count", LABELS) == 1
    # TTFT is what the client sees: arrival to the first token streamed (102.25).
    assert value("vllm:time_to_first_token_seconds_sum", LABELS) == pytest.approx(2.25)
    # Inter-token gaps 0.25 and 0.5.
    assert value("vllm:inter_token_latency_seconds_sum", LABELS) == pytest.approx(0.75)
    assert value("vllm:inter_token_latency_seconds_count", LABELS) == 2
    assert value("vllm:generation_tokens_total", LABELS) == 3
