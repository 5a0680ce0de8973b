"""kvsched.calibrate.step_matching: a logged run tied to its requests.

The logs here are made two ways the replay does not share: by hand (small
cases whose answer is worked out in the comments), and from the simulator's
own step trace (a full simulation, whose counts the test tallies with
vLLM's rule itself), so the replay must find the arrivals the simulation had.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvsched.calibrate.step_matching import iteration_counts, replay_iteration_log
from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf.hardware import get_hardware
from kvsched.perf.model_catalog import get_model
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig, StepTimeModel
from kvsched.profile.iteration_log import IterationLine
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import Workload, WorkloadRequest

STEP = StepTimeModel(get_model("Qwen/Qwen3-0.6B"), get_hardware("h100-sxm"), ParallelConfig(),
                     RuntimeConfig())


def config(budget: int = 512, max_num_seqs: int = 8, num_blocks: int = 400, threshold: int = 0,
           prefix_caching: bool = True) -> SimConfig:
    sched = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=2048,
                            long_prefill_token_threshold=threshold)
    return SimConfig(sched, CacheConfig(num_gpu_blocks=num_blocks, block_size=16,
                                        enable_prefix_caching=prefix_caching), STEP, fast_forward=False)


def line(k: int, ctx_reqs: int, ctx_tokens: int, gen_reqs: int, gen_tokens: int) -> IterationLine:
    return IterationLine(k, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, 10.0, engine=0)


def request(i: int, prompt: int, output: int, t: float = 0.0) -> WorkloadRequest:
    return WorkloadRequest(f"r{i}", t, ((1000 + i, prompt),), output)


def test_counts_follow_vllms_rule() -> None:
    # a: new (no output yet), b: decoding, c: preempted after 3 outputs and
    # recomputing 40 tokens — a generation request for vLLM.
    assert iteration_counts({"a": 100, "b": 1, "c": 40}, {"a": 0, "b": 5, "c": 3}) == (1, 100, 2, 41)


def test_requests_are_admitted_only_when_a_step_needs_them() -> None:
    # Sent together; the engine saw r0 alone first (its 100 tokens), then r1
    # (150) beside r0's first decode; r0 has 2 output tokens, r1 1.
    wl = Workload("w", (request(0, 100, 2), request(1, 150, 1)))
    log = [line(0, 1, 100, 0, 0), line(1, 1, 150, 1, 1)]
    rep = replay_iteration_log(config(), wl, log)
    assert rep.complete, rep.reason
    assert rep.arrival_step == [0, 1]
    assert [s.scheduled for s in rep.steps] == [{0: 100}, {0: 1, 1: 150}]
    # r0 samples its first token in step 0, its second in step 1; r1 its first in step 1.
    assert [s.sampled for s in rep.steps] == [[0], [0, 1]]
    assert [s.token_index for s in rep.steps] == [[0], [1, 0]]


def test_a_request_that_overtook_an_earlier_one() -> None:
    # r1 (200 tokens) reached the engine before r0 (100), sent first: no
    # run of requests in send order gives a first step of 200 context tokens.
    wl = Workload("w", (request(0, 100, 1), request(1, 200, 2)))
    log = [line(0, 1, 200, 0, 0), line(1, 1, 100, 1, 1)]
    rep = replay_iteration_log(config(), wl, log)
    assert rep.complete, rep.reason
    assert rep.arrival_step == [1, 0]
    assert [s.scheduled for s in rep.steps] == [{1: 200}, {0: 100, 1: 1}]


def equal_prompts_log() -> tuple[Workload, list[IterationLine]]:
    # r0 and r1 both have 100-token prompts; r0 wants 1 token, r1 4. The
    # engine got r1 first: step 0 runs one 100-token prompt either way, but
    # only r1 first keeps a request decoding in step 3.
    wl = Workload("w", (request(0, 100, 1), request(1, 100, 4)))
    log = [line(0, 1, 100, 0, 0), line(1, 1, 100, 1, 1), line(2, 0, 0, 1, 1), line(3, 0, 0, 1, 1)]
    return wl, log


def test_a_later_step_sends_the_replay_back_to_an_earlier_choice() -> None:
    wl, log = equal_prompts_log()
    rep = replay_iteration_log(config(), wl, log)
    assert rep.complete, rep.reason
    assert rep.arrival_step == [1, 0]
    assert rep.steps[3].scheduled == {1: 1}


def test_first_token_times_pick_the_order() -> None:
    wl, log = equal_prompts_log()
    # The client saw r1's first token 30 ms before r0's.
    rep = replay_iteration_log(config(), wl, log, first_token_times=[0.08, 0.05])
    assert rep.complete, rep.reason
    assert rep.arrival_step == [1, 0]
    # Times that contradict the log: r0's first token seen first, but the
    # log is only explained with r1 first; the replay still finds it (in
    # send order without the times), as its last try.
    rep = replay_iteration_log(config(), wl, log, first_token_times=[0.05, 0.08])
    assert rep.complete and rep.arrival_step == [1, 0]


def test_a_log_the_scheduler_cannot_explain_says_where() -> None:
    wl = Workload("w", (request(0, 100, 2), request(1, 150, 1)))
    # 300 context tokens in one step: no prompt is that long.
    log = [line(0, 1, 100, 0, 0), line(7, 1, 300, 1, 1)]
    rep = replay_iteration_log(config(), wl, log)
    assert not rep.complete
    assert rep.diverged_at == 1
    assert "iteration 7" in rep.reason and "1 context requests / 300 tokens" in rep.reason
    assert len(rep.steps) == 1


def test_refuses_an_engine_the_cpu_platform_does_not_run() -> None:
    sched = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=2048,
                            async_scheduling=True)
    async_config = SimConfig(sched, CacheConfig(num_gpu_blocks=400, block_size=16), STEP)
    with pytest.raises(ValueError, match="synchronous"):
        replay_iteration_log(async_config, Workload("w", (request(0, 10, 1),)), [line(0, 1, 10, 0, 0)])
    with pytest.raises(ValueError, match="first_token_times"):
        replay_iteration_log(config(), Workload("w", (request(0, 10, 1),)), [line(0, 1, 10, 0, 0)],
                             first_token_times=[0.0, 1.0])


# ---------------------------------------------------------------------------
# Logs from full simulations


def simulated_log(cfg: SimConfig, wl: Workload) -> tuple[list[IterationLine], list[dict[str, Any]]]:
    """The simulator's steps as vLLM's iteration log would count them
    (tallied here: a request is a context request until it has sampled)."""
    buf = io.StringIO()
    Simulator(cfg, wl, trace_steps=buf).run()
    prompt = {r.request_id: r.num_prompt_tokens for r in wl.requests}
    sampled: set[str] = set()
    log: list[IterationLine] = []
    trace = [json.loads(x) for x in buf.getvalue().splitlines()]
    computed: dict[str, int] = {}
    for k, step in enumerate(trace):
        computed.update(step["computed_at_admission"])
        cr = ct = gr = gt = 0
        now_sampling = []
        for rid, n in step["scheduled"]:
            if rid in sampled:
                gr, gt = gr + 1, gt + n
            else:
                cr, ct = cr + 1, ct + n
            computed[rid] += n
            if computed[rid] >= prompt[rid]:
                now_sampling.append(rid)
        sampled.update(now_sampling)
        log.append(line(k, cr, ct, gr, gt))
    return log, trace


def check_replay(cfg: SimConfig, wl: Workload, times: Sequence[float] | None) -> None:
    log, trace = simulated_log(cfg, wl)
    rep = replay_iteration_log(cfg, wl, log, first_token_times=times)
    assert rep.complete, rep.reason
    index = {r.request_id: i for i, r in enumerate(wl.requests)}
    assert [s.scheduled for s in rep.steps] == [{index[r]: n for r, n in step["scheduled"]} for step in trace]
    first: dict[int, int] = {}
    for k, step in enumerate(trace):
        for rid, _ in step["scheduled"]:
            first.setdefault(index[rid], k)
    # Every request arrives, and not after its first step (right before it
    # unless, waiting, it changed an earlier step: the long-prefill
    # threshold holds only while two or more requests are in the engine).
    assert all(0 <= rep.arrival_step[i] <= first[i] for i in range(len(wl.requests)))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 400), st.integers(1, 12),
                                  st.sampled_from([0.0, 0.0, 0.002, 0.05])), min_size=1, max_size=12),
       budget=st.sampled_from([64, 256, 512]), seqs=st.sampled_from([2, 8]),
       blocks=st.sampled_from([40, 400]), threshold=st.sampled_from([0, 48]),
       shared=st.booleans())
def test_replays_any_simulated_run(lengths: list[tuple[int, int, float]], budget: int, seqs: int, blocks: int,
                                   threshold: int, shared: bool) -> None:
    """Random runs (bursts, chunking, a small cache that preempts, a
    long-prefill threshold, shared prefixes) replayed from their counts alone."""
    t = 0.0
    reqs = []
    for i, (prompt, output, gap) in enumerate(lengths):
        t += gap
        runs: tuple[tuple[int, int], ...] = ((1000 + i, prompt),)
        if shared and prompt > 32:
            runs = ((7, 32), (1000 + i, prompt - 32))
        reqs.append(WorkloadRequest(f"r{i}", t, runs, output))
    wl = Workload("w", tuple(reqs))
    cfg = config(budget, seqs, blocks, threshold)
    # Not a request the cache can never hold (the simulator refuses it).
    assume(all(r.num_prompt_tokens + r.output_len <= blocks * 16 - 16 for r in reqs))
    check_replay(cfg, wl, None)
