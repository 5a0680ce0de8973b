"""The optimiser's units of the host terms, read off the runs' latencies."""

from __future__ import annotations

import pytest
from calibrate_runs import MODEL

from kvsched.calibrate import parse_bench
from kvsched.calibrate.terms import TERM_SCALES, latency_units


def test_units_are_the_latencies_each_term_is_part_of() -> None:
    # Two requests, both due at 0, first token at 0.1 s, four more 0.1 s apart:
    # mean TTFT 0.1 s, mean TPOT 0.1 s, 0.8 s of decoding over a 0.5 s span
    # (1.6 requests decoding at once), prompts of 100 and 300 tokens.
    run = parse_bench({"model_id": MODEL, "input_lens": [100, 300], "output_lens": [5, 5],
                       "ttfts": [0.1, 0.1], "itls": [[0.1] * 4, [0.1] * 4], "request_rate": "inf"}, "t")
    assert run.mean_ttft() == pytest.approx(0.1) and run.mean_tpot() == pytest.approx(0.1)
    assert run.decode_concurrency() == pytest.approx(1.6)
    units = latency_units([run], num_layers=8)
    assert units["step_s"] == pytest.approx(0.1)
    assert units["prefill_step_per_layer_s"] == pytest.approx(0.1 / 8)
    assert units["per_sampled_request_s"] == pytest.approx(0.1 / 1.6)
    assert units["arrival_s"] == pytest.approx(0.1)
    assert units["per_prompt_token_s"] == pytest.approx(0.1 / 200)


def test_a_run_without_output_tokens_keeps_the_typical_step_units() -> None:
    # One-token outputs have no TPOT: the step terms fall back to their
    # typical sizes, the arrival terms still come from the TTFT.
    run = parse_bench({"model_id": MODEL, "input_lens": [50], "output_lens": [1], "ttfts": [0.2],
                       "itls": [[]], "request_rate": "inf"}, "t")
    assert run.mean_tpot() is None and run.decode_concurrency() == 1.0
    units = latency_units([run], num_layers=4)
    assert units["step_s"] == TERM_SCALES["step_s"]
    assert units["per_sampled_request_s"] == TERM_SCALES["per_sampled_request_s"]
    assert units["arrival_s"] == pytest.approx(0.2)
    assert units["per_prompt_token_s"] == pytest.approx(0.2 / 50)
