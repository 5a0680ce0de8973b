"""The vLLM 0.34.0 goldens (goldens_0_34/, written by vllm_0_34/regenerate.py).

Pure Python, no vLLM: every corpus scenario has a 0.34 trace; comparison.json is
what the traces say; every 0.34 trace that differs from its 0.33 golden is covered by
a 0.34 change docs/vllm_versions.md lists (the counterfactual edits of
vllm_0_34/counterfactual.py, which replays them through 0.33 to prove it); the probe
scenarios of 0.34's new scheduler knobs show the documented effect. kvsched's own
replay is compared with these goldens by test_conformance_0_34.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "vllm_0_34"))

import compare_versions as cv  # noqa: E402
import counterfactual  # noqa: E402


def _scenario(folder: str, name: str) -> dict:
    if folder == "shared_examples":
        return json.loads((cv.SHARED_EXAMPLES / name).read_text())
    return json.loads((HERE / folder / name).read_text())


def _repo_folders() -> list[str]:
    return [f for f in cv.FOLDERS if f not in ("dp", "shared_examples")]


@pytest.mark.parametrize("folder", _repo_folders())
def test_every_scenario_has_a_034_trace(folder: str) -> None:
    rows = cv.pairs(folder)
    assert rows, folder
    missing = [name for name, _old, new in rows if new is None]
    assert not missing, f"{folder}: no 0.34 trace for {missing[:5]}"


def test_comparison_file_matches_the_traces() -> None:
    recorded = json.loads(cv.COMPARISON.read_text())
    computed = json.loads(json.dumps(cv.compare_all()))
    if not cv.SHARED_EXAMPLES.is_dir():  # the shared reference is not laid out here
        recorded.pop("shared_examples", None)
        computed.pop("shared_examples", None)
    assert computed == recorded


def test_every_difference_has_a_known_034_cause() -> None:
    recorded = json.loads(cv.COMPARISON.read_text())
    unexplained = []
    for folder, rows in recorded.items():
        for name, row in rows.items():
            if row["status"] == "equal":
                continue
            assert row["status"] == "differs", (folder, name, row)
            if folder == "shared_examples" and not cv.SHARED_EXAMPLES.is_dir():
                continue
            scenario = _scenario(folder, name)
            if not any(edit(scenario) for edit in counterfactual.EDITS.values()):
                unexplained.append(f"{folder}/{name}")
    assert not unexplained


def _events(name: str) -> list[tuple[int, list[str], list[str]]]:
    trace = cv.read_trace(cv.GOLDENS / "probes" / f"{name}.vllm.jsonl")
    return [
        (line["step"], line["new"], sorted(line.get("kv_load", {})))
        for line in trace
        if line["new"] or line.get("kv_load")
    ]


def test_cache_aware_admission_probes() -> None:
    admitted = {
        name: [rid for _s, new, _l in _events(name) for rid in new]
        for name in ("cache_aware_off", "cache_aware_on", "cache_aware_threshold")
    }
    assert admitted["cache_aware_off"] == ["warm", "hog", "cold", "hot"]
    assert admitted["cache_aware_on"] == ["warm", "hog", "hot", "cold"]
    assert admitted["cache_aware_threshold"] == admitted["cache_aware_off"]


def test_max_num_inflight_kv_loads_probes() -> None:
    def load_steps(name: str) -> dict[str, int]:
        return {rid: step for step, _new, loads in _events(name) for rid in loads}

    # No cap: loads start only once the running request (max_num_seqs 1) is done.
    assert load_steps("inflight_kv_loads_off") == {"l1": 12, "l2": 12}
    # A cap of 1: l1 loads while the batch is full, l2 once l1 was admitted.
    assert load_steps("inflight_kv_loads_1") == {"l1": 1, "l2": 12}
    assert load_steps("inflight_kv_loads_4") == {"l1": 1, "l2": 1}


def test_failed_load_reservation_livelock_persists() -> None:
    assert (cv.GOLDENS / "probes" / "failed_load_reservation.vllm.jsonl.stuck").exists()


def test_traces_not_stored_twice_still_match_the_033_goldens() -> None:
    # A 0.34 trace equal to its 0.33 golden is kept once, as the 0.33 file, with
    # the hash 0.34's trace had: an edited 0.33 golden must not pass for 0.34's.
    same = cv.same_as_033()
    assert len(same) > 1000
    changed = []
    for key, digest in same.items():
        folder, name = key.split("/", 1)
        old = cv.old_dir_of(folder) / name
        if folder == "shared_examples" and not old.exists():
            continue  # the shared reference is not laid out here
        if cv.trace_sha256(old) != digest:
            changed.append(key)
        assert not (cv.GOLDENS / folder / name).exists(), f"{key} is stored twice"
    assert not changed, f"0.33 goldens changed since the 0.34 comparison: {changed[:5]}"
