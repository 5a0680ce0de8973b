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


def test_loss_residuals_weigh_each_metric_of_a_run_by_its_group_count() -> None:
    from kvsched.calibrate.loss import LossGroups, loss_residuals
    from kvsched.calibrate.run_files import ObservedRun

    # 40 requests: two TTFT groups by prompt length (20 each, the minimum),
    # one TPOT group (only 20 requests have more than one output token).
    inputs = tuple([100] * 20 + [900] * 20)
    outputs = tuple([1] * 20 + [5] * 20)
    ttfts = tuple([0.1] * 20 + [0.5] * 20)
    tpots = tuple([None] * 20 + [0.02] * 20)
    run = ObservedRun("t", MODEL, inputs, outputs, tuple(range(40)), None, "given",
                      ttfts=ttfts, tpots=tpots)
    groups = LossGroups.of(run, groups=4)
    assert [len(g) for g in groups.ttft] == [20, 20] and [len(g) for g in groups.tpot] == [20]
    # Simulated: the short prompts' TTFT 20 % high, the long ones' exact, TPOT 10 % low.
    sim = SimulatedLatencies(np.array([0.12] * 20 + [0.5] * 20), np.array([math.nan] * 20 + [0.018] * 20))
    r = loss_residuals(run, sim, groups)
    # Each metric's errors over the square root of how many there are, so a
    # run's TTFT weighs as much as its TPOT however finely it is grouped.
    assert r == pytest.approx([0.2 / math.sqrt(2), 0.0, -0.1])
