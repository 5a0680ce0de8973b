"""How long one engine step takes, from the composition of its batch.

A roofline per component, per device: each part of the forward pass takes the
longer of its FLOPs at the achieved FLOP rate and its bytes at the achieved
bandwidth (the efficiency factors of :class:`~kvsched.perf.hardware.Hardware`).

- Linear layers (attention projections, dense MLPs, shared experts): weights
  read once per step, 2 FLOPs per weight per token; decode-only batches are
  padded to the CUDA-graph capture size, as vLLM runs them.
- Routed experts: only the experts the step's tokens touch are read (expected
  distinct experts under uniform routing); FLOPs for ``experts_per_token``
  experts per token.
- Attention: prefill FLOPs over each new token's context (causal); decode reads
  the whole KV of each sequence. MLA (DeepSeek) decode runs absorbed over the
  576-value latent, its prefill un-absorbed plus the latent up-projection.
  Sliding-window layers cap the context at the window (see ``BatchShape``).
- LM head: only for the positions that sample (with speculative decoding,
  every verified draft position too).
- Speculative decoding: a request verifying d drafts is a decode of 1 + d
  query tokens (its KV read once, its extra queries' FLOPs added); the
  drafter's own passes are priced by :mod:`kvsched.perf.drafter` with the
  same backend and added to the forward pass.
- Tensor-parallel all-reduce (two per layer) on the scale-up fabric, or on
  the scale-out network for a TP group larger than the scale-up domain;
  expert-parallel all-to-all (dispatch and combine per MoE layer) on the
  scale-up fabric.
- A fixed latency per kernel and a CPU cost per step and per request; with
  async scheduling the CPU work overlaps the forward pass.
- Host terms (:mod:`kvsched.perf.host`), the GPU's idle time around a
  step's kernels: every backend carries them and adds them here, in one
  place (:meth:`StepTimeModel.add_host_gaps`, ``add_prefill_host`` and
  ``gpu_time``). The measured backend's and the roofline's default is the
  fitted file (:func:`kvsched.perf.host.default_host_terms`); the profiled
  backend's the serving path its profile measured; ``--calibration FILE``
  replaces them, ``--calibration none`` drops them.

Inputs are integer aggregates (``BatchShape``), so the same batch always gives
the same float: the simulator's fast-forward relies on that.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.perf.checkpoint_format import check_quantized_layers, quantizes
from kvsched.perf.decode_steps import combine_step_time as combine_step_time
from kvsched.perf.decode_steps import roofline_decode_times
from kvsched.perf.hardware import Hardware
from kvsched.perf.host import NO_HOST_TIME, HostTerms
from kvsched.perf.hybrid import INDEX_KEY_SCALE_BYTES
from kvsched.perf.kv_cache_planning import attention_bytes_per_token
from kvsched.perf.models import ModelSpec
from kvsched.perf.pipeline import PipelineStages

# KERNEL_LATENCY_S re-exported: its users import it from here.
from kvsched.perf.roofline_factors import KERNEL_LATENCY_S as KERNEL_LATENCY_S
from kvsched.perf.roofline_factors import KernelFactors, RooflineFactors, roofline_factors

# Weight formats, bytes per weight including their scales:
# - fp8_block: FP8 with a scale per 128 x 128 block (Qwen's, DeepSeek's and
#   MiniMax's FP8 checkpoints); the scales are 1/16384 of the bytes.
# - nvfp4: E2M1 (4 bits) plus one FP8 E4M3 scale per 16 weights (NVIDIA
#   ModelOpt; the one FP32 scale per tensor is negligible): 0.5 + 1/16.
# - mxfp4: E2M1 plus one E8M0 (8-bit) scale per 32 weights (OCP MX; gpt-oss):
#   0.5 + 1/32.
# - int4: 4-bit integers plus one 16-bit scale per group of 32, symmetric so
#   no zero point (compressed-tensors' pack-quantized; Kimi-K2.5): 0.5 + 2/32.
DTYPE_BYTES: Mapping[str, float] = MappingProxyType({
    "auto": 2, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp8": 1,
    "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_block": 1,
    "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32, "int4": 0.5 + 2 / 32})
# 4-bit formats vLLM runs weight-only (dequantized into 16-bit math): MXFP4
# (Marlin on Hopper; on Blackwell FlashInfer's MXFP4 x BF16 MoE, vLLM's
# default there) and int4 (Marlin). NVFP4 is W4A4 where the GPU has FP4
# tensor cores and weight-only (Marlin) elsewhere, as aiconfigurator's
# ``resolve_nvfp4_for_system`` also reads it.
WEIGHT_ONLY_DTYPES = frozenset({"mxfp4", "int4"})
KERNELS_PER_LAYER = 8          # norm, qkv, attention, o, norm, up/gate, act, down
GEMMS_PER_LAYER = 4            # qkv, o, up/gate, down
ELEMENTWISE_PER_LAYER = 3      # norm, norm, act
CPU_STEP_S = 0.5e-3            # scheduling + input preparation + output processing, per step
CPU_PER_REQUEST_S = 4e-6       # per scheduled request (vLLM's scheduler alone is a few µs)


# vLLM's --kv-cache-dtype names the model covers ("auto": the 16-bit activation dtype).
KV_CACHE_DTYPE_BYTES = {"auto": 2, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_cache_dtype_bytes(value: str) -> int:
    """Bytes per KV-cache element: "auto" is the 16-bit activation dtype (FP8
    weights do not make an FP8 cache; only --kv-cache-dtype fp8 does)."""
    if isinstance(value, str) and value in KV_CACHE_DTYPE_BYTES:
        return KV_CACHE_DTYPE_BYTES[value]
    raise UserInputError(f"kv_cache_dtype={value!r} (--kv-cache-dtype): unknown KV-cache dtype; use one of "
                     f"{', '.join(KV_CACHE_DTYPE_BYTES)}")


# vLLM's --dtype (the model's activation dtype, and its weights' when the
# checkpoint is not quantized) -> kvsched's 16-bit weight name; bf16 and
# fp16 are kvsched's own spellings, kept as aliases. "auto" is the
# checkpoint's torch_dtype: bfloat16 for every catalog model.
MODEL_DTYPES: Mapping[str, str] = MappingProxyType({
    "auto": "bf16", "bfloat16": "bf16", "bf16": "bf16", "half": "fp16", "float16": "fp16", "fp16": "fp16"})
# vLLM's 32-bit --dtype values: kvsched has no FP32 GEMM rate to price them.
FP32_DTYPES = ("float", "float32")


def model_dtype(value: str) -> str:
    """The 16-bit weight dtype of vLLM's ``--dtype`` ``value``; the one
    owner of what --dtype takes. A weight format (fp8, nvfp4, mxfp4, int4)
    is refused: quantization comes from --quantization or the checkpoint's
    own format, never from --dtype."""
    name = value.lower() if isinstance(value, str) else value
    if isinstance(name, str) and name in MODEL_DTYPES:
        return MODEL_DTYPES[name]
    if name in FP32_DTYPES:
        raise UserInputError(f"dtype={value!r} (--dtype): kvsched prices 16-bit models only (the hardware "
                         "data has no FP32 GEMM rates); use bfloat16 or float16")
    if isinstance(name, str) and name in DTYPE_BYTES:
        raise UserInputError(f"dtype={value!r} (--dtype): {value} is a weight quantization, not a model "
                         "dtype; quantize with --quantization (fp8, modelopt_fp4, mxfp4), or name a "
                         "checkpoint stored in it, and keep --dtype to one of "
                         f"{', '.join(MODEL_DTYPES)}")
    raise UserInputError(f"dtype={value!r} (--dtype): unknown model dtype; use one of "
                     f"{', '.join(MODEL_DTYPES)} (vLLM's --dtype; float32 is not priced)")


def dtype_bytes(field: str, value: str) -> float:
    """Bytes per weight of ``value``, scales included."""
    try:
        return DTYPE_BYTES[value.lower()]
    except (KeyError, AttributeError):
        raise UserInputError(f"{field}={value!r}: unknown dtype; use one of "
                         f"{', '.join(sorted(DTYPE_BYTES))}") from None


def math_dtype(dtype: str, hardware: Hardware) -> str:
    """The tensor-core math ("bf16", "fp8" or "fp4") a GEMM on ``dtype``
    weights runs in on ``hardware``."""
    name = dtype.lower()
    wb = dtype_bytes("dtype", name)
    if name == "nvfp4":
        return "fp4" if hardware.has_fp4 else "bf16"
    if name in WEIGHT_ONLY_DTYPES or wb == 2:
        return "bf16"
    if not hardware.has_fp8:
        raise UserInputError(f"dtype={dtype!r}: {hardware.name} has no FP8 path; use 16-bit weights (no "
                         "--quantization fp8; for a checkpoint published in FP8, such as DeepSeek-V3's, "
                         "its 16-bit conversion, e.g. deepseek-ai/DeepSeek-V3-BF16)")
    return "fp8"


def gemm_factors(math: str, factors: RooflineFactors) -> KernelFactors:
    """The roofline factors of a GEMM in ``math`` (see :func:`math_dtype`).
    FP4 takes the FP8 ones: no FP4 GEMM efficiency is measured in the facts
    or fitted."""
    return factors.gemm_fp8 if math in ("fp4", "fp8") else factors.gemm_bf16


def gemm_flop_rate(math: str, hardware: Hardware, factors: RooflineFactors | None = None) -> float:
    """Achieved FLOP/s of a GEMM in ``math``: the peak of ``hardware`` at the
    efficiency of ``factors`` (default: the roofline's for it)."""
    hw = hardware
    eff = gemm_factors(math, factors if factors is not None else roofline_factors(hw)).flops_eff
    if math == "fp4":
        return (hw.fp4_flops or 0.0) * eff
    if math == "fp8":
        return (hw.fp8_flops or 0.0) * eff
    return hw.bf16_flops * eff


def cudagraph_capture_sizes(max_size: int, multiple_of: int = 1) -> list[int]:
    """vLLM's default decode capture sizes: 1, 2, 4, then every 8 up to 256,
    every 16 beyond, up to ``max_size``. With speculative decoding
    (``multiple_of`` = 1 + num_speculative_tokens, the uniform decode query
    length) each size is rounded up to a multiple of it, those past
    ``max_size`` dropped (vLLM's adjust_cudagraph_sizes_for_spec_decode)."""
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, max(max_size, 272) + 1, 16)]
    sizes = [s for s in sizes if s <= max_size] or [1]
    if multiple_of <= 1:
        return sizes
    rounded = sorted({r for s in sizes if (r := -(-s // multiple_of) * multiple_of) <= max_size})
    return rounded or [multiple_of]


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    # Stages of TP GPUs each (kvsched.perf.pipeline prices them); the step
    # backends price the whole model on one TP group.
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise UserInputError(f"{name}={value!r}: must be a positive integer")

    @property
    def expert_parallel_size(self) -> int:
        """vLLM shards experts over TP × DP ranks when expert parallelism is on."""
        if self.enable_expert_parallel:
            return self.tensor_parallel_size * self.data_parallel_size
        return 1

    @property
    def expert_shards(self) -> int:
        """Devices the routed experts are split over: the expert-parallel
        group when expert parallelism is on (whole experts per rank), else the
        TP group (every expert split over it)."""
        ep = self.expert_parallel_size
        return ep if ep > 1 else self.tensor_parallel_size

    @property
    def expert_tensor_parallel_size(self) -> int:
        """Ranks each routed expert's weights are split over: 1 under expert
        parallelism, else the TP group (see :attr:`expert_shards`)."""
        return 1 if self.expert_parallel_size > 1 else self.tensor_parallel_size

    @property
    def uses_all_to_all(self) -> bool:
        """vLLM dispatches tokens to experts with all-to-all kernels only when
        expert parallelism spans data-parallel ranks (FusedMoE's
        ``use_all2all_kernels``); with one DP rank the experts are split over
        the TP group and their outputs summed by the layer's all-reduce."""
        return self.enable_expert_parallel and self.data_parallel_size > 1


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    # Which linear layers ``dtype`` covers (kvsched.perf.checkpoint_format.QUANTIZED_LAYERS);
    # the others run in 16 bits.
    quantized_layers: str = "all"
    async_scheduling: bool = True
    cudagraph_max_size: int = 512
    # Capture sizes are multiples of this: 1 + num_speculative_tokens with
    # speculative decoding (vLLM's uniform decode query length), else 1.
    cudagraph_multiple_of: int = 1
    cpu_step_s: float = CPU_STEP_S
    cpu_per_request_s: float = CPU_PER_REQUEST_S

    def __post_init__(self) -> None:
        dtype_bytes("dtype", self.dtype)
        kv_cache_dtype_bytes(self.kv_cache_dtype)
        check_quantized_layers(self.quantized_layers)

    @property
    def kv_bytes(self) -> int:
        return kv_cache_dtype_bytes(self.kv_cache_dtype)


@dataclass(frozen=True, slots=True)
class WeightSplit:
    """A deployment's parameters by how they lie on one device (whole-model
    counts; see :func:`weight_split`): ``quantized``, the linear layers the
    weight format covers but the routed experts; ``linear16``, the other
    linear layers and the MoE routers (16-bit, read by every token);
    ``routed_experts``; ``sixteen_bit``, everything 16-bit (``linear16``
    plus embedding, LM head, norms). All but the routed experts split over
    TP; the routed experts over ``expert_shards``."""

    tensor_parallel_size: int
    expert_shards: int
    quantized: int
    linear16: int
    routed_experts: int
    sixteen_bit: int
    experts_quantized: bool

    def bytes_per_device(self, weight_bytes: float) -> float:
        """Weight bytes on one device, ``weight_bytes`` per quantized weight
        (scales included), 2 per 16-bit one."""
        expert_bytes = weight_bytes if self.experts_quantized else 2
        return ((self.sixteen_bit * 2 + self.quantized * weight_bytes) / self.tensor_parallel_size
                + self.routed_experts * expert_bytes / self.expert_shards)


def weight_split(model: ModelSpec, parallel: ParallelConfig, quantized_layers: str = "all") -> WeightSplit:
    """The one owner of which weights a format covers and how they split
    over the devices (:class:`WeightSplit`): the step time reads the
    per-device linear weights from it, the memory plan their bytes."""
    m = model
    linear = {"attention": m.mixer_params(),
              "dense_mlp": m.num_dense_layers * m.dense_mlp_params_per_layer(),
              "shared_experts": m.num_moe_layers * m.shared_expert_params()}
    quantized = sum(n for part, n in linear.items() if quantizes(quantized_layers, part))
    linear16 = (sum(n for part, n in linear.items() if not quantizes(quantized_layers, part))
                + m.num_moe_layers * m.router_params_per_layer())
    experts = m.num_moe_layers * m.num_experts * m.expert_params()
    return WeightSplit(parallel.tensor_parallel_size, parallel.expert_shards, quantized, linear16, experts,
                       m.num_params() - experts - quantized, quantizes(quantized_layers, "routed_experts"))


@dataclass(slots=True)
class BatchShape:
    """One step's batch as integer aggregates over its scheduled requests.

    A request with ``n`` new tokens and ``c`` already computed is a *decode*
    when ``n == 1`` and a *prefill chunk* otherwise.
    """

    num_tokens: int            # Σ n
    num_reqs: int
    num_sampled: int           # requests that sample a token this step
    num_decodes: int           # requests with n == 1
    decode_kv_tokens: int      # Σ (c + 1) over decodes: KV each decode reads
    prefill_tokens: int        # Σ n over prefill chunks
    prefill_kv_tokens: int     # Σ (c + n) over prefill chunks
    prefill_attn_pairs: int    # Σ (n·c + n(n+1)/2): query-key pairs, causal
    # Speculative decoding: a request verifying d drafts (n = 1 + d) is a
    # decode of n query tokens: in num_decodes, its KV read (c + n) in
    # decode_kv_tokens. spec_tokens = Σ d (in num_tokens; each also gets a
    # row of logits), spec_query_keys = Σ (d·c + d(d+1)/2), the query-key
    # pairs its extra queries add over one query per KV token read.
    spec_tokens: int = 0
    spec_query_keys: int = 0
    # LoRA: GPU seconds its adapter loads and kernels add to the step
    # (kvsched.perf.lora prices them; the simulator's rank keeps the
    # adapter caches they depend on).
    lora_gpu_s: float = 0.0
    # The vision encoder: GPU seconds its images add to the step
    # (kvsched.perf.vision prices them; kvsched.sim.encoder picks the
    # images a step encodes).
    encoder_gpu_s: float = 0.0

    @classmethod
    def decode(cls, num_reqs: int, decode_kv_tokens: int) -> BatchShape:
        return cls(num_reqs, num_reqs, num_reqs, num_reqs, decode_kv_tokens, 0, 0, 0)


def sparse_shape(shape: BatchShape, topk: int) -> BatchShape:
    """``shape`` as attention sees it when every query attends to at most
    ``topk`` keys (DeepSeek Sparse Attention): each decode reads at most
    ``topk`` keys, each prefill query pairs with at most ``topk`` keys and
    each prefill request's chunk reads at most ``topk`` plus its own new
    keys. Upper bounds from the aggregates, exact once every context is
    past ``topk`` (or all within it)."""
    num_prefills = shape.num_reqs - shape.num_decodes
    return dataclasses.replace(
        shape, decode_kv_tokens=min(shape.decode_kv_tokens, topk * shape.num_decodes),
        prefill_kv_tokens=min(shape.prefill_kv_tokens, topk * num_prefills + shape.prefill_tokens),
        prefill_attn_pairs=min(shape.prefill_attn_pairs, topk * shape.prefill_tokens),
        spec_query_keys=min(shape.spec_query_keys, topk * shape.spec_tokens))


class DrafterTime(Protocol):
    """What a step-time model needs of a speculative-decoding drafter
    (:class:`kvsched.perf.drafter.Drafter`): its seconds per step."""

    def gpu_time(self, shape: BatchShape, global_tokens: int | None = None) -> float: ...

    def cpu_time(self, shape: BatchShape) -> float: ...

    def describe(self) -> str: ...


def _roof(flops: float, flop_rate: float, nbytes: float, bandwidth: float) -> float:
    a = flops / flop_rate
    b = nbytes / bandwidth
    return a if a > b else b


class StepTimeModel:
    """Seconds per step for one engine (a TP group; one DP rank)."""

    backend = "roofline"

    def __init__(self, model: ModelSpec, hardware: Hardware,
                 parallel: ParallelConfig | None = None,
                 runtime: RuntimeConfig | None = None, host: HostTerms | None = None) -> None:
        parallel = parallel or ParallelConfig()
        runtime = runtime or RuntimeConfig()
        self.model = model
        self.hardware = hardware
        self.parallel = parallel
        self.runtime = runtime
        tp = parallel.tensor_parallel_size
        ep = parallel.expert_parallel_size
        hw = hardware
        wb = dtype_bytes("dtype", runtime.dtype)
        kvb = runtime.kv_bytes
        # The layers runtime.quantized_layers names run at ``dtype`` (bytes
        # and math); the rest, the router and the LM head in 16 bits.
        self.math = math_dtype(runtime.dtype, hw)
        self.weight_bytes = wb
        self.kv_bytes = kvb
        # Efficiencies and per-call latencies per kernel kind: learned from
        # the measured tables, or the hardware's (kvsched.perf.roofline_factors).
        f = self.factors = roofline_factors(hw)
        lin = gemm_factors(self.math, f)
        self.lin_flops = gemm_flop_rate(self.math, hw, f)
        self.head_flops = gemm_flop_rate("bf16", hw, f)
        # Weight bandwidth: the 16-bit weights' (LM head, routers, 16-bit
        # layers) and the quantized layers' (``lin_bw``).
        self.weight_bw = hw.mem_bw * f.gemm_bf16.bw_eff
        self.lin_bw = hw.mem_bw * lin.bw_eff
        self.prefill_attn_bw = hw.mem_bw * f.attention_prefill.bw_eff
        self.prefill_attn_flops = hw.bf16_flops * f.attention_prefill.flops_eff
        self.decode_attn_bw = hw.mem_bw * f.attention_decode.bw_eff
        self.decode_attn_flops = hw.bf16_flops * f.attention_decode.flops_eff
        m = model
        L = m.num_layers
        split = weight_split(m, parallel, runtime.quantized_layers)
        self.dense_params = split.quantized / tp
        self.dense16_params = split.linear16 / tp
        self.expert_shards = split.expert_shards
        experts_quantized = split.experts_quantized
        self.expert_bytes = wb if experts_quantized else 2.0
        # Routed experts: their math's MoE factors (learned from the fused-MoE
        # tables, or the hardware's GEMM factors), one latency per MoE layer.
        expert_math = self.math if experts_quantized else "bf16"
        self.expert_kind = "moe_fp8" if expert_math in ("fp4", "fp8") else "moe_bf16"
        moe = f.moe_fp8 if self.expert_kind == "moe_fp8" else f.moe_bf16
        peak = {"fp4": hw.fp4_flops, "fp8": hw.fp8_flops}.get(expert_math, hw.bf16_flops)
        self.expert_flops = (peak or 0.0) * moe.flops_eff
        self.expert_bw = hw.mem_bw * moe.bw_eff
        self.expert_latency = moe.latency_s
        self.lm_head_params = m.lm_head_matmul_params() / tp
        self.moe_layers = m.num_moe_layers
        self.expert_params = m.expert_params()
        self.num_experts = m.num_experts
        self.topk = m.experts_per_token
        self.tp = tp
        self.ep = ep
        # Attention per device: heads split over TP; KV heads too, but never
        # below one (vLLM replicates them); MLA's latent is replicated.
        heads = m.num_heads / tp
        kv_per_layer = attention_bytes_per_token(m, kvb, tp, hw)
        if m.is_mla:
            latent = m.kv_lora_rank + m.qk_rope_head_dim
            self.decode_flops_per_key = 2 * heads * (latent + m.kv_lora_rank)
            self.prefill_flops_per_pair = 2 * heads * (m.head_dim + m.v_head_dim)
            # Un-absorbed prefill first expands the latent into per-head K and V.
            self.prefill_flops_per_kv = 2 * m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        else:
            self.decode_flops_per_key = 4 * heads * m.head_dim
            self.prefill_flops_per_pair = 4 * heads * m.head_dim
            self.prefill_flops_per_kv = 0.0
        self.kv_bytes_per_layer = kv_per_layer
        # A hybrid model's other layer kinds (kvsched.perf.hybrid), priced on
        # the roofline by every backend (_hybrid_time); None: none.
        self.hybrid = m.hybrid
        self.full_layers = m.num_full_attention_layers
        # DSA's layers that score the context themselves (the rest reuse their top-k).
        self.index_layers = m.num_index_layers
        self.sliding_layers = m.num_sliding_layers
        self.window = m.sliding_window
        self.hidden = m.hidden_size
        self.num_layers = L
        # All-reduces per step: one after each residual block.
        self.num_blocks = m.num_blocks
        # TP all-reduces: on the scale-up fabric within its domain, over the
        # scale-out network beyond (refused where the hardware data has none).
        self.ar_bw = hw.tensor_parallel_bw(tp) * f.allreduce.bw_eff if tp > 1 else 0.0
        self.ar_latency = f.allreduce.latency_s
        self.a2a_bw = hw.scaleup_bw_for_group(ep) * hw.comm_bw_frac if ep > 1 else 0.0
        self.comm_latency = hw.comm_latency_s
        # Fixed latency per kernel: with the hardware's factors 3 us for each
        # of a layer's kernels, every step; with learned attention factors the
        # attention kernels' own latency, per phase a step runs (a mixed step
        # runs a prefill and a decode call), and each GEMM its kind's.
        learned_attention = f.learned_kinds & {"attention_prefill", "attention_decode"}
        if not f.learned_kinds:
            self.fixed_gpu_s = L * KERNELS_PER_LAYER * KERNEL_LATENCY_S
        else:
            # The MLP's two GEMM kernels, but in MoE layers whose experts
            # carry their own learned latency (_routed_expert_time).
            mlp_layers = L - self.moe_layers if self.expert_kind in f.learned_kinds else L
            per_layer = ELEMENTWISE_PER_LAYER * KERNEL_LATENCY_S + (GEMMS_PER_LAYER - 2) * lin.latency_s
            self.fixed_gpu_s = (L * (per_layer if learned_attention else per_layer + KERNEL_LATENCY_S)
                                + mlp_layers * 2 * lin.latency_s)
        self.prefill_attn_latency = L * f.attention_prefill.latency_s if learned_attention else 0.0
        self.decode_attn_latency = L * f.attention_decode.latency_s if learned_attention else 0.0
        self.capture_sizes = cudagraph_capture_sizes(runtime.cudagraph_max_size,
                                                     runtime.cudagraph_multiple_of)
        self.async_scheduling = runtime.async_scheduling
        # Memos of the batch-size-only parts of decode steps (see gpu_time and
        # decode_step_time).
        self._decode_parts: dict[tuple[int, int, int, int], tuple[float, float]] = {}
        self._decode_step_parts: dict[tuple[int, int | None], tuple[float, float, float]] = {}
        # Why a better backend was not used, if one was asked for ("auto").
        self.backend_note = ""
        # Queries a table-based backend answered past its tables (the
        # roofline has none).
        self.extrapolated: set[str] = set()
        # Host terms (kvsched.perf.host): the GPU's idle time around the
        # kernels, added to every step's forward pass (None: no such time;
        # RuntimeConfig's CPU terms, which overlap the forward pass under
        # async scheduling, are apart from them).
        self.host: HostTerms | None = host
        # What to say of the host terms beside whose they are (a borrowed
        # default, kvsched.perf.host.default_host_terms).
        self.host_borrowed = ""
        terms = host if host is not None else NO_HOST_TIME
        # A step with prefill tokens: the per-layer charge of files fitted
        # before 2026-12-05, its launch floor, and what its prefill
        # requests and tokens cost (kvsched.perf.host).
        self._prefill_host_s = terms.prefill_step_per_layer_s * model.num_layers
        self._prefill_floor_s = terms.prefill_launch_per_layer_s * model.num_layers
        self._per_prefill_req_s = terms.per_prefill_request_s
        self._per_prefill_tok_s = terms.per_prefill_token_s
        # The gap between steps every step pays (the DP ranks' agreement
        # only when there are several), and its part per sampled request.
        self._step_host_s = terms.step_s + (terms.dp_sync_s if parallel.data_parallel_size > 1 else 0.0)
        self._per_sampled_host_s = terms.per_sampled_request_s
        # Speculative decoding's drafter, priced per step on top of the
        # target's forward pass (kvsched.perf.drafter; None: no drafter).
        self.drafter: DrafterTime | None = None
        # Pipeline parallelism's stages (kvsched.perf.pipeline; None: one
        # stage): the simulator splits each step's price over them.
        self.pipeline: PipelineStages | None = None

    def with_host(self, host: HostTerms) -> StepTimeModel:
        """This backend pricing the same deployment with the host terms
        ``host`` (calibrate replays a run with each candidate): the same
        note and drafter, fresh memos."""
        twin = self._rebuilt(host)
        twin.backend_note = self.backend_note
        twin.host_borrowed = self.host_borrowed if host is self.host else ""
        twin.drafter = self.drafter
        twin.pipeline = self.pipeline
        return twin

    def _rebuilt(self, host: HostTerms) -> StepTimeModel:
        """A new model of this backend and deployment with ``host``; each
        backend builds its own."""
        return StepTimeModel(self.model, self.hardware, self.parallel, self.runtime, host)

    def add_host_gaps(self, t: float, num_sampled: int) -> float:
        """``t`` plus the host's gap of a step in which ``num_sampled``
        requests sample: the one owner of how the per-step host terms add
        (every backend, stepping and fast-forward alike: the same float)."""
        return t + self._step_host_s + self._per_sampled_host_s * num_sampled

    def add_prefill_host(self, t: float, shape: BatchShape) -> float:
        """``t`` (a step's forward pass plus its host gaps, add_host_gaps)
        with what the step's prefill work costs the host
        (kvsched.perf.host): the layers' launches as a floor under the
        forward pass (a step outside full CUDA graphs), and each prefill
        request and token. A decode-only step pays none of it."""
        if shape.prefill_tokens:
            floor = self._prefill_floor_s
            if floor:
                gaps = self._step_host_s + self._per_sampled_host_s * shape.num_sampled
                if t - gaps < floor:
                    t = floor + gaps
            t += (self._prefill_host_s + self._per_prefill_req_s * (shape.num_reqs - shape.num_decodes)
                  + self._per_prefill_tok_s * shape.prefill_tokens)
        return t

    def host_note(self) -> str:
        """Whose host terms price the steps; "no host terms" when none."""
        h = self.host
        if h is None or h.terms() == NO_HOST_TIME.terms():
            return "no host terms"
        note = f"host terms {h.vllm_version}/{h.hardware_class}"
        return f"{note} ({self.host_borrowed})" if self.host_borrowed else note

    def describe_backend(self) -> str:
        """Which backend prices the steps, for summaries and saved results."""
        notes = [n for n in (self.backend_note, f"efficiencies: {self.factors.source}", self.host_note())
                 if n]
        return "roofline (" + "; ".join(notes) + ")"

    def pricing(self) -> str:
        """The pricing's short name, for a table row or a candidate: the
        backend, "roofline-fallback" where a better backend was asked for
        ("auto") and could not price the deployment (``backend_note`` says
        why). The one owner of that label (:mod:`kvsched.sim.pricing` reads
        it for results, compare rows and tune candidates)."""
        return "roofline-fallback" if self.backend == "roofline" and self.backend_note else self.backend

    def padded_tokens(self, num_tokens: int) -> int:
        sizes = self.capture_sizes
        i = bisect.bisect_left(sizes, num_tokens)
        return sizes[i] if i < len(sizes) else num_tokens

    def gpu_time(self, shape: BatchShape, global_tokens: int | None = None) -> float:
        """Forward-pass seconds. ``global_tokens`` is the tokens of all DP ranks
        that share the experts (expert parallelism); default: this batch."""
        T = shape.num_tokens
        if T == 0:
            return 0.0
        # Rows of logits: one per sampling request, plus one per verified draft.
        logits = shape.num_sampled + shape.spec_tokens
        if shape.prefill_tokens == 0:
            # Decode-only: pad to the CUDA-graph size; the parts that depend
            # only on the batch size repeat step after step, so memoise them.
            T = self.padded_tokens(T)
            key = (T, global_tokens or T, shape.num_sampled, logits)
            parts = self._decode_parts.get(key)
            if parts is None:
                parts = self._decode_parts[key] = self._batch_parts(T, global_tokens or T,
                                                                     shape.num_sampled, logits)
        else:
            parts = self._batch_parts(T, global_tokens or T, shape.num_sampled, logits)
        return self.add_prefill_host(parts[0] + self._layers_attention_time(shape) + parts[1], shape)

    def _layers_attention_time(self, s: BatchShape) -> float:
        """Every layer's attention part: the backend's full and sliding
        attention (over top-k keys with DeepSeek Sparse Attention) plus a
        hybrid model's other kinds (:meth:`_hybrid_time`)."""
        h = self.hybrid
        if h is None:
            return self._attention_time(s)
        shaped = sparse_shape(s, h.index_topk) if h.index_topk else s
        return self._attention_time(shaped) + self._hybrid_time(s)

    def _hybrid_time(self, s: BatchShape) -> float:
        """A hybrid model's layers that are not full attention, and DSA's
        indexer, on the roofline (kvsched.perf.hybrid's rules)."""
        h = self.hybrid
        assert h is not None
        t = 0.0
        tp = self.tp
        prefill = s.prefill_tokens > 0
        flops_rate = self.prefill_attn_flops if prefill else self.decode_attn_flops
        bw = self.prefill_attn_bw if prefill else self.decode_attn_bw
        if h.num_linear_layers:
            # Independent of the context: FLOPs per token, each request's state read and written once.
            flops = (h.linear_flops_per_token(True) * s.prefill_tokens
                     + h.linear_flops_per_token(False) * (s.num_tokens - s.prefill_tokens))
            state = 2.0 * s.num_reqs * h.linear_state_bytes()
            t += _roof(flops / tp, flops_rate, state / tp, bw) * h.num_linear_layers
        if h.num_mamba_layers:
            # Mamba-2 likewise: per token, and each request's state read and written once.
            flops = (h.mamba_flops_per_token(True) * s.prefill_tokens
                     + h.mamba_flops_per_token(False) * (s.num_tokens - s.prefill_tokens))
            state = 2.0 * s.num_reqs * h.mamba_state_bytes()
            t += _roof(flops / tp, flops_rate, state / tp, bw) * h.num_mamba_layers
        if h.num_chunked_layers:
            # Each token sees only its own chunk: a window of the chunk size (upper bounds).
            c = h.attention_chunk_size
            num_prefills = s.num_reqs - s.num_decodes
            t += self._attention_layer(min(s.decode_kv_tokens, c * s.num_decodes),
                                       min(s.prefill_kv_tokens, c * num_prefills + s.prefill_tokens),
                                       min(s.prefill_attn_pairs, c * s.prefill_tokens),
                                       min(s.spec_query_keys, c * s.spec_tokens)) * h.num_chunked_layers
        if h.index_topk:
            # The indexer scores every key of the context: FP8 q.k over its heads, per query-key pair,
            # and reads every key once (FP8 values and a 4-byte scale); heads split over TP.
            per_pair = 2.0 * h.index_n_heads * h.index_head_dim / tp
            pairs = s.decode_kv_tokens + s.spec_query_keys + s.prefill_attn_pairs
            keys = s.decode_kv_tokens + s.prefill_kv_tokens
            key_bytes = h.index_head_dim + INDEX_KEY_SCALE_BYTES
            fp8 = self.hardware.fp8_flops or self.hardware.bf16_flops
            eff = self.prefill_attn_flops / self.hardware.bf16_flops
            t += _roof(per_pair * pairs, fp8 * eff, keys * key_bytes, bw) * self.index_layers
        return t

    def _stepped_decode_times(self, num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                              global_tokens: int | None) -> list[float]:
        """``decode_step_times`` of a hybrid model: each step priced whole
        (its attention is not linear in the KV read), so a stretch and
        single steps give the same floats."""
        cpu = self.runtime.cpu_step_s + self.runtime.cpu_per_request_s * num_reqs
        return [combine_step_time(self.gpu_time(BatchShape.decode(num_reqs, first_kv_tokens + j * kv_step),
                                                global_tokens), cpu, self.async_scheduling)
                for j in range(count)]

    def _batch_parts(self, T: int, global_tokens: int, num_sampled: int,
                     num_logits: int | None = None) -> tuple[float, float]:
        """(linear layers and experts, LM head + collectives + fixed latency);
        ``num_logits``: the LM head's rows (default: ``num_sampled``)."""
        t = self._linear_time(T)
        if self.moe_layers:
            t += self.moe_layers * self._routed_expert_time(T, global_tokens)
        rest = self.fixed_gpu_s
        if num_sampled:
            rows = num_sampled if num_logits is None else num_logits
            rest += _roof(2.0 * rows * self.lm_head_params, self.head_flops,
                          2.0 * self.lm_head_params, self.weight_bw)
        if self.tp > 1:
            msg = T * self.hidden * 2.0
            rest += self.num_blocks * (self.ar_latency
                                           + 2.0 * (self.tp - 1) / self.tp * msg / self.ar_bw)
        if self.moe_layers:
            rest += self._all_to_all_time(T)
        return t, self.add_host_gaps(rest, num_sampled)

    def _all_to_all_time(self, T: int) -> float:
        """Expert-parallel dispatch and combine of a T-token step, every MoE
        layer, on the scale-up fabric (0 when vLLM runs none)."""
        if self.ep <= 1 or not self.parallel.uses_all_to_all:
            return 0.0
        sent = T * self.topk * self.hidden * 2.0 * (self.ep - 1) / self.ep
        return self.moe_layers * 2 * (self.comm_latency + sent / self.a2a_bw)

    def _linear_time(self, T: int) -> float:
        """Every linear layer but the routed experts and the LM head, as one
        roof: the quantized layers' FLOPs at their rate plus the 16-bit ones'
        at theirs, against all their bytes."""
        q, h = self.dense_params, self.dense16_params
        if not h:
            return _roof(2.0 * T * q, self.lin_flops, q * self.weight_bytes, self.lin_bw)
        compute = 2.0 * T * (q / self.lin_flops + h / self.head_flops)
        if self.lin_bw == self.weight_bw:
            memory = (q * self.weight_bytes + h * 2.0) / self.weight_bw
        else:
            memory = q * self.weight_bytes / self.lin_bw + h * 2.0 / self.weight_bw
        return compute if compute > memory else memory

    def _routed_expert_time(self, tokens: int, global_tokens: int) -> float:
        E, k, p = self.num_experts, self.topk, self.expert_params
        # Expected distinct experts hit by global_tokens × k uniform picks.
        touched = E * (1.0 - (1.0 - k / E) ** global_tokens)
        shards = self.expert_shards
        if self.ep > 1:
            flops = 2.0 * global_tokens * k * p / shards
            nbytes = touched / shards * p * self.expert_bytes
        else:
            flops = 2.0 * tokens * k * p / shards
            nbytes = touched * p * self.expert_bytes / shards
        return _roof(flops, self.expert_flops, nbytes, self.expert_bw) + self.expert_latency

    def _attention_time(self, s: BatchShape) -> float:
        extra = s.spec_query_keys
        t = self._attention_layer(s.decode_kv_tokens, s.prefill_kv_tokens,
                                  s.prefill_attn_pairs, extra) * self.full_layers
        if self.sliding_layers:
            # Upper bounds of the window-capped sums (Σ min(c, w) + n ...): exact
            # once every context reaches the window, the common case (w = 128).
            w = self.window
            num_prefills = s.num_reqs - s.num_decodes
            t += self._attention_layer(min(s.decode_kv_tokens, w * s.num_decodes),
                                       min(s.prefill_kv_tokens, w * num_prefills + s.prefill_tokens),
                                       min(s.prefill_attn_pairs, w * s.prefill_tokens),
                                       min(extra, w * s.spec_tokens)
                                       ) * self.sliding_layers
        # Learned attention latencies, per call (one per layer and phase run).
        if s.num_decodes:
            t += self.decode_attn_latency
        if s.prefill_attn_pairs:
            t += self.prefill_attn_latency
        return t

    def spec_attention_factor(self, decode_kv: int, extra_keys: int) -> float:
        """How much longer a layer's decode attention takes with the extra
        queries of draft verification (``extra_keys`` query-key pairs over
        one query per KV token): the roofline's ratio, >= 1 (1 while the
        KV read bounds it). The measured backend scales its one-query
        generation kernels by it."""
        base = self._attention_layer(decode_kv, 0, 0)
        return self._attention_layer(decode_kv, 0, 0, extra_keys) / base if base > 0 else 1.0

    def _attention_layer(self, decode_kv: int, prefill_kv: int, pairs: int, extra_keys: int = 0) -> float:
        t = 0.0
        if decode_kv:
            keys = decode_kv + extra_keys if extra_keys else decode_kv
            t += _roof(self.decode_flops_per_key * keys, self.decode_attn_flops,
                       decode_kv * self.kv_bytes_per_layer, self.decode_attn_bw)
        if pairs:
            flops = self.prefill_flops_per_pair * pairs + self.prefill_flops_per_kv * prefill_kv
            t += _roof(flops, self.prefill_attn_flops, prefill_kv * self.kv_bytes_per_layer,
                       self.prefill_attn_bw)
        return t

    def cpu_time(self, shape: BatchShape) -> float:
        return self.runtime.cpu_step_s + self.runtime.cpu_per_request_s * shape.num_reqs

    def linear_time(self, n: int, k: int, tokens: int) -> float:
        """A replicated 16-bit GEMM of an n x k weight over ``tokens`` tokens
        (a drafter's input projection), with its kernel latency."""
        w = float(n * k)
        return _roof(2.0 * tokens * w, self.head_flops, 2.0 * w, self.weight_bw) + KERNEL_LATENCY_S

    def step_time(self, shape: BatchShape, global_tokens: int | None = None) -> float:
        """Wall seconds of the step: with async scheduling the CPU work of
        scheduling the next step overlaps this forward pass (and the
        drafter's passes, with speculative decoding)."""
        drafter = self.drafter
        if (drafter is None and not shape.spec_tokens and shape.prefill_tokens == 0 and not shape.lora_gpu_s
                and not shape.encoder_gpu_s and shape.num_decodes == shape.num_reqs == shape.num_sampled):
            return self.decode_step_time(shape.num_reqs, shape.decode_kv_tokens, global_tokens)
        gpu = self.gpu_time(shape, global_tokens) + shape.lora_gpu_s + shape.encoder_gpu_s
        cpu = self.cpu_time(shape)
        if drafter is not None:
            gpu += drafter.gpu_time(shape, global_tokens)
            cpu += drafter.cpu_time(shape)
        return combine_step_time(gpu, cpu, self.async_scheduling)

    def decode_step_time(self, num_reqs: int, decode_kv_tokens: int,
                         global_tokens: int | None = None) -> float:
        """``step_time`` of ``num_reqs`` one-token decodes reading
        ``decode_kv_tokens`` KV in all, without building a BatchShape. Every
        pure-decode step goes through :meth:`decode_step_times`, so stepping
        and fast-forward give the same float."""
        return self.decode_step_times(num_reqs, decode_kv_tokens, 0, 1, global_tokens)[0]

    def decode_batch_parts(self, num_reqs: int, global_tokens: int | None) -> tuple[float, float, float]:
        """(linear layers and experts, LM head + collectives, CPU) of a
        pure-decode step of ``num_reqs`` requests: the parts that depend on
        the batch size only, memoised (a stretch repeats them every step)."""
        key = (num_reqs, global_tokens)
        parts = self._decode_step_parts.get(key)
        if parts is None:
            T = self.padded_tokens(num_reqs)
            lin, rest = self._batch_parts(T, global_tokens or T, num_reqs, num_reqs)
            cpu = self.runtime.cpu_step_s + self.runtime.cpu_per_request_s * num_reqs
            parts = self._decode_step_parts[key] = (lin, rest, cpu)
        return parts

    def decode_step_times(self, num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                          global_tokens: int | None = None) -> list[float]:
        """Step times of ``count`` consecutive decode steps of ``num_reqs``
        requests, step j reading ``first_kv_tokens + j * kv_step`` KV tokens
        (a decode stretch: every request's context grows by one per step).
        The one formula of a pure-decode step."""
        if self.hybrid is not None:
            return self._stepped_decode_times(num_reqs, first_kv_tokens, kv_step, count, global_tokens)
        lin, rest, cpu = self.decode_batch_parts(num_reqs, global_tokens)
        # Sliding-window layers read at most the window per request: their
        # attention per step, added to the full layers' in the loop.
        sliding = self.sliding_layers
        extra = None
        if sliding:
            window_kv = self.window * num_reqs
            extra = [self._attention_layer(min(first_kv_tokens + j * kv_step, window_kv), 0, 0) * sliding
                     for j in range(count)]
        # The loop itself is compiled (kvsched.perf.decode_steps): a stretch
        # prices every step it may take.
        return roofline_decode_times(lin, rest, cpu, self.decode_flops_per_key, self.decode_attn_flops,
                                     self.kv_bytes_per_layer, self.decode_attn_bw,
                                     self.decode_attn_latency, self.full_layers, num_reqs,
                                     first_kv_tokens, kv_step, count, self.async_scheduling, extra)
