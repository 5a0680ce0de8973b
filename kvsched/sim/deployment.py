"""A deployment to simulate: model, hardware, parallelism, engine settings,
resolved with vLLM's defaults and its start-up checks."""

from __future__ import annotations

from dataclasses import dataclass

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf.hardware import Hardware, get_hardware, load_efficiency_overrides
from kvsched.perf.memory import MemoryPlan, plan_memory
from kvsched.perf.models import ModelSpec, get_model
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig, StepTimeModel

GIB = 2**30


def serve_defaults(hardware: Hardware) -> tuple[int, int]:
    """vLLM 0.33's ``vllm serve`` defaults for (max_num_batched_tokens,
    max_num_seqs): by device memory, A100s kept on the small tier."""
    memory = hardware.memory_bytes
    if memory >= 160 * GIB:
        return 16384, 1024
    if memory >= 70 * GIB and not hardware.id.startswith("a100"):
        return 8192, 1024
    return 2048, 256


@dataclass(frozen=True, slots=True)
class EngineOptions:
    """vLLM engine arguments (None = vLLM's default for this deployment)."""

    model: str = "meta-llama/Llama-3.1-8B"
    hardware: str = "h100-sxm"
    efficiency_file: str | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: int | None = None
    async_scheduling: bool = True
    prefill_schedule_interval: int = 1


@dataclass(frozen=True, slots=True)
class Deployment:
    options: EngineOptions
    model: ModelSpec
    hardware: Hardware
    parallel: ParallelConfig
    runtime: RuntimeConfig
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    memory: MemoryPlan
    step_model: StepTimeModel

    @property
    def lockstep(self) -> bool:
        """Data-parallel ranks step together when they share experts."""
        return self.model.is_moe and self.parallel.expert_parallel_size > 1

    def describe(self) -> str:
        sc, cc = self.scheduler_config, self.cache_config
        tp = self.parallel.tensor_parallel_size
        dp = self.parallel.data_parallel_size
        ep = f" EP{self.parallel.expert_parallel_size}" if self.parallel.expert_parallel_size > 1 else ""
        dps = f" DP{dp}" if dp > 1 else ""
        return (f"{self.model.name} ({self.runtime.dtype}) on {tp * dp}x {self.hardware.name} "
                f"(TP{tp}{dps}{ep}), "
                f"max_num_seqs {sc.max_num_seqs}, max_num_batched_tokens {sc.max_num_batched_tokens}, "
                f"max_model_len {sc.max_model_len}, {cc.num_gpu_blocks} KV blocks of {cc.block_size}"
                f"{', prefix caching' if cc.enable_prefix_caching else ''}"
                f"{', async scheduling' if self.runtime.async_scheduling else ''}"
                + (f", prefill every {k} steps" if (k := self.options.prefill_schedule_interval) > 1
                   else ""))


def build_deployment(opts: EngineOptions) -> Deployment:
    model = get_model(opts.model)
    hardware = get_hardware(opts.hardware)
    if opts.efficiency_file:
        hardware = load_efficiency_overrides(opts.efficiency_file, hardware)
    parallel = ParallelConfig(opts.tensor_parallel_size, opts.data_parallel_size,
                              opts.enable_expert_parallel)
    if model.num_heads % opts.tensor_parallel_size:
        raise ValueError(f"tensor_parallel_size={opts.tensor_parallel_size}: must divide the "
                         f"{model.num_heads} attention heads of {model.name}")
    batched, seqs = serve_defaults(hardware)
    max_num_seqs = opts.max_num_seqs or seqs
    max_num_batched_tokens = opts.max_num_batched_tokens or batched
    max_model_len = opts.max_model_len or model.max_position_embeddings
    if not opts.enable_chunked_prefill and opts.max_num_batched_tokens is None:
        # vLLM raises the default so a whole max_model_len prompt fits one step.
        max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
    if max_model_len > model.max_position_embeddings:
        raise ValueError(f"max_model_len={max_model_len}: above {model.name}'s "
                         f"max_position_embeddings ({model.max_position_embeddings})")
    runtime = RuntimeConfig(dtype=opts.dtype, kv_cache_dtype=opts.kv_cache_dtype,
                            async_scheduling=opts.async_scheduling,
                            cudagraph_max_size=min(2 * max_num_seqs, 512))
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, enable_chunked_prefill=opts.enable_chunked_prefill,
        long_prefill_token_threshold=opts.long_prefill_token_threshold,
        policy=opts.scheduling_policy)
    memory = plan_memory(model, hardware, parallel, runtime, opts.block_size,
                         opts.gpu_memory_utilization, max_num_batched_tokens, max_num_seqs)
    num_blocks = opts.num_gpu_blocks_override or memory.num_gpu_blocks
    if (num_blocks - 1) * opts.block_size < max_model_len:
        raise ValueError(
            f"max_model_len={max_model_len} needs {max_model_len} tokens of KV but the cache holds "
            f"{(num_blocks - 1) * opts.block_size} ({memory.describe()}); lower --max-model-len, "
            "raise --gpu-memory-utilization or --tensor-parallel-size")
    cache_config = CacheConfig(num_gpu_blocks=num_blocks, block_size=opts.block_size,
                               enable_prefix_caching=opts.enable_prefix_caching)
    if isinstance(opts.prefill_schedule_interval, bool) or not isinstance(
            opts.prefill_schedule_interval, int) or opts.prefill_schedule_interval < 1:
        raise ValueError(f"prefill_schedule_interval={opts.prefill_schedule_interval!r}: "
                         "must be an integer >= 1 (1 admits prefill every step)")
    step_model = StepTimeModel(model, hardware, parallel, runtime)
    return Deployment(opts, model, hardware, parallel, runtime, scheduler_config, cache_config,
                      memory, step_model)
