"""The report's TTFT split, prefill/decode and KV offloading sections, drawn
from the results' ``ttft_parts_ms``, ``ttft_split_ms``, ``kv_transfer``,
``role_utilisation``, ``kv_offload`` / ``prefix_cache_hit_rate_by_tier`` and
``kv_offload_by_role`` keys (see :func:`kvsched.sim.run.run_prepared`). Each
section is empty when no run has its keys, so a plain run's page has only
the TTFT split."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvsched.report.charts import Bar, bar_chart, color, esc
from kvsched.sim.ttft_parts import PART_NAMES

# The TTFT split's parts, in the order a request meets them: (key, name).
TTFT_PARTS = (("prefill_leg_ms", "prefill leg"), ("hop_ms", "hop to decode"),
              ("kv_wait_and_read_ms", "wait + KV read"), ("decode_first_step_ms", "first decode step"))
TTFT_COLORS = {"prefill leg": "#f28e2b", "hop to decode": "#b07aa1", "wait + KV read": "#e15759",
               "first decode step": "#4e79a7"}
TIER_COLORS = {"GPU": "#4e79a7", "CPU": "#59a14f"}
# ttft_parts_ms's parts (kvsched.sim.ttft_parts names them), in the order a
# request meets them: their colours.
TTFT_PART_COLORS = {"arrival": "#bab0ac", "queue": "#edc948", "offload_load": "#59a14f", "prefill": "#f28e2b",
                    "hop": "#b07aa1", "decode_admission": "#ff9da7", "transfer": "#e15759",
                    "decode_queue": "#9c755f", "first_token_step": "#4e79a7"}
TTFT_STATISTICS = ("mean", "median", "p90", "p99")

Formatter = Callable[[Any], str]


def _pct(v: Any) -> str:
    return f"{100.0 * float(v):,.2f}%"


def _num(v: Any) -> str:
    return f"{float(v):,.2f}"


def _int(v: Any) -> str:
    return f"{int(v):,}"


def _gb(v: Any) -> str:
    return f"{float(v) / 1e9:,.3f}"


def _table(labels: Sequence[str], rows: Sequence[tuple[str, str, str, Formatter]],
           values: Sequence[Mapping[str, Any] | None], prefix: str) -> str:
    """One row per ``(key, unit, description, format)`` present in any run,
    one column per run; each cell carries ``data-key="{prefix}.{key}"``."""
    head = "".join(f'<th class="num"><span class="swatch" style="background:{color(i)}"></span>'
                   f"{esc(label)}</th>" for i, label in enumerate(labels)) if len(labels) > 1 else \
        '<th class="num">value</th>'
    body = []
    for key, unit, description, fmt in rows:
        if not any(v is not None and key in v for v in values):
            continue
        cells = "".join(
            f'<td class="num" data-key="{esc(prefix)}.{esc(key)}" data-result="{i}">'
            f'<span class="v">{esc(fmt(v[key]) if v is not None and key in v else "-")}</span></td>'
            for i, v in enumerate(values))
        body.append(f'<tr><td class="key" title="{esc(description)}">{esc(key)}</td>'
                    f'<td class="unit">{esc(unit)}</td>{cells}</tr>')
    if not body:
        return ""
    return (f'<table class="metrics"><thead><tr><th>metric</th><th>unit</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


TRANSFER_ROWS: tuple[tuple[str, str, str, Formatter], ...] = (
    ("count", "", "KV reads (one per request sent to a decode instance)", _int),
    ("bytes", "GB", "KV bytes read, all ranks", _gb),
    ("mean_ms", "ms", "mean time of one read", _num),
    ("p99_ms", "ms", "99th percentile read time", _num),
    ("mean_queued_ms", "ms", "mean wait for a busy link", _num),
)
SPLIT_ROWS = tuple((key, "ms", f"mean TTFT part: {name}", _num) for key, name in TTFT_PARTS)
UTILISATION_ROWS: tuple[tuple[str, str, str, Formatter], ...] = (
    ("engine_cores", "", "engine cores of the role (instances x DP ranks)", _int),
    ("busy_fraction", "%", "share of the run its engine cores were stepping", _pct),
    ("num_steps", "", "engine steps", _int),
    ("mean_batch_size", "req", "requests per step", _num),
    ("mean_tokens_per_step", "tok", "tokens per step", _num),
    ("mean_kv_cache_usage", "%", "KV cache usage, time-weighted over busy time", _pct),
    ("max_kv_cache_usage", "%", "highest KV cache usage of any engine core", _pct),
)
TIER_ROWS: tuple[tuple[str, str, str, Formatter], ...] = (
    ("gpu", "%", "prompt tokens found in the GPU prefix cache", _pct),
    ("cpu", "%", "prompt tokens loaded from CPU memory", _pct),
    ("total", "%", "GPU + CPU", _pct),
)
OFFLOAD_ROWS: tuple[tuple[str, str, str, Formatter], ...] = (
    ("num_cpu_blocks", "", "CPU KV blocks, all ranks", _int),
    ("cpu_hit_tokens", "tok", "prompt tokens found in CPU memory", _int),
    ("stores", "", "store jobs (GPU -> CPU)", _int),
    ("store_bytes", "GB", "bytes stored, all ranks", _gb),
    ("mean_store_ms", "ms", "mean store job time, queueing included", _num),
    ("p99_store_ms", "ms", "99th percentile store job time", _num),
    ("loads", "", "load jobs (CPU -> GPU)", _int),
    ("load_bytes", "GB", "bytes loaded, all ranks", _gb),
    ("mean_load_ms", "ms", "mean load job time, queueing included", _num),
    ("p99_load_ms", "ms", "99th percentile load job time", _num),
)


def _part(key: str) -> tuple[str, str, str]:
    """(name, colour, description) of a TTFT part (an unknown key: itself, muted)."""
    name, description = PART_NAMES.get(key, (key, key))
    return name, TTFT_PART_COLORS.get(key, "#79706e"), description


def ttft_section(labels: Sequence[str], metrics: Sequence[Mapping[str, Any]]) -> str:
    """The TTFT split card: each part's mean as stacked bars (one per run)
    and each part's mean, median, p90 and p99 (a table per run; cells carry
    ``data-key="ttft_parts_ms.{part}.{statistic}"``); "" when no run has it."""
    splits: list[Mapping[str, Mapping[str, float]]] = [m.get("ttft_parts_ms") or {} for m in metrics]
    if not any(splits):
        return ""
    known = list(PART_NAMES)
    # Known parts in a request's order, any other after them.
    keys = sorted({k for s in splits for k in s},
                  key=lambda k: (known.index(k) if k in known else len(known), k))
    colors = {_part(k)[0]: _part(k)[1] for k in keys}
    bars = [Bar(label, tuple((_part(k)[0], float(s[k]["mean"])) for k in keys if k in s))
            for label, s in zip(labels, splits) if s]
    chart = bar_chart("ttft-parts", bars, colors, "mean time to first token (ms)",
                      description="mean TTFT split into the parts a request meets, per run")
    head = "".join(f'<th class="num">{esc(stat)}</th>' for stat in TTFT_STATISTICS)
    tables = []
    for i, (label, split) in enumerate(zip(labels, splits)):
        if not split:
            continue
        rows = "".join(
            f'<tr><td class="key" title="{esc(_part(k)[2])}">{esc(_part(k)[0])}</td><td class="unit">ms</td>'
            + "".join(f'<td class="num" data-key="ttft_parts_ms.{esc(k)}.{stat}" data-result="{i}">'
                      f'<span class="v">{esc(_num(split[k][stat]) if stat in split[k] else "-")}</span></td>'
                      for stat in TTFT_STATISTICS) + "</tr>"
            for k in keys if k in split)
        title = f'<h3><span class="swatch" style="background:{color(i)}"></span>{esc(label)}</h3>' \
            if len(labels) > 1 else ""
        tables.append(f'{title}<table class="metrics"><thead><tr><th>part</th><th>unit</th>{head}</tr>'
                      f"</thead><tbody>{rows}</tbody></table>")
    return (f'<section class="card" data-section="ttft"><h2>Time to first token, split</h2>'
            f'<p class="note">Each request\'s TTFT (client send to first token) in the parts it meets; '
            f"per request they add up to its TTFT, so the means add up to the mean TTFT (the percentiles "
            f"do not add up). Under P/D the first parts are on the prefill instance, the rest on the decode "
            f"instance.</p><figure><h3>Mean TTFT split</h3>{chart}</figure>{''.join(tables)}</section>")


def pd_section(labels: Sequence[str], metrics: Sequence[Mapping[str, Any]]) -> str:
    """The P/D card: the KV transfers and each role's utilisation, and the
    four-part TTFT means (``ttft_split_ms``) as a table, or as stacked bars
    too for results without ``ttft_parts_ms`` (saved before it; else
    :func:`ttft_section` draws the split); "" when no run is disaggregated."""
    if not any("ttft_split_ms" in m for m in metrics):
        return ""
    chart = ""
    if not any("ttft_parts_ms" in m for m in metrics):
        bars = [Bar(label, tuple((name, float(m["ttft_split_ms"].get(key, 0.0))) for key, name in TTFT_PARTS))
                for label, m in zip(labels, metrics) if "ttft_split_ms" in m]
        chart = bar_chart("ttft-split", bars, TTFT_COLORS, "mean time to first token (ms)",
                          description="mean TTFT split into its four parts, per run")
        chart = f"<figure><h3>TTFT split</h3>{chart}</figure>"
    split = _table(labels, SPLIT_ROWS, [m.get("ttft_split_ms") for m in metrics], "ttft_split_ms")
    transfer = _table(labels, TRANSFER_ROWS, [m.get("kv_transfer") for m in metrics], "kv_transfer")
    roles = sorted({role for m in metrics for role in m.get("role_utilisation", {})},
                   key=lambda r: (r != "prefill", r))
    use = "".join(
        f"<h3>{esc(role)} instances</h3>"
        + _table(labels, UTILISATION_ROWS, [m.get("role_utilisation", {}).get(role) for m in metrics],
                 f"role_utilisation.{role}")
        for role in roles)
    return (f'<section class="card" data-section="pd"><h2>Prefill/decode disaggregation</h2>'
            f'<p class="note">Time to first token of a request: its prefill instance\'s leg (queue and '
            f"prefill), the hop to a decode instance, the wait for and read of its KV cache, and the "
            f"decode instance's first step; means over completed requests.</p>"
            f"{chart}{split}"
            f"<h3>KV transfer (prefill &rarr; decode)</h3>{transfer}"
            f"<h3>Utilisation by role</h3>"
            f'<p class="note">Busy: share of the run (0 to the last step of any role) its engine cores '
            f"were stepping.</p>{use}</section>")


def _offload_parts(m: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], Mapping[str, Any]]]:
    """``(role or "", kv_offload, prefix_cache_hit_rate_by_tier)`` of one run:
    each role's under P/D, else the run's own."""
    by_role = m.get("kv_offload_by_role") or {}
    if by_role:
        return [(role, part["kv_offload"], part["prefix_cache_hit_rate_by_tier"])
                for role, part in by_role.items()]
    if m.get("kv_offload"):
        return [("", m["kv_offload"], m.get("prefix_cache_hit_rate_by_tier") or {})]
    return []


def offload_section(labels: Sequence[str], metrics: Sequence[Mapping[str, Any]]) -> str:
    """The KV offloading card: prefix-cache hit rate by tier as stacked bars
    (one per run, and per role under P/D) and the store/load traffic;
    "" when no run offloads."""
    parts = [_offload_parts(m) for m in metrics]
    if not any(parts):
        return ""
    several = len(labels) > 1
    bars = [Bar(" ".join(x for x in (label if several else "", role) if x) or label,
                tuple((name, 100.0 * float(tiers.get(name.lower(), 0.0))) for name in TIER_COLORS))
            for label, run in zip(labels, parts) for role, _, tiers in run]
    chart = bar_chart("offload-hit-rate", bars, TIER_COLORS, "prefix cache hit rate (% of prompt tokens)",
                      description="prefix cache hit rate by tier, per run and role")
    roles = list(dict.fromkeys(role for run in parts for role, _, _ in run))
    tables = []
    for role in roles:
        found = [next(((off, tiers) for r, off, tiers in run if r == role), None) for run in parts]
        prefix = f"kv_offload_by_role.{role}." if role else ""
        head = f"<h3>{esc(role)} instances</h3>" if role else ""
        tables.append(
            head + _table(labels, TIER_ROWS, [f[1] if f else None for f in found],
                          f"{prefix}prefix_cache_hit_rate_by_tier")
            + _table(labels, OFFLOAD_ROWS, [f[0] if f else None for f in found], f"{prefix}kv_offload"))
    return (f'<section class="card" data-section="offload"><h2>KV offloading to CPU</h2>'
            f'<p class="note">Prompt tokens found in the GPU prefix cache and loaded from CPU memory, over '
            f"the tokens looked up; store and load jobs priced by the host link (times include "
            f"queueing).</p><figure><h3>Prefix cache hit rate by tier</h3>{chart}</figure>"
            f'{"".join(tables)}</section>')
