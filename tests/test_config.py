"""SchedulerConfig / CacheConfig: vLLM's defaults, and every validation rule
raising a ValueError that names the offending field and value."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvsched import CacheConfig, SchedulerConfig, config, scheduler_defaults


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


# -- one owner for vLLM's engine defaults ------------------------------------------

def test_engine_default_constants_are_vllms() -> None:
    # vLLM's SchedulerConfig / CacheConfig class defaults, written out by hand.
    assert (config.DEFAULT_MAX_NUM_BATCHED_TOKENS, config.DEFAULT_MAX_NUM_SEQS) == (2048, 128)
    # The scenario format's block size (a deployment's is its release's:
    # tests/test_vllm_versions.py).
    assert config.DEFAULT_BLOCK_SIZE == 16
    assert scheduler_defaults.DEFAULT_MAX_NUM_SEQS == 128
    assert scheduler_defaults.DEFAULT_MAX_NUM_BATCHED_TOKENS == 2048


def test_num_gpu_blocks_override_is_bounded_by_the_block_pool() -> None:
    config.check_num_gpu_blocks_override(2**24)
    with pytest.raises(ValueError, match=r"num_gpu_blocks_override=16777217: must be at most 16,777,216"
                                         r".*--num-gpu-blocks-override"):
        config.check_num_gpu_blocks_override(2**24 + 1)


# -- one owner for vLLM's speculative methods --------------------------------------

@pytest.mark.parametrize(("spelling", "method"), [
    ("ngram", "ngram"), ("[ngram]", "ngram"), ("ngram_gpu", "ngram_gpu"), ("eagle", "eagle"),
    ("eagle3", "eagle3"), ("mtp", "mtp"), ("deepseek_mtp", "mtp"), ("qwen3_next_mtp", "mtp"),
    ("mimo_mtp", "mtp"), ("glm4_moe_mtp", "mtp"), ("ernie_mtp", "mtp"), ("longcat_flash_mtp", "mtp"),
])
def test_vllms_spellings_resolve_to_their_method(spelling: str, method: str) -> None:
    assert config.resolve_speculative_method(spelling, config.SPECULATIVE_METHODS, "refused") == method


def test_a_vllm_method_outside_the_callers_is_refused_with_its_reason() -> None:
    for spelling in ("eagle", "deepseek_mtp", "medusa", "suffix", "draft_model"):
        with pytest.raises(ValueError, match=r"^speculative_config\.method='[a-z_]+': runs n-gram only$"):
            config.resolve_speculative_method(spelling, config.NGRAM_METHODS, "runs n-gram only")
    with pytest.raises(ValueError, match=r"^speculative_config\.method='ngrams': unknown speculative "
                                         r"method; did you mean 'ngram'\? use one of ngram, ngram_gpu$"):
        config.resolve_speculative_method("ngrams", config.NGRAM_METHODS, "runs n-gram only")
    with pytest.raises(ValueError, match=r"speculative_config\.method=5: must be a string"):
        config.resolve_speculative_method(5, config.NGRAM_METHODS, "runs n-gram only")


# What each spelling is to the engine (n-gram only) and to the simulator
# (every method it prices), written out by hand: "unknown" for a name vLLM
# does not have, "refused" for vLLM's method the reader does not take.
SPELLINGS = [
    ("ngram", "ngram", "ngram"), ("[ngram]", "ngram", "ngram"), ("ngram_gpu", "ngram_gpu", "ngram_gpu"),
    ("eagle", "refused", "eagle"), ("eagle3", "refused", "eagle3"), ("mtp", "refused", "mtp"),
    ("deepseek_mtp", "refused", "mtp"), ("qwen3_next_mtp", "refused", "mtp"),
    ("medusa", "refused", "refused"), ("suffix", "refused", "refused"),
    ("draft_model", "refused", "refused"), ("mlp_speculator", "refused", "refused"),
    ("Ngram", "unknown", "unknown"), ("ngrm", "unknown", "unknown"), ("eagle4", "unknown", "unknown"),
    ("", "unknown", "unknown"),
]


def _outcome(read: Any) -> str:
    try:
        return str(read())
    except ValueError as err:
        return "unknown" if "unknown speculative method" in str(err) else "refused"


@pytest.mark.parametrize(("spelling", "engine", "simulator"), SPELLINGS)
def test_the_engine_and_the_simulator_take_the_same_spellings(spelling: str, engine: str,
                                                              simulator: str) -> None:
    from kvsched.engine.args import engine_speculative_config
    from kvsched.perf import get_model
    from kvsched.sim.speculative import parse_speculative_config

    spec = {"method": spelling, "num_speculative_tokens": 2}
    # ngram_gpu runs in the engine with async scheduling only.
    use_async = engine == "ngram_gpu"

    def run_engine() -> str:
        parsed = engine_speculative_config(spec, use_async)
        assert parsed is not None
        return parsed.method

    def run_simulator() -> str:
        # eagle needs a drafter checkpoint name in vLLM; DeepSeek-V3 has MTP layers.
        given = dict(spec, model="drafter") if spelling.startswith("eagle") else spec
        return parse_speculative_config(given, get_model("deepseek-ai/DeepSeek-V3"), False).method

    assert (_outcome(run_engine), _outcome(run_simulator)) == (engine, simulator)
