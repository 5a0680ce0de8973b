"""A self-contained HTML report of one or more simulation runs.

:func:`write_report` / :func:`render_report` make one page for labelled
:class:`~kvsched.sim.simulator.SimResult` objects (several are drawn over each
other, one colour per result): the configuration lines given by the caller, a
table of ``vllm bench serve``'s metrics and the engine statistics (one column
per result), latency CDFs (TTFT, TPOT, ITL, E2E latency) and time series of
output throughput, batch composition, KV cache usage and queue lengths; with
prefill/decode disaggregation or KV offloading, their sections
(:mod:`kvsched.report.pd_sections`).

This module assembles the page; :mod:`kvsched.report.charts` draws the charts
(inline SVG, data reduced with numpy first). The page opens offline: no
script, font, stylesheet or image is fetched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kvsched.errors import UserInputError
from kvsched.report.charts import (
    MAX_CDF_POINTS,
    MAX_TIME_BUCKETS,
    PALETTE,
    bucket_width,
    cdf_points,
    color,
    latency_charts,
    over_time_charts,
    run_end,
    text_width,
)
from kvsched.report.charts import esc as _esc
from kvsched.report.pd_sections import offload_section, pd_section, ttft_section
from kvsched.report.style import STYLESHEET
from kvsched.sim.refusals import failure_reasons
from kvsched.sim.simulator import SimResult

# Re-exported: the report's size limits and colours are the charts'.
__all__ = ["MAX_CDF_POINTS", "MAX_TIME_BUCKETS", "PALETTE", "bucket_width", "cdf_points", "format_value",
           "render_report", "write_report"]


# -- numbers --------------------------------------------------------------------

# Metrics shown as percentages (they are fractions in ``SimResult.metrics()``).
FRACTION_KEYS = frozenset({"prefill_token_share", "decode_token_share", "mean_kv_cache_usage",
                           "max_kv_cache_usage", "prefix_cache_hit_rate",
                           "spec_decode_draft_acceptance_rate"})


def format_value(key: str, value: object) -> str:
    """How the summary table prints ``metrics()[key]``: integers with thousands
    separators, fractions (shares, usages, hit rates) as percentages with two
    decimals, other numbers with two decimals (as ``vllm bench serve`` prints)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, list | tuple):  # per-position rates
        return ", ".join(f"{float(v):.3f}" for v in value)
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if isinstance(value, float | np.floating):
        v = float(value)
        if not math.isfinite(v):
            return str(v)
        if key in FRACTION_KEYS:
            return f"{100.0 * v:,.2f}%"
        return f"{v:,.2f}"
    return str(value)


# -- the page -------------------------------------------------------------------

# Summary table: (section, [(metric key, unit, description)]).
METRIC_ROWS: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    ("Requests", (
        ("completed", "", "requests completed"),
        ("failed", "", "requests refused (never scheduled) or timed out (--request-timeout)"),
        ("duration", "s", "benchmark duration: start to the last completion"),
        ("total_input_tokens", "tok", "prompt tokens of completed requests"),
        ("total_output_tokens", "tok", "output tokens of completed requests"),
    )),
    ("Throughput", (
        ("request_throughput", "req/s", "completed requests per second"),
        ("request_goodput", "req/s", "requests meeting every SLO per second"),
        ("output_throughput", "tok/s", "output tokens per second"),
        ("total_token_throughput", "tok/s", "prompt + output tokens per second"),
        ("output_throughput_per_gpu", "tok/s", "output tokens per second per GPU (TP x DP GPUs)"),
        ("total_token_throughput_per_gpu", "tok/s", "prompt + output tokens per second per GPU"),
        ("max_output_tokens_per_s", "tok/s", "most output tokens in one second"),
        ("max_concurrent_requests", "", "most requests in flight in one second"),
    )),
    *((name, tuple((f"{stat}_{metric}_ms", "ms", f"{stat} {name.lower()}")
                   for stat in ("mean", "median", "p90", "p99")))
      for metric, name in (("ttft", "Time to first token"), ("tpot", "Time per output token"),
                           ("itl", "Inter-token latency"), ("e2el", "End-to-end latency"))),
    ("Engine", (
        ("num_steps", "", "engine steps"),
        ("mean_batch_size", "req", "requests per step"),
        ("mean_tokens_per_step", "tok", "tokens per step"),
        ("prefill_token_share", "%", "share of scheduled tokens that were prefill"),
        ("decode_token_share", "%", "share of scheduled tokens that were decode"),
        ("mean_kv_cache_usage", "%", "KV cache usage, time-weighted over busy time"),
        ("max_kv_cache_usage", "%", "highest KV cache usage after a step"),
        ("num_preemptions", "", "requests preempted (recomputed)"),
        ("prefix_cache_hit_rate", "%", "prompt tokens found in the prefix cache"),
    )),
    ("Speculative decoding", (
        ("spec_decode_num_drafts", "", "verifications (a request's drafts of one step)"),
        ("spec_decode_num_draft_tokens", "tok", "draft tokens verified"),
        ("spec_decode_num_accepted_tokens", "tok", "draft tokens accepted"),
        ("spec_decode_draft_acceptance_rate", "%", "accepted / draft tokens"),
        ("spec_decode_mean_acceptance_length", "tok", "1 + accepted / drafts, as vLLM logs it"),
        ("spec_decode_acceptance_rate_per_position", "", "per draft position: accepted there / drafts"),
    )),
)


def _delta(value: object, reference: object) -> str:
    if (isinstance(value, bool) or isinstance(reference, bool)
            or not isinstance(value, int | float) or not isinstance(reference, int | float)):
        return ""
    if reference == 0 or not math.isfinite(reference) or not math.isfinite(value):
        return ""
    change = (value - reference) / abs(reference) * 100.0
    return f"{change:+.1f}%" if abs(change) >= 0.05 else ""


LATENCY_SECTIONS = frozenset(name for name, _ in METRIC_ROWS[2:6])


def _column_heads(labels: Sequence[str]) -> str:
    """One column per run, with its chart colour; a single run's column is
    just its values (its label and colour tell nothing with nothing beside it)."""
    if len(labels) == 1:
        return '<th class="num">value</th>'
    return "".join(f'<th class="num"><span class="swatch" style="background:{color(i)}"></span>'
                   f"{_esc(label)}</th>" for i, label in enumerate(labels))


def _metrics_tables(labels: Sequence[str], metrics: Sequence[Mapping[str, Any]]) -> str:
    """The summary: one row per metric key present in any result, one column
    per result (later columns also show their change against the first)."""
    ncols = 2 + len(labels)
    blocks: list[tuple[str, str]] = []  # (section, rows html)
    for section, rows in METRIC_ROWS:
        body = []
        for key, unit, description in rows:
            if not any(key in m for m in metrics):
                continue
            cells = []
            for i, m in enumerate(metrics):
                value = m.get(key)
                d = f'<span class="d">{_esc(_delta(value, metrics[0].get(key)))}</span>' if i else ""
                cells.append(f'<td class="num" data-key="{_esc(key)}" data-result="{i}">'
                             f'<span class="v">{_esc(format_value(key, value))}</span>{d}</td>')
            body.append(f'<tr><td class="key" title="{_esc(description)}">{_esc(key)}</td>'
                        f'<td class="unit">{_esc(unit)}</td>{"".join(cells)}</tr>')
        if body:
            blocks.append((section, f'<tr class="section"><td colspan="{ncols}">{_esc(section)}</td></tr>'
                           + "".join(body)))
    thead = f"<thead><tr><th>metric</th><th>unit</th>{_column_heads(labels)}</tr></thead>"

    def table(rows: Sequence[str]) -> str:
        return f'<table class="metrics">{thead}<tbody>{"".join(rows)}</tbody></table>'

    value_width = sum(max(80.0, text_width(label, 12.5) + 30) + (60 if i else 0)
                      for i, label in enumerate(labels))
    if 190 + 50 + value_width <= 520:
        # Narrow enough: two tables side by side, latencies on the right.
        left = [rows for name, rows in blocks if name not in LATENCY_SECTIONS]
        right = [rows for name, rows in blocks if name in LATENCY_SECTIONS]
        if left and right:
            return f'<div class="tables two">{table(left)}{table(right)}</div>'
    return f'<div class="tables">{table([rows for _, rows in blocks])}</div>'


def _runs_table(labels: Sequence[str], results: Sequence[SimResult]) -> str:
    several = len(results) > 1
    rows = []
    for i, (label, r) in enumerate(zip(labels, results)):
        name = (f'<td><span class="swatch" style="background:{color(i)}"></span>{_esc(label)}</td>'
                if several else "")
        rows.append(
            f"<tr>{name}<td>{_esc(r.workload)}</td>"
            f'<td class="num">{len(r.records):,}</td><td class="num">{len(r.failed):,}</td>'
            f'<td class="num">{run_end(r):,.2f}</td><td class="num">{r.totals.num_steps:,}</td>'
            f'<td class="num">{r.num_fast_forwarded_steps:,}</td>'
            f'<td class="num">{r.wall_seconds:,.2f}</td></tr>')
    failures = []
    for label, r in zip(labels, results):
        if r.failed:
            shown = r.failed[:20]
            items = "".join(f"<li><code>{_esc(rid)}</code>: {_esc(why)}</li>" for rid, why in shown)
            rest = len(r.failed) - len(shown)
            more = f"<li>... and {rest:,} more</li>" if rest else ""
            reasons = "".join(f"<li>{count:,} &times; {_esc(reason)}</li>"
                              for reason, count in failure_reasons(r.failed).items())
            failures.append(f"<details><summary>{_esc(label) + ': ' if several else ''}"
                            f"{len(r.failed):,} requests failed"
                            f'</summary><p class="note">by reason:</p><ul class="reasons">{reasons}</ul>'
                            f'<p class="note">the first {len(shown):,}:</p><ul>{items}{more}</ul></details>')
    return ('<table class="runs"><thead><tr>' + ("<th>run</th>" if several else "")
            + '<th>workload</th><th class="num">completed</th>'
            '<th class="num">failed</th><th class="num">simulated time (s)</th><th class="num">steps</th>'
            '<th class="num">fast-forwarded steps</th><th class="num">simulation wall time (s)</th>'
            f'</tr></thead><tbody>{"".join(rows)}</tbody></table>{"".join(failures)}')


# A text setting longer than LONG_TEXT characters (a provenance paragraph)
# shows its first sentence, or its first FOLDED_HEAD characters, and folds the
# whole text under it.
LONG_TEXT = 240
FOLDED_HEAD = 100


def _setting(value: object) -> str:
    """A scalar setting as the table prints it (plain text, not yet escaped)."""
    if value is None:
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _text_html(text: str) -> str:
    """A text value; a long one (a provenance paragraph) folds after its first
    sentence so the table stays readable."""
    if len(text) <= LONG_TEXT:
        return _esc(text)
    cut = text.find(". ")
    head = text[:cut + 1] if 0 < cut < FOLDED_HEAD else text[:FOLDED_HEAD].rsplit(" ", 1)[0] + " ..."
    return f'<details class="long"><summary>{_esc(head)}</summary>{_esc(text)}</details>'


def _setting_html(value: object) -> str:
    """A setting's cell content: a scalar as text, a mapping (e.g. the host
    terms) as a small key/value table, a list as one line per item."""
    if isinstance(value, Mapping):
        if not value:
            return "-"
        rows = "".join(f"<tr><th>{_esc(k)}</th><td>{_setting_html(v)}</td></tr>" for k, v in value.items())
        return f'<table class="kv">{rows}</table>'
    if isinstance(value, list | tuple):
        if not value:
            return "-"
        return '<ul class="items">' + "".join(f"<li>{_setting_html(v)}</li>" for v in value) + "</ul>"
    return _text_html(_setting(value))


def _deployment_table(labels: Sequence[str], descriptions: Sequence[Mapping[str, Mapping[str, Any]]]
                      ) -> str:
    """Every setting of each run's deployment and workload (see
    :func:`kvsched.sim.results.describe_run`): one row per setting, one column
    per run; with several runs a value differing from the first run's is
    marked. Mappings and lists are drawn as small tables and lists. The notes
    on which numbers are per rank follow the table."""
    ncols = 1 + len(labels)
    body: list[str] = []
    notes: dict[str, str] = {}
    for part in ("deployment", "workload"):
        groups: dict[str, list[str]] = {}  # section -> setting keys, first-seen order
        for d in descriptions:
            entry = d.get(part, {})
            if part == "workload":
                entry = {"workload": entry}
            for section, settings in entry.items():
                if section == "per_rank":
                    notes.update(settings)
                    continue
                keys = groups.setdefault(section, [])
                keys.extend(k for k in settings if k not in keys)
        for section, keys in groups.items():
            body.append(f'<tr class="section"><td colspan="{ncols}">{_esc(section)}</td></tr>')
            for key in keys:
                values = [_setting_html(_nested(d, part, section, key)) for d in descriptions]
                cells = "".join(
                    f'<td class="num{" changed" if i and v != values[0] else ""}" '
                    f'data-setting="{_esc(section)}.{_esc(key)}" data-result="{i}">{v}</td>'
                    for i, v in enumerate(values))
                body.append(f'<tr><td class="key">{_esc(key)}</td>{cells}</tr>')
    note_items = "".join(f"<li><b>{_esc(k)}</b>: {_esc(v)}</li>" for k, v in notes.items())
    head = f"<thead><tr><th>setting</th>{_column_heads(labels)}</tr></thead>"
    return (f'<table class="metrics deployment">{head}'
            f'<tbody>{"".join(body)}</tbody></table>'
            + (f'<ul class="notes">{note_items}</ul>' if note_items else ""))


def _nested(description: Mapping[str, Mapping[str, Any]], part: str, section: str, key: str) -> object:
    entry = description.get(part, {})
    settings = entry if part == "workload" else entry.get(section, {})
    return settings.get(key) if isinstance(settings, Mapping) else None


def render_report(results: Sequence[tuple[str, SimResult]], title: str, config_lines: Sequence[str] = (),
                  *, metrics: Sequence[Mapping[str, Any]] | None = None,
                  goodput_slos: dict[str, float] | None = None,
                  descriptions: Sequence[Mapping[str, Mapping[str, Any]]] | None = None) -> str:
    """The report page as one HTML string (see :func:`write_report`)."""
    if not results:
        raise UserInputError("render_report: no results; give at least one (label, SimResult)")
    labels = [label for label, _ in results]
    dupes = sorted({label for label in labels if labels.count(label) > 1})
    if dupes:
        raise UserInputError(f"render_report: labels must differ, {', '.join(map(repr, dupes))} given twice")
    runs = [r for _, r in results]
    if metrics is None:
        metrics = [r.metrics(goodput_slos=goodput_slos) for r in runs]
    elif len(metrics) != len(runs):
        raise UserInputError(f"render_report: {len(metrics)} metrics dicts for {len(runs)} results")
    if descriptions is not None and len(descriptions) != len(results):
        raise UserInputError(f"render_report: {len(descriptions)} run descriptions for "
                             f"{len(results)} results")

    cdf_html = [f'<figure><h3>{_esc(long)} <span class="note">({_esc(short)})</span></h3>{svg}</figure>'
                for long, short, svg in latency_charts(labels, runs)]
    time_html = [f'<figure><h3>{_esc(name)}</h3><p class="note">{_esc(note)}</p>{svg}</figure>'
                 for name, note, svg in over_time_charts(labels, runs)]

    ran = ""
    if config_lines:
        items = "".join(f"<li>{_esc(line)}</li>" for line in config_lines)
        ran = f'<ul class="ran">{items}</ul>'
    settings = ""
    if descriptions:
        marked = "" if len(runs) == 1 else "; values that differ from the first run's are marked"
        settings = (f'<section class="card"><h2>Deployment and workload</h2><p class="note">As simulated, '
                    f"vLLM's defaults resolved{marked}.</p>"
                    f"{_deployment_table(labels, descriptions)}</section>")
    what = "one run" if len(runs) == 1 else f"{len(runs)} runs compared; deltas are against the first"
    # What a reader looks for first comes first: what ran and how it went,
    # the charts, the numbers; every setting last.
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_esc(title)}</title><style>{STYLESHEET}</style></head><body><main>",
        f'<header><h1>{_esc(title)}</h1><p class="sub">kvsched serving simulation report: {_esc(what)}</p>'
        f"{ran}</header>",
        f'<section class="card"><h2>Runs</h2>{_runs_table(labels, runs)}</section>',
        f'<section class="card"><h2>Latency distributions</h2><p class="note">Cumulative share of '
        f"requests (of output tokens for ITL) at or below each latency.</p>"
        f'<div class="grid2">{"".join(cdf_html)}</div></section>',
        f'<section class="card"><h2>Over time</h2>{"".join(time_html)}</section>',
        ttft_section(labels, metrics),
        pd_section(labels, metrics),
        offload_section(labels, metrics),
        f'<section class="card"><h2>Summary</h2><p class="note">vllm bench serve\'s metric names; '
        f"latencies in milliseconds, percentiles as numpy computes them.</p>"
        f"{_metrics_tables(labels, metrics)}</section>",
        settings,
        "<footer>Generated by kvsched. Self-contained: charts are inline SVG; nothing is loaded from "
        "elsewhere.</footer>",
        "</main></body></html>",
        "",
    ])


def write_report(path: str | Path, results: Sequence[tuple[str, SimResult]], title: str,
                 config_lines: Sequence[str] = (), *, metrics: Sequence[Mapping[str, Any]] | None = None,
                 goodput_slos: dict[str, float] | None = None,
                 descriptions: Sequence[Mapping[str, Mapping[str, Any]]] | None = None) -> None:
    """Write the HTML report of ``results`` (``(label, result)`` pairs, drawn
    over each other in that order) to ``path``.

    ``config_lines`` are shown as given under the title (model, hardware,
    parallelism, scheduler settings, workload ...). ``metrics``: each
    result's ``result.metrics()`` if the caller has them already (they cost
    about a second for a one-hour run); otherwise they are computed here, with
    ``goodput_slos`` if given. ``descriptions``: each result's deployment and
    workload (:func:`kvsched.sim.results.describe_run`), shown as a table."""
    page = render_report(results, title, config_lines, metrics=metrics, goodput_slos=goodput_slos,
                         descriptions=descriptions)
    Path(path).write_text(page, encoding="utf-8")
