"""Golden traces of lockstep (MoE) DP ranks under vLLM 0.33.0's prefill
cadence, step counter and waves, from vLLM's own code.

Each DP rank is vLLM's real ``Scheduler`` built for a DP deployment
(``data_parallel_size`` > 1, so its local cadence is off), plus a stand-in for
its ``DPEngineCoreProc`` holding the attributes two of that class's methods
use; the methods are called unbound on it:

- ``DPEngineCoreProc._should_throttle_prefills``: whether this step defers
  prefills (the interval and the shared step counter); the result goes to
  ``Scheduler.schedule(throttle_prefills)``;
- ``DPEngineCoreProc._has_global_unfinished_reqs``: counts the step and, on
  the first step of a wave and every ``dp_sync_interval``-th, all-reduces
  whether any rank has unfinished requests. The all-reduce
  (``ParallelConfig.sync_dp_state``) is replaced by the OR of every rank's
  flag, which is what its SUM all-reduce computes without a pause pending.

This driver does what ``DPEngineCoreProc.run_busy_loop`` does around them
(that loop blocks on sockets and cannot be called): a step on every rank
while the engines run (a rank without requests runs a dummy batch: no
``schedule()``), and when the all-reduce finds no work anywhere the wave
ends: ``current_wave += 1``, ``step_counter = 0``. A request arriving at
idle engines starts them all (the coordinator's START_DP_WAVE). Arrivals are
by tick; a tick of idle engines runs nothing.

Requests follow ../../shared/reference/SCENARIO_FORMAT.md plus ``rank``.
Run with the reference Python (``bash ../shared/reference/setup.sh``):

    ~/.cache/kvsched-reference/venv/bin/python tests/conformance/dp/make_lockstep_goldens.py

It rewrites lockstep_goldens.json next to it (deterministic).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

import cadence_oracle as co  # noqa: E402  (puts the reference oracle on the path)
import vllm  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.engine.core import DPEngineCoreProc  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

OUT = HERE / "lockstep_goldens.json"
oracle = co.oracle


def _engine_core(interval: int, sync_interval: int) -> SimpleNamespace:
    """What the two DPEngineCoreProc methods read and write, as its __init__
    sets them."""
    return SimpleNamespace(prefill_schedule_interval=interval, dp_sync_interval=sync_interval,
                           step_counter=0, current_wave=0, pending_pause=False,
                           ignore_start_dp_wave=False, dp_group=None,
                           vllm_config=SimpleNamespace(parallel_config=SimpleNamespace()))


def _rank_record(tick: int, sched: Any, output: Any, done: list[list[str]]) -> dict[str, Any]:
    return co.vllm_step_record(tick, sched, output, done)


def run(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    dp = int(scenario["data_parallel_size"])
    interval = int(scenario["prefill_schedule_interval"])
    sync_interval = int(scenario["dp_sync_interval"])
    scheds = [co.vllm_scheduler(scenario, dp) for _ in range(dp)]
    assert all(s.local_prefill_interval == 1 for s in scheds)
    cores = [_engine_core(interval, sync_interval) for _ in range(dp)]
    init_none_hash(sha256)
    hasher = get_request_block_hasher(int(scenario["cache"].get("block_size", 16)), sha256)
    specs = {r["request_id"]: r for r in scenario["requests"]}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in scenario["requests"]:
        arrivals.setdefault(int(r["arrival_step"]), []).append(r)
    horizon = max(arrivals)
    running = False
    trace: list[dict[str, Any]] = []
    tick = 0
    while tick <= horizon or running:
        if tick > 10_000:
            raise RuntimeError("did not finish")
        for r in arrivals.get(tick, ()):
            scheds[int(r["rank"])].add_request(oracle.make_request(r, hasher))
            running = True
        if not running:
            tick += 1
            continue
        counter = cores[0].step_counter
        throttles = {DPEngineCoreProc._should_throttle_prefills(core) for core in cores}  # type: ignore[arg-type]
        assert len(throttles) == 1
        ranks: list[dict[str, Any] | None] = []
        for sched, core in zip(scheds, cores):
            if not sched.has_requests():
                ranks.append(None)  # a dummy batch
                continue
            output = sched.schedule(DPEngineCoreProc._should_throttle_prefills(core))  # type: ignore[arg-type]
            ids = list(output.num_scheduled_tokens)
            tokens = [[] if sched.requests[rid].is_prefill_chunk
                      else [oracle.next_token(specs[rid], sched.requests[rid].num_output_tokens)]
                      for rid in ids]
            engine_out = sched.update_from_output(output, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
            done = [[o.request_id, co.FINISH[int(o.finish_reason)]]
                    for outs in engine_out.values() for o in outs.outputs if o.finish_reason is not None]
            ranks.append(_rank_record(tick, sched, output, done))
        local = [s.has_unfinished_requests() for s in scheds]

        anywhere = any(local)

        def all_reduce(_group: object, has_unfinished: bool, pending_pause: bool,
                       anywhere: bool = anywhere) -> tuple[bool, bool]:
            return anywhere, False

        results = set()
        for core, unfinished in zip(cores, local):
            core.vllm_config.parallel_config.sync_dp_state = all_reduce
            results.add(DPEngineCoreProc._has_global_unfinished_reqs(core, unfinished))  # type: ignore[arg-type]
        assert len(results) == 1
        running = results.pop()
        if not running:
            for core in cores:  # run_busy_loop: the wave ended
                core.current_wave += 1
                core.step_counter = 0
        trace.append({"tick": tick, "step_counter": counter, "throttle": throttles.pop(),
                      "engines_running": running, "wave": cores[0].current_wave, "ranks": ranks})
        tick += 1
    return trace


def _request(rid: str, rank: int, tick: int, prompt: int, max_tokens: int, token: int) -> dict[str, Any]:
    return {"request_id": rid, "rank": rank, "arrival_step": tick,
            "prompt_token_ids": [token + i for i in range(prompt)], "max_tokens": max_tokens,
            "ignore_eos": True}


def _scenario(name: str, dp: int, interval: int, sync: int, requests: list[dict[str, Any]], *,
              budget: int = 64, max_num_seqs: int = 8, blocks: int = 400) -> dict[str, Any]:
    return {"name": name, "data_parallel_size": dp, "prefill_schedule_interval": interval,
            "dp_sync_interval": sync,
            "scheduler": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": budget,
                          "max_model_len": 512},
            "cache": {"block_size": 16, "num_gpu_blocks": blocks},
            "requests": requests}


def hand_scenarios() -> list[dict[str, Any]]:
    R = _request
    return [
        # A wave ends at a finish-sync (counter 8 with sync 4); the next wave's
        # counter restarts, so C (arriving while B decodes) waits for counter 4.
        _scenario("wave_reset_restarts_cadence", 2, 4, 4, [
            R("a", 0, 0, 8, 6, 100), R("b", 0, 12, 8, 20, 200), R("c", 0, 15, 8, 3, 300)]),
        # B arrives while the idle ranks still run dummy batches before the
        # finish-sync: the wave goes on and the counter keeps counting.
        _scenario("arrival_in_dummy_tail", 2, 3, 8, [
            R("a", 0, 0, 8, 3, 100), R("b", 1, 5, 8, 20, 200), R("c", 1, 8, 8, 3, 300)]),
        # dp_sync_interval 1: every step syncs, the wave ends with the last request.
        _scenario("sync_every_step", 2, 2, 1, [
            R("a", 0, 0, 8, 4, 100), R("b", 1, 6, 8, 9, 200), R("c", 1, 8, 8, 2, 300)]),
        # A request finished in its first step: the step-1 sync ends the wave at once.
        _scenario("one_token_wave", 2, 3, 16, [
            R("a", 0, 0, 8, 1, 100), R("b", 0, 3, 8, 10, 200), R("c", 0, 5, 8, 2, 300)]),
        # Chunked prefills sit out throttled steps while the other rank decodes.
        _scenario("chunks_wait_for_aligned_steps", 2, 3, 16, [
            R("d", 0, 0, 4, 30, 100), R("long", 0, 2, 90, 3, 200), R("e", 1, 1, 4, 20, 300)],
            budget=32),
        # Capacity bound: more waiting than max_num_seqs admits; throttling stops.
        _scenario("capacity_bound_escape", 2, 4, 16, [
            R(f"q{i}", i % 2, i // 2, 8, 12, 100 * (i + 1)) for i in range(10)], max_num_seqs=2),
    ]


def random_scenario(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    dp = rng.randint(2, 3)
    interval = rng.randint(2, 4)
    sync = rng.choice([1, 2, 4, 16])
    tick = 0
    requests = []
    for i in range(rng.randint(6, 12)):
        tick += rng.choice([0, 0, 1, 2, 3, 5, 12, 25])
        requests.append(_request(f"s{seed}-{i}", rng.randrange(dp), tick, rng.randint(1, 80),
                                 rng.randint(1, 14), 1000 * (i + 1)))
    return _scenario(f"random_{seed}", dp, interval, sync, requests,
                     budget=rng.choice([16, 32, 64]), max_num_seqs=rng.randint(2, 6))


def main() -> int:
    scenarios = hand_scenarios() + [random_scenario(seed) for seed in range(16)]
    cases = [{"scenario": sc, "trace": run(sc)} for sc in scenarios]
    out = {"source": f"vLLM {vllm.__version__} Scheduler (data_parallel_size > 1) with "
                     "DPEngineCoreProc._should_throttle_prefills and _has_global_unfinished_reqs",
           "cases": cases}
    OUT.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    steps = sum(len(c["trace"]) for c in cases)
    throttled = sum(t["throttle"] for c in cases for t in c["trace"])
    waves = sum(t["wave"] > 0 and not t["engines_running"] for c in cases for t in c["trace"])
    print(f"{OUT.name}: {len(cases)} scenarios, {steps} lockstep steps, {throttled} throttled, "
          f"{waves} wave ends")
    return 0


if __name__ == "__main__":
    sys.exit(main())
