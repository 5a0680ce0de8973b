"""KV cache planning as vLLM plans it: per-layer cache specs, KV cache
groups, page sizes and the block count of the one shared block pool.

Ported from vLLM 0.33 / 0.34 (``v1/core/kv_cache_planning.py``:
``get_kv_cache_groups``, ``unify_kv_cache_spec_page_size``,
``_get_kv_cache_groups_uniform_page_size``, ``get_kv_cache_config_from_groups``;
``platforms/interface.py``: ``_align_hybrid_block_size``;
``model_executor/models/config.py``: ``MambaModelConfig``); the grouping
code is the same in both releases, only their default block size differs
(``kvsched.scheduler_defaults.resolve_cache_defaults`` owns it).

The steps, in vLLM's order:

1. every layer declares a spec (:class:`LayerSpec`): its kind, block size
   and the bytes one block of it takes (a page);
2. ``--disable-hybrid-kv-cache-manager`` promotes sliding-window and
   chunked-local layers to full attention (a model with Mamba layers then
   fails, as in vLLM);
3. one spec for every layer, or one *type* (all full attention, MLA with
   its indexer included) -> one group with every layer;
4. otherwise the pages are made equal (a smaller attention page grows its
   block size by the ratio, a Mamba page is padded), the layers of equal
   spec form buckets, and each bucket is split round-robin into groups of
   ``group_size`` layers (the smallest bucket, or the largest when it is
   under 1.5 times the smallest);
5. a block id is one page in each layer of one group: ``bytes_per_block``
   is the largest group's sum of pages and ``num_blocks = available //
   bytes_per_block`` (or ``--num-gpu-blocks-override``).

Assumed, as on NVIDIA Hopper with the default attention backends
(FlashAttention, FlashMLA, Triton/FlashInfer Mamba kernels): the layer-outer
KV cache layout (``LBNHC``, vLLM's default; block-outer packing is for
backends that ask for it, DeepSeek-V4's indexer), kernel blocks in
multiples of 16 tokens, no per-layer block-stride padding. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvsched.config import KVCacheGroup
from kvsched.errors import UserInputError
from kvsched.perf.hardware import Hardware
from kvsched.perf.model_parsers import model_spec_from_config
from kvsched.perf.models import ModelSpec

# vLLM's KVCacheSpec classes, as kinds. "mla_attention" (MLAAttentionSpec:
# DeepSeek's latent and V3.2's indexer key cache) is full attention to the
# scheduler (FullAttentionManager) but is never padded to another page.
FULL = "full_attention"
MLA = "mla_attention"
SLIDING = "sliding_window"
CHUNKED = "chunked_local_attention"
MAMBA = "mamba"
LAYER_KINDS = (FULL, MLA, SLIDING, CHUNKED, MAMBA)
# The scheduler's kind (kvsched.config.KV_GROUP_KINDS) of each layer kind.
_GROUP_KIND = {FULL: "full_attention", MLA: "full_attention", SLIDING: "sliding_window",
               CHUNKED: "chunked_local_attention", MAMBA: "mamba"}
# Smallest kernel block of FlashAttention / FlashMLA / Triton attention on CUDA
# (their supported kernel block sizes are multiples of 16): the granularity
# vLLM rounds a hybrid Mamba model's attention block size to.
KERNEL_BLOCK_ALIGNMENT = 16
# FlashInfer's GDN prefill (Hopper's default for gated delta net layers)
# exports mid-prefill states every 64 tokens; in Mamba align mode the
# attention block size is made a multiple of it (gdn_attn.py's
# FLASHINFER_GDN_CHECKPOINT_ALIGNMENT).
GDN_CHECKPOINT_ALIGNMENT = 64


@dataclass(slots=True, frozen=True)
class LayerSpec:
    """One layer's KV cache spec (vLLM's ``KVCacheSpec`` of that layer).

    Attention kinds store ``bytes_per_token`` per token (K and V of the
    rank's KV heads, or MLA's one latent row); a Mamba layer stores one
    state of ``state_bytes`` per block, whatever its block size.
    ``page_size_padded`` is a page grown to a shared size (vLLM pads Mamba
    pages and attention pages that do not divide the largest). A Mamba
    layer's ``num_prefill_checkpoint_blocks`` / ``prefill_checkpoint_alignment``
    are its MambaSpec's (kvsched.config.KVCacheGroup)."""

    kind: str
    block_size: int
    bytes_per_token: int = 0
    state_bytes: int = 0
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    page_size_padded: int | None = None
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"kind={self.kind!r}: one of {', '.join(LAYER_KINDS)}")
        mamba = self.kind == MAMBA
        if mamba != (self.state_bytes > 0) or mamba == (self.bytes_per_token > 0):
            raise ValueError(f"{self.kind} layer: a Mamba layer has state_bytes, an attention layer "
                             "bytes_per_token")

    @property
    def unpadded_page_bytes(self) -> int:
        return self.state_bytes if self.kind == MAMBA else self.bytes_per_token * self.block_size

    @property
    def page_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.unpadded_page_bytes


@dataclass(slots=True, frozen=True)
class PlannedGroup:
    """One KV cache group: ``num_layers`` layers of one kind sharing a block
    table, and the bytes one block of the group takes over its layers (the
    layers' pages: equal, except in a one-group model of mixed pages such
    as DeepSeek-V3.2's latent and indexer layers)."""

    kind: str
    block_size: int
    num_layers: int
    bytes_per_block: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    num_prefill_checkpoint_blocks: int = 0
    prefill_checkpoint_alignment: int | None = None

    def kv_group(self) -> KVCacheGroup:
        """The scheduler's description of this group (kvsched.config)."""
        return KVCacheGroup(_GROUP_KIND[self.kind], self.block_size, self.num_layers,
                            self.sliding_window, self.attention_chunk_size,
                            self.num_prefill_checkpoint_blocks, self.prefill_checkpoint_alignment)


@dataclass(slots=True, frozen=True)
class KVCachePlan:
    """vLLM's KVCacheConfig in numbers: the groups, the bytes one block id
    takes, and ``num_blocks`` (the pool, vLLM's null block included)."""

    groups: tuple[PlannedGroup, ...]
    bytes_per_block: int
    num_blocks: int
    # A Mamba hybrid's cache sizing (the attention block size vLLM settled
    # on, the Mamba cache mode); None: no Mamba layers.
    mamba: MambaCache | None = None

    def kv_groups(self) -> tuple[KVCacheGroup, ...]:
        return tuple(g.kv_group() for g in self.groups)


def _promote_local(layers: Sequence[LayerSpec]) -> list[LayerSpec]:
    """``--disable-hybrid-kv-cache-manager``: sliding-window and chunked-local
    layers allocate like full attention (vLLM's
    ``_promote_local_kv_cache_specs``; their compute still slides). A model
    that still mixes kinds afterwards (Mamba beside attention) is refused, as
    vLLM refuses it."""
    kinds = {spec.kind for spec in layers}
    if _is_uniform_type(layers) or len(set(layers)) <= 1:
        return list(layers)
    full_sizes = {spec.block_size for spec in layers if spec.kind in (FULL, MLA)}
    promoted = list(layers)
    if kinds & {FULL, MLA} and kinds & {SLIDING, CHUNKED}:
        full_block = next(iter(full_sizes)) if len(full_sizes) == 1 else None
        promoted = [replace(spec, kind=FULL, sliding_window=None, attention_chunk_size=None,
                            block_size=full_block or spec.block_size)
                    if spec.kind in (SLIDING, CHUNKED) else spec for spec in layers]
    if not (_is_uniform_type(promoted) or len(set(promoted)) <= 1):
        raise UserInputError(
            "disable_hybrid_kv_cache_manager=True (--disable-hybrid-kv-cache-manager): this model's "
            f"layers ({', '.join(sorted(kinds))}) cannot share one full-attention KV cache group "
            "(vLLM fails at start-up: Mamba / linear-attention state needs the hybrid KV cache "
            "manager); drop --disable-hybrid-kv-cache-manager")
    return promoted


def _is_uniform_type(layers: Sequence[LayerSpec]) -> bool:
    """vLLM's ``UniformTypeKVCacheSpecs.is_uniform_type``: one block size and
    layers that need the same token slots (all full attention, MLA
    included; all sliding with one window; all chunked with one chunk; all
    Mamba with one page)."""
    first = layers[0]
    if len({spec.block_size for spec in layers}) > 1:
        return False
    if first.kind in (FULL, MLA):
        return all(spec.kind in (FULL, MLA) for spec in layers)
    if first.kind == SLIDING:
        return all(spec.kind == SLIDING and spec.sliding_window == first.sliding_window for spec in layers)
    if first.kind == CHUNKED:
        return all(spec.kind == CHUNKED and spec.attention_chunk_size == first.attention_chunk_size
                   for spec in layers)
    return all(spec.kind == MAMBA and spec.page_bytes == first.page_bytes for spec in layers)


def _unify_page_size(layers: Sequence[LayerSpec]) -> list[LayerSpec]:
    """vLLM's ``unify_kv_cache_spec_page_size``: every page made the largest
    one P. A Mamba page is padded to P; an attention page p dividing P gets
    ``P // p`` times the block size; a non-MLA attention page that does not
    divide P is padded; an MLA page that does not divide P is refused."""
    top = max(spec.page_bytes for spec in layers)
    out: list[LayerSpec] = []
    for spec in layers:
        page = spec.page_bytes
        if page == top:
            out.append(spec)
        elif spec.kind == MAMBA:
            out.append(replace(spec, page_size_padded=top))
        elif top % page == 0:
            out.append(replace(spec, block_size=spec.block_size * (top // page)))
        elif spec.kind != MLA:
            out.append(replace(spec, page_size_padded=top))
        else:
            raise UserInputError(
                f"an MLA layer's KV page ({page} bytes) does not divide the largest page ({top} "
                "bytes) and MLA pages cannot be padded: vLLM cannot place this model's KV cache "
                "groups in one block pool; use another --block-size or --kv-cache-dtype")
    return out


def _group(spec: LayerSpec, count: int) -> PlannedGroup:
    return PlannedGroup(spec.kind, spec.block_size, count, count * spec.page_bytes,
                        spec.sliding_window, spec.attention_chunk_size,
                        spec.num_prefill_checkpoint_blocks, spec.prefill_checkpoint_alignment)


def plan_kv_cache_groups(layers: Sequence[LayerSpec], *,
                         disable_hybrid_kv_cache_manager: bool = False) -> tuple[PlannedGroup, ...]:
    """vLLM's ``get_kv_cache_groups`` for ``layers`` in model order (module
    doc, steps 2-4). An attention-free model has no group."""
    if not layers:
        return ()
    specs = _promote_local(layers) if disable_hybrid_kv_cache_manager else list(layers)
    # Promoted layers drop their window here, so one spec is plain equality
    # (vLLM merges full-attention specs that differ only in their window).
    if len(set(specs)) == 1:
        return (_group(specs[0], len(specs)),)
    if _is_uniform_type(specs):
        # One group of mixed pages (DeepSeek-V3.2's latent and indexer
        # layers): a block id takes every layer's page.
        first = specs[0]
        kinds = {s.kind for s in specs}
        kind = first.kind if len(kinds) == 1 else (MLA if MLA in kinds else FULL)
        return (PlannedGroup(kind, first.block_size, len(specs), sum(s.page_bytes for s in specs),
                             first.sliding_window, first.attention_chunk_size),)
    specs = _unify_page_size(specs)
    buckets: dict[LayerSpec, int] = {}
    for spec in specs:
        buckets[spec] = buckets.get(spec, 0) + 1
    smallest, largest = min(buckets.values()), max(buckets.values())
    # vLLM's rule: the "1" of an n:1 layer pattern, unless the buckets are
    # nearly even (a drafter's extra layer), when padding the smaller wastes less.
    group_size = largest if largest < smallest * 1.5 else smallest
    groups: list[PlannedGroup] = []
    for spec, count in buckets.items():
        num_groups = -(-count // group_size)
        # layers[i::num_groups]: group i takes every num_groups-th layer.
        for i in range(num_groups):
            groups.append(_group(spec, len(range(i, count, num_groups))))
    return tuple(groups)


def resolve_disable_hybrid_kv_cache_manager(requested: bool | None, *, attention_chunk_size: bool,
                                            target_hidden_state_drafter: bool = False,
                                            allow_chunked_local_with_hybrid: bool = False,
                                            connector_supports_hma: bool = True) -> bool:
    """vLLM's resolution of ``--disable-hybrid-kv-cache-manager``
    (``VllmConfig.__post_init__``, both releases) on a platform with the
    hybrid manager (CUDA, ROCm, XPU, CPU all have it). It must be off
    (``need``) for a model with ``attention_chunk_size`` (Llama 4) under an
    EAGLE-style drafter reading the target's hidden states, or unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE is set
    (``allow_chunked_local_with_hybrid``); when not given, also for a KV
    connector without hybrid support. Given as False (enable) where it must
    be off is refused, as vLLM refuses it; given as True it is kept."""
    need = attention_chunk_size and (target_hidden_state_drafter or not allow_chunked_local_with_hybrid)
    if requested is None:
        return need or not connector_supports_hma
    if requested is False and need:
        raise UserInputError(
            "disable_hybrid_kv_cache_manager=False (--no-disable-hybrid-kv-cache-manager): vLLM turns the "
            "hybrid KV cache manager off for chunked local attention (attention_chunk_size) "
            + ("with an EAGLE-style drafter" if target_hidden_state_drafter else
               "unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1")
            + "; leave the flag unset")
    return requested


def bytes_per_block(groups: Sequence[PlannedGroup]) -> int:
    """The bytes one block id takes in the shared pool: the largest group's
    pages (groups alias the same tensors, a block id belongs to one group)."""
    return max(g.bytes_per_block for g in groups)


def plan_kv_cache(layers: Sequence[LayerSpec], available_bytes: int, *,
                  disable_hybrid_kv_cache_manager: bool = False,
                  num_gpu_blocks_override: int | None = None) -> KVCachePlan:
    """vLLM's KV cache config for ``layers`` with ``available_bytes`` of KV
    memory on the device (module doc): the groups and ``num_blocks``."""
    groups = plan_kv_cache_groups(layers, disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager)
    if not groups:
        # vLLM's BlockPool still holds its null block.
        return KVCachePlan((), 0, 1)
    per_block = bytes_per_block(groups)
    blocks = max(int(available_bytes), 0) // per_block
    if num_gpu_blocks_override is not None:
        blocks = num_gpu_blocks_override
    return KVCachePlan(groups, per_block, blocks)


def blocks_per_request(groups: Sequence[KVCacheGroup], *, max_model_len: int,
                       max_in_flight_tokens: int, mamba_state_blocks: int = 0) -> int:
    """Blocks of the shared pool one request of ``max_model_len`` tokens may
    hold at once, summed over the groups: vLLM's start-up check
    (``_max_memory_usage_bytes_from_groups``, each group's
    ``max_memory_usage_bytes``) refuses a pool smaller than that plus the
    null block. Full attention: every token; sliding window: the window, the
    in-flight tokens (``max_in_flight_tokens``: every concurrent batch's
    ``max_num_batched_tokens``, freed only once processed) and one block for
    a window that starts mid-block; chunked local: a chunk and the in-flight
    tokens; Mamba: ``mamba_state_blocks`` states
    (:attr:`MambaCache.state_blocks_per_request`)."""
    total = 0
    for g in groups:
        if g.kind == FULL:
            tokens, extra = max_model_len, 0
        elif g.kind == SLIDING:
            assert g.sliding_window is not None
            tokens, extra = min(g.sliding_window - 1 + max_in_flight_tokens, max_model_len), 1
        elif g.kind == CHUNKED:
            assert g.attention_chunk_size is not None
            tokens, extra = min(g.attention_chunk_size + max_in_flight_tokens, max_model_len), 0
        else:
            if mamba_state_blocks < 1:
                raise ValueError("a Mamba group needs mamba_state_blocks "
                                 "(MambaCache.state_blocks_per_request)")
            total += mamba_state_blocks
            continue
        total += -(-tokens // g.block_size) + extra
    return total


# -- Mamba hybrids: the attention block size and the Mamba cache mode ---------------


@dataclass(slots=True, frozen=True)
class MambaCache:
    """How vLLM sizes a hybrid attention/Mamba model's cache: the attention
    block size it settles on, the Mamba cache mode and block size, and the
    page the Mamba state is padded to (None: not padded)."""

    block_size: int
    mamba_cache_mode: str
    mamba_block_size: int
    mamba_page_size_padded: int | None
    # States one request holds at once (MambaSpec.max_memory_usage_bytes):
    # align mode the running and the previous block's, plus a prefill
    # checkpoint block when the layers export one; "none" mode one.
    state_blocks_per_request: int = 1


def resolve_mamba_cache(*, block_size: int, enable_prefix_caching: bool, max_model_len: int,
                        attention_bytes_per_token: int, mamba_state_bytes: int, use_mla: bool = False,
                        checkpoint_alignment: int | None = None,
                        checkpoint_block: bool = False) -> MambaCache:
    """vLLM's ``MambaModelConfig.verify_and_update_config`` then
    ``Platform._align_hybrid_block_size``:

    - prefix caching on: Mamba cache mode "align" (one state per block),
      off: "none" (one state per request, the Mamba block spans
      ``max_model_len``);
    - the attention block size is raised to the smallest multiple of the
      kernel alignment (the larger of 16 and ``block_size``; 128 with MLA;
      in align mode also a multiple of the Mamba layers' prefill
      ``checkpoint_alignment`` when every layer has one) whose attention
      page holds a Mamba state;
    - the Mamba page is padded to that attention page.

    ``checkpoint_block``: the Mamba layers keep a prefill checkpoint block
    in align mode (MambaMixer2 always; the GDN layer when it exports
    checkpoints, i.e. with a ``checkpoint_alignment``).
    """
    mode = "align" if enable_prefix_caching else "none"
    align = max(KERNEL_BLOCK_ALIGNMENT, block_size)
    if use_mla:
        align = max(align, 128)
    if mode == "align" and checkpoint_alignment:
        align = math.lcm(align, checkpoint_alignment)
    needed = align * -(-mamba_state_bytes // (align * attention_bytes_per_token))
    needed = KERNEL_BLOCK_ALIGNMENT * -(-needed // KERNEL_BLOCK_ALIGNMENT)
    block = max(block_size, needed)
    page = block * attention_bytes_per_token
    states = 2 + int(checkpoint_block) if mode == "align" else 1
    return MambaCache(block, mode, block if mode == "align" else max_model_len,
                      None if page == mamba_state_bytes else page, states)


# -- per-layer specs ------------------------------------------------------------------

# The model dtype kvsched's hybrid checkpoints run in (all are 16-bit): the
# conv state's dtype (vLLM's mamba_cache_dtype "auto").
MODEL_DTYPE_BYTES = 2
# DeepSeek-V3.2's lightning indexer caches one FP8 key of index_head_dim
# values per token with one float32 scale per 128 values (vLLM's Indexer:
# quant_block_size 128, a uint8 cache of head_dim + head_dim // 128 * 4 bytes).
INDEXER_QUANT_BLOCK = 128
# vLLM's fp8_ds_mla row, the fp8 latent of FlashMLA's sparse kernels
# (MLAAttention.get_kv_cache_spec's state_content_bytes): per token the
# kv_lora_rank values in fp8, a float32 scale per 128 of them, and the RoPE
# part left 16-bit: 512 + 4 * 4 + 64 * 2 = 656 bytes (DeepSeek-V3.2, GLM-5).
FP8_DS_MLA_QUANT_BLOCK = 128
# The indexer's kernels on CUDA read 64-token blocks, no other size
# (DeepseekV32IndexerBackend.get_supported_kernel_block_sizes, 0.33 and 0.34).
SPARSE_INDEXER_KERNEL_BLOCK = 64


@dataclass(slots=True, frozen=True)
class ModelKVLayout:
    """A model's per-layer KV specs for one deployment, in model order, the
    attention block size, and for a Mamba hybrid how vLLM sized its cache."""

    layers: tuple[LayerSpec, ...]
    block_size: int
    mamba: MambaCache | None = None


def kv_heads_per_rank(kv_heads: int, tensor_parallel_size: int) -> int:
    """vLLM splits KV heads over TP ranks and replicates them when fewer
    (ModelConfig.get_num_kv_heads)."""
    return max(1, kv_heads // tensor_parallel_size)


def model_kernel_block(model: ModelSpec, platform: str) -> int | None:
    """The kernel block a model's own attention backends need on
    ``platform`` beyond the platform's dense backend's: DeepSeek Sparse
    Attention's indexer on CUDA (:data:`SPARSE_INDEXER_KERNEL_BLOCK`; the
    sparse MLA backends beside it take multiples of 32 or 64). None: none.
    Without --block-size vLLM picks the smallest block every backend takes
    (``Platform.update_block_size_for_backend``): 64 in both releases."""
    if platform == "cuda" and model.num_index_layers:
        return SPARSE_INDEXER_KERNEL_BLOCK
    return None


# The CUDA compute capability majors vLLM has a sparse MLA backend for
# (FlashMLA's and FlashAttention's on Hopper, FlashMLA's and FlashInfer's on
# SM100, FlashInfer's SM120 kernel; none before Hopper), in both releases.
SPARSE_MLA_CUDA_MAJORS = (9, 10, 12)


def check_sparse_mla_device(model: ModelSpec, hardware: Hardware) -> None:
    """Refuse DeepSeek Sparse Attention on a CUDA device vLLM has no sparse
    MLA backend for (A100, L40S, L4: vLLM fails to start), naming the fix."""
    major = hardware.cuda_capability_major
    if model.num_index_layers and major is not None and major not in SPARSE_MLA_CUDA_MAJORS:
        raise UserInputError(
            f"{model.name} on {hardware.name} (CUDA compute capability {major}.x): DeepSeek Sparse "
            "Attention needs a sparse MLA backend and vLLM has one only on compute capability 9.x "
            "(Hopper), 10.x and 12.x (Blackwell); use an H100, H200, B200 or newer")


def attention_bytes_per_token(model: ModelSpec, kv_cache_bytes: float, tensor_parallel_size: int,
                              hardware: Hardware) -> float:
    """KV bytes one token adds to one attention layer on one rank as vLLM
    lays the cache out on ``hardware``: the model's K and V (or MLA latent),
    or for DeepSeek Sparse Attention the sparse backend's latent row
    (:func:`sparse_mla_bytes_per_token`: FlashMLA's fp8_ds_mla off SM100).
    What the step time reads and a P/D transfer moves per layer and token."""
    if model.num_index_layers:
        return float(sparse_mla_bytes_per_token(model, int(kv_cache_bytes),
                                                fp8_ds_mla=not hardware.sm100_family))
    return model.kv_bytes_per_layer_per_rank(kv_cache_bytes, tensor_parallel_size)


def sparse_mla_bytes_per_token(model: ModelSpec, kv_cache_bytes: int, fp8_ds_mla: bool) -> int:
    """One DeepSeek Sparse Attention layer's latent bytes per token: the
    16-bit latent with ``kv_cache_bytes`` 2; with an fp8 cache (1) vLLM's
    fp8_ds_mla row when the sparse backend is FlashMLA's (``fp8_ds_mla``:
    vLLM's pick for an fp8 cache on Hopper, where FlashAttention's sparse
    MLA takes no fp8), else one byte per value (FlashInfer's sparse MLA,
    its first pick on Blackwell, keeps the plain fp8 latent)."""
    if kv_cache_bytes not in (1, 2):
        raise UserInputError(f"{model.name}: kv_cache_dtype of {kv_cache_bytes} byte(s) (--kv-cache-dtype) "
                             "with DeepSeek Sparse Attention: vLLM's sparse MLA takes a 16-bit or an fp8 "
                             "cache; use --kv-cache-dtype auto or fp8")
    if kv_cache_bytes == 1 and fp8_ds_mla:
        rank, rope = model.kv_lora_rank, model.qk_rope_head_dim
        return rank + rank // FP8_DS_MLA_QUANT_BLOCK * 4 + rope * 2
    return int(model.kv_bytes_per_layer_per_rank(kv_cache_bytes, 1))


def model_spec_layers(model: ModelSpec, *, block_size: int, tensor_parallel_size: int, kv_cache_bytes: int,
                      num_layers: int | None = None, num_sliding_layers: int | None = None,
                      extra_full_layers: int = 0, fp8_ds_mla: bool = True) -> tuple[LayerSpec, ...]:
    """The layers of a model kvsched prices (full attention, MLA, sliding
    window; Llama 4's chunked local attention; DeepSeek-V3.2's indexer), or
    of ``num_layers`` of them (``num_sliding_layers`` sliding: one PP stage;
    its chunked layers in the model's proportion, rounded up), plus
    ``extra_full_layers`` full-attention layers of a drafter sharing the
    block tables. The one owner of a ModelSpec's per-layer KV specs.

    Sliding and chunked layers come first when there are any (layer 0
    slides in gpt-oss and Gemma, is chunked in Llama 4): vLLM orders its
    groups by each spec's first layer, and the round-robin split only
    counts layers. DeepSeek Sparse Attention gives each MLA layer with an
    indexer a second spec, its indexer's key cache (vLLM's Indexer: fp8
    keys of ``index_head_dim`` bytes and a float32 scale per 128 of them per
    token, replicated on every rank as the latent is); a layer reusing
    another's top-k has none (vLLM builds no indexer there). Its latent in
    an fp8 cache is :func:`sparse_mla_bytes_per_token`'s (``fp8_ds_mla``:
    FlashMLA's sparse backend's row)."""
    layers = model.num_layers if num_layers is None else num_layers
    sliding_layers = model.num_sliding_layers if num_sliding_layers is None else num_sliding_layers
    hybrid = model.hybrid
    if hybrid is not None and (hybrid.num_linear_layers or hybrid.num_mamba_layers):
        # Their state pages and the attention block size depend on the cache
        # mode: model_spec_kv_layout lays them out.
        raise ValueError(f"{model.name}: a linear-attention / Mamba hybrid; use model_spec_kv_layout")
    chunked_layers = hybrid.num_chunked_layers if hybrid is not None else 0
    if chunked_layers and layers != model.num_layers:
        chunked_layers = -(-chunked_layers * layers // model.num_layers)
    per_token = int(model.kv_bytes_per_layer_per_rank(kv_cache_bytes, tensor_parallel_size))
    full = LayerSpec(MLA if model.is_mla else FULL, block_size, per_token)
    sliding = (LayerSpec(SLIDING, block_size, per_token, sliding_window=model.sliding_window),) \
        * sliding_layers
    chunked = (LayerSpec(CHUNKED, block_size, per_token,
                         attention_chunk_size=hybrid.attention_chunk_size),) * chunked_layers \
        if hybrid is not None else ()
    full_layers = layers - sliding_layers - chunked_layers
    if hybrid is not None and hybrid.index_topk:
        latent = LayerSpec(MLA, block_size, sparse_mla_bytes_per_token(model, kv_cache_bytes, fp8_ds_mla))
        index_dim = hybrid.index_head_dim
        indexer = LayerSpec(MLA, block_size, index_dim + index_dim // INDEXER_QUANT_BLOCK * 4)
        # A stage's share of the layers that reuse another's top-k, rounded down.
        shared = hybrid.num_shared_index_layers * full_layers // model.num_layers
        # A drafter layer is a copy of the target's (kvsched.perf.drafter.layer_spec), as
        # vLLM's MTP layer is, indexer included: an MTP layer always builds one.
        return sliding + chunked + (latent, indexer) * (full_layers - shared + extra_full_layers) \
            + (latent,) * shared
    return sliding + chunked + (full,) * (full_layers + extra_full_layers)


def model_spec_kv_layout(model: ModelSpec, *, block_size: int, tensor_parallel_size: int, kv_cache_bytes: int,
                         enable_prefix_caching: bool, max_model_len: int,
                         extra_full_layers: int = 0, fp8_ds_mla: bool = True) -> ModelKVLayout:
    """A ModelSpec's per-layer KV specs with the attention block size vLLM
    runs it at: :func:`model_spec_layers`' for attention-only models (the
    block size as given); for a Mamba-state hybrid its linear or Mamba-2
    layers as Mamba state (:func:`mamba_state_bytes`) beside its
    full-attention layers, the block size raised to hold a state page
    (:func:`resolve_mamba_cache`). FlashInfer's GDN prefill checkpoints
    every 64 tokens and keeps a checkpoint block in align mode; MambaMixer2
    exports no mid-prefill checkpoint but always declares a checkpoint
    block. The state layers come first, as layer 0 is one in every
    published Qwen3-Next, Qwen3.5 and Nemotron-H config (vLLM orders its
    groups by their first layer). Nemotron-H's MLP-only layers hold no
    cache."""
    h = model.hybrid
    if h is None or not (h.num_linear_layers or h.num_mamba_layers):
        return ModelKVLayout(model_spec_layers(model, block_size=block_size,
                                               tensor_parallel_size=tensor_parallel_size,
                                               kv_cache_bytes=kv_cache_bytes,
                                               extra_full_layers=extra_full_layers, fp8_ds_mla=fp8_ds_mla),
                             block_size)
    tp = tensor_parallel_size
    state = mamba_state_bytes(model, tp)
    per_token = int(model.kv_bytes_per_layer_per_rank(kv_cache_bytes, tp))
    gdn = h.num_linear_layers > 0
    mamba = resolve_mamba_cache(block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                                max_model_len=max_model_len, attention_bytes_per_token=per_token,
                                mamba_state_bytes=state,
                                checkpoint_alignment=GDN_CHECKPOINT_ALIGNMENT if gdn else None,
                                checkpoint_block=enable_prefix_caching or not gdn)
    # The prefill checkpoint block vLLM's layer spec declares: Gated DeltaNet
    # in align mode (FlashInfer's GDN prefill exports checkpoints) on the
    # prefix-cache grid, the Mamba block (get_mamba_prefill_checkpoint_grid
    # without prefix_match_unit); MambaMixer2 always, at any token (1).
    checkpoint = ({"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": mamba.mamba_block_size}
                  if enable_prefix_caching else {}) if gdn else \
        {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}
    layer = LayerSpec(MAMBA, mamba.mamba_block_size, state_bytes=state,
                      page_size_padded=mamba.mamba_page_size_padded, **checkpoint)
    full = LayerSpec(FULL, mamba.block_size, per_token)
    states = h.num_linear_layers + h.num_mamba_layers
    return ModelKVLayout((layer,) * states + (full,) * (model.num_full_attention_layers + extra_full_layers),
                         mamba.block_size, mamba)


def mamba_state_bytes(model: ModelSpec, tensor_parallel_size: int) -> int:
    """One request's state in one linear-attention or Mamba-2 layer on one
    TP rank, as vLLM's MambaStateShapeCalculator shapes it: the
    convolution's ``kernel - 1`` rows of its channels (split over TP, in
    the model's 16 bits) and the recurrent state (split over TP, at the
    state dtype). Gated DeltaNet: channels 2 x key heads x key dim + value
    heads x value dim, state value heads x value dim x key dim. Mamba-2:
    channels heads x head dim + 2 x groups x state size (groups that do not
    split over TP replicated up to the TP size), state heads x head dim x
    state size."""
    h = model.hybrid
    assert h is not None
    tp = tensor_parallel_size
    if h.num_linear_layers:
        for name, heads in (("linear_num_key_heads", h.linear_num_key_heads),
                            ("linear_num_value_heads", h.linear_num_value_heads)):
            if heads % tp:
                raise UserInputError(f"{model.name}: {name}={heads} is not divisible by "
                                     f"tensor_parallel_size={tp} (vLLM splits the Gated DeltaNet heads over "
                                     "TP); use a TP size dividing it")
        conv_width = (2 * h.linear_num_key_heads * h.linear_key_head_dim
                      + h.linear_num_value_heads * h.linear_value_head_dim) // tp
        ssm = h.linear_num_value_heads // tp * h.linear_value_head_dim * h.linear_key_head_dim \
            * h.linear_state_dtype_bytes
        return (h.linear_conv_kernel - 1) * conv_width * MODEL_DTYPE_BYTES + ssm
    if h.mamba_num_heads % tp:
        raise UserInputError(f"{model.name}: mamba_num_heads={h.mamba_num_heads} is not divisible by "
                             f"tensor_parallel_size={tp} (vLLM splits the Mamba-2 heads over TP); use a TP "
                             "size dividing it")
    groups = h.mamba_n_groups if h.mamba_n_groups % tp == 0 else tp
    conv_width = (h.mamba_inner + 2 * groups * h.mamba_state_size) // tp
    ssm = h.mamba_num_heads // tp * h.mamba_head_dim * h.mamba_state_size * h.mamba_state_dtype_bytes
    return (h.mamba_conv_kernel - 1) * conv_width * MODEL_DTYPE_BYTES + ssm


def model_kv_layout(data: Mapping[str, Any], *, block_size: int, tensor_parallel_size: int = 1,
                    kv_cache_bytes: int = 2, enable_prefix_caching: bool = True,
                    max_model_len: int | None = None, source: str = "config.json",
                    fp8_ds_mla: bool = True) -> ModelKVLayout:
    """The per-layer KV cache specs vLLM's model classes declare for the
    config.json ``data`` on one of ``tensor_parallel_size`` ranks,
    ``kv_cache_bytes`` per KV value (2: "auto" on a 16-bit model; 1: fp8):
    the model read by kvsched.perf.model_parsers, laid out by
    :func:`model_spec_kv_layout` (``fp8_ds_mla``: its sparse MLA's fp8 row)."""
    model = model_spec_from_config(data, source, source)
    return model_spec_kv_layout(
        model, block_size=block_size, tensor_parallel_size=tensor_parallel_size,
        kv_cache_bytes=kv_cache_bytes, enable_prefix_caching=enable_prefix_caching,
        max_model_len=max_model_len if max_model_len is not None else model.max_position_embeddings,
        fp8_ds_mla=fp8_ds_mla)
