"""vLLM's defaults for the scheduler limits and the KV cache an engine starts with.

``vllm serve`` and the offline ``LLM`` class leave ``max_num_seqs``,
``max_num_batched_tokens`` and ``max_model_len`` unset unless the user gives
them, and vLLM fills them in ``EngineArgs.create_engine_config`` from the
*usage context* (which entry point built the engine) and the device. Both of
kvsched's entry points resolve them here: ``kvsched simulate`` as
``OPENAI_API_SERVER`` (it models ``vllm serve``), ``kvsched.LLM`` as
``LLM_CLASS``. Torch-free, so the simulator and the CLI can import it.

The block size, ``gpu_memory_utilization`` and whether the KV cache is
sized the extensible way are the release's (kvsched.vllm_versions owns the
values) and the platform's: :func:`resolve_cache_defaults`, which the
simulator's deployments and the engine both call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Literal

from kvsched.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, MAX_STEP_LIMIT

# vLLM's SchedulerConfig class defaults (owned by kvsched.config, beside the
# class), named here too as the fallback of ``get_batch_defaults``.
from kvsched.engine_flags import option
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.jsonfile import show
from kvsched.vllm_versions import EXTENSIBLE_KV_CACHE_GPU_MEMORY_UTILIZATION, check_release_flags, rules_for

__all__ = ["DEFAULT_MAX_NUM_BATCHED_TOKENS", "DEFAULT_MAX_NUM_SEQS", "DEVICE_TYPES", "KERNEL_BLOCK_MULTIPLE",
           "PLATFORMS", "CacheDefaults", "DeviceInfo", "DeviceType", "Platform", "SchedulerLimits",
           "UsageContext", "check_optional_limit", "get_batch_defaults", "preferred_block_size",
           "resolve_cache_defaults", "resolve_scheduler_limits"]

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


# Where an engine runs, as vLLM's platform tells: CUDA and ROCm (vLLM's
# "CUDA-alike" platforms, the only ones with the extensible KV cache), a
# CPU, or another accelerator (Ascend through its plugin, TPU).
Platform = Literal["cuda", "rocm", "cpu", "other"]
PLATFORMS: tuple[Platform, ...] = ("cuda", "rocm", "cpu", "other")
# The block sizes the default attention backend takes, as multiples of its
# kernel block (vLLM's get_supported_kernel_block_sizes, the same in 0.33
# and 0.34): FlashAttention and Triton on GPUs MultipleOf(16), CPU_ATTN
# MultipleOf(32). (MLA backends force their own, e.g. FlashMLA 64; not
# modelled: kvsched takes the platform's dense backend.)
KERNEL_BLOCK_MULTIPLE: MappingProxyType[Platform, int] = MappingProxyType(
    {"cuda": 16, "rocm": 16, "cpu": 32, "other": 16})


@dataclass(frozen=True, slots=True)
class CacheDefaults:
    """The KV-cache settings an engine starts with: the user's where given,
    else its release's and platform's (:func:`resolve_cache_defaults`)."""

    block_size: int
    gpu_memory_utilization: float
    # Sized the extensible way (vLLM 0.34: after warmup and CUDA-graph
    # capture, from measured memory; kvsched.perf.memory); False: from the
    # profiling estimate.
    extensible_kv_cache: bool


def preferred_block_size(default: int, multiple: int) -> int:
    """The block size vLLM picks when --block-size is not given
    (``AttentionBackend.get_preferred_block_size``): the release's default
    where the backend takes it, else the smallest size it takes. CPU_ATTN
    (multiples of 32) turns 0.33's 16 into 32; 0.34's 64 stays 64."""
    return default if default % multiple == 0 else multiple


def resolve_cache_defaults(vllm_version: str, platform: Platform, *, block_size: int | None,
                           gpu_memory_utilization: float | None,
                           enable_extensible_kv_cache: bool | None = None,
                           num_gpu_blocks_override: int | None = None,
                           registers_kv_cache: bool = False,
                           can_extend: bool = True, model_kernel_block: int | None = None) -> CacheDefaults:
    """The block size, ``gpu_memory_utilization`` and KV-cache sizing of an
    engine of ``vllm_version`` on ``platform`` (None: not given).

    - block size: the given one, else the release's default as the
      platform's attention backend takes it (:func:`preferred_block_size`),
      and the model's own backends where they need a larger kernel block
      (``model_kernel_block``: DeepSeek Sparse Attention's indexer reads 64
      tokens on CUDA, so 0.33's 16 becomes 64); a given size those cannot
      be split into is refused, as vLLM fails at start-up;
    - the extensible KV cache (releases that have it, ``VllmConfig.
      _resolve_extensible_kv_cache``): when not given, on on CUDA and ROCm
      unless ``num_gpu_blocks_override`` is set or a KV connector registers
      the cache for RDMA (``registers_kv_cache``: NIXL on device memory; on
      ROCm that rules it out, on CUDA NIXL also exports FABRIC handles,
      which need an IMEX channel: kvsched takes none to be open, as on
      machines outside NVL72 racks, so it is off there too) or the engine
      cannot extend a cache (``can_extend`` False: kvsched's own engine
      sizes its cache from a profile run); given on, refused where it is
      ruled out (vLLM raises); given for a release without it, refused;
    - ``gpu_memory_utilization``: the given one, else 1.0 with the
      extensible cache, else the release's default (0.92).
    """
    if platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r}: one of {', '.join(PLATFORMS)}")
    rules = rules_for(vllm_version)
    check_release_flags(vllm_version, {"enable_extensible_kv_cache": enable_extensible_kv_cache})
    multiple = KERNEL_BLOCK_MULTIPLE[platform]
    if model_kernel_block is not None:
        multiple = math.lcm(multiple, model_kernel_block)
        kernel = model_kernel_block
        if block_size is not None and block_size % kernel:
            raise UserInputError(f"block_size={block_size} (--block-size): this model's attention kernels "
                                 f"read {kernel}-token blocks (DeepSeek Sparse Attention's indexer on CUDA), "
                                 f"which vLLM cannot fit in it; use a multiple of {kernel} or leave it unset")
    if block_size is None:
        block_size = preferred_block_size(rules.default_block_size, multiple)
    extensible = False
    if rules.extensible_kv_cache:
        unsupported = None
        if platform not in ("cuda", "rocm"):
            unsupported = "it runs on CUDA and ROCm only"
        elif not can_extend:
            unsupported = "kvsched's engine sizes its KV cache from a profile run, as vLLM without it"
        elif num_gpu_blocks_override is not None:
            unsupported = ("it sizes the KV cache from measured memory, which num_gpu_blocks_override "
                           "(--num-gpu-blocks-override) overrides")
        elif platform == "rocm" and registers_kv_cache:
            unsupported = ("on ROCm, UCX and RDMA cannot register its driver-mapped memory, which "
                           "NixlConnector needs")
        if enable_extensible_kv_cache is None:
            extensible = unsupported is None and not registers_kv_cache
        elif enable_extensible_kv_cache and unsupported is not None:
            raise UserInputError(f"enable_extensible_kv_cache=True (--enable-extensible-kv-cache): "
                                 f"{unsupported}; drop the flag (vLLM {vllm_version} then sizes the cache "
                                 "from its profiling estimate)")
        else:
            extensible = bool(enable_extensible_kv_cache)
    if gpu_memory_utilization is None:
        gpu_memory_utilization = (EXTENSIBLE_KV_CACHE_GPU_MEMORY_UTILIZATION if extensible
                                  else rules.default_gpu_memory_utilization)
    return CacheDefaults(block_size, gpu_memory_utilization, extensible)
