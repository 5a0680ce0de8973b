"""kvsched.validation.published and its doc tables (published_report, which
benchmarks/validate_perf.py runs).

These are plumbing checks, not accuracy targets: the measured errors live in
docs/validation.md and are not asserted here. The step model's physics checks
are in tests/perf/test_step_time_physics.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from kvsched.validation import errors, published, published_report

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "validation.md"


@pytest.fixture(scope="module")
def facts() -> Path:
    if not (published.FACTS / "splitwise_perf_model.csv").exists():
        pytest.skip(f"facts not found at {published.FACTS}")
    return published.FACTS


@pytest.fixture(scope="module")
def sections(facts: Path) -> dict[str, str]:
    return published_report.build_sections(facts)


# -- the validation script -------------------------------------------------------


def test_script_prints_every_section(facts: Path) -> None:
    lines: list[str] = []
    assert published_report.main([], out=lines.append) == 0
    text = "\n".join(lines)
    for title in published_report.TITLES.values():
        assert f"## {title}" in text


def test_splitwise_predictions_and_errors_are_finite(facts: Path) -> None:
    results = published.splitwise_results(facts)
    assert len(results) == 228  # every (model, hardware, TP, prompt, batch, tokens) group of the CSV
    for r in results:
        for metric in ("prompt", "token", "e2e"):
            predicted, measured = r.metric(metric)
            assert predicted > 0 and math.isfinite(predicted)
            assert math.isfinite(errors.rel_err(predicted, measured))


def test_serving_comparisons_have_finite_errors(facts: Path) -> None:
    rows = published.serving_comparisons() + published.kernel_comparisons()
    scored = [c for c in rows if c.status in ("compared", "closest")]
    assert scored
    for c in scored:
        assert c.error is not None and math.isfinite(c.error), c.name
    for c in rows:
        if c.status == "not comparable":
            assert c.predicted is None and c.note, c.name
    dp_rows = published.pending_comparisons()
    assert all(c.predicted is None and c.note for c in dp_rows)
    # The DP-policy rows point at the page that compares them.
    assert sum(c.status == "in balance.md" and "docs/balance.md" in c.note for c in dp_rows) == 2


def test_power_capped_rows_are_copies_with_scaled_prefill(facts: Path) -> None:
    n, lo, hi, same = published.check_pcap_rows(facts / "splitwise_perf_model.csv")
    assert n == 420 and same
    assert lo == pytest.approx(1.3) and hi == pytest.approx(1.3)


def test_doc_blocks_name_generated_sections(facts: Path, sections: dict[str, str]) -> None:
    text = DOC.read_text(encoding="utf-8")
    names = re.findall(r"<!-- BEGIN validate_perf:([a-z-]+) -->", text)
    assert names and set(names) <= set(sections)
    published_report.render_doc(text, sections)  # every block closes and is known
