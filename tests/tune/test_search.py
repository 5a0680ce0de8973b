"""The tuner's objectives on results written here (no simulation): what a
candidate costs and how candidates rank."""

from __future__ import annotations

import pytest

from kvsched.sim.spec import RunSpec
from kvsched.tune.search import Problem, Slo
from kvsched.tune.space import Candidate


def _problem(objective: str) -> Problem:
    return Problem("meta-llama/Llama-3.1-8B", RunSpec(), Slo((("ttft", 500.0),), "mean"), objective,
                   {"h100-sxm": 3.0, "h200": 4.0}, is_random=True, base_rate=1.0)


def _result(num_gpus: int, output_throughput: float, goodput: float) -> dict[str, object]:
    return {"num_gpus": num_gpus, "metrics": {"output_throughput": output_throughput,
                                              "request_goodput": goodput, "mean_ttft_ms": 100.0}}


def test_cost_per_million_tokens_pays_for_every_gpu() -> None:
    problem = _problem("cost")
    # 4 H100s at $3 an hour make 2,000 tokens/s: $12 per 7.2 million tokens.
    e = problem.evaluated(Candidate("h100-sxm", 4), None, _result(4, 2000.0, 8.0))
    assert e.cost_per_mtok == pytest.approx(12.0 / 7.2)
    assert e.goodput_per_gpu == pytest.approx(2.0)
    one = problem.evaluated(Candidate("h100-sxm", 1), None, _result(1, 2000.0, 8.0))
    assert one.cost_per_mtok == pytest.approx(3.0 / 7.2)


def test_the_cost_objective_prefers_fewer_gpus_at_the_same_throughput() -> None:
    problem = _problem("cost")
    # Same tokens/s on one H200 ($4/h) and on two H100s ($6/h): the H200 is cheaper.
    h200 = problem.evaluated(Candidate("h200", 1), None, _result(1, 1000.0, 1.0))
    h100s = problem.evaluated(Candidate("h100-sxm", 2), None, _result(2, 1000.0, 2.0))
    assert problem.score(h200) > problem.score(h100s)
