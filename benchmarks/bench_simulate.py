"""Simulator speed and memory.

    python benchmarks/bench_simulate.py                  # Azure conv trace (the README figure)
    python benchmarks/bench_simulate.py --compare        # ... also step by step, and check equality
    python benchmarks/bench_simulate.py --scale          # issue 9's bars: 1M requests, CPU per request
    python benchmarks/bench_simulate.py --hybrid         # a hybrid KV cache (gpt-oss-120b), ff on and off
    python benchmarks/bench_simulate.py --case random:100000:20   # one case
    python benchmarks/bench_simulate.py --step-time-backend measured --step-time-backend roofline
    python benchmarks/bench_simulate.py --async-ratio 3 --step-time-backend roofline
                                                         # async vs synchronous loop, same run
    python benchmarks/bench_simulate.py --model tests/perf/data/tiny_llama \
        --step-time-profile benchmarks/real_vllm/results/matrix-quiet/profiles/llama.json \
        --step-time-backend profiled --step-time-backend roofline
                                                         # a step profile's speed beside the roofline's

Cases (each runs in a fresh process, so its peak RSS is its own):

- ``azure``: the whole Azure LLM inference 2023 conversation trace (19,366
  requests, one hour) on Llama-3.1-8B on one H100 with ``vllm serve``'s
  defaults; wall seconds include loading the trace;
- ``random:N:RATE``: N random prompts (vllm bench's defaults, 1024 in / 128
  out) at RATE requests/s (``inf``: all at t=0), same deployment;
  ``random:N:RATE:IN:OUT`` with IN / OUT tokens.

``--hybrid`` times a hybrid KV cache: gpt-oss-120b (full attention beside a
128-token sliding window) on one H100, 2,000 random 1024 / 1024 prompts at
t=0, with fast-forward and without, and checks the metrics are identical.

Prints wall and CPU seconds, simulated requests per wall second, CPU
microseconds per simulated request and peak RSS.

``--async-ratio N`` times each case N times with vLLM's async engine loop and
N times with the synchronous one, alternating (so both see the same machine
load), and prints the ratio of their best wall (and CPU) seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvsched.sim.deployment import EngineOptions
from kvsched.sim.run import build_group_deployment, serve, sim_config
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunOptions, RunSpec
from kvsched.sim.workload import Workload, load_azure, random_workload
from kvsched.version import build

TRACE = Path(os.environ.get("KVSCHED_TRACES") or next(
    (p for p in (Path(__file__).resolve().parents[2] / "shared" / "traces", Path("/work/shared/traces"))
     if p.is_dir()), Path("../shared/traces")))


def _workload(case: str) -> Workload:
    if case == "azure":
        return load_azure(TRACE / "azure_llm_2023_conv.csv")
    if case.startswith("azure:"):  # the first N requests
        return load_azure(TRACE / "azure_llm_2023_conv.csv").truncated(int(case.split(":")[1]))
    parts = case.split(":")
    if parts[0] != "random" or len(parts) not in (3, 5):
        raise SystemExit(f"unknown case {case!r}: use azure, random:N:RATE or random:N:RATE:IN:OUT")
    lengths = {"input_len": int(parts[3]), "output_len": int(parts[4])} if len(parts) == 5 else {}
    return random_workload(num_prompts=int(parts[1]), request_rate=float(parts[2]), seed=0, **lengths)


def run_case(case: str, fast_forward: bool = True, backend: str = "auto",
             async_scheduling: bool = True, model: str = "Llama-3.1-8B",
             profile: str | None = None) -> dict[str, Any]:
    """One case in this process (wall and CPU include loading the kernel tables)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    workload = _workload(case)
    # Through kvsched's one runner: the spec's deployment, this case's workload.
    spec = RunSpec(DeploymentSpec((InstanceGroup(EngineOptions(
        model=model, hardware="h100-sxm", step_time_backend=backend,
        step_time_profile=profile if backend == "profiled" else None,
        async_scheduling=async_scheduling)),)), options=RunOptions(fast_forward=fast_forward))
    group = spec.deployment.group
    deployment, _ = build_group_deployment(group)
    result = serve(deployment, group, workload, sim_config(deployment, spec), spec.options)
    metrics = result.metrics()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    n = len(workload.requests)
    return {"case": case, "fast_forward": fast_forward, "backend": deployment.step_model.backend,
            "async_scheduling": async_scheduling, "build": build(),
            "requests": n, "wall_seconds": wall,
            "cpu_seconds": cpu, "requests_per_wall_second": n / wall,
            "cpu_us_per_request": cpu / n * 1e6,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "metrics": metrics}


def run_isolated(case: str, fast_forward: bool = True, backend: str = "auto",
                 async_scheduling: bool = True, model: str = "Llama-3.1-8B",
                 profile: str | None = None) -> dict[str, Any]:
    """One case in a fresh interpreter (its own peak RSS)."""
    cmd = ([sys.executable, __file__, "--child", case, "--step-time-backend", backend, "--model", model]
           + (["--step-time-profile", profile] if profile else [])
           + ([] if async_scheduling else ["--no-async-scheduling"])
           + ([] if fast_forward else ["--no-fast-forward"]))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.splitlines()[-1]))


def async_ratio(case: str, backend: str, repeats: int) -> list[dict[str, Any]]:
    """``repeats`` runs of ``case`` with the async engine loop and as many
    synchronous, alternating; prints the async/sync ratio of the best."""
    if repeats < 1:
        raise SystemExit(f"--async-ratio {repeats}: give a number of runs >= 1")
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for _ in range(repeats):
        for use_async in (True, False):
            r = run_isolated(case, backend=backend, async_scheduling=use_async)
            runs[use_async].append(r)
            show(r)
    best = {a: min(rs, key=lambda r: r["wall_seconds"]) for a, rs in runs.items()}
    cpu = {a: min(r["cpu_seconds"] for r in rs) for a, rs in runs.items()}
    print(f"{case} {backend}: async/sync wall {best[True]['wall_seconds'] / best[False]['wall_seconds']:.2f} "
          f"(best of {repeats}: {best[True]['wall_seconds']:.2f} s / {best[False]['wall_seconds']:.2f} s), "
          f"CPU {cpu[True] / cpu[False]:.2f} ({cpu[True]:.2f} s / {cpu[False]:.2f} s)", flush=True)
    return runs[True] + runs[False]


def show(r: dict[str, Any]) -> None:
    m = r["metrics"]
    loop = "async " if r["async_scheduling"] else "sync  "
    built = r.get("build", "interpreted")[:6]
    print(f"{r['case']:<22} {r['backend']:<8} {built} {loop}ff={'on ' if r['fast_forward'] else 'off'} "
          f"{r['requests']:>9,} requests: "
          f"{r['wall_seconds']:7.1f} s wall ({r['requests_per_wall_second']:7,.0f} req/s), "
          f"{r['cpu_us_per_request']:5.0f} µs CPU per request, peak RSS {r['peak_rss_mb']:6,.0f} MB  "
          f"(steps {m['num_steps']:,}, fast-forwarded {m['fast_forwarded_steps']:,}; "
          f"simulated {m['duration']:,.0f} s)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="store_true", help="also run without fast-forward")
    ap.add_argument("--scale", action="store_true",
                    help="1M random requests at 20 req/s and at t=0; CPU per request from 10k to 1M")
    ap.add_argument("--case", action="append",
                    help="azure, random:N:RATE or random:N:RATE:IN:OUT (repeatable)")
    ap.add_argument("--hybrid", action="store_true",
                    help="gpt-oss-120b's hybrid KV cache, 2000 random 1024/1024 prompts at t=0, "
                         "with and without fast-forward (implies --compare)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-fast-forward", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="Llama-3.1-8B", help="the model (default: %(default)s)")
    ap.add_argument("--step-time-profile", metavar="FILE",
                    help="the step profile the profiled backend prices from (the model must match it)")
    ap.add_argument("--step-time-backend", action="append",
                    choices=["auto", "measured", "roofline", "profiled"],
                    help="price steps with this backend (repeatable: each case runs with each; "
                         "default auto)")
    ap.add_argument("--no-async-scheduling", action="store_true",
                    help="the synchronous engine loop (default: vLLM's async loop, as on GPUs)")
    ap.add_argument("--async-ratio", type=int, metavar="N",
                    help="run each case N times async and N times synchronous, alternating, and "
                         "print the async/sync ratio of the best wall and CPU seconds")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    use_async = not args.no_async_scheduling
    if args.hybrid:
        args.model = "openai/gpt-oss-120b"
        args.case = ["random:2000:inf:1024:1024"]
        args.compare = True
    if args.child:
        r = run_case(args.child, not args.no_fast_forward, (args.step_time_backend or ["auto"])[0],
                     use_async, args.model, args.step_time_profile)
        print(json.dumps(r, default=lambda v: None if isinstance(v, float) and math.isinf(v) else str(v)))
        return 0
    cases = args.case or (["random:10000:20", "random:100000:20", "random:1000000:20",
                           "random:1000000:inf"] if args.scale else ["azure"])
    runs = []
    if args.async_ratio:
        for case, backend in [(c, b) for c in cases for b in args.step_time_backend or ["auto"]]:
            runs.extend(async_ratio(case, backend, args.async_ratio))
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=2, default=str) + "\n")
        return 0
    if "profiled" in (args.step_time_backend or []) and not args.step_time_profile:
        raise SystemExit("--step-time-backend profiled needs --step-time-profile FILE")
    for case, backend in [(c, b) for c in cases for b in args.step_time_backend or ["auto"]]:
        runs.append(run_isolated(case, backend=backend, async_scheduling=use_async, model=args.model,
                                 profile=args.step_time_profile))
        show(runs[-1])
        if args.compare:
            runs.append(run_isolated(case, fast_forward=False, backend=backend, async_scheduling=use_async,
                                     model=args.model, profile=args.step_time_profile))
            show(runs[-1])
            a, b = (dict(r["metrics"]) for r in runs[-2:])
            for key in ("simulation_wall_seconds", "fast_forwarded_steps"):
                a.pop(key)
                b.pop(key)
            print(f"identical metrics with and without fast-forward: {a == b}; "
                  f"speed-up {runs[-1]['wall_seconds'] / runs[-2]['wall_seconds']:.1f}x")
            if a != b:
                return 1
    if args.scale:
        rate20 = [r for r in runs if r["case"].endswith(":20")]
        if len(rate20) > 1:
            base = rate20[0]["cpu_us_per_request"]
            print("CPU per request vs 10k: " + ", ".join(
                f"{r['requests']:,}: {r['cpu_us_per_request'] / base - 1:+.0%}" for r in rate20))
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
