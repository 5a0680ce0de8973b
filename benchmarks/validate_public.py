"""kvsched against published real vLLM serving runs, with AIConfigurator's estimate of the same rows.

Every row of ``kvsched.validation.public_runs`` (a ``vllm bench serve`` result
published with its server command, GPU and vLLM version) is simulated with
kvsched's default pricing (``--step-time-backend auto``: the measured kernel
tables where they cover the model and GPU, else the roofline, each with its
default host terms) and, where it can, estimated by AIConfigurator
(aiconfigurator-core's vLLM aggregated model). Nothing is fitted on these
rows. Writes docs/public_runs.md: the errors, the refusals and where every
number came from.

    python benchmarks/validate_public.py                    # every row, kvsched + AIC
    python benchmarks/validate_public.py --no-aic --out /tmp/public.md --json /tmp/public.json

Needs aiconfigurator-core for the AIConfigurator column (``pip install -e ".[measured]"``).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from kvsched.validation.aic_estimate import AicEstimate, AicEstimator
from kvsched.validation.errors import rel_err
from kvsched.validation.public_runs import (
    DROP_REASONS,
    DROPPED,
    MIN_OUTPUT_SHARE,
    REJECTED_SOURCES,
    RUNS,
    PublicRun,
    SimulatedRun,
    aic_row,
    dropped_url,
    map_run,
    simulate_run,
)
from kvsched.validation.silicon_rows import Refusal

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "public_runs.md"


@dataclass(slots=True)
class Result:
    run: PublicRun
    kvsched: SimulatedRun | Refusal
    aic: AicEstimate | Refusal | None   # None: not asked


# (label, measured value, kvsched's value) for every metric kvsched is judged on.
METRICS: tuple[tuple[str, Callable[[PublicRun], float], Callable[[SimulatedRun], float]], ...] = (
    ("mean TTFT", lambda r: r.measured.ttft.mean, lambda s: s.ttft.mean),
    ("median TTFT", lambda r: r.measured.ttft.median, lambda s: s.ttft.median),
    ("P99 TTFT", lambda r: r.measured.ttft.p99, lambda s: s.ttft.p99),
    ("mean TPOT", lambda r: r.measured.tpot.mean, lambda s: s.tpot.mean),
    ("median TPOT", lambda r: r.measured.tpot.median, lambda s: s.tpot.median),
    ("mean ITL", lambda r: r.measured.itl.mean, lambda s: s.itl.mean),
    ("mean E2E (derived)", lambda r: r.measured.derived_mean_e2e_ms, lambda s: s.mean_e2e_ms),
    ("output tok/s", lambda r: r.measured.output_throughput, lambda s: s.output_throughput),
    ("duration", lambda r: r.measured.duration_s, lambda s: s.duration_s),
)
AIC_METRICS: dict[str, Callable[[AicEstimate], float]] = {
    "mean TTFT": lambda a: a.ttft_ms, "mean TPOT": lambda a: a.tpot_ms}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the markdown report (default: %(default)s)")
    p.add_argument("--json", type=Path, help="also save every row's prediction here")
    p.add_argument("--no-aic", action="store_true", help="skip AIConfigurator")
    p.add_argument("--limit", type=int, help="only the first N rows (a quick check)")
    return p.parse_args(argv)


def evaluate(runs: Sequence[PublicRun], aic: AicEstimator | None) -> list[Result]:
    out = []
    for i, run in enumerate(runs, 1):
        t0 = time.perf_counter()
        sim = simulate_run(run)
        estimate: AicEstimate | Refusal | None = None
        if aic is not None:
            row = aic_row(run)
            estimate = row if isinstance(row, Refusal) else aic.estimate(row)
        print(f"[{i}/{len(runs)}] {run.id}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        out.append(Result(run, sim, estimate))
    return out


# --------------------------------------------------------------------------
# The report


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def _median_abs(errors: Sequence[float]) -> str:
    return f"{statistics.median(abs(e) for e in errors):.0%} (n={len(errors)})" if errors else "-"


def _bias(errors: Sequence[float]) -> str:
    return _pct(statistics.median(errors)) if errors else "-"


def headline(results: Sequence[Result]) -> list[str]:
    priced = [r for r in results if isinstance(r.kvsched, SimulatedRun)]
    both = [r for r in priced if isinstance(r.aic, AicEstimate)]
    lines = ["| metric | kvsched median abs error | kvsched median signed error | AIConfigurator median abs "
             "error | on the rows both priced: kvsched / AIConfigurator |",
             "|---|---|---|---|---|"]
    for label, measured, predicted in METRICS:
        errs = [rel_err(predicted(r.kvsched), measured(r.run)) for r in priced
                if isinstance(r.kvsched, SimulatedRun)]
        aic_cell = both_cell = "-"
        if label in AIC_METRICS:
            pick = AIC_METRICS[label]
            aic_errs = [rel_err(pick(r.aic), measured(r.run)) for r in results
                        if isinstance(r.aic, AicEstimate)]
            aic_cell = _median_abs(aic_errs)
            k = [rel_err(predicted(r.kvsched), measured(r.run)) for r in both
                 if isinstance(r.kvsched, SimulatedRun)]
            a = [rel_err(pick(r.aic), measured(r.run)) for r in both if isinstance(r.aic, AicEstimate)]
            both_cell = f"{_median_abs(k)} / {_median_abs(a)}"
        lines.append(f"| {label} | {_median_abs(errs)} | {_bias(errs)} | {aic_cell} | {both_cell} |")
    return lines


def by_group(results: Sequence[Result]) -> list[str]:
    """kvsched's median |error| of mean TTFT and mean TPOT by request shape and by pricing."""
    priced = [r for r in results if isinstance(r.kvsched, SimulatedRun)]

    def cell(rows: Sequence[Result], metric: int) -> str:
        _, measured, predicted = METRICS[metric]
        return _median_abs([rel_err(predicted(r.kvsched), measured(r.run)) for r in rows
                            if isinstance(r.kvsched, SimulatedRun)])

    groups: dict[str, list[Result]] = {}
    for r in priced:
        assert isinstance(r.kvsched, SimulatedRun)
        groups.setdefault(f"{r.run.input_len}/{r.run.output_len} x {r.run.num_prompts}", []).append(r)
    for r in priced:
        assert isinstance(r.kvsched, SimulatedRun)
        groups.setdefault(f"pricing: {r.kvsched.pricing}", []).append(r)
    lines = ["| rows | mean TTFT | mean TPOT |", "|---|---|---|"]
    lines += [f"| {name} | {cell(rows, 0)} | {cell(rows, 3)} |" for name, rows in groups.items()]
    return lines


def _short(run: PublicRun) -> str:
    served = run.id.split(": ", 1)[1]
    gpu = {"a100-80gb": "A100", "h100-sxm": "H100", "h200": "H200"}.get(run.hardware, run.hardware)
    return f"{served} · {gpu} · {run.input_len}/{run.output_len} × {run.num_prompts}"


def row_tables(results: Sequence[Result]) -> list[str]:
    lines = ["### TTFT and TPOT: measured, kvsched, AIConfigurator (mean, ms)", "",
             "| # | run | pricing | TTFT measured | kvsched | err | AIC | err | TPOT measured | kvsched "
             "| err | AIC | err |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        m = r.run.measured
        if isinstance(r.kvsched, SimulatedRun):
            s = r.kvsched
            k = (s.pricing, _num(s.ttft.mean), _pct(rel_err(s.ttft.mean, m.ttft.mean)), _num(s.tpot.mean),
                 _pct(rel_err(s.tpot.mean, m.tpot.mean)))
        else:
            k = ("refused", "-", "-", "-", "-")
        if isinstance(r.aic, AicEstimate):
            a = (_num(r.aic.ttft_ms), _pct(rel_err(r.aic.ttft_ms, m.ttft.mean)), _num(r.aic.tpot_ms),
                 _pct(rel_err(r.aic.tpot_ms, m.tpot.mean)))
        else:
            a = ("-", "-", "-", "-")
        lines.append(f"| {i} | {_short(r.run)} | {k[0]} | {_num(m.ttft.mean)} | {k[1]} | {k[2]} | {a[0]} | "
                     f"{a[1]} | {_num(m.tpot.mean)} | {k[3]} | {k[4]} | {a[2]} | {a[3]} |")
    lines += ["", "### kvsched's other metrics: signed error (measured value)", "",
              "| # | " + " | ".join(label for label, _, _ in METRICS[1:] if label != "mean TPOT") + " |",
              "|---|" + "---|" * (len(METRICS) - 2)]
    for i, r in enumerate(results, 1):
        cells = []
        for label, measured, predicted in METRICS[1:]:
            if label == "mean TPOT":
                continue
            value = measured(r.run)
            cells.append(f"{_pct(rel_err(predicted(r.kvsched), value))} ({_num(value)})"
                         if isinstance(r.kvsched, SimulatedRun) else f"- ({_num(value)})")
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return lines


def refusals(results: Sequence[Result]) -> list[str]:
    lines = ["| # | who | reason | detail |", "|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        for who, verdict in (("kvsched", r.kvsched), ("AIConfigurator", r.aic)):
            if isinstance(verdict, Refusal):
                detail = verdict.detail.replace("|", "/")[:220]
                lines.append(f"| {i} | {who} | {verdict.reason} | {detail} |")
    return lines


def provenance(results: Sequence[Result]) -> list[str]:
    lines = ["| # | source (file, line, commit) | vLLM | server | benchmark | GPUs (source's words) | "
             "assumptions and notes |", "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(results, 1):
        run = r.run
        mapped = map_run(run)
        notes = list(r.kvsched.notes) if isinstance(r.kvsched, SimulatedRun) else (
            list(mapped.notes) if not isinstance(mapped, Refusal) else [])
        notes.append(f"prompts: {run.prompt_tokens} tokens each (the source's total input / N; "
                     f"--random-input-len {run.input_len})")
        notes.append(f"outputs: {run.output_len} tokens each ({run.output_share:.2%} of N x O generated)")
        bench = (f"`vllm bench serve --dataset-name {run.dataset} --random-input-len {run.input_len} "
                 f"--random-output-len {run.output_len} --num-prompts {run.num_prompts} --seed {run.seed}` "
                 "(openai-chat, request rate inf)")
        lines.append(f"| {i} | [{run.source.path}#L{run.line}]({run.url}) @ {run.source.commit[:10]} | "
                     f"{run.vllm_version} | `{run.serve_command}` | {bench} | {run.source.gpus} | "
                     f"{'; '.join(notes)} |")
    return lines


def left_out() -> list[str]:
    counts = Counter(d.reason for d in DROPPED)
    lines = ["Results of the same documents that are not rows (vLLM, random dataset):", "",
             "| reason | results | where |", "|---|---|---|"]
    for reason, text in DROP_REASONS.items():
        where = ", ".join(f"[{d.doc}#L{d.line}]({dropped_url(d)})" for d in DROPPED if d.reason == reason)
        lines.append(f"| {text} | {counts[reason]} | {where} |")
    lines += ["", "Other public sources looked at:", "", "| source | where | why no row |", "|---|---|---|"]
    lines += [f"| {s.name} | {s.where} | {s.reason} |" for s in REJECTED_SOURCES]
    return lines


def _checkout() -> str:
    """The repository's commit, and whether the working tree differs from it."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "checkout unknown"
    return f"commit {head}{' with local changes' if dirty else ''}"


def report(results: Sequence[Result], aic_asked: bool) -> str:
    kvsched_version = importlib.metadata.version("kvsched")
    try:
        aic_version = importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        aic_version = "not installed"
    priced = sum(isinstance(r.kvsched, SimulatedRun) for r in results)
    aic_priced = sum(isinstance(r.aic, AicEstimate) for r in results)
    pricing = Counter(r.kvsched.pricing for r in results if isinstance(r.kvsched, SimulatedRun))
    parts = [
        "# kvsched on published real vLLM serving runs",
        "",
        "A held-out judge: `vllm bench serve` results that others published with their server command, GPU "
        "and vLLM version, simulated by kvsched with its default pricing (`--step-time-backend auto`: the "
        "measured vLLM kernel tables where they cover the model and GPU, else the roofline, each with its "
        "default host terms) and estimated by AIConfigurator where it can. Nothing in kvsched is fitted or "
        "tuned on these rows. The data, its sources and every assumption are in "
        "`kvsched/validation/data/gpustack_runs.yaml` (read by `kvsched/validation/public_runs.py`); "
        "this page is written by `benchmarks/validate_public.py` "
        f"({datetime.date.today().isoformat()}, kvsched {kvsched_version} at {_checkout()}, "
        f"aiconfigurator-core {aic_version}).",
        "",
        f"{len(results)} rows; kvsched priced {priced} "
        f"({', '.join(f'{n} {k}' for k, n in pricing.items())}), "
        f"AIConfigurator {aic_priced if aic_asked else 'not asked'}. Errors are (predicted - measured) / "
        "measured: negative = kvsched predicts less time (or less throughput) than was measured.",
        "",
        "How to read it: every run sends all its requests at once (`--request-rate inf`, no "
        "`--max-concurrency`), so TTFT is mostly the wait behind earlier prefills and the server's own "
        "handling of a burst of 100-1000 chat requests. AIConfigurator is asked about a static batch of "
        "min(prompts, vLLM's max_num_seqs) requests of the same lengths (its aggregated model has no "
        "queue), so its TTFT leaves that wait out by construction; its TPOT is the comparable figure. "
        "'Mean E2E (derived)' is the source's mean TTFT + mean TPOT x (O - 1), exact when every output has "
        "O tokens (the rows keep only runs that generated at least "
        f"{MIN_OUTPUT_SHARE:.0%} of them).",
        "",
        "## Headline",
        "",
        *headline(results),
        "",
        "kvsched by request shape (input/output tokens x prompts) and by what priced the steps "
        "(median abs error):",
        "",
        *by_group(results),
        "",
        "## Rows",
        "",
        *row_tables(results),
        "",
        "## Refusals",
        "",
        *refusals(results),
        "",
        "## Provenance",
        "",
        "Numbers transcribed from GPUStack's performance-lab documents (Apache-2.0), with credit. "
        "The benchmark client is `vllm bench serve --backend openai-chat --endpoint /v1/chat/completions` "
        "as each document states (printed for the 4000/200 case; the other cases are taken to differ only "
        "in the lengths and the number of prompts, which their printed totals agree with); the server is "
        "the document's `vllm serve` line with vLLM's defaults for everything it does not set.",
        "",
        *provenance(results),
        "",
        "## What was left out",
        "",
        *left_out(),
        "",
    ]
    return "\n".join(parts)


def to_json(results: Sequence[Result]) -> list[dict[str, object]]:
    def one(value: object) -> object:
        if value is None:
            return None
        if isinstance(value, Refusal):
            return {"refused": value.reason, "detail": value.detail}
        return asdict(value)  # type: ignore[call-overload]
    return [{"id": r.run.id, "url": r.run.url, "kvsched": one(r.kvsched), "aic": one(r.aic)} for r in results]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model is in the catalog: no download
    runs = RUNS[:args.limit] if args.limit else RUNS
    aic = None if args.no_aic else AicEstimator()
    results = evaluate(runs, aic)
    args.out.write_text(report(results, aic is not None), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(to_json(results), indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
