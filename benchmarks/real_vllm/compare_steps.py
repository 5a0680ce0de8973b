"""A real vLLM serving run against kvsched, step by step (issue 21, item 5).

From a recorded run only (``vllm bench serve``'s result file, saved with
``--save-detailed``, and the server's log with
``--enable-logging-iteration-details``); no server is started:

1. The run's requests (each prompt's and output's length, sent at the
   client's own send times) are simulated by kvsched with the server's flags
   and the synchronous engine loop (vLLM's CPU platform turns async
   scheduling off), and the simulated step trace is set beside vLLM's
   iteration log: number of steps, each step's batch (context and
   generation requests and tokens) and its time (``--step-time-profile``:
   the profiled backend's forward-pass price against the logged time).
2. Mechanics only: the same simulation priced with vLLM's own logged step
   times (:class:`kvsched.perf.logged.LoggedStepTimeModel`, step k priced
   with logged step k), through :func:`kvsched.sim.run.serve` like every
   run; its metrics against the real run's.

Prefix-cache hits the log shows (a prompt whose first logged chunk is
shorter than its length in a step under the token budget) are given to the
simulated prompts as a shared first block, so the simulated scheduler finds
them too; which earlier prompt a hit came from is not in the log, so the
shared block is request 0's (the cache holds every block of the run: no
eviction changes which).

    PYTHONPATH=. python benchmarks/real_vllm/compare_steps.py \\
        --result benchmarks/real_vllm/results/real_random256x32_50p_1rps_run2.json \\
        --server-log benchmarks/real_vllm/results/real_random256x32_50p_1rps_run2.server.log.gz \\
        --model /work/tiny/llama-tiny-f32 \\
        --step-time-profile benchmarks/real_vllm/profiles/llama-tiny-f32-cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.calibrate.reanchor import read_iteration_log
from kvsched.calibrate.step_matching import IterationReplay, iteration_counts, replay_iteration_log
from kvsched.perf.host import HostTerms
from kvsched.perf.logged import LoggedStep, LoggedStepTimeModel
from kvsched.perf.step_profile import StepRecord
from kvsched.perf.step_time import BatchShape
from kvsched.profile.attribution import PointLedger, SentRequest
from kvsched.profile.iteration_log import IterationLine
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.run import build_group_deployment, serve, sim_config
from kvsched.sim.simulator import SimConfig, SimResult
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunOptions, RunSpec
from kvsched.sim.workload import Workload, WorkloadRequest, load_workload
from kvsched.sim.workload.tokens import HASH_BLOCK_TOKEN_BASE, UNIQUE_TOKEN_BASE

# (context requests, context tokens, generation requests, generation tokens)
Composition = tuple[int, int, int, int]
SHARED_BLOCK_TOKEN = HASH_BLOCK_TOKEN_BASE  # the first block the logged hits found cached
PERCENTILES = (50.0, 99.0)


@dataclasses.dataclass(frozen=True, slots=True)
class RealRun:
    prompt_lens: list[int]
    output_lens: list[int]
    send_times: list[float]       # seconds from the first send
    result: dict[str, Any]        # the bench result file
    iterations: list[IterationLine]


def schedule_origin(result: dict[str, Any], seed: int) -> float:
    """When the bench sent its first request, from the start of its clock:
    its arrival schedule's first gap (kvsched reproduces vLLM's schedule);
    vllm bench's duration counts from there."""
    rate, burstiness = float(result["request_rate"]), float(result.get("burstiness") or 1.0)
    if not np.isfinite(rate):
        return 0.0
    n = int(result["num_prompts"])
    w = load_workload("random", None, num_prompts=n, input_len=1, output_len=1, range_ratio=0.0, prefix_len=0,
                      request_rate=rate, burstiness=burstiness, max_concurrency=None, seed=seed)
    return w.requests[0].arrival_time


def read_run(result_path: Path, log_path: Path, seed: int) -> RealRun:
    result = json.loads(result_path.read_text())
    iterations = read_iteration_log(str(log_path))
    starts = result["start_times"]
    if any(b < a for a, b in itertools.pairwise(starts)):
        sys.exit(f"{result_path}: start_times are not in send order")
    origin = schedule_origin(result, seed)
    return RealRun(list(result["input_lens"]), list(result["output_lens"]),
                   [t - starts[0] + origin for t in starts], result, iterations)


@dataclasses.dataclass(frozen=True, slots=True)
class Attribution:
    """The log's steps attributed to the requests (in send order)."""

    hits: list[int]              # each request's prefix-cache hit, tokens
    records: list[StepRecord]    # each step's work
    first_step: list[int]        # per request: the step that first scheduled it
    last_step: list[int]         # per request: the step of its last token
    sampled: list[list[int]]     # per step: the requests that received a token
    token_index: list[list[int]]  # per step: which token (0-based) each of those received


def attribute(run: RealRun, token_budget: int) -> Attribution:
    """Every logged step attributed to the requests in send order
    (:class:`~kvsched.profile.attribution.PointLedger`)."""
    requests = [SentRequest(p, o, sent=True) for p, o in zip(run.prompt_lens, run.output_lens)]
    ledger = PointLedger("serving run", requests, token_budget=token_budget)
    sampled: list[list[int]] = []
    token_index: list[list[int]] = []
    records: list[StepRecord] = []
    first_step = [-1] * len(requests)
    for k, it in enumerate(run.iterations):
        before = [r.generated for r in requests]
        untouched = [r.computed == 0 for r in requests]
        record = ledger.step(it)
        if record is None:
            sys.exit(f"the server log's steps do not follow from the requests sent: {ledger.problem}")
        records.append(record)
        for i, r in enumerate(requests):
            if untouched[i] and r.computed:
                first_step[i] = k
        got = [i for i, r in enumerate(requests) if r.generated > before[i]]
        sampled.append(got)
        token_index.append([requests[i].generated - 1 for i in got])
    if not ledger.done:
        sys.exit("the server log ends before every request finished")
    last_step = [-1] * len(requests)
    for k, got in enumerate(sampled):
        for i in got:
            last_step[i] = k
    return Attribution([r.cached for r in requests], records, first_step, last_step, sampled, token_index)


def attribute_by_replay(run: RealRun, config: SimConfig,
                        workload: Workload) -> tuple[Attribution, IterationReplay]:
    """Every logged step attributed to the requests by kvsched's own
    scheduler (:func:`kvsched.calibrate.step_matching.replay_iteration_log`:
    chunking, prefix-cache hits, preemption and the long-prefill threshold
    are the scheduler's decisions; only arrivals are read off the log).
    ``workload`` holds the run's requests in send order as the server got
    them (their shared prefixes included)."""
    first_token = [t + ttft for t, ttft in zip(run.send_times, run.result["ttfts"])]
    rep = replay_iteration_log(config, workload, run.iterations, first_token)
    if not rep.complete:
        sys.exit(f"kvsched's scheduler cannot explain the server log: {rep.reason}")
    records = []
    for it, st in zip(run.iterations, rep.steps):
        sh = st.shape
        records.append(StepRecord(
            point="serving run", iteration=it.iteration, context_requests=it.context_requests,
            context_tokens=it.context_tokens, generation_requests=it.generation_requests,
            generation_tokens=it.generation_tokens, elapsed_ms=it.elapsed_ms, num_tokens=sh.num_tokens,
            num_reqs=sh.num_reqs, num_sampled=sh.num_sampled, prefill_tokens=sh.prefill_tokens,
            prefill_attn_pairs=sh.prefill_attn_pairs, decode_kv_tokens=sh.decode_kv_tokens))
    n = len(run.prompt_lens)
    first_step, last_step = [-1] * n, [-1] * n
    for k, st in enumerate(rep.steps):
        for i in st.scheduled:
            if first_step[i] < 0:
                first_step[i] = k
        for i in st.sampled:
            last_step[i] = k
    return Attribution([0] * n, records, first_step, last_step, [st.sampled for st in rep.steps],
                       [st.token_index for st in rep.steps]), rep


def client_step_ends(run: RealRun, att: Attribution) -> list[float | None]:
    """When each logged step's tokens reached the client (seconds from the
    first send; the earliest of its tokens), from the bench's TTFTs and
    ITLs; None for a step that sampled nothing."""
    result = run.result
    token_times = []
    for i, send in enumerate(run.send_times):
        t = send + result["ttfts"][i]
        times = [t]
        for gap in result["itls"][i]:
            t += gap
            times.append(t)
        token_times.append(times)
    return [min(token_times[i][j] for i, j in zip(got, idx)) if got else None
            for got, idx in zip(att.sampled, att.token_index)]


def measured_host_terms(run: RealRun, att: Attribution, cpu_step_s: float,
                        cpu_per_request_s: float) -> tuple[HostTerms, dict[str, Any]]:
    """The host time vLLM's iteration clock leaves out, read off this run
    (not fitted to its metrics): between two back-to-back steps the client
    sees its tokens ``elapsed + gap`` apart; the gap less kvsched's own CPU
    terms is the host's per-step term (a line in the requests that
    sample), and a request sent to an idle engine sees its first token
    ``arrival + elapsed + gap`` after its send."""
    ends = client_step_ends(run, att)
    its = run.iterations
    by_sampled: dict[int, list[float]] = {}
    gaps: list[float] = []
    for k in range(1, len(its)):
        a, b = ends[k - 1], ends[k]
        if a is None or b is None or its[k].generation_requests == 0:
            continue  # a step the engine may have waited before (nothing was decoding)
        n = its[k].context_requests + its[k].generation_requests
        gap = b - a - its[k].elapsed_ms / 1e3
        gaps.append(gap)
        by_sampled.setdefault(len(att.sampled[k]), []).append(gap - cpu_step_s - cpu_per_request_s * n)
    # A weighted line through the per-size medians (robust to the stalls).
    xs = np.array(sorted(by_sampled), dtype=float)
    ys = np.array([statistics.median(by_sampled[int(x)]) for x in xs])
    w = np.sqrt([len(by_sampled[int(x)]) for x in xs])
    slope, intercept = np.polyfit(xs, ys, 1, w=w)
    slope, intercept = max(0.0, float(slope)), max(0.0, float(intercept))
    first_step = {}
    for k, got in enumerate(att.sampled):
        for i, j in zip(got, att.token_index[k]):
            if j == 0:
                first_step[i] = k
    idle = []
    for i, k in first_step.items():
        prev = ends[k - 1] if k else None
        # Idle: the step before ended before the send. A step the client saw
        # no token of (a prefill chunk, maybe this request's own first one)
        # has no end: such an arrival is not counted (its first token came
        # after several steps, and counting it read ~550 ms "arrival delays"
        # off the Azure runs' 1,024-token prompts).
        if its[k].generation_requests == 0 and (k == 0 or (prev is not None and prev < run.send_times[i])):
            gap = (intercept + slope * len(att.sampled[k]) + cpu_step_s
                   + cpu_per_request_s * its[k].context_requests)
            idle.append(run.result["ttfts"][i] - its[k].elapsed_ms / 1e3 - gap)
    arrival = max(0.0, statistics.median(idle)) if idle else 0.0
    terms = HostTerms(0.0, "as logged", "as logged", "read off the real run's client timestamps",
                      step_s=intercept, per_sampled_request_s=slope, arrival_s=arrival)
    info = {"client_gap_ms": {"steps": len(gaps), "median": 1e3 * statistics.median(gaps),
                              "p10": 1e3 * float(np.percentile(gaps, 10)),
                              "p90": 1e3 * float(np.percentile(gaps, 90))},
            "step_s_ms": 1e3 * intercept, "per_sampled_request_ms": 1e3 * slope,
            "arrival_ms": 1e3 * arrival, "idle_arrivals": len(idle),
            "idle_arrival_ms": [round(1e3 * x, 1) for x in idle]}
    return terms, info


def build_workload(run: RealRun, hits: Sequence[int], block_size: int,
                   arrivals: Sequence[float] | None = None) -> Workload:
    """The run's requests: its lengths, sent at its send times, with the
    logged hits as a shared first block (request 0's)."""
    shared = max(hits, default=0)
    if any(h not in (0, shared) for h in hits) or shared % block_size:
        sys.exit(f"prefix-cache hits {sorted(set(hits))}: only one hit length, a multiple of the "
                 f"{block_size}-token block, is modelled")
    requests = []
    times = run.send_times if arrivals is None else arrivals
    for i, (p, o, t) in enumerate(zip(run.prompt_lens, run.output_lens, times)):
        own = (UNIQUE_TOKEN_BASE + i, p - shared) if shared else (UNIQUE_TOKEN_BASE + i, p)
        runs = ((SHARED_BLOCK_TOKEN, shared), own) if shared and (i == 0 or hits[i]) else (
            (UNIQUE_TOKEN_BASE + i, p),)
        requests.append(WorkloadRequest(f"req-{i}", t, runs, o))
    return Workload("real-run", tuple(requests))


def step_pinned_arrivals(run: RealRun, att: Attribution, step_seconds: Sequence[float]) -> list[float]:
    """Arrival times that put each request where vLLM first scheduled it:
    with the log's steps taking ``step_seconds`` one after the other (the
    engine idle only where nothing was in flight, until the next send),
    a request first scheduled at step k arrives during step k - 1 (at an
    idle engine: at step k's start). A simulation with these arrivals and
    these step times tests the scheduler alone: any step whose batch differs
    from the log's is the scheduler's doing, not a timing race."""
    n = len(run.iterations)
    # In flight after step k: first scheduled at or before k, last token after k.
    arrivals = [0.0] * len(run.send_times)
    by_step: dict[int, list[int]] = {}
    for i, k in enumerate(att.first_step):
        by_step.setdefault(k, []).append(i)
    t = 0.0
    busy_after = [False] * n
    for first, last in zip(att.first_step, att.last_step):
        for k in range(first, last):
            busy_after[k] = True
    for k in range(n):
        new = by_step.get(k, [])
        if k == 0 or not busy_after[k - 1]:
            # An idle engine: the step starts when its first request arrives.
            t = max(t, min(run.send_times[i] for i in new)) if new else t
            for i in new:
                arrivals[i] = t
        else:
            for i in new:
                arrivals[i] = t - min(1e-3, step_seconds[k - 1] / 2)
        t += step_seconds[k]
    return arrivals


def run_spec(args: argparse.Namespace, backend: str) -> RunSpec:
    engine = EngineOptions(
        model=args.model, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, block_size=args.block_size, async_scheduling=args.async_scheduling,
        num_gpu_blocks_override=args.kv_cache_tokens // args.block_size,
        step_time_backend="profiled" if backend == "profiled" else "roofline",
        step_time_profile=args.step_time_profile if backend == "profiled" else None)
    return RunSpec(DeploymentSpec((InstanceGroup(engine=engine),)),
                   options=RunOptions(fast_forward=False, percentiles=PERCENTILES))


def simulate(args: argparse.Namespace, workload: Workload, backend: str,
             logged: Sequence[LoggedStep] = (), host: HostTerms | None = None,
             window: int = 0) -> tuple[SimResult, list[dict[str, Any]], Any]:
    """kvsched's run of ``workload``: its result, its step trace and the
    step-time model that priced it."""
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "steps.jsonl"
        spec = run_spec(args, backend)
        spec = spec.with_options(trace_steps=str(trace_path))
        deployment, _ = build_group_deployment(spec.deployment.group)
        if backend == "logged":
            d = deployment
            model = LoggedStepTimeModel(d.model, d.hardware, d.parallel, d.runtime, logged,
                                        source=str(args.server_log), host=host, window=window)
            deployment = dataclasses.replace(deployment, step_model=model)
        config = sim_config(deployment, spec)
        result = serve(deployment, spec.deployment.group, workload, config, spec.options)
        trace = [json.loads(line) for line in trace_path.read_text().splitlines()]
    return result, trace, deployment


def compositions(trace: list[dict[str, Any]], prompt_lens: dict[str, int]) -> list[Composition]:
    """Each simulated step's batch as vLLM's iteration log counts it
    (:func:`kvsched.calibrate.step_matching.iteration_counts`): a
    context request has produced no output token yet (a prompt chunk, its
    last one included), every other a generation request (a preempted one
    recomputing its prompt too)."""
    computed: dict[str, int] = {}
    outputs: dict[str, int] = {}
    out: list[Composition] = []
    for step in trace:
        computed.update(step["computed_at_admission"])
        scheduled = dict(step["scheduled"])
        out.append(iteration_counts(scheduled, {rid: outputs.get(rid, 0) for rid in scheduled}))
        for rid, n in scheduled.items():
            computed[rid] += n
            if computed[rid] >= prompt_lens[rid]:
                outputs[rid] = outputs.get(rid, 0) + 1
    return out


def describe(c: Composition) -> str:
    return f"{c[0]} ctx req / {c[1]} ctx tok, {c[2]} gen req / {c[3]} gen tok"


def step_comparison(real: list[Composition], sim: list[Composition]) -> dict[str, Any]:
    same = sum(a == b for a, b in zip(real, sim))
    first = next((i for i, (a, b) in enumerate(zip(real, sim)) if a != b), None)
    if first is None and len(real) != len(sim):
        first = min(len(real), len(sim))
    return {"real_steps": len(real), "sim_steps": len(sim), "same_composition": same,
            "first_divergence": first}


def profiled_step_errors(att: Attribution, deployment: Any) -> dict[str, Any]:
    """The profiled backend's forward-pass price of each logged step's
    attributed work against its logged time (vLLM's iteration time and the
    profile's are the same clock)."""
    model = deployment.step_model
    errs: dict[str, list[float]] = {"all": [], "decode": [], "with prefill": []}
    for r in att.records:
        shape = BatchShape(r.num_tokens, r.num_reqs, r.num_sampled, r.generation_requests, r.decode_kv_tokens,
                           r.prefill_tokens, 0, r.prefill_attn_pairs)
        e = model.gpu_time(shape) / (r.elapsed_ms / 1e3) - 1.0
        errs["all"].append(e)
        errs["decode" if r.context_requests == 0 else "with prefill"].append(e)
    return {k: {"steps": len(v), "median_signed_pct": 100 * statistics.median(v),
                "median_abs_pct": 100 * statistics.median(map(abs, v))} for k, v in errs.items() if v}


def real_metrics(result: dict[str, Any]) -> dict[str, float]:
    lat = np.asarray(result["latencies"]) * 1e3
    out = {k: float(result[k]) for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
                                         "median_itl_ms", "p99_itl_ms", "output_throughput")}
    out["mean_e2el_ms"] = float(lat.mean())
    out["median_e2el_ms"] = float(np.percentile(lat, 50))
    out["p99_e2el_ms"] = float(np.percentile(lat, 99))
    out["duration_s"] = float(result["duration"])
    return out


def sim_metrics(result: SimResult) -> dict[str, float]:
    m = result.metrics(PERCENTILES)
    keys = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "p99_itl_ms",
            "output_throughput", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "duration")
    out = {k: float(m[k]) for k in keys}
    out["duration_s"] = out.pop("duration")
    return out


def metric_errors(real: dict[str, float], sim: dict[str, float]) -> dict[str, dict[str, float]]:
    return {k: {"real": real[k], "kvsched": sim[k], "error_pct": 100 * (sim[k] / real[k] - 1)} for k in real}


def replay(args: argparse.Namespace, run: RealRun, att: Attribution, workload: Workload,
           logged: Sequence[LoggedStep], host: HostTerms | None, window: int) -> dict[str, Any]:
    """One replay priced with the logged step times: its steps against the
    log's, and its metrics against the real run's."""
    result, trace, deployment = simulate(args, workload, "logged", logged, host, window)
    prompt_lens = {f"req-{i}": n for i, n in enumerate(run.prompt_lens)}
    sim = compositions(trace, prompt_lens)
    real = real_compositions(run)
    steps = step_comparison(real, sim)
    m = deployment.step_model
    steps["priced_by"] = {"window": window, "in_order": m.num_in_order, "ahead": m.num_ahead,
                          "behind": m.num_behind, "logged_steps_skipped": m.num_skipped,
                          "elsewhere": m.num_elsewhere, "mismatched": m.num_mismatches}
    steps["steps_past_the_log"] = max(0, len(trace) - len(real))
    first = steps["first_divergence"]
    if first is not None:
        steps["around_first_divergence"] = [
            {"step": i, "real": describe(real[i]) if i < len(real) else None,
             "sim": describe(sim[i]) if i < len(sim) else None}
            for i in range(max(0, first - 1), first + 2)]
    recs = result.records
    ttft = {rid: f - t for rid, f, t in zip(recs.request_id, recs.first_token_time, recs.send_time)}
    diffs = [1e3 * (ttft[f"req-{i}"] - run.result["ttfts"][i]) for i in range(len(run.send_times))]
    largest = sorted(((round(d, 1), i) for i, d in enumerate(diffs)), key=lambda x: -abs(x[0]))[:5]
    return {"steps": steps,
            "ttft_difference_ms": {"median": statistics.median(diffs), "mean": statistics.fmean(diffs),
                                   "largest_with_request": largest},
            "metrics": metric_errors(real_metrics(run.result), sim_metrics(result))}


def real_compositions(run: RealRun) -> list[Composition]:
    return [(it.context_requests, it.context_tokens, it.generation_requests, it.generation_tokens)
            for it in run.iterations]


def compare(args: argparse.Namespace, run: RealRun) -> dict[str, Any]:
    """Every figure of the comparison (see the module)."""
    att = attribute(run, args.max_num_batched_tokens)
    workload = build_workload(run, att.hits, args.block_size)
    report: dict[str, Any] = {"prefix_cache_hits": {f"req-{i}": h for i, h in enumerate(att.hits) if h}}
    logged = [LoggedStep(c[1] + c[3], c[0] + c[2], it.elapsed_ms / 1e3)
              for c, it in zip(real_compositions(run), run.iterations)]
    # Steps the simulation runs past the log (its steps diverged) are priced
    # at the log's median and counted, so the replay still finishes.
    median_s = statistics.median(s.elapsed_s for s in logged)
    logged += [LoggedStep(1, 1, median_s)] * len(logged)

    rt = build_group_deployment(run_spec(args, "logged").deployment.group)[0].runtime
    # The scheduler alone: each request arriving in the step before the one
    # vLLM first scheduled it in, the steps at their logged times.
    step_s = [it.elapsed_ms / 1e3 + rt.cpu_step_s + rt.cpu_per_request_s * (it.context_requests
                                                                           + it.generation_requests)
              for it in run.iterations]
    pinned = build_workload(run, att.hits, args.block_size, step_pinned_arrivals(run, att, step_s))
    # Its send times are not the bench's: its steps only.
    report["logged_in_order_step_pinned_arrivals"] = {
        "steps": replay(args, run, att, pinned, logged, None, 0)["steps"]}
    report["logged_in_order_kvsched_host"] = replay(args, run, att, workload, logged, None, 0)
    report["logged_aligned_kvsched_host"] = replay(args, run, att, workload, logged, None, args.window)
    host, info = measured_host_terms(run, att, rt.cpu_step_s, rt.cpu_per_request_s)
    report["host_read_off_the_run"] = info
    report["logged_in_order_measured_host"] = replay(args, run, att, workload, logged, host, 0)
    report["logged_aligned_measured_host"] = replay(args, run, att, workload, logged, host, args.window)

    if args.step_time_profile:
        result, trace, deployment = simulate(args, workload, "profiled")
        prompt_lens = {f"req-{i}": n for i, n in enumerate(run.prompt_lens)}
        report["profiled"] = {
            "steps": step_comparison(real_compositions(run), compositions(trace, prompt_lens)),
            "step_time_error": profiled_step_errors(att, deployment),
            "metrics": metric_errors(real_metrics(run.result), sim_metrics(result))}
    return report


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--result", type=Path, required=True,
                   help="vllm bench serve's result file (--save-detailed)")
    p.add_argument("--server-log", type=Path, required=True,
                   help="the server's log with --enable-logging-iteration-details (.gz read as such)")
    p.add_argument("--model", required=True, help="the served checkpoint (its config.json)")
    p.add_argument("--step-time-profile",
                   help="also price the steps with this profile (item 1's step times)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=128, help="vLLM's CPU platform default: 128")
    p.add_argument("--kv-cache-tokens", type=int, default=65536, help="the KV cache the server logged")
    p.add_argument("--seed", type=int, default=0, help="the bench's --seed (its arrival schedule)")
    p.add_argument("--async-scheduling", action="store_true",
                   help="simulate vLLM's async engine loop (vLLM's CPU platform turns it off: a "
                   "contrast only)")
    p.add_argument("--window", type=int, default=4,
                   help="logged steps either side a simulated step's batch is looked for (aligned replays)")
    p.add_argument("--output", type=Path, help="write every figure here (JSON)")
    args = p.parse_args(argv)

    run = read_run(args.result, args.server_log, args.seed)
    report = compare(args, run)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
