"""kvsched's step traces against vLLM 0.33.0's, recorded by the reference oracle.

Every scenario under scenarios/ (hand-written), random/ (generated),
features/ (the oracle's examples of async scheduling, speculative decoding
and the LoRA cap), kv_connector/ (the oracle's KV connector examples:
the scripted connector, NixlConnector and OffloadingConnector) and
random_features/ (generated with those features) has
a golden trace NAME.vllm.jsonl from
../shared/reference/vllm_replay.py; every field of every step must be
identical.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402

SCENARIOS = [path for folder in ("scenarios", "random", "features", "kv_connector",
                                 "random_features")
             for path in sorted((HERE / folder).glob("*.json"))]


def _golden(path: Path) -> Path:
    return path.with_name(path.stem + ".vllm.jsonl")


def test_corpus_is_complete() -> None:
    hand_written = list((HERE / "scenarios").glob("*.json"))
    assert len(hand_written) >= 40, "the acceptance bar is at least 40 hand-written scenarios"
    assert len(list((HERE / "features").glob("*.json"))) == 8, "the oracle's 8 feature examples"
    assert len(list((HERE / "kv_connector").glob("kvconn_*.json"))) == 10, (
        "the oracle's 10 scripted KV connector examples")
    assert len(list((HERE / "kv_connector").glob("pd_*.json"))) == 2, (
        "the oracle's 2 NixlConnector (P/D) examples")
    assert len(list((HERE / "kv_connector").glob("offload_*.json"))) == 3, (
        "the oracle's 3 OffloadingConnector examples")
    missing = [p.name for p in SCENARIOS if not _golden(p).exists()]
    assert not missing, f"scenarios without a golden trace: {missing}"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_trace_matches_vllm(path: Path) -> None:
    expected = [json.loads(line) for line in _golden(path).read_text().splitlines() if line.strip()]
    out = io.StringIO()
    # The goldens are the shared reference's release's traces, so that
    # release's scheduler replays them, whatever kvsched's default.
    replay(load_scenario(str(path), SHARED_REFERENCE_VERSION), out)
    actual = [json.loads(line) for line in out.getvalue().splitlines()]
    assert expected, "empty golden trace"
    diff = first_difference(expected, actual)
    assert diff is None, diff
