"""kvsched against every real vLLM run of run_matrix.py (issue 21, item 5).

Reads only the recorded files under ``results/matrix/`` (no server runs).
For every run, ``kvsched`` simulates the same requests (each prompt's and
output's length as the bench recorded them, the prompts' shared prefixes as
``bench_client.py`` found them) sent at the same times (the bench's
``start_times``; a closed loop is replayed as a closed loop, as ``kvsched
calibrate`` replays one), on the server's flags (``--max-num-seqs``,
``--max-num-batched-tokens``, chunked prefill, prefix caching,
``--long-prefill-token-threshold``, the KV cache the server logged, the CPU
platform's 128-token blocks, vLLM's CPU platform's synchronous engine
loop), priced by:

- ``profiled``: the architecture's step profile (``../profiles/``), host
  terms those the profile measured of the serving path (none for a profile
  taken before it measured them: kvsched's own CPU time per step only);
- ``profiled-noserve``: the same profile without its serving-path terms
  (``profiles/noserve/``: the pricing before issue 34);
- ``profiled+cal``: the same with host terms ``kvsched calibrate`` fitted on
  the two noise-floor repeats of ``llama-base/poisson1`` (which are then
  not judged);
- ``roofline``: the roofline as shipped, with a hardware file for this CPU
  (``cpu-epyc-1core.yaml``: one core's FP32 rate as its 16-bit rate, half
  its memory bandwidth so 16-bit bytes take FP32's time);
- ``roofline+cal``: the same with host terms ``kvsched calibrate`` fitted on
  the same two repeats (what a user with no profile can do);
- ``logged`` and ``logged+host``: the mechanics alone: each simulated step
  priced with vLLM's own logged step of the same batch
  (:class:`kvsched.perf.logged.LoggedStepTimeModel`, nearest within 4 steps,
  else anywhere in the run's log), with kvsched's own host time, or with
  the host time read off the run's own timestamps (``host_read_off``; where
  the log can be attributed);
- ``profiled-earlier`` (the Llama only): the profile taken four hours
  before the runs (``../profiles/llama-tiny-f32-cpu.json``), a contrast;
- ``profiled+anchor`` and ``profiled+cal+anchor``: the profile re-anchored
  on the configuration's warm-up (``kvsched.calibrate.reanchor``: the
  warm-up's logged steps, tied to their batches by kvsched's scheduler,
  against the profile's prices; every profiled step time scaled by the
  median ratio), without and with the host terms. The warm-up runs right
  after the server starts, before the configuration's judged runs, and is
  never judged: what a user does by sending a short run before trusting a
  profile taken earlier on a shared machine.

Per run and in aggregate (median |error| over the judged runs): mean,
median and p99 TTFT, mean TPOT, median and p99 ITL, mean and p99 E2E,
output throughput (tokens over the span from the first send to the last
finish, both sides), beside the noise floor (three back-to-back repeats).
Per step (profiled): vLLM's iteration count against kvsched's, and how many
steps have the same batch at the same index.

    PYTHONPATH=. python benchmarks/real_vllm/judge_matrix.py [--calibrate]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import run_matrix as rm
from compare_steps import Attribution, RealRun, attribute_by_replay, compositions, measured_host_terms

from kvsched.calibrate.reanchor import measure_drift, read_iteration_log, reanchored
from kvsched.calibrate.run_files import parse_bench
from kvsched.calibrate.step_matching import IterationReplay
from kvsched.perf.host import HostTerms
from kvsched.perf.logged import LoggedStep, LoggedStepTimeModel
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.step_profile import load_profile, save_profile
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.run import build_group_deployment, serve, sim_config
from kvsched.sim.simulator import SimResult
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunOptions, RunSpec
from kvsched.sim.workload import Workload, WorkloadRequest

HERE = rm.HERE
# Each architecture's profile, taken right before its runs (run_all.sh).
PROFILES = {"llama": HERE / "profiles" / "llama-tiny-f32-cpu-matrix.json",
            "qwen3": HERE / "profiles" / "qwen3-tiny-f32-cpu-matrix.json"}
# The Llama's earlier profile (12:19 UTC, 4 hours before the runs), a contrast.
EARLIER_PROFILE = HERE / "profiles" / "llama-tiny-f32-cpu.json"
HARDWARE = HERE / "cpu-epyc-1core.yaml"
BLOCK_SIZE = 128              # vLLM's CPU platform default
OWN_TOKEN_BASE = 500_000      # each prompt's own tokens (below kvsched's reserved bases)
PERCENTILES = (50.0, 99.0)
LOGGED_WINDOW = 4             # logged steps either side a simulated step's batch is looked for
NOISE_CONFIG, NOISE_RUNS = "llama-base", ("poisson1", "poisson1_r2", "poisson1_r3")
CALIBRATION_RUNS = NOISE_RUNS[1:]
METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "p99_itl_ms",
           "mean_e2el_ms", "p99_e2el_ms", "output_throughput")
SHORT = {"mean_ttft_ms": "mean TTFT", "median_ttft_ms": "median TTFT", "p99_ttft_ms": "p99 TTFT",
         "mean_tpot_ms": "mean TPOT", "median_itl_ms": "median ITL", "p99_itl_ms": "p99 ITL",
         "mean_e2el_ms": "mean E2E", "p99_e2el_ms": "p99 E2E", "output_throughput": "throughput"}


@dataclasses.dataclass(frozen=True, slots=True)
class Matrix:
    """One matrix's directory (run_matrix.py --results) and the files judged with it."""

    results: Path

    def profile(self, arch: str) -> Path:
        """The architecture's profile: the matrix's own (``profiles/<arch>.json``,
        taken right before its runs) where it has one, else :data:`PROFILES`."""
        own = self.results / "profiles" / f"{arch}.json"
        return own if own.exists() else PROFILES[arch]

    def calibration(self, backend: str) -> Path:
        # Host terms are the machine's (API server, client, engine loop), fitted
        # once on the Llama's runs and used for both architectures.
        return self.results / ("calibration-llama.json" if backend == "profiled"
                               else f"calibration-{backend}-llama.json")


# ---------------------------------------------------------------------------
# The engine flags of a configuration


def flag_value(flags: Sequence[str], name: str) -> str | None:
    """The flag's value as vLLM's parser takes it: the last one given."""
    value = None
    for i, f in enumerate(flags):
        if f == name:
            value = flags[i + 1]
    return value


def engine_options(matrix: Matrix, config: rm.ServerConfig, server: dict[str, Any],
                   pricing: str) -> EngineOptions:
    """kvsched's engine arguments for ``config`` as served (and logged)."""
    flags = (*rm.COMMON_FLAGS, *config.flags)
    kv_tokens = server["kv_cache_tokens"]
    if kv_tokens is None or kv_tokens % BLOCK_SIZE:
        sys.exit(f"{config.name}: server.json kv_cache_tokens={kv_tokens!r}: not a whole number of blocks")
    common = dict(
        model=rm.MODELS[config.model][0],
        max_num_seqs=int(flag_value(flags, "--max-num-seqs") or 0) or None,
        max_num_batched_tokens=int(flag_value(flags, "--max-num-batched-tokens") or 0) or None,
        max_model_len=int(flag_value(flags, "--max-model-len") or 0) or None,
        enable_chunked_prefill="--no-enable-chunked-prefill" not in flags,
        enable_prefix_caching="--no-enable-prefix-caching" not in flags,
        long_prefill_token_threshold=int(flag_value(flags, "--long-prefill-token-threshold") or 0),
        # vLLM's "KV cache size: N tokens" counts every block, the null
        # block too, as kvsched's override does.
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=int(flag_value(flags, "--num-gpu-blocks-override")
                                    or kv_tokens // BLOCK_SIZE),
        async_scheduling=False,  # vLLM's CPU platform turns async scheduling off
        # The real server is vLLM 0.32 (CPU build): its scheduler is the one
        # kvsched models as 0.33, not the newest release kvsched defaults to.
        vllm_version="0.33")
    if pricing.startswith("roofline"):
        cal_path = matrix.calibration("roofline")
        return EngineOptions(**common, hardware=str(HARDWARE), step_time_backend="roofline",
                             calibration=str(cal_path) if pricing == "roofline+cal" else None)
    if pricing == "profiled-earlier":
        profile = EARLIER_PROFILE
    elif pricing == "profiled-noserve":
        profile = noserve_profile(matrix, config.model)
    elif pricing.endswith("+anchor"):
        profile = anchored_profile(matrix, config, server, EngineOptions(
            **common, step_time_backend="profiled", step_time_profile=str(matrix.profile(config.model))))
    else:
        profile = matrix.profile(config.model)
    cal = matrix.calibration("profiled")
    return EngineOptions(**common, step_time_backend="profiled", step_time_profile=str(profile),
                         calibration=str(cal) if pricing.startswith("profiled+cal") else None)


def noserve_profile(matrix: Matrix, arch: str) -> Path:
    """The architecture's profile without its serving-path measurement (the
    profiled backend's pricing before issue 34), written once under
    ``profiles/noserve/``."""
    out = matrix.results / "profiles" / "noserve" / f"{arch}.json"
    if not out.exists():
        prof = load_profile(matrix.profile(arch))
        out.parent.mkdir(parents=True, exist_ok=True)
        save_profile(dataclasses.replace(prof, serving=None, requests=[],
                                         notes=[*prof.notes, "serving path dropped (judge_matrix.py)"]), out)
    return out


def replayed(options: EngineOptions, data: dict[str, Any], workload: Workload,
             logged: list[Any]) -> tuple[Any, RealRun, Attribution, IterationReplay]:
    """The deployment of ``options``, the recorded run, and its log tied to
    its requests by kvsched's own scheduler (``compare_steps.attribute_by_replay``;
    exits with why where it cannot)."""
    spec = RunSpec(DeploymentSpec((InstanceGroup(engine=options),)), options=RunOptions(fast_forward=False))
    deployment, _ = build_group_deployment(spec.deployment.group)
    starts = data["start_times"]
    run = RealRun(list(data["input_lens"]), list(data["output_lens"]), [t - starts[0] for t in starts], data,
                  logged)
    att, rep = attribute_by_replay(run, sim_config(deployment, spec), workload)
    return deployment, run, att, rep


def anchored_profile(matrix: Matrix, config: rm.ServerConfig, server: dict[str, Any],
                     options: EngineOptions) -> Path:
    """The architecture's profile re-anchored on ``config``'s warm-up
    (written once under ``profiles/anchored/``)."""
    out = matrix.results / "profiles" / "anchored" / f"{config.name}.json"
    if out.exists():
        return out
    warm = matrix.results / config.name / "warmup.json"
    data = json.loads(warm.read_text())
    prompts = json.loads(warm.with_suffix(".prompts.json").read_text())
    workload, _ = workload_of(data, prompts, str(warm.relative_to(HERE)))
    logged = read_log(warm.with_suffix(".server.log.gz"))
    deployment, _, _, rep = replayed(options, data, workload, logged)
    model = deployment.step_model
    assert isinstance(model, ProfiledStepTimeModel)
    drift = measure_drift(model, rep, logged)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_profile(reanchored(model.profile, drift, str(warm.relative_to(HERE))), out)
    print(f"{config.name}: profile re-anchored on its warm-up: x{drift.factor:.3f} over {drift.steps} steps "
          f"(prefill {drift.prefill_factor}, decode {drift.decode_factor})", flush=True)
    return out


# ---------------------------------------------------------------------------
# A recorded run


def read_log(path: Path) -> list[Any]:
    return read_iteration_log(str(path))


def truncated(runs: Sequence[tuple[int, int]], n: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for token, count in runs:
        if n <= 0:
            break
        out.append((token, min(count, n)))
        n -= count
    return out


def workload_of(data: dict[str, Any], prompts: dict[str, Any],
                source: str) -> tuple[Workload, dict[str, Any]]:
    """The run's requests as kvsched sends them, with their shared prefixes."""
    run = parse_bench(data, source)
    n = len(run.input_lens)
    if run.failed or n != len(prompts["prompt_lens"]):
        sys.exit(f"{source}: {run.failed} failed requests, {n} completed of {len(prompts['prompt_lens'])} "
                 "prompts; the replay needs every request")
    mismatched = sum(a != b for a, b in zip(run.input_lens, prompts["prompt_lens"]))
    runs: list[list[tuple[int, int]]] = []
    shared_tokens = 0
    for i, (length, (j, common)) in enumerate(zip(run.input_lens, prompts["shared_with"])):
        # Below a block nothing is shared in the cache; the last prompt
        # token is always computed (vLLM never hits a whole prompt).
        common = min(common, length, run.input_lens[j] if j >= 0 else 0)
        head = truncated(runs[j], common) if j >= 0 and common >= BLOCK_SIZE else []
        own = length - sum(c for _, c in head)
        runs.append(head + ([(OWN_TOKEN_BASE + i, own)] if own else []))
        shared_tokens += length - own
    requests = tuple(WorkloadRequest(f"r{i}", t, tuple(r), o)
                     for i, (t, r, o) in enumerate(zip(run.arrivals, runs, run.output_lens)))
    info = {"requests": n, "arrivals": run.arrivals_note, "prompt_len_mismatches": mismatched,
            "shared_prefix_tokens": shared_tokens}
    return Workload(source, requests, run.max_concurrency), info


def real_metrics(data: dict[str, Any]) -> dict[str, float]:
    out = {k: float(data[k]) for k in METRICS if k not in ("mean_e2el_ms", "p99_e2el_ms",
                                                           "output_throughput")}
    lat = np.asarray(data["latencies"])
    starts = np.asarray(data["start_times"])
    out["mean_e2el_ms"] = float(lat.mean() * 1e3)
    out["p99_e2el_ms"] = float(np.percentile(lat * 1e3, 99))
    out["output_throughput"] = float(sum(data["output_lens"]) / ((starts + lat).max() - starts.min()))
    return out


def sim_metrics(result: SimResult) -> dict[str, float]:
    m = result.metrics(PERCENTILES)
    out = {k: float(m[k]) for k in METRICS if k != "output_throughput"}
    r = result.records
    span = max(r.finish_time) - min(r.send_time)
    out["output_throughput"] = float(sum(r.num_output_tokens) / span)
    out["num_preemptions"] = float(m["num_preemptions"])
    out["prefix_cache_hit_rate"] = float(m["prefix_cache_hit_rate"])
    return out


def simulate(options: EngineOptions, workload: Workload, logged: Sequence[LoggedStep] = (),
             host: HostTerms | None = None, source: str = "") -> tuple[SimResult, list[dict[str, Any]]]:
    """kvsched's run of ``workload``: its result and step trace; with
    ``logged`` steps, each step priced with vLLM's logged step of the same
    batch (the mechanics alone)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = Path(tmp) / "steps.jsonl"
        spec = RunSpec(DeploymentSpec((InstanceGroup(engine=options),)),
                       options=RunOptions(fast_forward=False, percentiles=PERCENTILES,
                                          trace_steps=str(trace_path)))
        deployment, _ = build_group_deployment(spec.deployment.group)
        if logged:
            d = deployment
            model = LoggedStepTimeModel(d.model, d.hardware, d.parallel, d.runtime, logged, source=source,
                                        host=host, window=LOGGED_WINDOW)
            deployment = dataclasses.replace(deployment, step_model=model)
        config = sim_config(deployment, spec)
        result = serve(deployment, spec.deployment.group, workload, config, spec.options)
        trace = [json.loads(line) for line in trace_path.read_text().splitlines()]
    return result, trace


def host_read_off(matrix: Matrix, data: dict[str, Any], logged: list[Any], config: rm.ServerConfig,
                  server: dict[str, Any], workload: Workload) -> tuple[HostTerms | None, Any]:
    """The host time around vLLM's iteration clock read off the run's own
    timestamps (``compare_steps.measured_host_terms``: the client's gaps
    between back-to-back steps less their logged times; the delay from send
    to engine at an idle engine), with the log tied to the requests by
    kvsched's own scheduler (``compare_steps.attribute_by_replay``); None
    and why where it cannot be."""
    starts = data["start_times"]
    if any(b < a for a, b in itertools.pairwise(starts)):
        return None, "start_times not in send order"
    try:
        deployment, run, att, rep = replayed(engine_options(matrix, config, server, "roofline"), data,
                                             workload, logged)
        runtime = deployment.runtime
        terms, info = measured_host_terms(run, att, runtime.cpu_step_s, runtime.cpu_per_request_s)
        info["replay"] = {"steps_explained": len(rep.steps), "restarts": rep.restarts}
        return terms, info
    except SystemExit as e:  # compare_steps says why it cannot attribute the log
        return None, str(e)
    except (ValueError, TypeError, np.linalg.LinAlgError) as e:
        return None, f"{type(e).__name__}: {e}"


def judge_run(matrix: Matrix, config: rm.ServerConfig, server: dict[str, Any], path: Path,
              pricings: Sequence[str]) -> dict[str, Any]:
    data = json.loads(path.read_text())
    prompts = json.loads(path.with_suffix(".prompts.json").read_text())
    workload, info = workload_of(data, prompts, str(path.relative_to(HERE)))
    real = real_metrics(data)
    logged = read_log(path.with_suffix(".server.log.gz"))
    counters = data.get("run_matrix", {}).get("server_counters", {})
    out: dict[str, Any] = {"config": config.name, "run": path.stem, "workload": info, "real": real,
                           "real_counters": counters,
                           "real_steps": len(logged),
                           "real_mean_step_ms": statistics.fmean(it.elapsed_ms for it in logged) if logged
                           else None}
    real_comp = [(it.context_requests, it.context_tokens, it.generation_requests, it.generation_tokens)
                 for it in logged]
    prompt_lens = {r.request_id: r.num_prompt_tokens for r in workload.requests}
    steps = [LoggedStep(c[1] + c[3], c[0] + c[2], it.elapsed_ms / 1e3) for c, it in zip(real_comp, logged)]
    # Steps a replay runs past the log (its steps diverged) are priced at
    # the log's median, as compare_steps.py does.
    if steps:
        steps += [LoggedStep(1, 1, statistics.median(x.elapsed_s for x in steps))] * len(steps)
    for pricing in pricings:
        if pricing.startswith("logged"):
            if not steps:
                continue
            host = None
            if pricing == "logged+host":
                host, note = host_read_off(matrix, data, logged, config, server, workload)
                out["host_read_off_the_run"] = note
                if host is None:
                    continue
            # The deployment the logged steps replace the pricing of (its
            # CPU time per step is kvsched's, as for every backend).
            options = engine_options(matrix, config, server, "roofline")
            result, trace = simulate(options, workload, steps, host,
                                     str(path.with_suffix(".server.log.gz").relative_to(HERE)))
        else:
            result, trace = simulate(engine_options(matrix, config, server, pricing), workload)
        sim = sim_metrics(result)
        errors = {k: 100 * (sim[k] / real[k] - 1) for k in METRICS}
        entry: dict[str, Any] = {"metrics": sim, "error_pct": errors}
        comp = compositions(trace, prompt_lens)
        same = sum(a == b for a, b in zip(real_comp, comp))
        # Step time where the batch is vLLM's at the same index (kvsched's
        # step duration holds its CPU time per step too: ~0.5 ms).
        ratios = [t["duration"] / (it.elapsed_ms / 1e3) - 1
                  for t, it, a, b in zip(trace, logged, real_comp, comp) if a == b and it.elapsed_ms > 0]
        entry["step_time"] = {
            "same_batch_steps": len(ratios),
            "median_signed_pct": 100 * statistics.median(ratios) if ratios else None,
            "median_abs_pct": 100 * statistics.median(map(abs, ratios)) if ratios else None,
            "median_step_ms_real_sim": [statistics.median(it.elapsed_ms for it in logged) if logged else None,
                                        1e3 * statistics.median(t["duration"] for t in trace)]}
        entry["steps"] = {"sim": len(comp), "same_batch_same_index": same,
                          "first_divergence": next((i for i, (a, b) in enumerate(zip(real_comp, comp))
                                                    if a != b), None)}
        out[pricing] = entry
    return out


# ---------------------------------------------------------------------------
# Calibration, noise, aggregate


def calibrate(matrix: Matrix, config: rm.ServerConfig, server: dict[str, Any], backend: str) -> None:
    """``kvsched calibrate`` (``backend``: profiled or roofline) on the two noise repeats."""
    o = engine_options(matrix, config, server, backend)
    out = matrix.calibration(backend)
    pricing = (["--step-time-profile", str(o.step_time_profile)] if backend == "profiled"
               else ["--hardware", str(o.hardware), "--step-time-backend", "roofline"])
    cmd = [sys.executable, "-m", "kvsched.cli", "calibrate", "--model", o.model, *pricing,
           "--max-num-seqs", str(o.max_num_seqs), "--max-num-batched-tokens",
           str(o.max_num_batched_tokens), "--max-model-len", str(o.max_model_len), "--block-size",
           str(BLOCK_SIZE), "--num-gpu-blocks-override", str(o.num_gpu_blocks_override),
           "--no-async-scheduling", "--max-iterations", "40", "-o", str(out)]
    for run in CALIBRATION_RUNS:
        cmd += ["--bench", str(matrix.results / config.name / f"{run}.json")]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def spread(values: Sequence[float]) -> float:
    """(max - min) / mean, in %."""
    return 100 * (max(values) - min(values)) / statistics.fmean(values)


def noise_floor(matrix: Matrix, config: str = NOISE_CONFIG) -> dict[str, Any] | None:
    paths = [matrix.results / config / f"{r}.json" for r in NOISE_RUNS]
    if not all(p.exists() for p in paths):
        return None
    ms = [real_metrics(json.loads(p.read_text())) for p in paths]
    return {"runs": [str(p.relative_to(HERE)) for p in paths],
            "values": {k: [round(m[k], 2) for m in ms] for k in METRICS},
            "spread_pct": {k: spread([m[k] for m in ms]) for k in METRICS}}


def aggregate(judged: list[dict[str, Any]], pricings: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pricing in pricings:
        rows = [j[pricing]["error_pct"] for j in judged if pricing in j]
        if not rows:
            continue
        out[pricing] = {"runs": len(rows),
                        "median_abs_pct": {k: statistics.median(abs(r[k]) for r in rows) for k in METRICS},
                        "median_signed_pct": {k: statistics.median(r[k] for r in rows) for k in METRICS}}
    return out


# Issue 21's bars on the median |error| over the judged runs, or twice the
# measured spread of repeated runs where that is larger.
BARS = {"mean_tpot_ms": 5.0, "mean_ttft_ms": 10.0, "p99_ttft_ms": 15.0}


def acceptance(report: dict[str, Any]) -> dict[str, Any]:
    noise = report["noise_floor"]
    out: dict[str, Any] = {}
    for pricing, agg in report["aggregate"].items():
        rows = {}
        for k, bar in BARS.items():
            floor = 2 * noise["spread_pct"][k] if noise else 0.0
            limit = max(bar, floor)
            rows[k] = {"median_abs_pct": agg["median_abs_pct"][k], "bar_pct": limit,
                       "met": agg["median_abs_pct"][k] <= limit}
        out[pricing] = rows
    return out


def markdown(report: dict[str, Any], pricings: Sequence[str]) -> str:
    lines = ["| pricing | runs | " + " | ".join(SHORT[k] for k in METRICS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in METRICS) + " |"]
    for pricing, agg in report["aggregate"].items():
        lines.append(f"| {pricing} median abs | {agg['runs']} | "
                     + " | ".join(f"{agg['median_abs_pct'][k]:.1f} %" for k in METRICS) + " |")
        lines.append(f"| {pricing} median signed | | "
                     + " | ".join(f"{agg['median_signed_pct'][k]:+.1f} %" for k in METRICS) + " |")
    for key, label in (("noise_floor", "pinned"), ("noise_floor_repeat", "pinned, later"),
                       ("noise_floor_unpinned", "unpinned")):
        if report[key]:
            sp = report[key]["spread_pct"]
            lines.append(f"| noise floor, {label} (3 repeats: max-min / mean) | 3 | "
                         + " | ".join(f"{sp[k]:.1f} %" for k in METRICS) + " |")
    lines += ["", "Issue 21's bars (median |error|; or twice the noise floor's spread where larger):", "",
              "| pricing | " + " | ".join(SHORT[k] for k in BARS) + " |",
              "| --- | " + " | ".join("---" for _ in BARS) + " |"]
    for pricing, rows in report["acceptance"].items():
        lines.append(f"| {pricing} | " + " | ".join(
            f"{r['median_abs_pct']:.1f} % vs {r['bar_pct']:.1f} %: {'met' if r['met'] else 'not met'}"
            for r in rows.values()) + " |")
    lines += ["", "Per run (errors of the " + pricings[0] + " pricing; real values in ms, tok/s):", "",
              "| run | steps real / sim / same | step time, same batches | preemptions real / sim | "
              "prefix hits real / sim | " + " | ".join(SHORT[k] for k in METRICS) + " |",
              "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in METRICS) + " |"]
    for j in report["runs"]:
        e = j.get(pricings[0])
        if e is None:
            continue
        st = e["steps"]
        cells = [f"{j['real'][k]:.1f} ({e['error_pct'][k]:+.1f} %)" for k in METRICS]
        mark = "" if j["judged"] else " (calibration)"
        c = j["real_counters"]
        queries = c.get("prefix_cache_queries_total", 0.0)
        real_hits = f"{100 * c['prefix_cache_hits_total'] / queries:.0f} %" if queries else "?"
        real_pre = f"{c['num_preemptions_total']:.0f}" if c else "?"
        m = e["metrics"]
        sig = e["step_time"]["median_signed_pct"]
        step_err = "" if sig is None else f"{sig:+.1f} % (abs {e['step_time']['median_abs_pct']:.1f} %)"
        lines.append(f"| {j['config']}/{j['run']}{mark} | {j['real_steps']} / {st['sim']} / "
                     f"{st['same_batch_same_index']} | {step_err} | "
                     f"{real_pre} / {m['num_preemptions']:.0f} | "
                     f"{real_hits} / {100 * m['prefix_cache_hit_rate']:.0f} % | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calibrate", action="store_true",
                   help="(re)fit the host terms on the noise repeats first (kvsched calibrate)")
    p.add_argument("--pricings", default="profiled,profiled+cal,profiled+anchor,profiled+cal+anchor,roofline,"
                                         "roofline+cal,logged,logged+host,profiled-earlier")
    p.add_argument("--results", type=Path, default=rm.RESULTS,
                   help="the matrix's directory (run_matrix.py --results)")
    p.add_argument("--output", type=Path, help="default: judged.json in the matrix's directory")
    args = p.parse_args(argv)
    matrix = Matrix(args.results.resolve())
    output: Path = args.output or matrix.results / "judged.json"
    configs = {c.name: c for c in rm.CONFIGS}
    servers = {}
    for name in configs:
        meta = matrix.results / name / "server.json"
        if meta.exists():
            servers[name] = json.loads(meta.read_text())
    if args.calibrate:
        for backend in ("profiled", "roofline"):
            calibrate(matrix, configs[NOISE_CONFIG], servers[NOISE_CONFIG], backend)
    wanted = args.pricings.split(",")
    report: dict[str, Any] = {"runs": []}
    for name, server in servers.items():
        config = configs[name]
        for path in sorted((matrix.results / name).glob("*.json")):
            if path.name in ("server.json",) or path.name.endswith(".prompts.json") or path.stem == "warmup":
                continue
            pricings = [x for x in wanted if not x.endswith("+cal")
                        or matrix.calibration(x.split("+")[0]).exists()]
            have_profile = matrix.profile(config.model).exists()
            pricings = [x for x in pricings if not x.startswith("profiled") or have_profile]
            pricings = [x for x in pricings if x != "profiled-earlier" or config.model == "llama"]
            j = judge_run(matrix, config, server, path, pricings)
            j["judged"] = not (name == NOISE_CONFIG and path.stem in CALIBRATION_RUNS)
            report["runs"].append(j)
            e = j.get(pricings[0], {}).get("error_pct", {})
            print(f"{name}/{path.stem}: " + ", ".join(f"{SHORT[k]} {e[k]:+.1f} %" for k in METRICS if k in e),
                  flush=True)
    judged = [j for j in report["runs"] if j["judged"]]
    report["aggregate"] = aggregate(judged, wanted)
    report["noise_floor"] = noise_floor(matrix)
    report["noise_floor_repeat"] = noise_floor(matrix, "llama-base-repeat")
    report["noise_floor_unpinned"] = noise_floor(matrix, "llama-base-nopin")
    report["acceptance"] = acceptance(report)
    output.write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report, wanted)
    output.with_suffix(".md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
