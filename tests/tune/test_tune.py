"""kvsched tune: the search against brute force, the contract, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kvsched.cli import main
from kvsched.sim.flags import parse_spec
from kvsched.sim.results import json_safe
from kvsched.tune.evaluate import Job, ResultCache, run_job
from kvsched.tune.executors import LocalExecutor
from kvsched.tune.search import Problem, Runner, Slo, prune_by_memory, rank, rate_grid, search
from kvsched.tune.space import Candidate, SearchSpace

WORKLOAD = ["--num-prompts", "60", "--random-input-len", "256", "--random-output-len", "24",
            "--random-range-ratio", "0.5"]


def _problem(model: str, slo: Slo, objective: str = "goodput-per-gpu",
             prices: dict[str, float] | None = None) -> Problem:
    return Problem(model, parse_spec(["--model", model, *WORKLOAD]), slo, objective, prices or {},
                   is_random=True, base_rate=4.0)


def _runner() -> Runner:
    return Runner(LocalExecutor(1), ResultCache(None, "test"))


@dataclass(frozen=True, slots=True)
class _Answer:
    """One candidate at one rate, as the reference reads its full simulation."""

    label: str
    order: tuple[object, ...]
    meets: bool
    goodput_per_gpu: float
    num_gpus: int
    first_metric_ms: float


def _reference_answer(problem: Problem, c: Candidate, rate: float | None) -> _Answer | None:
    """The candidate simulated to the end (no early stop), its objectives
    computed here from vllm bench's keys: the SLO statistic of each target at
    or under it; request goodput over the GPUs (tensor x data parallel)."""
    job = dataclasses.replace(problem.job(c, rate), guard=None)
    result = run_job(job)
    if "error" in result:
        return None
    metrics = result["metrics"]
    stat = "mean" if problem.slo.percentile == "mean" else f"p{problem.slo.percentile}"
    meets = all(metrics[f"{stat}_{name}_ms"] <= target for name, target in problem.slo.targets)
    gpus = c.tensor_parallel_size * c.data_parallel_size
    assert result["num_gpus"] == gpus
    first = problem.slo.targets[0][0]
    return _Answer(c.label(), c.order_key(), meets, metrics["request_goodput"] / gpus, gpus,
                   metrics[f"{stat}_{first}_ms"])


def _brute_force(problem: Problem, candidates: list[Candidate], rates: list[float] | None,
                 ) -> tuple[str | None, list[str]]:
    """Every candidate at every rate, each simulated on its own and to the end;
    the best (most goodput per GPU, then fewer GPUs, then the candidate
    order) and the Pareto front, computed here."""
    assert problem.objective == "goodput-per-gpu"
    answers: list[_Answer] = []
    for c in candidates:
        if rates is None:
            answer = _reference_answer(problem, c, 6.0)
            if answer is not None:
                answers.append(answer)
            continue
        at_rates = [_reference_answer(problem, c, r) for r in rates]
        if any(a is None for a in at_rates):
            continue
        evaluated = [a for a in at_rates if a is not None]
        # The highest grid rate below the first miss (the search's premise).
        feasible: list[_Answer] = []
        for a in evaluated:
            if not a.meets:
                break
            feasible.append(a)
        answers.append(feasible[-1] if feasible else evaluated[0])
    ok = [a for a in answers if a.meets]
    best = min(ok, key=lambda a: (-a.goodput_per_gpu, a.num_gpus, a.order), default=None)
    return (best.label if best else None), _front_by_sweep(ok)


def _front_by_sweep(ok: list[_Answer]) -> list[str]:
    """The Pareto front (more goodput per GPU, less first-metric latency) by a
    sweep, not by the pairwise test the search uses: walking goodput levels
    from the highest down, an answer is on the front when it has its level's
    lowest latency and is strictly faster than everything at higher levels."""
    front: list[str] = []
    faster_above = math.inf
    for level in sorted({a.goodput_per_gpu for a in ok}, reverse=True):
        here = [a for a in ok if a.goodput_per_gpu == level]
        lowest = min(a.first_metric_ms for a in here)
        if lowest < faster_above:
            front += [a.label for a in here if a.first_metric_ms == lowest]
            faster_above = lowest
    return sorted(front)


def test_the_sweep_front_is_the_textbook_one() -> None:
    # Hand-made points (goodput/GPU, latency): b is dominated by a (same
    # goodput, slower), d by c (less goodput, slower), e and f tie exactly.
    def answer(label: str, goodput: float, latency: float) -> _Answer:
        return _Answer(label, (), True, goodput, 1, latency)

    points = [answer("a", 10, 100), answer("b", 10, 150), answer("c", 8, 50), answer("d", 7, 60),
              answer("e", 5, 20), answer("f", 5, 20), answer("g", 4, 20)]
    assert _front_by_sweep(points) == ["a", "c", "e", "f"]


SPACES = {
    "dense": ("meta-llama/Llama-3.1-8B", SearchSpace(
        ("h100-sxm", "h200"), (1, 2), (1, 2), max_num_seqs=(None, 8), max_num_batched_tokens=(None, 512))),
    "moe-ep": ("Qwen/Qwen3-30B-A3B", SearchSpace(
        ("h100-sxm",), (1, 2), (1, 2), enable_expert_parallel=(False, True), max_num_seqs=(None, 8))),
    "admission": ("meta-llama/Llama-3.1-8B", SearchSpace(
        ("h100-sxm",), (1,), (1, 2), admission_policy=("none", "balance", "prefill-cadence"),
        max_num_seqs=(None, 4))),
}


@pytest.mark.parametrize("name", list(SPACES))
@pytest.mark.parametrize("find_max_rate", [False, True])
def test_search_equals_brute_force(name: str, find_max_rate: bool) -> None:
    model, space = SPACES[name]
    slo = Slo((("ttft", 300.0), ("tpot", 30.0)), "99")
    problem = _problem(model, slo)
    candidates = sorted(space.candidates(4, model != "meta-llama/Llama-3.1-8B"),
                        key=lambda c: c.order_key())
    feasible, pruned = prune_by_memory(candidates, problem.base)
    assert feasible and not pruned
    grid = rate_grid(2.0, 1.0, 64.0, 1) if find_max_rate else None
    runner = _runner()
    answers, failed = search(problem, feasible, runner, None if find_max_rate else 6.0, find_max_rate, grid)
    result = rank(problem, answers, pruned, runner, failed)
    best, front = _brute_force(problem, candidates, grid)
    assert best is not None, "the space should have a config meeting the SLO"
    assert result.best is not None and result.best.candidate.label() == best
    assert sorted(e.candidate.label() for e in result.pareto) == front
    if find_max_rate:
        # Binary search: about log2(grid) simulations per candidate, not the grid.
        assert runner.simulated <= len(feasible) * (math.ceil(math.log2(len(grid) + 1)) + 1)
        assert runner.simulated < len(feasible) * len(grid)


def test_memory_prunes_before_simulating() -> None:
    cands = [Candidate("h100-sxm", 1), Candidate("h100-sxm", 4)]
    keep, pruned = prune_by_memory(cands, parse_spec(["--model", "meta-llama/Llama-3.1-70B"]))
    assert keep == [Candidate("h100-sxm", 4)]
    assert pruned[0][0] == Candidate("h100-sxm", 1) and "memory" in pruned[0][1].lower()


def test_results_are_cached_and_resumed(tmp_path: Path) -> None:
    problem = _problem("meta-llama/Llama-3.1-8B", Slo((("ttft", 300.0),), "mean"))
    jobs = [problem.job(Candidate("h100-sxm", 1), r) for r in (2.0, 4.0)]
    first = Runner(LocalExecutor(1), ResultCache(str(tmp_path), "v1"))
    out1 = first.run(jobs)
    again = Runner(LocalExecutor(1), ResultCache(str(tmp_path), "v1"))
    assert again.run(jobs) == [{**r, "job": json_safe(j.identity())} for r, j in zip(out1, jobs)]
    assert (again.simulated, again.cached) == (0, 2)
    other = Runner(LocalExecutor(1), ResultCache(str(tmp_path), "v2"))  # another kvsched version
    other.run(jobs)
    assert other.simulated == 2


def test_the_contract_and_the_reproducing_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tune.json"
    assert main(["tune", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "h200",
                 "--max-gpus", "2", "--tp", "1", "--dp", "1", "2", "--max-num-seqs", "default",
                 "--max-num-batched-tokens", "default", *WORKLOAD, "--target-rate", "6",
                 "--slo", "ttft:300", "tpot:30", "--workers", "1", "--no-cache", "--no-progress",
                 "--save-result", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    best = data["best"]
    assert {"simulate_args", "vllm_serve", "num_gpus", "metrics"} <= set(best)
    assert best["vllm_serve"].startswith("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 1")
    assert best["vllm_serve"] in printed
    assert isinstance(data["pareto"], list) and data["pareto"]
    # Re-simulated alone with simulate, the winner gives the same numbers and meets the SLO.
    again = tmp_path / "again.json"
    assert main(["simulate", *best["simulate_args"], "--goodput", "ttft:300", "tpot:30",
                 "--no-progress", "--save-result", str(again)]) == 0
    metrics: dict[str, Any] = json.loads(again.read_text())
    assert metrics["p99_ttft_ms"] == best["metrics"]["p99_ttft_ms"] <= 300
    assert metrics["p99_tpot_ms"] == best["metrics"]["p99_tpot_ms"] <= 30


@pytest.mark.parametrize("argv, match", [
    (["--hardware", "tpu-v9"], "tpu-v9"),
    (["--slo", "ttft:abc"], "not a number"),
    (["--tp", "0"], "must be an integer"),
    (["--tp", "4"], "search space is empty"),
    (["--max-gpus", "0"], "--max-gpus"),
    (["--model", "meta-llama/Llama-3.1-70B", "--max-gpus", "1"], "fits in memory"),
    (["--objective", "cost"], "--gpu-price"),
    (["--kv-cache-dtype", "int3"], "kv_cache_dtype"),
])
def test_bad_input_is_one_line(argv: list[str], match: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["tune", "--max-gpus", "2", *WORKLOAD, "--slo", "ttft:300", "--no-cache", "--workers", "1",
            "--no-progress"]
    # Later flags win in argparse, so the bad one goes last.
    assert main([*base, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsched: error:") and match in err[0], err


def test_an_impossible_slo_names_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--max-gpus", "1", *WORKLOAD, "--slo", "ttft:0.001", "--no-cache",
                 "--workers", "1", "--no-progress", "--max-num-seqs", "default",
                 "--max-num-batched-tokens", "default"]) == 0
    out = capsys.readouterr().out
    assert "No deployment meets the SLO; the closest is h100-sxm TP1" in out


def test_job_keys_differ_by_what_changes_results() -> None:
    spec = parse_spec(["--model", "x"]).with_options(percentiles=(99.0,), goodput=(("ttft", 1.0),))
    a = Job(spec)
    assert a.key("v") == Job(parse_spec(["--model", "x"]).with_options(
        percentiles=(99.0,), goodput=(("ttft", 1.0),))).key("v")
    assert a.key("v") != a.key("w")
    assert a.key("v") != Job(spec, "digest").key("v")
    assert a.key("v") != Job(spec.with_options(goodput=(("ttft", 2.0),))).key("v")
    assert a.key("v") != Job(spec.with_engine(max_num_seqs=8)).key("v")
    assert a.key("v") != Job(spec, guard="99").key("v")


def test_a_rate_at_the_top_of_the_grid_is_a_lower_bound(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.json"
    assert main(["tune", "--max-gpus", "1", *WORKLOAD, "--request-rate", "2", "--slo", "ttft:100000",
                 "--find-max-rate", "--rate-range", "1", "2", "--rate-steps", "1", "--max-num-seqs",
                 "default", "--max-num-batched-tokens", "default", "--no-cache", "--workers", "1",
                 "--no-progress", "--save-result", str(out)]) == 2
    assert "give one rate" in capsys.readouterr().err
    assert main(["tune", "--max-gpus", "1", *WORKLOAD, "--slo", "ttft:100000", "--find-max-rate",
                 "--rate-range", "1", "2", "--rate-steps", "1", "--max-num-seqs", "default",
                 "--max-num-batched-tokens", "default", "--no-cache", "--workers", "1", "--no-progress",
                 "--save-result", str(out)]) == 0
    printed = capsys.readouterr().out
    best = json.loads(out.read_text())["best"]
    assert best["rate_is_lower_bound"] is True and best["rate"] == 2.0  # 2 x the workload's 1 req/s
    assert ">=2" in printed and "raise --rate-range HIGH" in printed
    assert best["simulate_args"][-2:] == ["--goodput", "ttft:100000"]


def test_a_bad_save_result_path_fails_before_simulating(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--max-gpus", "1", *WORKLOAD, "--slo", "ttft:300", "--no-cache", "--workers",
                 "1", "--no-progress", "--save-result", str(tmp_path / "missing" / "t.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--save-result" in err[0]


def test_a_space_file_sets_dimensions_and_names_a_misspelling(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("tensor_parallel_size: [1]\ndata_parallel_size: [1]\nmax_num_seqs: [default, 4]\n"
                     "max_num_batched_tokens: [default]\nkv_cache_dtype: [auto, fp8]\n")
    out = tmp_path / "t.json"
    assert main(["tune", "--max-gpus", "2", *WORKLOAD, "--slo", "ttft:100000", "--space", str(space),
                 "--no-cache", "--workers", "1", "--no-progress", "--save-result", str(out)]) == 0
    labels = sorted(e["label"] for e in json.loads(out.read_text())["ranked"])
    assert labels == ["h100-sxm TP1", "h100-sxm TP1 kv fp8", "h100-sxm TP1 seqs 4",
                      "h100-sxm TP1 seqs 4 kv fp8"]
    space.write_text("max_num_seq: [4]\n")
    assert main(["tune", "--max-gpus", "2", *WORKLOAD, "--slo", "ttft:300", "--space", str(space),
                 "--no-cache", "--workers", "1", "--no-progress"]) == 2
    assert "did you mean 'max_num_seqs'?" in capsys.readouterr().err
    # A dimension given twice is refused, not read as its last line.
    space.write_text("max_num_seqs: [4]\nmax_num_seqs: [8]\n")
    assert main(["tune", "--max-gpus", "2", *WORKLOAD, "--slo", "ttft:300", "--space", str(space),
                 "--no-cache", "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"--space={space}" in err and "duplicate key 'max_num_seqs'" in err


def test_speculative_decoding_and_the_loop_reach_both_command_lines(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    spec = '{"method": "ngram", "num_speculative_tokens": 2}'
    assert main(["tune", "--max-gpus", "1", *WORKLOAD, "--slo", "ttft:100000", "--max-num-seqs", "default",
                 "--max-num-batched-tokens", "default", "--no-async-scheduling", "--speculative-config",
                 spec, "--spec-acceptance", "0.6,0.3", "--no-cache", "--workers", "1", "--no-progress",
                 "--save-result", str(out)]) == 0
    best = json.loads(out.read_text())["best"]
    args = best["simulate_args"]
    assert "--no-async-scheduling" in args and args[args.index("--speculative-config") + 1] == spec
    assert args[args.index("--spec-acceptance") + 1] == "0.6,0.3"
    # vllm serve takes the loop and the config, not kvsched's acceptance model.
    assert "--no-async-scheduling" in best["vllm_serve"] and "--speculative-config" in best["vllm_serve"]
    assert "--spec-acceptance" not in best["vllm_serve"]
    # The reproducing simulate line runs them: speculative decoding's metrics show.
    assert best["metrics"]["spec_decode_num_drafts"] > 0


# GB200's tables time all-reduce over 2 and 4 GPUs only: Llama-3.1-70B at TP4
# is priced by measured kernels, at TP8 by the roofline ("auto" falls back).
_MIXED = ["tune", "--model", "meta-llama/Llama-3.1-70B", "--hardware", "gb200", "--max-gpus", "8",
          "--tp", "4", "8", "--dp", "1", "--max-num-seqs", "default", "--max-num-batched-tokens", "default",
          *WORKLOAD, "--slo", "ttft:100000", "--no-cache", "--workers", "1", "--no-progress"]


def test_candidates_priced_by_different_backends_are_refused_before_simulating(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: TP8's roofline fallback ranked beside TP4's measured kernels, unsaid.
    assert main(_MIXED) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and captured.out == "", err
    assert "candidates are priced by different step-time backends" in err[0]
    assert "measured: 'gb200 TP4" in err[0] and "roofline-fallback: 'gb200 TP8" in err[0]
    assert "--step-time-backend" in err[0] and "--allow-mixed-pricing" in err[0]


def test_every_candidate_says_its_pricing_and_an_allowed_mix_is_flagged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tune.json"
    assert main([*_MIXED, "--allow-mixed-pricing", "--save-result", str(out)]) == 0
    printed = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["mixed_pricing"] is True
    pricing = {e["candidate"]["tensor_parallel_size"]: (e["pricing"], e["pricing_reason"])
               for e in data["ranked"]}
    assert pricing == {4: ("measured", ""),
                       8: ("roofline-fallback", "measured kernels not used: no measured all-reduce over 8 "
                                                "GPUs on gb200")}
    rows = [line for line in printed.splitlines() if "gb200 TP" in line and line.lstrip()[:1].isdigit()]
    assert {line.split()[-1] for line in rows} == {"measured", "roofline-fallback"}
    assert "warning: --allow-mixed-pricing" in printed
    # Forced to one backend, the same space is searched without the flag.
    assert main([*_MIXED, "--step-time-backend", "roofline", "--save-result", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["mixed_pricing"] is False
    assert {e["pricing"] for e in data["ranked"]} == {"roofline"}
