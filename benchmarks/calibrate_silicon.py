"""``kvsched calibrate`` on real vLLM runs: one deployment of silicon_sample.csv.

    python benchmarks/calibrate_silicon.py                  # Qwen3-32B, TP2 on H100 SXM
    python benchmarks/calibrate_silicon.py --out DIR        # keep the run files and calibration

aiconfigurator-core's ``systems/silicon_sample.csv`` holds real vLLM serving
runs as one row each: the deployment, ISL/OSL, the client's concurrency and
the measured mean TTFT and TPOT (no per-request times). This script takes the
rows of one deployment (by default Qwen/Qwen3-32B on 2 H100 SXM, six ISL/OSL
pairs at concurrencies 8 to 128), writes each as a summary-only ``vllm bench
serve`` result (``model_id``, ``request_rate: inf``, ``max_concurrency``,
the request lengths InferenceX's client drew, ``mean_ttft_ms``,
``mean_tpot_ms``; kvsched.validation.silicon says how the rows were run), and runs

    kvsched calibrate <the row's engine flags> --bench <fit rows> --held-out <other rows>

through the CLI: the fit sees the rows at concurrencies 8, 32 and 128, the
held-out error is on the rows at 16 and 64 it never saw. Each row is
replayed as its counted requests only: with prefix caching off, the warm-up
phase before them leaves the engine as it found it (kvsched.validation.silicon).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kvsched.cli import main as kvsched_main
from kvsched.sim.deployment import EngineOptions
from kvsched.validation.silicon import build_run_deployment
from kvsched.validation.silicon_rows import Refusal, ServingRun, inferencex_lengths, load_rows, map_row

FIT_CONCURRENCIES = (8, 32, 128)
HELD_OUT_CONCURRENCIES = (16, 64)


def rows_of(model: str, system: str, tp: int) -> list[ServingRun]:
    """The mapped rows of one deployment: those sharing the most common
    engine options (a row from another collection may set other flags)."""
    runs = []
    for row in load_rows():
        if row.model_path == model and row.system == system and row.tp_size == tp \
                and row.attention_dp_size == 1:
            run = map_row(row)
            if not isinstance(run, Refusal):
                runs.append(run)
    if not runs:
        raise SystemExit(f"no priced rows for {model} on {system} TP{tp}")
    common, _ = Counter(r.options for r in runs).most_common(1)[0]
    return sorted((r for r in runs if r.options == common),
                  key=lambda r: (r.row.isl, r.row.osl, r.concurrency))


def bench_file(run: ServingRun) -> dict[str, Any]:
    """The row as vllm bench serve's result without per-request times."""
    row = run.row
    inputs, outputs = inferencex_lengths(row.isl, row.osl, run.num_prompts)
    return {"backend": "vllm", "model_id": row.model_path, "num_prompts": run.num_prompts,
            "request_rate": "inf", "burstiness": 1.0, "max_concurrency": run.concurrency,
            "completed": run.num_prompts, "input_lens": inputs, "output_lens": outputs,
            "mean_ttft_ms": row.ttft_ms, "mean_tpot_ms": row.tpot_ms,
            "silicon_row_id": row.id, "silicon_data_source": row.source}


def engine_flags(options: EngineOptions) -> list[str]:
    """simulate's flags for ``options`` (those not at their defaults)."""
    default = EngineOptions()
    flags: list[str] = []
    for f in dataclasses.fields(EngineOptions):
        value = getattr(options, f.name)
        if value == getattr(default, f.name) or f.name == "step_time_backend":
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        else:
            flags += [flag, str(value)]
    return flags


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--model", default="Qwen/Qwen3-32B")
    ap.add_argument("--system", default="h100_sxm", help="aiconfigurator's system name")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--out", help="folder for the run files and calibration.json (default: a temp one)")
    ap.add_argument("--max-iterations", type=int, default=12)
    args = ap.parse_args()
    runs = rows_of(args.model, args.system, args.tp)
    built = build_run_deployment(runs[0], "measured")
    if isinstance(built, Refusal):
        raise SystemExit(f"the measured backend cannot price {args.model} on {args.system}: {built}")
    options = built[0].options
    folder = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="calibrate-silicon-"))
    folder.mkdir(parents=True, exist_ok=True)
    fit: list[str] = []
    held: list[str] = []
    for run in runs:
        row = run.row
        path = folder / f"isl{row.isl}-osl{row.osl}-conc{row.concurrency}.json"
        path.write_text(json.dumps(bench_file(run)) + "\n", encoding="utf-8")
        if row.concurrency in FIT_CONCURRENCIES:
            fit.append(str(path))
        elif row.concurrency in HELD_OUT_CONCURRENCIES:
            held.append(str(path))
    argv = ["calibrate", *engine_flags(options), "--max-iterations", str(args.max_iterations),
            "--output", str(folder / "calibration.json"), "--vllm-version",
            runs[0].row.backend_version or "unknown"]
    for p in fit:
        argv += ["--bench", p]
    for p in held:
        argv += ["--held-out", p]
    print(f"{len(fit)} rows to fit (concurrency {', '.join(map(str, FIT_CONCURRENCIES))}), {len(held)} "
          f"held out (concurrency {', '.join(map(str, HELD_OUT_CONCURRENCIES))}); files in {folder}")
    print("kvsched " + " ".join(a if " " not in a else repr(a) for a in argv), flush=True)
    t0 = time.perf_counter()
    code = kvsched_main(argv)
    print(f"calibrate took {time.perf_counter() - t0:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
