"""Replay a scheduler scenario with a scripted fake model, step by step, exactly
as ../shared/reference/SCENARIO_FORMAT.md says, and write the step trace.

The same scenario through vLLM's oracle (vllm_replay.py) must give the same trace.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.core.output import ModelRunnerOutput, SchedulerOutput
from kvsched.core.policies import AdmissionPolicy, PrefillCadence
from kvsched.core.scheduler import Scheduler
from kvsched.core.trace import step_record
from kvsched.request import Request, SamplingParams

DEFAULT_TOKEN = 100
# The oracle's defaults for keys a scenario leaves out.
_SCHEDULER_DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 128, "max_num_batched_tokens": 8192, "max_model_len": 8192,
    "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
    "scheduler_reserve_full_isl": True,
}


@dataclass(slots=True)
class Scenario:
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    requests: list[dict[str, Any]]
    aborts: dict[int, list[str]] = field(default_factory=dict)
    max_steps: int = 1_000_000
    # vLLM's prefill_schedule_interval; > 1 installs a PrefillCadence policy.
    prefill_schedule_interval: int = 1


@dataclass(slots=True)
class ReplayResult:
    steps: int
    preemptions: int
    scheduler_seconds: float

    def summary(self) -> dict[str, Any]:
        return {"engine": "kvsched", "steps": self.steps, "preemptions": self.preemptions,
                "scheduler_seconds": self.scheduler_seconds}


def _int(obj: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}.{key}={value!r}: must be an integer")
    return value


def _bool(obj: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key}={value!r}: must be true or false")
    return value


def _int_list(obj: dict[str, Any], key: str, where: str) -> list[int]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError(f"{where}.{key}: must be a list of integers")
    return value


def parse_scenario(obj: Any) -> Scenario:
    """Check a scenario object and build its configs; errors name the field."""
    if not isinstance(obj, dict):
        raise ValueError("scenario: must be a JSON object")
    sc = obj.get("scheduler", {})
    cc = obj.get("cache", {})
    if not isinstance(sc, dict) or not isinstance(cc, dict):
        raise ValueError("scenario.scheduler and scenario.cache must be JSON objects")
    d = _SCHEDULER_DEFAULTS
    policy = sc.get("policy", d["policy"])
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=_int(sc, "max_num_batched_tokens", "scheduler", d["max_num_batched_tokens"]),
        max_num_seqs=_int(sc, "max_num_seqs", "scheduler", d["max_num_seqs"]),
        max_model_len=_int(sc, "max_model_len", "scheduler", d["max_model_len"]),
        enable_chunked_prefill=_bool(sc, "enable_chunked_prefill", "scheduler", d["enable_chunked_prefill"]),
        long_prefill_token_threshold=_int(sc, "long_prefill_token_threshold", "scheduler", 0),
        policy=policy,
        scheduler_reserve_full_isl=_bool(sc, "scheduler_reserve_full_isl", "scheduler", True),
    )
    if "num_gpu_blocks" not in cc:
        raise ValueError("cache.num_gpu_blocks: missing; give the total block count "
                         "(including the null block)")
    cache_config = CacheConfig(
        num_gpu_blocks=_int(cc, "num_gpu_blocks", "cache"),
        block_size=_int(cc, "block_size", "cache", 16),
        enable_prefix_caching=_bool(cc, "enable_prefix_caching", "cache", False),
    )
    requests = obj.get("requests")
    if not isinstance(requests, list):
        raise ValueError("scenario.requests: must be a list of request objects")
    seen: set[str] = set()
    for i, r in enumerate(requests):
        where = f"requests[{i}]"
        if not isinstance(r, dict):
            raise ValueError(f"{where}: must be a JSON object")
        rid = r.get("request_id")
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"{where}.request_id={rid!r}: must be a non-empty string")
        if rid in seen:
            raise ValueError(f"{where}.request_id={rid!r}: duplicate id; ids must be unique")
        seen.add(rid)
        _int_list(r, "prompt_token_ids", where)
        _int_list(r, "sampled_token_ids", where)
        _int_list(r, "stop_token_ids", where)
        if "max_tokens" not in r:
            raise ValueError(f"{where}.max_tokens: missing")
        for key in ("max_tokens", "min_tokens", "priority", "arrival_step"):
            _int(r, key, where, 0)
        if _int(r, "arrival_step", where, 0) < 0:
            raise ValueError(f"{where}.arrival_step: must be >= 0")
        _bool(r, "ignore_eos", where, False)
        eos = r.get("eos_token_id")
        if eos is not None and (isinstance(eos, bool) or not isinstance(eos, int)):
            raise ValueError(f"{where}.eos_token_id={eos!r}: must be an integer or null")
        at = r.get("arrival_time", 0)
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise ValueError(f"{where}.arrival_time={at!r}: must be a number")
    aborts: dict[int, list[str]] = {}
    raw_aborts = obj.get("aborts", [])
    if not isinstance(raw_aborts, list):
        raise ValueError("scenario.aborts: must be a list of {step, request_ids}")
    for i, a in enumerate(raw_aborts):
        if not isinstance(a, dict) or not isinstance(a.get("request_ids"), list):
            raise ValueError(f"aborts[{i}]: must be an object with step and request_ids")
        bad = [x for x in a["request_ids"] if not isinstance(x, str)]
        if bad:
            raise ValueError(f"aborts[{i}].request_ids: {bad[0]!r} is not a string request id")
        aborts.setdefault(_int(a, "step", f"aborts[{i}]"), []).extend(a["request_ids"])
    max_steps = _int(obj, "max_steps", "scenario", 1_000_000)
    # Top level (the cadence corpus) or among the scheduler keys.
    where, holder = ("scenario", obj) if "prefill_schedule_interval" in obj else ("scheduler", sc)
    interval = _int(holder, "prefill_schedule_interval", where, 1)
    if interval < 1:
        raise ValueError(f"{where}.prefill_schedule_interval={interval}: must be >= 1")
    return Scenario(scheduler_config, cache_config, requests, aborts, max_steps, interval)


def load_scenario(path: str) -> Scenario:
    with open(path) as f:
        try:
            obj = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    return parse_scenario(obj)


def make_request(spec: dict[str, Any]) -> Request:
    params = SamplingParams(
        max_tokens=spec["max_tokens"],
        min_tokens=spec.get("min_tokens", 0),
        ignore_eos=spec.get("ignore_eos", False),
        eos_token_id=spec.get("eos_token_id"),
        stop_token_ids=tuple(spec.get("stop_token_ids", ())),
    )
    return Request(
        request_id=spec["request_id"],
        prompt_token_ids=list(spec["prompt_token_ids"]),
        sampling_params=params,
        priority=spec.get("priority", 0),
        arrival_time=float(spec.get("arrival_time", spec.get("arrival_step", 0))),
    )


def next_token(spec: dict[str, Any], num_output_tokens: int) -> int:
    """The scripted token for output position ``num_output_tokens``; below
    min_tokens a scripted stop token is replaced, as a real sampler masks it."""
    script = spec.get("sampled_token_ids") or ()
    token = script[num_output_tokens] if num_output_tokens < len(script) else DEFAULT_TOKEN
    if num_output_tokens < spec.get("min_tokens", 0):
        stops = set(spec.get("stop_token_ids", ()))
        if not spec.get("ignore_eos", False) and spec.get("eos_token_id") is not None:
            stops.add(spec["eos_token_id"])
        if token in stops:
            token = DEFAULT_TOKEN
    return token


def check_requests(scenario: Scenario) -> None:
    """Raise ValueError for the first request ``add_request`` would refuse, so a
    bad scenario fails before its first step rather than at an arrival."""
    sched = Scheduler(scenario.scheduler_config, scenario.cache_config)
    for spec in scenario.requests:
        sched.check_request(make_request(spec))


StepHook = Callable[[int, SchedulerOutput, dict[str, Any], Scheduler], None]


def replay(scenario: Scenario, trace_out: TextIO | None = None,
           on_step: StepHook | None = None, explain: bool = False,
           admission_policy: AdmissionPolicy | None = None) -> ReplayResult:
    """Run the scenario's step loop; write one JSON line per step to ``trace_out``.
    ``admission_policy`` replaces the scenario's (a PrefillCadence when it sets
    ``prefill_schedule_interval`` > 1)."""
    check_requests(scenario)
    policy = admission_policy
    if policy is None and scenario.prefill_schedule_interval > 1:
        policy = PrefillCadence(scenario.prefill_schedule_interval)
    sched = Scheduler(scenario.scheduler_config, scenario.cache_config, policy, explain_admission=explain)
    specs = {r["request_id"]: r for r in scenario.requests}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in scenario.requests:
        arrivals.setdefault(r.get("arrival_step", 0), []).append(r)
    aborts = scenario.aborts
    last_event = max([*arrivals, *aborts, 0])
    requests = sched.requests
    perf = time.perf_counter
    seconds = 0.0
    step = 0
    while step <= last_event or sched.has_unfinished_requests():
        if step >= scenario.max_steps:
            raise RuntimeError(f"scenario did not finish within max_steps={scenario.max_steps}")
        for spec in arrivals.get(step, ()):
            sched.add_request(make_request(spec))
        finished: list[list[str]] = []
        live = [rid for rid in aborts.get(step, ()) if rid in requests]
        if live:
            sched.finish_requests(live)
            finished.extend([rid, "abort"] for rid in live)

        t0 = perf()
        output = sched.schedule()
        t1 = perf()
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            req = requests[rid]
            sampled.append([] if req.is_prefill_chunk
                           else [next_token(specs[rid], len(req.output_token_ids))])
        runner_output = ModelRunnerOutput(req_ids, sampled)
        t2 = perf()
        results = sched.update_from_output(output, runner_output).finished
        t3 = perf()
        seconds += (t1 - t0) + (t3 - t2)

        finished.extend([o.request_id, o.finish_reason or ""] for o in results)
        record = step_record(step, output, finished, sched)
        if trace_out is not None:
            trace_out.write(json.dumps(record, separators=(",", ":")) + "\n")
        if on_step is not None:
            on_step(step, output, record, sched)
        step += 1
    return ReplayResult(step, sched.num_preemptions, seconds)
