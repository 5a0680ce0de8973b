"""Hybrid KV cache groups (cache.kv_groups): kvsched against vLLM's committed traces.

hybrid/scenarios/NAME.json are hand-written scenarios, one or two behaviours of a
group kind each (sliding window, chunked local attention, Mamba state, their
mixes with full attention, prefix hits, the shared-prefix junction, eviction and
preemption, the admission cap, different block sizes); hybrid/random/ holds
random_hybrid.py's seeds HYBRID_CORPUS_SEEDS; hybrid/multimodal/ random
multimodal scenarios with a second group (hybrid_multimodal_scenario). Each has vLLM 0.34.0's trace
NAME.vllm.jsonl and vLLM 0.33.0's NAME.vllm033.jsonl, both from
vllm_0_34/oracle.py (on each release's venv; compare_live_hybrid.py --write-corpus
rewrites the random ones). kvsched replays every one under the matching
--vllm-version and must give the same trace, the per-group block counts
(`group_blocks`) included.
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
from random_hybrid import (  # noqa: E402
    HYBRID_CORPUS_SEEDS,
    HYBRID_MM_CORPUS_SEEDS,
    hybrid_multimodal_scenario,
    hybrid_scenario_path,
    random_hybrid_scenario,
    seed_of,
)
from random_scenarios import format_scenario, parse_seeds  # noqa: E402

from kvsched.config import CacheConfig, KVCacheGroup, SchedulerConfig, SpeculativeConfig  # noqa: E402
from kvsched.core.hybrid_kv_cache import HybridKVCacheManager, make_kv_cache_manager  # noqa: E402
from kvsched.core.kv_cache_manager import KVCacheManager  # noqa: E402
from kvsched.core.scheduler import Scheduler  # noqa: E402
from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.errors import UserInputError  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402

ROOT = HERE / "hybrid"
GOLDEN_SUFFIXES = {"0.34": ".vllm.jsonl", "0.33": ".vllm033.jsonl"}
SCENARIOS = [p for folder in ("scenarios", "random", "multimodal")
             for p in sorted((ROOT / folder).glob("*.json"))]


def _golden(path: Path, version: str) -> Path:
    return path.with_name(path.stem + GOLDEN_SUFFIXES[version])


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_corpus_is_complete() -> None:
    expected = {hybrid_scenario_path(ROOT / "random", s).name for s in parse_seeds(HYBRID_CORPUS_SEEDS)}
    assert {p.name for p in (ROOT / "random").glob("*.json")} == expected
    assert len(list((ROOT / "scenarios").glob("*.json"))) >= 10
    missing = [_golden(p, v).name for p in SCENARIOS for v in GOLDEN_SUFFIXES if not _golden(p, v).exists()]
    assert not missing, f"scenarios without a golden: {missing[:10]}"


def test_generator_reproduces_the_random_corpus() -> None:
    drifted = [s for s in parse_seeds(HYBRID_CORPUS_SEEDS)
               if hybrid_scenario_path(ROOT / "random", s).read_text()
               != format_scenario(random_hybrid_scenario(s))]
    assert not drifted, (f"seeds {drifted[:5]} differ from random_hybrid.py; rerun "
                         "compare_live_hybrid.py --write-corpus for both releases")


def test_generator_reproduces_the_multimodal_corpus() -> None:
    """hybrid/multimodal/ holds hybrid_multimodal_scenario's seeds of
    HYBRID_MM_CORPUS_SEEDS that vLLM finishes on both releases, as written."""
    paths = sorted((ROOT / "multimodal").glob("*.json"))
    assert len(paths) >= 20
    allowed = set(parse_seeds(HYBRID_MM_CORPUS_SEEDS))
    with_items = 0
    for path in paths:
        seed = seed_of(path)
        scenario = hybrid_multimodal_scenario(seed)
        assert seed in allowed and scenario is not None, path.name
        assert path.read_text() == format_scenario(scenario), path.name
        with_items += any("mm_items" in r for r in scenario["requests"])
    assert with_items >= 20, "the corpus should exercise the encoder path"


def test_goldens_carry_the_group_view() -> None:
    """vLLM saw the groups: every line has one [length, real blocks] per group
    for every running request."""
    for path in SCENARIOS:
        num_groups = len(json.loads(path.read_text())["cache"]["kv_groups"])
        for version in GOLDEN_SUFFIXES:
            for line in _lines(_golden(path, version)):
                assert len(line["group_blocks"]) == line["num_running"], path.name
                assert all(len(v) == num_groups for v in line["group_blocks"].values()), path.name


@pytest.mark.parametrize("version", sorted(GOLDEN_SUFFIXES))
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_kvsched_matches_vllm(path: Path, version: str) -> None:
    out = io.StringIO()
    replay(load_scenario(str(path), version), out)
    actual = [json.loads(x) for x in out.getvalue().splitlines()]
    diff = first_difference(_lines(_golden(path, version)), actual)
    assert diff is None, f"{path.name} on vLLM {version}: {diff}"


def _cache(**kw: object) -> CacheConfig:
    groups = (KVCacheGroup("full_attention", 4), KVCacheGroup("sliding_window", 4, sliding_window=8))
    args: dict = {"num_gpu_blocks": 64, "block_size": 4, "kv_groups": groups}
    args.update(kw)
    return CacheConfig(**args)


def test_one_full_attention_group_keeps_the_fast_manager() -> None:
    """kv_groups of one full-attention group of block_size is today's cache:
    the fast single-group manager, not the coordinator."""
    one = CacheConfig(num_gpu_blocks=8, block_size=16, kv_groups=(KVCacheGroup("full_attention", 16),))
    assert type(make_kv_cache_manager(one, 128, 256)) is KVCacheManager
    assert type(make_kv_cache_manager(CacheConfig(num_gpu_blocks=8), 128, 256)) is KVCacheManager
    assert type(make_kv_cache_manager(_cache(), 128, 256)) is HybridKVCacheManager


@pytest.mark.parametrize("kw, needle", [
    ({"block_size": 8}, "cache.block_size=8"),
    ({"hash_block_size": 2}, "cache.hash_block_size=2"),
    ({"mamba_cache_mode": "align", "enable_prefix_caching": False}, "cache.mamba_cache_mode='align'"),
    ({"kv_groups": (KVCacheGroup("full_attention", 8), KVCacheGroup("mamba", 4)), "block_size": 8,
      "enable_prefix_caching": True}, "mamba group with prefix caching on"),
    ({"kv_groups": (KVCacheGroup("full_attention", 4),), "prefix_cache_retention_interval": 4},
     "prefix_cache_retention_interval=4"),
    ({"prefix_cache_retention_interval": 6}, "multiple of the scheduler block size 4"),
])
def test_unmodelled_or_invalid_layouts_are_refused(kw: dict, needle: str) -> None:
    with pytest.raises(UserInputError) as err:
        make_kv_cache_manager(_cache(**kw), 128, 256)
    assert needle in str(err.value)


@pytest.mark.parametrize("what", ["pp", "spec_mamba", "drafter"])
def test_unmodelled_features_are_refused(what: str) -> None:
    sc = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256,
                         pipeline_parallel_size=2 if what == "pp" else 1)
    cache = _cache()
    spec = None
    if what == "spec_mamba":
        spec = SpeculativeConfig("ngram", 2)
        cache = _cache(kv_groups=(KVCacheGroup("full_attention", 4), KVCacheGroup("mamba", 4)))
    elif what == "drafter":
        spec = SpeculativeConfig("eagle", 2)
    with pytest.raises(UserInputError, match=r"cache\.kv_groups"):
        Scheduler(sc, cache, speculative_config=spec)


def test_ngram_speculative_decoding_runs_with_window_groups() -> None:
    sc = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    Scheduler(sc, _cache(), speculative_config=SpeculativeConfig("ngram", 2))


def test_scenario_keys_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    base = {"cache": {"num_gpu_blocks": 10, "block_size": 4,
                      "kv_groups": [{"kind": "sliding_window", "block_size": 4}]}, "requests": []}
    path.write_text(json.dumps(base))
    with pytest.raises(UserInputError, match="sliding_window"):
        load_scenario(str(path))
    base["cache"]["kv_groups"] = [{"kind": "full_attention", "block_size": 4, "window": 3}]
    path.write_text(json.dumps(base))
    with pytest.raises(UserInputError, match=r"cache.kv_groups\[0\].window: unknown key"):
        load_scenario(str(path))
    base["cache"]["kv_groups"] = [{"kind": "linear", "block_size": 4}]
    path.write_text(json.dumps(base))
    with pytest.raises(UserInputError, match="unknown KV cache group kind"):
        load_scenario(str(path))


def test_prefill_checkpoint_keys(tmp_path: Path) -> None:
    """A Mamba group's prefill checkpoint keys reach its KVCacheGroup; on
    another kind, below 0 (blocks) or below 1 (alignment) they are refused."""
    path = tmp_path / "ckpt.json"
    mamba = {"kind": "mamba", "block_size": 4, "num_prefill_checkpoint_blocks": 1,
             "prefill_checkpoint_alignment": 4}
    base: dict = {"cache": {"num_gpu_blocks": 10, "block_size": 4,
                            "kv_groups": [{"kind": "full_attention", "block_size": 4}, mamba]},
                  "requests": []}
    path.write_text(json.dumps(base))
    group = load_scenario(str(path)).cache_config.kv_groups[1]
    assert (group.num_prefill_checkpoint_blocks, group.prefill_checkpoint_alignment) == (1, 4)
    for key, value, needle in (
            ("num_prefill_checkpoint_blocks", -1, "must be >= 0"),
            ("prefill_checkpoint_alignment", 0, "must be >= 1")):
        base["cache"]["kv_groups"][1] = {**mamba, key: value}
        path.write_text(json.dumps(base))
        with pytest.raises(UserInputError, match=rf"kv_groups\[1\]\.{key}=.*{needle}"):
            load_scenario(str(path))
    base["cache"]["kv_groups"][1] = mamba
    base["cache"]["kv_groups"][0] = {"kind": "full_attention", "block_size": 4,
                                     "num_prefill_checkpoint_blocks": 1}
    path.write_text(json.dumps(base))
    with pytest.raises(UserInputError, match="only a mamba group has a prefill checkpoint"):
        load_scenario(str(path))
    with pytest.raises(UserInputError, match="prefill_checkpoint_alignment"):
        KVCacheGroup("sliding_window", 4, sliding_window=8, prefill_checkpoint_alignment=4)
