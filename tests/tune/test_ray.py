"""The Ray executor on a local Ray instance: the same results as the process
pool, job for job, and the same answer from ``kvsched tune``. Ray is in the
dev extra, so a missing Ray fails here instead of skipping."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from kvsched.cli import main
from kvsched.sim.flags import parse_spec
from kvsched.tune.evaluate import Job, ResultCache
from kvsched.tune.executors import LocalExecutor, RayExecutor, _check_reachable
from kvsched.tune.search import Problem, Runner, Slo, prune_by_memory, rank, rate_grid, search
from kvsched.tune.space import SearchSpace

MODEL = "meta-llama/Llama-3.1-8B"
WORKLOAD = ["--num-prompts", "40", "--random-input-len", "256", "--random-output-len", "16",
            "--random-range-ratio", "0.5"]
SPACE = SearchSpace(("h100-sxm", "h200"), (1, 2), (1,), max_num_seqs=(None, 8))


@pytest.fixture(scope="module")
def ray_executor() -> Iterator[RayExecutor]:
    """One local Ray instance for the module (starting one takes seconds)."""
    assert not ray.is_initialized()
    executor = RayExecutor(None)
    assert executor.started and ray.is_initialized()
    yield executor
    executor.close()
    assert not ray.is_initialized()


class Recording:
    """An executor that keeps every job and result it ran."""

    def __init__(self, inner: LocalExecutor | RayExecutor) -> None:
        self.inner = inner
        self.log: list[tuple[Job, dict[str, Any]]] = []

    def run(self, jobs: list[Job]) -> Iterator[dict[str, Any]]:
        for job, result in zip(jobs, self.inner.run(jobs)):
            self.log.append((job, result))
            yield result

    def close(self) -> None:
        pass


def _machine_free(result: dict[str, Any]) -> dict[str, Any]:
    # The simulation's wall time is this machine's, kept apart from the metrics.
    return {k: v for k, v in result.items() if k != "wall_seconds"}


def _tune(executor: LocalExecutor | RayExecutor) -> tuple[list[tuple[Job, dict[str, Any]]], dict[str, Any]]:
    # An SLO the candidates sustain at different rates of the grid.
    slo = Slo((("ttft", 300.0), ("tpot", 15.0)), "99")
    problem = Problem(MODEL, parse_spec(["--model", MODEL, *WORKLOAD]), slo, "goodput-per-gpu", {},
                      is_random=True, base_rate=4.0)
    candidates = sorted(SPACE.candidates(2, False), key=lambda c: c.order_key())
    feasible, pruned = prune_by_memory(candidates, problem.base)
    recording = Recording(executor)
    runner = Runner(recording, ResultCache(None, "test"))
    answers, failed = search(problem, feasible, runner, None, True, rate_grid(2.0, 1.0, 32.0, 1))
    result = rank(problem, answers, pruned, runner, failed)
    ranked = {
        "ranked": [(e.candidate.label(), e.rate, e.meets_slo, e.metrics) for e in result.ranked],
        "best": result.best.candidate.label() if result.best else None,
        "pareto": sorted(e.candidate.label() for e in result.pareto),
    }
    return recording.log, ranked


# Starting Ray takes ~5 s: the Ray tests are the slow tier.
@pytest.mark.slow
def test_ray_gives_the_process_pools_results(ray_executor: RayExecutor) -> None:
    local = LocalExecutor(2)
    try:
        local_log, local_ranked = _tune(local)
    finally:
        local.close()
    ray_log, ray_ranked = _tune(ray_executor)
    assert len(local_log) > len(list(SPACE.candidates(2, False)))  # the rate was bisected
    assert [job for job, _ in ray_log] == [job for job, _ in local_log]
    assert [_machine_free(r) for _, r in ray_log] == [_machine_free(r) for _, r in local_log]
    assert any("metrics" in r for _, r in ray_log)
    assert ray_ranked == local_ranked
    assert ray_ranked["best"] is not None and ray_ranked["pareto"]


@pytest.mark.slow
def test_the_cli_gives_the_same_best_on_ray(ray_executor: RayExecutor, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def tune(executor: str) -> dict[str, Any]:
        out = tmp_path / f"{executor}.json"
        assert main(["tune", "--model", MODEL, "--hardware", "h100-sxm", "h200", "--max-gpus", "2",
                     "--tp", "1", "2", "--dp", "1", "--max-num-seqs", "default",
                     "--max-num-batched-tokens", "default", *WORKLOAD, "--target-rate", "6",
                     "--slo", "ttft:300", "tpot:30", "--executor", executor, "--workers", "2",
                     "--no-cache", "--no-progress", "--save-result", str(out)]) == 0
        data: dict[str, Any] = json.loads(out.read_text())
        return data

    local, on_ray = tune("local"), tune("ray")
    assert on_ray["best"] is not None
    assert on_ray["best"]["simulate_args"] == local["best"]["simulate_args"]
    assert on_ray["best"]["metrics"] == local["best"]["metrics"]
    assert on_ray["pareto"] == local["pareto"]
    # The CLI used the instance it found and left it running.
    assert ray.is_initialized()
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_close_shuts_down_only_its_own_instance(ray_executor: RayExecutor) -> None:
    joined = RayExecutor(None)  # Ray is already up: used as it is
    assert not joined.started
    joined.close()
    assert ray.is_initialized()


def test_an_address_where_no_cluster_answers_is_a_quick_error() -> None:
    # Ray itself would retry it for minutes.
    with pytest.raises(ValueError, match=r"--ray-address 127\.0\.0\.1:1: no Ray cluster answers"):
        _check_reachable("127.0.0.1:1")
    _check_reachable("auto")  # left to Ray


def test_core_and_simulate_do_not_import_ray() -> None:
    code = ("import sys, kvsched, kvsched.cli, kvsched.commands.simulate, kvsched.commands.tune, "
            "kvsched.tune.executors; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
