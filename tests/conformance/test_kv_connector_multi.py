"""The kv_connector_multi/ corpus: random MultiConnector scenarios (vLLM's
MultiConnector of NixlConnector and OffloadingConnector, in either order, on
one side of a P/D pair; compare_live_multi.py) with vLLM 0.33.0's traces,
gzipped (``compare_live_multi.py --write-corpus`` rewrites them from the
oracle, through multi_oracle.py). kvsched must replay each one identically,
step by step; a scenario vLLM never finishes is compared up to its
max_steps, where kvsched must stop too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live_multi import CORPUS, FILE_PREFIX, MULTI_CORPUS_SEEDS, random_multi_scenario  # noqa: E402
from random_kv_connector import compare_with_golden, golden_of, read_trace  # noqa: E402
from random_scenarios import format_scenario, parse_seeds  # noqa: E402

from kvsched.errors import UserInputError  # noqa: E402
from kvsched.scenario import load_scenario  # noqa: E402

PATHS = sorted(CORPUS.glob(f"{FILE_PREFIX}*.json"))
# The task's bar: at least 20 committed scenarios.
MIN_SCENARIOS = 20


def _seed(path: Path) -> int:
    return int(path.stem.removeprefix(FILE_PREFIX))


def test_corpus_is_large_enough_and_exercises_both_children() -> None:
    assert len(PATHS) >= MIN_SCENARIOS, f"only {len(PATHS)} scenarios in {CORPUS.name}/"
    assert {_seed(p) for p in PATHS} <= set(parse_seeds(MULTI_CORPUS_SEEDS))
    orders = set()
    nixl_loads = cpu_loads = 0
    for path in PATHS:
        kvc = json.loads(path.read_text())["kv_connector"]
        orders.add(tuple(c["type"] for c in kvc["connectors"]))
        for rec in read_trace(golden_of(path)[0]):
            cpu = {row[1] for row in rec["offload"]["load"]}
            cpu_loads += len(cpu)
            nixl_loads += len(set(rec["kv_load"]) - cpu)
    assert orders == {("nixl", "offloading"), ("offloading", "nixl")}
    assert nixl_loads > 0 and cpu_loads > 0, (nixl_loads, cpu_loads)


def test_generator_reproduces_the_corpus() -> None:
    drifted = [p.name for p in PATHS if p.read_text() != format_scenario(random_multi_scenario(_seed(p)))]
    assert not drifted, (f"{len(drifted)} scenarios differ from the generator (first: {drifted[:5]}); "
                         "run python tests/conformance/compare_live_multi.py --write-corpus")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_trace_matches_vllm(path: Path) -> None:
    _, diff = compare_with_golden(path)
    assert diff is None, diff


@pytest.mark.parametrize("connectors, words", [
    ([{"type": "nixl"}, {"type": "nixl"}], ["connectors[1].type", "repeated"]),
    ([{"type": "scripted"}], ["connectors[0].type", "nixl, offloading"]),
    ([], ["kv_connector.connectors", "1 to 2"]),
    ([{"type": "offloading"}], ["num_cpu_blocks"]),
    ([{"type": "nixl", "load_failure_policy": "fail"}], ["load_failure_policy"]),
])
def test_a_bad_multi_scenario_is_refused_by_name(tmp_path: Path, connectors: list[Any],
                                                 words: list[str]) -> None:
    scenario = json.loads(PATHS[0].read_text())
    scenario["kv_connector"]["connectors"] = connectors
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(scenario))
    with pytest.raises(UserInputError) as e:
        load_scenario(str(path))
    for w in words:
        assert w in str(e.value), str(e.value)
