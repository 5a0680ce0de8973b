"""``kvsched simulate``: flags named as vLLM's engine arguments and as
``vllm bench serve``'s; results with vllm bench's JSON keys."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsched.sim.deployment import (
    QUANTIZATIONS,
    STEP_TIME_BACKENDS,
    Deployment,
    EngineOptions,
    build_deployment,
)
from kvsched.sim.metrics import parse_goodput
from kvsched.sim.refusals import failure_reasons, format_failures, split_refused
from kvsched.sim.results import (
    describe_run,
    detailed_lists,
    json_safe,
    num_gpus,
    per_gpu_metrics,
)
from kvsched.sim.simulator import SimConfig, SimResult, Simulator, stderr_progress
from kvsched.sim.workload import (
    DATASET_NAMES,
    DEFAULT_INPUT_LEN,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_OUTPUT_LEN,
    MAX_ARRIVAL_TIME,
    MAX_BURSTINESS,
    MAX_NUM_PROMPTS,
    MAX_REQUEST_TOKENS,
    MAX_SEED,
    MIN_BURSTINESS,
    Workload,
    load_workload,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from kvsched.sim.cluster import Cluster
    from kvsched.sim.dp import DPSimulator


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    d = EngineOptions()
    g = p.add_argument_group("engine (vLLM's engine arguments)")
    g.add_argument("--model", default=d.model,
                   help="catalog name, with or without the organisation, or a Hugging Face "
                        "model directory / config.json (default: %(default)s)")
    g.add_argument("--hardware", default=d.hardware,
                   help="accelerator id (h100-sxm, h200, a100-80gb, b200, l40s, rtx-4090, mi300x, "
                        "ascend-910b, ...) or a YAML/JSON hardware file (default: %(default)s)")
    g.add_argument("--efficiency-file", help="YAML/JSON file overriding the roofline's efficiency factors")
    g.add_argument("--calibration", metavar="FILE",
                   help="host-time terms for the measured backend (JSON, as kvsched.perf.host "
                        "describes; default: the terms fitted on real vLLM runs)")
    g.add_argument("--step-time-backend", choices=list(STEP_TIME_BACKENDS), default=d.step_time_backend,
                   help="how engine steps are priced: measured vLLM kernel latencies "
                        "(aiconfigurator-core's tables), the roofline, or auto: measured where "
                        "the tables cover the model, GPU and precision (default: %(default)s)")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size,
                   help="GPUs per engine core, sharding each layer (default: %(default)s)")
    g.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="engine cores, each with its own scheduler and KV cache (default: 1)")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="shard experts over TP x DP ranks (MoE ranks then step in lockstep); "
                        "no effect on a dense model")
    g.add_argument("--dp-routing", choices=["vllm", "round-robin", "least-loaded"], default="vllm",
                   help="how arrivals pick a DP rank (vllm: vLLM's load score on stale stats and "
                        "its own in-flight counts)")
    g.add_argument("--dp-stats-interval", type=float, default=0.1,
                   help="seconds between the load stats the vllm router sees (default 0.1)")
    g.add_argument("--dp-sync-interval", type=int, default=16,
                   help="lockstep (MoE) DP ranks: steps between the all-reduces that find every "
                        "rank idle and end a wave (default: %(default)s)")
    g.add_argument("--admission-policy", choices=["none", "balance", "adp-balance", "prefill-cadence"],
                   default="none", help="admission policy on every rank (see docs/simulator.md)")
    g.add_argument("--balance-threshold", choices=["full", "full-minus-one"], default="full",
                   help="balance: hold while any rank runs max_num_seqs (full) or one less")
    g.add_argument("--adp-timeout-iters", type=int, default=50,
                   help="adp-balance: steps a rank waits for the others before it admits anyway "
                        "(default: %(default)s)")
    g.add_argument("--adp-batching-wait-iters", type=int, default=0,
                   help="adp-balance: extra steps to wait so admissions batch up "
                        "(default: %(default)s)")
    g.add_argument("--max-num-seqs", type=int,
                   help="most requests running at once per engine core "
                        "(default: vLLM serve's for the hardware)")
    g.add_argument("--max-num-batched-tokens", type=int,
                   help="token budget of one engine step per engine core "
                        "(default: vLLM serve's for the hardware)")
    g.add_argument("--max-model-len", type=int,
                   help="longest prompt + output a request may have; the server refuses longer "
                        "ones (default: the model's context length)")
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=d.enable_chunked_prefill,
                   help="split long prompts over several steps (default: on, as vLLM's v1)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=d.enable_prefix_caching,
                   help="reuse KV blocks of shared prompt prefixes (default: on, as vLLM's v1)")
    g.add_argument("--block-size", type=int, default=d.block_size,
                   help="tokens per KV cache block (default: %(default)s)")
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization,
                   help="share of GPU memory vLLM may use; the KV cache gets what the weights "
                        "and activations leave (default: %(default)s)")
    g.add_argument("--long-prefill-token-threshold", type=int, default=d.long_prefill_token_threshold,
                   help="cap on a long prompt's tokens per step when chunking (0: off; "
                        "default: %(default)s)")
    g.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default=d.scheduling_policy,
                   help="order of the waiting queue (default: %(default)s)")
    g.add_argument("--dtype", default=d.dtype,
                   help="precision of an unquantized checkpoint: bf16 (default) or fp16 (fp8: "
                        "as --quantization fp8)")
    g.add_argument("--quantization", "-q", choices=list(QUANTIZATIONS), default=None,
                   help="the weights' format as vLLM's --quantization names it: fp8 (on the fly), "
                        "modelopt_fp4 (NVFP4), mxfp4 (MoE experts) (default: the checkpoint's own "
                        "format, e.g. FP8 for a name ending in -FP8, MXFP4 experts for gpt-oss)")
    g.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, help="auto (16 bits) or fp8")
    g.add_argument("--num-gpu-blocks-override", type=int,
                   help="KV cache blocks per engine core, instead of what memory leaves")
    g.add_argument("--prefill-schedule-interval", type=int, default=d.prefill_schedule_interval,
                   help="admit prefill only every K engine steps (vLLM's prefill cadence)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   default=d.async_scheduling,
                   help="vLLM's async engine loop: schedule step N+1 while step N runs, its CPU "
                        "work overlapping the forward pass (vLLM's GPU default: on)")
    g.add_argument("--speculative-config", metavar="JSON",
                   help="speculative decoding as vLLM takes it, e.g. '{\"method\": \"mtp\", "
                        "\"num_speculative_tokens\": 1}' (methods: mtp, eagle, eagle3, ngram, "
                        "ngram_gpu; default: off)")
    g.add_argument("--spec-acceptance", metavar="R0,R1,...",
                   help="speculative decoding: acceptance rate per draft position as vLLM's metrics "
                        "report it (accepted at position i / drafts), e.g. 0.8,0.6,0.45 "
                        "(default: per method, see docs/simulator.md)")


# Flags of the random dataset only. argparse leaves them None so that a flag
# the user gave can be told from one left at its default (a trace dataset
# refuses the former); resolve_workload_args fills the defaults, in one place.
RANDOM_DEFAULTS: dict[str, Any] = {
    "random_input_len": DEFAULT_INPUT_LEN,
    "random_output_len": DEFAULT_OUTPUT_LEN,
    "random_range_ratio": 0.0,
    "random_prefix_len": 0,
    "request_rate": math.inf,
    "burstiness": 1.0,
}


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (vllm bench serve's arguments)")
    g.add_argument("--dataset-name", choices=DATASET_NAMES, default="random",
                   help="random (synthetic) or a trace: azure, mooncake, jsonl (default: random)")
    g.add_argument("--dataset-path", help="trace file for azure, mooncake or jsonl")
    g.add_argument("--num-prompts", type=int,
                   help=f"prompts to send (random: default {DEFAULT_NUM_PROMPTS}; traces: default all)")
    g.add_argument("--random-input-len", type=int,
                   help=f"random: prompt tokens per request (default {DEFAULT_INPUT_LEN})")
    g.add_argument("--random-output-len", type=int,
                   help=f"random: output tokens per request (default {DEFAULT_OUTPUT_LEN})")
    g.add_argument("--random-range-ratio", type=float,
                   help="random: lengths drawn uniformly within +-ratio of the above (default 0)")
    g.add_argument("--random-prefix-len", type=int,
                   help="random: tokens of a prefix shared by every prompt (default 0)")
    g.add_argument("--request-rate", type=float,
                   help="random: requests/s (default inf: all at once); a trace keeps its own "
                        "arrival times, rescale them with --time-scale")
    g.add_argument("--burstiness", type=float,
                   help="random: gamma shape of the arrival gaps, 1 = Poisson (default 1)")
    g.add_argument("--max-concurrency", type=int,
                   help="most requests in flight; later ones wait at the client (default: no limit)")
    g.add_argument("--seed", type=int, default=0,
                   help="seed of the random dataset and of EOS draws (default: %(default)s)")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the request rate; default 1)")
    g.add_argument("--duration", type=float,
                   help="keep only requests arriving before this many seconds")
    g.add_argument("--eos-probability", type=float, default=0.0,
                   help="per-token EOS probability; 0 (default) generates each request's output "
                        "length, as ignore_eos does")


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--save-result", metavar="FILE.json",
                   help="results with vllm bench's keys, plus the deployment and workload")
    g.add_argument("--save-detailed", action="store_true",
                   help="with --save-result: also vllm bench's per-request lists and records")
    g.add_argument("--report", metavar="FILE.html", help="a self-contained page with plots")
    g.add_argument("--trace-steps", metavar="FILE.jsonl",
                   help="the scheduler's step trace plus each step's start and duration "
                        "(steps every step: no fast-forward)")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    g.add_argument("--metric-percentiles", default="50,90,99",
                   help="percentiles to report, comma-separated (default: %(default)s)")
    g.add_argument("--no-fast-forward", action="store_true",
                   help="step through pure-decode stretches one by one (same results, slower)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate", help="simulate a vLLM deployment serving a workload, without the GPUs",
        description="Drive kvsched's exact vLLM scheduler in virtual time with a performance "
                    "model: throughput and TTFT/TPOT/ITL/latency for a model, hardware, "
                    "parallelism, scheduler settings and traffic.")
    add_engine_arguments(p)
    add_workload_arguments(p)
    add_output_arguments(p)
    p.set_defaults(func=run_simulate)


def engine_options(args: argparse.Namespace) -> EngineOptions:
    return EngineOptions(
        model=args.model, hardware=args.hardware, efficiency_file=args.efficiency_file,
        step_time_backend=args.step_time_backend, calibration=args.calibration,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        scheduling_policy=args.scheduling_policy, dtype=args.dtype, quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype, num_gpu_blocks_override=args.num_gpu_blocks_override,
        async_scheduling=args.async_scheduling,
        speculative_config=getattr(args, "speculative_config", None),
        spec_acceptance=getattr(args, "spec_acceptance", None),
        prefill_schedule_interval=(args.prefill_schedule_interval
                                   if args.admission_policy != "prefill-cadence"
                                   else max(args.prefill_schedule_interval, 2)))


def make_deployment(args: argparse.Namespace, who: str = "") -> Deployment:
    """The deployment ``args`` describe. Expert parallelism on a dense model
    is dropped with a note on stderr, as vLLM has no experts to shard there."""
    options = engine_options(args)
    deployment = build_deployment(options)
    if options.enable_expert_parallel and not deployment.model.is_moe:
        print(f"kvsched: note: {who}--enable-expert-parallel has no effect: {deployment.model.name} "
              "is a dense model (no experts), and vLLM ignores expert parallelism for it",
              file=sys.stderr, flush=True)
        deployment = build_deployment(dataclasses.replace(options, enable_expert_parallel=False))
    return deployment


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# Steps a step-counting flag may name (--prefill-schedule-interval,
# --dp-sync-interval, --adp-*-iters): a million. An engine step takes at
# least ~1 ms, so that is over a quarter of an hour between events the flag
# paces; more is no cadence, only a way to stall a run.
MAX_STEP_COUNT = 1_000_000


def _show(value: object) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text if len(text) <= 40 else f"{text[:12]}...({len(text)} digits)"


def _int_flag(args: argparse.Namespace, dest: str, low: int, high: int, why: str) -> None:
    value = getattr(args, dest, None)
    if value is not None and not low <= value <= high:
        raise ValueError(f"{_flag(dest)}={_show(value)}: must be an integer in [{low}, {high:,}] ({why})")


def check_flag_ranges(args: argparse.Namespace) -> None:
    """Every number of the workload and run flags in its stated range, before
    anything is built from it (the engine flags: ``validate_engine_options``;
    the time span a rate or time scale gives: ``build_workload``)."""
    n = args.num_prompts
    if n is not None and n < 1:
        raise ValueError(f"--num-prompts={_show(n)}: must be at least 1; leave it out to send "
                         f"{DEFAULT_NUM_PROMPTS} random prompts or a whole trace")
    _int_flag(args, "num_prompts", 1, MAX_NUM_PROMPTS,
              "the random dataset draws every request up front; memory grows with the count")
    tokens_why = ("2**40, far beyond any context window; a longer request is refused against "
                  "max_model_len anyway")
    for dest in ("random_input_len", "random_output_len", "random_prefix_len"):
        _int_flag(args, dest, 0, MAX_REQUEST_TOKENS, tokens_why)
    ratio = args.random_range_ratio
    if ratio is not None and not 0 <= ratio < 1:
        raise ValueError(f"--random-range-ratio={_show(ratio)}: must be in [0, 1) (lengths are drawn "
                         "within +-ratio of --random-input-len / --random-output-len)")
    rate = args.request_rate
    if rate is not None and not rate > 0:
        raise ValueError(f"--request-rate={_show(rate)}: must be > 0 requests/s; inf (the default) "
                         "sends every request at once")
    b = args.burstiness
    if b is not None and not (MIN_BURSTINESS <= b <= MAX_BURSTINESS or b == math.inf):
        raise ValueError(f"--burstiness={_show(b)}: must be in [{MIN_BURSTINESS}, {MAX_BURSTINESS:g}] or "
                         "inf (constant gaps); below, numpy's gamma gaps underflow to 0 and the "
                         "arrivals are not the process asked for; 1 is Poisson")
    mc = args.max_concurrency
    if mc is not None and mc < 1:
        raise ValueError(f"--max-concurrency={_show(mc)}: must be at least 1 (above the number of "
                         "requests it is no limit); leave it out for no limit")
    _int_flag(args, "seed", 0, MAX_SEED, "vLLM seeds numpy's RandomState, which takes 32-bit seeds")
    scale = args.time_scale
    if not (0 < scale < math.inf):
        raise ValueError(f"--time-scale={_show(scale)}: must be a finite number > 0 (0.5 = twice the "
                         "request rate)")
    if args.duration is not None and not args.duration > 0:
        raise ValueError(f"--duration={_show(args.duration)}: must be > 0 seconds; leave it out to keep "
                         "every request")
    p = args.eos_probability
    if not 0 <= p < 1:
        raise ValueError(f"--eos-probability={_show(p)}: must be in [0, 1) (the chance each output "
                         "token is EOS; 0 generates every request's output length)")
    stats = getattr(args, "dp_stats_interval", None)
    if stats is not None and not 0 < stats <= MAX_ARRIVAL_TIME:
        raise ValueError(f"--dp-stats-interval={_show(stats)}: must be a number of seconds in "
                         f"(0, {MAX_ARRIVAL_TIME:g}] (the simulator's time span); vLLM's is 0.1")
    steps_why = "a million steps is over a quarter of an hour of engine time"
    _int_flag(args, "dp_sync_interval", 1, MAX_STEP_COUNT, steps_why)
    _int_flag(args, "adp_timeout_iters", 0, MAX_STEP_COUNT, steps_why)
    _int_flag(args, "adp_batching_wait_iters", 0, MAX_STEP_COUNT, steps_why)
    _int_flag(args, "prefill_schedule_interval", 1, MAX_STEP_COUNT, steps_why)


def resolve_workload_args(args: argparse.Namespace) -> argparse.Namespace:
    """A copy of ``args`` with the flags' ranges checked
    (:func:`check_flag_ranges`), the workload flags checked against the
    dataset and the random dataset's defaults filled in (trace datasets keep
    None)."""
    check_flag_ranges(args)
    out = copy.copy(args)
    if args.dataset_name == "random":
        if args.dataset_path is not None:
            raise ValueError(f"--dataset-path={args.dataset_path}: --dataset-name is random (the "
                             "default), which reads no file; add --dataset-name azure, mooncake or "
                             "jsonl to replay the trace")
        for dest, default in RANDOM_DEFAULTS.items():
            if getattr(out, dest) is None:
                setattr(out, dest, default)
        if out.num_prompts is None:
            out.num_prompts = DEFAULT_NUM_PROMPTS
        return out
    if not args.dataset_path:
        raise ValueError(f"--dataset-name {args.dataset_name}: needs --dataset-path, the trace file "
                         "to replay")
    for dest in ("request_rate", "burstiness"):
        value = getattr(args, dest)
        if value is not None:
            raise ValueError(f"{_flag(dest)}={value:g}: the {args.dataset_name} dataset replays the "
                             "trace's own arrival times; rescale them with --time-scale "
                             "(0.5 = twice the rate) instead")
    for dest in RANDOM_DEFAULTS:
        value = getattr(args, dest)
        if value is not None:
            raise ValueError(f"{_flag(dest)}={value:g}: only for --dataset-name random; the "
                             f"{args.dataset_name} dataset takes each request's lengths from the "
                             "trace, drop the flag")
    return out


def build_workload(args: argparse.Namespace) -> Workload:
    """The workload of ``args`` after :func:`resolve_workload_args`."""
    if args.dataset_name == "random":
        span = args.num_prompts / args.request_rate
        if span > MAX_ARRIVAL_TIME:
            raise ValueError(
                f"--request-rate={_show(args.request_rate)}: {args.num_prompts} prompts at that rate "
                f"arrive over {span:.4g} s, beyond the simulator's time span of {MAX_ARRIVAL_TIME:g} s "
                "(float64 times lose step-time precision further out); use --request-rate >= "
                f"{args.num_prompts / MAX_ARRIVAL_TIME:.4g} or fewer --num-prompts")
        high = args.random_prefix_len + math.ceil(args.random_input_len * (1 + args.random_range_ratio))
        if high > MAX_REQUEST_TOKENS:
            raise ValueError(
                f"--random-prefix-len + --random-input-len x (1 + --random-range-ratio) = {high} "
                "tokens: must be at most 2**40 (far beyond any context window)")
        workload = load_workload(
            "random", None, num_prompts=args.num_prompts, input_len=args.random_input_len,
            output_len=args.random_output_len, range_ratio=args.random_range_ratio,
            prefix_len=args.random_prefix_len, request_rate=args.request_rate,
            burstiness=args.burstiness, max_concurrency=args.max_concurrency, seed=args.seed)
    else:
        workload = load_workload(args.dataset_name, args.dataset_path,
                                 max_concurrency=args.max_concurrency)
    if args.time_scale != 1.0:
        last = workload.last_arrival_time * args.time_scale
        if last > MAX_ARRIVAL_TIME:
            raise ValueError(
                f"--time-scale={_show(args.time_scale)}: puts the last arrival at {last:.4g} s, beyond "
                f"the simulator's time span of {MAX_ARRIVAL_TIME:g} s; use --time-scale <= "
                f"{MAX_ARRIVAL_TIME / workload.last_arrival_time:.4g}")
        workload = workload.scaled(args.time_scale)
    if args.dataset_name != "random" and args.num_prompts is not None:
        workload = workload.truncated(num_requests=args.num_prompts)
    if args.duration is not None:
        workload = workload.truncated(duration=args.duration)
    return workload


def describe_workload(args: argparse.Namespace, workload: Workload) -> str:
    n = len(workload.requests)
    conc = f", max concurrency {workload.max_concurrency}" if workload.max_concurrency else ""
    scale = f", arrival times x{args.time_scale:g} (--time-scale)" if args.time_scale != 1.0 else ""
    if args.dataset_name == "random":
        rate = "all at t=0" if math.isinf(args.request_rate) else f"{args.request_rate:g} req/s"
        return (f"{n} random prompts ({args.random_input_len} in / {args.random_output_len} out"
                f"{f', range ratio {args.random_range_ratio:g}' if args.random_range_ratio else ''}"
                f"{f', shared prefix {args.random_prefix_len}' if args.random_prefix_len else ''}"
                f", {rate}{scale}{conc})")
    return (f"{n} requests of {args.dataset_path} over {workload.last_arrival_time:,.0f} s"
            f"{scale}{conc}")


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--metric-percentiles={text!r}: give numbers like 50,90,99") from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise ValueError(f"--metric-percentiles={text!r}: each must be in [0, 100]")
    return values


OUTPUT_FLAGS = (("--save-result", "save_result"), ("--report", "report"),
                ("--trace-steps", "trace_steps"))


def check_output_path(flag: str, path: str) -> None:
    """Raise ValueError, before any simulating, if ``path`` cannot be written."""
    p = Path(path)
    if path == "" or p.is_dir():
        raise ValueError(f"{flag}={path!r}: is a folder; give a file name in it")
    folder = p.parent
    if not folder.exists():
        raise ValueError(f"{flag}={path}: folder {folder} does not exist; create it or choose "
                         "another path")
    if not folder.is_dir():
        raise ValueError(f"{flag}={path}: {folder} is not a folder; choose another path")
    writable = os.access(p, os.W_OK) if p.exists() else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise ValueError(f"{flag}={path}: not writable (permission denied); choose another path")


def check_output_paths(args: argparse.Namespace) -> None:
    for flag, dest in OUTPUT_FLAGS:
        path = getattr(args, dest, None)
        if path is not None:
            check_output_path(flag, path)
    if args.save_detailed and not args.save_result:
        raise ValueError("--save-detailed: adds per-request lists to --save-result's file; "
                         "give --save-result FILE.json too")


def serve(deployment: Deployment, args: argparse.Namespace, accepted: Workload,
          refused: list[tuple[str, str]], progress: Any = None,
          after_step: Callable[[Cluster], None] | None = None) -> SimResult:
    """Simulate the requests the server accepts; the refused ones are added to
    the result's failures, as vllm bench serve records them."""
    result = run_deployment(deployment, sim_config(deployment, args), accepted, args, progress,
                            after_step)
    result.failed.extend(refused)
    return result


def workload_source(args: argparse.Namespace) -> str:
    """Where the requests come from, for a message: the trace file, or the flags."""
    if getattr(args, "dataset_name", "random") != "random" and getattr(args, "dataset_path", None):
        return f"--dataset-path={args.dataset_path}"
    return "--dataset-name random"


def accept(deployment: Deployment, workload: Workload,
           source: str = "") -> tuple[Workload, list[tuple[str, str]]]:
    """(requests the server accepts, refused ones); an error if it accepts none
    (``source``: where the requests came from, for the message)."""
    max_model_len = deployment.scheduler_config.max_model_len
    accepted, refused = split_refused(workload, max_model_len)
    if accepted is None:
        where = f"{source}: " if source else ""
        raise ValueError(
            f"{where}all {len(refused)} requests have prompt + output > max_model_len={max_model_len}, "
            "so the server would refuse every one; raise --max-model-len (up to the model's "
            f"{deployment.model.max_position_embeddings}) or shorten the requests")
    return accepted, refused


@dataclasses.dataclass(slots=True)
class PreparedRun:
    """A simulate command line checked and built, ready to run."""

    args: argparse.Namespace
    deployment: Deployment
    workload: Workload
    accepted: Workload
    refused: list[tuple[str, str]]


def prepare_run(args: argparse.Namespace, who: str = "") -> PreparedRun:
    """Everything a run can get wrong before it starts: flags, deployment
    (a model that does not fit is refused here), workload, refusals."""
    args = resolve_workload_args(args)
    deployment = make_deployment(args, who)
    workload = build_workload(args)
    accepted, refused = accept(deployment, workload, workload_source(args))
    return PreparedRun(args, deployment, workload, accepted, refused)


def measure(run: PreparedRun, percentiles: tuple[float, ...], slos: dict[str, float] | None,
            progress: Any = None, after_step: Callable[[Cluster], None] | None = None,
            ) -> tuple[SimResult, dict[str, Any]]:
    """Simulate a prepared run: the result and vllm bench serve's metrics
    (plus per-GPU throughputs). ``after_step`` runs after every step (it may
    stop the run by raising)."""
    result = serve(run.deployment, run.args, run.accepted, run.refused, progress, after_step)
    metrics = result.metrics(percentiles, slos)
    metrics.update(per_gpu_metrics(metrics, run.deployment))
    return result, metrics


def run_simulate(args: argparse.Namespace) -> int:
    percentiles = parse_percentiles(args.metric_percentiles)
    slos = parse_goodput(args.goodput) if args.goodput else None
    check_output_paths(args)
    prepared = prepare_run(args)
    args, deployment, workload = prepared.args, prepared.deployment, prepared.workload
    print(f"Simulating {deployment.describe()}; serving {describe_workload(args, workload)}.",
          flush=True)
    progress = None if args.no_progress or not sys.stderr.isatty() else stderr_progress
    result, metrics = measure(prepared, percentiles, slos, progress)
    print(format_table(metrics, percentiles, num_gpus(deployment)))
    for line in format_failures(result.failed, len(workload.requests)):
        print(line)
    run = describe_run(deployment, args, workload)
    if args.save_result:
        note = save_result(args.save_result, deployment, args, metrics, result, workload)
        if note:
            print(f"kvsched: note: --save-detailed: {note}", file=sys.stderr)
    if args.report:
        from kvsched.report.simulate_page import write_report

        write_report(args.report, [("kvsched", result)], "kvsched simulate",
                     [deployment.describe(), describe_workload(args, workload)], metrics=[metrics],
                     descriptions=[run])
        print(f"report: {args.report}")
    return 0


def run_deployment(deployment: Deployment, config: SimConfig, workload: Workload,
                   args: argparse.Namespace, progress: Any = None,
                   after_step: Callable[[Cluster], None] | None = None) -> SimResult:
    """One engine, or data-parallel ranks with the chosen admission policy."""
    dp = deployment.parallel.data_parallel_size
    if dp == 1 and args.admission_policy in ("none", "prefill-cadence"):
        if args.trace_steps:
            with open(args.trace_steps, "w") as trace:
                return Simulator(config, workload, trace_steps=trace, progress=progress).run()
        single = Simulator(config, workload, progress=progress)
        if after_step is not None:
            single.cluster.after_step.append(after_step)
        return single.run()
    if args.trace_steps:
        raise ValueError("--trace-steps: not supported with data parallelism or DP policies yet")
    sim = build_dp_simulator(deployment, config, workload, args)
    if after_step is not None:
        sim.cluster.after_step.append(after_step)
    return sim.run().combined()


def build_dp_simulator(deployment: Deployment, config: SimConfig, workload: Workload,
                       args: argparse.Namespace) -> DPSimulator:
    """Data-parallel ranks with the chosen admission policy, publishing their
    load to each other after every step (the policies' all-gather)."""
    from kvsched.core.policies import AdpBalance, BalanceGate, DPRankStates
    from kvsched.sim.dp import DPOptions, DPSimulator

    dp = deployment.parallel.data_parallel_size
    shared = DPRankStates(dp, args.dp_sync_interval)
    policies: list[Any] = [None] * dp
    if args.admission_policy == "balance":
        if args.balance_threshold == "full-minus-one" and deployment.scheduler_config.max_num_seqs < 2:
            raise ValueError("--balance-threshold full-minus-one needs --max-num-seqs >= 2 (with 1 it "
                             "would hold every admission forever); use --balance-threshold full")
        policies = [BalanceGate(shared, r, args.balance_threshold) for r in range(dp)]
    elif args.admission_policy == "adp-balance":
        policies = [AdpBalance(shared, r, args.adp_timeout_iters, args.adp_batching_wait_iters)
                    for r in range(dp)]
    options = DPOptions(dp, lockstep=deployment.lockstep, router=args.dp_routing,
                        stats_interval=args.dp_stats_interval, sync_interval=args.dp_sync_interval)
    sim = DPSimulator(config, workload, options, policies, shared)
    sim.after_step.append(lambda d: shared.publish_all([r.sched for r in d.ranks]))
    return sim


def sim_config(deployment: Deployment, args: argparse.Namespace) -> SimConfig:
    return SimConfig(deployment.scheduler_config, deployment.cache_config, deployment.step_model,
                     eos_probability=args.eos_probability, seed=args.seed,
                     fast_forward=not args.no_fast_forward,
                     prefill_schedule_interval=deployment.options.prefill_schedule_interval,
                     keep_token_times=bool(getattr(args, "save_detailed", False)),
                     # The step log grows with the run; only the report plots it.
                     keep_step_log=bool(getattr(args, "report", None)),
                     speculative=deployment.speculative)


def result_dict(deployment: Deployment, args: argparse.Namespace, metrics: dict[str, Any],
                result: SimResult, workload: Workload) -> tuple[dict[str, Any], str | None]:
    """The saved JSON: vllm bench serve's flat keys, then ``deployment`` and
    ``workload`` in full, and with ``--save-detailed`` the per-request lists;
    plus a note when a per-request list cannot be written."""
    run = describe_run(deployment, args, workload)
    lists, note = detailed_lists(workload.requests, result.records, result.failed)
    out: dict[str, Any] = {
        "backend": "kvsched-simulate",
        "model_id": deployment.model.name,
        "hardware": deployment.hardware.id,
        "tensor_parallel_size": deployment.parallel.tensor_parallel_size,
        "data_parallel_size": deployment.parallel.data_parallel_size,
        "num_gpus": num_gpus(deployment),
        "dataset_name": args.dataset_name,
        "num_prompts": len(result.records) + len(result.failed),
        "request_rate": args.request_rate if args.dataset_name == "random" else None,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "max_num_seqs": deployment.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": deployment.scheduler_config.max_num_batched_tokens,
        "num_gpu_blocks": deployment.cache_config.num_gpu_blocks,
        **metrics,
        "failed_reasons": failure_reasons(result.failed),
        **run,
        # One string per request, "" for success, as vllm bench serve's list:
        # kept without --save-detailed too, so no refusal goes unrecorded.
        "errors": lists["errors"],
    }
    if result.ranks:
        # Each DP rank's own engine figures (the flat ones above are rank 0's).
        out["ranks"] = [{"rank": i, "completed": len(r.records), "failed": len(r.failed),
                         **r.engine_stats()} for i, r in enumerate(result.ranks)]
    if args.save_detailed:
        out.update(lists)
        out["requests"] = [
            {"request_id": r.request_id, "send_time": r.send_time, "ttft": r.ttft,
             "e2el": r.e2el, "input_len": r.num_prompt_tokens, "output_len": r.num_output_tokens}
            for r in result.records]
        out["failed_requests"] = [{"request_id": rid, "error": why} for rid, why in result.failed]
    return out, note if args.save_detailed else None


def save_result(path: str, deployment: Deployment, args: argparse.Namespace,
                metrics: dict[str, Any], result: SimResult, workload: Workload) -> str | None:
    """Write :func:`result_dict` to ``path``; returns its note, if any."""
    out, note = result_dict(deployment, args, metrics, result, workload)
    with open(path, "w") as f:
        json.dump(json_safe(out), f, indent=2, allow_nan=False)
        f.write("\n")
    return note


def format_table(m: dict[str, Any], percentiles: tuple[float, ...], gpus: int = 1) -> str:
    """A summary in the shape of vllm bench serve's."""
    rows: list[tuple[str, str]] = []

    def add(label: str, key: str, fmt: str = "{:.2f}") -> None:
        if key in m and m[key] is not None:
            rows.append((label, fmt.format(m[key])))

    add("Successful requests:", "completed", "{}")
    add("Failed requests:", "failed", "{}")
    add("Benchmark duration (s):", "duration")
    add("Total input tokens:", "total_input_tokens", "{}")
    add("Total generated tokens:", "total_output_tokens", "{}")
    add("Request throughput (req/s):", "request_throughput")
    add("Request goodput (req/s):", "request_goodput")
    add("Output token throughput (tok/s):", "output_throughput")
    add("Total token throughput (tok/s):", "total_token_throughput")
    if gpus > 1:
        add(f"Output tok/s per GPU ({gpus} GPUs):", "output_throughput_per_gpu")
        add(f"Total tok/s per GPU ({gpus} GPUs):", "total_token_throughput_per_gpu")
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append((f"-- {title} --", ""))
        add(f"Mean {name.upper()} (ms):", f"mean_{name}_ms")
        add(f"Median {name.upper()} (ms):", f"median_{name}_ms")
        for p in percentiles:
            label = f"{p:g}"
            add(f"P{label} {name.upper()} (ms):", f"p{label}_{name}_ms")
    rows.append(("-- Engine (rank 0) --" if gpus > 1 else "-- Engine --", ""))
    add("Steps:", "num_steps", "{}")
    add("Mean batch size (requests):", "mean_batch_size")
    add("Mean tokens per step:", "mean_tokens_per_step")
    add("Prefill token share:", "prefill_token_share", "{:.1%}")
    add("Mean KV cache usage:", "mean_kv_cache_usage", "{:.1%}")
    add("Max KV cache usage:", "max_kv_cache_usage", "{:.1%}")
    add("Preemptions (all ranks):" if gpus > 1 else "Preemptions:", "num_preemptions", "{}")
    add("Prefix cache hit rate:", "prefix_cache_hit_rate", "{:.1%}")
    add("KV blocks (per rank):" if gpus > 1 else "KV blocks:", "num_gpu_blocks", "{}")
    if "spec_decode_num_drafts" in m:
        rows.append(("-- Speculative Decoding --", ""))
        add("Drafts:", "spec_decode_num_drafts", "{}")
        add("Draft tokens:", "spec_decode_num_draft_tokens", "{}")
        add("Accepted tokens:", "spec_decode_num_accepted_tokens", "{}")
        add("Draft acceptance rate:", "spec_decode_draft_acceptance_rate", "{:.1%}")
        add("Mean acceptance length:", "spec_decode_mean_acceptance_length")
        for i, rate in enumerate(m.get("spec_decode_acceptance_rate_per_position", ())):
            rows.append((f"Acceptance rate, position {i}:", f"{rate:.3f}"))
    add("Simulation wall time (s):", "simulation_wall_seconds")
    width = 50
    lines = ["{s:{c}^{n}}".format(s=" Simulated Serving Benchmark Result ", n=width, c="=")]
    for label, value in rows:
        if not value:
            lines.append("{s:{c}^{n}}".format(s=f" {label.strip('- ')} ", n=width, c="-"))
        else:
            lines.append(f"{label:<40}{value:>10}")
    lines.append("=" * width)
    return "\n".join(lines)
