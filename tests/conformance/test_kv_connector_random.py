"""The kv_connector_random/ corpus: random scripted-KV-connector scenarios
(random_kv_connector.py: plain, async, speculative and LoRA bases; sync and
async loads, load failures under both policies, delayed frees, every role)
with vLLM 0.33.0's traces, gzipped (compare_live_kv.py --write-corpus rewrites
them). kvsched must replay each one identically, step by step; a scenario vLLM
never finishes is compared up to its max_steps, where kvsched must stop too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_kv_connector import (  # noqa: E402
    BASES,
    FILE_PREFIX,
    KV_CORPUS_SEEDS,
    base_of,
    compare_with_golden,
    golden_of,
    kv_scenario_path,
    random_kv_scenario,
)
from random_scenarios import format_scenario, parse_seeds  # noqa: E402

CORPUS = HERE / "kv_connector_random"
SEEDS = parse_seeds(KV_CORPUS_SEEDS)
# Issue 22's bar: at least 300 committed scenarios that vLLM finishes.
MIN_FINISHED = 300


def test_corpus_is_complete_and_mostly_finishes() -> None:
    expected = {kv_scenario_path(CORPUS, seed).name for seed in SEEDS}
    present = {p.name for p in CORPUS.glob(f"{FILE_PREFIX}*.json")}
    assert present == expected, (
        f"missing: {sorted(expected - present)[:10]}, unexpected: {sorted(present - expected)[:10]}")
    stuck = [seed for seed in SEEDS if golden_of(kv_scenario_path(CORPUS, seed))[1]]
    assert len(SEEDS) - len(stuck) >= MIN_FINISHED, f"only {len(SEEDS) - len(stuck)} finish in vLLM"
    assert stuck, "no scenario vLLM never finishes: the livelock comparison is not exercised"
    assert {base_of(seed) for seed in SEEDS} == set(BASES)


def test_generator_reproduces_the_corpus() -> None:
    drifted = [seed for seed in SEEDS
               if kv_scenario_path(CORPUS, seed).read_text() != format_scenario(random_kv_scenario(seed))]
    assert not drifted, (f"{len(drifted)} scenarios differ from the generator (first: {drifted[:5]}); "
                         "run python tests/conformance/compare_live_kv.py --write-corpus")


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"{FILE_PREFIX}{s}")
def test_trace_matches_vllm(seed: int) -> None:
    _, diff = compare_with_golden(kv_scenario_path(CORPUS, seed))
    assert diff is None, diff


# Hand-kept scenarios from earlier draws that exercised a fix, with vLLM's trace
# (stable across oracle hash seeds); each file's description says what it pins.
REGRESSIONS = HERE / "kv_connector_regressions"


@pytest.mark.parametrize("path", sorted(REGRESSIONS.glob("*.json")), ids=lambda p: p.stem)
def test_regression_matches_vllm(path: Path) -> None:
    _, diff = compare_with_golden(path)
    assert diff is None, diff

