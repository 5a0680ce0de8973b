"""The vLLM release a scheduler follows: one owner of what differs between releases."""

from __future__ import annotations

import pytest

from kvsched.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from kvsched.core.kv_connector import KVTransferConfig, combined_role
from kvsched.core.multi_connector import MultiConnector
from kvsched.core.nixl_connector import NixlConnector
from kvsched.core.scheduler import Scheduler
from kvsched.errors import UserInputError
from kvsched.request import Request, SamplingParams
from kvsched.scenario import parse_scenario
from kvsched.vllm_versions import (
    DEFAULT_VLLM_VERSION,
    EXTENSIBLE_KV_CACHE_GPU_MEMORY_UTILIZATION,
    FLAGS_SINCE,
    VLLM_VERSIONS,
    check_release_flags,
    rules_for,
)


def test_the_modelled_releases_and_the_default() -> None:
    assert VLLM_VERSIONS == ("0.33", "0.34")
    assert DEFAULT_VLLM_VERSION == "0.34"  # the newest modelled release
    assert rules_for("0.33").long_prefill_threshold_needs_chunked_prefill is False
    assert rules_for("0.34").long_prefill_threshold_needs_chunked_prefill is True


@pytest.mark.parametrize("bad", ["0.32", "0.34.0", "", 0.34, None])
def test_an_unmodelled_release_is_refused_by_name(bad: object) -> None:
    with pytest.raises(UserInputError, match=r"vllm_version=.*use one of 0\.33, 0\.34"):
        SchedulerConfig(vllm_version=bad)  # type: ignore[arg-type]
    with pytest.raises(UserInputError, match="vllm_version"):
        parse_scenario({"cache": {"num_gpu_blocks": 64}, "requests": []}, "s.json",
                       vllm_version=bad)  # type: ignore[arg-type]


def _first_step_tokens(version: str) -> dict[str, int]:
    # Two prompts of 100 tokens, threshold 32, chunked prefill off: 0.33 caps each
    # request's step at the threshold, 0.34 ignores it without chunked prefill.
    config = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, max_model_len=512,
                             enable_chunked_prefill=False, long_prefill_token_threshold=32,
                             vllm_version=version)
    sched = Scheduler(config, CacheConfig(num_gpu_blocks=64, block_size=16))
    for i in range(2):
        prompt = list(range(1 + 1000 * i, 101 + 1000 * i))  # distinct: no prefix hit
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=4)))
    out = sched.schedule()
    sched.check_invariants()
    return dict(out.num_scheduled_tokens)


def test_long_prefill_threshold_without_chunked_prefill_per_release() -> None:
    assert _first_step_tokens("0.33") == {"r0": 32, "r1": 32}
    assert _first_step_tokens("0.34") == {"r0": 100, "r1": 100}


@pytest.mark.parametrize("roles, combined", [
    (["kv_both"], "kv_both"),
    (["kv_producer"], "kv_producer"),
    (["kv_consumer"], "kv_consumer"),
    (["kv_producer", "kv_consumer"], "kv_both"),
    (["kv_producer", "kv_producer"], "kv_producer"),
    (["kv_consumer", "kv_both"], "kv_both"),
])
def test_combined_role(roles: list[str], combined: str) -> None:
    assert combined_role(roles) == combined


@pytest.mark.parametrize("version, consumer", [("0.33", False), ("0.34", True)])
def test_multi_connector_role_per_release(version: str, consumer: bool) -> None:
    # A producer MultiConnector over a kv_both child: 0.33 reads its own role,
    # 0.34 its children's.
    child = NixlConnector(KVTransferConfig("kv_both"), 16)
    multi = MultiConnector(KVTransferConfig("kv_producer"), [child], version)
    assert multi.kv_transfer_config.is_kv_consumer is consumer
    assert multi.kv_transfer_config.is_kv_producer is True


@pytest.mark.parametrize("version, runs", [("0.33", False), ("0.34", True)])
def test_ngram_with_async_scheduling_per_release(version: str, runs: bool) -> None:
    # §20: 0.33's V1 model runner refuses method "ngram" with async scheduling;
    # 0.34 runs it as its GPU n-gram speculator. "ngram_gpu" runs on both.
    config = SchedulerConfig(async_scheduling=True, vllm_version=version)
    cache = CacheConfig(num_gpu_blocks=64, block_size=16)
    Scheduler(config, cache, speculative_config=SpeculativeConfig("ngram_gpu", 2))
    if runs:
        sched = Scheduler(config, cache, speculative_config=SpeculativeConfig("ngram", 2))
        assert sched.num_spec_tokens == 2
    else:
        with pytest.raises(UserInputError, match=r"speculative_config\.method='ngram'.*vLLM 0\.33"):
            Scheduler(config, cache, speculative_config=SpeculativeConfig("ngram", 2))
    scenario = {"async_scheduling": True, "speculative": {"num_speculative_tokens": 2, "method": "ngram"},
                "cache": {"num_gpu_blocks": 64}, "requests": []}
    if runs:
        assert parse_scenario(scenario, "s.json", version).speculative_config is not None
    else:
        with pytest.raises(UserInputError, match=r"s\.json: speculative_config\.method='ngram'"):
            parse_scenario(scenario, "s.json", version)


# -- the releases' cache defaults (docs/vllm_versions.md §1, §2) ---------------

def test_each_releases_cache_defaults() -> None:
    # vLLM's CacheConfig in each wheel (config/cache.py): DEFAULT_BLOCK_SIZE 16
    # then 64; gpu_memory_utilization 0.92 (0.34: unset, resolved to 0.92
    # without the extensible KV cache and 1.0 with it); the extensible cache
    # (enable_extensible_kv_cache) new in 0.34.
    table = {v: (rules_for(v).default_block_size, rules_for(v).default_gpu_memory_utilization,
                 rules_for(v).extensible_kv_cache) for v in VLLM_VERSIONS}
    assert table == {"0.33": (16, 0.92, False), "0.34": (64, 0.92, True)}
    assert EXTENSIBLE_KV_CACHE_GPU_MEMORY_UTILIZATION == 1.0
    assert dict(FLAGS_SINCE) == {"enable_extensible_kv_cache": "0.34", "max_num_inflight_kv_loads": "0.34",
                                 "cache_aware_admission_window": "0.34",
                                 "cache_aware_admission_threshold": "0.34"}


def test_a_flag_the_release_lacks_is_refused_by_name() -> None:
    with pytest.raises(UserInputError) as info:
        check_release_flags("0.33", {"enable_extensible_kv_cache": False})
    assert str(info.value) == (
        "enable_extensible_kv_cache=False (--enable-extensible-kv-cache): vLLM 0.33 has no "
        "--enable-extensible-kv-cache (vLLM 0.34 added it); drop it, or simulate vLLM 0.34 with "
        "--vllm-version 0.34")
    check_release_flags("0.33", {"enable_extensible_kv_cache": None})  # not given: nothing to refuse
    check_release_flags("0.34", {"enable_extensible_kv_cache": True})
