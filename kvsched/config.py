"""Scheduler and KV-cache configuration, with vLLM's names, defaults and rules.

Every rule raises a ``ValueError`` that names the field, the value and the fix,
so a bad flag never turns into a hang or a traceback deep in the scheduler.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, Protocol

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import json_problem, strict_loads
from kvsched.vllm_versions import (
    DEFAULT_VLLM_VERSION,
    FLAGS_SINCE,
    VERSIONED_SCHEDULER_KNOBS,
    check_vllm_version,
    release_has,
    rules_for,
)

POLICIES = ("fcfs", "priority")
# The bound on a step's sequences and tokens (max_num_seqs,
# max_num_batched_tokens) and on a sequence's tokens (max_model_len) that
# every input - a flag, a scenario file - is checked against: 2**24. No GPU
# holds the activations of that many tokens in one step, and no model's
# context is that long (the longest published is 10M tokens).
MAX_STEP_LIMIT = 2**24
# Engine steps a step-counting setting may name (--prefill-schedule-interval,
# --dp-sync-interval, --adp-*-iters): a million. An engine step takes at
# least ~1 ms, so that is over a quarter of an hour between the events the
# setting paces; more is no cadence, only a way to stall a run.
MAX_STEP_COUNT = 1_000_000
# vLLM's EngineCore.batch_queue_size under async scheduling: the executor's
# max_concurrent_batches without pipeline parallelism, one batch running on
# the GPU while the next is scheduled. The one owner of that depth: the
# scheduler, the engine, the replayer and the simulator all read it.
BATCH_QUEUE_SIZE = 2


# Pipeline stages kvsched takes (vLLM's pipeline_parallel_size): a model's
# layers split over more than 16 stages leaves a handful of layers a stage,
# and no published deployment goes past 16.
MAX_PIPELINE_PARALLEL_SIZE = 16


def batch_queue_size(async_scheduling: bool, pipeline_parallel_size: int = 1) -> int:
    """How many scheduled batches vLLM's engine keeps in flight
    (VllmConfig.max_concurrent_batches): one step at a time when synchronous
    without pipeline parallelism; the async batch queue; with PP one batch
    per stage to fill the pipeline. Async scheduling with PP adds the batch
    being scheduled: PP + 1 (0.33 on its V2 model runner, whose rules
    kvsched follows there; 0.34 has only that runner)."""
    if pipeline_parallel_size > 1:
        return pipeline_parallel_size + 1 if async_scheduling else pipeline_parallel_size
    return BATCH_QUEUE_SIZE if async_scheduling else 1


class _HasRequests(Protocol):
    def has_requests(self) -> bool: ...


def keeps_scheduling(queue_len: int, queue_size: int, num_scheduled_tokens: int,
                     scheduler: _HasRequests) -> bool:
    """vLLM's EngineCore.step_with_batch_queue, after it queues the batch it
    just scheduled: True when it returns without waiting for the oldest
    batch's output (the queue has room, and the batch ran tokens or more
    can be scheduled); False when it blocks on that output and applies it.
    The one owner of the rule for the engine, the scenario runner and the
    simulator."""
    return queue_len < queue_size and (num_scheduled_tokens > 0 or scheduler.has_requests())


def check_pipeline_parallel_size(value: object) -> None:
    """vLLM's ``pipeline_parallel_size``: 1 (no PP) to MAX_PIPELINE_PARALLEL_SIZE."""
    if not is_int(value) or not 1 <= value <= MAX_PIPELINE_PARALLEL_SIZE:
        raise _fail("pipeline_parallel_size", value,
                    f"must be an integer in [1, {MAX_PIPELINE_PARALLEL_SIZE}]",
                    "use 1 for no pipeline parallelism, or the number of pipeline stages")

# vLLM's engine defaults that every entry point (generate, simulate, tune)
# starts from: SchedulerConfig's class defaults for the step limits (what
# vllm serve falls back to where get_batch_defaults has no entry). A
# deployment's block size and share of device memory default to its
# release's (kvsched.vllm_versions, resolved by
# kvsched.scheduler_defaults.resolve_cache_defaults).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
DEFAULT_MAX_NUM_SEQS = 128
# The block size of a CacheConfig built without one and of a scenario file
# that names none (the scenario format's default, vLLM 0.33's; scenarios
# keep it whatever release replays them).
DEFAULT_BLOCK_SIZE = 16
# vLLM 0.33 takes any block size > 0; its kernels' blocks are 16 to 256
# tokens (FlashMLA 64, FlashInfer 16/32/64, Ascend 128), and hybrid models
# align theirs to a few hundred. 4096 is kvsched's bound: beyond it a block
# is longer than most requests' whole context.
MAX_BLOCK_SIZE = 4096
# KV blocks one scheduler's block pool may hold: 2**24 (16.8M). Each costs
# ~48 bytes of pool state before any KV (measured: 2**21 blocks, 48 bytes
# each, max RSS), so 2**24 is ~800 MB of bookkeeping, and 2**24 blocks of 16
# tokens are 268M tokens of KV, over 20x what any GPU holds.
MAX_NUM_GPU_BLOCKS = 2**24
# A scenario file (kvsched replay, the conformance corpus) builds its block
# pool whole, and every input file must be refused or read within 2 s and
# 200 MB: 2**21 blocks cost about 100 MB and 0.2 s to build (and hold 33M
# tokens at block size 16, more than any single GPU's cache).
MAX_SCENARIO_GPU_BLOCKS = 2**21
# vLLM's max_loras: adapter slots in one batch, a uint16 in its LoRA mapping.
MAX_LORAS = 2**16 - 1


def _fail(field: str, value: object, rule: str, fix: str) -> UserInputError:
    return UserInputError(f"{field}={value!r}: {rule}; {fix}")


def _require_positive(name: str, value: int) -> None:
    if not is_int(value):
        raise _fail(name, value, "must be an integer", f"pass a whole number for {name}")
    if value < 1:
        raise _fail(name, value, "must be positive", f"set {name} to 1 or more")


def check_long_prefill_token_threshold(value: object) -> None:
    if not is_int(value) or value < 0:
        raise _fail("long_prefill_token_threshold", value,
                    "must be a non-negative integer", "use 0 to disable the cap")


def check_max_num_inflight_kv_loads(value: object) -> None:
    """vLLM 0.34's ``max_num_inflight_kv_loads``: None (no cap) or 1 to
    MAX_STEP_LIMIT requests holding blocks for an asynchronous KV load."""
    if value is not None and (not is_int(value) or not 1 <= value <= MAX_STEP_LIMIT):
        raise _fail("max_num_inflight_kv_loads", value,
                    f"must be an integer in [1, {MAX_STEP_LIMIT:,}] or unset",
                    "leave it unset for no cap, or give the most asynchronous KV loads in flight")


def check_cache_aware_admission_window(value: object) -> None:
    """vLLM 0.34's ``cache_aware_admission_window``: 0 (off) or how many
    waiting requests at the head of the queue are reordered, at most
    MAX_STEP_LIMIT (each costs a prefix-cache probe per step)."""
    if not is_int(value) or not 0 <= value <= MAX_STEP_LIMIT:
        raise _fail("cache_aware_admission_window", value,
                    f"must be an integer in [0, {MAX_STEP_LIMIT:,}]",
                    "use 0 to admit in arrival order, or the number of waiting requests to reorder")


def check_cache_aware_admission_threshold(value: object) -> None:
    """vLLM 0.34's ``cache_aware_admission_threshold``: the KV cache usage,
    a fraction in [0, 1], from which cache-aware admission reorders."""
    if not is_number(value) or not 0 <= value <= 1:
        raise _fail("cache_aware_admission_threshold", value, "must be a fraction in [0, 1]",
                    "e.g. 0.5 reorders once half the KV cache is in use, 0 on every step")


def check_gpu_memory_utilization(value: object) -> None:
    """vLLM's ``gpu_memory_utilization``: a fraction of device memory in (0, 1]."""
    if not is_number(value) or not 0 < value <= 1:
        raise _fail("gpu_memory_utilization", value, "must be a fraction in (0, 1]",
                    "e.g. 0.9 gives the engine 90 % of the device's memory")


def check_num_gpu_blocks_override(value: object) -> None:
    """None (size the cache from memory) or at least 2 blocks."""
    if value is None:
        return
    if not is_int(value) or value < 2:
        raise _fail("num_gpu_blocks_override", value,
                    "must be an integer >= 2 (one block is vLLM's reserved null block)",
                    "leave it unset to size the cache from memory")
    if value > MAX_NUM_GPU_BLOCKS:
        raise _fail("num_gpu_blocks_override", value,
                    f"must be at most {MAX_NUM_GPU_BLOCKS:,} (2**24: a block pool that large is "
                    "~800 MB of bookkeeping and 20x the KV any GPU holds)",
                    "lower --num-gpu-blocks-override or leave it unset to size the cache from memory")


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    """What vLLM calls ``SchedulerConfig`` (plus ``max_model_len``).

    ``max_num_partial_prefills`` and ``max_long_partial_prefills`` are accepted
    and validated as vLLM's engine arguments are, but vLLM 0.33's v1 scheduler
    never reads them, so neither does kvsched's.
    """

    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    policy: str = "fcfs"
    scheduler_reserve_full_isl: bool = True
    # vLLM's AsyncScheduler: step N+1 is scheduled before step N's tokens are
    # known (output placeholders). vLLM turns it on by default on GPUs; the
    # scheduler core defaults to the synchronous one, as vLLM's class does.
    async_scheduling: bool = False
    # vLLM's ParallelConfig.pipeline_parallel_size, the one parallel setting
    # the scheduler and the engine loop read: PP stages keep that many
    # batches in flight (batch_queue_size), and under async scheduling a
    # request decodes at most once every PP steps (vLLM's decode stagger).
    pipeline_parallel_size: int = 1
    # The vLLM release whose scheduler this is (kvsched.vllm_versions owns
    # what differs between releases).
    vllm_version: str = DEFAULT_VLLM_VERSION
    # vLLM 0.34's cap on asynchronous KV loads holding blocks before their
    # requests run (in progress, done and not yet admitted, or aborted
    # mid-load). Setting it also sends the requests a KV connector may load
    # asynchronously to a queue of their own, whose loads start while the
    # batch is full. None: no cap, loads start only with a free running slot.
    max_num_inflight_kv_loads: int | None = None
    # vLLM 0.34's cache-aware admission (FCFS with prefix caching only): the
    # first ``window`` waiting requests are reordered by cached prefix, deepest
    # first, once the KV cache usage is at least ``threshold``. 0: off.
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float = 0.5
    # Multimodal models: the encoder embeddings one step may encode and the
    # encoder cache's size, in embeddings, before vLLM raises each to the
    # model's largest item (kvsched.core.encoder_cache_manager.
    # compute_mm_encoder_budget). None: vLLM's value, max_num_batched_tokens
    # (vLLM does not let a user set them; the conformance scenarios do).
    max_num_encoder_input_tokens: int | None = None
    encoder_cache_size: int | None = None
    # vLLM's --disable-chunked-mm-input: a step never covers part of a
    # multimodal item's placeholders; the chunk stops before the item.
    disable_chunked_mm_input: bool = False

    def encoder_limits(self) -> tuple[int, int]:
        """(max_num_encoder_input_tokens, encoder_cache_size) with vLLM's
        default applied (SchedulerConfig.__post_init__ sets both to
        max_num_batched_tokens)."""
        budget = self.max_num_encoder_input_tokens
        size = self.encoder_cache_size
        return (self.max_num_batched_tokens if budget is None else budget,
                self.max_num_batched_tokens if size is None else size)

    def __post_init__(self) -> None:
        check_vllm_version(self.vllm_version)
        check_max_num_inflight_kv_loads(self.max_num_inflight_kv_loads)
        check_cache_aware_admission_window(self.cache_aware_admission_window)
        check_cache_aware_admission_threshold(self.cache_aware_admission_threshold)
        self._check_release_has_knobs()
        if type(self.async_scheduling) is not bool:
            raise _fail("async_scheduling", self.async_scheduling, "must be True or False",
                        "pass a bool")
        check_pipeline_parallel_size(self.pipeline_parallel_size)
        for name in ("max_num_encoder_input_tokens", "encoder_cache_size"):
            if getattr(self, name) is not None:
                _require_positive(name, getattr(self, name))
        if type(self.disable_chunked_mm_input) is not bool:
            raise _fail("disable_chunked_mm_input", self.disable_chunked_mm_input,
                        "must be True or False", "pass a bool")
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


    def _check_release_has_knobs(self) -> None:
        """A setting this release's scheduler lacks (kvsched.vllm_versions)
        must stay at its default: vLLM 0.33 has no in-flight KV load cap and
        no cache-aware admission."""
        missing = {k for k in VERSIONED_SCHEDULER_KNOBS if not release_has(self.vllm_version, k)}
        if not missing:
            return
        for f in fields(self):
            if f.name in missing and getattr(self, f.name) != f.default:
                first = FLAGS_SINCE[f.name]
                raise _fail(f.name, getattr(self, f.name),
                            f"vLLM {self.vllm_version}'s scheduler has no such setting (new in vLLM "
                            f"{first})", f"set vllm_version to {first!r}, or leave it at its default "
                            f"({f.default!r})")


# The kinds of KV cache group vLLM pages separately (its KVCacheSpec
# classes, one single-type manager each): full attention (also MLA),
# sliding-window attention, chunked local attention (Llama 4) and the
# Mamba / linear-attention state (Nemotron-H, Qwen3-Next, Kimi-Linear).
KV_GROUP_KINDS = ("full_attention", "sliding_window", "chunked_local_attention", "mamba")
# vLLM's --mamba-cache-mode values: "align" keeps a state block per
# scheduler block (needed for prefix caching), "none" one state per request.
MAMBA_CACHE_MODES = ("none", "align")


@dataclass(slots=True, frozen=True)
class KVCacheGroup:
    """One KV cache group of vLLM's KVCacheConfig: the layers of one kind that
    share a block table. Every group draws from the one shared block pool
    (``CacheConfig.num_gpu_blocks``). ``num_layers`` only matters for
    memory; the scheduler reads the kind, block size and window.

    A Mamba group may carry vLLM's prefill checkpoint (MambaSpec's fields
    of the same names): ``num_prefill_checkpoint_blocks`` blocks a request
    may hold beside its running state so the backend can export a
    mid-prefill state (MambaMixer2: 1; FlashInfer's GDN prefill: 1), and
    ``prefill_checkpoint_alignment``, the token multiple such an export
    must lie at from the chunk start (MambaMixer2: 1; GDN: the Mamba block
    size). Only "align" mode (prefix caching on) reads them."""

    kind: str
    block_size: int
    num_layers: int = 1
    sliding_window: int | None = None  # sliding_window groups: tokens attended
    attention_chunk_size: int | None = None  # chunked_local_attention groups
    num_prefill_checkpoint_blocks: int = 0  # mamba groups
    prefill_checkpoint_alignment: int | None = None  # mamba groups

    def __post_init__(self) -> None:
        if self.kind not in KV_GROUP_KINDS:
            raise _fail("kv_groups.kind", self.kind, "unknown KV cache group kind",
                        f"use one of {', '.join(KV_GROUP_KINDS)}")
        _require_positive("kv_groups.block_size", self.block_size)
        _require_positive("kv_groups.num_layers", self.num_layers)
        needs = {"sliding_window": "sliding_window",
                 "chunked_local_attention": "attention_chunk_size"}.get(self.kind)
        for name in ("sliding_window", "attention_chunk_size"):
            value = getattr(self, name)
            if name == needs:
                _require_positive(f"kv_groups.{name}", value)
            elif value is not None:
                raise _fail(f"kv_groups.{name}", value, f"only a {name.replace('attention_', '')} "
                            f"group has one, this group is {self.kind}", f"drop {name}")
        blocks, alignment = self.num_prefill_checkpoint_blocks, self.prefill_checkpoint_alignment
        if self.kind != "mamba" and (blocks != 0 or alignment is not None):
            name = "num_prefill_checkpoint_blocks" if blocks != 0 else "prefill_checkpoint_alignment"
            raise _fail(f"kv_groups.{name}", getattr(self, name), "only a mamba group has a prefill "
                        f"checkpoint, this group is {self.kind}", f"drop {name}")
        # vLLM only asks whether the count is above 0 (one checkpoint block at
        # most per step) and adds it to the memory a request may hold.
        if not is_int(blocks) or blocks < 0:
            raise _fail("kv_groups.num_prefill_checkpoint_blocks", blocks, "must be a whole number >= 0",
                        "use 0 (no checkpoint) or 1 (vLLM's MambaMixer2 and GDN layers)")
        if alignment is not None:
            _require_positive("kv_groups.prefill_checkpoint_alignment", alignment)


@dataclass(slots=True, frozen=True)
class CacheConfig:
    """The paged KV cache: ``num_gpu_blocks`` counts vLLM's reserved null block.

    ``kv_groups`` empty means vLLM's single full-attention group of
    ``block_size`` tokens (every model kvsched ran before hybrid groups);
    otherwise one entry per KV cache group, all sharing the one pool.
    ``hash_block_size`` (None: ``block_size``) is the prefix-cache hash
    granularity; ``mamba_cache_mode`` (None: vLLM's resolution) applies to
    Mamba groups. ``prefix_cache_retention_interval`` is vLLM's (default 0:
    sliding-window and Mamba groups cache only the blocks a replay or a
    shared-prefix junction can hit; None: every block; N: also one tail
    per N tokens)."""

    num_gpu_blocks: int
    block_size: int = DEFAULT_BLOCK_SIZE
    enable_prefix_caching: bool = True
    kv_groups: tuple[KVCacheGroup, ...] = ()
    hash_block_size: int | None = None
    mamba_cache_mode: str | None = None
    prefix_cache_retention_interval: int | None = 0

    def __post_init__(self) -> None:
        _require_positive("block_size", self.block_size)
        _require_positive("num_gpu_blocks", self.num_gpu_blocks)
        if self.num_gpu_blocks < 2:
            raise _fail("num_gpu_blocks", self.num_gpu_blocks,
                        "one block is vLLM's reserved null block, so no KV would fit",
                        "use at least 2 blocks")
        if self.hash_block_size is not None:
            _require_positive("hash_block_size", self.hash_block_size)
        if self.mamba_cache_mode is not None and self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise _fail("mamba_cache_mode", self.mamba_cache_mode, "unknown Mamba cache mode",
                        f"use one of {', '.join(MAMBA_CACHE_MODES)}")
        retention = self.prefix_cache_retention_interval
        if retention is not None and (not is_int(retention) or retention < 0):
            raise _fail("prefix_cache_retention_interval", retention, "must be a whole number >= 0 "
                        "or None", "use 0 (vLLM's default), a multiple of the block size, or None")


# vLLM's speculative methods, the one list every reader of
# --speculative-config (the engine, the simulator) resolves through
# :func:`resolve_speculative_method`. ``ngram`` and ``ngram_gpu`` propose
# drafts without a drafter model (no KV of their own); ``eagle``, ``eagle3``
# and ``mtp`` run a drafter on the target's hidden states and reserve KV
# slots for its K positions (vLLM's ``num_lookahead_tokens``).
NGRAM_METHODS = ("ngram", "ngram_gpu")
DRAFTER_METHODS = ("eagle", "eagle3", "mtp")
SPECULATIVE_METHODS = NGRAM_METHODS + DRAFTER_METHODS
# vLLM's other spellings, which its SpeculativeConfig rewrites to these:
# "[ngram]" to "ngram", and its per-architecture MTP model types to "mtp"
# (deprecated names; vLLM warns and rewrites them).
SPECULATIVE_METHOD_ALIASES: Mapping[str, str] = MappingProxyType({
    "[ngram]": "ngram",
    "deepseek_mtp": "mtp", "mimo_mtp": "mtp", "glm4_moe_mtp": "mtp", "ernie_mtp": "mtp",
    "qwen3_next_mtp": "mtp", "longcat_flash_mtp": "mtp",
})
# vLLM's methods kvsched neither runs nor prices: refused by name, with the
# reason, rather than as unknown.
UNMODELLED_SPECULATIVE_METHODS = ("draft_model", "medusa", "mlp_speculator", "suffix", "dflash",
                                  "dspark", "custom_class", "extract_hidden_states")
# vLLM caps num_speculative_tokens far below this; it only bounds input.
MAX_SPECULATIVE_TOKENS = 64


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """vLLM's ``--speculative-config``: the method and K, the draft tokens
    proposed per step. ``prompt_lookup_min``/``prompt_lookup_max`` are the
    n-gram proposer's match lengths (None: vLLM's defaults, see
    :meth:`ngram_lookup`)."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise _fail("speculative_config.method", self.method, "unknown speculative method",
                        f"use one of {', '.join(SPECULATIVE_METHODS)}")
        k = self.num_speculative_tokens
        if not is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise _fail("speculative_config.num_speculative_tokens", k,
                        f"must be an integer in [1, {MAX_SPECULATIVE_TOKENS}]",
                        "give the number of draft tokens proposed per step, e.g. 3")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            v = getattr(self, name)
            if v is not None and (not is_int(v) or v < 1):
                raise _fail(f"speculative_config.{name}", v, "must be an integer >= 1",
                            "leave it unset for vLLM's default")
        if self.method not in NGRAM_METHODS and (
                self.prompt_lookup_min is not None or self.prompt_lookup_max is not None):
            raise _fail("speculative_config.method", self.method,
                        "prompt_lookup_min/max apply to the n-gram proposer only",
                        "drop them or use method 'ngram'")
        lo, hi = self.ngram_lookup()
        if lo > hi:
            raise _fail("speculative_config.prompt_lookup_min", lo,
                        f"exceeds prompt_lookup_max ({hi})", "lower it")

    def ngram_lookup(self) -> tuple[int, int]:
        """(min, max) n-gram lengths, vLLM's defaults filled in: one given
        sets both, none gives 5 and 5 (vllm/config/speculative.py)."""
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            return 5, 5
        if lo is None:
            assert hi is not None
            return hi, hi
        if hi is None:
            return lo, lo
        return lo, hi

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots reserved past the scheduled tokens for the drafter's own
        positions: K for drafter-model methods, 0 for n-gram."""
        return self.num_speculative_tokens if self.method in DRAFTER_METHODS else 0


def resolve_speculative_method(method: object, supported: Sequence[str], refusal: str) -> str:
    """``speculative_config.method`` as vLLM spells it (an alias resolved to
    its method, see ``SPECULATIVE_METHOD_ALIASES``), checked against the
    methods the caller runs (``supported``). A vLLM method outside them is
    refused with ``refusal`` (the caller's reason and fix); anything else is
    an unknown method, with the closest supported name as a hint."""
    if not isinstance(method, str):
        raise _fail("speculative_config.method", method, "must be a string",
                    f"use one of {', '.join(supported)}")
    resolved = SPECULATIVE_METHOD_ALIASES.get(method, method)
    if resolved in supported:
        return resolved
    if resolved in SPECULATIVE_METHODS or resolved in UNMODELLED_SPECULATIVE_METHODS:
        raise UserInputError(f"speculative_config.method={resolved!r}: {refusal}")
    close = difflib.get_close_matches(method, supported, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UserInputError(f"speculative_config.method={method!r}: unknown speculative method; {hint}use one "
                     f"of {', '.join(supported)}")


def speculative_object(value: object) -> Mapping[str, Any]:
    """vLLM's ``speculative_config`` as given: a mapping, or its JSON text
    (``--speculative-config '{"method": "ngram", ...}'``). One ValueError
    naming the field for text that is not a JSON object."""
    if isinstance(value, str):
        try:
            value = strict_loads(value, constants=False)
        except ValueError as err:
            raise UserInputError(f"speculative_config: {json_problem(err)}; give an object "
                             'such as \'{"method": "ngram", "num_speculative_tokens": 3}\'') from None
    if not isinstance(value, Mapping):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise UserInputError(f"speculative_config={shown}: must be a JSON object with method and "
                         'num_speculative_tokens, e.g. {"method": "ngram", "num_speculative_tokens": 3}')
    return value


def check_speculative_with_async(speculative: SpeculativeConfig | None, async_scheduling: bool,
                                 vllm_version: str = DEFAULT_VLLM_VERSION) -> None:
    """vLLM 0.33 refuses the CPU n-gram proposer with async scheduling
    (VllmConfig.__post_init__, V1 model runner); ``ngram_gpu`` is its
    async-capable twin. Releases that run the pair
    (``VersionRules.ngram_with_async_scheduling``) take it."""
    if (speculative is not None and async_scheduling and speculative.method == "ngram"
            and not rules_for(vllm_version).ngram_with_async_scheduling):
        raise _fail("speculative_config.method", "ngram",
                    f"vLLM {vllm_version} does not run the CPU n-gram proposer with async scheduling",
                    "use method 'ngram_gpu', or turn async scheduling off")


def check_speculative_settings(config: SchedulerConfig, speculative: SpeculativeConfig | None) -> None:
    """The scheduler settings vLLM 0.33 cannot run speculative decoding
    with (raises ValueError naming the field). A request admitted with one
    token to compute is padded to 1 + K tokens and never admitted unpadded,
    so a budget below 1 + K admits nothing behind it (vLLM spins forever),
    and a long-prefill threshold below 1 + K cuts the padding (vLLM fails
    an assertion). And the CPU n-gram proposer does not run under async
    scheduling (:func:`check_speculative_with_async`)."""
    if speculative is None:
        return
    if config.pipeline_parallel_size > 1:
        raise _fail("pipeline_parallel_size", config.pipeline_parallel_size,
                    "kvsched does not model speculative decoding with pipeline parallelism "
                    "(the drafts of batches still in the pipeline)",
                    "use pipeline_parallel_size=1 with speculative decoding")
    check_speculative_with_async(speculative, config.async_scheduling, config.vllm_version)
    k = speculative.num_speculative_tokens
    if config.max_num_batched_tokens < 1 + k:
        raise _fail("max_num_batched_tokens", config.max_num_batched_tokens,
                    f"below 1 + num_speculative_tokens ({1 + k}), so a request with one token to "
                    "compute could never be admitted (vLLM 0.33 would spin forever)",
                    "raise max_num_batched_tokens")
    threshold = config.long_prefill_token_threshold
    if 0 < threshold < 1 + k:
        raise _fail("long_prefill_token_threshold", threshold,
                    f"below 1 + num_speculative_tokens ({1 + k}), it would cut a padded admission "
                    "(vLLM 0.33 fails an assertion)", "raise it or set it to 0")


@dataclass(slots=True, frozen=True)
class LoRAConfig:
    """vLLM's LoRA settings the scheduler reads: at most ``max_loras``
    distinct adapters among the running requests."""

    max_loras: int = 1

    def __post_init__(self) -> None:
        m = self.max_loras
        if not is_int(m) or not 1 <= m <= MAX_LORAS:
            raise _fail("max_loras", m, f"must be an integer in [1, {MAX_LORAS}]",
                        "give the number of adapters that may run in one batch")
