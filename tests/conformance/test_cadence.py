"""vLLM's prefill cadence (``prefill_schedule_interval``) against vLLM 0.33.0.

Every scenario under cadence/ sets a top-level ``prefill_schedule_interval``;
its golden NAME.vllm.jsonl comes from cadence_oracle.py (vLLM's real
Scheduler with that interval). kvsched's replay installs a PrefillCadence
policy for the key; every field of every step must be identical.
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

SCENARIOS = sorted((HERE / "cadence").glob("*.json"))


def _golden(path: Path) -> list[dict]:
    text = path.with_name(path.stem + ".vllm.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _trace(path: Path) -> list[dict]:
    out = io.StringIO()
    # cadence_oracle.py ran the shared reference's release: replay as that one.
    replay(load_scenario(str(path), SHARED_REFERENCE_VERSION), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_corpus_is_complete() -> None:
    assert len(SCENARIOS) >= 15
    for path in SCENARIOS:
        assert path.with_name(path.stem + ".vllm.jsonl").exists(), path.name
        assert json.loads(path.read_text())["prefill_schedule_interval"] in (2, 3, 4)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_cadence_matches_vllm(path: Path) -> None:
    expected = _golden(path)
    assert expected, "empty golden trace"
    diff = first_difference(expected, _trace(path))
    assert diff is None, diff


def test_corpus_defers() -> None:
    """The cadence changes vLLM's decisions in the corpus: replaying without
    the interval differs from the golden trace in most scenarios."""
    differ = 0
    for path in SCENARIOS:
        scenario = load_scenario(str(path), SHARED_REFERENCE_VERSION)
        scenario.prefill_schedule_interval = 1
        out = io.StringIO()
        replay(scenario, out)
        plain = [json.loads(line) for line in out.getvalue().splitlines()]
        differ += first_difference(_golden(path), plain) is not None
    assert differ >= len(SCENARIOS) - 2
