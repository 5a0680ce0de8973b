"""SchedulerConfig / CacheConfig: vLLM's defaults, and every validation rule
raising a ValueError that names the offending field and value."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvsched import CacheConfig, SchedulerConfig


def _raises_naming(cls: type, field: str, value: object, **kwargs: Any) -> None:
    with pytest.raises(ValueError) as info:
        cls(**kwargs)
    message = str(info.value)
    assert field in message, message
    assert str(value) in message, message


# -- defaults -----------------------------------------------------------------

def test_scheduler_defaults_are_vllms() -> None:
    config = SchedulerConfig()
    assert config.max_num_batched_tokens == 2048
    assert config.max_num_seqs == 128
    assert config.enable_chunked_prefill is True
    assert config.long_prefill_token_threshold == 0
    assert config.max_num_partial_prefills == 1
    assert config.max_long_partial_prefills == 1
    assert config.policy == "fcfs"
    assert config.scheduler_reserve_full_isl is True


def test_cache_defaults_are_vllms() -> None:
    config = CacheConfig(num_gpu_blocks=10)
    assert config.block_size == 16
    assert config.enable_prefix_caching is True
    assert config.num_gpu_blocks == 10


def test_configs_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SchedulerConfig().max_num_seqs = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        CacheConfig(num_gpu_blocks=4).block_size = 8  # type: ignore[misc]


# -- SchedulerConfig rules ------------------------------------------------------

POSITIVE_INT_FIELDS = ["max_num_batched_tokens", "max_num_seqs", "max_model_len",
                       "max_num_partial_prefills", "max_long_partial_prefills"]


@pytest.mark.parametrize("field", POSITIVE_INT_FIELDS)
@pytest.mark.parametrize("value", [0, -3])
def test_positive_fields_reject_non_positive(field: str, value: int) -> None:
    _raises_naming(SchedulerConfig, field, value, **{field: value})


@pytest.mark.parametrize("field", POSITIVE_INT_FIELDS)
@pytest.mark.parametrize("value", [2.5, "64", True, None])
def test_positive_fields_reject_non_integers(field: str, value: object) -> None:
    _raises_naming(SchedulerConfig, field, value, **{field: value})


@pytest.mark.parametrize("value", [-1, 1.5, "8", False])
def test_long_prefill_token_threshold_must_be_non_negative_int(value: object) -> None:
    _raises_naming(SchedulerConfig, "long_prefill_token_threshold", value,
                   long_prefill_token_threshold=value)


def test_long_prefill_token_threshold_cannot_exceed_max_model_len() -> None:
    _raises_naming(SchedulerConfig, "long_prefill_token_threshold", 1025,
                   max_model_len=1024, long_prefill_token_threshold=1025)


@pytest.mark.parametrize("policy", ["lifo", "FCFS", ""])
def test_unknown_policy(policy: str) -> None:
    _raises_naming(SchedulerConfig, "policy", repr(policy), policy=policy)


def test_no_chunked_prefill_needs_budget_for_a_whole_prompt() -> None:
    _raises_naming(SchedulerConfig, "max_num_batched_tokens", 2048,
                   enable_chunked_prefill=False, max_num_batched_tokens=2048, max_model_len=2049)


def test_budget_must_cover_max_num_seqs() -> None:
    _raises_naming(SchedulerConfig, "max_num_batched_tokens", 127,
                   max_num_batched_tokens=127, max_num_seqs=128)


def test_partial_prefills_need_chunked_prefill() -> None:
    _raises_naming(SchedulerConfig, "max_num_partial_prefills", 2,
                   enable_chunked_prefill=False, max_model_len=2048, max_num_partial_prefills=2)


def test_long_partial_prefills_cannot_exceed_partial_prefills() -> None:
    _raises_naming(SchedulerConfig, "max_long_partial_prefills", 3,
                   max_num_partial_prefills=2, max_long_partial_prefills=3)


@pytest.mark.parametrize("kwargs", [
    {},
    # Each rule at its boundary: equal is allowed.
    {"enable_chunked_prefill": False, "max_num_batched_tokens": 4096, "max_model_len": 4096},
    {"max_num_batched_tokens": 8, "max_num_seqs": 8},
    {"max_model_len": 512, "long_prefill_token_threshold": 512},
    {"max_num_partial_prefills": 4, "max_long_partial_prefills": 4},
    {"enable_chunked_prefill": False, "max_model_len": 2048, "max_num_partial_prefills": 1},
    {"max_num_batched_tokens": 1, "max_num_seqs": 1, "max_model_len": 1},
    {"policy": "priority", "scheduler_reserve_full_isl": False},
])
def test_valid_scheduler_configs_construct(kwargs: dict[str, Any]) -> None:
    config = SchedulerConfig(**kwargs)
    for key, value in kwargs.items():
        assert getattr(config, key) == value


# -- CacheConfig rules ------------------------------------------------------------

@pytest.mark.parametrize("value", [0, -16, 1.0, "16", True])
def test_block_size_must_be_positive_int(value: object) -> None:
    _raises_naming(CacheConfig, "block_size", value, num_gpu_blocks=8, block_size=value)


@pytest.mark.parametrize("value", [0, -1, 8.0, "8", None])
def test_num_gpu_blocks_must_be_positive_int(value: object) -> None:
    _raises_naming(CacheConfig, "num_gpu_blocks", value, num_gpu_blocks=value)


def test_num_gpu_blocks_needs_more_than_the_null_block() -> None:
    _raises_naming(CacheConfig, "num_gpu_blocks", 1, num_gpu_blocks=1)


@pytest.mark.parametrize("kwargs", [
    {"num_gpu_blocks": 2, "block_size": 1},
    {"num_gpu_blocks": 1000, "block_size": 32, "enable_prefix_caching": False},
])
def test_valid_cache_configs_construct(kwargs: dict[str, Any]) -> None:
    config = CacheConfig(**kwargs)
    for key, value in kwargs.items():
        assert getattr(config, key) == value
