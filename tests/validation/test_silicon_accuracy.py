"""Accuracy against real vLLM serving runs, pinned: a regression fails CI.

A fixed sample of aiconfigurator-core's silicon_sample.csv rows (the vLLM
aggregated rows on H100, H200 and B200 at concurrency 16 or less, the
first four of each model, GPU and precision, in file order) is simulated
as it was run with the measured backend and its fitted host terms. The
bounds are the errors measured when the terms were last fitted plus a
small margin (the figures in docs/validation.md come from the full run,
``benchmarks/validate_silicon.py``). The measured TTFTs and TPOTs are the
CSV's, not kvsched's: this test can fail.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest

from kvsched.validation.silicon import simulate_row
from kvsched.validation.silicon_rows import Refusal, ServingRun, load_rows, map_row

SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm")
MAX_CONCURRENCY = 16
PER_GROUP = 4
# Median |relative error| over the sample, measured 2026-12-05 with the host
# terms of kvsched/perf/data as selected and fitted that day (four folds on
# every 4th Hopper row), plus 2 points of margin. The first selection of that
# day (every 8th row, no per-prefill-token term) gave 14.7 % and 8.8 %; the
# terms of 2026-11-26 (a per-layer charge on every step with a
# prefill token, which real runs with prefix caching refute: issue 34) gave
# 11.4 % and 6.6 % here; those of 2026-11-24 13.8 % and 7.2 %.
SAMPLE_SIZE = 65
TTFT_BOUND = 0.140   # measured 12.0 %
TPOT_BOUND = 0.099   # measured 7.9 %


def sample_runs() -> list[ServingRun]:
    groups: dict[tuple[str, str, str], list[ServingRun]] = defaultdict(list)
    for row in load_rows():
        if row.system not in SYSTEMS or row.concurrency is None or row.concurrency > MAX_CONCURRENCY:
            continue
        run = map_row(row)
        if isinstance(run, Refusal):
            continue
        groups[(row.model_path, row.system, str(row.precision))].append(run)
    return [run for key in sorted(groups) for run in groups[key][:PER_GROUP]]


# ~80 s on 2 cores: the slow tier (CI runs it after the default run).
@pytest.mark.slow
def test_a_fixed_sample_of_real_runs_stays_as_accurate_as_when_fitted() -> None:
    runs = sample_runs()
    assert len(runs) == SAMPLE_SIZE  # the sample itself has not changed
    ttft, tpot = [], []
    for run in runs:
        result = simulate_row(run, "measured")
        assert not isinstance(result, Refusal), (run.row.id, result)
        ttft.append(abs(result.mean_ttft_ms / run.row.ttft_ms - 1))
        tpot.append(abs(result.mean_tpot_ms / run.row.tpot_ms - 1))
    assert statistics.median(ttft) <= TTFT_BOUND
    assert statistics.median(tpot) <= TPOT_BOUND
