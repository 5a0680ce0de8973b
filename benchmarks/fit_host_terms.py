"""Select and fit kvsched's host-time terms on real vLLM serving runs; judge them on others.

    python benchmarks/fit_host_terms.py                 # select, fit, write the default file
    python benchmarks/fit_host_terms.py --dry-run       # select and fit, write nothing
    python benchmarks/fit_host_terms.py --held-out      # ... then evaluate the B200 rows
    python benchmarks/fit_host_terms.py --workers 1     # simulate rows in 1 process

Rows: the vLLM aggregated rows of aiconfigurator-core's silicon_sample.csv
that kvsched's measured backend can price. Training rows are the Hopper ones
(h100_sxm, h200_sxm); the B200 rows are held out: the selection and the fit
never map, simulate or look at them, and ``--held-out`` reads them only after
the terms and their values are fixed (and written). The figures of
docs/validation.md §5 come from ``benchmarks/validate_silicon.py`` run after
this script.

Every choice is made on the training rows:

1. *Which terms* (``CANDIDATES``). Each candidate set is fitted on the H100
   rows and judged on the H200 rows, and the other way round (two folds by
   GPU, every ``--select-stride``-th row of each GPU). The set with the
   lowest mean validation objective over the two folds is selected; a tie
   goes to the smaller set.
2. *Their values.* The selected set is refitted on every ``--stride``-th
   row of each Hopper GPU, pooled, and written to kvsched/perf/data with the
   selection and fit figures in its provenance.

Cost bound: a row's simulation time grows with the output tokens its
client asks for (10 x CONC x OSL counted requests' tokens); a few rows (e.g.
gpt-oss-120b at CONC 512, 8k outputs) cost minutes each. The selection and
the fit use only training rows under ``--max-output-tokens`` (default 1M:
447 of the 554 training rows), a choice made on cost alone; the held-out
evaluation has no bound.

Objective: median |error| of mean TTFT plus median |error| of mean TPOT over
the rows, each row simulated as it was run (kvsched.validation.silicon).
Fit: coordinate descent over a set's terms, non-negative, from 0: the first
round walks each term up a grid of multiples of its step, the next rounds
refine by factors around the current value. Terms outside the set stay 0;
``dp_sync_s`` is in no candidate set (see CANDIDATES).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import date
from pathlib import Path

from kvsched.perf.host import DEFAULT_FILE, TERMS, HostTerms, save_host_terms
from kvsched.validation.silicon import simulate_row
from kvsched.validation.silicon_rows import PROMPTS_PER_CLIENT, Refusal, ServingRun, load_rows, map_row

TRAIN = ("h100_sxm", "h200_sxm")
HELD_OUT = ("b200_sxm",)
# The terms that may be fitted, with the step of their first grid (seconds)
# and the unit they are printed in. per_prompt_token_s goes last: the fits of
# the two candidate sets then share every evaluation of their first round up
# to it (the score cache below), which halves the selection's cost.
GRID = {
    "prefill_step_per_layer_s": (0.1e-3, "ms", 1e3),
    "step_s": (0.2e-3, "ms", 1e3),
    "per_sampled_request_s": (5e-6, "us", 1e6),
    "arrival_s": (5e-3, "ms", 1e3),
    "per_prompt_token_s": (5e-6, "us", 1e6),
}
# The candidate term sets the selection compares. per_prompt_token_s is the
# term whose inclusion was in question: tokenisation costs about a
# microsecond per token, which these rows may not tell apart from prefill
# kernel time (a free fit on 2026-11-24 put it at 20 us). dp_sync_s is in
# no set and stays 0: the only data-parallel training rows are 15 H100 rows
# (attention-DP 4) and none on H200, so neither GPU fold could judge it.
CANDIDATES: dict[str, tuple[str, ...]] = {
    "4 terms": ("prefill_step_per_layer_s", "step_s", "per_sampled_request_s", "arrival_s"),
    "4 terms + per_prompt_token_s": ("prefill_step_per_layer_s", "step_s", "per_sampled_request_s",
                                     "arrival_s", "per_prompt_token_s"),
}
ROUNDS = 2


def output_tokens(run: ServingRun) -> int:
    """The counted requests' output tokens at most: what a row's simulation time grows with."""
    return PROMPTS_PER_CLIENT * run.row.concurrency * run.row.osl


def runs_of(systems: Sequence[str]) -> list[ServingRun]:
    out = []
    for row in load_rows():
        if row.system in systems:
            run = map_row(row)
            if not isinstance(run, Refusal):
                out.append(run)
    return out


def _row_errors(args: tuple[ServingRun, str]) -> tuple[float, float] | None:
    run, path = args
    candidate = dataclasses.replace(run, options=dataclasses.replace(run.options, calibration=path))
    result = simulate_row(candidate, "measured")
    if isinstance(result, Refusal):
        return None
    return result.mean_ttft_ms / run.row.ttft_ms - 1, result.mean_tpot_ms / run.row.tpot_ms - 1


Errors = tuple[list[float], list[float]]


class Evaluator:
    """Simulates a set of rows with given terms; remembers every result, so
    an evaluation two fits share runs once."""

    def __init__(self, workdir: Path, workers: int) -> None:
        self.workdir = workdir
        self.pool = ProcessPoolExecutor(workers) if workers > 1 else None
        self.count = 0
        self.seconds = 0.0
        self.cache: dict[tuple[str, tuple[float, ...]], Errors] = {}

    def errors(self, label: str, runs: Sequence[ServingRun], values: dict[str, float]) -> Errors:
        """(TTFT errors, TPOT errors) of every run of ``runs`` (named
        ``label``) kvsched prices with the terms ``values``."""
        key = (label, tuple(round(values.get(n, 0.0), 12) for n in TERMS))
        if key in self.cache:
            return self.cache[key]
        t0 = time.perf_counter()
        self.count += 1
        path = self.workdir / f"terms-{self.count}.json"
        save_host_terms(candidate(values), path)
        # The costliest rows first, so that no worker is left with one at the end.
        jobs = [(run, str(path)) for run in sorted(runs, key=output_tokens, reverse=True)]
        results = list(self.pool.map(_row_errors, jobs) if self.pool else map(_row_errors, jobs))
        pairs = [r for r in results if r is not None]
        self.cache[key] = ([a for a, _ in pairs], [b for _, b in pairs])
        self.seconds += time.perf_counter() - t0
        return self.cache[key]


def median_abs(errors: Sequence[float]) -> float:
    return statistics.median(abs(x) for x in errors)


def summary(ttft: Sequence[float], tpot: Sequence[float]) -> str:
    return (f"{len(ttft)} rows: TTFT median |err| {median_abs(ttft):.1%} "
            f"(bias {statistics.mean(ttft):+.1%}), TPOT median |err| {median_abs(tpot):.1%} "
            f"(bias {statistics.mean(tpot):+.1%})")


def objective(ttft: Sequence[float], tpot: Sequence[float]) -> float:
    return median_abs(ttft) + median_abs(tpot)


def candidate(values: dict[str, float], provenance: str = "candidate") -> HostTerms:
    return HostTerms(vllm_version="0.24", hardware_class="nvidia", provenance=provenance,
                     **{name: values.get(name, 0.0) for name in TERMS})


def describe(values: dict[str, float]) -> str:
    return ", ".join(f"{name} {values[name] * GRID[name][2]:.3g} {GRID[name][1]}"
                     for name in GRID if values.get(name, 0.0) > 0) or "all terms 0"


def fit(terms: Sequence[str], score: Callable[[dict[str, float]], float]) -> tuple[dict[str, float], float]:
    """Coordinate descent over ``terms`` from 0; the best values and their score."""
    best = {name: 0.0 for name in terms}
    best_score = score(best)
    for round_ in range(ROUNDS):
        for name in terms:
            step = GRID[name][0]
            # Round 1 walks up from 0 in steps; later rounds refine by
            # factors around the current value.
            current = best[name]
            if round_ == 0:
                grid = [step * k for k in (1, 2, 4)]
            else:
                grid = [current * f for f in (0.7, 1.4)] if current else [step / 2]
            for value in grid:
                trial = {**best, name: value}
                s = score(trial)
                if s < best_score:
                    best, best_score = trial, s
    return best, best_score


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="do not write the default file")
    ap.add_argument("--workers", type=int, default=2, help="processes simulating rows (default 2)")
    ap.add_argument("--stride", type=int, default=8,
                    help="refit the selected terms on every N-th training row of each GPU (default 8; "
                         "equal to --select-stride, the refit reuses the folds' simulations)")
    ap.add_argument("--select-stride", type=int, default=8,
                    help="fit and judge the GPU folds of the selection on every N-th row of each "
                         "GPU (default 8)")
    ap.add_argument("--max-output-tokens", type=float, default=1e6,
                    help="select and fit on the training rows whose counted requests ask for at most "
                         "this many output tokens (default 1e6; 0: every row)")
    ap.add_argument("--held-out", action="store_true",
                    help="after writing the terms, evaluate them on the held-out B200 rows")
    args = ap.parse_args(argv)
    for flag in ("workers", "stride", "select_stride"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')}={getattr(args, flag)}: must be at least 1")
    if args.max_output_tokens < 0:
        ap.error(f"--max-output-tokens={args.max_output_tokens:g}: must be at least 0 (0: every row)")
    t0 = time.perf_counter()
    every = runs_of(TRAIN)
    train = [r for r in every if not args.max_output_tokens or output_tokens(r) <= args.max_output_tokens]
    bound = (f"the {len(train)} of {len(every)} training rows with at most {int(args.max_output_tokens):,} "
             f"counted output tokens" if args.max_output_tokens else f"all {len(every)} training rows")
    print(f"selecting and fitting on {bound}", file=sys.stderr, flush=True)
    by_gpu = {gpu: [r for r in train if r.row.system == gpu] for gpu in TRAIN}
    folds = [(TRAIN[0], TRAIN[1]), (TRAIN[1], TRAIN[0])]
    with tempfile.TemporaryDirectory() as tmp:
        ev = Evaluator(Path(tmp), args.workers)

        def errors(gpus: Sequence[str], stride: int, values: dict[str, float]) -> Errors:
            """The errors of every ``stride``-th row of each of ``gpus``, pooled;
            each GPU's sample is simulated (and remembered) on its own, so the
            refit reuses what the folds ran."""
            ttft: list[float] = []
            tpot: list[float] = []
            for gpu in gpus:
                label = f"{gpu} 1/{stride}"
                fresh = (label, tuple(round(values.get(n, 0.0), 12) for n in TERMS)) not in ev.cache
                a, b = ev.errors(label, by_gpu[gpu][::stride], values)
                if fresh:
                    print(f"  [{label}, {len(a)} rows] {describe(values)}: objective {objective(a, b):.4f} "
                          f"({time.perf_counter() - t0:,.0f} s)", file=sys.stderr, flush=True)
                ttft += a
                tpot += b
            return ttft, tpot

        def scorer(gpus: Sequence[str], stride: int) -> Callable[[dict[str, float]], float]:
            return lambda values: objective(*errors(gpus, stride, values))

        # 1. Selection: two folds by GPU, on the training rows only.
        selection: list[tuple[str, float, list[str]]] = []
        for name, terms in CANDIDATES.items():
            notes, validation = [], []
            for fit_gpu, val_gpu in folds:
                values, fit_score = fit(terms, scorer([fit_gpu], args.select_stride))
                val_errors = errors([val_gpu], args.select_stride, values)
                validation.append(objective(*val_errors))
                notes.append(f"fit on {fit_gpu} ({describe(values)}; objective {fit_score:.3f}), "
                             f"judged on {val_gpu}: {summary(*val_errors)}, objective {validation[-1]:.3f}")
            selection.append((name, statistics.mean(validation), notes))
            print(f"candidate {name}: mean validation objective {selection[-1][1]:.4f}", file=sys.stderr)
        # min keeps the first of equal scores; CANDIDATES lists the smaller set first.
        chosen = min(selection, key=lambda s: s[1])[0]
        # 2. Refit of the selected set on both Hopper GPUs.
        best, best_score = fit(CANDIDATES[chosen], scorer(TRAIN, args.stride))
        after = summary(*errors(TRAIN, args.stride, best))
        before = summary(*errors(TRAIN, args.stride, {}))
        evaluations, sim_seconds = ev.count, ev.seconds
        select_text = "; ".join(
            f"{name}: mean validation objective {score:.3f} ({' / '.join(notes)})"
            for name, score, notes in selection)
        zero = [n for n in TERMS if n not in CANDIDATES[chosen]]
        provenance = (
            f"fitted {date.today().isoformat()} by benchmarks/fit_host_terms.py on the "
            f"{'/'.join(TRAIN)} vLLM agg rows of aiconfigurator-core 0.12's silicon_sample.csv "
            f"(measured backend; {bound}; objective: median |TTFT err| + median |TPOT err|; "
            f"coordinate descent). "
            f"Terms selected on the training rows only, by two folds by GPU (fit on one Hopper GPU, "
            f"judged on the other, every {args.select_stride}th row of each): {select_text}. "
            f"Selected: {chosen}; {', '.join(zero)} kept at 0 (dp_sync_s: DP rows on H100 only). "
            f"Refitted on every {args.stride}th training row of each GPU: {after} (all terms 0: {before}). "
            f"The held-out {'/'.join(HELD_OUT)} rows were not read before these values were written.")
        print("selection (training rows only):")
        for name, score, notes in selection:
            print(f"  {name}: mean validation objective {score:.4f}")
            for note in notes:
                print(f"    {note}")
        print(f"selected: {chosen}")
        print(f"fitted: {describe(best)} (objective {best_score:.4f})")
        print(f"train (every {args.stride}th of each of {'/'.join(TRAIN)}): with    {after}")
        print(f"                                           without {before}")
        print(f"({time.perf_counter() - t0:,.0f} s, {evaluations} evaluations, "
              f"{sim_seconds:,.0f} s simulating)")
        if not args.dry_run:
            save_host_terms(candidate(best, provenance), DEFAULT_FILE)
            print(f"wrote {DEFAULT_FILE}")
        if args.held_out:
            # Read only now: the terms and their values are fixed.
            held = runs_of(HELD_OUT)
            print(f"held out ({'/'.join(HELD_OUT)}): with    {summary(*ev.errors('held out', held, best))}")
            print(f"                      without {summary(*ev.errors('held out', held, {}))}")
            print(f"({time.perf_counter() - t0:,.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
