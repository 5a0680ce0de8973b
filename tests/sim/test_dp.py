"""Data-parallel simulation: lockstep timing, independent replicas, routing."""

from __future__ import annotations

import dataclasses

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import BatchShape, ParallelConfig, StepTimeModel
from kvsched.sim.dp import DPOptions, DPSimulator
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import Workload, WorkloadRequest, random_workload

SC = SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=16, max_model_len=4096)
CC = CacheConfig(num_gpu_blocks=800, block_size=16)
DENSE = StepTimeModel(get_model("Llama-3.1-8B"), get_hardware("h100-sxm"))
MOE = StepTimeModel(get_model("Qwen3-30B-A3B"), get_hardware("h100-sxm"),
                    ParallelConfig(1, 2, enable_expert_parallel=True))


def _req(rid: str, t: float, prompt: int, out: int, token: int) -> WorkloadRequest:
    return WorkloadRequest(rid, t, ((token, prompt),), out)


def test_lockstep_step_lasts_as_long_as_the_slowest_rank_and_idle_ranks_wait() -> None:
    # One request only: rank 0 prefills and decodes, rank 1 runs dummy batches.
    wl = Workload("one", (_req("a", 0.0, 1000, 3, 7),))
    sim = DPSimulator(SimConfig(SC, CC, MOE), wl, DPOptions(2, lockstep=True, router="round-robin"))
    result = sim.run()
    busy, idle = sim.ranks
    assert result.routed == [1, 0]
    (group,) = sim.instances  # one instance, one clock for both ranks
    assert group.ranks == [busy, idle]
    steps = busy.steps
    prefill = BatchShape(1000, 1, 1, 0, 0, 1000, 1000, 1000 * 1001 // 2)
    expected = max(MOE.step_time(prefill, 1000), MOE.step_time(BatchShape.decode(1, 1), 1000))
    assert steps.duration[0] == expected
    assert len(idle.steps) == 0 and len(steps) == 3


def test_lockstep_experts_see_every_ranks_tokens() -> None:
    # The same batch costs more when the other rank also runs tokens through the experts.
    alone = MOE.gpu_time(BatchShape.decode(8, 8000), 8)
    shared = MOE.gpu_time(BatchShape.decode(8, 8000), 8 + 200)
    assert shared > alone


def test_independent_replicas_keep_their_own_clocks() -> None:
    wl = Workload("two", (_req("long", 0.0, 2000, 40, 5), _req("short", 0.0, 100, 2, 6)))
    sim = DPSimulator(SimConfig(SC, CC, DENSE), wl, DPOptions(2, router="round-robin"))
    result = sim.run()
    assert result.routed == [1, 1]
    clock_a, clock_b = (inst.now for inst in sim.instances)
    assert clock_b < clock_a  # the short request's replica finished early, unblocked by the other
    single = Simulator(SimConfig(SC, CC, DENSE, fast_forward=False),
                       Workload("short", (wl.requests[1],))).run()
    (alone,) = single.records
    (mine,) = result.ranks[1].records
    assert dataclasses.astuple(mine) == dataclasses.astuple(alone)


def test_one_rank_equals_the_single_engine_simulator() -> None:
    wl = random_workload(num_prompts=40, input_len=300, output_len=50, request_rate=15.0, seed=2)
    single = Simulator(SimConfig(SC, CC, DENSE, fast_forward=False), wl).run().metrics()
    dp = DPSimulator(SimConfig(SC, CC, DENSE), wl, DPOptions(1)).run().combined().metrics()
    for key in ("mean_ttft_ms", "p99_itl_ms", "duration", "output_throughput", "num_steps"):
        assert dp[key] == single[key], key


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="data_parallel_size"):
        DPOptions(0)
    with pytest.raises(ValueError, match="router"):
        DPOptions(2, router="random")


def test_simulate_cli_runs_data_parallel_with_each_policy(
    capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.cli import main

    base = ["simulate", "--model", "Qwen3-30B-A3B", "--data-parallel-size", "2",
            "--enable-expert-parallel", "--max-num-seqs", "8", "--num-prompts", "24",
            "--random-input-len", "300", "--random-output-len", "20", "--no-progress"]
    for policy in ("none", "balance", "adp-balance", "prefill-cadence"):
        assert main([*base, "--admission-policy", policy]) == 0, policy
        out = capsys.readouterr().out
        assert "DP2 EP2" in out and "Successful requests:                            24" in out


@pytest.mark.parametrize("wl_kw", [{"request_rate": 30.0}, {"max_concurrency": 6}])
def test_lockstep_fast_forward_is_exact(wl_kw: dict[str, float]) -> None:
    wl = random_workload(num_prompts=50, input_len=400, output_len=120, range_ratio=0.5, seed=4,
                         **wl_kw)  # type: ignore[arg-type]
    cc = CacheConfig(num_gpu_blocks=300, block_size=16)

    def run(ff: bool) -> tuple[dict[str, object], list[list[float]], int]:
        sim = DPSimulator(SimConfig(SC, cc, MOE, fast_forward=ff), wl,
                          DPOptions(3, lockstep=True, router="least-loaded"))
        res = sim.run()
        metrics = res.combined().metrics()
        ffd = metrics.pop("fast_forwarded_steps")
        metrics.pop("simulation_wall_seconds")
        logs = [list(r.steps.start) + list(r.steps.free_blocks) for r in res.ranks]
        return metrics, logs, int(ffd)  # type: ignore[arg-type]

    stepped, jumped = run(False), run(True)
    assert stepped[2] == 0 and jumped[2] > 0
    assert jumped[0] == stepped[0]
    assert jumped[1] == stepped[1]


def test_lockstep_prefill_cadence_follows_the_shared_step_counter() -> None:
    # vLLM's DP engine core: a rank with decode work prefills only on steps whose
    # shared counter is a multiple of the interval (no capacity pressure here;
    # a rank with nothing to decode prefills at once).
    wl = random_workload(num_prompts=24, input_len=300, output_len=30, request_rate=40.0, seed=3)
    config = SimConfig(SC, CC, MOE, prefill_schedule_interval=3)
    sim = DPSimulator(config, wl, DPOptions(2, lockstep=True, router="round-robin"))
    seen = [0, 0]
    prefill_counters: list[int] = []

    def record(d: DPSimulator) -> None:
        for i, r in enumerate(d.ranks):
            if len(r.steps) > seen[i]:
                seen[i] = len(r.steps)
                steps = r.steps
                if 0 < steps.prefill_tokens[-1] < steps.num_tokens[-1]:  # prefill beside decodes
                    prefill_counters.append(d.shared.step_counter - 1)  # the step just run

    sim.after_step.append(record)
    result = sim.run().combined()
    assert len(result.records) == 24
    assert prefill_counters and all(c % 3 == 0 for c in prefill_counters)
    plain = DPSimulator(SimConfig(SC, CC, MOE), wl, DPOptions(2, lockstep=True, router="round-robin"))
    base = plain.run().combined()
    assert sum(r.ttft for r in result.records) > sum(r.ttft for r in base.records)


def test_dense_replicas_send_at_the_event_time_not_a_later_finish() -> None:
    # Issue 9's reproducer (kvsched simulate -dp 2 --num-prompts 3000
    # --request-rate 20 --random-range-ratio 0.9) crashed: a request was
    # stamped with another replica's later finish time as its send time, so
    # its first token came "before" it was sent.
    wl = random_workload(num_prompts=3000, input_len=1024, output_len=128, range_ratio=0.9,
                         request_rate=20.0, seed=0)
    cc = CacheConfig(num_gpu_blocks=28000, block_size=16)
    sc = SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=8192)
    result = DPSimulator(SimConfig(sc, cc, DENSE), wl, DPOptions(2)).run()
    records = result.combined().records
    assert len(records) == 3000
    by_id = {r.request_id: r for r in wl.requests}
    for r in records:
        assert r.send_time == by_id[r.request_id].arrival_time  # open loop: sent on arrival
        assert r.send_time < r.first_token_time <= r.finish_time
    assert sum(result.routed) == 3000 and min(result.routed) > 1000


# -- vLLM's DP step counter and waves on lockstep ranks ---------------------------
# Round-robin routing: a -> rank 0, d -> rank 1, b -> 0, e -> 1, c -> 0.
DUMMY = MOE.step_time(BatchShape.decode(1, 1), 2)  # a step where every rank runs a dummy batch


def _wave_run(t_b: float, t_c: float, interval: int, sync: int) -> DPSimulator:
    wl = Workload("waves", (
        _req("a", 0.0, 100, 3, 7), _req("d", 0.0, 100, 3, 8),
        _req("b", t_b, 100, 30, 9), _req("e", t_b + 1e-7, 100, 1, 10),
        _req("c", t_c, 100, 3, 11)))
    config = SimConfig(SC, CC, MOE, prefill_schedule_interval=interval)
    sim = DPSimulator(config, wl, DPOptions(2, lockstep=True, router="round-robin", sync_interval=sync))
    sim.run()
    return sim


def _prefill_steps(sim: DPSimulator) -> list[int]:
    steps = sim.ranks[0].steps
    return [i for i in range(len(steps)) if steps.prefill_tokens[i]]


def test_lockstep_counter_restarts_after_the_wave_ends() -> None:
    # Wave 1: a and d run 3 steps (counters 0-2), a dummy step (3), then the
    # finish-sync at counter 4 finds both ranks idle: the wave ends. Wave 2,
    # long after: b prefills at counter 0; c arrives during that step, waits
    # through counters 1 and 2 (b decodes, interval 3) and prefills at 3.
    # Were the counter to go on from 4, c would prefill at counter 6, two steps
    # after b.
    first = _wave_run(5.0, 5.0, interval=3, sync=4)  # where b's first step starts
    (t_b_step,) = [s for s in first.ranks[0].steps.start if s >= 5.0][:1]
    sim = _wave_run(5.0, t_b_step + 1e-6, interval=3, sync=4)
    assert sim.shared.current_wave == 2
    assert _prefill_steps(sim) == [0, 3, 6]  # a; b at the wave's step 0; c at its step 3


def test_lockstep_ranks_run_dummy_batches_until_the_finish_sync() -> None:
    # a's last step ends at t_end with counter 3; with dp_sync_interval 16 the
    # idle ranks keep running dummy batches (counters 3, 4, ...). b arrives in
    # the middle of the second one: it starts when that step ends, at counter 5,
    # in the same wave. c, arriving during b's first step, waits for counter 8
    # (interval 4): b's steps 3-5 run at counters 5-7, c prefills at index 6.
    probe = _wave_run(50.0, 50.0, interval=4, sync=16)
    steps = probe.ranks[0].steps
    t_end = steps.start[2] + steps.duration[2]
    t_b = t_end + 1.5 * DUMMY
    b_start = t_end + DUMMY + DUMMY
    sim = _wave_run(t_b, b_start + 1e-6, interval=4, sync=16)
    steps = sim.ranks[0].steps
    assert steps.start[3] == pytest.approx(b_start, rel=0, abs=1e-12)
    assert sim.shared.current_wave == 1  # only the last wave ended
    assert _prefill_steps(sim) == [0, 3, 6]
