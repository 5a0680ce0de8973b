"""The multimodal corpus (the encoder path) replayed through kvsched against
vLLM's own traces: the hand-written scenarios of multimodal/ (one per branch
of vLLM's encoder scheduling) and seeds MM_CORPUS_SEEDS of
random_multimodal.py in multimodal_random/, each with a vLLM 0.34.0 golden
(NAME.vllm.jsonl) and a 0.33.0 golden (NAME.vllm-0.33.jsonl), both written by
vllm_0_34/oracle.py (compare_live_multimodal.py --write)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from compare_live_multimodal import SUFFIX  # noqa: E402
from random_multimodal import MM_CORPUS_SEEDS, random_multimodal_scenario  # noqa: E402
from random_scenarios import parse_seeds  # noqa: E402

from kvsched.core.scheduler import Scheduler  # noqa: E402
from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.errors import CannotServe  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402

FOLDERS = (HERE / "multimodal", HERE / "multimodal_random")
SCENARIOS = sorted(p for folder in FOLDERS for p in folder.glob("*.json"))
CASES = [(path, version) for path in SCENARIOS for version in SUFFIX]


def test_corpus_is_complete() -> None:
    """Every scenario has both releases' goldens; the random folder holds
    exactly the corpus seeds, as the generator writes them today."""
    assert len(list((HERE / "multimodal").glob("*.json"))) >= 15
    for path in SCENARIOS:
        for version in SUFFIX:
            assert golden_of(path, version).is_file(), (path.name, version)
    seeds = parse_seeds(MM_CORPUS_SEEDS)
    random_dir = HERE / "multimodal_random"
    assert sorted(p.name for p in random_dir.glob("*.json")) == sorted(
        f"random_mm_{s}.json" for s in seeds)
    for seed in seeds[:5]:
        written = json.loads((random_dir / f"random_mm_{seed}.json").read_text())
        assert written == random_multimodal_scenario(seed), seed


def golden_of(path: Path, version: str) -> Path:
    """The release's trace of the scenario: NAME.SUFFIX, or NAME.SUFFIX.stuck
    for one vLLM spins on until max_steps (a livelock)."""
    golden = path.with_name(path.stem + SUFFIX[version])
    stuck = golden.with_name(golden.name + ".stuck")
    return stuck if stuck.exists() else golden


@pytest.mark.parametrize(("path", "version"), CASES,
                         ids=[f"{p.parent.name}/{p.stem}@{v}" for p, v in CASES])
def test_replay_matches_vllm(path: Path, version: str) -> None:
    golden = golden_of(path, version)
    expected = [json.loads(line) for line in golden.read_text().splitlines() if line.strip()]
    out = io.StringIO()
    scenario = load_scenario(str(path), version)
    def check(_step: int, _output: object, _record: object, sched: Scheduler) -> None:
        sched.check_invariants()
    if golden.name.endswith(".stuck"):
        # vLLM never finishes it: kvsched must spin the same way to max_steps.
        with pytest.raises(CannotServe, match="max_steps"):
            replay(scenario, out, on_step=check)
    else:
        replay(scenario, out, on_step=check)
    actual = [json.loads(line) for line in out.getvalue().splitlines()]
    assert first_difference(expected, actual) is None


def test_releases_differ_where_the_rules_do() -> None:
    """The corpus holds scenarios on which 0.33 and 0.34 decide differently
    for the encoder (vllm_versions' two encoder rules), so both rules are
    checked against vLLM, not just one of them."""
    folder = HERE / "multimodal"
    for name in ("release_diff_cut_inside_item", "release_diff_unchunked_cut",
                 "chunked_prefill_off_encoder_cut"):
        new = (folder / f"{name}{SUFFIX['0.34']}").read_text()
        old = (folder / f"{name}{SUFFIX['0.33']}").read_text()
        assert new != old, name
