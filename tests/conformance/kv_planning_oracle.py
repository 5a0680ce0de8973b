"""KV cache planning goldens from vLLM's own planning code (issue 37).

    VENV=~/.cache/kvsched-reference/venv-0.34   # or venv (0.33)
    $VENV/bin/python tests/conformance/kv_planning_oracle.py tests/conformance/kv_planning/vllm_0_34.json

For every case of :func:`cases` (a model's config.json, tensor parallel size,
block size, prefix caching, --disable-hybrid-kv-cache-manager,
--num-gpu-blocks-override, the KV memory available) it writes vLLM's KV
cache groups (kind, layer count, block size, bytes per block) and
``num_blocks``, or the error vLLM raises. tests/perf/test_kv_cache_planning.py
compares kvsched.perf.kv_cache_planning to the file (no vLLM needed there).

What is vLLM's code and what is our reading:

- vLLM's: the spec classes and their page sizes (``FullAttentionSpec``,
  ``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``, ``MLAAttentionSpec``,
  ``MambaSpec``, ``kv_cache_interface.py``); the spec registry
  (``register_all_kvcache_specs``); the grouping and block count
  (``kv_cache_planning.get_kv_cache_groups``,
  ``get_kv_cache_config_from_groups``); the Mamba state shapes and dtypes
  (the model classes' ``get_mamba_state_shape_from_config`` /
  ``get_mamba_state_dtype_from_config``, i.e. ``MambaStateShapeCalculator``,
  ``MambaStateDtypeCalculator``); the Mamba cache mode and block size
  (``MambaModelConfig.verify_and_update_config``); Nemotron-H's SSM state
  dtype (``NemotronHForCausalLMConfig.verify_and_update_config``); the hybrid attention block
  size and Mamba padding (``Platform._align_hybrid_block_size``, run with
  FlashAttention as the attention backend and stand-in Mamba layers that
  answer ``get_prefill_checkpoint_alignment`` as vLLM's layer classes do);
  the start-up check's blocks per request
  (``_max_memory_usage_bytes_from_groups``, 8192 tokens in flight);
  a sliding layer's block size (``attention._largest_kernel_block_within``
  with FlashAttention's kernel block sizes).
- Ours (transcribed from reading the model classes, since building the
  models needs weights or a GPU): which layer gets which spec (gpt-oss:
  even layers slide; Gemma 3: ``layer_types`` or every 6th global; Llama 4:
  chunked local on RoPE layers, ``no_rope_layers`` or every 4th NoPE;
  Qwen3-Next and Qwen3.5: ``layer_types`` or every 4th full (Qwen3.5's
  SSM state dtype by its config class, ``Qwen3_5ForConditionalGenerationConfig``); Nemotron-H:
  ``hybrid_override_pattern`` M/*; the prefill checkpoint blocks the Mamba
  layer classes add to their spec; DeepSeek Sparse Attention (DeepSeek-V3.2,
  GLM-5): one MLA latent per layer, built by vLLM's own
  ``MLAAttention.get_kv_cache_spec`` on a stand-in layer, its dtype the one
  vLLM's ``_canonicalize_sparse_mla_kv_cache_dtype`` gives for the case's
  sparse backend (FLASHMLA_SPARSE turns fp8 into fp8_ds_mla,
  FLASHINFER_MLA_SPARSE keeps it), and one indexer key cache of
  index_head_dim + index_head_dim / 128 * 4 bytes on each layer that builds
  an indexer: 0.34's ``compute_skip_topk_layers`` names the others, for
  0.33 its sparse attention's frequency rule transcribed), the KV heads per
  rank (split over TP, at least one), the GDN prefill backend (FlashInfer, as
  on Hopper: checkpoint alignment 64 in align mode; Mamba2 layers: none), the
  layout (LBNHC, vLLM's default when no backend asks for another) and the
  disable_hybrid_kv_cache_manager default (on for chunked local attention
  without VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE, else off;
  ``config/vllm.py``), given per case as a flag.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

for key, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                   ("VLLM_NO_USAGE_STATS", "1"), ("VLLM_TARGET_DEVICE", "cpu")):
    os.environ.setdefault(key, value)

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.v1.core import kv_cache_planning as planning  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

REPO = Path(__file__).resolve().parents[2]
GDN_FLASHINFER_CHECKPOINT_ALIGNMENT = 64


def _text(config: dict) -> dict:
    wrappers = ("gemma3", "llama4", "qwen3_5", "qwen3_5_moe")
    return config.get("text_config", config) if config.get("model_type") in wrappers else config


def _layout_name() -> object:
    from vllm.v1.kv_cache_interface import KVCacheLayout
    return KVCacheLayout.LBNHC


def _vllm_config(case: dict, text: dict) -> SimpleNamespace:
    """The parts of VllmConfig the planning functions read."""
    layout = _layout_name()
    cache = SimpleNamespace(
        block_size=case["block_size"], cache_dtype=case["kv_cache_dtype"],
        enable_prefix_caching=case["enable_prefix_caching"],
        mamba_cache_mode="none", mamba_block_size=None, mamba_page_size_padded=None,
        mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto",
        num_gpu_blocks_override=case.get("num_gpu_blocks_override"), prefix_cache_retention_interval=None,
        use_replayssm=False, user_specified_block_size=True, kv_cache_dtype_skip_layers=None,
        skip_page_size_padded=None, prefix_match_unit=None,
        get_resolved_kv_cache_layout=lambda: layout, kv_cache_layout=layout.name)
    hf = SimpleNamespace(**text)
    model = SimpleNamespace(
        hf_config=hf, hf_text_config=hf, dtype=torch.bfloat16, max_model_len=case["max_model_len"],
        use_mla=False, architecture=case["architecture"], architectures=[case["architecture"]],
        supports_kv_cache_grouping=False, original_max_model_len=case["max_model_len"], is_hybrid=True,
        get_num_kv_heads=lambda parallel: max(1, text["num_key_value_heads"] // case["tensor_parallel_size"]),
        get_head_size=lambda: text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    return SimpleNamespace(
        cache_config=cache, model_config=model,
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=case["disable_hybrid_kv_cache_manager"],
                                         enable_chunked_prefill=True),
        parallel_config=SimpleNamespace(tensor_parallel_size=case["tensor_parallel_size"],
                                        decode_context_parallel_size=1),
        attention_config=SimpleNamespace(hisparse_config=None), speculative_config=None,
        num_speculative_tokens=0, use_flashinfer_replayssm=False, additional_config={},
        max_in_flight_tokens=case["max_in_flight_tokens"],
        compilation_config=SimpleNamespace(static_forward_context={}))


def _attention_backend() -> type:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    return FlashAttentionBackend


def _sliding_block_size(per_token: int, block_size: int) -> int:
    """vLLM's Attention.get_kv_cache_spec for a sliding layer (no shared page)."""
    from vllm.model_executor.layers.attention import attention as attn_module
    pick = attn_module._largest_kernel_block_within
    probe = SlidingWindowSpec(block_size=1, num_kv_heads=1, head_size=1, dtype=torch.bfloat16,
                              sliding_window=1)
    try:
        return pick(_attention_backend(), per_token, per_token * block_size, block_size, probe,
                    divisor_of=block_size)
    except TypeError:  # 0.33: no divisor_of
        return pick(_attention_backend(), per_token, per_token * block_size, block_size, probe)


def _mamba_layer_class(alignment: int | None) -> type:
    """A stand-in Mamba layer: vLLM's get_mamba_prefill_checkpoint_alignment
    reads only get_prefill_checkpoint_alignment from each layer."""
    from vllm.model_executor.layers.mamba.abstract import MambaBase

    class StandIn(MambaBase):
        def get_state_shape(self):  # pragma: no cover - not read
            raise NotImplementedError

        def get_state_dtype(self):  # pragma: no cover - not read
            raise NotImplementedError

        @property
        def mamba_type(self):  # pragma: no cover - not read
            raise NotImplementedError

        def get_prefill_checkpoint_alignment(self):
            return alignment

    return StandIn


def _align_hybrid(vc: SimpleNamespace, model_cls: type, mamba_alignment: int | None, num_mamba: int) -> None:
    """vLLM's MambaModelConfig then Platform._align_hybrid_block_size."""
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MambaModelConfig
    from vllm.platforms.interface import Platform

    MambaModelConfig.verify_and_update_config(vc)
    layer_cls = _mamba_layer_class(mamba_alignment)
    for i in range(num_mamba):
        layer = layer_cls()
        vc.compilation_config.static_forward_context[f"mamba.{i}"] = layer
    saved_resolve = ModelRegistry.resolve_model_cls
    saved_find = Platform._find_non_ssm_backends
    ModelRegistry.resolve_model_cls = lambda *a, **k: (model_cls, vc.model_config.architecture)
    Platform._find_non_ssm_backends = classmethod(lambda cls, config: [_attention_backend()])
    try:
        from vllm.config.vllm import get_layers_from_vllm_config  # noqa: F401
        Platform._align_hybrid_block_size(vc, _attention_backend())
    finally:
        ModelRegistry.resolve_model_cls = saved_resolve
        Platform._find_non_ssm_backends = saved_find


class _NemotronHStateShapes:
    """NemotronHForCausalLM's get_mamba_state_{shape,dtype}_from_config
    (nemotron_h.py), the same calls into vLLM's calculators: the model
    module itself does not import on this CPU-only install."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vc):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
        hf = vc.model_config.hf_config
        return MambaStateShapeCalculator.mamba2_state_shape(
            intermediate_size=hf.mamba_num_heads * hf.mamba_head_dim,
            tp_world_size=vc.parallel_config.tensor_parallel_size, n_groups=hf.n_groups,
            num_heads=hf.mamba_num_heads, head_dim=hf.mamba_head_dim, state_size=hf.ssm_state_size,
            conv_kernel=hf.conv_kernel, num_spec=vc.num_speculative_tokens)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vc):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator
        return MambaStateDtypeCalculator.mamba2_state_dtype(
            vc.model_config.dtype, vc.cache_config.mamba_cache_dtype, vc.cache_config.mamba_ssm_cache_dtype)


class _Qwen3NextStateShapes:
    """Qwen3NextForCausalLM's get_mamba_state_{shape,dtype}_from_config
    (qwen3_next.py), the same calls into vLLM's calculators."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vc):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
        hf = vc.model_config.hf_text_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vc.parallel_config.tensor_parallel_size, hf.linear_num_key_heads, hf.linear_num_value_heads,
            hf.linear_key_head_dim, hf.linear_value_head_dim, hf.linear_conv_kernel_dim, 0)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vc):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            vc.model_config.dtype, vc.cache_config.mamba_cache_dtype, vc.cache_config.mamba_ssm_cache_dtype)


def _skip_topk_layers(text: dict) -> set[int]:
    """The layers of a DSA model that build no indexer: vLLM 0.34's own
    ``compute_skip_topk_layers``; 0.33 has none, its sparse attention
    (models/deepseek_v32/attention.py) applies the frequency rule in each
    layer, transcribed here."""
    try:
        from vllm.model_executor.models.utils import compute_skip_topk_layers
    except ImportError:
        freq = text.get("index_topk_freq", 1)
        pattern = text.get("index_topk_pattern")
        offset = text.get("index_skip_topk_offset", 2)
        if pattern is None:
            return {i for i in range(text["num_hidden_layers"]) if max(i - offset + 1, 0) % freq != 0}
        return {i for i in range(min(text["num_hidden_layers"], len(pattern))) if pattern[i] == "S"}
    return set(compute_skip_topk_layers(SimpleNamespace(**text)))


def _sparse_latent_spec(case: dict, text: dict, vc: SimpleNamespace, owner: bool) -> object:
    """A DSA layer's latent spec from vLLM's MLAAttention.get_kv_cache_spec,
    its cache dtype as vLLM's MLAAttention settles it for the case's sparse
    backend (FLASHMLA_SPARSE unless the case names another)."""
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    backend = AttentionBackendEnum[case.get("sparse_mla_backend", "FLASHMLA_SPARSE")].get_class()
    dtype = mla_attention._canonicalize_sparse_mla_kv_cache_dtype(backend, case["kv_cache_dtype"])
    impl = SimpleNamespace(kv_lora_rank=text["kv_lora_rank"], qk_rope_head_dim=text["qk_rope_head_dim"])
    row = getattr(backend.get_impl_cls(), "get_fp8_ds_mla_row_bytes", None)  # 0.34; 0.33 has a constant
    if row is not None:
        impl.get_fp8_ds_mla_row_bytes = lambda: row(impl)
    layer = SimpleNamespace(kv_cache_dtype=dtype, head_size=text["kv_lora_rank"] + text["qk_rope_head_dim"],
                            sliding_window=None, topk_buffer_width=None, indexer=object() if owner else None,
                            non_causal_multi_token_decode=False, impl=impl)
    return mla_attention.MLAAttention.get_kv_cache_spec(layer, vc)


def _qwen3_5_ssm_dtype(vc) -> None:
    """vLLM's Qwen3.5 config rule (the wrapper's verify_and_update_config):
    the SSM cache dtype from text_config's mamba_ssm_dtype."""
    from vllm.model_executor.models.config import Qwen3_5ForConditionalGenerationConfig
    Qwen3_5ForConditionalGenerationConfig.verify_and_update_config(vc)


def layer_specs(case: dict) -> dict:
    config = json.loads((REPO / case["config"]).read_text())
    text = _text(config)
    vc = _vllm_config(case, text)
    tp = case["tensor_parallel_size"]
    layers = text["num_hidden_layers"]
    kv_heads = max(1, text.get("num_key_value_heads", 1) // tp)
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    kind = text["model_type"]
    specs: dict = {}
    # The attention layers' KV dtype and quant mode, as vLLM's Attention reads
    # --kv-cache-dtype (kv_cache_dtype_str_to_dtype, get_kv_quant_mode).
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import get_kv_quant_mode
    kv_dtype = kv_cache_dtype_str_to_dtype(case["kv_cache_dtype"], vc.model_config)
    quant = {"kv_quant_mode": get_kv_quant_mode(case["kv_cache_dtype"])}

    def full(block: int) -> FullAttentionSpec:
        return FullAttentionSpec(block_size=block, num_kv_heads=kv_heads, head_size=head, dtype=kv_dtype,
                                 **quant)

    def sliding(window: int) -> SlidingWindowSpec:
        per_token = FullAttentionSpec(block_size=1, num_kv_heads=kv_heads, head_size=head, dtype=kv_dtype,
                                      **quant).page_size_bytes
        block = _sliding_block_size(per_token, case["block_size"])
        return SlidingWindowSpec(block_size=block, num_kv_heads=kv_heads, head_size=head, dtype=kv_dtype,
                                 sliding_window=window, **quant)

    bs = case["block_size"]
    if kind == "gpt_oss":
        for i in range(layers):
            specs[f"layers.{i}"] = sliding(text["sliding_window"]) if i % 2 == 0 else full(bs)
    elif kind == "gemma3_text":
        pattern = text.get("sliding_window_pattern", 6)
        types = text.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                            for i in range(layers)]
        for i, t in enumerate(types):
            specs[f"layers.{i}"] = sliding(text.get("sliding_window", 4096)) if t == "sliding_attention" \
                else full(bs)
    elif kind == "llama4_text":
        rope = text.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
        for i in range(layers):
            specs[f"layers.{i}"] = ChunkedLocalAttentionSpec(
                block_size=bs, num_kv_heads=kv_heads, head_size=head, dtype=kv_dtype, **quant,
                attention_chunk_size=text["attention_chunk_size"]) if rope[i] else full(bs)
    elif kind == "llama":
        for i in range(layers):
            specs[f"layers.{i}"] = full(bs)
    elif kind == "deepseek_v3":
        for i in range(layers):
            specs[f"layers.{i}.attn"] = MLAAttentionSpec(
                block_size=bs, num_kv_heads=1, max_tp_shards=1,
                head_size=text["kv_lora_rank"] + text["qk_rope_head_dim"], dtype=kv_dtype,
                cache_dtype_str=case["kv_cache_dtype"], **quant)
    elif kind in ("deepseek_v32", "glm_moe_dsa"):
        from vllm.v1.kv_cache_interface import SparseCacheRole
        index_head = text["index_head_dim"] + text["index_head_dim"] // 128 * 4
        shared = _skip_topk_layers(text)
        latent = {owner: _sparse_latent_spec(case, text, vc, owner) for owner in (True, False)}
        for i in range(layers):
            specs[f"layers.{i}.attn"] = latent[i not in shared]
            if i not in shared:
                specs[f"layers.{i}.indexer.k_cache"] = MLAAttentionSpec(
                    block_size=bs, num_kv_heads=1, max_tp_shards=1, head_size=index_head, dtype=torch.uint8,
                    cache_role=SparseCacheRole.INDEXER)
    else:
        if kind == "nemotron_h":
            from vllm.model_executor.models.config import NemotronHForCausalLMConfig
            # vLLM's rule for the SSM state dtype: config.json's, else float32.
            NemotronHForCausalLMConfig.verify_and_update_config(vc)
            model_cls = _NemotronHStateShapes
            kinds = ["mamba" if c == "M" else "attention" if c == "*" else "" for c in
                     text["hybrid_override_pattern"]]
            alignment = None
        else:
            if kind in ("qwen3_5_text", "qwen3_5_moe_text"):
                # Qwen3.5's state shapes and dtypes are Qwen3-Next's calls (qwen3_5.py); only
                # the SSM dtype's default differs.
                _qwen3_5_ssm_dtype(vc)
            model_cls = _Qwen3NextStateShapes
            interval = text.get("full_attention_interval", 4)
            types = text.get("layer_types") or ["linear_attention" if (i + 1) % interval else "full_attention"
                                                for i in range(layers)]
            kinds = ["mamba" if t == "linear_attention" else "attention" for t in types]
            alignment = GDN_FLASHINFER_CHECKPOINT_ALIGNMENT if case["enable_prefix_caching"] else None
        _align_hybrid(vc, model_cls, alignment, kinds.count("mamba"))
        cache = vc.cache_config
        # What the layer classes' get_kv_cache_spec adds: MambaMixer2 always
        # one prefill checkpoint block (alignment 1); the GDN layer one when it
        # exports checkpoints (align mode, FlashInfer), on the prefix grid.
        checkpoints = {}
        if kind == "nemotron_h":
            checkpoints = {"num_prefill_checkpoint_blocks": 1, "prefill_checkpoint_alignment": 1}
        elif alignment is not None:
            checkpoints = {"num_prefill_checkpoint_blocks": 1,
                           "prefill_checkpoint_alignment": cache.mamba_block_size}
        shapes = tuple(model_cls.get_mamba_state_shape_from_config(vc))
        dtypes = tuple(model_cls.get_mamba_state_dtype_from_config(vc))
        for i, k in enumerate(kinds):
            if k == "mamba":
                specs[f"layers.{i}"] = MambaSpec(
                    block_size=cache.mamba_block_size, shapes=shapes, dtypes=dtypes,
                    page_size_padded=cache.mamba_page_size_padded, mamba_cache_mode=cache.mamba_cache_mode,
                    **checkpoints)
            elif k == "attention":
                specs[f"layers.{i}"] = full(cache.block_size)
    return {"vllm_config": vc, "specs": specs}


def _kind(spec: object) -> str:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        kinds = {_kind(s) for s in spec.kv_cache_specs.values()}
        return kinds.pop() if len(kinds) == 1 else "mixed"
    for cls, name in ((MLAAttentionSpec, "mla_attention"), (FullAttentionSpec, "full_attention"),
                      (ChunkedLocalAttentionSpec, "chunked_local_attention"),
                      (SlidingWindowSpec, "sliding_window"), (MambaSpec, "mamba")):
        if isinstance(spec, cls):
            return name
    return type(spec).__name__


def plan(case: dict) -> dict:
    built = layer_specs(case)
    vc, specs = built["vllm_config"], built["specs"]
    try:
        groups = planning.get_kv_cache_groups(vc, specs)
        config = planning.get_kv_cache_config_from_groups(vc, groups, case["available_bytes"])
    except (ValueError, NotImplementedError, AssertionError) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    out_groups = []
    for group in config.kv_cache_groups:
        spec = group.kv_cache_spec
        layer_specs_ = list(spec.kv_cache_specs.values()) if isinstance(spec, UniformTypeKVCacheSpecs) \
            else [spec] * len(group.layer_names)
        out_groups.append({"kind": _kind(spec), "num_layers": len(group.layer_names),
                           "block_size": spec.block_size,
                           "bytes_per_block": sum(s.page_size_bytes for s in layer_specs_),
                           # A promoted (full-attention) spec keeps its window for the
                           # kernels; only a local group's window shapes allocation.
                           "sliding_window": spec.sliding_window if isinstance(spec, SlidingWindowSpec)
                           else None,
                           "attention_chunk_size": spec.attention_chunk_size
                           if isinstance(spec, ChunkedLocalAttentionSpec) else None})
    cache = vc.cache_config
    # vLLM's start-up check: the pool blocks one request of max_model_len may
    # hold, summed over the groups (each spec's max_memory_usage_bytes).
    builder = planning.DefaultKVCacheConfigBuilder()
    needed = planning._max_memory_usage_bytes_from_groups(builder, vc, groups)
    per_block = planning._pool_bytes_per_block_from_builder(builder, vc, groups)
    return {"groups": out_groups, "num_blocks": config.num_blocks,
            "blocks_per_request": needed // per_block,
            "attention_block_size": cache.block_size,
            "mamba_cache_mode": cache.mamba_cache_mode if cache.mamba_block_size is not None else None,
            "mamba_block_size": cache.mamba_block_size,
            "mamba_page_size_padded": cache.mamba_page_size_padded}


MODELS = (
    # (name, config.json in this repository, vLLM architecture, prefix caching settings)
    ("openai/gpt-oss-120b", "tests/perf/data/hf_configs/openai--gpt-oss-120b.json", "GptOssForCausalLM"),
    ("google/gemma-3-27b-it", "tests/perf/data/hf_configs/google--gemma-3-27b-it.json",
     "Gemma3ForConditionalGeneration"),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "tests/perf/data/hf_configs/"
     "meta-llama--Llama-4-Scout-17B-16E-Instruct.json", "Llama4ForConditionalGeneration"),
    ("Qwen/Qwen3-Next-80B-A3B-Instruct", "tests/perf/data/hf_configs/Qwen--Qwen3-Next-80B-A3B-Instruct.json",
     "Qwen3NextForCausalLM"),
    ("Qwen/Qwen3.5-27B", "tests/perf/data/hf_configs/Qwen--Qwen3.5-27B.json",
     "Qwen3_5ForConditionalGeneration"),
    ("Qwen/Qwen3.5-35B-A3B", "tests/perf/data/hf_configs/Qwen--Qwen3.5-35B-A3B.json",
     "Qwen3_5MoeForConditionalGeneration"),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "tests/perf/data/hf_configs/"
     "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json", "NemotronHForCausalLM"),
    ("nvidia/Nemotron-H-8B-Base-8K", "tests/perf/data/hf_configs/nvidia--Nemotron-H-8B-Base-8K.json",
     "NemotronHForCausalLM"),
    # Models of one kind, for the uniform paths.
    ("meta-llama/Llama-3.1-8B", "tests/perf/data/hf_configs/meta-llama--Llama-3.1-8B.json",
     "LlamaForCausalLM"),
    ("deepseek-ai/DeepSeek-V3", "tests/perf/data/hf_configs/deepseek-ai--DeepSeek-V3.json",
     "DeepseekV3ForCausalLM"),
    ("deepseek-ai/DeepSeek-V3.2", "tests/perf/data/hf_configs/deepseek-ai--DeepSeek-V3.2.json",
     "DeepseekV32ForCausalLM"),
    # DSA under GLM's config: every layer its own indexer (GLM-5), 57 of 78 sharing (GLM-5.2).
    ("zai-org/GLM-5", "tests/perf/data/hf_configs/zai-org--GLM-5.json", "GlmMoeDsaForCausalLM"),
    ("zai-org/GLM-5.2", "tests/perf/data/hf_configs/zai-org--GLM-5.2.json", "GlmMoeDsaForCausalLM"),
)
DSA_MODELS = ("deepseek-ai/DeepSeek-V3.2", "zai-org/GLM-5", "zai-org/GLM-5.2")
GIB = 2**30


def cases() -> list[dict]:
    """Each model at both releases' default block sizes (0.33: 16, 0.34: 64),
    two KV memory sizes, hybrid manager on and off, prefix caching on and
    off, one num_gpu_blocks_override and one TP 8 case, and an fp8 KV cache
    at both block sizes."""
    out = []
    for name, config, arch in MODELS:
        for block_size in (16, 64):
            for available in (20 * GIB + 12345, 61 * GIB):
                for disable in (False, True):
                    for caching in (True, False):
                        out.append({"model": name, "config": config, "architecture": arch,
                                    "tensor_parallel_size": 1, "block_size": block_size,
                                    "enable_prefix_caching": caching,
                                    "disable_hybrid_kv_cache_manager": disable,
                                    "num_gpu_blocks_override": None, "available_bytes": available,
                                    "max_model_len": 32768, "max_in_flight_tokens": 8192,
                                    "kv_cache_dtype": "auto"})
        out.append({**out[-1], "tensor_parallel_size": 8, "disable_hybrid_kv_cache_manager": False,
                    "enable_prefix_caching": True})
        out.append({**out[-1], "num_gpu_blocks_override": 1000})
        fp8 = {**out[-1], "num_gpu_blocks_override": None, "tensor_parallel_size": 1, "kv_cache_dtype": "fp8"}
        if name not in DSA_MODELS:
            for block_size in (16, 64):
                out.append({**fp8, "block_size": block_size})
        else:
            # Sparse MLA's fp8 latent per backend: fp8_ds_mla (FlashMLA's, Hopper's pick) or plain
            # fp8 (FlashInfer's, Blackwell's pick); both at 0.34's default block and at 16.
            for backend in ("FLASHMLA_SPARSE", "FLASHINFER_MLA_SPARSE"):
                for block_size in (16, 64):
                    out.append({**fp8, "block_size": block_size, "sparse_mla_backend": backend})
    return out


def main() -> None:
    out_path = Path(sys.argv[1])
    # vllm_config is only handed to the platform hook for custom specs.
    register_all_kvcache_specs(SimpleNamespace())
    results = [{"case": case, "vllm": plan(case)} for case in cases()]
    out_path.write_text(json.dumps({"vllm_version": vllm.__version__, "results": results}, indent=1) + "\n")
    print(f"{len(results)} cases -> {out_path} (vLLM {vllm.__version__})")


if __name__ == "__main__":
    main()
