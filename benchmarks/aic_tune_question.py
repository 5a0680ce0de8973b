"""Put the issue-12 tuning question to AIConfigurator's CLI and summarise its answers.

AIConfigurator is not a kvsched dependency; run this with the Python of a separate venv:

    python3 -m venv /tmp/aicvenv && /tmp/aicvenv/bin/pip install aiconfigurator==0.12.0
    /tmp/aicvenv/bin/python benchmarks/aic_tune_question.py --out /tmp/aic_runs

It reads the Azure 2023 conversation trace (../shared/traces/azure_llm_2023_conv.csv),
derives the ISL/OSL and request rate AIC can take, runs `aiconfigurator cli default`
(best tokens/s/GPU on 16 GPUs) and `aiconfigurator cli recommend` (fewest GPUs for the
trace's mean rate) for H100 SXM and H200 SXM, bf16 and fp8, and writes per-run logs,
AIC's own save dirs, and summary.json into --out. Each run goes through a small
wrapper that counts AIC's calls to its agg/disagg worker predictors (the number of
points it evaluated) and times the run. Docs: docs/tune_aic.md.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"

# AIC ships the config.json of these two checkpoints; meta-llama/Llama-3.1-70B-Instruct
# itself would be fetched from the HF hub, which is not reachable here. The base and
# Instruct checkpoints have the same architecture (80 layers, 8192 hidden, GQA 64/8).
MODELS = {
    "bf16": "meta-llama/Meta-Llama-3.1-70B",
    "fp8": "nvidia/Llama-3.1-70B-Instruct-FP8",
}
SYSTEMS = ["h100_sxm", "h200_sxm"]
TTFT_MS, TPOT_MS, MAX_GPUS = 2000, 100, 16

INNER = r"""
import sys, json, time
import aiconfigurator.sdk.sweep as sw
counts = {"agg_points": 0, "disagg_worker_points": 0}
seen = {"agg": set(), "disagg": set()}
_a, _d = sw.predict_agg_worker, sw.predict_disagg_worker
def _par(m):
    c = m.config
    return (c.tp_size, c.pp_size, c.attention_dp_size)
def a(*x, **k):
    counts["agg_points"] += 1  # calls, incl. AIC's 75-value TPOT re-sweep (cached)
    seen["agg"].add((_par(k["model"]), k["runtime_config"].batch_size, k["ctx_tokens"]))
    return _a(*x, **k)
def d(*x, **k):
    counts["disagg_worker_points"] += 1
    seen["disagg"].add((_par(k["model"]), str(k["role"]), k["runtime_config"].batch_size))
    return _d(*x, **k)
sw.predict_agg_worker, sw.predict_disagg_worker = a, d
from aiconfigurator.main import main
t0 = time.perf_counter()
try:
    main(sys.argv[1:])
finally:
    counts["wall_s"] = round(time.perf_counter() - t0, 2)
    counts["agg_distinct"] = len(seen["agg"])
    counts["disagg_worker_distinct"] = len(seen["disagg"])
    counts["agg_parallel"] = sorted({p for p, *_ in seen["agg"]})
    open(COUNTS, "w").write(json.dumps(counts))
"""


def trace_stats(path: Path) -> dict:
    ts, isl, osl = [], [], []
    with open(path) as f:
        for row in csv.DictReader(f):
            ts.append(datetime.fromisoformat(row["TIMESTAMP"][:26]))
            isl.append(int(row["ContextTokens"]))
            osl.append(int(row["GeneratedTokens"]))
    span = (max(ts) - min(ts)).total_seconds()
    return {
        "requests": len(ts),
        "span_s": round(span, 1),
        "mean_rate": round((len(ts) - 1) / span, 3),
        "isl_mean": round(statistics.fmean(isl), 1),
        "isl_median": statistics.median(isl),
        "osl_mean": round(statistics.fmean(osl), 1),
        "osl_median": statistics.median(osl),
    }


def run(out: Path, name: str, argv: list[str]) -> dict:
    save = out / name
    counts = out / f"{name}.counts.json"
    code = INNER.replace("COUNTS", repr(str(counts)))
    cmd = [sys.executable, "-W", "ignore", "-c", code, "cli", *argv, "--no-color", "--save-dir", str(save)]
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    wall = round(time.perf_counter() - t0, 2)
    res = {"name": name, "cmd": "aiconfigurator cli " + " ".join(argv), "rc": rc, "wall_s": wall}
    if counts.exists():
        res.update({k: v for k, v in json.loads(counts.read_text()).items() if k != "wall_s"})
        res["search_s"] = json.loads(counts.read_text())["wall_s"]
    for mode in ("agg", "disagg"):
        files = glob.glob(str(save / "**" / mode / "best_config_topn.csv"), recursive=True)
        if files:
            with open(files[0]) as f:
                res[mode] = list(csv.DictReader(f))
    keys = ("agg_distinct", "disagg_worker_distinct", "agg_parallel")
    print(f"{name}: rc={rc} wall={wall}s", {k: res.get(k) for k in keys}, flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/aic_runs")
    ap.add_argument("--trace", default=str(TRACE))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    st = trace_stats(Path(a.trace))
    print(json.dumps(st))
    isl, osl = round(st["isl_mean"]), round(st["osl_mean"])
    rate = round(st["mean_rate"], 2)
    def question(model: str, sysname: str, isl: int, osl: int) -> list[str]:
        """The flags every run shares: model, GPU, lengths, SLOs."""
        return ["--model", model, "--system", sysname, "--backend", "vllm", "--isl", str(isl),
                "--osl", str(osl), "--ttft", str(TTFT_MS), "--tpot", str(TPOT_MS), "--top-n", "5"]

    budget = ["--total-gpus", str(MAX_GPUS), "--serving-mode", "auto"]
    runs = []
    for sysname in SYSTEMS:
        for prec, model in MODELS.items():
            base = question(model, sysname, isl, osl)
            runs.append(run(out, f"{sysname}_{prec}_default", ["default", *base, *budget]))
            runs.append(run(out, f"{sysname}_{prec}_recommend",
                            ["recommend", *base, "--target-request-rate", str(rate)]))
        # sensitivity: the trace's median lengths instead of its means (bf16 only)
        median = question(MODELS["bf16"], sysname, int(st["isl_median"]), int(st["osl_median"]))
        runs.append(run(out, f"{sysname}_bf16_default_median", ["default", *median, *budget]))
        # finer max-num-batched-tokens grid (AIC's --enable-chunked-prefill), bf16 only
        runs.append(run(out, f"{sysname}_bf16_default_chunked",
                        ["default", *question(MODELS["bf16"], sysname, isl, osl), *budget,
                         "--enable-chunked-prefill"]))
    (out / "summary.json").write_text(json.dumps({"trace": st, "runs": runs}, indent=1))
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    main()
