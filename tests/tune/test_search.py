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


def test_a_tp_size_the_heads_do_not_split_over_is_a_space_error(capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.cli import main
    from kvsched.tune.search import prune_by_memory

    # Llama-3.1-8B: 32 query heads, 8 KV heads. TP 3 is no memory question.
    with pytest.raises(ValueError, match=r"^search space: tensor_parallel_size=3 \(--tensor-parallel-size\): "
                                         r"must divide the 32 attention heads of meta-llama/Llama-3.1-8B; "
                                         r"use one of 1, 2, 4, 8, 16, 32$"):
        prune_by_memory([Candidate("h100-sxm", 1), Candidate("h100-sxm", 3)],
                        RunSpec().with_engine(model="meta-llama/Llama-3.1-8B"))
    assert main(["tune", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--tp", "3",
                 "--slo", "ttft:500", "--num-prompts", "10", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "must divide the 32 attention heads" in err and "fits in memory" not in err


def test_fewest_gpus_ranks_by_gpu_count_before_goodput() -> None:
    problem = _problem("fewest-gpus")
    # One GPU at 1 req/s of goodput against four GPUs at 20 (5 per GPU):
    # the objective asks for the fewest GPUs, whatever the others make.
    one = problem.evaluated(Candidate("h100-sxm", 1), None, _result(1, 500.0, 1.0))
    four = problem.evaluated(Candidate("h100-sxm", 4), None, _result(4, 9000.0, 20.0))
    assert one.goodput_per_gpu == pytest.approx(1.0) and four.goodput_per_gpu == pytest.approx(5.0)
    assert problem.score(one) > problem.score(four)
    # At the same GPU count, goodput per GPU decides.
    better = problem.evaluated(Candidate("h200", 1), None, _result(1, 900.0, 3.0))
    assert problem.score(better) > problem.score(one)
