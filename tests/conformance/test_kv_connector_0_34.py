"""The kv_connector_0_34/ corpus: generated offloading and MultiConnector scenarios
that show vLLM 0.34's offloading changes (failed transfer jobs, the store threshold
counted once per request; docs/vllm_versions.md §17, §21), with vLLM 0.34.0's traces
(make_kv_connector_0_34.py writes them through the 0.34 oracle, vllm_0_34/).

kvsched replays each as 0.34 identically, step by step, the ``offload`` key (the
connector's jobs, fences and CPU chunks) included; each trace still shows what its
seed was picked for; 0.33 refuses the scripted failures, which its offloading worker
cannot report.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
# This folder first: vllm_0_34/ (which other tests put on the path) has a
# regenerate.py too, and the live comparers import this folder's.
sys.path.insert(0, str(HERE))
from make_kv_connector_0_34 import CORPUS, CORPUS_DIR, VERSION, scenario_text  # noqa: E402
from random_kv_connector import compare_with_golden, golden_of, read_trace  # noqa: E402

from kvsched.errors import UserInputError  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402

CASES = [(prefix, seed, features) for prefix, seeds in CORPUS.items() for seed, features in seeds.items()]
FEATURES = ("load_fail", "store_fail", "threshold_once")


def _path(prefix: str, seed: int) -> Path:
    path: Path = CORPUS_DIR / f"{prefix}_{seed}.json"
    return path


def _ids(case: Any) -> str:
    return f"{case[0]}_{case[1]}" if isinstance(case, tuple) else str(case)


def test_corpus_is_complete() -> None:
    assert sorted(p.name for p in CORPUS_DIR.glob("*.json")) == sorted(
        _path(prefix, seed).name for prefix, seed, _ in CASES)
    for prefix in CORPUS:
        assert len(CORPUS[prefix]) >= 3, prefix
    # Every feature by at least two seeds.
    for feature in FEATURES:
        assert sum(feature in features for _, _, features in CASES) >= 2, feature


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_scenario_is_the_generators(case: tuple[str, int, tuple[str, ...]]) -> None:
    prefix, seed, _ = case
    assert _path(prefix, seed).read_text() == scenario_text(prefix, seed)


def _offload_rows(trace: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    return [(line["step"], line.get("offload")) for line in trace]


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_kvsched_replays_vllm_034(case: tuple[str, int, tuple[str, ...]]) -> None:
    prefix, seed, _ = case
    path = _path(prefix, seed)
    _, diff = compare_with_golden(path, None, VERSION)
    assert diff is None, diff
    # The connector's own trace key too: which jobs, from which block, fences,
    # completions, failures and the CPU chunks in use.
    out = io.StringIO()
    replay(load_scenario(str(path), VERSION), out)
    actual = [json.loads(line) for line in out.getvalue().splitlines()]
    assert _offload_rows(actual) == _offload_rows(read_trace(golden_of(path)[0]))


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_trace_shows_its_feature(case: tuple[str, int, tuple[str, ...]]) -> None:
    prefix, seed, features = case
    path = _path(prefix, seed)
    scenario = json.loads(path.read_text())
    trace = read_trace(golden_of(path)[0])
    stores = {row[0] for line in trace for row in line["offload"]["store"]}
    failed = [j for line in trace for j in line["offload"].get("failed", ())]
    load_failed = {rid for line in trace for rid in line["load_failed"]}
    scripted = {r["request_id"] for r in scenario["requests"] if "offload_load_fail" in r}
    if "load_fail" in features:
        assert any(j not in stores for j in failed)
        assert load_failed & scripted
    if "store_fail" in features:
        assert any(j in stores for j in failed)
    if "threshold_once" in features:
        kvc = scenario["kv_connector"]
        offload = kvc if kvc["type"] == "offloading" else next(
            c for c in kvc["connectors"] if c["type"] == "offloading")
        assert offload["store_threshold"] >= 2


@pytest.mark.parametrize("case", [c for c in CASES if "threshold_once" not in c[2]], ids=_ids)
def test_033_refuses_the_scripted_failures(case: tuple[str, int, tuple[str, ...]]) -> None:
    prefix, seed, _ = case
    with pytest.raises(UserInputError, match=r"0\.33's offloading worker asserts that every transfer"):
        load_scenario(str(_path(prefix, seed)), "0.33")
