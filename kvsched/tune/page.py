"""``kvsched tune --report FILE.html``: the search's answer as one self-contained page.

The question (model, hardware, budget, workload, SLO, objective and what the
search ran), the Pareto plot of goodput per GPU against the first SLO's
statistic, the ranked table, and the ``vllm serve`` / ``kvsched simulate``
lines of the best deployment and of each Pareto point. Same look and same
rules as the simulator's report (:mod:`kvsched.report.simulate_page`): inline SVG and
CSS, nothing fetched.
"""

from __future__ import annotations

import argparse
import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvsched.report.charts import PALETTE, Axis, Mark, Series, esc, scatter_chart
from kvsched.report.style import STYLESHEET
from kvsched.sim.workload import Workload
from kvsched.tune.search import Evaluated, Problem, TuneResult, rate_grid

MET, MISSED, FRONT, BEST, TARGET = PALETTE[0], PALETTE[3], "#1f2430", PALETTE[1], PALETTE[3]
# The y axis turns logarithmic when the plotted values span more than this.
LOG_SPAN = 20.0
_EXTRA_CSS = """
code { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; background: #f0f2f5; padding: 2px 5px; border-radius: 4px; overflow-wrap: anywhere;
  white-space: pre-wrap; }  /* a P/D answer: one line per instance, then the proxy */
dl.cmds dt { font-weight: 600; margin-top: 10px; } dl.cmds dd { margin: 3px 0 0 0; }
tr.best td { background: #fff4e0; } td.met { color: #2f7d32; } td.missed { color: #b3261e; }
svg.chart .callout-label { fill: var(--fg); font-weight: 600; }
"""


@dataclass(frozen=True, slots=True)
class Question:
    """What the page says was asked, besides the :class:`Problem`."""

    hardware: Sequence[str]
    max_gpus: int
    workload: str                       # where the requests come from, and their shape
    rate: str                           # the rate asked for, in words
    num_candidates: int                 # the space's candidates within the budget
    find_max_rate: bool = False


def question_from_args(args: argparse.Namespace, workload: Workload, base_rate: float,
                       num_candidates: int) -> Question:
    """The header of ``kvsched tune``'s report, from its flags."""
    n, conc = len(workload.requests), args.max_concurrency
    tail = f", max concurrency {conc}" if conc else ""
    if args.dataset_name == "random":
        what = (f"{n} random prompts ({_len(args.random_input_len)} in / "
                f"{_len(args.random_output_len)} out"
                + (f", range ratio {args.random_range_ratio:g}" if args.random_range_ratio else "")
                + (f", shared prefix {args.random_prefix_len}" if args.random_prefix_len else "")
                + f", seed {args.seed}{tail})")
    else:
        what = (f"{n} requests of the {args.dataset_name} trace {args.dataset_path} over "
                f"{workload.last_arrival_time:,.0f} s ({base_rate:.3g} req/s){tail}")
    how = "--request-rate" if args.dataset_name == "random" else "the trace rescaled in time"
    if args.find_max_rate:
        grid = rate_grid(base_rate)
        rate = (f"per deployment, the highest rate meeting the SLO (binary search over "
                f"{grid[0]:.3g} to {grid[-1]:.3g} req/s, {how})")
    elif args.target_rate is not None:
        rate = f"{args.target_rate:g} req/s ({how})"
    elif args.dataset_name == "random" and args.request_rate is not None:
        rate = f"{args.request_rate:g} req/s (--request-rate)"
    else:
        rate = "as given: " + ("all requests at t=0" if args.dataset_name == "random"
                               else f"the trace's own arrival times (x{args.time_scale:g})")
    return Question(list(args.hardware), args.max_gpus, what, rate, num_candidates, args.find_max_rate)


def _len(value: int | None) -> str:
    return "default" if value is None else str(value)


def _stat(problem: Problem) -> str:
    p = problem.slo.percentile
    return "mean" if p == "mean" else f"p{p}"


def _y(problem: Problem, e: Evaluated) -> float:
    value = e.metrics.get(problem.slo.key(problem.slo.targets[0][0]))
    return float(value) if isinstance(value, int | float) else math.nan


def _front_steps(problem: Problem, front: Sequence[Evaluated]) -> tuple[list[float], list[float]]:
    """The staircase bounding what the front dominates: up, then right, from
    the lowest goodput to the highest."""
    pts = sorted({(e.goodput_per_gpu, _y(problem, e)) for e in front})
    xs, ys = [pts[0][0]] if pts else [], [pts[0][1]] if pts else []
    for x, y in pts[1:]:
        xs += [xs[-1], x]
        ys += [y, y]
    return xs, ys


def pareto_chart(problem: Problem, result: TuneResult, question: Question) -> tuple[str, str]:
    """(svg, note): every answered deployment with full metrics as a point."""
    slo, stat = problem.slo, _stat(problem)
    name, target = slo.targets[0]
    shown = [e for e in result.ranked if not e.stopped and math.isfinite(_y(problem, e))]
    stopped = sum(1 for e in result.ranked if e.stopped)
    blank = len(result.ranked) - len(shown) - stopped
    at: dict[tuple[float, float], list[str]] = {}
    for e in shown:
        at.setdefault((e.goodput_per_gpu, _y(problem, e)), []).append(e.candidate.label())

    def title(e: Evaluated) -> str:
        same = [x for x in at[(e.goodput_per_gpu, _y(problem, e))] if x != e.candidate.label()]
        return (f"{e.candidate.label()}: {e.goodput_per_gpu:.3g} req/s/GPU, {stat} {name} "
                f"{_y(problem, e):,.1f} ms, {'meets' if e.meets_slo else 'misses'} the SLO"
                + (f" (same point: {'; '.join(same)})" if same else ""))

    marks = [Mark(e.goodput_per_gpu, _y(problem, e), title(e), MET if e.meets_slo else MISSED,
                  "dot" if e.meets_slo else "cross", "met" if e.meets_slo else "missed") for e in shown]
    ys = [m.y for m in marks if m.y > 0] + [target]
    log = min(ys) > 0 and max(ys) / min(ys) > LOG_SPAN
    fx, fy = _front_steps(problem, result.pareto)
    lines = [Series("Pareto front", np.array(fx), np.array(fy), FRONT)] if fx else []
    best = result.best
    callout = None
    if best is not None and best in shown:
        m = marks[shown.index(best)]
        callout = (Mark(m.x, m.y, m.title, BEST), f"best: {best.candidate.label()}")
    per = " (at each deployment's highest rate meeting the SLO)" if question.find_max_rate else ""
    svg = scatter_chart(
        "pareto", marks, Axis(f"goodput per GPU (req/s/GPU){per}"),
        Axis(f"{stat} {name.upper()} (ms{', log scale' if log else ''})", log=log),
        lines=lines, hlines=[(target, f"SLO: {stat} {name} {target:g} ms", TARGET)], callout=callout,
        legend=[("meets the SLO", "dot", MET), ("misses the SLO", "cross", MISSED),
                ("Pareto front", "line", FRONT), ("SLO target", "dash", TARGET), ("best", "ring", BEST)],
        description=f"Goodput per GPU against {stat} {name} for every deployment simulated")
    notes = [f"{len(shown)} deployments plotted"]
    if stopped:
        notes.append(f"{stopped} stopped early (the SLO surely missed, so no full metrics) are not plotted")
    if blank:
        notes.append(f"{blank} without a {stat} {name} value are not plotted")
    return svg, "; ".join(notes) + "."


def _table(problem: Problem, result: TuneResult) -> str:
    slo, stat = problem.slo, _stat(problem)
    front = {id(e) for e in result.pareto}
    head = "".join(f'<th class="num">{esc(stat)} {esc(n)} (ms, &le; {t:g})</th>' for n, t in slo.targets)
    # Failed requests (refused, or timed out with --request-timeout), where any candidate has them.
    failures = any(e.metrics.get("failed") for e in result.ranked)
    if failures:
        head += '<th class="num">failed requests</th>'
    rows = []
    for i, e in enumerate(result.ranked, 1):
        cells = "".join(f'<td class="num">{_ms(e.metrics.get(slo.key(n)))}</td>' for n, _ in slo.targets)
        if failures:
            failed = e.metrics.get("failed")
            cells += f'<td class="num">{"-" if failed is None else failed}</td>'
        tags = " (best)" if e is result.best else " (Pareto)" if id(e) in front else ""
        best = ' class="best"' if e is result.best else ""
        rows.append(
            f'<tr{best}><td class="num">{i}</td>'
            f'<td>{esc(e.candidate.label())}{tags}</td><td class="num">{e.num_gpus}</td>'
            f'<td class="num">{"-" if e.rate is None else f"{e.rate:.3g}"}</td>'
            f'<td class="num">{e.goodput_per_gpu:.3f}</td>{cells}'
            f'<td class="{"met" if e.meets_slo else "missed"}">{"met" if e.meets_slo else "missed"}</td>'
            f"<td>{esc(e.stopped or '-')}</td>"
            f"<td title=\"{esc(e.pricing.detail if e.pricing else '')}\">"
            f"{esc(e.pricing.describe() if e.pricing else '-')}</td></tr>")
    return ('<table class="ranked"><thead><tr><th class="num">#</th><th>deployment</th>'
            '<th class="num">GPUs</th><th class="num">rate (req/s)</th>'
            f'<th class="num">goodput/GPU (req/s)</th>{head}<th>SLO</th><th>stopped early</th>'
            '<th>step pricing</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


def _gpus(n: int) -> str:
    return f"{n} GPU{'s' if n != 1 else ''}"


def _ms(value: object) -> str:
    return f"{value:,.1f}" if isinstance(value, int | float) and math.isfinite(value) else "-"


def _commands(problem: Problem, result: TuneResult) -> str:
    chosen = [("best", result.best)] if result.best else [("closest (misses the SLO)", result.closest)]
    chosen += [("Pareto", e) for e in result.pareto if e is not result.best]
    goodput = " ".join(f"{n}:{t:g}" for n, t in problem.slo.targets)
    items = []
    for what, e in chosen:
        if e is None:
            continue
        items.append(f"<dt>{esc(what)}: {esc(e.candidate.label())} on {_gpus(e.num_gpus)} "
                     f"({e.goodput_per_gpu:.3f} req/s/GPU)</dt>"
                     f"<dd><code>{esc(problem.vllm_serve(e.candidate))}</code></dd>"
                     f"<dd><code>kvsched simulate {esc(shlex.join(e.argv))}</code></dd>")
    if not items:
        return '<p class="note">No deployment was answered.</p>'
    return (f'<p class="note">Each deployment\'s <code>vllm serve</code> line, and the <code>kvsched '
            f"simulate</code> line reproducing its numbers (add <code>--goodput {esc(goodput)}</code> "
            f'for request_goodput).</p><dl class="cmds">{"".join(items)}</dl>')


def _skipped(result: TuneResult) -> str:
    out = []
    for what, items in (("pruned by memory (never simulated)", result.pruned),
                        ("failed (could not serve the load)", result.failed)):
        if items:
            lis = "".join(f"<li>{esc(c.label())}: {esc(why)}</li>" for c, why in items)
            out.append(f"<details><summary>{len(items)} {esc(what)}</summary><ul>{lis}</ul></details>")
    return "".join(out)


def render_tune_report(problem: Problem, result: TuneResult, question: Question, version: str) -> str:
    """The page as one HTML string."""
    slo, stat = problem.slo, _stat(problem)
    facts = [
        ("model", problem.model), ("vLLM release", problem.base.engine.vllm_version),
        ("hardware", ", ".join(question.hardware)),
        ("GPU budget", f"up to {question.max_gpus} GPUs per deployment"),
        ("workload", question.workload), ("rate", question.rate),
        ("SLO", ", ".join(f"{stat} {n} &le; {t:g} ms" for n, t in slo.targets)),
        ("objective", problem.objective),
        ("search", f"{question.num_candidates} candidates, {len(result.ranked)} answered; "
                   f"{result.num_simulations} simulations, {result.num_cached} cached; "
                   f"{len(result.pruned)} pruned by memory, {len(result.failed)} failed"),
        ("kvsched", version)]
    items = "".join(f"<li><b>{esc(k)}:</b> {v if k == 'SLO' else esc(v)}</li>" for k, v in facts)
    svg, note = pareto_chart(problem, result, question)
    first = slo.targets[0][0]
    if result.best is not None:
        answer = f"Best: {result.best.candidate.label()} on {_gpus(result.best.num_gpus)}."
    elif result.closest is not None:
        answer = f"No deployment meets the SLO; the closest is {result.closest.candidate.label()}."
    else:
        answer = "No deployment was answered."
    title = f"kvsched tune: {problem.model}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{STYLESHEET}{_EXTRA_CSS}</style></head><body><main>",
        f'<header><h1>{esc(title)}</h1><p class="sub">{esc(answer)}</p></header>',
        f'<section class="card"><h2>The question</h2><ul class="config">{items}</ul></section>',
        f'<section class="card"><h2>Pareto front</h2><p class="note">Goodput per GPU against {esc(stat)} '
        f"{esc(first)}; the front: deployments meeting the SLO that no other beats on both. "
        f'{esc(note)}</p><figure>{svg}</figure></section>',
        f'<section class="card"><h2>Commands</h2>{_commands(problem, result)}</section>',
        f'<section class="card"><h2>Ranked</h2><p class="note">Meeting the SLO first, by the objective; '
        f"then the rest by how far they miss.</p>{_table(problem, result)}{_skipped(result)}</section>",
        "<footer>Generated by kvsched tune. Self-contained: the chart is inline SVG; nothing is loaded "
        "from elsewhere.</footer>",
        "</main></body></html>",
        "",
    ])


def write_tune_report(path: str | Path, problem: Problem, result: TuneResult, question: Question,
                      version: str) -> None:
    Path(path).write_text(render_tune_report(problem, result, question, version), encoding="utf-8")
