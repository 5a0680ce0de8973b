"""kvsched replaying as vLLM 0.34.0 against 0.34.0's own traces.

The 0.34 oracle (vllm_0_34/, tests/conformance/README.md) replayed every scenario of
the 0.33 corpus; its traces are goldens_0_34/ (one equal to its 0.33 golden is that
file, listed in goldens_0_34/same_as_0_33.txt). kvsched, built with
``vllm_version="0.34"``, must give each one step by step, stuck ones included. The
0.34-only probes (in-flight KV load cap, cache-aware admission) need scheduler knobs
kvsched does not model yet and are not compared here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "vllm_0_34"))

import compare_versions as cv  # noqa: E402
from random_kv_connector import compare_with_golden  # noqa: E402

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
