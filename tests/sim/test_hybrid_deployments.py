"""Llama 4 Scout, DeepSeek-V3.2, GLM-5, Qwen3-Next, Qwen3.5 and Nemotron-3
deployments as the simulator builds them: the KV cache vLLM plans for them
(its defaults), and their other layer kinds handed to the step-time model.
Expected numbers are config.json's and vLLM's planning goldens
(tests/conformance/kv_planning), not the code's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.memory import kv_cache_plan
from kvsched.perf.model_parsers import load_model_spec
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.kv_transfer import transfer_bytes_per_rank
from kvsched.sim.run import run
from kvsched.sim.spec import RunSpec, WorkloadSpec

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "perf" / "data" / "hf_configs"
SCOUT = CONFIGS / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json"
DSV32 = CONFIGS / "deepseek-ai--DeepSeek-V3.2.json"
GLM5 = CONFIGS / "zai-org--GLM-5.json"
GLM52 = CONFIGS / "zai-org--GLM-5.2.json"


def _golden(model: str, block_size: int, tp: int, disable_hma: bool, apc: bool | None = None,
            kv_cache_dtype: str = "auto", sparse_mla_backend: str | None = None,
            release: str = "0_34") -> dict:
    data = json.loads((REPO / f"tests/conformance/kv_planning/vllm_{release}.json").read_text())
    for result in data["results"]:
        c = result["case"]
        if (c["model"], c["block_size"], c["tensor_parallel_size"], c["disable_hybrid_kv_cache_manager"],
                c["kv_cache_dtype"], c["num_gpu_blocks_override"], c.get("sparse_mla_backend")) == (
                    model, block_size, tp, disable_hma, kv_cache_dtype, None, sparse_mla_backend) \
                and apc in (None, c["enable_prefix_caching"]):
            return dict(result["vllm"])
    raise AssertionError(f"no golden for {model} bs{block_size} tp{tp}")


def test_llama4_scout_pages_its_chunked_layers_as_full_attention() -> None:
    # vLLM turns the hybrid KV cache manager off for attention_chunk_size unless
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1: one full-attention group of
    # all 48 layers, the scheduler's plain KV cache manager.
    d = build_deployment(EngineOptions(model=str(SCOUT), hardware="h100", tensor_parallel_size=8,
                                       block_size=64, max_model_len=32768))
    assert d.cache_config.kv_groups == () and d.cache_config.block_size == 64
    # config.json: 48 layers, 8 KV heads of 128 (one per rank at TP 8), bf16 K and V.
    assert d.memory.bytes_per_block == 48 * 64 * 2 * 1 * 128 * 2
    # vLLM's promoted plan at TP 1 (the golden, 8 KV heads a rank) is 8x this block.
    assert _golden("meta-llama/Llama-4-Scout-17B-16E-Instruct", 64, 1, True)["groups"][0]["bytes_per_block"] \
        == 8 * d.memory.bytes_per_block
    assert d.cache_config.num_gpu_blocks == int(d.memory.kv_cache_bytes) // d.memory.bytes_per_block
    # The step-time model prices 3 of every 4 layers as chunked local attention (chunks of 8192).
    hybrid = d.step_model.hybrid
    assert hybrid is not None and (hybrid.num_chunked_layers, hybrid.attention_chunk_size) == (36, 8192)
    assert d.step_model.full_layers == 12


def test_deepseek_v32_blocks_hold_the_indexer_keys() -> None:
    d = build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       block_size=64, max_model_len=32768))
    want = _golden("deepseek-ai/DeepSeek-V3.2", 64, 8, False)
    assert [g["kind"] for g in want["groups"]] == ["mla_attention"]
    assert d.memory.bytes_per_block == want["groups"][0]["bytes_per_block"]
    assert d.cache_config.kv_groups == ()
    hybrid = d.step_model.hybrid
    assert hybrid is not None and hybrid.index_topk == 2048


@pytest.mark.parametrize(("hardware", "backend"),
                         [("h200", "FLASHMLA_SPARSE"), ("b200", "FLASHINFER_MLA_SPARSE")])
def test_deepseek_v32_fp8_kv_cache_is_vllms_sparse_layout(hardware: str, backend: str) -> None:
    # vLLM's sparse MLA backend for an fp8 cache: FlashMLA's on Hopper (fp8_ds_mla, 656 bytes
    # a token), FlashInfer's on Blackwell (plain fp8, 576); the golden's block at TP 1 is the
    # same per rank (the latent and indexer keys are replicated).
    d = build_deployment(EngineOptions(model=str(DSV32), hardware=hardware, tensor_parallel_size=8,
                                       kv_cache_dtype="fp8", max_model_len=32768))
    want = _golden("deepseek-ai/DeepSeek-V3.2", 64, 1, False, kv_cache_dtype="fp8",
                   sparse_mla_backend=backend)
    assert d.cache_config.block_size == 64
    assert d.memory.bytes_per_block == want["groups"][0]["bytes_per_block"] \
        == 61 * 64 * ((656 if hardware == "h200" else 576) + 132)


def test_sparse_attention_takes_64_token_blocks_on_cuda() -> None:
    # The indexer's CUDA kernels read 64-token blocks only: vLLM 0.33's default 16 becomes 64
    # (Platform.update_block_size_for_backend); a given 16 cannot be run.
    d = build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       vllm_version="0.33", max_model_len=32768))
    assert d.cache_config.block_size == 64
    with pytest.raises(UserInputError, match=r"block_size=16 .*multiple of 64"):
        build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       block_size=16, max_model_len=32768))


@pytest.mark.parametrize("release", ["0_33", "0_34"])
def test_glm5_kv_blocks_are_vllms(release: str) -> None:
    # GLM-5 in fp8 (as zai-org/GLM-5-FP8) on 8 B200s: vLLM's GlmMoeDsaForCausalLM hook makes an
    # "auto" cache fp8 on SM100,
    # served by FlashInfer's sparse MLA (plain fp8 latent); 78 latents and 78 indexer caches
    # in one MLA group. The golden plans 61 GiB at TP 1; the same per-rank specs here.
    d = build_deployment(EngineOptions(model=str(GLM5), hardware="b200", tensor_parallel_size=8,
                                       quantization="fp8", vllm_version=release.replace("_", "."),
                                       max_model_len=32768))
    assert d.runtime.kv_cache_dtype == "fp8" and d.cache_config.block_size == 64
    want = _golden("zai-org/GLM-5", 64, 1, False, kv_cache_dtype="fp8",
                   sparse_mla_backend="FLASHINFER_MLA_SPARSE", release=release)
    assert [(g["kind"], g["num_layers"]) for g in want["groups"]] == [("mla_attention", 156)]
    assert d.memory.bytes_per_block == want["groups"][0]["bytes_per_block"] == 78 * 64 * (576 + 132)
    assert d.cache_config.kv_groups == ()
    # The blocks of the KV memory the plan left, as the golden counts them for its memory.
    per_block = want["groups"][0]["bytes_per_block"]
    assert d.cache_config.num_gpu_blocks == int(d.memory.kv_cache_bytes) // per_block
    assert want["num_blocks"] == (61 * 2**30) // want["groups"][0]["bytes_per_block"]
    # Every layer scores its own top-k: 78 indexers priced.
    assert d.step_model.index_layers == 78


def test_glm52_shared_layers_hold_no_indexer_keys() -> None:
    # GLM-5.2: 21 of 78 layers build an indexer (indexer_types); on Hopper, bf16.
    d = build_deployment(EngineOptions(model=str(GLM52), hardware="h200", tensor_parallel_size=8,
                                       quantization="fp8", max_model_len=32768))
    want = _golden("zai-org/GLM-5.2", 64, 8, False)
    assert [(g["kind"], g["num_layers"]) for g in want["groups"]] == [("mla_attention", 99)]
    assert d.memory.bytes_per_block == want["groups"][0]["bytes_per_block"] == 64 * (78 * 1152 + 21 * 132)
    assert d.step_model.index_layers == 21


NEXT = CONFIGS / "Qwen--Qwen3-Next-80B-A3B-Instruct.json"


def test_qwen3_next_without_prefix_caching_keeps_its_state_in_mamba_groups() -> None:
    d = build_deployment(EngineOptions(model=str(NEXT), hardware="h200", tensor_parallel_size=2,
                                       block_size=64, enable_prefix_caching=False, max_model_len=4096))
    cc = d.cache_config
    # config.json: 36 Gated DeltaNet layers, 12 full (every 4th); vLLM groups them 12 a group,
    # the Mamba groups first (layer 0 is linear), as its plan of this model does (the golden).
    golden = _golden("Qwen/Qwen3-Next-80B-A3B-Instruct", 64, 1, False)
    assert [(g.kind, g.num_layers) for g in cc.kv_groups] == \
        [(g["kind"], g["num_layers"]) for g in golden["groups"]]
    # Mamba cache mode "none" without prefix caching: one state block spanning max_model_len.
    assert cc.mamba_cache_mode == "none"
    assert [g.block_size for g in cc.kv_groups if g.kind == "mamba"] == [4096] * 3
    # The attention block holds a state page: per rank, conv 3 x (2 x 16 x 128 + 32 x 128) / 2
    # bf16 + SSM 32 / 2 x 128 x 128 bf16 = 548,864 bytes over 1 KV head x 256 x K,V x 2 bytes
    # = 1024 bytes a token: 64 x cdiv(548864, 64 x 1024) = 576 tokens (alignment max(16, 64)).
    assert [g.block_size for g in cc.kv_groups if g.kind == "full_attention"] == [576]
    assert d.memory.bytes_per_block == 12 * 576 * 1024
    # The scheduler's block: the groups' least common multiple (vLLM's resolve_kv_cache_block_sizes).
    assert cc.block_size == 36864
    hybrid = d.step_model.hybrid
    assert hybrid is not None and hybrid.num_linear_layers == 36


def test_qwen3_next_at_defaults_keeps_a_prefill_checkpoint_block() -> None:
    # vLLM's default for hybrid models: prefix caching on, Mamba cache mode "align"; its GDN
    # layers (FlashInfer's prefill exports mid-prefill states) add a prefill checkpoint block
    # on the prefix-cache grid, the Mamba block.
    d = build_deployment(EngineOptions(model=str(NEXT), hardware="h200", tensor_parallel_size=2,
                                       block_size=64, max_model_len=4096))
    cc = d.cache_config
    assert cc.enable_prefix_caching and cc.mamba_cache_mode == "align"
    # The 576-token block of the test above (a multiple of 64, the GDN checkpoint stride),
    # now shared by every group: align mode pages a Mamba state per attention block.
    assert [(g.kind, g.block_size) for g in cc.kv_groups] == [("mamba", 576)] * 3 + [("full_attention", 576)]
    assert [(g.num_prefill_checkpoint_blocks, g.prefill_checkpoint_alignment)
            for g in cc.kv_groups if g.kind == "mamba"] == [(1, 576)] * 3
    assert all(g.num_prefill_checkpoint_blocks == 0 and g.prefill_checkpoint_alignment is None
               for g in cc.kv_groups if g.kind != "mamba")
    assert cc.block_size == 576
    # vLLM's MambaSpec.max_memory_usage_bytes in align mode: 2 states + the checkpoint block.
    assert d.memory.mamba is not None and d.memory.mamba.state_blocks_per_request == 3


def test_qwen3_next_simulates_prefix_hits_at_defaults() -> None:
    # Prompts of a shared 1200-token prefix and 300 tokens of their own: a later prompt
    # resumes from the Mamba state at 1152 (2 blocks of 576) the first one cached.
    spec = RunSpec(workload=WorkloadSpec(num_prompts=8, random_input_len=300, random_prefix_len=1200,
                                         random_output_len=16, seed=0)).with_engine(
        model=str(NEXT), hardware="h200", tensor_parallel_size=2, max_model_len=4096,
        num_gpu_blocks_override=64)
    result = run(spec)
    assert result.metrics["completed"] == 8
    assert result.prepared.deployment.cache_config.enable_prefix_caching
    assert result.metrics["prefix_cache_hit_rate"] > 0


def test_qwen3_next_simulates_a_run_without_prefix_caching() -> None:
    spec = RunSpec(workload=WorkloadSpec(num_prompts=16, random_input_len=1500, random_output_len=32,
                                         seed=0)).with_engine(
        model=str(NEXT), hardware="h200", tensor_parallel_size=2, max_model_len=4096,
        enable_prefix_caching=False, num_gpu_blocks_override=16)
    result = run(spec)
    # 15 usable blocks: a request of ~1530 tokens holds 3 attention blocks of 576 tokens and one
    # state block (mode "none": one spanning max_model_len) in each of the 3 Mamba groups: 6
    # blocks, so 2 run at once and hold 12 of the 15.
    assert result.metrics["completed"] == 16
    assert result.metrics["mean_batch_size"] == 2.0
    assert result.metrics["max_kv_cache_usage"] == pytest.approx(12 / 15)


QWEN3_5 = CONFIGS / "Qwen--Qwen3.5-27B.json"
NANO = CONFIGS / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"
# (config, the planning goldens' name): compared at the goldens' TP 1, block size 64 and
# max_model_len (the "none" mode's Mamba block spans it), on an H200.
STATE_HYBRIDS = [(QWEN3_5, "Qwen/Qwen3.5-27B"), (NANO, "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")]


def _groups(golden: dict) -> list[tuple[str, int, int]]:
    return [(g["kind"], g["num_layers"], g["block_size"]) for g in golden["groups"]]


@pytest.mark.parametrize(("config", "name"), STATE_HYBRIDS)
def test_qwen3_5_and_nemotron_3_kv_groups_are_vllms(config: Path, name: str) -> None:
    # Without prefix caching: the deployment's groups, block sizes and block bytes are vLLM's plan.
    d = build_deployment(EngineOptions(model=str(config), hardware="h200", tensor_parallel_size=1,
                                       block_size=64, enable_prefix_caching=False, max_model_len=32768))
    golden = _golden(name, 64, 1, False, apc=False)
    cc = d.cache_config
    assert [(g.kind, g.num_layers, g.block_size) for g in cc.kv_groups] == _groups(golden)
    assert d.memory.bytes_per_block == golden["groups"][0]["bytes_per_block"]
    assert cc.mamba_cache_mode == "none"
    # At vLLM's default (prefix caching on, align mode) the memory plan is vLLM's too, and the
    # Mamba groups keep vLLM's prefill checkpoint block: Gated DeltaNet on the Mamba block's
    # grid, MambaMixer2 at any token (alignment 1).
    default = _golden(name, 64, 1, False, apc=True)
    plan = kv_cache_plan(d.model, d.model.num_layers, 0, 64, 1, 2, 0, float(61 * 2**30),
                         max_model_len=32768)
    assert [(g.kind, g.num_layers, g.block_size) for g in plan.groups] == _groups(default)
    assert plan.num_blocks == _golden_blocks(name, 61 * 2**30)
    on = build_deployment(EngineOptions(model=str(config), hardware="h200", tensor_parallel_size=1,
                                        block_size=64, max_model_len=32768)).cache_config
    assert on.mamba_cache_mode == "align" and on.enable_prefix_caching
    mamba = [g for g in on.kv_groups if g.kind == "mamba"]
    assert mamba and all(g.num_prefill_checkpoint_blocks == 1 for g in mamba)
    alignment = 1 if config == NANO else mamba[0].block_size
    assert all(g.prefill_checkpoint_alignment == alignment for g in mamba)


def _golden_blocks(model: str, available: int) -> int:
    data = json.loads((REPO / "tests/conformance/kv_planning/vllm_0_34.json").read_text())
    for result in data["results"]:
        c = result["case"]
        if (c["model"], c["block_size"], c["tensor_parallel_size"], c["available_bytes"],
                c["enable_prefix_caching"], c["disable_hybrid_kv_cache_manager"], c["kv_cache_dtype"],
                c["num_gpu_blocks_override"]) == (model, 64, 1, available, True, False, "auto", None):
            return int(result["vllm"]["num_blocks"])
    raise AssertionError(f"no golden for {model} with {available} bytes")


def test_nemotron_3_prices_each_layer_by_its_block() -> None:
    d = build_deployment(EngineOptions(model=str(NANO), hardware="h200", tensor_parallel_size=1,
                                       enable_prefix_caching=False, max_model_len=4096))
    # hybrid_override_pattern: 23 Mamba-2 mixers ('M'), 6 attention layers ('*'), 23 MoE blocks
    # ('E'), each a layer alone: attention and KV only where '*', experts only where 'E'.
    step, h = d.step_model, d.model.hybrid
    assert h is not None
    assert (h.num_mamba_layers, h.num_mixer_only_layers, h.num_mlp_only_layers) == (23, 29, 23)
    assert (step.full_layers, step.moe_layers, d.model.num_dense_layers) == (6, 23, 0)
    # One all-reduce a layer (52), not two.
    assert step.num_blocks == 52
    # SSM state in float32 (config.json's mamba_ssm_cache_dtype).
    assert h.mamba_state_dtype_bytes == 4


@pytest.mark.parametrize(("config", "name"), STATE_HYBRIDS)
def test_qwen3_5_and_nemotron_3_simulate_without_prefix_caching(config: Path, name: str) -> None:
    spec = RunSpec(workload=WorkloadSpec(num_prompts=8, random_input_len=700, random_output_len=16,
                                         seed=0)).with_engine(
        model=str(config), hardware="h200", tensor_parallel_size=1, max_model_len=4096,
        enable_prefix_caching=False)
    result = run(spec)
    assert result.metrics["completed"] == 8
    assert result.prepared.deployment.cache_config.mamba_cache_mode == "none"


def test_qwen3_5_runs_images_through_its_vision_tower() -> None:
    # Qwen3.5's vision tower is Qwen3-VL's (kvsched.perf.vision): each random-mm image becomes
    # prompt tokens beside the text, encoded before its prefill.
    spec = RunSpec(workload=WorkloadSpec(dataset_name="random-mm", num_prompts=4, random_input_len=64,
                                         random_output_len=8, seed=0)).with_engine(
        model=str(QWEN3_5), hardware="h200", tensor_parallel_size=1, max_model_len=4096,
        enable_prefix_caching=False)
    result = run(spec)
    assert result.metrics["completed"] == 4
    requests = result.prepared.workload.requests
    assert all(len(r.mm_items) == 1 and r.num_prompt_tokens > r.mm_items[0].length for r in requests)


def test_pd_transfer_moves_every_layers_kv_and_the_indexer_keys() -> None:
    h200, b200 = get_hardware("h200"), get_hardware("b200")
    # Llama 4 Scout at TP 8: all 48 layers hold every token (vLLM's hybrid manager off),
    # 1 KV head of 128 a rank, K and V in bf16.
    scout = load_model_spec(SCOUT, "meta-llama/Llama-4-Scout-17B-16E-Instruct")
    assert transfer_bytes_per_rank(scout, 2, 8, 1000, h200) == 48 * 1000 * 2 * 1 * 128 * 2
    # DeepSeek-V3.2: 61 layers of a 576-value bf16 latent plus 128 fp8 indexer bytes and a 4-byte scale.
    dsv32 = load_model_spec(DSV32, "deepseek-ai/DeepSeek-V3.2")
    assert transfer_bytes_per_rank(dsv32, 2, 8, 1000, h200) == 61 * 1000 * (576 * 2 + 128 + 4)
    # An fp8 cache: FlashMLA's fp8_ds_mla row on Hopper (512 fp8 + 4 float32 scales + 64 bf16
    # RoPE values = 656 bytes), FlashInfer's plain fp8 latent (576) on B200.
    assert transfer_bytes_per_rank(dsv32, 1, 8, 1000, h200) == 61 * 1000 * (656 + 132)
    assert transfer_bytes_per_rank(dsv32, 1, 8, 1000, b200) == 61 * 1000 * (576 + 132)
    # GLM-5.2: indexer keys on its 21 indexer layers only.
    glm52 = load_model_spec(GLM52, "zai-org/GLM-5.2")
    assert transfer_bytes_per_rank(glm52, 2, 8, 1000, h200) == 1000 * (78 * 576 * 2 + 21 * 132)
    nxt = load_model_spec(NEXT, "Qwen/Qwen3-Next-80B-A3B-Instruct")
    with pytest.raises(UserInputError, match="--disaggregation"):
        transfer_bytes_per_rank(nxt, 2, 2, 1000, h200)


def test_drafter_layers_share_the_blocks_as_the_targets_layers() -> None:
    # DeepSeek-V3.2's MTP layer is a V3.2 decoder layer (vLLM's deepseek_mtp.py): its block
    # holds a latent and indexer page too, 62 layers of 64 x (576 x 2 + 128 + 4) bytes.
    d = build_deployment(EngineOptions(model=str(DSV32), hardware="h200", tensor_parallel_size=8,
                                       block_size=64,
                                       speculative_config='{"method": "mtp", "num_speculative_tokens": 1}',
                                       max_model_len=8192))
    assert d.memory.bytes_per_block == 62 * 64 * (576 * 2 + 128 + 4)
    # Llama 4 Scout with an EAGLE-3 head: one more full-attention layer (1 KV head of 128 a rank).
    d = build_deployment(EngineOptions(model=str(SCOUT), hardware="h200", tensor_parallel_size=8,
                                       block_size=64,
                                       speculative_config='{"method": "eagle3", "model": "x/eagle3", '
                                                          '"num_speculative_tokens": 2}', max_model_len=8192))
    assert d.cache_config.kv_groups == ()
    assert d.memory.bytes_per_block == 49 * 64 * 2 * 1 * 128 * 2


def test_glm5_simulates_a_run_in_its_planned_blocks() -> None:
    spec = RunSpec(workload=WorkloadSpec(num_prompts=8, random_input_len=1000, random_output_len=16,
                                         seed=0)).with_engine(
        model=str(GLM5), hardware="b200", tensor_parallel_size=8, quantization="fp8", max_model_len=4096)
    result = run(spec)
    assert result.metrics["completed"] == 8
    d = result.prepared.deployment
    want = _golden("zai-org/GLM-5", 64, 1, False, kv_cache_dtype="fp8",
                   sparse_mla_backend="FLASHINFER_MLA_SPARSE")
    assert d.memory.bytes_per_block == want["groups"][0]["bytes_per_block"]


def test_qwen3_next_start_up_check_counts_the_checkpoint_block() -> None:
    # vLLM's start-up check: one max_model_len request must fit beside the null block. At
    # 4096 tokens in 576-token blocks: 8 full-attention blocks, and per Mamba group
    # MambaSpec.max_memory_usage_bytes' 2 states + 1 checkpoint block (align mode): 8 + 3 x 3 = 17.
    opts = {"model": str(NEXT), "hardware": "h200", "tensor_parallel_size": 2, "max_model_len": 4096}
    build_deployment(EngineOptions(**opts, num_gpu_blocks_override=18))
    with pytest.raises(UserInputError, match="needs 17 KV blocks"):
        build_deployment(EngineOptions(**opts, num_gpu_blocks_override=17))


def test_sparse_attention_is_refused_where_vllm_has_no_sparse_mla_backend() -> None:
    # vLLM's sparse MLA backends need compute capability 9.x, 10.x or 12.x: DeepSeek-V3.2 on
    # A100s does not start.
    with pytest.raises(UserInputError, match=r"compute capability 8\.x.*sparse MLA backend"):
        build_deployment(EngineOptions(model=str(DSV32), hardware="a100-80gb", tensor_parallel_size=8,
                                       max_model_len=4096))


def test_kv_cache_size_is_vllms_logged_one() -> None:
    # vLLM logs "KV cache size: N tokens, Maximum concurrency ...: Cx" with C = the pool's blocks
    # over one max_model_len request's blocks summed over its groups. Qwen3-Next at 4096 tokens:
    # 17 blocks a request (8 full-attention + 3 Mamba groups x 3), so 170 blocks are 10 requests.
    opts = {"model": str(NEXT), "hardware": "h200", "tensor_parallel_size": 2, "max_model_len": 4096}
    d = build_deployment(EngineOptions(**opts, num_gpu_blocks_override=170))
    assert d.kv_cache_size() == (40960, 10.0)
    assert "KV cache size 40,960 tokens, maximum concurrency 10.00x" in d.describe()
    # One full-attention group: 8192 tokens are 512 blocks of 16, so 1000 blocks are 1.953125.
    d = build_deployment(EngineOptions(model="meta-llama/Llama-3.1-8B-Instruct", hardware="h100",
                                       block_size=16, max_model_len=8192, num_gpu_blocks_override=1000))
    assert d.kv_cache_size() == (16000, 1000 / 512)
