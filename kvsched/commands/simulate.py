"""``kvsched simulate``: flags named as vLLM's engine arguments and as
``vllm bench serve``'s; results with vllm bench's JSON keys."""

from __future__ import annotations

import argparse
import math
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError
from kvsched.files import read_text
from kvsched.jsonfile import json_problem, strict_loads
from kvsched.sim.flags import (
    add_engine_arguments,
    add_output_arguments,
    add_paste_arguments,
    add_workload_arguments,
    result_file_from_args,
    spec_argv,
    spec_from_args,
    with_pasted,
)
from kvsched.sim.pricing import pricing_of
from kvsched.sim.refusals import format_failures
from kvsched.sim.results import ResultFile, describe_run, detailed_lists, num_gpus, write_result
from kvsched.sim.run import PreparedRun, RunResult, prepare, run_prepared
from kvsched.sim.simulator import stderr_progress
from kvsched.sim.spec import RunSpec, WorkloadSpec, spec_from_json, spec_to_json
from kvsched.sim.ttft_parts import PART_NAMES
from kvsched.sim.workload import Workload


def add_simulate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "simulate", help="simulate a vLLM deployment serving a workload, without the GPUs",
        description="Drive kvsched's exact vLLM scheduler in virtual time with a performance "
                    "model: throughput and TTFT/TPOT/ITL/latency for a model, hardware, "
                    "parallelism, scheduler settings and traffic.")
    add_engine_arguments(p)
    add_workload_arguments(p)
    add_output_arguments(p, result_files=True)
    add_paste_arguments(p)
    p.add_argument("--run-spec", metavar="FILE.json",
                   help="run the deployment and workload of a saved run spec (a --save-result file's "
                        "'run_spec', or a spec of its own; format in docs/simulator.md) instead of "
                        "engine and workload flags")
    p.set_defaults(func=run_simulate)


# A run spec file: a bound on its size (a spec is a few kilobytes; a
# --save-result file with --save-detailed lists may be large).
MAX_RUN_SPEC_BYTES = 512 * 2**20


def read_run_spec(path: str) -> RunSpec:
    """The spec in ``path``: a file of :func:`spec_to_json`'s form, or a
    ``--save-result`` file holding one under ``run_spec``."""
    text = read_text(path, MAX_RUN_SPEC_BYTES, "a run spec (JSON)",
                     fix="give a --save-result file or a spec of its own")
    try:
        data = strict_loads(text, constants=False)
    except ValueError as e:
        raise UserInputError(f"--run-spec={path}: {json_problem(e)}") from None
    if isinstance(data, dict) and "run_spec" in data:
        data = data["run_spec"]
    return spec_from_json(data, f"--run-spec={path}")


def spec_of(args: argparse.Namespace) -> RunSpec:
    """The run spec of a simulate command line: the flags', or --run-spec's
    deployment and workload with the output flags' options."""
    flags = spec_from_args(args)
    if args.run_spec is None:
        return flags
    given = spec_argv(RunSpec(flags.deployment, flags.workload))
    if given:
        raise UserInputError(f"--run-spec={args.run_spec}: sets the deployment and workload; drop the "
                             f"engine and workload flags given with it ({' '.join(given[:6])})")
    saved = read_run_spec(args.run_spec)
    return RunSpec(saved.deployment, saved.workload, flags.options)


def describe_workload(args: WorkloadSpec, workload: Workload) -> str:
    """The workload in one phrase (``args`` resolved)."""
    n = len(workload.requests)
    conc = f", max concurrency {workload.max_concurrency}" if workload.max_concurrency else ""
    if workload.request_timeout is not None:
        conc += f", request timeout {workload.request_timeout:g} s"
    scale = f", arrival times x{args.time_scale:g} (--time-scale)" if args.time_scale != 1.0 else ""
    if args.dataset_name in ("random", "random-mm"):
        assert args.request_rate is not None
        rate = "all at t=0" if math.isinf(args.request_rate) else f"{args.request_rate:g} req/s"
        images = (f", {sum(len(r.mm_items) for r in workload.requests)} images"
                  if args.dataset_name == "random-mm" else "")
        return (f"{n} {args.dataset_name} prompts ({args.random_input_len} in / "
                f"{args.random_output_len} out{images}"
                f"{f', range ratio {args.random_range_ratio:g}' if args.random_range_ratio else ''}"
                f"{f', shared prefix {args.random_prefix_len}' if args.random_prefix_len else ''}"
                f", {rate}{scale}{conc})")
    paced = (f" at {args.request_rate:g} req/s (--request-rate)" if args.request_rate is not None
             and not math.isinf(args.request_rate) else "")
    return (f"{n} requests of {args.dataset_path or args.dataset_name}{paced} over "
            f"{workload.last_arrival_time:,.0f} s{scale}{conc}")


OUTPUT_FLAGS = (("--save-result", "save_result"), ("--report", "report"),
                ("--trace-steps", "trace_steps"))


def check_output_path(flag: str, path: str) -> None:
    """Raise ValueError, before any simulating, if ``path`` cannot be written."""
    p = Path(path)
    if path == "" or p.is_dir():
        raise UserInputError(f"{flag}={path!r}: is a folder; give a file name in it")
    folder = p.parent
    if not folder.exists():
        raise UserInputError(f"{flag}={path}: folder {folder} does not exist; create it or choose "
                         "another path")
    if not folder.is_dir():
        raise UserInputError(f"{flag}={path}: {folder} is not a folder; choose another path")
    writable = os.access(p, os.W_OK) if p.exists() else os.access(folder, os.W_OK | os.X_OK)
    if not writable:
        raise UserInputError(f"{flag}={path}: not writable (permission denied); choose another path")


def check_output_paths(args: argparse.Namespace) -> None:
    for flag, dest in OUTPUT_FLAGS:
        path = getattr(args, dest, None)
        # --save-result without a name, or inside --result-dir: named and made when saved.
        named_later = dest == "save_result" and (path == "" or getattr(args, "result_dir", None))
        if path is not None and not named_later:
            check_output_path(flag, path)
    if args.save_detailed and args.save_result is None and not getattr(args, "append_result", False):
        raise UserInputError("--save-detailed: adds per-request lists to --save-result's file; "
                         "give --save-result too")


def run_simulate(args: argparse.Namespace) -> int:
    args, pasted = with_pasted(args)
    check_output_paths(args)
    for line in pasted.report():
        print(f"kvsched: {line}", file=sys.stderr, flush=True)
    prepared = prepare(spec_of(args))
    spec, deployment, workload = prepared.spec, prepared.deployment, prepared.workload
    for remark in prepared.notes:
        print(f"kvsched: note: {remark}", file=sys.stderr, flush=True)
    print(f"Simulating {describe_deployment(prepared)}; "
          f"serving {describe_workload(spec.workload, workload)}.",
          flush=True)
    progress = None if args.no_progress or not sys.stderr.isatty() else stderr_progress
    done = run_prepared(prepared, progress)
    prefill = prepared.prefill_deployment
    gpus = num_gpus(deployment) + (num_gpus(prefill) if prefill is not None else 0)
    print(format_table(done.metrics, spec.options.percentiles, gpus, deployment.parallel.data_parallel_size))
    priced = pricing_of(deployment)
    print(f"Steps priced by: {priced.label}: {priced.detail}")
    past = sorted(deployment.step_model.extrapolated)
    if past:
        # Steps the backend's data did not cover were priced anyway: say so
        # once, with the first few (the measured backend lists every cell).
        shown = "; ".join(past[:EXTRAPOLATED_SHOWN])
        more = f"; and {len(past) - EXTRAPOLATED_SHOWN} more" if len(past) > EXTRAPOLATED_SHOWN else ""
        print(f"kvsched: warning: {len(past)} kind(s) of step priced past the backend's data "
              f"(all in --save-result's deployment.step_times.extrapolated): {shown}{more}",
              file=sys.stderr, flush=True)
    for line in format_failures(done.result.failed, len(workload.requests)):
        print(line)
    burst = burst_note(spec.workload, done.metrics)
    if burst:
        print(burst)
    target = result_file_from_args(args)
    if target.saves:
        w = spec.workload
        date = datetime.now().strftime("%Y%m%d-%H%M%S")
        path = target.path(deployment.options.model, w.request_rate, w.max_concurrency, date)
        note = save_result(path, done, target, date)
        print(f"result: {path}")
        if note:
            print(f"kvsched: note: --save-detailed: {note}", file=sys.stderr)
    if args.report:
        from kvsched.report.simulate_page import write_report

        write_report(args.report, [("kvsched", done.result)], "kvsched simulate",
                     [deployment.describe(), describe_workload(spec.workload, workload)],
                     metrics=[done.metrics], descriptions=[describe_run(deployment, spec, workload)])
        print(f"report: {args.report}")
    return 0


# How many of the steps priced past the backend's data the warning names.
EXTRAPOLATED_SHOWN = 3

# A steady load a server sustains: this share of its throughput under a burst.
SUSTAINABLE_SHARE = 0.7


def describe_deployment(prepared: PreparedRun) -> str:
    """One line for the deployment; both roles of a disaggregated one."""
    prefill, decode = prepared.prefill_deployment, prepared.deployment
    if prefill is None:
        return decode.describe()
    x, y = prefill.parallel.data_parallel_size, decode.parallel.data_parallel_size
    return (f"{x}P{y}D disaggregated (NixlConnector, proxy routing {prepared.spec.deployment.router}): "
            f"prefill instances {prefill.describe()}; decode instances {decode.describe()}")


def burst_note(workload: WorkloadSpec, metrics: dict[str, Any]) -> str | None:
    """What a run of every request at t=0 shows, and the flag for a steady
    load: vllm bench serve's default --request-rate inf measures a burst,
    whose TTFTs are mostly queueing (None for any other workload)."""
    if workload.dataset_name != "random" or workload.request_rate != math.inf:
        return None
    if workload.max_concurrency is not None:
        return None
    throughput = float(metrics.get("request_throughput") or 0.0)
    suggest = f"{SUSTAINABLE_SHARE * throughput:.3g}" if throughput > 0 else "R"
    return (f"Note: all {metrics.get('completed', 0) + metrics.get('failed', 0)} requests arrived at "
            "t=0 (vllm bench serve's default --request-rate inf): a burst, so TTFT is mostly time "
            "queued behind earlier requests and the throughput is the server's peak. For a server under "
            f"a steady load add --request-rate (e.g. --request-rate {suggest}, "
            f"{SUSTAINABLE_SHARE:.0%} of the {throughput:.3g} req/s measured here) or "
            "--max-concurrency.")


def result_dict(done: RunResult) -> tuple[dict[str, Any], str | None]:
    """The saved JSON: vllm bench serve's flat keys, then ``deployment`` and
    ``workload`` in full (from the run's spec), and with ``--save-detailed``
    the per-request lists; plus a note when a per-request list cannot be
    written."""
    spec, deployment, workload = done.prepared.spec, done.prepared.deployment, done.prepared.workload
    result, metrics, args = done.result, done.metrics, spec.workload
    save_detailed = spec.options.keep_token_times
    run = describe_run(deployment, spec, workload)
    lists, note = detailed_lists(workload.requests, result.records, result.failed)
    out: dict[str, Any] = {
        "backend": "kvsched-simulate",
        "model_id": deployment.model.name,
        "hardware": deployment.hardware.id,
        "tensor_parallel_size": deployment.parallel.tensor_parallel_size,
        "pipeline_parallel_size": deployment.parallel.pipeline_parallel_size,
        "data_parallel_size": deployment.parallel.data_parallel_size,
        "num_gpus": num_gpus(deployment) + (num_gpus(done.prepared.prefill_deployment)
                                            if done.prepared.prefill_deployment is not None else 0),
        "disaggregation": (f"{done.prepared.prefill_deployment.parallel.data_parallel_size}P"
                           f"{deployment.parallel.data_parallel_size}D"
                           if done.prepared.prefill_deployment is not None else None),
        "dataset_name": args.dataset_name,
        "num_prompts": len(result.records) + len(result.failed),
        "request_rate": args.request_rate,
        "burstiness": args.burstiness,
        "max_concurrency": args.max_concurrency,
        "max_num_seqs": deployment.scheduler_config.max_num_seqs,
        "max_num_batched_tokens": deployment.scheduler_config.max_num_batched_tokens,
        "num_gpu_blocks": deployment.cache_config.num_gpu_blocks,
        **metrics,
        # Which step-time backend priced the run (and why, for a fallback).
        **pricing_of(deployment).to_json(),
        **run,
        # One string per request, "" for success, as vllm bench serve's list:
        # kept without --save-detailed too, so no refusal goes unrecorded.
        "errors": lists["errors"],
        # The whole run as kvsched took it: kvsched simulate --run-spec FILE repeats it.
        "run_spec": spec_to_json(spec),
    }
    if result.ranks:
        # Each DP rank's own engine figures (the flat ones above are rank 0's).
        out["ranks"] = [{"rank": i, "completed": len(r.records), "failed": len(r.failed),
                         **r.engine_stats()} for i, r in enumerate(result.ranks)]
    if save_detailed:
        out.update(lists)
        out["requests"] = [
            {"request_id": r.request_id, "send_time": r.send_time, "ttft": r.ttft,
             "e2el": r.e2el, "input_len": r.num_prompt_tokens, "output_len": r.num_output_tokens}
            for r in result.records]
        out["failed_requests"] = [{"request_id": rid, "error": why} for rid, why in result.failed]
    return out, note if save_detailed else None


def save_result(path: str, done: RunResult, target: ResultFile | None = None, date: str = "") -> str | None:
    """Write :func:`result_dict` to ``path`` (with ``target``'s date, label
    and metadata first, as vllm bench serve); returns its note, if any."""
    out, note = result_dict(done)
    if target is not None:
        spec = done.prepared.spec
        out = {**target.header(date, spec.workload.tokenizer or spec.engine.model), **out}
    write_result(path, out, target is not None and target.append_result)
    return note


def format_table(m: dict[str, Any], percentiles: tuple[float, ...], gpus: int = 1, ranks: int = 1) -> str:
    """A summary in the shape of vllm bench serve's (``gpus`` in all,
    ``ranks`` data-parallel engine cores: the engine figures are rank 0's
    only when there are several)."""
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
    parts = m.get("ttft_parts_ms") or {}
    if parts:
        rows.append(("-- TTFT split: mean / p99 (ms) --", ""))
        for key, stats in parts.items():
            name = PART_NAMES.get(key, (key,))[0]
            rows.append((f"{name[:1].upper()}{name[1:]}:", f"{stats['mean']:.2f} / {stats['p99']:.2f}"))
    rows.append(("-- Engine (rank 0) --" if ranks > 1 else "-- Engine --", ""))
    add("Steps:", "num_steps", "{}")
    add("Mean batch size (requests):", "mean_batch_size")
    add("Mean tokens per step:", "mean_tokens_per_step")
    add("Prefill token share:", "prefill_token_share", "{:.1%}")
    add("Mean KV cache usage:", "mean_kv_cache_usage", "{:.1%}")
    add("Max KV cache usage:", "max_kv_cache_usage", "{:.1%}")
    add("Preemptions (all ranks):" if ranks > 1 else "Preemptions:", "num_preemptions", "{}")
    add("Prefix cache hit rate:", "prefix_cache_hit_rate", "{:.1%}")
    add("KV blocks (per rank):" if ranks > 1 else "KV blocks:", "num_gpu_blocks", "{}")
    if "spec_decode_num_drafts" in m:
        rows.append(("-- Speculative Decoding --", ""))
        add("Drafts:", "spec_decode_num_drafts", "{}")
        add("Draft tokens:", "spec_decode_num_draft_tokens", "{}")
        add("Accepted tokens:", "spec_decode_num_accepted_tokens", "{}")
        add("Draft acceptance rate:", "spec_decode_draft_acceptance_rate", "{:.1%}")
        add("Mean acceptance length:", "spec_decode_mean_acceptance_length")
        for i, rate in enumerate(m.get("spec_decode_acceptance_rate_per_position", ())):
            rows.append((f"Acceptance rate, position {i}:", f"{rate:.3f}"))
    lora = m.get("lora")
    if lora:
        rows.append(("-- LoRA (all ranks) --" if ranks > 1 else "-- LoRA --", ""))
        rows.append(("Adapter loads from CPU:", f"{lora['loads_from_cpu']}"))
        rows.append(("Adapter loads from disk:", f"{lora['loads_from_disk']}"))
        rows.append(("Adapter load time (s):", f"{lora['load_seconds']:.3f}"))
        rows.append(("LoRA kernel time (s):", f"{lora['kernel_seconds']:.3f}"))
    kv = m.get("kv_transfer")
    if kv:
        rows.append(("-- KV transfer (prefill -> decode) --", ""))
        rows.append(("KV reads:", f"{kv['count']}"))
        rows.append(("KV read (GB, all ranks):", f"{kv['bytes'] / 1e9:.2f}"))
        for label, key in (("Mean KV read (ms):", "mean_ms"), ("P99 KV read (ms):", "p99_ms"),
                           ("Mean wait for a busy link (ms):", "mean_queued_ms")):
            if key in kv:
                rows.append((label, f"{kv[key]:.2f}"))
        rows.append(("Path:", "+".join(kv.get("paths", ()))))
        split = m.get("ttft_split_ms") or {}
        for label, key in (("TTFT: prefill leg (ms):", "prefill_leg_ms"),
                           ("TTFT: hop to decode (ms):", "hop_ms"),
                           ("TTFT: wait + KV read (ms):", "kv_wait_and_read_ms"),
                           ("TTFT: first decode step (ms):", "decode_first_step_ms")):
            if key in split:
                rows.append((label, f"{split[key]:.2f}"))
    for role, use in (m.get("role_utilisation") or {}).items():
        rows.append((f"-- Utilisation ({role}, {use['engine_cores']} engine cores) --", ""))
        rows.append(("Busy fraction:", f"{use['busy_fraction']:.1%}"))
        rows.append(("Mean batch size (requests):", f"{use['mean_batch_size']:.2f}"))
        rows.append(("Mean tokens per step:", f"{use['mean_tokens_per_step']:.2f}"))
        rows.append(("Mean / max KV cache usage:",
                     f"{use['mean_kv_cache_usage']:.1%} / {use['max_kv_cache_usage']:.1%}"))
    # Disaggregated: each role's CPU tier (the top-level figures are the decode role's).
    by_role = m.get("kv_offload_by_role") or {}
    sections = ([(f" ({role})", part["kv_offload"], part["prefix_cache_hit_rate_by_tier"])
                 for role, part in by_role.items()] if by_role
                else [("", m["kv_offload"], m.get("prefix_cache_hit_rate_by_tier") or {})]
                if m.get("kv_offload") else [])
    for suffix, off, tiers in sections:
        rows.append((f"-- KV offloading to CPU{suffix} --", ""))
        rows.append(("CPU KV blocks (all ranks):" if ranks > 1 or by_role else "CPU KV blocks:",
                     f"{off['num_cpu_blocks']}"))
        for label, key in (("Prefix hit rate, GPU:", "gpu"), ("Prefix hit rate, CPU:", "cpu"),
                           ("Prefix hit rate, total:", "total")):
            if key in tiers:
                rows.append((label, f"{tiers[key]:.1%}"))
        rows.append(("Stores / loads:", f"{off['stores']} / {off['loads']}"))
        rows.append(("Stored / loaded (GB, all ranks):",
                     f"{off['store_bytes'] / 1e9:.2f} / {off['load_bytes'] / 1e9:.2f}"))
        for label, key in (("Mean load (ms):", "mean_load_ms"), ("P99 load (ms):", "p99_load_ms"),
                           ("Mean store (ms):", "mean_store_ms")):
            if key in off:
                rows.append((label, f"{off[key]:.2f}"))
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
