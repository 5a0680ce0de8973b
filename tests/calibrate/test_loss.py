"""The relative errors of a replay against its run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from calibrate_runs import MODEL

from kvsched.calibrate import SimulatedLatencies, parse_bench, run_errors


def test_run_errors_are_relative_per_request() -> None:
    run = parse_bench({"model_id": MODEL, "input_lens": [10, 20], "output_lens": [1, 3],
                       "ttfts": [0.1, 0.2], "itls": [[], [0.01, 0.01]], "request_rate": "inf"}, "t")
    sim = SimulatedLatencies(np.array([0.11, 0.18]), np.array([math.nan, 0.0125]))
    e = run_errors(run, sim)
    assert e.ttft == pytest.approx([0.1, -0.1]) and e.tpot == pytest.approx([0.25])
