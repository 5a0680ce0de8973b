"""Async scheduling and speculative decoding in the simulator.

- async scheduling changes decisions (vLLM's async engine loop: a request
  that arrives while a step runs is admitted one step later) and timing
  (the CPU work overlaps the forward pass), never what a request receives;
- every request finishes with exactly its output length whatever the
  features (a hypothesis fuzzer over small workloads);
- the simulated acceptance statistics (vLLM's spec-decode metrics)
  converge to the configured per-position rates;
- the drafter is priced and its memory taken from the KV budget;
- bad --speculative-config / --spec-acceptance values are one error line
  naming the field, exit status 2.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsched.cli import main
from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.core.policies import DPRankStates
from kvsched.perf import get_hardware, get_model
from kvsched.perf.drafter import Drafter, drafter_shape
from kvsched.perf.step_time import (
    BatchShape,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    cudagraph_capture_sizes,
)
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.dp import DPOptions, DPSimulator
from kvsched.sim.rank import SimResult
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.speculative import (
    AcceptanceModel,
    SpecOptions,
    default_rates,
    parse_speculative_config,
    rates_from_length,
    request_key,
    uniform,
)
from kvsched.sim.workload import (
    HASH_BLOCK_TOKEN_BASE,
    UNIQUE_TOKEN_BASE,
    Workload,
    WorkloadRequest,
    random_workload,
)

H100 = get_hardware("h100-sxm")
LLAMA = get_model("Llama-3.1-8B")
DEEPSEEK = get_model("deepseek-ai/DeepSeek-V3")
SYNC_MODEL = StepTimeModel(LLAMA, H100, runtime=RuntimeConfig(async_scheduling=False))
ASYNC_MODEL = StepTimeModel(LLAMA, H100, runtime=RuntimeConfig(async_scheduling=True))
MOE = get_model("Qwen3-30B-A3B")
MOE_SYNC = StepTimeModel(MOE, H100, ParallelConfig(1, 2, True), RuntimeConfig(async_scheduling=False))
MOE_ASYNC = StepTimeModel(MOE, H100, ParallelConfig(1, 2, True), RuntimeConfig(async_scheduling=True))
# CI runs 300 fuzz examples; KVSCHED_SPEC_FUZZ_EXAMPLES=N runs more.
FUZZ_EXAMPLES = int(os.environ.get("KVSCHED_SPEC_FUZZ_EXAMPLES", "300"))
SMALL = ["--num-prompts", "30", "--random-input-len", "200", "--random-output-len", "24", "--no-progress"]


def _req(i: int, prompt: int, output: int, at: float) -> WorkloadRequest:
    """Request i: a prompt no other request shares."""
    return WorkloadRequest(str(i), at, ((UNIQUE_TOKEN_BASE + i, prompt),), output)


def _spec(method: str, rates: tuple[float, ...]) -> SpecOptions:
    return SpecOptions(method, len(rates), AcceptanceModel(rates, "test"))


def _sim(workload: Workload, *, use_async: bool, spec: SpecOptions | None = None,
         eos: float = 0.0, caching: bool = True, blocks: int = 3000, **sched: Any) -> SimResult:
    sc = SchedulerConfig(**{"max_num_batched_tokens": 1024, "max_num_seqs": 32, "max_model_len": 4096,
                            **sched, "async_scheduling": use_async})
    cc = CacheConfig(num_gpu_blocks=blocks, block_size=16, enable_prefix_caching=caching)
    config = SimConfig(sc, cc, ASYNC_MODEL if use_async else SYNC_MODEL, eos_probability=eos, seed=5,
                       speculative=spec)
    sim = Simulator(config, workload)
    result = sim.run()
    sim.sched.check_invariants()
    assert not sim.sched.has_unfinished_requests() and not sim.instance.busy()
    return result


def _outputs(result: SimResult) -> dict[str, int]:
    return {r.request_id: r.num_output_tokens for r in result.records}


# -- async scheduling ---------------------------------------------------------------


def test_async_gives_every_request_its_tokens_and_overlaps_the_cpu() -> None:
    workload = random_workload(num_prompts=40, input_len=300, output_len=60, range_ratio=0.5, seed=3)
    sync = _sim(workload, use_async=False)
    overlap = _sim(workload, use_async=True)
    want = {r.request_id: r.output_len for r in workload.requests}
    assert _outputs(sync) == _outputs(overlap) == want
    ms, ma = sync.metrics(), overlap.metrics()
    # All at t=0: the CPU work hidden behind the forward pass shortens every
    # step, so both the first token and every later one come sooner.
    assert ma["mean_tpot_ms"] < ms["mean_tpot_ms"]
    assert ma["mean_ttft_ms"] < ms["mean_ttft_ms"]
    assert ma["duration"] < ms["duration"]


def test_async_admits_an_arrival_one_step_later() -> None:
    """vLLM's async loop schedules batch N+1 as batch N starts: a request
    arriving while N runs joins N+2 (synchronously: N+1)."""
    # b arrives during a's decode.
    workload = Workload("two", [_req(0, 64, 200, 0.0), _req(1, 64, 8, 0.050)])
    for use_async in (False, True):
        sc = SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=8, max_model_len=4096,
                             async_scheduling=use_async)
        config = SimConfig(sc, CacheConfig(num_gpu_blocks=500), SYNC_MODEL, seed=1, keep_step_log=True)
        result = Simulator(config, workload).run()
        assert result.steps is not None
        starts = list(result.steps.start)
        num_reqs = list(result.steps.num_reqs)
        # The first step (the one running at 0.050 s) and the first with b.
        running = max(i for i, s in enumerate(starts) if s <= 0.050)
        joined = next(i for i, n in enumerate(num_reqs) if n == 2)
        assert joined == running + (2 if use_async else 1)


def test_async_wastes_the_step_after_an_eos() -> None:
    """A request that stops on EOS in step N is already in step N+1 (its
    stop is not known when N+1 is scheduled): that step carries it for
    nothing, and it still receives exactly its tokens up to the EOS."""
    workload = random_workload(num_prompts=30, input_len=100, output_len=80, range_ratio=0.3, seed=9)
    sync = _sim(workload, use_async=False, eos=0.05)
    overlap = _sim(workload, use_async=True, eos=0.05)
    # Same EOS draws (seeded per rank, in arrival order): same outputs.
    assert _outputs(sync) == _outputs(overlap)
    assert any(n < r.output_len for n, r in zip(_outputs(sync).values(), workload.requests))
    # The wasted slots: more request-steps than tokens produced plus prefill chunks.
    assert overlap.totals.num_reqs > sync.totals.num_reqs


def test_async_lockstep_dp_ranks_finish_every_request() -> None:
    moe = get_model("Qwen3-30B-A3B")
    model = StepTimeModel(moe, H100, runtime=RuntimeConfig(async_scheduling=True))
    sc = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=4096,
                         async_scheduling=True)
    config = SimConfig(sc, CacheConfig(num_gpu_blocks=800), model, seed=2)
    workload = random_workload(num_prompts=40, input_len=200, output_len=30, range_ratio=0.5,
                               request_rate=50.0, seed=4)
    options = DPOptions(4, lockstep=True, sync_interval=4)
    sim = DPSimulator(config, workload, options, shared=DPRankStates(4, 4))
    result = sim.run().combined()
    assert sorted(_outputs(result).items()) == sorted((r.request_id, r.output_len) for r in workload.requests)
    assert not any(inst.busy() for inst in sim.instances)


# -- every request finishes: a fuzzer -----------------------------------------------


@st.composite
def _cases(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 12))
    shared = draw(st.booleans())
    requests = []
    for i in range(n):
        prompt, output, at = draw(st.integers(1, 150)), draw(st.integers(1, 50)), draw(st.floats(0.0, 0.3))
        if shared:
            # Prompts of 16-token blocks from a few: prefix-cache hits, some of
            # all but the last token (padded admissions).
            runs = tuple((HASH_BLOCK_TOKEN_BASE + draw(st.integers(0, 2)), 16) for _ in range(prompt // 16))
            runs = runs + (((UNIQUE_TOKEN_BASE + i, prompt % 16),) if prompt % 16 else ())
            requests.append(WorkloadRequest(str(i), at, runs or ((UNIQUE_TOKEN_BASE + i, 1),), output))
        else:
            requests.append(_req(i, prompt, output, at))
    k = draw(st.integers(1, 4))
    rates = tuple(sorted((draw(st.floats(0.0, 1.0)) for _ in range(k)), reverse=True))
    spec = draw(st.sampled_from([None, "mtp", "ngram", "ngram_gpu", "eagle"]))
    use_async = draw(st.booleans())
    if spec == "ngram" and use_async:
        spec = "ngram_gpu"  # vLLM 0.33 refuses the CPU proposer with async scheduling
    seqs = draw(st.integers(1, 8))
    return {
        "workload": Workload("fuzz", requests),
        "use_async": use_async,
        "spec": None if spec is None else _spec(spec, rates),
        "eos": draw(st.sampled_from([0.0, 0.0, 0.05])),
        "caching": draw(st.booleans()),
        # Tight caches preempt (the async path then applies stale outputs).
        "blocks": draw(st.integers(14, 120)),
        "max_num_seqs": seqs,
        "max_num_batched_tokens": draw(st.integers(max(seqs, 8), 256)),
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 8, 40])),
    }


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases(), st.sampled_from([1, 1, 2, 3]))
def test_every_request_finishes_with_its_output_length(case: dict[str, Any], dp: int) -> None:
    workload: Workload = case.pop("workload")
    if dp == 1:
        result = _sim(workload, **case)
    else:
        # MoE ranks with expert parallelism: lockstep, dummy batches, waves.
        sc = SchedulerConfig(max_num_batched_tokens=case["max_num_batched_tokens"],
                             max_num_seqs=case["max_num_seqs"], max_model_len=4096,
                             long_prefill_token_threshold=case["long_prefill_token_threshold"],
                             async_scheduling=case["use_async"])
        cc = CacheConfig(num_gpu_blocks=case["blocks"], enable_prefix_caching=case["caching"])
        model = MOE_ASYNC if case["use_async"] else MOE_SYNC
        config = SimConfig(sc, cc, model, eos_probability=case["eos"], seed=5, speculative=case["spec"])
        sim = DPSimulator(config, workload, DPOptions(dp, lockstep=True, sync_interval=2),
                          shared=DPRankStates(dp, 2))
        result = sim.run().combined()
        assert not any(inst.busy() for inst in sim.instances)
        for r in sim.ranks:
            r.sched.check_invariants()
    want = {r.request_id: r.output_len for r in workload.requests}
    got = _outputs(result)
    assert set(got) == set(want) and not result.failed
    for rid, n in got.items():
        if case["eos"]:
            assert 1 <= n <= want[rid]
        else:
            assert n == want[rid]
    stats = result.spec_stats
    if case["spec"] is None:
        assert stats is None
    else:
        assert stats is not None
        k = case["spec"].num_speculative_tokens
        assert stats.num_accepted_tokens <= stats.num_draft_tokens <= stats.num_drafts * k
        assert stats.num_accepted_tokens_per_pos == sorted(stats.num_accepted_tokens_per_pos, reverse=True)
        # Every accepted draft is a token some request received, except those
        # past a request's stop in its last step (vLLM's metrics count them;
        # update_from_output drops them): at most K per request.
        assert stats.num_accepted_tokens <= sum(got.values()) + k * len(got)


# -- the acceptance model --------------------------------------------------------------


def test_acceptance_draws_are_deterministic_and_uniform() -> None:
    key = request_key(0, "req-7")
    assert key == request_key(0, "req-7") != request_key(1, "req-7")
    draws = [uniform(key, n) for n in range(20000)]
    assert all(0.0 <= u < 1.0 for u in draws)
    assert abs(sum(draws) / len(draws) - 0.5) < 0.01
    model = AcceptanceModel((0.8, 0.6, 0.45), "test")
    assert [model.accepted(u, 3) for u in (0.0, 0.5, 0.7, 0.9)] == [3, 2, 1, 0]
    assert model.accepted(0.0, 1) == 1  # never more than the drafts scheduled
    assert model.mean_acceptance_length == pytest.approx(2.85)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rates=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4).map(
    lambda r: tuple(sorted(r, reverse=True))), use_async=st.booleans(),
    method=st.sampled_from(["mtp", "eagle3", "ngram_gpu"]))
def test_acceptance_statistics_converge_to_the_configured_rates(
        rates: tuple[float, ...], use_async: bool, method: str) -> None:
    # No prefix caching and prompts of 2+ tokens: no padded admission; a
    # roomy budget and cache: every verification has all K drafts.
    workload = random_workload(num_prompts=24, input_len=64, output_len=400, seed=11)
    result = _sim(workload, use_async=use_async, spec=_spec(method, rates), caching=False,
                  blocks=4000, max_num_batched_tokens=4096)
    metrics = result.metrics()
    drafts = metrics["spec_decode_num_drafts"]
    assert drafts > 2000
    assert metrics["spec_decode_num_draft_tokens"] == drafts * len(rates)
    for got, want in zip(metrics["spec_decode_acceptance_rate_per_position"], rates):
        assert got == pytest.approx(want, abs=0.035)
    assert metrics["spec_decode_mean_acceptance_length"] == pytest.approx(1 + sum(rates), abs=0.08)
    assert metrics["spec_decode_draft_acceptance_rate"] == pytest.approx(sum(rates) / len(rates), abs=0.035)


def test_padding_drafts_are_never_accepted() -> None:
    """A request admitted with one token to compute (its prompt cached but
    the last token) is padded to 1 + K tokens; the padding is rejected."""
    # The same 33-token prompt: b hits a's 2 cached blocks, 1 token to compute.
    runs = ((HASH_BLOCK_TOKEN_BASE, 16), (HASH_BLOCK_TOKEN_BASE + 1, 16), (HASH_BLOCK_TOKEN_BASE + 2, 1))
    shared = [WorkloadRequest("a", 0.0, runs, 4), WorkloadRequest("b", 1.0, runs, 4)]
    result = _sim(Workload("padding", shared), use_async=False, spec=_spec("mtp", (1.0, 1.0)))
    assert _outputs(result) == {"a": 4, "b": 4}
    stats = result.spec_stats
    assert stats is not None
    # b's admission verified 2 padding drafts and accepted none.
    assert stats.num_draft_tokens - stats.num_accepted_tokens == 2


def test_default_rates_and_their_sources() -> None:
    assert default_rates("mtp", 3) == (0.85, 0.425, 0.2125)
    assert default_rates("eagle", 2) == (0.5, 0.25)
    assert rates_from_length(2.5, 3) == (1.0, 0.5, 0.0)
    options = parse_speculative_config('{"method": "mtp", "num_speculative_tokens": 2}', DEEPSEEK, True)
    assert options.acceptance.rates == (0.85, 0.425)
    assert "2412.19437" in options.acceptance.source
    # K defaults to the checkpoint's MTP layers (1), as vLLM's n_predict.
    options = parse_speculative_config({"method": "mtp"}, DEEPSEEK, True, "0.9")
    assert options.num_speculative_tokens == 1 and options.acceptance.rates == (0.9,)


# -- the drafter's price and memory -------------------------------------------------------


def test_verification_is_priced_as_decode_with_extra_queries() -> None:
    model = StepTimeModel(LLAMA, H100, runtime=RuntimeConfig(cudagraph_multiple_of=3))
    assert model.capture_sizes[:5] == [3, 6, 9, 18, 24]  # 1, 2, 4, 8, 16, 24 rounded up
    assert cudagraph_capture_sizes(512, 4)[-1] == 512
    plain = BatchShape.decode(32, 32 * 1000)
    verify = BatchShape(96, 32, 32, 32, 32 * 1002, 0, 0, 0, 64, 32 * (2 * 1000 + 3))
    assert model.gpu_time(verify) > model.gpu_time(plain)
    assert model.spec_attention_factor(32 * 1002, 32 * 2003) >= 1.0


def test_mtp_drafter_costs_a_layer_per_pass_and_takes_memory() -> None:
    base = build_deployment(EngineOptions(model="deepseek-ai/DeepSeek-V3-FP8", hardware="h200",
                                          tensor_parallel_size=8))
    one = build_deployment(EngineOptions(model="deepseek-ai/DeepSeek-V3-FP8", hardware="h200",
                                         tensor_parallel_size=8,
                                         speculative_config='{"method":"mtp","num_speculative_tokens":1}'))
    three = build_deployment(EngineOptions(model="deepseek-ai/DeepSeek-V3-FP8", hardware="h200",
                                           tensor_parallel_size=8,
                                           speculative_config='{"method":"mtp","num_speculative_tokens":3}'))
    # The MTP module's weights (an MoE layer) and its KV layer come out of the cache.
    # 11.6 B parameters in FP8 over 8 GPUs, and the replicated 16-bit eh_proj.
    assert 1.2 < one.memory.drafter_bytes / 2**30 < 2.0
    assert one.cache_config.num_gpu_blocks < base.cache_config.num_gpu_blocks
    ratio = base.memory.bytes_per_block / one.memory.bytes_per_block
    assert ratio == pytest.approx(61 / 62)
    shape = BatchShape.decode(32, 32 * 2000)
    drafter = one.step_model.drafter
    assert drafter is not None
    t1 = drafter.gpu_time(shape)
    assert three.step_model.drafter is not None
    t3 = three.step_model.drafter.gpu_time(shape)
    target = base.step_model.gpu_time(shape)
    # One MoE layer of 61 per pass, roughly.
    assert target / 61 < t1 < target / 10
    assert t3 == pytest.approx(3 * t1, rel=0.35)
    assert "drafter" in one.memory.describe()


def test_ngram_costs_cpu_only() -> None:
    drafter = Drafter(drafter_shape("ngram", 3, LLAMA), SYNC_MODEL)
    shape = BatchShape.decode(16, 16 * 500)
    assert drafter.gpu_time(shape) == 0.0 and drafter.cpu_time(shape) > 0.0


# -- the command line ---------------------------------------------------------------------


def test_simulate_reports_spec_decode_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    report = tmp_path / "r.html"
    assert main(["simulate", *SMALL, "--model", "deepseek-ai/DeepSeek-V3-FP8", "--hardware", "h200",
                 "-tp", "8", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}',
                 "--spec-acceptance", "0.9,0.6", "--save-result", str(out), "--report", str(report)]) == 0
    text = capsys.readouterr().out
    assert "Mean acceptance length:" in text and "Acceptance rate, position 1:" in text
    saved = json.loads(out.read_text())
    assert saved["spec_decode_num_drafts"] > 0
    assert saved["spec_decode_mean_acceptance_length"] == pytest.approx(2.5, abs=0.2)
    assert len(saved["spec_decode_acceptance_rate_per_position"]) == 2
    spec = saved["deployment"]["speculative_config"]
    assert spec["method"] == "mtp" and spec["acceptance_rates"] == [0.9, 0.6]
    assert saved["deployment"]["scheduler"]["async_scheduling"] is True
    page = report.read_text()
    assert "spec_decode_mean_acceptance_length" in page and "speculative_config" in page


def test_no_async_scheduling_keeps_the_synchronous_loop(tmp_path: Path) -> None:
    paths = [tmp_path / f"{i}.json" for i in range(3)]
    args = ["simulate", *SMALL, "--request-rate", "30"]
    assert main([*args, "--no-async-scheduling", "--save-result", str(paths[0])]) == 0
    assert main([*args, "--no-async-scheduling", "--no-fast-forward", "--save-result", str(paths[1])]) == 0
    assert main([*args, "--save-result", str(paths[2])]) == 0
    sync, stepped, overlap = (json.loads(p.read_text()) for p in paths)
    # Both loops jump their pure-decode stretches.
    assert sync["fast_forwarded_steps"] > 0 and overlap["fast_forwarded_steps"] > 0
    for key in ("simulation_wall_seconds", "fast_forwarded_steps", "date"):
        sync.pop(key)
        stepped.pop(key)
    # The run spec records --no-fast-forward itself.
    assert sync["run_spec"]["options"].pop("fast_forward") is True
    assert stepped["run_spec"]["options"].pop("fast_forward") is False
    assert sync == stepped
    assert overlap["total_output_tokens"] == sync["total_output_tokens"]
    assert overlap["mean_tpot_ms"] < sync["mean_tpot_ms"]


@pytest.mark.parametrize("argv, words", [
    (["--speculative-config", "{nope"], "speculative_config: not valid JSON"),
    (["--speculative-config", "[1]"], "speculative_config=[1]"),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1, "spec_tokens": 2}'],
     "speculative_config.spec_tokens: unknown key"),
    (["--speculative-config", '{"method": "mtp", "num_speculative_token": 1}'],
     "did you mean 'num_speculative_tokens'"),
    (["--speculative-config", '{"method": "medusa2", "num_speculative_tokens": 1}'],
     "speculative_config.method='medusa2'"),
    (["--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 1}'],
     "speculative_config.method='draft_model'"),
    (["--speculative-config", '{"num_speculative_tokens": 1}'], "speculative_config.method: missing"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 0, "model": "x"}'],
     "speculative_config.num_speculative_tokens=0"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": true, "model": "x"}'],
     "speculative_config.num_speculative_tokens=True"),
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'],
     "speculative_config.model: missing"),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
     "has no MTP layers"),
    # vLLM 0.33 refuses the CPU n-gram proposer with async scheduling (0.34 runs it).
    (["--vllm-version", "0.33", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
     "use method 'ngram_gpu', or pass --no-async-scheduling"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 3, '
      '"prompt_lookup_min": 0}'], "speculative_config.prompt_lookup_min=0"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2, '
      '"draft_tensor_parallel_size": 1}'], "speculative_config.draft_tensor_parallel_size"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2, '
      '"synthetic_acceptance_rates": [0.5, 0.4]}'], "rejection_sample_method"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2, '
      '"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.4, 0.5]}'],
     "never rise"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2, '
      '"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 4}'],
     "speculative_config.synthetic_acceptance_length=4"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2}',
      "--spec-acceptance", "0.5,0.6"], "--spec-acceptance"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2}',
      "--spec-acceptance", "0.5"], "--spec-acceptance"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2}',
      "--spec-acceptance", "0.5,1.5"], "--spec-acceptance[1]=1.5"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 2}',
      "--spec-acceptance", "a,b"], "--spec-acceptance"),
    (["--spec-acceptance", "0.5"], "give --speculative-config too"),
    (["--speculative-config", '{"method": "ngram_gpu", "num_speculative_tokens": 8}',
      "--max-num-batched-tokens", "8", "--max-num-seqs", "8"], "max_num_batched_tokens=8"),
])
def test_bad_speculative_flags_are_one_error_line(argv: list[str], words: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsched: error:") and words in err[0], err
    assert "Simulating" not in captured.out


def test_ngram_runs_synchronously(tmp_path: Path) -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 2}'
    out = tmp_path / "r.json"
    assert main(["simulate", *SMALL, "--no-async-scheduling", "--speculative-config", spec,
                 "--save-result", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 30
    assert result["run_spec"]["deployment"]["groups"][0]["engine"]["async_scheduling"] is False
    # Drafts were proposed and verified: two per draft, some accepted, the
    # second position no more often than the first.
    assert result["spec_decode_num_draft_tokens"] == 2 * result["spec_decode_num_drafts"] > 0
    first, second = result["spec_decode_acceptance_rate_per_position"]
    assert 0 < second <= first <= 1
