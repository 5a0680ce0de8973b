"""The engine core: kvsched's scheduler driving a PyTorch model on a paged KV cache.

``step()`` is vLLM's ``EngineCore.step`` (synchronous scheduling: schedule,
run, apply the output, then hand the proposer's drafts to the scheduler, as
``post_step`` does) or ``step_with_batch_queue`` (async scheduling: a batch
queue of 2, so step N+1 is scheduled before step N's output is applied).
Under async scheduling the model still runs each batch to the end as soon as
it is scheduled (CPU), so the runner knows the sampled tokens of the batch in
flight when it builds the next one's inputs, as vLLM's runner keeps them on
the device; what the batch queue changes is when the scheduler learns them,
and so its decisions, which are vLLM's.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvsched.config import (
    BATCH_QUEUE_SIZE,
    MAX_NUM_GPU_BLOCKS,
    CacheConfig,
    SchedulerConfig,
    check_speculative_settings,
    keeps_scheduling,
)
from kvsched.core.output import (
    EngineCoreOutputs,
    ModelRunnerOutput,
    SchedulerOutput,
    SpecDecodingStats,
)
from kvsched.core.scheduler import Scheduler
from kvsched.engine.args import DEFAULT_KV_CACHE_MEMORY, EngineArgs
from kvsched.errors import UserInputError
from kvsched.executor.model_runner import ModelRunner
from kvsched.executor.ngram_proposer import NgramProposer
from kvsched.executor.sampler import Sampler
from kvsched.model.attention import CausalAttention
from kvsched.model.config import ModelConfig, load_model_config
from kvsched.model.kv_groups import kv_cache_groups
from kvsched.model.llama import LlamaForCausalLM
from kvsched.model.loader import checkpoint_tensor_shapes, load_model, resolve_dtype
from kvsched.perf.memory import kv_cache_budget
from kvsched.request import Request, RequestStatus
from kvsched.scheduler_defaults import DeviceInfo, resolve_scheduler_limits


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"device={name!r}: torch sees no CUDA device here; use device='cpu'")
    return device


def device_info(device: torch.device) -> DeviceInfo:
    """What vLLM's platform reports for the batch defaults (one device: the
    engine has no tensor or pipeline parallelism)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return DeviceInfo("gpu", int(props.total_memory), str(props.name))
    return DeviceInfo("cpu", 0, "cpu")


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for ``block_size`` tokens."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * itemsize


def cuda_kv_budget(total: int, free: int, activation_peak: int, utilization: float) -> int:
    """vLLM's rule: ``utilization`` of the whole device, minus what is in use
    (weights, other processes) and the activation peak of a profile run."""
    used = total - free
    budget = int(kv_cache_budget(total, utilization, used, activation_peak))
    if budget <= 0:
        raise UserInputError(
            f"gpu_memory_utilization={utilization}: {used / 2**30:.2f} GiB of {total / 2**30:.2f} GiB "
            f"are in use and the activations need {activation_peak / 2**30:.2f} GiB, leaving nothing "
            "for the KV cache; raise it, lower max_num_batched_tokens, or pass kv_cache_memory")
    return budget


def profile_activation_peak(model: LlamaForCausalLM, num_tokens: int, num_logits: int,
                            device: torch.device) -> int:
    """Peak CUDA memory of one forward over ``num_tokens`` prompt tokens (the
    largest step the scheduler can build) beyond what is allocated now."""
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
        hidden = model.forward(ids, torch.arange(num_tokens, device=device), CausalAttention())
        model.compute_logits(hidden[-num_logits:])
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    torch.cuda.empty_cache()
    return int(peak)


def num_kv_blocks(args: EngineArgs, config: ModelConfig, dtype: torch.dtype, device: torch.device,
                  max_useful_tokens: int, activation_peak: int = 0) -> int:
    """``num_gpu_blocks_override`` wins; else the CPU budget ``kv_cache_memory``,
    or on CUDA ``gpu_memory_utilization`` as vLLM computes it (see
    ``cuda_kv_budget``). The CPU default (4 GiB) is capped at what
    ``max_useful_tokens`` can fill: the cache is zeroed, so an oversized one
    costs RAM and start-up time. :func:`check_kv_cache` bounds the result."""
    if args.num_gpu_blocks_override is not None:
        return args.num_gpu_blocks_override
    block_size, utilization = args.cache_settings
    per_block = kv_bytes_per_block(config, block_size, dtype)
    if args.kv_cache_memory is not None:
        budget = int(args.kv_cache_memory)
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = cuda_kv_budget(total, free, activation_peak, utilization)
    else:
        useful = (-(-max_useful_tokens // block_size) + 1) * per_block
        budget = min(DEFAULT_KV_CACHE_MEMORY, useful)
    blocks = budget // per_block
    if blocks < 2:
        raise UserInputError(f"kv_cache_memory={budget}: one KV block needs {per_block} bytes and "
                             f"two are the "
                         "minimum (one is the null block); give more memory")
    return int(blocks)


# The scheduler's block pool keeps ~48 bytes per KV block beside its K and V
# (measured: a pool of 2**21 blocks raised max RSS by 48 bytes a block).
POOL_BYTES_PER_BLOCK = 48


def host_available_memory() -> int | None:
    """Bytes the kernel can give this process now without swapping: Linux's
    MemAvailable, else the free physical pages (os.sysconf, which leaves out
    reclaimable caches and so errs low); None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory(device: torch.device) -> tuple[int | None, str]:
    """What the KV cache and the weights may take on ``device``, and where
    that figure comes from (for messages)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {torch.cuda.get_device_name(device)}"
    return host_available_memory(), "of RAM available on this machine (MemAvailable)"


def weight_bytes(config: ModelConfig, dtype: torch.dtype) -> int:
    """The checkpoint's tensors in ``dtype``, as the loader allocates them."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return sum(math.prod(shape) for shape in checkpoint_tensor_shapes(config).values()) * itemsize


def check_kv_cache(args: EngineArgs, device: torch.device, num_blocks: int, per_block: int,
                   weights: int, available: int | None, where: str) -> None:
    """The KV cache (and its block pool) and the weights fit in ``available``
    bytes, and the pool within MAX_NUM_GPU_BLOCKS blocks, checked before
    either is allocated: an oversized cache fails here naming the flag that
    sized it, not as the kernel's OOM kill or a MemoryError mid-allocation.
    ``available`` None (unknown, or the cache was sized from free memory):
    the pool bound only."""
    if available is not None:
        # The pool lives in host memory: on CUDA it is not the device's to hold.
        block_bytes = per_block + (POOL_BYTES_PER_BLOCK if device.type == "cpu" else 0)
        need = num_blocks * block_bytes + weights
        if need > available:
            # The most blocks, and their K/V bytes, that fit beside the weights.
            most = max(available - weights, 0) // block_bytes
            if args.num_gpu_blocks_override is not None:
                fix = f"lower it to at most {most:,}"
            elif args.kv_cache_memory is not None:
                fix = f"give at most {_size(most * per_block)}"
            else:
                fix = (f"pass --kv-cache-memory of at most {_size(most * per_block)}, or lower "
                       "--max-num-seqs or --max-model-len")
            raise UserInputError(f"{_cache_source(args, device)}: {num_blocks:,} KV blocks of {per_block:,} "
                             f"bytes and the weights ({_size(weights)}) need {_size(need)}, more than the "
                             f"{_size(available)} {where}; {fix}")
    if num_blocks > MAX_NUM_GPU_BLOCKS:
        raise UserInputError(f"{_cache_source(args, device)}: {num_blocks:,} KV blocks of {args.block_size} "
                         f"tokens, above the {MAX_NUM_GPU_BLOCKS:,} a block pool holds (2**24, ~800 MB of "
                         "bookkeeping); raise --block-size or give the cache less memory")


def _cache_source(args: EngineArgs, device: torch.device) -> str:
    """The flag that sized the KV cache, with its value, for messages."""
    if args.num_gpu_blocks_override is not None:
        return f"num_gpu_blocks_override={args.num_gpu_blocks_override} (--num-gpu-blocks-override)"
    if args.kv_cache_memory is not None:
        size = int(args.kv_cache_memory)
        return f"kv_cache_memory={size} (--kv-cache-memory, {_size(size)})"
    if device.type == "cuda":
        return f"gpu_memory_utilization={args.gpu_memory_utilization} (--gpu-memory-utilization)"
    return ("the default KV cache (vLLM's CPU 4 GiB, capped at what max_num_seqs x max_model_len "
            "tokens fill)")


def _size(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.2f} MiB"


@dataclass(slots=True)
class StepResult:
    """One engine step. ``scheduled``: the batch scheduled in it (None when
    nothing was: async scheduling draining its queue). ``executed``,
    ``runner_output`` and ``core_outputs``: the batch whose output the
    scheduler applied in it, that output and what the scheduler made of it
    (all None under async scheduling when the step only filled the queue).
    Synchronous scheduling applies the batch it scheduled."""

    scheduled: SchedulerOutput | None
    executed: SchedulerOutput | None
    runner_output: ModelRunnerOutput | None
    core_outputs: EngineCoreOutputs | None


@dataclass(frozen=True, slots=True)
class IterationDetails:
    """One model execution as vLLM's ``--enable-logging-iteration-details``
    reports it: a *context* request has produced no output token before the
    step (a prompt chunk, the last one included), every other is a
    *generation* request; ``elapsed_s`` is the model's execution alone
    (scheduling and output processing are outside it, as in vLLM's clock)."""

    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_s: float

    def log_line(self, kv_cache_usage: float) -> str:
        """vLLM's line, which ``kvsched.profile.iteration_log`` parses."""
        return (f"Engine 000: Iteration({self.iteration}): {self.context_requests} context requests, "
                f"{self.context_tokens} context tokens, {self.generation_requests} generation "
                f"requests, {self.generation_tokens} generation tokens, iteration elapsed time: "
                f"{self.elapsed_s * 1e3:.2f} ms, CPU KV cache usage: {kv_cache_usage * 100:.1f}%")


class EngineCore:
    """One scheduler, one model runner; ``step()`` is vLLM's engine step."""

    def __init__(self, args: EngineArgs) -> None:
        self.device = resolve_device(args.device)
        # The release's block size and memory share for this device where
        # not given (on a CPU 0.33's 16 is not a size CPU_ATTN takes: 32).
        args = args.with_cache_defaults("cuda" if self.device.type == "cuda" else "cpu")
        block_size = args.cache_settings[0]
        config = load_model_config(args.model)
        self.dtype = resolve_dtype(args.dtype, config, self.device)
        # Every setting is checked before the weights load (a bad flag fails fast).
        limits = resolve_scheduler_limits(
            args.usage_context, device_info(self.device), max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
            max_position_embeddings=config.max_position_embeddings,
            enable_chunked_prefill=args.enable_chunked_prefill)
        max_num_seqs, batched, max_model_len = (
            limits.max_num_seqs, limits.max_num_batched_tokens, limits.max_model_len)
        self.async_scheduling = args.async_scheduling
        self.speculative_config = args.speculative
        self.scheduler_config = SchedulerConfig(
            max_num_batched_tokens=batched, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
            enable_chunked_prefill=args.enable_chunked_prefill,
            long_prefill_token_threshold=args.long_prefill_token_threshold,
            policy=args.scheduling_policy, async_scheduling=self.async_scheduling,
            max_num_inflight_kv_loads=args.max_num_inflight_kv_loads,
            cache_aware_admission_window=args.cache_aware_admission_window,
            cache_aware_admission_threshold=args.cache_aware_admission_threshold)
        # The scheduler's checks of the speculative settings (the budget for
        # 1 + K tokens), before the weights load.
        check_speculative_settings(self.scheduler_config, self.speculative_config)
        # The cache's size, and that it fits with the weights, before either
        # is allocated; except on CUDA without a size given, where vLLM's rule
        # sizes it from what a profile run leaves free (so it fits).
        profile = (self.device.type == "cuda" and args.kv_cache_memory is None
                   and args.num_gpu_blocks_override is None)
        useful_tokens = max_num_seqs * max_model_len
        if not profile:
            num_blocks = num_kv_blocks(args, config, self.dtype, self.device, useful_tokens)
            available, where = available_memory(self.device)
            per_block = kv_bytes_per_block(config, block_size, self.dtype)
            check_kv_cache(args, self.device, num_blocks, per_block, weight_bytes(config, self.dtype),
                           available, where)
        self.model_config, self.model = load_model(args.model, self.dtype, self.device)
        if profile:
            peak = profile_activation_peak(self.model, min(batched, max_model_len), max_num_seqs,
                                           self.device)
            num_blocks = num_kv_blocks(args, self.model_config, self.dtype, self.device, useful_tokens,
                                       peak)
            check_kv_cache(args, self.device, num_blocks,
                           kv_bytes_per_block(config, block_size, self.dtype), 0, None, "")
        # The model's KV cache groups as vLLM forms them; one full-attention
        # group is the scheduler's default (an empty tuple).
        groups = kv_cache_groups(self.model_config, block_size).groups
        single = len(groups) == 1 and groups[0].kind == "full_attention"
        self.cache_config = CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size,
                                        enable_prefix_caching=args.enable_prefix_caching,
                                        kv_groups=() if single else groups)
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config,
                                   vocab_size=self.model_config.vocab_size,
                                   speculative_config=self.speculative_config)
        proposer = None
        if self.speculative_config is not None:
            proposer = NgramProposer(self.speculative_config, max_model_len)
        self.runner = ModelRunner(self.model, self.model_config, num_blocks, block_size,
                                  self.device, self.dtype,
                                  Sampler(args.seed, self.device, self.model_config.eos_token_ids),
                                  proposer=proposer, async_drafts=self.async_scheduling)
        # Async scheduling: batches run but not yet applied, newest first,
        # with their outputs (vLLM's batch queue holds the futures).
        self.batch_queue: deque[tuple[SchedulerOutput, ModelRunnerOutput]] = deque()
        # Speculative decoding's counters summed over every step so far.
        self.spec_decoding_stats: SpecDecodingStats | None = None
        # Told about every model execution (the server's per-step log); the
        # count numbers them as vLLM's Iteration(N) does.
        self.iteration_observer: Callable[[IterationDetails], None] | None = None
        self.num_iterations = 0

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def has_unfinished_requests(self) -> bool:
        """Requests to finish, or (async) a batch whose output is still to apply."""
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def _execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Run the model on a scheduled batch; tell ``iteration_observer``
        (when set) what ran and how long it took."""
        observer = self.iteration_observer
        if observer is None or scheduler_output.total_num_scheduled_tokens == 0:
            return self.runner.execute_model(scheduler_output)
        requests = self.scheduler.requests
        ctx_reqs = ctx_tokens = gen_reqs = gen_tokens = 0
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            if requests[rid].num_output_tokens:
                gen_reqs += 1
                gen_tokens += n
            else:
                ctx_reqs += 1
                ctx_tokens += n
        start = time.perf_counter()
        runner_output = self.runner.execute_model(scheduler_output)
        elapsed = time.perf_counter() - start
        self.num_iterations += 1
        observer(IterationDetails(self.num_iterations, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens,
                                  elapsed))
        return runner_output

    def step(self) -> StepResult:
        if self.async_scheduling:
            return self._step_with_batch_queue()
        scheduler_output = self.scheduler.schedule()
        runner_output = self._execute(scheduler_output)
        core_outputs = self._apply(scheduler_output, runner_output)
        if self.speculative_config is not None and scheduler_output.total_num_scheduled_tokens > 0:
            # vLLM's post_step: the drafts proposed after this step.
            drafts = self.runner.take_draft_token_ids()
            if drafts is not None:
                self.scheduler.update_draft_token_ids(drafts)
        return StepResult(scheduler_output, scheduler_output, runner_output, core_outputs)

    def _step_with_batch_queue(self) -> StepResult:
        """vLLM's step_with_batch_queue: schedule a batch while the queue has
        room; apply the oldest batch's output once the queue is full or
        nothing more can be scheduled."""
        queue = self.batch_queue
        scheduled = None
        if self.scheduler.has_requests():
            scheduled = self.scheduler.schedule()
            queue.appendleft((scheduled, self._execute(scheduled)))
            if keeps_scheduling(len(queue), BATCH_QUEUE_SIZE, scheduled.total_num_scheduled_tokens,
                                self.scheduler):
                return StepResult(scheduled, None, None, None)
        elif not queue:
            return StepResult(None, None, None, None)
        executed, runner_output = queue.pop()
        return StepResult(scheduled, executed, runner_output, self._apply(executed, runner_output))

    def _apply(self, scheduler_output: SchedulerOutput,
               runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        stats = outputs.spec_decoding_stats
        if stats is not None:
            total = self.spec_decoding_stats
            if total is None:
                total = self.spec_decoding_stats = SpecDecodingStats(stats.num_spec_tokens)
            total.merge(stats)
        return outputs
