"""The stylesheet every kvsched HTML page shares (the simulate / compare page
and the tune page): one look, inlined into each page so it opens offline."""

from __future__ import annotations

STYLESHEET = """
:root { --fg: #1f2430; --muted: #5f6b7a; --line: #e2e6ec; --bg: #f5f6f8; --card: #ffffff; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1140px; margin: 0 auto; padding: 28px 20px 40px; }
header h1 { font-size: 24px; margin: 0 0 2px; font-weight: 650; }
header .sub { color: var(--muted); margin: 0 0 14px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 16px 20px 18px; margin: 0 0 16px; }
h2 { font-size: 16px; margin: 0 0 10px; font-weight: 650; }
h3 { font-size: 14px; margin: 0 0 2px; font-weight: 600; }
.note { color: var(--muted); font-size: 12.5px; margin: 0 0 6px; }
ul.config { list-style: none; margin: 0; padding: 0; columns: 2; column-gap: 32px; }
ul.config li { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; padding: 2px 0; break-inside: avoid; }
table { border-collapse: collapse; width: 100%; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: 12.5px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.key { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; }
td.unit { color: var(--muted); font-size: 12.5px; }
tr.section td { background: #f0f2f5; font-weight: 600; font-size: 12.5px; color: #3a4352;
  border-bottom: 1px solid var(--line); }
span.d { display: inline-block; min-width: 54px; color: var(--muted); font-size: 11px; }
.tables { display: grid; grid-template-columns: 1fr; gap: 0 28px; }
.tables:not(.two) table.metrics { width: auto; min-width: 66%; }
.tables:not(.two) table.metrics td.num, .tables:not(.two) table.metrics th.num { padding-left: 28px; }
.tables.two { grid-template-columns: 1fr 1fr; }
.swatch { display: inline-block; width: 12px; height: 12px; border-radius: 3px; margin-right: 6px;
  vertical-align: -1px; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 14px 24px; }
figure { margin: 0 0 6px; }
svg.chart { width: 100%; height: auto; display: block; }
svg.chart text { font-size: 12px; fill: var(--muted); }
svg.chart .legend-label { fill: var(--fg); }
svg.chart .axis-label { fill: #3a4352; font-size: 12.5px; }
svg.chart .grid line { stroke: #e9ecf1; stroke-width: 1; }
svg.chart .frame { fill: none; stroke: #c9ced6; stroke-width: 1; }
svg.chart .empty { font-size: 14px; }
details { margin-top: 8px; }
td.changed { background: #fff4e0; font-weight: 600; }
table.deployment td.num { white-space: normal; }
table.kv { width: auto; margin: 0 0 0 auto; }
table.kv th, table.kv td { padding: 1px 0 1px 12px; border: none; font-size: 12.5px; text-align: left; }
table.kv th { font-weight: 500; white-space: nowrap; }
ul.items { list-style: none; margin: 0; padding: 0; }
details.long { margin: 0; max-width: 640px; }
details.long summary { cursor: pointer; }
ul.ran { list-style: none; margin: 0 0 14px; padding: 0; }
ul.ran li { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, "DejaVu Sans Mono", monospace;
  font-size: 12.5px; padding: 2px 0; }
ul.notes { color: var(--muted); font-size: 12.5px; margin: 10px 0 0; padding-left: 18px; }
footer { color: var(--muted); font-size: 12px; margin-top: 18px; }
@media (max-width: 800px) { .grid2, .tables.two { grid-template-columns: 1fr; } ul.config { columns: 1; } }
"""
