"""vLLM's scheduler-limit and KV-cache defaults (kvsched.scheduler_defaults).

Expected values are vLLM 0.33.0's ``EngineArgs.get_batch_defaults`` and
``_set_default_max_num_seqs_and_batched_tokens_args``, written out by hand.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvsched.errors import UserInputError
from kvsched.scheduler_defaults import (
    CacheDefaults,
    DeviceInfo,
    Platform,
    SchedulerLimits,
    UsageContext,
    check_optional_limit,
    get_batch_defaults,
    preferred_block_size,
    resolve_cache_defaults,
    resolve_scheduler_limits,
)

GIB = 2**30
LLM_CLASS = UsageContext.LLM_CLASS
SERVE = UsageContext.OPENAI_API_SERVER
H100 = DeviceInfo("gpu", 80 * GIB, "NVIDIA H100 80GB HBM3")
B200 = DeviceInfo("gpu", 179 * GIB, "NVIDIA B200")
A100 = DeviceInfo("gpu", 80 * GIB, "NVIDIA A100-SXM4-80GB")
L40S = DeviceInfo("gpu", 45 * GIB, "NVIDIA L40S")
CPU = DeviceInfo("cpu", 0, "cpu")


@pytest.mark.parametrize(("context", "device", "expected"), [
    (LLM_CLASS, B200, (16384, 1024)), (SERVE, B200, (16384, 1024)),
    (LLM_CLASS, H100, (16384, 1024)), (SERVE, H100, (8192, 1024)),
    # A100s stay on the small tier despite 80 GiB.
    (LLM_CLASS, A100, (8192, 256)), (SERVE, A100, (2048, 256)),
    (LLM_CLASS, L40S, (8192, 256)), (SERVE, L40S, (2048, 256)),
    (LLM_CLASS, CPU, (4096, 256)), (SERVE, CPU, (2048, 128)),
    (LLM_CLASS, DeviceInfo("cpu", 0, "cpu", world_size=2), (8192, 512)),
    (SERVE, DeviceInfo("cpu", 0, "cpu", world_size=2), (4096, 256)),
])
def test_batch_defaults_by_usage_context_and_device(context: UsageContext, device: DeviceInfo,
                                                     expected: tuple[int, int]) -> None:
    assert get_batch_defaults(context, device) == expected


def test_batch_defaults_need_a_usage_context() -> None:
    with pytest.raises(TypeError, match="usage_context"):
        get_batch_defaults("OPENAI_API_SERVER", H100)  # type: ignore[arg-type]


def _resolve(context: UsageContext = SERVE, device: DeviceInfo = H100, *, seqs: int | None = None,
             batched: int | None = None, max_len: int | None = None, max_pos: int = 32768,
             chunked: bool = True) -> SchedulerLimits:
    return resolve_scheduler_limits(context, device, max_num_seqs=seqs, max_num_batched_tokens=batched,
                                    max_model_len=max_len, max_position_embeddings=max_pos,
                                    enable_chunked_prefill=chunked)


def test_unset_limits_take_the_context_defaults_and_the_model_length() -> None:
    assert _resolve(SERVE) == SchedulerLimits(1024, 8192, 32768)
    assert _resolve(LLM_CLASS) == SchedulerLimits(1024, 16384, 32768)
    assert _resolve(LLM_CLASS, CPU) == SchedulerLimits(256, 4096, 32768)


def test_given_limits_are_kept() -> None:
    assert _resolve(seqs=7, batched=300, max_len=1000) == SchedulerLimits(7, 300, 1000)
    # A given budget is not raised for chunked prefill off (SchedulerConfig then judges it).
    assert _resolve(batched=300, max_len=1000, chunked=False).max_num_batched_tokens == 300


def test_chunked_prefill_off_raises_the_default_budget_to_max_model_len() -> None:
    assert _resolve(SERVE, L40S, chunked=False).max_num_batched_tokens == 32768
    assert _resolve(SERVE, L40S, max_len=1000, chunked=False).max_num_batched_tokens == 2048


def test_default_budget_is_capped_at_max_num_seqs_times_max_model_len() -> None:
    assert _resolve(seqs=2, max_len=100).max_num_batched_tokens == 200


def test_default_max_num_seqs_is_capped_at_the_budget() -> None:
    assert _resolve(batched=64).max_num_seqs == 64
    assert _resolve(seqs=2048, batched=64).max_num_seqs == 2048  # given: kept


def test_max_model_len_above_the_model_is_refused() -> None:
    with pytest.raises(ValueError, match=r"max_model_len=40000 \(--max-model-len\).*32768"):
        _resolve(max_len=40000)


@pytest.mark.parametrize("field", ["seqs", "batched", "max_len"])
@pytest.mark.parametrize("value", [0, -1])
def test_zero_or_negative_is_refused_not_read_as_default(field: str, value: int) -> None:
    name = {"seqs": "max_num_seqs", "batched": "max_num_batched_tokens", "max_len": "max_model_len"}[field]
    with pytest.raises(ValueError, match=rf"{name}={value} \(--{name.replace('_', '-')}\)"):
        _resolve(**{field: value})  # type: ignore[arg-type]


def test_device_info_is_checked() -> None:
    with pytest.raises(ValueError, match="device_type"):
        DeviceInfo("tpu", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="world_size"):
        DeviceInfo("cpu", 0, world_size=0)


@pytest.mark.parametrize("field", ["max_num_seqs", "max_num_batched_tokens", "max_model_len"])
def test_limits_above_2_to_the_24_are_refused_naming_the_flag(field: str) -> None:
    check_optional_limit(field, 2**24)
    flag = "--" + field.replace("_", "-")
    with pytest.raises(ValueError, match=rf"^{field}=16777217 \({flag}\): must be at most 16,777,216"):
        check_optional_limit(field, 2**24 + 1)
    with pytest.raises(ValueError, match=rf"^{field}=<a 400-digit integer> \({flag}\): must be at most"):
        check_optional_limit(field, int("9" * 400))


# -- the KV cache's defaults per release and platform -------------------------
# Expected values from the two wheels: CacheConfig.DEFAULT_BLOCK_SIZE (16, 64),
# the backends' get_preferred_block_size (FlashAttention MultipleOf(16),
# CPU_ATTN MultipleOf(32)), resolved_gpu_memory_utilization (1.0 with the
# extensible cache, else 0.92) and VllmConfig._resolve_extensible_kv_cache.

def _cache(version: str, platform: Platform, **given: object) -> CacheDefaults:
    kwargs: dict[str, Any] = {"block_size": None, "gpu_memory_utilization": None, **given}
    return resolve_cache_defaults(version, platform, **kwargs)


@pytest.mark.parametrize(("version", "platform", "given", "expected"), [
    ("0.33", "cuda", {}, CacheDefaults(16, 0.92, False)),
    ("0.33", "rocm", {}, CacheDefaults(16, 0.92, False)),
    ("0.33", "cpu", {}, CacheDefaults(32, 0.92, False)),        # CPU_ATTN takes multiples of 32
    ("0.34", "cuda", {}, CacheDefaults(64, 1.0, True)),
    ("0.34", "rocm", {}, CacheDefaults(64, 1.0, True)),
    ("0.34", "cpu", {}, CacheDefaults(64, 0.92, False)),        # 64 is a multiple of 32
    ("0.34", "other", {}, CacheDefaults(64, 0.92, False)),      # extensible: CUDA and ROCm only
    ("0.34", "cuda", {"num_gpu_blocks_override": 100}, CacheDefaults(64, 0.92, False)),
    ("0.34", "cuda", {"registers_kv_cache": True}, CacheDefaults(64, 0.92, False)),  # NIXL, no IMEX
    ("0.34", "cuda", {"registers_kv_cache": True, "enable_extensible_kv_cache": True},
     CacheDefaults(64, 1.0, True)),                             # vLLM allows it on CUDA, with a warning
    ("0.34", "cuda", {"enable_extensible_kv_cache": False}, CacheDefaults(64, 0.92, False)),
    ("0.34", "cuda", {"can_extend": False}, CacheDefaults(64, 0.92, False)),
    # Given values are kept.
    ("0.34", "cuda", {"block_size": 16, "gpu_memory_utilization": 0.9}, CacheDefaults(16, 0.9, True)),
    ("0.33", "cpu", {"block_size": 16, "gpu_memory_utilization": 0.5}, CacheDefaults(16, 0.5, False)),
])
def test_cache_defaults_by_release_and_platform(version: str, platform: Platform, given: dict[str, object],
                                                expected: CacheDefaults) -> None:
    assert _cache(version, platform, **given) == expected


def test_the_preferred_block_size_is_the_default_where_the_backend_takes_it() -> None:
    assert [preferred_block_size(d, m) for d, m in ((16, 16), (16, 32), (64, 16), (64, 32), (64, 128))] \
        == [16, 32, 64, 64, 128]


@pytest.mark.parametrize(("version", "platform", "given", "match"), [
    ("0.33", "cuda", {"enable_extensible_kv_cache": True}, r"vLLM 0\.33 has no --enable-extensible-kv-cache"),
    ("0.34", "other", {"enable_extensible_kv_cache": True}, r"runs on CUDA and ROCm only"),
    ("0.34", "cuda", {"enable_extensible_kv_cache": True, "num_gpu_blocks_override": 100},
     r"num_gpu_blocks_override \(--num-gpu-blocks-override\) overrides"),
    ("0.34", "rocm", {"enable_extensible_kv_cache": True, "registers_kv_cache": True},
     r"on ROCm, UCX and RDMA cannot register"),
])
def test_an_extensible_cache_that_cannot_be_is_refused(version: str, platform: Platform,
                                                       given: dict[str, object], match: str) -> None:
    prefix = r"^enable_extensible_kv_cache=True \(--enable-extensible-kv-cache\): .*"
    with pytest.raises(UserInputError, match=prefix + match):
        _cache(version, platform, **given)
