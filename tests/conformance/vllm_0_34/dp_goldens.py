"""The DP goldens (tests/conformance/dp/) from vLLM 0.34.0's own code, into
goldens_0_34/dp/ (same file names and formats as the 0.33 ones).

    ~/.cache/kvsched-reference/venv-0.34/bin/python tests/conformance/vllm_0_34/dp_goldens.py [--out DIR]

- router_goldens.json: dp/make_router_goldens.py's cases (its scripted events, its
  unbound calls of DPLBAsyncMPClient.get_core_engine_for_request /
  process_engine_outputs), run on 0.34;
- lockstep_goldens.json: dp/make_lockstep_goldens.py's scenarios, each rank a 0.34
  Scheduler built by oracle.py with data_parallel_size > 1 and the scenario's
  prefill_schedule_interval, stepped the way that script steps them (vLLM's own
  DPEngineCoreProc._should_throttle_prefills / _has_global_unfinished_reqs on a
  stand-in; 0.34's _has_global_unfinished_reqs also reads enable_fault_tolerance,
  False here as without --enable-fault-tolerance). The step records are oracle.py's
  trace lines without the optional keys (the 0.33 script's record).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import oracle

HERE = Path(__file__).resolve().parent
DP = HERE.parent / "dp"
# vllm_X_Y/ writes goldens_X_Y/dp/ unless told otherwise (regenerate.py's --goldens).
OUT = HERE.parent / HERE.name.replace("vllm_", "goldens_", 1) / "dp"
sys.path.insert(0, str(DP))
sys.path.insert(0, str(HERE.parent))

import make_lockstep_goldens as lockstep  # noqa: E402  (scenario builders only)
import make_router_goldens as router  # noqa: E402
from vllm.v1.engine.core import DPEngineCoreProc  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402


def lockstep_run(scenario: dict) -> list[dict]:
    dp = int(scenario["data_parallel_size"])
    interval = int(scenario["prefill_schedule_interval"])
    sync_interval = int(scenario["dp_sync_interval"])
    scheds = [oracle.make_scheduler(scenario, data_parallel_size=dp) for _ in range(dp)]
    assert all(s.local_prefill_interval == 1 for s in scheds)
    cores = []
    for _ in range(dp):
        core = lockstep._engine_core(interval, sync_interval)
        core.enable_fault_tolerance = False
        cores.append(core)
    hasher = oracle.block_hasher(scenario)
    specs = {r["request_id"]: r for r in scenario["requests"]}
    arrivals: dict[int, list[dict]] = {}
    for r in scenario["requests"]:
        arrivals.setdefault(int(r["arrival_step"]), []).append(r)
    horizon = max(arrivals)
    running = False
    trace: list[dict] = []
    tick = 0
    while tick <= horizon or running:
        if tick > 10_000:
            raise RuntimeError("did not finish")
        for r in arrivals.get(tick, ()):
            scheds[int(r["rank"])].add_request(oracle.make_request(r, hasher, scenario))
            running = True
        if not running:
            tick += 1
            continue
        counter = cores[0].step_counter
        throttles = {DPEngineCoreProc._should_throttle_prefills(core) for core in cores}
        assert len(throttles) == 1
        ranks: list[dict | None] = []
        for sched, core in zip(scheds, cores):
            if not sched.has_requests():
                ranks.append(None)
                continue
            so = sched.schedule(DPEngineCoreProc._should_throttle_prefills(core))
            admitted = oracle.admissions(sched, so)
            ids = list(so.num_scheduled_tokens)
            tokens = [
                []
                if sched.requests[rid].is_prefill_chunk
                else [oracle.scripted_token(specs[rid], sched.requests[rid].num_output_tokens)]
                for rid in ids
            ]
            outs = sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, sampled_token_ids=tokens))
            ranks.append(
                oracle.step_line(tick, so, admitted, oracle.finishes(outs), sched, False, False, None)
            )
        local = [s.has_unfinished_requests() for s in scheds]
        anywhere = any(local)

        def all_reduce(_group, has_unfinished, pending_pause, anywhere=anywhere):
            return anywhere, False

        results = set()
        for core, unfinished in zip(cores, local):
            core.vllm_config.parallel_config.sync_dp_state = all_reduce
            results.add(DPEngineCoreProc._has_global_unfinished_reqs(core, unfinished))
        assert len(results) == 1
        running = results.pop()
        if not running:
            for core in cores:
                core.current_wave += 1
                core.step_counter = 0
        trace.append(
            {
                "tick": tick,
                "step_counter": counter,
                "throttle": throttles.pop(),
                "engines_running": running,
                "wave": cores[0].current_wave,
                "ranks": ranks,
            }
        )
        tick += 1
    return trace


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"where the two files go (default {OUT})")
    out = ap.parse_args(argv).out
    oracle.check_version()
    out.mkdir(parents=True, exist_ok=True)
    router.OUT = out / "router_goldens.json"
    router.main()
    lockstep.OUT = out / "lockstep_goldens.json"
    lockstep.run = lockstep_run
    lockstep.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
