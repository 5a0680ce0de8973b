"""Replay a checked scenario step by step on kvsched's scheduler with the
scripted fake model, as vLLM's oracle (../shared/reference/vllm_replay.py)
runs it on vLLM's, and write the step trace: the same scenario must give
the same trace.
"""

from __future__ import annotations

import bisect
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from kvsched.config import (
    batch_queue_size,
    keeps_scheduling,
)
from kvsched.core.output import (
    CachedRequestData,
    EngineCoreOutputs,
    ModelRunnerOutput,
    SchedulerOutput,
)
from kvsched.core.policies import AdmissionPolicy, PrefillCadence
from kvsched.core.scheduler import Scheduler
from kvsched.core.trace import step_record
from kvsched.errors import CannotServe
from kvsched.scenario.build import (
    KVReport,
    build_scheduler,
    check_requests,
    collect_kv_report,
    encoder_fields,
    kv_fields,
    make_request,
    make_worker,
)
from kvsched.scenario.fake_model import Entry, FakeModel
from kvsched.scenario.schema import ReplayResult, Scenario


def record_ids(record: dict[str, Any]) -> list[str]:
    """The scheduled request ids of a trace record, in order."""
    return [rid for rid, _ in record["scheduled"]]


def _empty_output() -> SchedulerOutput:
    """The trace's view of an async step that called no schedule()."""
    return SchedulerOutput([], CachedRequestData(), {}, 0, set(), set())


StepHook = Callable[[int, SchedulerOutput, dict[str, Any], Scheduler], None]
# Idle trace lines are written this many at a time.
_IDLE_CHUNK = 4096


def replay(scenario: Scenario, trace_out: TextIO | None = None,
           on_step: StepHook | None = None, explain: bool = False,
           admission_policy: AdmissionPolicy | None = None, *, skip_idle: bool = True) -> ReplayResult:
    """Run the scenario's step loop; write one JSON line per step to ``trace_out``.
    ``admission_policy`` replaces the scenario's (a PrefillCadence when it sets
    ``prefill_schedule_interval`` > 1).

    Idle stretches (no request in the system, no arrival and no abort until a
    later step) are skipped rather than stepped through when ``skip_idle``
    and there is neither an ``on_step`` hook nor an ``admission_policy``
    (either may count steps): after one idle step, ``schedule()`` and
    ``update_from_output()`` change nothing until the next event, and every
    idle step's trace line is the previous one's with the step number
    changed; those lines are still written (the oracle writes them), but
    without a trace the stretch costs nothing."""
    check_requests(scenario)
    policy = admission_policy
    if policy is None and scenario.prefill_schedule_interval > 1:
        policy = PrefillCadence(scenario.prefill_schedule_interval)
    sched = build_scheduler(scenario, policy, explain)
    specs = {r["request_id"]: r for r in scenario.requests}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in scenario.requests:
        arrivals.setdefault(r.get("arrival_step", 0), []).append(r)
    aborts = scenario.aborts
    events = sorted({*arrivals, *aborts})
    last_event = max([*events, 0])
    max_steps = scenario.max_steps
    use_async = scenario.scheduler_config.async_scheduling
    # vLLM's engine runs step_with_batch_queue whenever its queue is deeper
    # than one batch (async scheduling, pipeline parallelism).
    queue_size = batch_queue_size(use_async, scenario.scheduler_config.pipeline_parallel_size)
    overlap = queue_size > 1
    use_spec = scenario.speculative_config is not None
    model = FakeModel(specs)
    # The KV connector's worker side sees every executed batch, in order.
    worker = make_worker(scenario)
    use_kv = worker is not None
    use_mm = sched.encoder_cache_manager is not None
    # Async scheduling: vLLM's EngineCore.batch_queue, newest first, with the
    # worker's report for each batch.
    batch_queue: deque[tuple[int, SchedulerOutput, list[Entry], KVReport | None]] = deque()
    # A caller's policy or hook may count steps: those see every step. With
    # a connector idle steps poll the worker: none is skipped.
    skip = skip_idle and on_step is None and admission_policy is None and not use_kv
    requests = sched.requests
    perf = time.perf_counter
    seconds = 0.0
    step = 0
    idle_tail: str | None = None  # the previous idle step's trace line after its step number
    scheduled_steps = 0
    while step <= last_event or batch_queue or (
            sched.has_requests() if use_kv else sched.has_unfinished_requests()):
        if step >= max_steps:
            raise CannotServe(f"{scenario.source}: the scenario did not finish within "
                               f"max_steps={max_steps}")
        quiet = (step not in arrivals and step not in aborts and not sched.has_unfinished_requests()
                 and not batch_queue and not (overlap and sched.has_requests()))
        if quiet and idle_tail is not None and skip:
            # Up to the next event (there is one: step <= last_event here).
            stop = min(events[bisect.bisect_right(events, step)], max_steps)
            if trace_out is not None:
                for start in range(step, stop, _IDLE_CHUNK):
                    trace_out.write("".join(f'{{"step":{s},{idle_tail}'
                                            for s in range(start, min(start + _IDLE_CHUNK, stop))))
            step = stop
            continue
        for spec in arrivals.get(step, ()):
            sched.add_request(make_request(spec))
        finished: list[list[str]] = []
        # (A finished request whose blocks a connector still holds is ignored.)
        live = [rid for rid in aborts.get(step, ()) if rid in requests and not requests[rid].is_finished()]
        if live:
            sched.finish_requests(live)
            finished.extend([rid, "abort"] for rid in live)

        processed: int | None = None
        results: EngineCoreOutputs | None = None
        output: SchedulerOutput | None = None
        report: tuple[ModelRunnerOutput, set[str]] | None = None
        if not overlap and (not use_kv or sched.has_requests()):
            # EngineCore.step() (with a connector it skips schedule() when
            # has_requests() is false), then post_step() hands the drafts over.
            t0 = perf()
            output = sched.schedule()
            t1 = perf()
            scheduled_steps += 1
            batch = model.capture(sched, output)
            runner_output = model.output(batch)
            if worker is not None:
                report = collect_kv_report(worker, output, runner_output)
            t2 = perf()
            results = sched.update_from_output(output, runner_output)
            t3 = perf()
            seconds += (t1 - t0) + (t3 - t2)
            if use_spec and output.total_num_scheduled_tokens > 0:
                drafts = model.propose(batch, output.num_spec_tokens_to_schedule)
                t4 = perf()
                sched.update_draft_token_ids(drafts)
                seconds += perf() - t4
        elif overlap:
            # EngineCore.step_with_batch_queue(): schedule the next batch;
            # collect the oldest once the queue is full or nothing is left
            # to schedule.
            pop = bool(batch_queue)
            if sched.has_requests():
                t0 = perf()
                output = sched.schedule()
                seconds += perf() - t0
                scheduled_steps += 1
                new_report = (worker.capture(output.kv_connector_metadata) if worker is not None
                              else None)
                batch_queue.appendleft((step, output, model.capture(sched, output), new_report))
                pop = not keeps_scheduling(len(batch_queue), queue_size,
                                           output.total_num_scheduled_tokens, sched)
            if pop:
                processed, done_output, done_batch, kv_report = batch_queue.pop()
                runner_output = model.output(done_batch)
                if kv_report is not None:
                    runner_output.kv_connector_output = kv_report[0]
                    report = (runner_output, kv_report[1])
                t2 = perf()
                results = sched.update_from_output(done_output, runner_output)
                seconds += perf() - t2

        if results is not None:
            finished.extend([o.request_id, o.finish_reason or ""] for o in results.finished)
        record = step_record(step, output if output is not None else _empty_output(), finished, sched)
        if use_spec:
            spec_tokens = output.scheduled_spec_decode_tokens if output is not None else {}
            record["spec"] = [[rid, len(spec_tokens[rid])] for rid in record_ids(record)
                              if rid in spec_tokens]
        if overlap:
            record["processed"] = processed
        if use_kv:
            record.update(kv_fields(sched, output, report))
        if use_mm:
            record.update(encoder_fields(sched, output))
        idle_tail = None
        if trace_out is not None:
            line = json.dumps(record, separators=(",", ":"))
            trace_out.write(line + "\n")
            prefix = f'{{"step":{step},'
            if quiet and line.startswith(prefix):
                idle_tail = line[len(prefix):] + "\n"
        elif quiet:
            idle_tail = ""
        if on_step is not None:
            on_step(step, output if output is not None else _empty_output(), record, sched)
        step += 1
    return ReplayResult(step, sched.num_preemptions, seconds, scheduled_steps)
