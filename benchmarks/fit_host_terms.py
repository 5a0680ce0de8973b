"""Fit kvsched's host-time terms on real vLLM serving runs; judge them on others.

    python benchmarks/fit_host_terms.py            # fit, report, write the default file
    python benchmarks/fit_host_terms.py --dry-run  # fit and report only

Split: the fit sees only the Hopper rows (h100_sxm, h200_sxm) of
aiconfigurator-core's silicon_sample.csv that kvsched's measured backend can
price; the B200 rows are held out and only evaluated. The objective is the
sum of the median |error| of mean TTFT and of mean TPOT over the training
rows, each row simulated as it was run (kvsched.perf.silicon). The one term
(kvsched.perf.host) is searched on a grid (every second training row, to
halve the time), refined around the best, and reported on all rows.
Writes kvsched/perf/data/host_terms_vllm-0.24_nvidia.json with the figures
in its provenance.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import date
from pathlib import Path

from kvsched.perf.host import DEFAULT_FILE, HostTerms, save_host_terms
from kvsched.perf.silicon import Refusal, ServingRun, load_rows, map_row, simulate_row

TRAIN = ("h100_sxm", "h200_sxm")
HELD_OUT = ("b200_sxm",)


def runs_of(systems: Sequence[str]) -> list[ServingRun]:
    out = []
    for row in load_rows():
        if row.system in systems:
            run = map_row(row)
            if not isinstance(run, Refusal):
                out.append(run)
    return out


def errors(runs: Sequence[ServingRun], terms: HostTerms, workdir: Path) -> tuple[list[float], list[float]]:
    """(TTFT errors, TPOT errors) of every run kvsched prices with ``terms``."""
    path = workdir / f"terms-{terms.prefill_step_per_layer_s:.6f}.json"
    save_host_terms(terms, path)
    ttft, tpot = [], []
    for run in runs:
        candidate = dataclasses.replace(run, options=dataclasses.replace(run.options, calibration=str(path)))
        result = simulate_row(candidate, "measured")
        if isinstance(result, Refusal):
            continue
        ttft.append(result.mean_ttft_ms / run.row.ttft_ms - 1)
        tpot.append(result.mean_tpot_ms / run.row.tpot_ms - 1)
    return ttft, tpot


def summary(ttft: Sequence[float], tpot: Sequence[float]) -> str:
    def med(e: Sequence[float]) -> float:
        return statistics.median(abs(x) for x in e)

    return (f"{len(ttft)} rows: TTFT median |err| {med(ttft):.1%} (bias {statistics.mean(ttft):+.1%}), "
            f"TPOT median |err| {med(tpot):.1%} (bias {statistics.mean(tpot):+.1%})")


def objective(ttft: Sequence[float], tpot: Sequence[float]) -> float:
    return statistics.median(abs(x) for x in ttft) + statistics.median(abs(x) for x in tpot)


def terms_at(value_s: float, provenance: str = "candidate") -> HostTerms:
    return HostTerms(prefill_step_per_layer_s=value_s, vllm_version="0.24", hardware_class="nvidia",
                     provenance=provenance)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="do not write the default file")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    train, held = runs_of(TRAIN), runs_of(HELD_OUT)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scores: dict[float, float] = {}

        def score(ms: float) -> float:
            ms = round(ms, 4)
            if ms not in scores:
                scores[ms] = objective(*errors(train[::2], terms_at(ms * 1e-3), work))
                print(f"  {ms:.3f} ms/layer: objective {scores[ms]:.4f}", file=sys.stderr, flush=True)
            return scores[ms]

        for ms in (0.0, 0.15, 0.3, 0.45):
            score(ms)
        best = min(scores, key=scores.__getitem__)
        for ms in (best - 0.075, best + 0.075):
            if ms >= 0:
                score(ms)
        best = min(scores, key=scores.__getitem__)
        fitted = terms_at(best * 1e-3)
        before_train = summary(*errors(train, terms_at(0.0), work))
        after_train = summary(*errors(train, fitted, work))
        before_held = summary(*errors(held, terms_at(0.0), work))
        after_held = summary(*errors(held, fitted, work))
    provenance = (f"fitted {date.today().isoformat()} by benchmarks/fit_host_terms.py on the "
                  f"{'/'.join(TRAIN)} vLLM agg rows of aiconfigurator-core 0.12's silicon_sample.csv "
                  f"(measured backend; objective: median |TTFT err| + median |TPOT err|). "
                  f"Train {after_train} (without the term: {before_train}). "
                  f"Held out {'/'.join(HELD_OUT)}: {after_held} (without: {before_held}).")
    print(f"prefill_step_per_layer_s = {best:.3f} ms/layer")
    print(f"train ({'/'.join(TRAIN)}): without {before_train}")
    print(f"                           with    {after_train}")
    print(f"held out ({'/'.join(HELD_OUT)}): without {before_held}")
    print(f"                     with    {after_held}")
    print(f"({time.perf_counter() - t0:.0f} s)")
    if not args.dry_run:
        save_host_terms(terms_at(best * 1e-3, provenance), DEFAULT_FILE)
        print(f"wrote {DEFAULT_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
