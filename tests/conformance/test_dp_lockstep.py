"""Lockstep DP ranks' prefill cadence, step counter and waves against vLLM 0.33.0.

dp/lockstep_goldens.json holds scenarios (SCENARIO_FORMAT plus each request's
``rank``, the deployment's ``data_parallel_size``, ``prefill_schedule_interval``
and ``dp_sync_interval``) and, per lockstep step, what vLLM decided: the DP
step counter the step ran with, whether the engines keep running after it,
the wave, and every rank's scheduling (null: a dummy batch). They come from
vLLM's real Scheduler and DPEngineCoreProc methods (dp/make_lockstep_goldens.py,
which needs the reference vLLM environment; this test only reads the file).

kvsched runs the same loop: one Scheduler per rank with a DPPrefillCadence
reading the shared DPRankStates, whose ``end_step`` counts the step and ends
the wave (the rule LockstepGroup uses in the simulator).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402

from kvsched.core.output import ModelRunnerOutput  # noqa: E402
from kvsched.core.policies import DPPrefillCadence, DPRankStates  # noqa: E402
from kvsched.core.scheduler import Scheduler  # noqa: E402
from kvsched.core.trace import first_difference, step_record  # noqa: E402
from kvsched.scenario import make_request, next_token, parse_scenario  # noqa: E402

GOLDENS = json.loads((HERE / "dp" / "lockstep_goldens.json").read_text())
CASES: list[dict[str, Any]] = GOLDENS["cases"]


def _has_requests(sched: Scheduler) -> bool:
    # vLLM's Scheduler.has_requests: unfinished requests, or finished ones not
    # yet reported by a schedule(); a rank without either runs a dummy batch.
    return sched.has_unfinished_requests() or bool(sched.finished_req_ids)


def kvsched_trace(raw: dict[str, Any]) -> list[dict[str, Any]]:
    # The goldens are the shared reference's release's (GOLDENS["source"]).
    scenario = parse_scenario(raw, vllm_version=SHARED_REFERENCE_VERSION)
    dp = raw["data_parallel_size"]
    shared = DPRankStates(dp, raw["dp_sync_interval"])
    scheds = [Scheduler(scenario.scheduler_config, scenario.cache_config,
                        DPPrefillCadence(shared, raw["prefill_schedule_interval"]))
              for _ in range(dp)]
    specs = {r["request_id"]: r for r in raw["requests"]}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in raw["requests"]:
        arrivals.setdefault(r["arrival_step"], []).append(r)
    horizon = max(arrivals)
    running = False
    trace: list[dict[str, Any]] = []
    tick = 0
    while tick <= horizon or running:
        assert tick < 10_000
        for r in arrivals.get(tick, ()):
            scheds[r["rank"]].add_request(make_request(r))
            running = True  # a request wakes every rank
        if not running:
            tick += 1
            continue
        counter = shared.step_counter
        ranks: list[dict[str, Any] | None] = []
        for sched in scheds:
            if not _has_requests(sched):
                ranks.append(None)
                continue
            output = sched.schedule()
            ids = list(output.num_scheduled_tokens)
            sampled = [[] if sched.requests[rid].is_prefill_chunk
                       else [next_token(specs[rid], len(sched.requests[rid].output_token_ids))]
                       for rid in ids]
            done = sched.update_from_output(output, ModelRunnerOutput(ids, sampled)).finished
            ranks.append(step_record(tick, output, [[o.request_id, o.finish_reason or ""] for o in done],
                                     sched))
        running = shared.end_step(any(s.has_unfinished_requests() for s in scheds))
        trace.append({"tick": tick, "step_counter": counter, "engines_running": running,
                      "wave": shared.current_wave, "ranks": ranks})
        tick += 1
    return trace


def compare(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> str | None:
    for e, a in zip(expected, actual):
        for key in ("tick", "step_counter", "engines_running", "wave"):
            if e[key] != a[key]:
                return f"tick {e['tick']}: {key} {a[key]!r}, vLLM {e[key]!r}"
        for rank, (er, ar) in enumerate(zip(e["ranks"], a["ranks"])):
            if (er is None) != (ar is None):
                return f"tick {e['tick']} rank {rank}: dummy batch in one trace only"
            if er is not None and ar is not None:
                diff = first_difference([er], [ar])
                if diff is not None:
                    return f"rank {rank}, {diff}"
    if len(expected) != len(actual):
        return f"{len(actual)} lockstep steps, vLLM {len(expected)}"
    return None


def test_goldens_exercise_the_rules() -> None:
    assert GOLDENS["source"].startswith("vLLM 0.33.0 ")
    assert len(CASES) >= 20
    steps = [t for c in CASES for t in c["trace"]]
    # Waves end (counter restarts) and the cadence really holds prefills back.
    assert sum(not t["engines_running"] for t in steps) >= 20
    assert any(t["step_counter"] > c["scenario"]["dp_sync_interval"]
               for c in CASES for t in c["trace"])
    assert sum(r is None for t in steps for r in t["ranks"]) > 50  # dummy batches


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["scenario"]["name"])
def test_lockstep_matches_vllm(case: dict[str, Any]) -> None:
    diff = compare(case["trace"], kvsched_trace(case["scenario"]))
    assert diff is None, diff
