"""A deployment to simulate: model, hardware, parallelism, engine settings,
resolved with vLLM's defaults and its start-up checks."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kvsched.config import (
    MAX_BLOCK_SIZE,
    MAX_NUM_GPU_BLOCKS,
    MAX_PIPELINE_PARALLEL_SIZE,
    MAX_STEP_COUNT,
    MAX_STEP_LIMIT,
    CacheConfig,
    SchedulerConfig,
    batch_queue_size,
    check_cache_aware_admission_threshold,
    check_cache_aware_admission_window,
    check_gpu_memory_utilization,
    check_long_prefill_token_threshold,
    check_max_num_inflight_kv_loads,
    check_num_gpu_blocks_override,
    check_speculative_settings,
)
from kvsched.core.hybrid_kv_cache import resolve_block_sizes
from kvsched.engine_flags import SchedulerCacheOptions, flag
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.jsonfile import show
from kvsched.perf.checkpoint_format import CheckpointFormat
from kvsched.perf.drafter import Drafter, drafter_shape, drafter_weight_bytes
from kvsched.perf.hardware import Hardware, get_hardware, load_efficiency_overrides
from kvsched.perf.host import HostTerms, default_host_terms, load_calibration
from kvsched.perf.kv_cache_planning import blocks_per_request, check_sparse_mla_device, model_kernel_block
from kvsched.perf.lora import (
    DEFAULT_MAX_LORA_RANK,
    DEFAULT_MAX_LORAS,
    LoraCost,
    check_lora_options,
    lora_cost,
    parse_lora_modules,
)
from kvsched.perf.measured import MeasuredStepTimeModel, measured_coverage
from kvsched.perf.memory import MemoryPlan, plan_memory
from kvsched.perf.model_catalog import checkpoint_format, get_model
from kvsched.perf.models import ModelSpec
from kvsched.perf.pipeline import PipelineStages
from kvsched.perf.profiled import ProfiledStepTimeModel, check_profile_matches
from kvsched.perf.step_profile import StepProfile, load_profile
from kvsched.perf.step_time import (
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    kv_cache_dtype_bytes,
    model_dtype,
)
from kvsched.scheduler_defaults import (
    KERNEL_BLOCK_MULTIPLE,
    CacheDefaults,
    DeviceInfo,
    UsageContext,
    check_optional_limit,
    get_batch_defaults,
    resolve_cache_defaults,
    resolve_scheduler_limits,
)
from kvsched.sim.offload_transfer import OffloadConfig, check_offloading_options, make_offload_config
from kvsched.sim.speculative import SpecOptions, parse_speculative_config
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION, VLLM_VERSIONS, check_vllm_version

# vLLM's CUDA attention backends (0.33 and 0.34) take a block size that is a
# multiple of their kernel block: 16 for FlashAttention and Triton
# (``MultipleOf(16)``), 16/32/64 for FlashInfer; anything else finds no
# backend at start-up.
BLOCK_SIZE_MULTIPLE = KERNEL_BLOCK_MULTIPLE["cuda"]
# Engine cores (--data-parallel-size): 1024, above the widest expert-parallel
# deployments run (a few hundred ranks); each is a whole scheduler and KV
# cache in the simulator.
MAX_DATA_PARALLEL_SIZE = 1024


def device_info(hardware: Hardware, parallel: ParallelConfig) -> DeviceInfo:
    """One simulated rank's device as vLLM's platform reports it."""
    return DeviceInfo("gpu", int(hardware.memory_bytes), hardware.name,
                      world_size=parallel.tensor_parallel_size * parallel.pipeline_parallel_size)


def serve_defaults(hardware: Hardware) -> tuple[int, int]:
    """``vllm serve``'s (max_num_batched_tokens, max_num_seqs) on ``hardware``."""
    return get_batch_defaults(UsageContext.OPENAI_API_SERVER, device_info(hardware, ParallelConfig()))


STEP_TIME_BACKENDS = ("auto", "measured", "roofline", "profiled")
# vLLM --quantization methods kvsched prices -> (weight dtype, the layers the
# method quantizes when the checkpoint does not say). fp8 quantizes every
# linear layer on the fly; modelopt_fp4 names a ModelOpt NVFP4 checkpoint,
# whose default recipe covers every linear layer; vLLM's mxfp4 method
# quantizes only the fused-MoE experts (its linear layers stay unquantized).
QUANTIZATION_FORMATS: Mapping[str, CheckpointFormat] = MappingProxyType({
    "fp8": CheckpointFormat("fp8"),
    "modelopt_fp4": CheckpointFormat("nvfp4"),
    "mxfp4": CheckpointFormat("mxfp4", layers="experts"),
})
QUANTIZATIONS = tuple(QUANTIZATION_FORMATS)


@dataclass(frozen=True, slots=True)
class EngineOptions(SchedulerCacheOptions):
    """vLLM engine arguments (None = vLLM's default for this deployment):
    the scheduler and KV-cache ones every entry point shares
    (:class:`~kvsched.engine_flags.SchedulerCacheOptions`, declared once)
    and those of a served deployment, each declared with its flag's help
    (:func:`~kvsched.engine_flags.flag`; kvsched.sim.flags adds the flags).
    ``dtype``, ``async_scheduling`` and ``speculative_config`` are vLLM
    flags every entry point takes with its own default: their help is
    ``add_scheduler_cache_flags``', their simulator default here."""

    model: str = flag(
        "meta-llama/Llama-3.1-8B",
        "catalog name, with or without the organisation, or a Hugging Face model directory / "
        "config.json (default: {default})")
    hardware: str = flag(
        "h100-sxm",
        "accelerator id (h100-sxm, h200, a100-80gb, b200, l40s, rtx-4090, mi300x, ascend-910b, ...) "
        "or a YAML/JSON hardware file (default: {default})")
    efficiency_file: str | None = flag(None, "YAML/JSON file overriding the roofline's efficiency factors")
    tensor_parallel_size: int = flag(
        1, "GPUs per engine core, sharding each layer (default: %(default)s)", aliases=("-tp",))
    data_parallel_size: int = flag(
        1, "engine cores, each with its own scheduler and KV cache (default: %(default)s)",
        aliases=("-dp",))
    enable_expert_parallel: bool = flag(
        False, "shard experts over TP x DP ranks (MoE ranks then step in lockstep); no effect on a "
               "dense model")
    # Stages of TP GPUs each (kvsched.perf.pipeline).
    pipeline_parallel_size: int = flag(
        1, "pipeline stages per engine core, each -tp GPUs holding its share of the layers; the "
           "engine keeps that many batches in flight (default: %(default)s)", aliases=("-pp",))
    dtype: str = "bf16"
    # None: the checkpoint's own format (e.g. "-FP8" in its name).
    quantization: str | None = flag(
        None, "the weights' format as vLLM's --quantization names it: fp8 (on the fly), modelopt_fp4 "
              "(NVFP4), mxfp4 (MoE experts) (default: the checkpoint's own format, e.g. FP8 for a "
              "name ending in -FP8, MXFP4 experts for gpt-oss)", QUANTIZATIONS, aliases=("-q",))
    kv_cache_dtype: str = flag("auto", "auto (16 bits) or fp8")
    async_scheduling: bool = True
    prefill_schedule_interval: int = flag(
        1, "admit prefill only every K engine steps (vLLM's prefill cadence)")
    # "auto" takes the profile when one is given, else the measured tables
    # where they cover the deployment (resolved_backend_choice, make_step_model).
    step_time_backend: str = flag(
        "auto", "how engine steps are priced: measured vLLM kernel latencies (aiconfigurator-core's "
                "tables), the roofline, or auto: measured where the tables cover the model, GPU and "
                "precision (default: %(default)s)", STEP_TIME_BACKENDS)
    # `kvsched profile`'s file: steps priced from the user's own vLLM (kvsched.perf.profiled).
    step_time_profile: str | None = flag(
        None, "price steps from a step profile of your own vLLM (kvsched profile writes it): the "
              "profiled backend; --hardware then only sizes what the profile does not say",
        metavar="FILE")
    # A host-terms file (kvsched.perf.host) added to any backend's steps,
    # replacing the measured backend's fitted default.
    calibration: str | None = flag(
        None, "host-time terms added to every step, for any backend (JSON, as kvsched.perf.host "
              "describes; kvsched calibrate writes one; default: the terms fitted on real vLLM runs "
              "for the measured backend and the roofline, the profile's own for --step-time-profile; "
              "'none': kernel time only)", metavar="FILE")
    # vLLM's --speculative-config as its JSON text (None: off).
    speculative_config: str | None = None
    # kvsched's own: per-position acceptance rates, comma-separated.
    spec_acceptance: str | None = flag(
        None, "speculative decoding: acceptance rate per draft position as vLLM's metrics report it "
              "(accepted at position i / drafts), e.g. 0.8,0.6,0.45 (default: per method, see "
              "docs/simulator.md)", metavar="R0,R1,...")
    # GiB of CPU KV cache per engine core, summed over its TP ranks (None: off).
    kv_offloading_size: float | None = flag(
        None, "KV offloading to CPU memory, as vLLM's flag: GiB of CPU KV cache per engine core, "
              "summed over its TP ranks (vLLM's OffloadingConnector; stores and loads priced over the "
              "GPU's host link; with --disaggregation every instance gets vLLM's MultiConnector of "
              "NIXL and offloading; default: off)", metavar="GIB")
    kv_offloading_backend: str = flag(
        "native", "with --kv-offloading-size: vLLM's backend; kvsched simulates native only "
                  "(default: %(default)s)")
    # vLLM's LoRA flags; kvsched.perf.lora owns their defaults and rules.
    enable_lora: bool = flag(
        False, "serve LoRA adapters, as vLLM's flag: the scheduler's max_loras cap, adapter loads and "
               "the LoRA kernels priced (docs/lora.md)")
    max_loras: int = flag(
        DEFAULT_MAX_LORAS, "with --enable-lora: adapters in one batch at most, each a GPU slot "
                           "(default: %(default)s)")
    max_lora_rank: int = flag(
        DEFAULT_MAX_LORA_RANK, "with --enable-lora: the slots' rank, one of vLLM's 1, 8, 16, 32, 64, "
                               "128, 256, 320, 512 (default: %(default)s)")
    # None: max_loras.
    max_cpu_loras: int | None = flag(
        None, "with --enable-lora: adapters kept in CPU memory, LRU (default: --max-loras)")
    fully_sharded_loras: bool = flag(
        False, "with --enable-lora and TP > 1: shard the LoRA weights' replicated halves too (less "
               "GPU memory and kernel traffic per GPU, a small collective per layer)")
    lora_modules: tuple[str, ...] = flag(
        (), "with --enable-lora: the adapters, as vllm serve's flag (NAME=PATH or JSON); each "
            "adapter's rank is its PATH/adapter_config.json's r when present, else --max-lora-rank; "
            "requests use them per --lora-share", metavar="NAME=PATH")
    # Empty: every LoRA layer.
    lora_target_modules: tuple[str, ...] = flag(
        (), "with --enable-lora: only these LoRA layers, as vLLM's flag (qkv_proj, o_proj, "
            "gate_up_proj, down_proj, or a slice's name such as q_proj; default: all)",
        metavar="MODULE")
    # Last: the fields before keep their positions (EngineOptions(model)).
    # The release simulated: its scheduler's rules (SchedulerConfig) and its
    # defaults where a flag is not given (kvsched.vllm_versions owns both).
    vllm_version: str = flag(
        DEFAULT_VLLM_VERSION,
        "the vLLM release to simulate: its scheduler, and its defaults for what is not given (block "
        "size, --gpu-memory-utilization, 0.34's extensible KV cache; docs/vllm_versions.md) "
        "(default: %(default)s)", VLLM_VERSIONS)
    # vLLM 0.34's --enable-extensible-kv-cache (None: vLLM's choice for the
    # deployment, scheduler_defaults.resolve_cache_defaults; refused for 0.33).
    enable_extensible_kv_cache: bool | None = flag(
        None, "vLLM 0.34's extensible KV cache: size the cache after warmup and CUDA-graph capture "
              "from measured memory (default: on on CUDA and ROCm without --num-gpu-blocks-override or "
              "NIXL; then --gpu-memory-utilization defaults to 1.0)")


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
    # Speculative decoding (None: off).
    speculative: SpecOptions | None = None
    # KV offloading to CPU memory (None: off).
    offload: OffloadConfig | None = None
    # LoRA (None: --enable-lora not given); its adapters are the
    # --lora-modules ones (the workload may add synthetic ones, see
    # kvsched.sim.workload.lora).
    lora: LoraCost | None = None
    # The share of device memory the KV cache was sized with (the release's
    # default where --gpu-memory-utilization was not given).
    gpu_memory_utilization: float = 0.0

    @property
    def lockstep(self) -> bool:
        """Data-parallel ranks step together when they share experts."""
        return self.model.is_moe and self.parallel.expert_parallel_size > 1

    @property
    def vllm_version(self) -> str:
        """The vLLM release simulated."""
        return self.scheduler_config.vllm_version

    def kv_cache_size(self) -> tuple[int, float]:
        """vLLM's logged "KV cache size: N tokens, Maximum concurrency for
        max_model_len tokens per request: Cx": C is the pool's blocks over
        one max_model_len request's blocks (:func:`request_blocks`), N is C x
        max_model_len (with several KV cache groups fewer than blocks x
        block size: each group takes its own blocks)."""
        sc, cc = self.scheduler_config, self.cache_config
        concurrency = cc.num_gpu_blocks / request_blocks(self.memory, sc, cc.block_size)
        return int(concurrency * sc.max_model_len), concurrency

    def describe(self) -> str:
        sc, cc = self.scheduler_config, self.cache_config
        tp = self.parallel.tensor_parallel_size
        dp = self.parallel.data_parallel_size
        pp = self.parallel.pipeline_parallel_size
        ep = f" EP{self.parallel.expert_parallel_size}" if self.parallel.expert_parallel_size > 1 else ""
        dps = f" DP{dp}" if dp > 1 else ""
        pps = f" PP{pp}" if pp > 1 else ""
        where = f"{tp * pp * dp}x {self.hardware.name}"
        size, concurrency = self.kv_cache_size()
        if isinstance(self.step_model, ProfiledStepTimeModel):
            # The profile's machine prices the steps; --hardware only sized defaults.
            where = f"{self.step_model.profile.hardware.get('name', '?')} (as profiled)"
        return (f"{self.model.name} ({self.runtime.dtype}) on {where} "
                f"(TP{tp}{pps}{dps}{ep}), vLLM {self.vllm_version}, "
                f"max_num_seqs {sc.max_num_seqs}, max_num_batched_tokens {sc.max_num_batched_tokens}, "
                f"max_model_len {sc.max_model_len}, {cc.num_gpu_blocks} KV blocks of {cc.block_size} "
                f"(KV cache size {size:,} tokens, maximum concurrency {concurrency:.2f}x)"
                f"{', prefix caching' if cc.enable_prefix_caching else ''}"
                f"{', async scheduling' if self.runtime.async_scheduling else ''}"
                + (f", {self.speculative.describe()}" if self.speculative is not None else "")
                + (f", prefill every {k} steps" if (k := self.options.prefill_schedule_interval) > 1
                   else "")
                + (f", KV offloading {o.size_gib:g} GiB ({o.num_cpu_blocks} CPU blocks)"
                   if (o := self.offload) is not None else "")
                + (f", {lo.describe()}" if (lo := self.lora) is not None else "")
                + f"; step times: {self.step_model.describe_backend()}")


def request_blocks(memory: MemoryPlan, scheduler_config: SchedulerConfig, block_size: int) -> int:
    """Blocks one request of ``max_model_len`` tokens may hold at once, over
    every KV cache group (vLLM's per-group ``max_memory_usage_bytes`` in
    pages): what its start-up check and its reported KV cache size read."""
    sc = scheduler_config
    if not memory.kv_groups:
        return -(-sc.max_model_len // block_size)
    batches = batch_queue_size(sc.async_scheduling, sc.pipeline_parallel_size)
    mamba = memory.mamba
    return blocks_per_request(memory.kv_groups, max_model_len=sc.max_model_len,
                              max_in_flight_tokens=batches * sc.max_num_batched_tokens,
                              mamba_state_blocks=mamba.state_blocks_per_request if mamba else 0)


def _positive_int(flag: str, value: object, maximum: int | None = None, why: str = "") -> None:
    field = flag[2:].replace("-", "_")
    if not is_int(value) or value < 1:
        raise UserInputError(f"{field}={show(value)} ({flag}): must be an integer >= 1")
    if maximum is not None and value > maximum:
        raise UserInputError(f"{field}={show(value)} ({flag}): must be at most {maximum:,} ({why})")


def validate_engine_options(opts: EngineOptions) -> None:
    """Every engine argument on its own, before anything is built: a bad flag
    names itself instead of surfacing as an odd failure further in (or being
    read as "default", as ``0`` would be)."""
    _positive_int("--tensor-parallel-size", opts.tensor_parallel_size, MAX_DATA_PARALLEL_SIZE,
                  "it must divide the model's attention heads, a few hundred at most")
    _positive_int("--data-parallel-size", opts.data_parallel_size, MAX_DATA_PARALLEL_SIZE,
                  "each engine core is a whole scheduler and KV cache in the simulator")
    _positive_int("--pipeline-parallel-size", opts.pipeline_parallel_size, MAX_PIPELINE_PARALLEL_SIZE,
                  "a model split over more stages keeps a handful of layers a stage")
    if opts.pipeline_parallel_size > 1:
        for flag, value in (("--speculative-config", opts.speculative_config),
                            ("--kv-offloading-size", opts.kv_offloading_size)):
            if value is not None:
                raise UserInputError(f"pipeline_parallel_size={opts.pipeline_parallel_size} "
                                     f"(--pipeline-parallel-size) with {flag}: kvsched does not simulate "
                                     "pipeline parallelism with it; drop one of them")
    for field in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        check_optional_limit(field, getattr(opts, field))
    for field in ("max_num_seqs", "max_num_batched_tokens"):
        value = getattr(opts, field)
        if value is not None and value > MAX_STEP_LIMIT:
            raise UserInputError(f"{field}={show(value)} (--{field.replace('_', '-')}): must be at most "
                             f"{MAX_STEP_LIMIT:,} (2**24: no GPU holds the activations of a step "
                             "that large); leave it unset for vLLM's default")
    check_num_gpu_blocks_override(opts.num_gpu_blocks_override)
    override = opts.num_gpu_blocks_override
    if override is not None and override * opts.data_parallel_size > MAX_NUM_GPU_BLOCKS:
        raise UserInputError(f"num_gpu_blocks_override={show(override)} (--num-gpu-blocks-override): the "
                         f"{opts.data_parallel_size} engine core(s) may have at most {MAX_NUM_GPU_BLOCKS:,} "
                         "KV blocks in all (2**24: 268M tokens of KV at block size 16, over 20x what any "
                         "GPU holds; the simulator keeps ~46 bytes per block); lower it")
    check_vllm_version(opts.vllm_version, flag="--vllm-version")
    block = opts.block_size
    if block is not None and (not is_int(block) or not 1 <= block <= MAX_BLOCK_SIZE
                              or block % BLOCK_SIZE_MULTIPLE):
        raise UserInputError(f"block_size={show(block)} (--block-size): must be a multiple of "
                         f"{BLOCK_SIZE_MULTIPLE} between {BLOCK_SIZE_MULTIPLE} and {MAX_BLOCK_SIZE} "
                         "(vLLM's CUDA attention backends take multiples of 16: 16, 32, 64, "
                         "128, ...; leave it unset for the release's default)")
    if opts.gpu_memory_utilization is not None:
        check_gpu_memory_utilization(opts.gpu_memory_utilization)
    if opts.enable_extensible_kv_cache is not None and type(opts.enable_extensible_kv_cache) is not bool:
        raise UserInputError(f"enable_extensible_kv_cache={opts.enable_extensible_kv_cache!r} "
                             "(--enable-extensible-kv-cache): must be True, False or unset")
    check_long_prefill_token_threshold(opts.long_prefill_token_threshold)
    check_max_num_inflight_kv_loads(opts.max_num_inflight_kv_loads)
    check_cache_aware_admission_window(opts.cache_aware_admission_window)
    check_cache_aware_admission_threshold(opts.cache_aware_admission_threshold)
    model_dtype(opts.dtype)
    kv_cache_dtype_bytes(opts.kv_cache_dtype)
    _positive_int("--prefill-schedule-interval", opts.prefill_schedule_interval, MAX_STEP_COUNT,
                  "a million engine steps is over a quarter of an hour between admissions")
    if opts.quantization is not None and opts.quantization not in QUANTIZATIONS:
        raise UserInputError(f"quantization={opts.quantization!r} (--quantization): kvsched prices "
                         f"{', '.join(QUANTIZATIONS)} (or leave it unset for the checkpoint's own)")
    if opts.step_time_backend not in STEP_TIME_BACKENDS:
        raise UserInputError(f"step_time_backend={opts.step_time_backend!r} (--step-time-backend): "
                         f"use one of {', '.join(STEP_TIME_BACKENDS)}")
    resolved_backend_choice(opts)  # a profile that conflicts with the backend is refused
    # The calibration and profile files are read once, by build_deployment,
    # before anything is priced.
    if type(opts.async_scheduling) is not bool:
        raise UserInputError(f"async_scheduling={opts.async_scheduling!r} (--async-scheduling): must be "
                         "True or False")
    check_offloading_options(opts.kv_offloading_size, opts.kv_offloading_backend)
    check_lora_options(opts.enable_lora, opts.max_loras, opts.max_lora_rank, opts.max_cpu_loras,
                       opts.fully_sharded_loras, opts.lora_modules, opts.lora_target_modules)
    if opts.enable_lora and opts.pipeline_parallel_size > 1:
        raise UserInputError(f"--enable-lora with --pipeline-parallel-size={opts.pipeline_parallel_size}: "
                             "LoRA on pipeline stages is not priced by kvsched yet; drop one of them")
    if opts.spec_acceptance is not None and opts.speculative_config is None:
        raise UserInputError(f"--spec-acceptance={opts.spec_acceptance}: sets the acceptance rates of "
                         "speculative decoding; give --speculative-config too")


def weight_format(opts: EngineOptions) -> CheckpointFormat:
    """The weights as priced: their dtype and the linear layers it covers.
    --quantization when given (the checkpoint's own layers and KV format when
    it names the checkpoint's format, as vLLM reads them from the
    checkpoint), else the checkpoint's own format
    (``Qwen/Qwen3-235B-A22B-FP8``: block FP8; ``openai/gpt-oss-120b``:
    MXFP4 experts), else --dtype over every layer."""
    own = checkpoint_format(opts.model)
    if opts.quantization is not None:
        method = QUANTIZATION_FORMATS[opts.quantization]
        # vLLM's fp8 method loads a block-FP8 checkpoint as it is stored.
        same = own is not None and (own.weights == method.weights
                                    or (method.weights, own.weights) == ("fp8", "fp8_block"))
        return own if own is not None and same else method
    if own is not None:
        return own
    return CheckpointFormat(model_dtype(opts.dtype))


def weight_dtype(opts: EngineOptions) -> str:
    """The weights' precision as priced (see :func:`weight_format`)."""
    return weight_format(opts).weights


def kv_cache_dtype(opts: EngineOptions, model: ModelSpec | None = None,
                   hardware: Hardware | None = None) -> str:
    """--kv-cache-dtype; ``auto`` takes the checkpoint's KV format where its
    quantization config names one (NVIDIA ModelOpt checkpoints), as vLLM
    does, else fp8 where ``model``'s architecture asks it on ``hardware``
    (GLM-5 on SM100-family GPUs, ``ModelSpec.fp8_kv_cache_on_sm100``)."""
    if opts.kv_cache_dtype == "auto":
        kv = weight_format(opts).kv_cache
        if kv is not None:
            return kv
        if (model is not None and hardware is not None and model.fp8_kv_cache_on_sm100
                and hardware.sm100_family):
            return "fp8"
    return opts.kv_cache_dtype


def resolved_backend_choice(opts: EngineOptions) -> str:
    """``opts.step_time_backend`` with a step profile taken into account: a
    profile chooses the profiled backend ("auto" or "profiled"); "profiled"
    needs one; the roofline or measured backend with one is refused (the
    profile would be ignored). The one owner of that rule."""
    choice = opts.step_time_backend
    if opts.step_time_profile is not None:
        if choice not in ("auto", "profiled"):
            raise UserInputError(f"step_time_profile={opts.step_time_profile!r} (--step-time-profile) "
                                 f"prices steps from a profile, but step_time_backend={choice!r} "
                                 "(--step-time-backend) asks for another backend: drop one of them")
        return "profiled"
    if choice == "profiled":
        raise UserInputError("step_time_backend='profiled' (--step-time-backend) needs a step profile: "
                             "give --step-time-profile FILE (kvsched profile writes one)")
    return choice


def make_step_model(opts: EngineOptions, model: ModelSpec, hardware: Hardware, parallel: ParallelConfig,
                    runtime: RuntimeConfig, profile: StepProfile | None = None,
                    host: HostTerms | None = None) -> StepTimeModel:
    """The step-time backend ``opts.step_time_backend`` names. A step profile
    (``profile``, read from ``opts.step_time_profile``) prices every step
    from the user's own vLLM. "auto" takes the measured kernels where they
    cover the deployment and no efficiency file tunes the roofline;
    otherwise the roofline, saying why."""
    choice = resolved_backend_choice(opts)
    # A calibration's host terms, for whichever backend prices the steps
    # (``host``: the file as build_deployment read it).
    if host is None and opts.calibration is not None:
        host = load_calibration(opts.calibration)
    if choice == "profiled":
        if profile is None:
            assert opts.step_time_profile is not None  # resolved_backend_choice checked it
            profile = load_profile(opts.step_time_profile)
        return ProfiledStepTimeModel(model, hardware, parallel, runtime, profile, host=host)
    # No pricing without host time: the measured backend and the roofline
    # alike take the fitted default of the hardware's class when no
    # calibration is given (kvsched.perf.host.default_host_terms says
    # where it was borrowed).
    borrowed = ""
    if host is None:
        host, borrowed = default_host_terms(hardware.name)
    if choice == "roofline":
        return _with_borrowed(StepTimeModel(model, hardware, parallel, runtime, host), borrowed)
    reason = measured_coverage(model, hardware, parallel, runtime)
    if choice == "auto" and reason is None and opts.efficiency_file:
        reason = "an --efficiency-file tunes the roofline"
    if reason is None:
        return _with_borrowed(MeasuredStepTimeModel(model, hardware, parallel, runtime, host), borrowed)
    if choice == "measured":
        raise UserInputError(f"step_time_backend='measured' (--step-time-backend): {reason}; "
                         "use roofline or auto")
    fallback = _with_borrowed(StepTimeModel(model, hardware, parallel, runtime, host), borrowed)
    fallback.backend_note = f"measured kernels not used: {reason}"
    return fallback


def _with_borrowed(step_model: StepTimeModel, borrowed: str) -> StepTimeModel:
    step_model.host_borrowed = borrowed
    return step_model


def resolve_cache(opts: EngineOptions, hardware: Hardware, registers_kv_cache: bool = False,
                  model: ModelSpec | None = None) -> CacheDefaults:
    """The block size, memory share and KV-cache sizing ``opts`` run with
    on ``hardware`` (the release's where not given; ``registers_kv_cache``:
    a KV connector registers the cache, as NIXL between P/D instances);
    ``model``'s own attention backends' kernel block where it needs one
    (DeepSeek Sparse Attention: 64 on CUDA)."""
    return resolve_cache_defaults(
        opts.vllm_version, hardware.platform, block_size=opts.block_size,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        enable_extensible_kv_cache=opts.enable_extensible_kv_cache,
        num_gpu_blocks_override=opts.num_gpu_blocks_override, registers_kv_cache=registers_kv_cache,
        model_kernel_block=model_kernel_block(model, hardware.platform) if model is not None else None)


def build_deployment(opts: EngineOptions, registers_kv_cache: bool = False) -> Deployment:
    """The deployment ``opts`` describe: its engine arguments validated, its
    files (model config, calibration, step profile) read, each once.
    Expert parallelism on a dense model is dropped (``options`` then says
    so), as vLLM has no experts to shard there. ``registers_kv_cache``: a
    KV connector registers the cache for RDMA (NIXL: a P/D instance)."""
    validate_engine_options(opts)
    model = get_model(opts.model)
    if opts.enable_expert_parallel and not model.is_moe:
        opts = dataclasses.replace(opts, enable_expert_parallel=False)
    # Read before anything is built: a bad file is refused first.
    host = load_calibration(opts.calibration) if opts.calibration is not None else None
    profile = load_profile(opts.step_time_profile) if opts.step_time_profile is not None else None
    hardware = get_hardware(opts.hardware)
    if opts.efficiency_file:
        hardware = load_efficiency_overrides(opts.efficiency_file, hardware)
    parallel = ParallelConfig(opts.tensor_parallel_size, opts.data_parallel_size,
                              opts.enable_expert_parallel, opts.pipeline_parallel_size)
    model.check_tensor_parallel_size(opts.tensor_parallel_size)
    check_sparse_mla_device(model, hardware)
    cache = resolve_cache(opts, hardware, registers_kv_cache, model)
    block_size = cache.block_size
    limits = resolve_scheduler_limits(
        UsageContext.OPENAI_API_SERVER, device_info(hardware, parallel),
        max_num_seqs=opts.max_num_seqs, max_num_batched_tokens=opts.max_num_batched_tokens,
        max_model_len=opts.max_model_len, max_position_embeddings=model.max_position_embeddings,
        enable_chunked_prefill=opts.enable_chunked_prefill)
    max_num_seqs = limits.max_num_seqs
    max_num_batched_tokens = limits.max_num_batched_tokens
    max_model_len = limits.max_model_len
    weights = weight_format(opts)
    if weights.layers == "experts" and not model.is_moe:
        raise UserInputError(f"quantization={opts.quantization!r} (--quantization): {weights.weights} "
                         f"quantizes MoE experts only and {model.name} is dense; use fp8 or "
                         "modelopt_fp4")
    speculative = None
    if opts.speculative_config is not None:
        if profile is not None:
            raise UserInputError("speculative_config (--speculative-config) with --step-time-profile: the "
                                 "profile holds no drafter or verification steps; drop one of them")
        speculative = parse_speculative_config(opts.speculative_config, model, opts.async_scheduling,
                                               opts.spec_acceptance, opts.vllm_version)
    # vLLM's uniform decode query length: 1 + K with speculative decoding;
    # its CUDA-graph sizes cover max_num_seqs such decodes, twice.
    query_len = 1 + (speculative.num_speculative_tokens if speculative is not None else 0)
    runtime = RuntimeConfig(dtype=weights.weights, kv_cache_dtype=kv_cache_dtype(opts, model, hardware),
                            quantized_layers=weights.layers,
                            async_scheduling=opts.async_scheduling,
                            cudagraph_max_size=min(2 * max_num_seqs * query_len, 512),
                            cudagraph_multiple_of=query_len)
    if profile is not None:
        # Before the memory plan: a profile of another model is the error to report.
        check_profile_matches(profile, model, parallel, runtime)
    scheduler_config = SchedulerConfig(
        max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, enable_chunked_prefill=opts.enable_chunked_prefill,
        long_prefill_token_threshold=opts.long_prefill_token_threshold,
        policy=opts.scheduling_policy, async_scheduling=opts.async_scheduling,
        pipeline_parallel_size=opts.pipeline_parallel_size,
        max_num_inflight_kv_loads=opts.max_num_inflight_kv_loads,
        cache_aware_admission_window=opts.cache_aware_admission_window,
        cache_aware_admission_threshold=opts.cache_aware_admission_threshold,
        vllm_version=opts.vllm_version)
    drafter = None
    drafter_bytes = 0.0
    if speculative is not None:
        check_speculative_settings(scheduler_config, speculative.core_config())
        drafter = drafter_shape(speculative.method, speculative.num_speculative_tokens, model)
        drafter_bytes = drafter_weight_bytes(drafter, model, parallel, runtime)
    lora = None
    if opts.enable_lora:
        lora = lora_cost(model, hardware, opts.tensor_parallel_size, opts.max_loras, opts.max_lora_rank,
                         opts.max_cpu_loras, opts.fully_sharded_loras,
                         parse_lora_modules(opts.lora_modules, opts.max_lora_rank), opts.lora_target_modules)
    memory = plan_memory(model, hardware, parallel, runtime, block_size,
                         cache.gpu_memory_utilization, max_num_batched_tokens, max_num_seqs,
                         drafter_bytes=drafter_bytes,
                         drafter_kv_layers=drafter.kv_layers if drafter is not None else 0,
                         lora_bytes=lora.slot_bytes() if lora is not None else 0.0,
                         extensible=cache.extensible_kv_cache,
                         enable_prefix_caching=opts.enable_prefix_caching, max_model_len=max_model_len)
    mamba = memory.mamba
    if mamba is not None:
        # vLLM raised the attention block size to hold a Mamba state page; the
        # scheduler's block is the LCM of the groups' (kvsched.core.hybrid_kv_cache).
        block_size = resolve_block_sizes(CacheConfig(num_gpu_blocks=2, block_size=mamba.block_size,
                                                     enable_prefix_caching=opts.enable_prefix_caching,
                                                     kv_groups=memory.kv_groups)).scheduler_block_size
    num_blocks = (memory.num_gpu_blocks if opts.num_gpu_blocks_override is None
                  else opts.num_gpu_blocks_override)
    if opts.num_gpu_blocks_override is None and profile is not None and profile.kv_cache_tokens:
        # The KV cache the profiled vLLM reported (on CPU, VLLM_CPU_KVCACHE_SPACE's):
        # the memory plan of --hardware does not describe that machine.
        num_blocks = profile.kv_cache_tokens // block_size
    if num_blocks * opts.data_parallel_size > MAX_NUM_GPU_BLOCKS:
        # A tiny model (e.g. from a config.json) on a large GPU: refused, not capped.
        raise UserInputError(
            f"the KV cache would have {num_blocks:,} blocks per engine core x {opts.data_parallel_size} "
            f"({memory.describe()}); the simulator tracks at most {MAX_NUM_GPU_BLOCKS:,} (2**24, ~46 "
            "bytes each); set --num-gpu-blocks-override, raise --block-size or lower "
            "--gpu-memory-utilization")
    if memory.kv_groups:
        # vLLM's start-up check over its KV cache groups: one request of
        # max_model_len tokens must fit in the pool beside the null block.
        needed = request_blocks(memory, scheduler_config, block_size)
        if num_blocks - 1 < needed:
            raise UserInputError(
                f"max_model_len={max_model_len} needs {needed} KV blocks over "
                f"{len(memory.kv_groups)} KV cache groups (vLLM's full-attention, sliding-window and "
                f"Mamba groups share one pool) but the cache holds {num_blocks - 1} ({memory.describe()}); "
                "lower --max-model-len, raise --gpu-memory-utilization, --tensor-parallel-size or "
                "--pipeline-parallel-size")
    elif (num_blocks - 1) * block_size < max_model_len:
        raise UserInputError(
            f"max_model_len={max_model_len} needs {max_model_len} tokens of KV but the cache holds "
            f"{(num_blocks - 1) * block_size} ({memory.describe()}); lower --max-model-len, "
            "raise --gpu-memory-utilization, --tensor-parallel-size or --pipeline-parallel-size")
    cache_config = CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size,
                               enable_prefix_caching=opts.enable_prefix_caching, kv_groups=memory.kv_groups,
                               mamba_cache_mode=mamba.mamba_cache_mode if mamba is not None else None)
    offload = make_offload_config(opts.kv_offloading_size, model, hardware, opts.tensor_parallel_size,
                                  memory.bytes_per_block,
                                  drafter_kv_layers=drafter.kv_layers if drafter is not None else 0)
    step_model = make_step_model(opts, model, hardware, parallel, runtime, profile, host)
    if drafter is not None:
        step_model.drafter = Drafter(drafter, step_model)
    if opts.pipeline_parallel_size > 1:
        step_model.pipeline = PipelineStages.build(hardware, model.hidden_size, opts.tensor_parallel_size,
                                                   opts.pipeline_parallel_size)
    return Deployment(opts, model, hardware, parallel, runtime, scheduler_config, cache_config,
                      memory, step_model, speculative, offload, lora, cache.gpu_memory_utilization)
