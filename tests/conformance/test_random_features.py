"""The random_features/ corpus: complete, and exactly what its generator writes.

random_features/random_features_SEED.json are random_features.py's scenarios for
the seeds FEATURE_CORPUS_SEEDS (async scheduling, speculative decoding, the LoRA cap),
each with vLLM 0.33.0's trace NAME.vllm.jsonl from ../shared/reference/vllm_replay.py
(regenerate.py --only random_features rewrites both). kvsched's traces are not
compared here yet.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_features import (  # noqa: E402
    FEATURE_CORPUS_SEEDS,
    feature_scenario_path,
    random_feature_scenario,
    validate_feature_scenario,
)
from random_scenarios import format_scenario, parse_seeds  # noqa: E402

CORPUS = HERE / "random_features"
SEEDS = parse_seeds(FEATURE_CORPUS_SEEDS)


def _golden(path: Path) -> Path:
    return path.with_name(path.stem + ".vllm.jsonl")


def test_corpus_is_complete() -> None:
    expected = {feature_scenario_path(CORPUS, seed).name for seed in SEEDS}
    present = {p.name for p in CORPUS.glob("*.json")}
    assert present == expected, (
        f"missing: {sorted(expected - present)[:10]}, unexpected: {sorted(present - expected)[:10]}"
    )
    missing = [p.name for p in sorted(CORPUS.glob("*.json")) if not _golden(p).exists()]
    assert not missing, f"scenarios without a golden trace: {missing[:10]}"
    orphans = [p.name for p in CORPUS.glob("*.vllm.jsonl")
               if not p.with_name(p.name[: -len(".vllm.jsonl")] + ".json").exists()]
    assert not orphans, f"goldens without a scenario: {orphans[:10]}"


def test_generator_reproduces_the_corpus() -> None:
    """Every committed scenario is byte for byte what the generator gives for its
    seed, so the corpus cannot drift from random_features.py."""
    drifted = []
    for seed in SEEDS:
        path = feature_scenario_path(CORPUS, seed)
        scenario = random_feature_scenario(seed)
        assert not validate_feature_scenario(scenario)
        if not path.exists() or path.read_text() != format_scenario(scenario):
            drifted.append(path.name)
    assert not drifted, (
        f"{len(drifted)} scenarios differ from the generator (first: {drifted[:5]}); "
        "run python tests/conformance/regenerate.py --only random_features"
    )


def test_goldens_carry_the_feature_fields() -> None:
    """A golden has `spec` on every step exactly when its scenario is speculative,
    and `processed` exactly when it is async: the oracle saw the features."""
    wrong = []
    for path in sorted(CORPUS.glob("*.json")):
        scenario = json.loads(path.read_text())
        lines = [json.loads(x) for x in _golden(path).read_text().splitlines() if x.strip()]
        spec = "speculative" in scenario
        use_async = bool(scenario.get("async_scheduling", False))
        if not lines or any(("spec" in s) != spec or ("processed" in s) != use_async for s in lines):
            wrong.append(path.name)
    assert not wrong, f"goldens that do not match their scenario's features: {wrong[:10]}"
