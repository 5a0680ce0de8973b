"""KV-cache capacity per GPU, the way vLLM sizes it at start-up.

vLLM profiles one forward pass of ``max_num_batched_tokens`` tokens and gives
the KV cache what is left of ``gpu_memory_utilization × memory`` after the
weights, that activation peak and non-torch memory (CUDA context, NCCL
buffers). We estimate the same three terms from the architecture:

- weights per device: the linear layers the weight format covers at its
  bytes per weight (scales included), everything else (embedding, LM head,
  routers, norms, layers the checkpoint leaves unquantized) in 16 bits,
  sharded over TP; routed experts over the expert-parallel group when
  expert parallelism is on;
- activation peak: per token the residual stream, the normed input, the fused
  QKV output and the MLP's gate/up output in 16 bits, plus float32 logits for
  ``max_num_seqs`` sampled rows (the sampler's dummy run);
- non-torch memory: a fixed ``NON_TORCH_BYTES`` (an estimate; vLLM measures it);
- with speculative decoding, the drafter's weights (kvsched.perf.drafter);
  its attention layers share the target's block tables, so each KV block
  holds their KV too.

With pipeline parallelism each stage's GPUs hold the weights and the KV of
that stage's layers only (kvsched.perf.pipeline.stage_layers), the first
stage also the embedding, the last the LM head (a copy of a tied
embedding). Every stage plans its own memory as above (activations and
non-torch memory as one GPU's); vLLM takes the fewest blocks any stage's
workers report, so the stage with the least KV room sets ``num_gpu_blocks``.

The KV room is then planned as vLLM plans it
(kvsched.perf.kv_cache_planning): the layers form KV cache groups (one for
a model of one attention kind; a full-attention group and sliding-window
groups of equal layer counts for gpt-oss and Gemma), every block id is one
page in each layer of one group, and ``num_gpu_blocks`` is the room divided
by the largest group's pages. The scheduler charges each group its own
blocks from that one pool (``kv_groups``), so a sliding-window group holds
blocks only for its window.

That is vLLM's sizing from the profiling estimate (``Worker.
determine_available_memory``), every release's where the extensible KV
cache is off. vLLM 0.33 also takes its CUDA-graph memory estimate
(``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default) off the
budget; kvsched's estimate plan counts it within ``NON_TORCH_BYTES``, as
it always has (so 0.33's figures stay the ones validated).

vLLM 0.34's extensible KV cache (``extensible=True``,
kvsched.scheduler_defaults.resolve_cache_defaults says when) commits the
cache after warmup and CUDA-graph capture, sized from the memory measured
free then (``measure_kv_cache_bytes`` in ``v1/worker/extensible_kv_cache.py``):

    kv = min(utilization x memory - resident, memory - resident - margin) - kept_free

``resident`` is everything held after capture (weights, drafter, LoRA
slots, non-torch memory and the captured graphs: the weights plus
``NON_TORCH_BYTES`` as above); ``kept_free`` the warmup peak vLLM keeps
free for the steps to come, which starts from the profiled
``peak_activation_memory`` (the activation peak plus the CUDA-graph
*estimate*, so the graphs count a second time there) and the sizing
steps' own peak (the same full-batch shapes: the activation peak);
``margin`` is ``max(1 GiB, 0.75 x kept_free)`` (3 GiB floor on ROCm).
vLLM takes the smaller of that and the capacity it reserved from the
profiling estimate (the estimate rule at the same utilization), which the
measurement never exceeds: it keeps the same peak and graphs free and
holds at least the same memory. The CUDA-graph
estimate is ``CUDA_GRAPH_ESTIMATE_BYTES``, a constant (an estimate, see
there); ``--gpu-memory-utilization`` below 1.0 caps the budget as vLLM
does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvsched.config import KVCacheGroup, check_gpu_memory_utilization
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.perf.hardware import Hardware
from kvsched.perf.kv_cache_planning import (
    KVCachePlan,
    MambaCache,
    model_spec_kv_layout,
    model_spec_layers,
    plan_kv_cache,
    resolve_disable_hybrid_kv_cache_manager,
)
from kvsched.perf.models import ModelSpec
from kvsched.perf.pipeline import stage_layers
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig, dtype_bytes, weight_split

GIB = 2**30
NON_TORCH_BYTES = 1.0 * GIB
# vLLM's profiled CUDA-graph memory estimate per GPU (profile_cudagraph_memory:
# the PIECEWISE graphs captured into a throwaway pool plus the FULL decode
# graphs extrapolated from two samples, at least 1 MiB each). kvsched does not
# capture graphs; 0.5 GiB is an estimate from vLLM's published start-up logs
# (0.13-0.21 GiB for 1B-class models, 0.36 GiB for a TP2 deployment capturing
# 16 sizes, 1.4 GiB for Llama-4 Maverick; 24-26 MiB per capture size for an
# 8B-class model), not a measurement of the deployment.
CUDA_GRAPH_ESTIMATE_BYTES = 0.5 * GIB
# The extensible KV cache's sizing margin (vLLM 0.34's
# KV_CACHE_MARGIN_FLOOR_BYTES, KV_CACHE_MARGIN_FRACTION): what it keeps free
# beyond the measured peak, for allocator rounding, fragmentation and shapes
# warmup does not combine; ROCm keeps a larger floor.
EXTENSIBLE_MARGIN_FLOOR_BYTES = 1.0 * GIB
EXTENSIBLE_MARGIN_FLOOR_BYTES_ROCM = 3.0 * GIB
EXTENSIBLE_MARGIN_FRACTION = 0.75


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Bytes per device and the resulting KV blocks (vLLM's ``num_gpu_blocks``,
    null block included)."""

    budget_bytes: float
    weight_bytes: float
    activation_bytes: float
    non_torch_bytes: float
    kv_cache_bytes: float
    bytes_per_block: float
    num_gpu_blocks: int
    # Speculative decoding's drafter weights (0 without a drafter model).
    drafter_bytes: float = 0.0
    # Pipeline parallelism: the stages, and the one whose GPUs hold the
    # fewest KV blocks (the figures above are that stage's).
    pipeline_parallel_size: int = 1
    stage: int = 0
    # LoRA's GPU slots (kvsched.perf.lora.LoraCost.slot_bytes; 0 without LoRA).
    lora_bytes: float = 0.0
    # Sized the extensible way (module doc): ``budget_bytes`` is then
    # min(utilization x memory, memory - margin), and the warmup peak kept
    # free is the activations plus ``cuda_graph_bytes`` (vLLM's estimate).
    extensible: bool = False
    cuda_graph_bytes: float = 0.0
    margin_bytes: float = 0.0
    # vLLM's KV cache groups when the model has more than one (or one that
    # is not plain full attention of the block size): the scheduler charges
    # each group its blocks from the one pool (kvsched.perf.kv_cache_planning).
    kv_groups: tuple[KVCacheGroup, ...] = ()
    # A Mamba hybrid's cache sizing (Qwen3-Next): the attention block size
    # vLLM raised the block size to, the Mamba cache mode; None: none.
    mamba: MambaCache | None = None

    def describe(self) -> str:
        drafter = f" - {self.drafter_bytes / GIB:.1f} drafter" if self.drafter_bytes else ""
        drafter += f" - {self.lora_bytes / GIB:.2f} LoRA slots" if self.lora_bytes else ""
        where = (f"PP stage {self.stage + 1} of {self.pipeline_parallel_size}, "
                 if self.pipeline_parallel_size > 1 else "")
        if self.extensible:
            kept = self.activation_bytes + self.cuda_graph_bytes
            return (f"{self.num_gpu_blocks} KV blocks, extensible KV cache sized after warmup: {where}"
                    f"{self.budget_bytes / GIB:.1f} GiB budget (a {self.margin_bytes / GIB:.2f} GiB margin "
                    f"kept) - {self.weight_bytes / GIB:.1f} weights{drafter} - "
                    f"{self.non_torch_bytes / GIB:.1f} other - {kept / GIB:.2f} warmup peak kept free "
                    f"({self.activation_bytes / GIB:.2f} activations + {self.cuda_graph_bytes / GIB:.2f} "
                    f"CUDA graphs) = {self.kv_cache_bytes / GIB:.1f} GiB for KV")
        return (f"{self.num_gpu_blocks} KV blocks: {where}{self.budget_bytes / GIB:.1f} GiB budget - "
                f"{self.weight_bytes / GIB:.1f} weights{drafter} - {self.activation_bytes / GIB:.2f} "
                f"activations - {self.non_torch_bytes / GIB:.1f} other = "
                f"{self.kv_cache_bytes / GIB:.1f} GiB for KV")


def kv_cache_budget(memory_bytes: float, utilization: float, in_use: float, activation_peak: float) -> float:
    """vLLM's KV-cache rule, the one owner of it (the simulator's plan and
    the engine's measured start-up alike): ``utilization`` of the whole
    device, less the memory in use (weights, non-torch memory, other
    processes) and the activation peak of the profile run."""
    return utilization * memory_bytes - in_use - activation_peak


@dataclass(frozen=True, slots=True)
class KvBudget:
    """What the KV cache (and a hybrid model's sliding-window reserve) may
    take on one device, with the terms it came from."""

    budget_bytes: float
    free_bytes: float
    cuda_graph_bytes: float = 0.0
    margin_bytes: float = 0.0


def device_kv_budget(hardware: Hardware, utilization: float, resident: float, activations: float,
                     extensible: bool) -> KvBudget:
    """The KV room on one device with ``resident`` bytes held (weights,
    drafter, LoRA slots, non-torch memory) and the profile run's
    ``activations`` peak: vLLM's estimate rule (:func:`kv_cache_budget`), or
    with ``extensible`` 0.34's measured rule (module doc). The one owner of
    which rule a plan follows."""
    if not extensible:
        return KvBudget(utilization * hardware.memory_bytes,
                        kv_cache_budget(hardware.memory_bytes, utilization, resident, activations))
    kept_free = activations + CUDA_GRAPH_ESTIMATE_BYTES
    rocm = hardware.platform == "rocm"
    floor = EXTENSIBLE_MARGIN_FLOOR_BYTES_ROCM if rocm else EXTENSIBLE_MARGIN_FLOOR_BYTES
    margin = max(floor, EXTENSIBLE_MARGIN_FRACTION * kept_free)
    budget = min(utilization * hardware.memory_bytes, hardware.memory_bytes - margin)
    return KvBudget(budget, budget - resident - kept_free, CUDA_GRAPH_ESTIMATE_BYTES, margin)


def weight_bytes_per_device(model: ModelSpec, parallel: ParallelConfig, dtype: str,
                            quantized_layers: str = "all") -> float:
    """Weight bytes on one device: the linear layers ``quantized_layers``
    names at ``dtype`` (scales included), everything else (the other linear
    layers, routers, norms, embedding, LM head) in 16 bits; sharded over TP,
    routed experts over the expert-parallel group when it is on."""
    return weight_split(model, parallel, quantized_layers).bytes_per_device(dtype_bytes("dtype", dtype))


def activation_peak_bytes(model: ModelSpec, parallel: ParallelConfig,
                          max_num_batched_tokens: int, max_num_seqs: int) -> float:
    tp = parallel.tensor_parallel_size
    m = model
    qkv = (m.num_heads + 2 * m.num_kv_heads) * m.head_dim / tp
    mlp = 2 * max(m.intermediate_size, m.moe_intermediate_size * m.experts_per_token) / tp
    per_token = (2 * m.hidden_size + max(qkv, mlp)) * 2
    logits = max_num_seqs * m.vocab_size * 4
    return max_num_batched_tokens * per_token + logits


def kv_cache_plan(model: ModelSpec, num_layers: int, num_sliding_layers: int, block_size: int,
                  tensor_parallel_size: int, kv_bytes: int, drafter_kv_layers: int,
                  free: float, *, enable_prefix_caching: bool = True,
                  max_model_len: int | None = None, fp8_ds_mla: bool = True) -> KVCachePlan:
    """vLLM's KV cache groups and block count for ``num_layers`` layers of
    ``model`` (the whole model, or one PP stage), ``num_sliding_layers`` of
    them sliding, with ``free`` bytes left for KV: one pool of blocks, each
    block id one page in every layer of one group
    (kvsched.perf.kv_cache_planning). The one owner of that rule here.

    ``--disable-hybrid-kv-cache-manager`` takes vLLM's default (the
    simulator has no flag or environment to change it): off, except for
    chunked local attention (Llama 4), where vLLM turns the hybrid manager
    off unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE is set;
    its chunked layers then allocate as full attention, one group.

    A Gated DeltaNet or Mamba-2 hybrid (Qwen3-Next, Qwen3.5, Nemotron-H) is laid out whole with its Mamba
    state pages (``enable_prefix_caching`` picks the Mamba cache mode,
    ``max_model_len`` the "none" mode's block; default the model's context);
    the plan's ``mamba`` then says how vLLM sized the blocks.

    ``fp8_ds_mla``: DeepSeek Sparse Attention's fp8 latent is FlashMLA's
    fp8_ds_mla row (vLLM's sparse backend for an fp8 cache off Blackwell;
    kvsched.perf.kv_cache_planning.sparse_mla_bytes_per_token)."""
    h = model.hybrid
    mamba = None
    if h is not None and (h.num_linear_layers or h.num_mamba_layers):
        layout = model_spec_kv_layout(
            model, block_size=block_size, tensor_parallel_size=tensor_parallel_size, kv_cache_bytes=kv_bytes,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len if max_model_len is not None else model.max_position_embeddings,
            extra_full_layers=drafter_kv_layers)
        layers, mamba = layout.layers, layout.mamba
    else:
        layers = model_spec_layers(model, block_size=block_size, tensor_parallel_size=tensor_parallel_size,
                                   kv_cache_bytes=kv_bytes, num_layers=num_layers,
                                   num_sliding_layers=num_sliding_layers, extra_full_layers=drafter_kv_layers,
                                   fp8_ds_mla=fp8_ds_mla)
    chunked = model.hybrid is not None and model.hybrid.num_chunked_layers > 0
    disable = resolve_disable_hybrid_kv_cache_manager(None, attention_chunk_size=chunked,
                                                      target_hidden_state_drafter=drafter_kv_layers > 0)
    plan = plan_kv_cache(layers, int(max(free, 0.0)), disable_hybrid_kv_cache_manager=disable)
    return dataclasses.replace(plan, mamba=mamba) if mamba is not None else plan


def scheduler_kv_groups(plan: KVCachePlan, block_size: int) -> tuple[KVCacheGroup, ...]:
    """The groups the scheduler is told about: none for vLLM's single
    full-attention group of ``block_size`` tokens (CacheConfig's default)."""
    groups = plan.kv_groups()
    if len(groups) == 1 and groups[0].kind == "full_attention" and groups[0].block_size == block_size:
        return ()
    return groups


def plan_memory(model: ModelSpec, hardware: Hardware, parallel: ParallelConfig,
                runtime: RuntimeConfig, block_size: int, gpu_memory_utilization: float,
                max_num_batched_tokens: int, max_num_seqs: int, *, drafter_bytes: float = 0.0,
                drafter_kv_layers: int = 0, lora_bytes: float = 0.0, extensible: bool = False,
                enable_prefix_caching: bool = True, max_model_len: int | None = None) -> MemoryPlan:
    """``drafter_bytes``: a speculative drafter's weights per device;
    ``drafter_kv_layers``: its attention layers, whose KV every block holds
    beside the target's full-attention layers; ``lora_bytes``: LoRA's GPU
    slots per device (allocated with the model, before vLLM sizes the KV
    cache); ``extensible``: sized as vLLM 0.34's extensible KV cache (module
    doc), else from the profiling estimate. ``enable_prefix_caching`` and
    ``max_model_len`` size a Gated DeltaNet or Mamba-2 hybrid's Mamba cache
    (:func:`kv_cache_plan`)."""
    check_gpu_memory_utilization(gpu_memory_utilization)
    if not is_int(block_size) or block_size < 1:
        raise UserInputError(f"block_size={block_size!r}: must be a positive integer")
    if parallel.pipeline_parallel_size > 1:
        return _plan_pipeline(model, hardware, parallel, runtime, block_size, gpu_memory_utilization,
                              max_num_batched_tokens, max_num_seqs, extensible)
    kvb = runtime.kv_bytes
    tp = parallel.tensor_parallel_size
    weights = weight_bytes_per_device(model, parallel, runtime.dtype, runtime.quantized_layers)
    activations = activation_peak_bytes(model, parallel, max_num_batched_tokens, max_num_seqs)
    room = device_kv_budget(hardware, gpu_memory_utilization,
                            weights + NON_TORCH_BYTES + drafter_bytes + lora_bytes, activations, extensible)
    free = room.free_bytes
    kv = kv_cache_plan(model, model.num_layers, model.num_sliding_layers, block_size, tp, kvb,
                       drafter_kv_layers, free, enable_prefix_caching=enable_prefix_caching,
                       max_model_len=max_model_len, fp8_ds_mla=not hardware.sm100_family)
    plan = MemoryPlan(room.budget_bytes, weights, activations, NON_TORCH_BYTES, free,
                      kv.bytes_per_block, kv.num_blocks, drafter_bytes, lora_bytes=lora_bytes,
                      extensible=extensible, cuda_graph_bytes=room.cuda_graph_bytes,
                      margin_bytes=room.margin_bytes, kv_groups=scheduler_kv_groups(kv, block_size),
                      mamba=kv.mamba)
    blocks = plan.num_gpu_blocks
    if blocks < 2:
        raise UserInputError(
            f"{model.name} does not fit on {hardware.name} with tensor_parallel_size={tp}: "
            f"{plan.describe()}. Raise --tensor-parallel-size or --gpu-memory-utilization, "
            "use --quantization fp8, or lower --max-num-batched-tokens")
    return plan


def _plan_pipeline(model: ModelSpec, hardware: Hardware, parallel: ParallelConfig,
                   runtime: RuntimeConfig, block_size: int, gpu_memory_utilization: float,
                   max_num_batched_tokens: int, max_num_seqs: int, extensible: bool) -> MemoryPlan:
    """plan_memory with PP stages (module doc): each stage's plan, and the
    one with the fewest blocks. A hybrid model's sliding-window layers are
    taken as spread evenly over the stages, and each stage's block is the
    largest group of its own layers, regrouped. vLLM instead projects the
    whole model's groups onto each stage's layers, which needs the layer
    order: the two agree for gpt-oss at PP 2-4 and Gemma 3 27B at PP 2, not
    always beyond (an approximation for hybrid models under PP)."""
    kvb = runtime.kv_bytes
    tp = parallel.tensor_parallel_size
    pp = parallel.pipeline_parallel_size
    m = model
    if m.hybrid is not None and (m.hybrid.num_linear_layers or m.hybrid.num_mamba_layers):
        raise UserInputError(f"pipeline_parallel_size={pp} (--pipeline-parallel-size) with {m.name}: vLLM's "
                             "Mamba cache groups of a linear-attention or Mamba-2 hybrid are not planned per "
                             "pipeline stage by kvsched; drop --pipeline-parallel-size")
    whole = weight_bytes_per_device(m, parallel, runtime.dtype, runtime.quantized_layers)
    # 16-bit embedding and LM head, per TP rank; the layers share the rest.
    embedding = m.embedding_params() * 2.0 / tp
    lm_head = m.lm_head_matmul_params() * 2.0 / tp
    per_layer_weights = (whole - embedding - m.lm_head_params() * 2.0 / tp) / m.num_layers
    activations = activation_peak_bytes(m, parallel, max_num_batched_tokens, max_num_seqs)
    # vLLM groups the whole model's layers and hands every stage the same
    # groups (each holding that stage's layers); the scheduler sees those.
    fp8_ds_mla = not hardware.sm100_family
    groups = scheduler_kv_groups(kv_cache_plan(m, m.num_layers, m.num_sliding_layers, block_size, tp, kvb, 0,
                                               0.0, fp8_ds_mla=fp8_ds_mla), block_size)
    plans: list[MemoryPlan] = []
    for i, n in enumerate(stage_layers(m.num_layers, pp)):
        weights = per_layer_weights * n + (embedding if i == 0 else 0.0) + (lm_head if i == pp - 1 else 0.0)
        sliding_layers = -(-m.num_sliding_layers * n // m.num_layers)
        room = device_kv_budget(hardware, gpu_memory_utilization, weights + NON_TORCH_BYTES, activations,
                                extensible)
        free = room.free_bytes
        kv = kv_cache_plan(m, n, sliding_layers, block_size, tp, kvb, 0, free, fp8_ds_mla=fp8_ds_mla)
        plans.append(MemoryPlan(room.budget_bytes, weights, activations, NON_TORCH_BYTES, free,
                                kv.bytes_per_block, kv.num_blocks, 0.0, pp, i, extensible=extensible,
                                cuda_graph_bytes=room.cuda_graph_bytes, margin_bytes=room.margin_bytes,
                                kv_groups=groups))
    plan = min(plans, key=lambda p: p.num_gpu_blocks)
    if plan.num_gpu_blocks < 2:
        raise UserInputError(
            f"{m.name} does not fit on {hardware.name} with tensor_parallel_size={tp} and "
            f"pipeline_parallel_size={pp}: {plan.describe()}. Raise --tensor-parallel-size, "
            "--pipeline-parallel-size or --gpu-memory-utilization, use --quantization fp8, or lower "
            "--max-num-batched-tokens")
    return plan
