"""kvsched replaying as vLLM 0.34.0 against 0.34.0's own traces.

The 0.34 oracle (vllm_0_34/, tests/conformance/README.md) replayed every scenario of
the 0.33 corpus; its traces are goldens_0_34/ (one equal to its 0.33 golden is that
file, listed in goldens_0_34/same_as_0_33.txt). kvsched, built with
``vllm_version="0.34"``, must give each one step by step, stuck ones included. So must
the 0.34-only probes (vllm_0_34/probes/, goldens_0_34/probes/): the in-flight KV load
cap (``max_num_inflight_kv_loads``) and cache-aware admission; each knob's probe
differs from kvsched's replay without the knob, so the comparison sees whether the
knob is modelled. And so must the random scenarios that set those knobs
(vllm_0_34/admission_random/: random_kv_connector.py's and random_scenarios.py's 0.34
scenarios picked from a live run where the knobs changed the trace; each one's trace
differs without its knobs). vllm_0_34/rules_0_34/ holds
scenarios written for 0.34's PP and async rules (docs/vllm_versions.md §7, §20: PP 3
and 8 with async scheduling, speculative method ``ngram`` with async scheduling), traced
by 0.34's own EngineCore loops (engine_oracle.py).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "vllm_0_34"))

import compare_versions as cv  # noqa: E402
from random_kv_connector import compare_with_golden, golden_of  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.errors import UserInputError  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402

# The shared reference's examples are compared where ../shared is laid out.
FOLDERS = [f for f in cv.FOLDERS if f != "dp" and (f != "shared_examples" or cv.SHARED_EXAMPLES.is_dir())]
CASES = [(folder, name, new) for folder in FOLDERS for name, _old, new in cv.pairs(folder)]


def test_every_034_trace_is_compared() -> None:
    missing = [f"{folder}/{name}" for folder, name, new in CASES if new is None]
    assert not missing, missing[:5]
    # 1,259 scenarios less the shared examples when ../shared is absent.
    assert len(CASES) >= 1236


@pytest.mark.parametrize("folder, name, golden", CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_trace_matches_vllm_034(folder: str, name: str, golden: Path) -> None:
    scenario = cv.old_dir_of(folder) / name
    _, diff = compare_with_golden(scenario, golden, "0.34")
    assert diff is None, diff


RULES_DIR = HERE / "vllm_0_34" / "rules_0_34"
RULES = sorted(RULES_DIR.glob("*.json"))


def _golden(name: str) -> list[dict]:
    return cv.read_trace(cv.GOLDENS / "rules_0_34" / f"{name}.vllm.jsonl")


def test_the_rules_folder_covers_pp_async_and_ngram_async() -> None:
    scenarios = [json.loads(p.read_text()) for p in RULES]
    pp_async = {s["pipeline_parallel_size"] for s in scenarios
                if s.get("async_scheduling") and s.get("pipeline_parallel_size", 1) > 1}
    assert pp_async >= {2, 3, 8}
    assert sum(1 for s in scenarios if s.get("async_scheduling")
               and (s.get("speculative") or {}).get("method") == "ngram") >= 2


@pytest.mark.parametrize("path", RULES, ids=lambda p: p.stem)
def test_rules_scenario_matches_vllm_034(path: Path) -> None:
    out = io.StringIO()
    replay(load_scenario(str(path), "0.34"), out)
    actual = [json.loads(line) for line in out.getvalue().splitlines()]
    assert first_difference(_golden(path.stem), actual) is None


@pytest.mark.parametrize("name", ["async_ngram", "async_ngram_preempt"])
def test_033_refuses_ngram_with_async_scheduling(name: str) -> None:
    # 0.33's V1 model runner refuses the pair (VllmConfig.__post_init__).
    with pytest.raises(UserInputError, match=r"speculative_config\.method='ngram'"):
        load_scenario(str(RULES_DIR / f"{name}.json"), "0.33")


def test_034_runs_ngram_as_ngram_gpu_under_async_scheduling() -> None:
    # 0.34 has one model runner, whose GPU n-gram speculator serves both methods:
    # the oracle's traces of the two otherwise equal scenarios are equal.
    assert _golden("async_ngram") == _golden("async_ngram_gpu")


@pytest.mark.parametrize("name, pp", [("pp2_async_preempt_abort", 2), ("pp3_async_stagger", 3),
                                      ("pp8_async", 8)])
def test_034_async_pp_decodes_at_most_once_every_pp_steps(name: str, pp: int) -> None:
    # §7: after a request samples, AsyncScheduler sets next_decode_eligible_step =
    # current_step + PP. Two one-token decodes of a request with no preemption in
    # between are PP steps apart or more, and the golden has such a pair exactly PP
    # apart (the stagger is what paces it, not the batch queue).
    last_decode: dict[str, int] = {}
    gaps = []
    for line in _golden(name):
        for rid in line["preempted"]:
            last_decode.pop(rid, None)
        for rid, n in line["scheduled"]:
            if n == 1 and rid in last_decode:
                gaps.append(line["step"] - last_decode[rid])
            if n == 1:
                last_decode[rid] = line["step"]
            else:
                last_decode.pop(rid, None)
    assert gaps and min(gaps) == pp, (name, sorted(set(gaps)))


PROBES = HERE / "vllm_0_34" / "probes"
PROBE_GOLDENS = HERE / "goldens_0_34" / "probes"
PROBE_NAMES = sorted(p.stem for p in PROBES.glob("*.json"))
# The probes whose trace depends on a 0.34 knob: the knob, and the value that
# changes the trace (None: the knob left out). cache_aware_threshold keeps arrival
# order (its KV usage stays below the threshold): with threshold 0 it would not.
KNOB_PROBES: dict[str, tuple[str, float | None]] = {
    "inflight_kv_loads_1": ("max_num_inflight_kv_loads", None),
    "inflight_kv_loads_4": ("max_num_inflight_kv_loads", None),
    "cache_aware_on": ("cache_aware_admission_window", None),
    "cache_aware_threshold": ("cache_aware_admission_threshold", 0.0)}


def probe_golden(name: str) -> Path:
    golden, _ = golden_of(PROBE_GOLDENS / f"{name}.json")
    return golden


def test_every_probe_has_a_golden() -> None:
    assert len(PROBE_NAMES) >= 7
    assert set(KNOB_PROBES) <= set(PROBE_NAMES)
    for name in PROBE_NAMES:
        assert probe_golden(name).exists()


@pytest.mark.parametrize("name", PROBE_NAMES)
def test_probe_matches_vllm_034(name: str) -> None:
    _, diff = compare_with_golden(PROBES / f"{name}.json", probe_golden(name), "0.34")
    assert diff is None, diff


@pytest.mark.parametrize("name", sorted(KNOB_PROBES))
def test_probe_depends_on_its_knob(name: str, tmp_path: Path) -> None:
    scenario = json.loads((PROBES / f"{name}.json").read_text())
    knob, value = KNOB_PROBES[name]
    if value is None:
        del scenario["scheduler"][knob]
    else:
        scenario["scheduler"][knob] = value
    changed = tmp_path / f"{name}.json"
    changed.write_text(json.dumps(scenario))
    _, diff = compare_with_golden(changed, probe_golden(name), "0.34")
    assert diff is not None, f"{name}: the trace is the same with {knob}={value}"


ADMISSION = HERE / "vllm_0_34" / "admission_random"
ADMISSION_GOLDENS = HERE / "goldens_0_34" / "admission_random"
ADMISSION_NAMES = sorted(p.stem for p in ADMISSION.glob("*.json"))
KNOBS = ("max_num_inflight_kv_loads", "cache_aware_admission_window")


def test_admission_scenarios_set_the_knobs() -> None:
    assert len(ADMISSION_NAMES) >= 10
    policies = set()
    for name in ADMISSION_NAMES:
        scheduler = json.loads((ADMISSION / f"{name}.json").read_text())["scheduler"]
        assert any(scheduler.get(k) for k in KNOBS), name
        policies.add(scheduler.get("policy", "fcfs"))
    assert policies == {"fcfs", "priority"}


@pytest.mark.parametrize("name", ADMISSION_NAMES)
def test_admission_scenario_matches_vllm_034(name: str) -> None:
    golden, _ = golden_of(ADMISSION_GOLDENS / f"{name}.json")
    _, diff = compare_with_golden(ADMISSION / f"{name}.json", golden, "0.34")
    assert diff is None, diff


@pytest.mark.parametrize("name", ADMISSION_NAMES)
def test_admission_scenario_depends_on_its_knobs(name: str, tmp_path: Path) -> None:
    scenario = json.loads((ADMISSION / f"{name}.json").read_text())
    for knob in KNOBS:
        scenario["scheduler"].pop(knob, None)
    plain = tmp_path / f"{name}.json"
    plain.write_text(json.dumps(scenario))
    golden, _ = golden_of(ADMISSION_GOLDENS / f"{name}.json")
    _, diff = compare_with_golden(plain, golden, "0.34")
    assert diff is not None, f"{name}: the trace is the same without {KNOBS}"
