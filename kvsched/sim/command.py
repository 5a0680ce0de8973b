"""``kvsched simulate``: flags named as vLLM's engine arguments and as
``vllm bench serve``'s; results with vllm bench's JSON keys."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from kvsched.sim.deployment import Deployment, EngineOptions, build_deployment
from kvsched.sim.metrics import parse_goodput
from kvsched.sim.simulator import SimConfig, SimResult, Simulator, stderr_progress
from kvsched.sim.workload import DATASET_NAMES, Workload, load_workload

if TYPE_CHECKING:
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
    g.add_argument("--efficiency-file", help="YAML/JSON file overriding efficiency factors")
    g.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size)
    g.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="engine cores, each with its own scheduler and KV cache")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="shard experts over TP x DP ranks (MoE ranks then step in lockstep)")
    g.add_argument("--dp-routing", choices=["vllm", "round-robin", "least-loaded"], default="vllm",
                   help="how arrivals pick a DP rank (vllm: lowest 4*waiting+running, stale stats)")
    g.add_argument("--dp-stats-interval", type=float, default=0.1,
                   help="seconds between the load stats the vllm router sees (default 0.1)")
    g.add_argument("--admission-policy", choices=["none", "balance", "adp-balance", "prefill-cadence"],
                   default="none", help="admission policy on every rank (see docs/simulator.md)")
    g.add_argument("--balance-threshold", choices=["full", "full-minus-one"], default="full",
                   help="balance: hold while any rank runs max_num_seqs (full) or one less")
    g.add_argument("--adp-timeout-iters", type=int, default=50)
    g.add_argument("--adp-batching-wait-iters", type=int, default=0)
    g.add_argument("--max-num-seqs", type=int, help="default: vLLM serve's for the hardware")
    g.add_argument("--max-num-batched-tokens", type=int,
                   help="default: vLLM serve's for the hardware")
    g.add_argument("--max-model-len", type=int, help="default: the model's context length")
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=d.enable_chunked_prefill)
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=d.enable_prefix_caching)
    g.add_argument("--block-size", type=int, default=d.block_size)
    g.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    g.add_argument("--long-prefill-token-threshold", type=int, default=d.long_prefill_token_threshold)
    g.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default=d.scheduling_policy)
    g.add_argument("--dtype", default=d.dtype, help="bf16 (default), fp16 or fp8 weights")
    g.add_argument("--kv-cache-dtype", default=d.kv_cache_dtype, help="auto (16 bits) or fp8")
    g.add_argument("--num-gpu-blocks-override", type=int)
    g.add_argument("--prefill-schedule-interval", type=int, default=d.prefill_schedule_interval,
                   help="admit prefill only every K engine steps (vLLM's prefill cadence)")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   default=d.async_scheduling,
                   help="overlap the scheduler's CPU work with the forward pass (vLLM's GPU default)")


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (vllm bench serve's arguments)")
    g.add_argument("--dataset-name", choices=DATASET_NAMES, default="random")
    g.add_argument("--dataset-path", help="trace file for azure, mooncake or jsonl")
    g.add_argument("--num-prompts", type=int,
                   help="prompts to send (random: default 1000; traces: default all)")
    g.add_argument("--random-input-len", type=int, default=1024)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--random-range-ratio", type=float, default=0.0)
    g.add_argument("--random-prefix-len", type=int, default=0)
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests/s for the random dataset (default inf: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0)
    g.add_argument("--max-concurrency", type=int)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="multiply arrival times (0.5 = twice the request rate)")
    g.add_argument("--duration", type=float, help="keep only requests arriving before this (s)")
    g.add_argument("--eos-probability", type=float, default=0.0,
                   help="per-token EOS probability; 0 (default) generates each request's output "
                        "length, as ignore_eos does")


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--save-result", metavar="FILE.json", help="results with vllm bench's keys")
    g.add_argument("--save-detailed", action="store_true",
                   help="with --save-result: also per-request records")
    g.add_argument("--report", metavar="FILE.html", help="a self-contained page with plots")
    g.add_argument("--trace-steps", metavar="FILE.jsonl",
                   help="the scheduler's step trace plus each step's start and duration "
                        "(steps every step: no fast-forward)")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    g.add_argument("--metric-percentiles", default="50,90,99")
    g.add_argument("--no-fast-forward", action="store_true",
                   help="step through pure-decode stretches one by one (same results, slower)")
    g.add_argument("--no-progress", action="store_true")


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
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching, block_size=args.block_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        scheduling_policy=args.scheduling_policy, dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype, num_gpu_blocks_override=args.num_gpu_blocks_override,
        async_scheduling=args.async_scheduling,
        prefill_schedule_interval=(args.prefill_schedule_interval
                                   if args.admission_policy != "prefill-cadence"
                                   else max(args.prefill_schedule_interval, 2)))


def build_workload(args: argparse.Namespace) -> Workload:
    if args.dataset_name == "random":
        workload = load_workload(
            "random", None, num_prompts=args.num_prompts or 1000, input_len=args.random_input_len,
            output_len=args.random_output_len, range_ratio=args.random_range_ratio,
            prefix_len=args.random_prefix_len, request_rate=args.request_rate,
            burstiness=args.burstiness, max_concurrency=args.max_concurrency, seed=args.seed)
    else:
        workload = load_workload(args.dataset_name, args.dataset_path,
                                 max_concurrency=args.max_concurrency)
    if args.time_scale != 1.0:
        workload = workload.scaled(args.time_scale)
    if args.dataset_name != "random" and (args.num_prompts or args.duration):
        workload = workload.truncated(num_requests=args.num_prompts, duration=args.duration)
    elif args.duration:
        workload = workload.truncated(duration=args.duration)
    return workload


def describe_workload(args: argparse.Namespace, workload: Workload) -> str:
    n = len(workload.requests)
    conc = f", max concurrency {workload.max_concurrency}" if workload.max_concurrency else ""
    if args.dataset_name == "random":
        rate = "all at t=0" if math.isinf(args.request_rate) else f"{args.request_rate:g} req/s"
        return (f"{n} random prompts ({args.random_input_len} in / {args.random_output_len} out"
                f"{f', range ratio {args.random_range_ratio:g}' if args.random_range_ratio else ''}"
                f"{f', shared prefix {args.random_prefix_len}' if args.random_prefix_len else ''}"
                f", {rate}{conc})")
    return f"{n} requests of {args.dataset_path} over {workload.last_arrival_time:,.0f} s{conc}"


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--metric-percentiles={text!r}: give numbers like 50,90,99") from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise ValueError(f"--metric-percentiles={text!r}: each must be in [0, 100]")
    return values


def run_simulate(args: argparse.Namespace) -> int:
    percentiles = parse_percentiles(args.metric_percentiles)
    slos = parse_goodput(args.goodput) if args.goodput else None
    deployment = build_deployment(engine_options(args))
    workload = build_workload(args)
    print(f"Simulating {deployment.describe()}; serving {describe_workload(args, workload)}.",
          flush=True)
    config = sim_config(deployment, args)
    progress = None if args.no_progress or not sys.stderr.isatty() else stderr_progress
    result = run_deployment(deployment, config, workload, args, progress)
    metrics = result.metrics(percentiles, slos)
    print(format_table(metrics, percentiles))
    for rid, why in result.failed[:5]:
        print(f"failed {rid}: {why}")
    if len(result.failed) > 5:
        print(f"... and {len(result.failed) - 5} more failed requests")
    if args.save_result:
        save_result(args.save_result, deployment, args, metrics, result)
    if args.report:
        from kvsched.sim.report import write_report

        write_report(args.report, [("kvsched", result)], "kvsched simulate",
                     [deployment.describe(), describe_workload(args, workload)], metrics=[metrics])
        print(f"report: {args.report}")
    return 0


def run_deployment(deployment: Deployment, config: SimConfig, workload: Workload,
                   args: argparse.Namespace, progress: Any = None) -> SimResult:
    """One engine, or data-parallel ranks with the chosen admission policy."""
    dp = deployment.parallel.data_parallel_size
    if dp == 1 and args.admission_policy in ("none", "prefill-cadence"):
        if args.trace_steps:
            with open(args.trace_steps, "w") as trace:
                return Simulator(config, workload, trace_steps=trace, progress=progress).run()
        return Simulator(config, workload, progress=progress).run()
    if args.trace_steps:
        raise ValueError("--trace-steps: not supported with data parallelism or DP policies yet")
    sim = build_dp_simulator(deployment, config, workload, args)
    return sim.run().combined()


def build_dp_simulator(deployment: Deployment, config: SimConfig, workload: Workload,
                       args: argparse.Namespace) -> DPSimulator:
    """Data-parallel ranks with the chosen admission policy, publishing their
    load to each other after every step (the policies' all-gather)."""
    from kvsched.core.policies import AdpBalance, BalanceGate, DPRankStates
    from kvsched.sim.dp import DPOptions, DPSimulator

    dp = deployment.parallel.data_parallel_size
    shared = DPRankStates(dp)
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
                        stats_interval=args.dp_stats_interval)
    sim = DPSimulator(config, workload, options, policies, shared)
    sim.after_step.append(lambda d: shared.publish_all([r.sched for r in d.ranks]))
    return sim


def sim_config(deployment: Deployment, args: argparse.Namespace) -> SimConfig:
    return SimConfig(deployment.scheduler_config, deployment.cache_config, deployment.step_model,
                     eos_probability=args.eos_probability, seed=args.seed,
                     fast_forward=not args.no_fast_forward,
                     prefill_schedule_interval=deployment.options.prefill_schedule_interval)


def save_result(path: str, deployment: Deployment, args: argparse.Namespace,
                metrics: dict[str, Any], result: SimResult) -> None:
    out: dict[str, Any] = {
        "backend": "kvsched-simulate",
        "model_id": deployment.model.name,
        "hardware": deployment.hardware.id,
        "tensor_parallel_size": deployment.parallel.tensor_parallel_size,
        "dataset_name": args.dataset_name,
        "num_prompts": len(result.records) + len(result.failed),
        "request_rate": args.request_rate if args.dataset_name == "random" else None,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "max_num_seqs": deployment.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": deployment.scheduler_config.max_num_batched_tokens,
        "num_gpu_blocks": deployment.cache_config.num_gpu_blocks,
        **metrics,
    }
    if args.save_detailed:
        out["requests"] = [
            {"request_id": r.request_id, "send_time": r.send_time, "ttft": r.ttft,
             "e2el": r.e2el, "input_len": r.num_prompt_tokens, "output_len": r.num_output_tokens}
            for r in result.records]
        out["failed_requests"] = [{"request_id": rid, "error": why} for rid, why in result.failed]
    with open(path, "w") as f:
        json.dump(out, f, indent=2, default=lambda v: None if isinstance(v, float) and
                  math.isinf(v) else v)
        f.write("\n")


def format_table(m: dict[str, Any], percentiles: tuple[float, ...]) -> str:
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
    for name, title in (("ttft", "Time to First Token"), ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        rows.append((f"-- {title} --", ""))
        add(f"Mean {name.upper()} (ms):", f"mean_{name}_ms")
        add(f"Median {name.upper()} (ms):", f"median_{name}_ms")
        for p in percentiles:
            label = f"{p:g}"
            add(f"P{label} {name.upper()} (ms):", f"p{label}_{name}_ms")
    rows.append(("-- Engine --", ""))
    add("Steps:", "num_steps", "{}")
    add("Mean batch size (requests):", "mean_batch_size")
    add("Mean tokens per step:", "mean_tokens_per_step")
    add("Prefill token share:", "prefill_token_share", "{:.1%}")
    add("Mean KV cache usage:", "mean_kv_cache_usage", "{:.1%}")
    add("Max KV cache usage:", "max_kv_cache_usage", "{:.1%}")
    add("Preemptions:", "num_preemptions", "{}")
    add("Prefix cache hit rate:", "prefix_cache_hit_rate", "{:.1%}")
    add("KV blocks:", "num_gpu_blocks", "{}")
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
