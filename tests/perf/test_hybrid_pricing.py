"""Hybrid models' layers priced by kind (kvsched.perf.hybrid): their
parameter counts against the published sizes, and the roofline's terms by
hand: linear attention independent of the context, chunked local attention
within its chunk, DeepSeek Sparse Attention over its top-k keys plus the
indexer over the whole context."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf import get_hardware
from kvsched.perf.hybrid import HybridLayers
from kvsched.perf.kv_cache_planning import model_kv_layout
from kvsched.perf.model_parsers import load_model_spec, model_spec_from_config
from kvsched.perf.models import ModelSpec
from kvsched.perf.step_time import (
    BatchShape,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
    sparse_shape,
    weight_split,
)

H100 = dataclasses.replace(get_hardware("h100-sxm"), id="h100-own")
NO_CPU = RuntimeConfig(async_scheduling=False, cpu_step_s=0.0, cpu_per_request_s=0.0)
CONFIGS = Path(__file__).parent / "data" / "hf_configs"
NEXT = CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Instruct.json"


def _bundled(name: str) -> Path:
    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or spec.origin is None:
        pytest.skip("aiconfigurator-core's bundled configs are needed")
    return Path(spec.origin).parent / "model_configs" / f"{name}_config.json"


# (config, published total parameters in billions, published active, tolerance):
# the model cards' "80B total, 3B activated", "671B" (+14B MTP), "109B total,
# 17B active" (with a ~0.7B vision tower kvsched does not count), "27B" and
# "35B-A3B" (Qwen3.5: with a vision tower and an MTP layer, not counted: 3 %).
# Nemotron: NVIDIA-Nemotron-3-Nano-30B-A3B's model card, "31.6B total
# parameters", "3.6B active including embeddings" (3.2B without); Nemotron-H's
# 8B (8.1B as NVIDIA's Megatron configs size it) and 56B (the Nemotron-H
# paper's sizes); Nemotron-3-Super-120B-A12B's and Nemotron-3-Ultra-550B-A55B's names
# (MTP layer not counted; Ultra's config lists its layers in layers_block_type).
@pytest.mark.parametrize(("name", "total", "active", "rel_total", "rel"), [
    ("Qwen3-Next", 80, 3, 0.02, 0.3), ("deepseek-ai--DeepSeek-V3.2", 671, 37, 0.02, 0.05),
    ("meta-llama--Llama-4-Scout-17B-16E-Instruct", 109, 17, 0.02, 0.05),
    ("Qwen--Qwen3.5-27B", 27, 27, 0.03, 0.03), ("Qwen--Qwen3.5-35B-A3B", 35, 3, 0.03, 0.15),
    ("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 31.6, 3.6, 0.005, 0.01),
    ("nvidia--Nemotron-H-8B-Base-8K", 8.1, 8.1, 0.005, 0.005),
    ("nvidia--Nemotron-H-56B-Base-8K", 56, 56, 0.01, 0.01),
    ("nvidia--NVIDIA-Nemotron-3-Super-120B-A12B-FP8", 120, 12, 0.01, 0.07),
    ("nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", 550, 55, 0.01, 0.03)])
def test_parameters_match_the_published_sizes(name: str, total: float, active: float, rel_total: float,
                                              rel: float) -> None:
    path = NEXT if name == "Qwen3-Next" else CONFIGS / f"{name}.json"
    if not path.exists():
        path = _bundled(name)
    model = load_model_spec(path, name)
    assert model.num_params() / 1e9 == pytest.approx(total, rel=rel_total)
    # Active counts include the embeddings and LM head (as models.md §4 does).
    assert model.active_params_per_token() / 1e9 == pytest.approx(active, rel=rel)


def test_glm5_parameters_match_its_technical_report() -> None:
    # GLM-5's technical report (Z.ai, "GLM-5: from Vibe Coding to Agentic Engineering",
    # arXiv:2602.15763, its architecture table): 744B total, 40B activated parameters;
    # its MTP layer not counted (as DeepSeek's 671B). kvsched: 743.91 B; active 40.83 B less
    # the input embedding (41.78 B with it, as models.md counts).
    glm5 = load_model_spec(CONFIGS / "zai-org--GLM-5.json", "zai-org/GLM-5")
    assert glm5.num_params() / 1e9 == pytest.approx(744, rel=1e-3)
    assert 40 <= (glm5.active_params_per_token() - glm5.embedding_params()) / 1e9 < 41
    # GLM-5.2 (same shapes): vLLM builds no indexer on its 57 shared layers, nor loads their weights.
    glm52 = load_model_spec(CONFIGS / "zai-org--GLM-5.2.json", "zai-org/GLM-5.2")
    assert glm52.hybrid is not None and glm52.num_index_layers == 21
    indexer = glm5.hybrid.indexer_params_per_layer(6144, 2048) if glm5.hybrid is not None else 0
    assert glm5.num_params() - glm52.num_params() == 57 * indexer


def test_indexer_sharing_is_read_as_vllm_builds_it() -> None:
    data = json.loads((CONFIGS / "zai-org--GLM-5.2.json").read_text())
    # Without indexer_types, the frequency rule alone (vLLM 0.33's): the same 57 shared layers.
    freq_only = {k: v for k, v in data.items() if k != "indexer_types"}
    assert model_spec_from_config(freq_only, "g").num_index_layers == 21
    # indexer_types that the frequency rule contradicts: 0.33 and 0.34 would build different models.
    with pytest.raises(UserInputError, match=r"indexer_types=.*index_topk_freq.*make them agree"):
        model_spec_from_config({**data, "index_topk_freq": 1}, "g")
    with pytest.raises(UserInputError, match=r"indexer_types=.*must list 78 layers"):
        model_spec_from_config({**data, "indexer_types": ["full"] * 77}, "g")
    with pytest.raises(UserInputError, match=r"index_topk_freq=0"):
        model_spec_from_config({**freq_only, "index_topk_freq": 0}, "g")


def test_shared_indexer_layers_are_not_priced() -> None:
    # A layer reusing an earlier layer's top-k scores nothing: GLM-5.2's indexer time is
    # 21/78 of GLM-5's (same shapes), its sparse attention the same.
    glm5 = load_model_spec(CONFIGS / "zai-org--GLM-5.json", "zai-org/GLM-5")
    glm52 = load_model_spec(CONFIGS / "zai-org--GLM-5.2.json", "zai-org/GLM-5.2")
    shape = BatchShape.decode(16, 16 * 100_000)
    full, shared = StepTimeModel(glm5, H100, runtime=NO_CPU), StepTimeModel(glm52, H100, runtime=NO_CPU)
    dense = full._layers_attention_time(shape) - full._hybrid_time(shape)
    assert shared._layers_attention_time(shape) - shared._hybrid_time(shape) == pytest.approx(dense)
    assert shared._hybrid_time(shape) == pytest.approx(full._hybrid_time(shape) * 21 / 78)


def test_layer_kinds_are_read_from_the_config() -> None:
    nxt = load_model_spec(NEXT, "Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert nxt.hybrid is not None and nxt.hybrid.num_linear_layers == 36
    assert nxt.num_full_attention_layers == 12  # every 4th of 48
    scout = load_model_spec(_bundled("meta-llama--Llama-4-Scout-17B-16E-Instruct"))
    assert scout.hybrid is not None
    assert (scout.hybrid.num_chunked_layers, scout.hybrid.attention_chunk_size) == (36, 8192)
    assert scout.num_full_attention_layers == 12  # the NoPE layers


# A Nemotron-H config of four layers, one of each block: a Mamba-2 mixer, attention, an MLP
# and an MoE block.
TINY_NEMOTRON = {
    "model_type": "nemotron_h", "hybrid_override_pattern": "M*-E", "num_hidden_layers": 4,
    "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 100, "max_position_embeddings": 4096, "intermediate_size": 96,
    "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 16, "n_groups": 2, "conv_kernel": 4,
    "use_conv_bias": True, "use_bias": False, "n_routed_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "n_shared_experts": 1, "moe_shared_expert_intermediate_size": 48,
}


def test_nemotron_h_parameters_by_hand() -> None:
    model = model_spec_from_config(TINY_NEMOTRON, "tiny-nemotron")
    embed = lm_head = 100 * 64
    norms = 4 * 64 + 64  # one RMSNorm a layer, and the final one
    # 'M': inner width 4 heads x 8 = 32; in_proj to z, x (32 each), B, C (2 groups x 16 each) and
    # dt (4 heads); conv1d over x, B, C (96 channels) of kernel 4 with a bias; A, D, dt_bias;
    # the gated norm (32); out_proj.
    mamba = 64 * (32 + 32 + 2 * 2 * 16 + 4) + 96 * 4 + 96 + 3 * 4 + 32 + 32 * 64
    attention = 64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64  # q, k, v, o; no biases
    mlp = 2 * 64 * 96  # up and down around relu2
    expert = 2 * 64 * 32
    router = 8 * 64 + 8  # gate and e_score_correction_bias
    shared = 2 * 64 * 48
    assert mamba == 11020 and attention == 12288
    assert model.num_params() == (embed + lm_head + norms + mamba + attention + mlp + router + 8 * expert
                                  + shared)
    assert model.active_params_per_token() == (embed + lm_head + norms + mamba + attention + mlp + router
                                               + 2 * expert + shared)
    assert (model.num_full_attention_layers, model.num_dense_layers, model.num_moe_layers) == (1, 1, 1)
    # A latent MoE (Nemotron-3-Super): the experts at the latent width 16, behind projections
    # into and out of it that every token runs.
    latent = model_spec_from_config({**TINY_NEMOTRON, "moe_latent_size": 16}, "tiny-latent")
    assert latent.num_params() == model.num_params() - 8 * expert + 8 * (2 * 16 * 32) + 2 * 64 * 16
    # The KV cache: the Mamba layer's state per request (conv 3 rows of 96 channels in bf16,
    # SSM 4 x 8 x 16 in float32, Nemotron-H's default) beside the attention layer's pages
    # (2 KV heads x 16 x K,V x 2 bytes = 128 a token); in align mode the block holds a state:
    # 16 x cdiv(2624, 16 x 128) = 32 tokens. The MLP and MoE layers hold nothing.
    state = 3 * 96 * 2 + 4 * 8 * 16 * 4
    layout = model_kv_layout(TINY_NEMOTRON, block_size=16)
    assert layout.block_size == 32 and layout.mamba is not None
    assert [(s.kind, s.state_bytes, s.bytes_per_token, s.page_bytes) for s in layout.layers] == \
        [("mamba", state, 0, 32 * 128), ("full_attention", 0, 128, 32 * 128)]
    # MambaMixer2 keeps a prefill checkpoint block in align mode: three states a request.
    assert layout.mamba.state_blocks_per_request == 3


def test_nemotron_h_bad_fields_name_the_field() -> None:
    with pytest.raises(UserInputError, match=r"hybrid_override_pattern='M\*-X'.*'E' \(MoE\)"):
        model_spec_from_config({**TINY_NEMOTRON, "hybrid_override_pattern": "M*-X"}, "bad")
    with pytest.raises(UserInputError, match=r"mlp_hidden_act='silu'.*relu2"):
        model_spec_from_config({**TINY_NEMOTRON, "mlp_hidden_act": "silu"}, "bad")
    with pytest.raises(UserInputError, match=r"mamba_ssm_cache_dtype='fp8'.*float32"):
        model_spec_from_config({**TINY_NEMOTRON, "mamba_ssm_cache_dtype": "fp8"}, "bad")


def test_nemotron_layers_block_type_names_the_same_layers() -> None:
    # Nemotron-3-Ultra's config lists its blocks in layers_block_type (legacy names) with no
    # pattern and no num_hidden_layers; transformers' current names are read too.
    base = {k: v for k, v in TINY_NEMOTRON.items()
            if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    pattern = model_spec_from_config(TINY_NEMOTRON, "tiny")
    for names in (["mamba", "attention", "mlp", "moe"], ["linear_attention", "full_attention", "mlp", "moe"]):
        listed = model_spec_from_config({**base, "layers_block_type": names}, "tiny")
        assert listed == pattern
    # The list wins over a stale num_hidden_layers, as transformers' config does.
    assert model_spec_from_config({**base, "layers_block_type": ["mamba", "attention"],
                                   "num_hidden_layers": 4}, "tiny").num_layers == 2
    with pytest.raises(UserInputError, match=r"layers_block_type=.*'moe'"):
        model_spec_from_config({**base, "layers_block_type": ["mamba", "ssm"]}, "bad")


def _linear_model(layers: int = 4, linear: int = 3) -> ModelSpec:
    return ModelSpec(name="tiny-next", hidden_size=1024, num_layers=layers, num_heads=8, num_kv_heads=2,
                     head_dim=128, intermediate_size=2048, vocab_size=1000, max_position_embeddings=1 << 20,
                     tie_word_embeddings=False,
                     hybrid=HybridLayers(num_linear_layers=linear, linear_num_key_heads=4,
                                         linear_num_value_heads=8, linear_key_head_dim=64,
                                         linear_value_head_dim=32, linear_conv_kernel=4))


def test_linear_attention_is_priced_per_token_whatever_the_context() -> None:
    model = _linear_model()
    step = StepTimeModel(model, H100, runtime=NO_CPU)
    R = 32
    conv_dim = 2 * 4 * 64 + 8 * 32
    flops = R * (6.0 * 8 * 64 * 32 + 2.0 * conv_dim * 4)
    state = 2.0 * R * (8 * 64 * 32 * 2 + conv_dim * 3 * 2)
    expected = 3 * max(flops / step.decode_attn_flops, state / step.decode_attn_bw)
    for kv in (R * 10, R * 100_000):
        assert step._hybrid_time(BatchShape.decode(R, kv)) == pytest.approx(expected, rel=1e-12)
    assert step.full_layers == 1
    # A prefill chunk adds the chunked kernel's intra-chunk products per token.
    n = 512
    pre = BatchShape(n, 1, 1, 0, 0, n, n, n * (n + 1) // 2)
    flops = n * (6.0 * 8 * 64 * 32 + 2.0 * conv_dim * 4 + 2.0 * 8 * 64 * (64 + 32))
    state = 2.0 * (8 * 64 * 32 * 2 + conv_dim * 3 * 2)
    assert step._hybrid_time(pre) == pytest.approx(
        3 * max(flops / step.prefill_attn_flops, state / step.prefill_attn_bw), rel=1e-12)


def test_chunked_local_layers_see_only_their_chunk() -> None:
    base = _linear_model(layers=4, linear=0)
    full = dataclasses.replace(base, hybrid=None)
    chunked = dataclasses.replace(base, hybrid=HybridLayers(num_chunked_layers=3, attention_chunk_size=1024))
    f = StepTimeModel(full, H100, runtime=NO_CPU)
    c = StepTimeModel(chunked, H100, runtime=NO_CPU)
    R = 8
    inside = BatchShape.decode(R, R * 1000)  # every context within its first chunk: as full attention
    assert c._layers_attention_time(inside) == pytest.approx(f._layers_attention_time(inside), rel=1e-12)
    beyond = BatchShape.decode(R, R * 50_000)  # a chunk's keys per request, not 50k
    expected = (f._attention_layer(R * 50_000, 0, 0) * 1 + f._attention_layer(R * 1024, 0, 0) * 3
                + f.decode_attn_latency)
    assert c._layers_attention_time(beyond) == pytest.approx(expected, rel=1e-12)


def test_sparse_attention_reads_topk_keys_and_the_indexer_all() -> None:
    shape = BatchShape.decode(4, 4 * 100_000)
    capped = sparse_shape(shape, 2048)
    assert (capped.decode_kv_tokens, capped.num_decodes) == (4 * 2048, 4)
    short = BatchShape.decode(4, 4 * 1000)
    assert sparse_shape(short, 2048) == short
    n, ctx = 1000, 50_000
    pre = BatchShape(n, 1, 1, 0, 0, n, ctx + n, n * ctx + n * (n + 1) // 2)
    got = sparse_shape(pre, 2048)
    assert (got.prefill_attn_pairs, got.prefill_kv_tokens) == (2048 * n, 2048 + n)


def test_deepseek_v32_step_is_dense_mla_over_topk_plus_the_indexer() -> None:
    model = load_model_spec(_bundled("deepseek-ai--DeepSeek-V3.2"))
    dense = dataclasses.replace(model, hybrid=None)
    sparse_step = StepTimeModel(model, H100, runtime=NO_CPU)
    dense_step = StepTimeModel(dense, H100, runtime=NO_CPU)
    R, ctx = 16, 100_000
    shape = BatchShape.decode(R, R * ctx)
    pairs, keys = R * ctx, R * ctx
    assert H100.fp8_flops is not None
    # FP8 q.k over 64 heads of 128, at the prefill attention's efficiency; FP8 keys + a 4-byte scale.
    fp8_rate = H100.fp8_flops * sparse_step.prefill_attn_flops / H100.bf16_flops
    indexer = max(2.0 * 64 * 128 * pairs / fp8_rate, keys * (128 + 4) / sparse_step.decode_attn_bw) * 61
    expected = dense_step._attention_time(BatchShape.decode(R, R * 2048)) + indexer
    assert sparse_step._layers_attention_time(shape) == pytest.approx(expected, rel=1e-12)
    # Long contexts cost the sparse model far less attention than the dense one.
    assert sparse_step._layers_attention_time(shape) < dense_step._layers_attention_time(shape) / 3


def test_a_decode_stretch_prices_each_step_as_stepping_does() -> None:
    for model in (_linear_model(),
                  dataclasses.replace(_linear_model(linear=0),
                                      hybrid=HybridLayers(num_chunked_layers=2, attention_chunk_size=64))):
        step = StepTimeModel(model, H100)
        stretch = step.decode_step_times(8, 8 * 60, 8, 6)
        assert stretch == [step.decode_step_times(8, 8 * 60 + 8 * j, 8, 1)[0] for j in range(6)]
        assert stretch[0] == step.step_time(BatchShape.decode(8, 8 * 60))


def test_hybrid_layers_are_checked() -> None:
    with pytest.raises(UserInputError, match="linear_key_head_dim"):
        HybridLayers(num_linear_layers=2, linear_num_key_heads=1, linear_num_value_heads=1,
                     linear_key_head_dim=0, linear_value_head_dim=1, linear_conv_kernel=4)
    with pytest.raises(UserInputError, match="exceed"):
        _linear_model(layers=2, linear=3)
    with pytest.raises(UserInputError, match="MLA"):
        dataclasses.replace(_linear_model(linear=0), hybrid=HybridLayers(index_topk=8, index_n_heads=1,
                                                                         index_head_dim=8))


def test_mamba2_layers_are_priced_per_token_and_state() -> None:
    # Nemotron-3-Nano's Mamba-2 mixer: 64 heads of 64, state 128, 8 groups, kernel 4, FP32 state.
    h = HybridLayers(num_mamba_layers=2, mamba_num_heads=64, mamba_head_dim=64, mamba_state_size=128,
                     mamba_n_groups=8, mamba_conv_kernel=4, mamba_chunk_size=128, mamba_state_dtype_bytes=4)
    model = dataclasses.replace(_linear_model(linear=0), hybrid=h)
    assert model.num_full_attention_layers == 2
    step = StepTimeModel(model, H100, runtime=NO_CPU)
    conv_dim = 64 * 64 + 2 * 8 * 128
    R = 16
    flops = R * (6.0 * 64 * 64 * 128 + 2.0 * conv_dim * 4)
    state = 2.0 * R * (64 * 64 * 128 * 4 + conv_dim * 3 * 2)
    expected = 2 * max(flops / step.decode_attn_flops, state / step.decode_attn_bw)
    for kv in (R * 10, R * 100_000):
        assert step._hybrid_time(BatchShape.decode(R, kv)) == pytest.approx(expected, rel=1e-12)
    # The mixer's weights replace q/k/v/o in those layers: in_proj (z, x, B, C, dt), conv, A/D/dt bias,
    # norm, out_proj.
    hidden = 1024
    mixer = hidden * (2 * 4096 + 2 * 8 * 128 + 64) + conv_dim * 4 + 3 * 64 + 4096 + 4096 * hidden
    dense = dataclasses.replace(model, hybrid=None)
    assert model.num_params() - dense.num_params() == 2 * (mixer - dense.attn_linear_params_per_layer())


def test_the_step_reads_the_mixers_weights_not_attentions() -> None:
    model = _linear_model()  # 1 full-attention layer, 3 Gated DeltaNet layers
    h = 1024
    attn = h * 8 * 128 + 2 * h * 2 * 128 + 8 * 128 * h
    conv_dim = 2 * 4 * 64 + 8 * 32
    gdn = h * (2 * 4 * 64 + 2 * 8 * 32) + h * 2 * 8 + conv_dim * 4 + 2 * 8 + 32 + 8 * 32 * h
    assert model.mixer_params() == attn + 3 * gdn
    split = weight_split(model, ParallelConfig())
    assert split.quantized == attn + 3 * gdn + 4 * model.dense_mlp_params_per_layer()


def test_sparse_attention_reads_the_backends_fp8_row() -> None:
    # An fp8 cache of DeepSeek Sparse Attention: FlashMLA's fp8_ds_mla row on Hopper (512 fp8
    # values + 4 float32 scales + 64 bf16 RoPE values), FlashInfer's plain fp8 latent on B200;
    # a bf16 cache is the 576-value latent in 2 bytes either way.
    model = load_model_spec(_bundled("deepseek-ai--DeepSeek-V3.2"))
    fp8 = dataclasses.replace(NO_CPU, kv_cache_dtype="fp8")
    assert StepTimeModel(model, H100, runtime=fp8).kv_bytes_per_layer == 512 + 4 * 4 + 64 * 2
    assert StepTimeModel(model, get_hardware("b200"), runtime=fp8).kv_bytes_per_layer == 576
    assert StepTimeModel(model, H100, runtime=NO_CPU).kv_bytes_per_layer == 576 * 2
