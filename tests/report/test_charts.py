"""kvsched.report.charts: inline SVG charts, drawn without any page around them."""

from __future__ import annotations

import numpy as np

from kvsched.report import charts, simulate_page


def test_charts_draw_without_the_page() -> None:
    # charts.py draws; simulate_page.py assembles the page around what it draws.
    svg = charts.svg_chart("demo", [charts.Series("s", np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0, 2.0]),
                                                  charts.PALETTE[0])],
                           charts.Axis("x"), charts.Axis("y"))
    assert svg.startswith('<svg class="chart" data-chart="demo"') and "<polyline" in svg
    assert not hasattr(simulate_page, "svg_chart") and not hasattr(simulate_page, "Series")
