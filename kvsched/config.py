"""Scheduler and KV-cache configuration, with vLLM's names, defaults and rules.

Every rule raises a ``ValueError`` that names the field, the value and the fix,
so a bad flag never turns into a hang or a traceback deep in the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("fcfs", "priority")
# The bound on a step's sequences and tokens (max_num_seqs,
# max_num_batched_tokens) and on a sequence's tokens (max_model_len) that
# every input - a flag, a scenario file - is checked against: 2**24. No GPU
# holds the activations of that many tokens in one step, and no model's
# context is that long (the longest published is 10M tokens).
MAX_STEP_LIMIT = 2**24


def _fail(field: str, value: object, rule: str, fix: str) -> ValueError:
    return ValueError(f"{field}={value!r}: {rule}; {fix}")


def _require_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(name, value, "must be an integer", f"pass a whole number for {name}")
    if value < 1:
        raise _fail(name, value, "must be positive", f"set {name} to 1 or more")


def check_long_prefill_token_threshold(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail("long_prefill_token_threshold", value,
                    "must be a non-negative integer", "use 0 to disable the cap")


def check_gpu_memory_utilization(value: object) -> None:
    """vLLM's ``gpu_memory_utilization``: a fraction of device memory in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise _fail("gpu_memory_utilization", value, "must be a fraction in (0, 1]",
                    "e.g. 0.9 gives the engine 90 % of the device's memory")


def check_num_gpu_blocks_override(value: object) -> None:
    """None (size the cache from memory) or at least 2 blocks."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise _fail("num_gpu_blocks_override", value,
                    "must be an integer >= 2 (one block is vLLM's reserved null block)",
                    "leave it unset to size the cache from memory")


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """What vLLM calls ``SchedulerConfig`` (plus ``max_model_len``).

    ``max_num_partial_prefills`` and ``max_long_partial_prefills`` are accepted
    and validated as vLLM's engine arguments are, but vLLM 0.33's v1 scheduler
    never reads them, so neither does kvsched's.
    """

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    policy: str = "fcfs"
    scheduler_reserve_full_isl: bool = True

    def __post_init__(self) -> None:
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len",
                     "max_num_partial_prefills", "max_long_partial_prefills"):
            _require_positive(name, getattr(self, name))
        threshold = self.long_prefill_token_threshold
        check_long_prefill_token_threshold(threshold)
        if self.policy not in POLICIES:
            raise _fail("policy", self.policy, "unknown scheduling policy",
                        "use 'fcfs' or 'priority'")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise _fail(
                "max_num_batched_tokens", self.max_num_batched_tokens,
                f"is smaller than max_model_len ({self.max_model_len}) with chunked "
                "prefill disabled, so long prompts could never be scheduled",
                "raise max_num_batched_tokens, lower max_model_len, or enable chunked prefill")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise _fail(
                "max_num_batched_tokens", self.max_num_batched_tokens,
                f"must be at least max_num_seqs ({self.max_num_seqs})",
                "raise max_num_batched_tokens or lower max_num_seqs")
        if threshold > self.max_model_len:
            raise _fail(
                "long_prefill_token_threshold", threshold,
                f"cannot exceed max_model_len ({self.max_model_len})",
                "lower the threshold (0 disables it)")
        if self.max_num_partial_prefills > 1 and not self.enable_chunked_prefill:
            raise _fail(
                "max_num_partial_prefills", self.max_num_partial_prefills,
                "concurrent partial prefills need chunked prefill",
                "enable chunked prefill or set max_num_partial_prefills to 1")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise _fail(
                "max_long_partial_prefills", self.max_long_partial_prefills,
                f"cannot exceed max_num_partial_prefills ({self.max_num_partial_prefills})",
                "lower max_long_partial_prefills")


@dataclass(slots=True, frozen=True)
class CacheConfig:
    """The paged KV cache: ``num_gpu_blocks`` counts vLLM's reserved null block."""

    num_gpu_blocks: int
    block_size: int = 16
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _require_positive("block_size", self.block_size)
        _require_positive("num_gpu_blocks", self.num_gpu_blocks)
        if self.num_gpu_blocks < 2:
            raise _fail("num_gpu_blocks", self.num_gpu_blocks,
                        "one block is vLLM's reserved null block, so no KV would fit",
                        "use at least 2 blocks")
