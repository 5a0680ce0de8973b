"""kvsched against real vLLM serving runs, with AIConfigurator's estimate of the same rows.

Every vLLM aggregated row of aiconfigurator-core's ``silicon_sample.csv``
(measured mean TTFT and TPOT) is simulated as InferenceX's client ran it
(``kvsched.validation.silicon``) with each chosen step-time backend, and estimated
by AIConfigurator (aiconfigurator-core's vLLM agg model) in the same run.
Rows a predictor cannot price are counted with the reason; the error tables
compare the predictors on the rows all of them priced.

    python benchmarks/validate_silicon.py                      # every row, roofline + AIC
    python benchmarks/validate_silicon.py --system h100_sxm --system h200_sxm --system b200_sxm \\
        --json silicon.json --update-doc docs/validation.md
    python benchmarks/validate_silicon.py --model llama-3.1-70b --limit 10 --backend measured
    python benchmarks/validate_silicon.py --from-json a.json --from-json b.json --update-doc DOC.md

``--from-json`` simulates nothing: it writes the tables of runs saved with
``--json``, merging each row's predictions from every file (e.g. one run with
the roofline and AIConfigurator, others with the measured backend, in
parallel processes); every row must then have every predictor.

Needs aiconfigurator-core (``pip install -e ".[measured]"``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import logging
import re
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvsched.validation.aic_estimate import AicEstimate, AicEstimator
from kvsched.validation.errors import ErrorStats, rel_err
from kvsched.validation.silicon import (
    CONCURRENCY_BANDS,
    RowResult,
    SimulatedRow,
    concurrency_band,
    evaluate_row,
)
from kvsched.validation.silicon_rows import Refusal, SiliconRow, load_rows, map_row

BACKENDS = ("roofline", "measured")
BEGIN, END = "<!-- silicon:begin -->", "<!-- silicon:end -->"
PROGRESS_EVERY_S = 5.0
GPU_NAMES = {"h100_sxm": "H100 SXM", "h200_sxm": "H200 SXM", "b200_sxm": "B200 SXM", "b300_sxm": "B300 SXM"}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--system", action="append", metavar="NAME",
                   help="only rows of this aiconfigurator system (h100_sxm, h200_sxm, b200_sxm, b300_sxm); "
                        "repeatable (default: all)")
    p.add_argument("--model", action="append", metavar="TEXT",
                   help="only rows whose model_path contains TEXT (any case); repeatable")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N rows after the filters")
    p.add_argument("--stride", type=int, default=1, metavar="N",
                   help="only every N-th row after the filters, in the CSV's order (default 1: every row)")
    p.add_argument("--backend", action="append", choices=BACKENDS,
                   help="kvsched step-time backend; repeatable (default: measured and roofline)")
    p.add_argument("--no-aic", action="store_true", help="skip AIConfigurator's estimates")
    p.add_argument("--json", metavar="OUT.json", help="write every row's inputs and results")
    p.add_argument("--update-doc", metavar="DOC.md",
                   help=f"rewrite the part of DOC.md between {BEGIN} and {END}")
    p.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")
    p.add_argument("--from-json", action="append", metavar="RUN.json",
                   help="simulate nothing: the tables of runs saved with --json, each row's predictions "
                        "merged over the files; repeatable")
    args = p.parse_args(argv)
    if args.from_json and (args.system or args.model or args.limit or args.stride != 1 or args.backend
                           or args.no_aic or args.json):
        p.error("--from-json takes the rows, backends and AIConfigurator's estimates from the files; "
                "leave out --system, --model, --limit, --stride, --backend, --no-aic and --json")
    args.backend = list(dict.fromkeys(args.backend or ["measured", "roofline"]))
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit={args.limit}: must be at least 1; leave it out for every row")
    if args.stride < 1:
        p.error(f"--stride={args.stride}: must be at least 1 (1: every row)")
    return args


def select_rows(rows: list[SiliconRow], args: argparse.Namespace) -> list[SiliconRow]:
    if args.system:
        known = sorted({r.system for r in rows})
        for s in args.system:
            if s not in known:
                raise ValueError(f"--system={s!r}: no vLLM agg rows for it; use one of {', '.join(known)}")
        rows = [r for r in rows if r.system in args.system]
    if args.model:
        wanted = [m.lower() for m in args.model]
        rows = [r for r in rows if any(w in r.model_path.lower() for w in wanted)]
        if not rows:
            raise ValueError(f"--model={args.model!r}: matches no row's model_path")
    rows = rows[::args.stride]
    return rows[:args.limit] if args.limit else rows


# --------------------------------------------------------------------------
# Running


@dataclasses.dataclass(slots=True)
class Timing:
    load_s: float = 0.0
    parts: dict[str, float] = dataclasses.field(default_factory=dict)
    slowest: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)

    def add(self, row_id: str, part: str, seconds: float) -> None:
        self.parts[part] = self.parts.get(part, 0.0) + seconds
        self.slowest.append((seconds, part, row_id))


def run_rows(rows: list[SiliconRow], backends: list[str], aic: AicEstimator | None, timing: Timing,
             progress: bool) -> list[RowResult]:
    results: list[RowResult] = []
    t0 = last = time.perf_counter()
    for i, row in enumerate(rows, 1):
        def record(part: str, seconds: float, row_id: str = row.id) -> None:
            timing.add(row_id, part, seconds)

        results.append(evaluate_row(row, backends, aic, record))
        now = time.perf_counter()
        if progress and (now - last >= PROGRESS_EVERY_S or i == len(rows)):
            last = now
            print(f"[{i}/{len(rows)}] {now - t0:,.0f} s: {row.id}", file=sys.stderr, flush=True)
    return results


# --------------------------------------------------------------------------
# Tables


Predictor = tuple[str, Callable[[RowResult], tuple[float, float] | None]]


def predictors(backends: list[str], with_aic: bool) -> list[Predictor]:
    out: list[Predictor] = []
    for b in backends:
        def kv(r: RowResult, b: str = b) -> tuple[float, float] | None:
            s = r.kvsched.get(b)
            return (s.mean_ttft_ms, s.mean_tpot_ms) if isinstance(s, SimulatedRow) else None
        out.append((f"kvsched {b}", kv))
    if with_aic:
        def aic(r: RowResult) -> tuple[float, float] | None:
            return (r.aic.ttft_ms, r.aic.tpot_ms) if isinstance(r.aic, AicEstimate) else None
        out.append(("AIConfigurator", aic))
    return out


def pct(x: float) -> str:
    return f"{x * 100:+.1f} %" if x < 0 or x > 0 else "0.0 %"


def apct(x: float) -> str:
    return f"{x * 100:.1f} %"


GROUPINGS: list[tuple[str, Callable[[SiliconRow], str]]] = [
    ("GPU", lambda r: GPU_NAMES.get(r.system, r.system)),
    ("model", lambda r: r.model_path),
    ("precision", lambda r: r.precision or "checkpoint (bf16)"),
    ("concurrency", lambda r: concurrency_band(r.concurrency)),
]


def error_table(label: str, key: Callable[[SiliconRow], str], common: list[RowResult],
                preds: list[Predictor], order: list[str] | None = None) -> list[str]:
    lines = [f"| {label} | predictor | n | TTFT MAPE | TTFT median abs | TTFT bias | "
             "TPOT MAPE | TPOT median abs | TPOT bias |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups: dict[str, list[RowResult]] = {}
    for r in common:
        groups.setdefault(key(r.row), []).append(r)
    names = order if order is not None else sorted(groups)
    for g in [n for n in names if n in groups]:
        for name, get in preds:
            ttft, tpot = [], []
            for r in groups[g]:
                p = get(r)
                assert p is not None  # common rows are priced by every predictor
                ttft.append(rel_err(p[0], r.row.ttft_ms))
                tpot.append(rel_err(p[1], r.row.tpot_ms))
            a, b = ErrorStats.of(ttft), ErrorStats.of(tpot)
            lines.append(f"| {g} | {name} | {a.n} | {apct(a.mape)} | {apct(a.median_abs)} | {pct(a.bias)} | "
                         f"{apct(b.mape)} | {apct(b.median_abs)} | {pct(b.bias)} |")
    return lines


def reason_of(value: object) -> str | None:
    return value.reason if isinstance(value, Refusal) else None


def _kvsched_reason(backend: str) -> Callable[[RowResult], str | None]:
    return lambda r: reason_of(r.kvsched.get(backend))


def report(results: list[RowResult], backends: list[str], with_aic: bool, command: str,
           wall_s: float, sources: str = "") -> str:
    preds = predictors(backends, with_aic)
    common = [r for r in results if all(get(r) is not None for _, get in preds)]
    systems = list(dict.fromkeys(r.row.system for r in results))
    out: list[str] = []
    today = datetime.date.today().isoformat()
    try:
        aic_version = importlib.metadata.version("aiconfigurator-core")
    except importlib.metadata.PackageNotFoundError:
        aic_version = "?"
    db_versions = sorted({r.aic.database_version for r in results if isinstance(r.aic, AicEstimate)})
    origin = f" from the runs {sources}" if sources else ""
    out.append(f"Generated by `{command}`{origin} on {today} in {wall_s:,.0f} s (aiconfigurator-core "
               f"{aic_version}; AIConfigurator's vLLM tables "
               f"{', '.join(db_versions) or 'not used'}).")
    out.append("")
    # Counts.
    head = "| GPU | vLLM agg rows | " + " | ".join(f"kvsched {b} simulates" for b in backends)
    head += " | AIConfigurator estimates | priced by all |" if with_aic else " | priced by all |"
    out += [head, "|" + "---|" * (3 + len(backends) + (1 if with_aic else 0))]
    for s in [*systems, None]:
        rows = [r for r in results if s is None or r.row.system == s]
        cells = [f"{sum(isinstance(r.kvsched.get(b), SimulatedRow) for r in rows)}" for b in backends]
        if with_aic:
            cells.append(f"{sum(isinstance(r.aic, AicEstimate) for r in rows)}")
        both = sum(r in common for r in rows)
        name = "**all**" if s is None else GPU_NAMES.get(s, s)
        out.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + f" | {both} |")
    out.append("")
    # Reasons.
    reasons: list[tuple[str, Callable[[RowResult], str | None]]] = [
        (f"kvsched {b}", _kvsched_reason(b)) for b in backends]
    if with_aic:
        reasons.append(("AIConfigurator", lambda r: reason_of(r.aic)))
    for title, get_reason in reasons:
        tally = Counter(x for r in results if (x := get_reason(r)) is not None)
        if not tally:
            continue
        out += [f"Rows {title} does not price, by reason:", "", "| reason | rows | e.g. |", "|---|---|---|"]
        for reason, n in tally.most_common():
            example = next(r for r in results if get_reason(r) == reason)
            detail = _example_detail(example, title, reason)
            out.append(f"| {reason} | {n} | {detail} |")
        out.append("")
    # Which pricing priced each simulated row (a backend asked for by name
    # prices every row it can; "auto" may fall back).
    for b in backends:
        labels = Counter(v.pricing or "not recorded" for r in results
                         if isinstance(v := r.kvsched.get(b), SimulatedRow))
        if labels:
            out.append(f"kvsched {b}: rows by pricing: "
                       + ", ".join(f"{label} {n}" for label, n in labels.most_common()) + ".")
            out.append("")
    if not common:
        out.append("No row was priced by every predictor.")
        return "\n".join(out)
    # Errors.
    out += [f"Errors on the {len(common)} rows every predictor priced (error = (predicted − measured) / "
            "measured; bias = mean signed error, negative = predicts less time than measured):", ""]
    out += error_table("rows", lambda r: "all", common, preds)
    for label, key in GROUPINGS:
        order = [b[0] for b in CONCURRENCY_BANDS] if label == "concurrency" else None
        out += ["", f"Per {label}:", ""]
        out += error_table(label, key, common, preds, order)
    # Largest errors, for a look at the rows themselves.
    first = preds[0]
    worst = sorted(common, key=lambda r: -abs(rel_err(_p(first, r)[0], r.row.ttft_ms)))[:8]
    out += ["", f"Largest TTFT errors of {first[0]} (ms; measured / predicted):", "",
            "| row id | CONC | measured TTFT | " + " | ".join(f"{n} TTFT" for n, _ in preds)
            + " | measured TPOT | " + " | ".join(f"{n} TPOT" for n, _ in preds) + " |",
            "|" + "---|" * (4 + 2 * len(preds))]
    for r in worst:
        out.append(f"| `{r.row.id}` | {r.row.concurrency} | {r.row.ttft_ms:,.1f} | "
                   + " | ".join(f"{_p(p, r)[0]:,.1f}" for p in preds)
                   + f" | {r.row.tpot_ms:,.2f} | " + " | ".join(f"{_p(p, r)[1]:,.2f}" for p in preds) + " |")
    return "\n".join(out)


def _p(pred: Predictor, r: RowResult) -> tuple[float, float]:
    value = pred[1](r)
    assert value is not None
    return value


def _example_detail(r: RowResult, title: str, reason: str) -> str:
    value: object = r.aic if title == "AIConfigurator" else r.kvsched.get(title.removeprefix("kvsched "))
    detail = value.detail if isinstance(value, Refusal) else ""
    # Paths inside the venv say nothing about the row; keep the message short.
    detail = re.sub(r" at /\S+", "", detail)
    detail = detail if len(detail) <= 140 else detail[:137] + "..."
    return detail.replace("|", "/")


# --------------------------------------------------------------------------
# Output


def to_json(value: Any) -> Any:
    if isinstance(value, Refusal):
        return {"refused": value.reason, "detail": value.detail}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def _prediction(value: dict[str, Any], kind: type[SimulatedRow] | type[AicEstimate]) -> Any:
    if "refused" in value:
        return Refusal(value["refused"], value["detail"])
    if kind is SimulatedRow:
        return SimulatedRow(**{**value, "notes": tuple(value["notes"])})
    return AicEstimate(**value)


def load_runs(paths: Sequence[str]) -> tuple[list[RowResult], list[str], bool, str, float]:
    """Rows, backends, whether AIConfigurator is in, the source commands and
    their wall seconds, merged from runs saved with ``--json``."""
    results: dict[str, RowResult] = {}
    backends: list[str] = []
    sources: list[str] = []
    wall = 0.0
    with_aic = False
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"--from-json={path}: cannot be read as a saved run ({e})") from None
        sources.append(f"`{data['command']}` ({data['wall_seconds']:,.0f} s)")
        wall += data["wall_seconds"]
        backends += [b for b in data["backends"] if b not in backends]
        for saved in data["rows"]:
            row = SiliconRow(**saved["row"])
            result = results.setdefault(row.id, RowResult(row, map_row(row)))
            for backend, value in saved["kvsched"].items():
                result.kvsched[backend] = _prediction(value, SimulatedRow)
            if saved["aic"] is not None:
                with_aic = True
                result.aic = _prediction(saved["aic"], AicEstimate)
    for r in results.values():
        missing = [b for b in backends if b not in r.kvsched]
        missing += ["AIConfigurator"] if with_aic and r.aic is None else []
        if missing:
            raise ValueError(f"--from-json: row {r.row.id} has no {', '.join(missing)} in any file; "
                             "give a file with every row for each predictor")
    return list(results.values()), backends, with_aic, " + ".join(sources), wall


def update_doc(path: str, body: str) -> None:
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise ValueError(f"--update-doc={path}: needs a line {BEGIN} and, after it, {END}; "
                         "add them where the tables go")
    start = text.index(BEGIN) + len(BEGIN)
    p.write_text(text[:start] + "\n" + body.rstrip() + "\n" + text[text.index(END):], encoding="utf-8")


def timing_summary(timing: Timing, aic: AicEstimator | None, wall_s: float, n: int) -> str:
    lines = [f"wall {wall_s:,.1f} s for {n} rows; loading the CSV {timing.load_s:.2f} s"]
    for part, seconds in sorted(timing.parts.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {part}: {seconds:,.1f} s")
    if aic is not None:
        parts = ", ".join(f"{k} {v:,.1f} s" for k, v in aic.timings.items())
        lines.append(f"  of which AIConfigurator: {parts}")
    lines.append("  slowest rows: " + "; ".join(f"{row_id} ({part}) {s:.2f} s"
                                                 for s, part, row_id in sorted(timing.slowest)[::-1][:5]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # aiconfigurator logs a warning per fallback it takes; the reasons that
    # matter end up in the rows' results.
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    command = "python benchmarks/validate_silicon.py" + "".join(
        f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    if args.from_json:
        merged, backends, with_aic, sources, source_wall = load_runs(args.from_json)
        body = report(merged, backends, with_aic, command, source_wall, sources)
        print(body)
        if args.update_doc:
            update_doc(args.update_doc, body)
        return 0
    t0 = time.perf_counter()
    timing = Timing()
    rows = select_rows(load_rows(), args)
    timing.load_s = time.perf_counter() - t0
    aic = None if args.no_aic else AicEstimator()
    results = run_rows(rows, args.backend, aic, timing, not args.no_progress)
    wall = time.perf_counter() - t0
    body = report(results, args.backend, aic is not None, command, wall)
    print(body)
    print(timing_summary(timing, aic, wall, len(rows)), file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"command": command, "wall_seconds": wall, "backends": args.backend,
                       "rows": [to_json(r) for r in results]}, f, indent=1)
            f.write("\n")
    if args.update_doc:
        update_doc(args.update_doc, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
