"""vLLM 0.33's defaults for the scheduler limits an engine starts with.

``vllm serve`` and the offline ``LLM`` class leave ``max_num_seqs``,
``max_num_batched_tokens`` and ``max_model_len`` unset unless the user gives
them, and vLLM fills them in ``EngineArgs.create_engine_config`` from the
*usage context* (which entry point built the engine) and the device. Both of
kvsched's entry points resolve them here: ``kvsched simulate`` as
``OPENAI_API_SERVER`` (it models ``vllm serve``), ``kvsched.LLM`` as
``LLM_CLASS``. Torch-free, so the simulator and the CLI can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from kvsched.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, MAX_STEP_LIMIT

# vLLM's SchedulerConfig class defaults (owned by kvsched.config, beside the
# class), named here too as the fallback of ``get_batch_defaults``.
from kvsched.engine_flags import option
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.jsonfile import show

__all__ = ["DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "DEVICE_TYPES", "DeviceInfo",
           "DeviceType", "SchedulerLimits", "UsageContext", "check_optional_limit",
           "get_batch_defaults", "resolve_scheduler_limits"]

GIB = 2**30

DeviceType = Literal["gpu", "cpu"]
DEVICE_TYPES: tuple[DeviceType, ...] = ("gpu", "cpu")


class UsageContext(Enum):
    """vLLM's ``UsageContext`` values that choose defaults."""

    LLM_CLASS = "LLM_CLASS"                  # the offline LLM class (kvsched.LLM)
    OPENAI_API_SERVER = "OPENAI_API_SERVER"  # vllm serve (kvsched simulate)


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What vLLM's ``current_platform`` reports for the defaults.

    ``device_type`` "gpu" is any accelerator vLLM does not treat as a CPU or a
    TPU (CUDA, ROCm, Ascend); ``total_memory`` is one device's memory in bytes;
    ``name`` its device name (vLLM looks for "a100" in it). ``world_size`` is
    pipeline x tensor parallel size: the CPU defaults scale with it.
    """

    device_type: DeviceType
    total_memory: int
    name: str = ""
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.device_type not in DEVICE_TYPES:
            raise UserInputError(f"device_type={self.device_type!r}: use one of {', '.join(DEVICE_TYPES)}")
        if not is_int(self.total_memory) \
                or self.total_memory < 0:
            raise UserInputError(f"total_memory={self.total_memory!r}: must be a byte count >= 0")
        if not is_int(self.world_size) or self.world_size < 1:
            raise UserInputError(f"world_size={self.world_size!r}: must be an integer >= 1")


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int


def get_batch_defaults(usage_context: UsageContext, device: DeviceInfo) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM 0.33 defaults to for this
    entry point on this device (``EngineArgs.get_batch_defaults``).

    GPUs by memory: >= 160 GiB (B200, MI300X) 16384 tokens and 1024 sequences
    for both entry points; >= 70 GiB except A100s (H100, H200) 16384 offline,
    8192 served, 1024 sequences; smaller GPUs and A100s 8192 offline, 2048
    served, 256 sequences. CPUs: 4096 tokens and 256 sequences offline, 2048
    and 128 served, each times the world size. (vLLM also keeps the GB10 on the
    small tier, by compute capability; no catalog device is one.)
    """
    if not isinstance(usage_context, UsageContext):
        raise TypeError(f"usage_context={usage_context!r}: must be a kvsched UsageContext")
    offline = usage_context is UsageContext.LLM_CLASS
    if device.device_type == "cpu":
        n = device.world_size
        # Served on CPU: SchedulerConfig's class defaults.
        return ((4096 if offline else DEFAULT_MAX_NUM_BATCHED_TOKENS) * n,
                (256 if offline else DEFAULT_MAX_NUM_SEQS) * n)
    if device.total_memory >= 160 * GIB:
        return 16384, 1024
    # vLLM measured a regression with the large defaults on A100s (its PR #17885).
    if device.total_memory >= 70 * GIB and "a100" not in device.name.lower():
        return (16384 if offline else 8192), 1024
    return (8192 if offline else 2048), 256


def check_optional_limit(field: str, value: object) -> None:
    """``value`` is None (vLLM's default) or an integer in [1, MAX_STEP_LIMIT];
    0 is refused, not read as "default"."""
    if value is None:
        return
    flag = option(field)
    if not is_int(value) or value < 1:
        raise UserInputError(f"{field}={value!r} ({flag}): must be a positive integer; "
                         f"leave it unset for vLLM's default")
    if value > MAX_STEP_LIMIT:
        raise UserInputError(f"{field}={show(value)} ({flag}): must be at most {MAX_STEP_LIMIT:,} (2**24: no "
                         "GPU holds the activations of a step that large, and no model's context is "
                         "that long); lower it, or leave it unset for vLLM's default")


def resolve_scheduler_limits(
        usage_context: UsageContext, device: DeviceInfo, *, max_num_seqs: int | None,
        max_num_batched_tokens: int | None, max_model_len: int | None,
        max_position_embeddings: int, enable_chunked_prefill: bool) -> SchedulerLimits:
    """The limits an engine starts with: the user's where given (None = unset),
    else vLLM 0.33's defaults (``_set_default_max_num_seqs_and_batched_tokens_args``).

    - ``max_model_len`` defaults to the model's ``max_position_embeddings`` and
      may not exceed it;
    - ``max_num_batched_tokens`` defaults to ``get_batch_defaults``'s, raised to
      ``max_model_len`` when chunked prefill is off (a whole prompt must fit
      one step), then capped at ``max_num_seqs * max_model_len``;
    - ``max_num_seqs`` defaults to ``get_batch_defaults``'s, capped at
      ``max_num_batched_tokens``.

    Values the user gave are never changed; ``SchedulerConfig`` then checks
    them against each other.
    """
    for field, value in (("max_num_seqs", max_num_seqs),
                         ("max_num_batched_tokens", max_num_batched_tokens),
                         ("max_model_len", max_model_len)):
        check_optional_limit(field, value)
    if max_model_len is None:
        max_model_len = max_position_embeddings
    elif max_model_len > max_position_embeddings:
        raise UserInputError(f"max_model_len={max_model_len} (--max-model-len): above the model's "
                         f"max_position_embeddings ({max_position_embeddings}); lower it")
    default_batched, default_seqs = get_batch_defaults(usage_context, device)
    seqs = default_seqs if max_num_seqs is None else max_num_seqs
    batched = max_num_batched_tokens
    if batched is None:
        batched = default_batched
        if not enable_chunked_prefill:
            batched = max(batched, max_model_len)
        batched = min(batched, seqs * max_model_len)
    if max_num_seqs is None:
        seqs = min(seqs, batched)
    return SchedulerLimits(seqs, batched, max_model_len)
