"""Issue 34: kvsched's profiled pricing judged median against median over repeats.

Reads only the recorded files of one run_matrix.py configuration whose
workloads ran several times with fresh prompts (``fresh_repeats``; e.g.
``serving-llama``): each run's ``vllm bench serve`` JSON, its prompts and
its server log. Every run is simulated from the profile alone
(``judge_matrix.judge_run``: the run's own requests at their own send
times, the server's flags; no re-anchoring, no calibration), with the
profile's serving-path terms (``profiled``) and without them
(``profiled-noserve``, the pricing before issue 34); beside them, not
judged, ``logged+host`` (vLLM's logged steps and the host time read off
the run itself: what the mechanics give when the step times and the
serving path are right) and those host terms read off each run, against
the profile's. Per workload and
metric: the median of the real repeats, the median of their simulations,
the error of the one against the other, and the repeats' spread (max -
min) / median. The bars: mean TPOT within 10 % and within twice the
repeats' spread, mean TTFT within 10 %, p99 TTFT within 15 %.

    PYTHONPATH=. python benchmarks/real_vllm/judge_repeats.py --results DIR [--config serving-llama]

writes ``DIR/judged-repeats.json`` and ``DIR/judged-repeats.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import judge_matrix as jm
import run_matrix as rm

from kvsched.perf.step_profile import load_profile

PRICINGS = ("profiled", "profiled-noserve")
# Not judged, shown beside: each run priced with vLLM's own logged steps and
# the host time read off the run itself (the mechanics alone; where the log
# can be tied to the requests).
DIAGNOSTIC = ("logged+host",)
METRICS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "p99_itl_ms",
           "mean_e2el_ms", "output_throughput")
# |error| of the medians, in %; mean TPOT also within twice the repeats' spread.
BARS = {"mean_tpot_ms": 10.0, "mean_ttft_ms": 10.0, "p99_ttft_ms": 15.0}


def spread(values: Sequence[float]) -> float:
    """(max - min) / median, in %."""
    return 100 * (max(values) - min(values)) / statistics.median(values)


def workload_name(stem: str) -> str:
    return stem.split("_r")[0]


def judge(results: Path, config_name: str) -> dict[str, Any]:
    configs = {c.name: c for c in rm.CONFIGS}
    if config_name not in configs:
        sys.exit(f"--config {config_name}: not a run_matrix.py configuration ({', '.join(configs)})")
    config = configs[config_name]
    meta = results / config.name / "server.json"
    if not meta.exists():
        sys.exit(f"{meta}: missing; run run_matrix.py run --results {results} --only {config.name} first")
    server = json.loads(meta.read_text())
    matrix = jm.Matrix(results.resolve())
    runs = []
    for path in sorted((results / config.name).glob("*.json")):
        if path.name == "server.json" or path.name.endswith(".prompts.json") or path.stem == "warmup":
            continue
        j = jm.judge_run(matrix, config, server, path.resolve(), (*PRICINGS, *DIAGNOSTIC))
        data = json.loads(path.read_text())
        j["loadavg_before_after"] = data.get("run_matrix", {}).get("loadavg_before_after")
        j["finished"] = data.get("run_matrix", {}).get("finished")
        j["client_flags"] = data.get("run_matrix", {}).get("client_flags")
        runs.append(j)
        print(f"{path.stem}: real mean TPOT {j['real']['mean_tpot_ms']:.2f} ms, "
              + ", ".join(f"{p} {j[p]['metrics']['mean_tpot_ms']:.2f}" for p in PRICINGS), flush=True)
    workloads: dict[str, list[dict[str, Any]]] = {}
    for j in runs:
        workloads.setdefault(workload_name(j["run"]), []).append(j)
    profile = load_profile(matrix.profile(config.model))
    out: dict[str, Any] = {"config": config.name, "profile": str(matrix.profile(config.model)),
                           "profile_serving": profile.serving.to_json() if profile.serving else None,
                           "runs": runs, "workloads": {}}
    for name, js in workloads.items():
        w: dict[str, Any] = {"repeats": [j["run"] for j in js], "real": {}, "spread_pct": {}}
        for k in METRICS:
            real = [j["real"][k] for j in js]
            w["real"][k] = {"values": real, "median": statistics.median(real)}
            w["spread_pct"][k] = spread(real)
        shown = [p for p in (*PRICINGS, *DIAGNOSTIC) if all(p in j for j in js)]
        w["pricings"] = shown
        w["host_read_off_the_runs"] = [j.get("host_read_off_the_run") for j in js]
        for p in shown:
            sims = {k: [j[p]["metrics"][k] for j in js] for k in METRICS}
            w[p] = {k: {"values": sims[k], "median": statistics.median(sims[k]),
                        "error_pct": 100 * (statistics.median(sims[k]) / w["real"][k]["median"] - 1)}
                    for k in METRICS}
            bars = {}
            for k, bar in BARS.items():
                err = abs(w[p][k]["error_pct"])
                met = err <= bar
                if k == "mean_tpot_ms":
                    met = met and err <= 2 * w["spread_pct"][k]
                bars[k] = {"abs_error_pct": err, "bar_pct": bar, "twice_spread_pct": 2 * w["spread_pct"][k],
                           "met": met}
            if p in PRICINGS:
                w[p + "_bars"] = bars
        out["workloads"][name] = w
    return out


def markdown(report: dict[str, Any]) -> str:
    short = {"mean_ttft_ms": "mean TTFT", "median_ttft_ms": "median TTFT", "p99_ttft_ms": "p99 TTFT",
             "mean_tpot_ms": "mean TPOT", "median_itl_ms": "median ITL", "p99_itl_ms": "p99 ITL",
             "mean_e2el_ms": "mean E2E", "output_throughput": "throughput"}
    lines = ["Median of the real repeats (ms; throughput tok/s), the simulations' median error against it, "
             "and the repeats' spread (max-min)/median:", "",
             "| workload | row | " + " | ".join(short[k] for k in METRICS) + " |",
             "| --- | --- | " + " | ".join("---" for _ in METRICS) + " |"]
    for name, w in report["workloads"].items():
        lines.append(f"| {name} ({len(w['repeats'])} repeats) | real median | "
                     + " | ".join(f"{w['real'][k]['median']:.1f}" for k in METRICS) + " |")
        lines.append("| | spread of the repeats | "
                     + " | ".join(f"{w['spread_pct'][k]:.1f} %" for k in METRICS) + " |")
        for p in w["pricings"]:
            mark = " (not judged)" if p in DIAGNOSTIC else ""
            lines.append(f"| | {p}{mark} | "
                         + " | ".join(f"{w[p][k]['error_pct']:+.1f} %" for k in METRICS) + " |")
    lines += ["", "Bars (|error| of the medians): mean TPOT <= 10 % and <= twice the repeats' spread, "
              "mean TTFT <= 10 %, p99 TTFT <= 15 %:", "",
              "| workload | pricing | mean TPOT | mean TTFT | p99 TTFT |", "| --- | --- | --- | --- | --- |"]
    for name, w in report["workloads"].items():
        for p in PRICINGS:
            b = w[p + "_bars"]
            tpot = b["mean_tpot_ms"]
            cells = [f"{tpot['abs_error_pct']:.1f} % (2x spread {tpot['twice_spread_pct']:.1f} %): "
                     f"{'met' if tpot['met'] else 'not met'}"]
            cells += [f"{b[k]['abs_error_pct']:.1f} %: {'met' if b[k]['met'] else 'not met'}"
                      for k in ("mean_ttft_ms", "p99_ttft_ms")]
            lines.append(f"| {name} | {p} | " + " | ".join(cells) + " |")
    serving = report.get("profile_serving")
    if serving:
        lines += ["", f"Host terms: the profile's serving path, step {1e3 * serving['step_s']:.2f} ms + "
                  f"{1e3 * serving['per_sampled_request_s']:.3f} ms a sampled request, arrival "
                  f"{1e3 * serving['arrival_s']:.2f} ms + {1e6 * serving['per_prompt_token_s']:.2f} us a "
                  "prompt token; read off each real run (its client's gaps between steps less the logged "
                  "step, its idle arrivals):", "",
                  "| run | step ms | per sampled request ms | arrival ms | client gap ms, median (p10-p90) |",
                  "| --- | --- | --- | --- | --- |"]
        for j in report["runs"]:
            h = j.get("host_read_off_the_run")
            if isinstance(h, dict):
                g = h["client_gap_ms"]
                lines.append(f"| {j['run']} | {h['step_s_ms']:.2f} | {h['per_sampled_request_ms']:.3f} | "
                             f"{h['arrival_ms']:.2f} | {g['median']:.2f} ({g['p10']:.2f}-{g['p90']:.2f}) |")
            else:
                lines.append(f"| {j['run']} | not read off: {h} | | | |")
    lines += ["", "Per run (real; the load averages 1/5/15 min before and after):", "",
              "| run | finished | load before | load after | mean TTFT | p99 TTFT | mean TPOT | "
              + " | ".join(f"{p} mean TPOT" for p in PRICINGS) + " |",
              "| --- | --- | --- | --- | --- | --- | --- | " + " | ".join("---" for _ in PRICINGS) + " |"]
    for j in report["runs"]:
        la = j.get("loadavg_before_after") or [["?"], ["?"]]
        r = j["real"]
        lines.append(f"| {j['run']} | {j.get('finished')} | {' '.join(la[0])} | {' '.join(la[1])} | "
                     f"{r['mean_ttft_ms']:.1f} | {r['p99_ttft_ms']:.1f} | {r['mean_tpot_ms']:.2f} | "
                     + " | ".join(f"{j[p]['metrics']['mean_tpot_ms']:.2f} "
                                  f"({j[p]['error_pct']['mean_tpot_ms']:+.1f} %)" for p in PRICINGS) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, required=True, help="run_matrix.py --results directory")
    p.add_argument("--config", default="serving-llama",
                   help="the configuration judged (default: %(default)s)")
    args = p.parse_args(argv)
    report = judge(args.results, args.config)
    (args.results / "judged-repeats.json").write_text(json.dumps(report, indent=1) + "\n")
    table = markdown(report)
    (args.results / "judged-repeats.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
