"""What calibrate prints and records: the terms before and after, the error
tables of the fitted and held-out runs, and the provenance line of the
written file."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import date

import numpy as np

from kvsched.calibrate.fit import Calibration
from kvsched.calibrate.loss import RunErrors
from kvsched.calibrate.terms import TERM_MEANING
from kvsched.perf.host import TERMS, format_term


def error_line(label: str, e: RunErrors) -> str:
    tm, ta, tb = RunErrors.summary(e.ttft)
    pm, pa, pb = RunErrors.summary(e.tpot)

    def pct(v: float) -> str:
        return "-" if math.isnan(v) else f"{v * 100:.2f}%"

    return (f"{label:<10}{pct(tm):>9}{pct(ta):>9}{pct(tb):>9}   {pct(pm):>9}{pct(pa):>9}{pct(pb):>9}"
            f"   {e.source}")


def error_block(before: Sequence[RunErrors], after: Sequence[RunErrors]) -> list[str]:
    """The error table of some runs, start against fitted, pooled when there
    are several."""
    lines = [ERROR_HEADER]
    for b, a in zip(before, after, strict=True):
        lines += [error_line("start", b), error_line("fitted", a)]
    if len(after) > 1:
        lines += [error_line("start", pooled(before)), error_line("fitted", pooled(after))]
    return lines


ERROR_HEADER = (f"{'':<10}{'TTFT':>9}{'':>9}{'':>9}   {'TPOT':>9}\n"
                f"{'':<10}{'med|err|':>9}{'mean|err|':>9}{'bias':>9}   {'med|err|':>9}{'mean|err|':>9}"
                f"{'bias':>9}   run")


def pooled(errors: Sequence[RunErrors]) -> RunErrors:
    return RunErrors(f"all {len(errors)} runs",
                     np.concatenate([e.ttft for e in errors]) if errors else np.zeros(0),
                     np.concatenate([e.tpot for e in errors]) if errors else np.zeros(0))


def format_report(c: Calibration) -> str:
    # 13 wide: a term fitted to ~0 prints as "7.951e-11 ms" (12 characters).
    lines = ["", f"{'term':<26}{'start':>13}{'fitted':>13}   meaning"]
    for name in TERMS:
        mark = "" if name in c.fitted else "  (not fitted)"
        lines.append(f"{name:<26}{format_term(name, getattr(c.start, name)):>13}"
                     f" {format_term(name, getattr(c.terms, name)):>12}   {TERM_MEANING[name]}{mark}")
    lines.append("")
    lines.append(f"Fit error (relative; {c.fit.iterations} iterations, loss {c.fit.loss:.4g}, "
                 f"{c.simulations} simulations in {c.wall_seconds:.1f} s):")
    lines += error_block(c.fit_before, c.fit_after)
    if c.held_after:
        lines.append("Held-out error (runs the fit never saw):")
        lines += error_block(c.held_before, c.held_after)
    else:
        lines.append("Held-out error: none (give --held-out FILE: a run of the same deployment at "
                     "another rate or concurrency)")
    lines.extend(f"note: {n}" for n in c.notes)
    return "\n".join(lines)


def _errors_text(errors: Sequence[RunErrors]) -> str:
    e = pooled(errors)
    tm, _, tb = RunErrors.summary(e.ttft)
    pm, _, pb = RunErrors.summary(e.tpot)
    return (f"{len(errors)} run(s): TTFT median |err| {tm * 100:.2f}% (bias {tb * 100:+.2f}%), "
            f"TPOT median |err| {pm * 100:.2f}% (bias {pb * 100:+.2f}%)")


def provenance(c: Calibration, fit_files: Sequence[str], held_files: Sequence[str], flags: str,
               start: str) -> str:
    held = (f" Held out {', '.join(held_files)}: {_errors_text(c.held_after)} (start: "
            f"{_errors_text(c.held_before)})." if held_files else " No held-out run.")
    unfitted = [n for n in TERMS if n not in c.fitted]
    return (f"fitted {date.today().isoformat()} by kvsched calibrate ({', '.join(c.fitted)}; loss: "
            "squared relative errors of mean TTFT and TPOT over groups of requests of similar length, "
            f"per run) on {', '.join(fit_files)} with deployment flags [{flags}], starting from "
            f"{start}{' (which gives ' + ', '.join(unfitted) + ')' if unfitted else ''}. Fit: "
            f"{_errors_text(c.fit_after)} (start: {_errors_text(c.fit_before)}).{held}")
