"""kvsched.perf.kv_cache_planning against vLLM's own planning code.

The goldens (tests/conformance/kv_planning/vllm_0_3{3,4}.json) are written by
tests/conformance/kv_planning_oracle.py in each reference venv: vLLM's
get_kv_cache_groups / get_kv_cache_config_from_groups over vLLM's spec
classes, for gpt-oss-120b, Gemma 3 27B, Llama 4 Scout, Qwen3-Next-80B, Qwen3.5 (27B and
35B-A3B: float32 recurrent state), Nemotron-H (8B-Base-8K and Nemotron-3-Nano-30B), Llama 3.1 8B,
DeepSeek-V3 and DeepSeek-V3.2 at both releases' default
block sizes, two memory sizes, the hybrid manager on and off, prefix
caching on and off, TP 8 and num_gpu_blocks_override.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.config import KVCacheGroup
from kvsched.errors import UserInputError
from kvsched.perf.kv_cache_planning import (
    CHUNKED,
    FULL,
    MAMBA,
    MLA,
    SLIDING,
    LayerSpec,
    blocks_per_request,
    model_kv_layout,
    plan_kv_cache,
    plan_kv_cache_groups,
    resolve_disable_hybrid_kv_cache_manager,
    resolve_mamba_cache,
)
from kvsched.perf.step_time import kv_cache_dtype_bytes

REPO = Path(__file__).resolve().parents[2]
GOLDENS = REPO / "tests" / "conformance" / "kv_planning"


def _results(release: str) -> list[dict]:
    data = json.loads((GOLDENS / f"vllm_{release}.json").read_text())
    assert data["vllm_version"] == release.replace("_", ".") + ".0"
    return list(data["results"])


def _case_id(result: dict) -> str:
    c = result["case"]
    return (f"{c['model'].split('/')[1]}-bs{c['block_size']}-tp{c['tensor_parallel_size']}-"
            f"{c['available_bytes'] // 2**30}GiB-"
            f"{'nohma' if c['disable_hybrid_kv_cache_manager'] else 'hma'}-"
            f"{'apc' if c['enable_prefix_caching'] else 'noapc'}-ovr{c['num_gpu_blocks_override']}-"
            f"{c['kv_cache_dtype']}")


CASES = [pytest.param(result, id=f"{release}-{_case_id(result)}")
         for release in ("0_33", "0_34") for result in _results(release)]


def _kvsched_plan(case: dict) -> dict:
    data = json.loads((REPO / case["config"]).read_text())
    layout = model_kv_layout(data, block_size=case["block_size"],
                             tensor_parallel_size=case["tensor_parallel_size"],
                             enable_prefix_caching=case["enable_prefix_caching"],
                             kv_cache_bytes=kv_cache_dtype_bytes(case["kv_cache_dtype"]),
                             max_model_len=case["max_model_len"],
                             fp8_ds_mla=case.get("sparse_mla_backend", "FLASHMLA_SPARSE")
                             == "FLASHMLA_SPARSE")
    try:
        plan = plan_kv_cache(layout.layers, case["available_bytes"],
                             disable_hybrid_kv_cache_manager=case["disable_hybrid_kv_cache_manager"],
                             num_gpu_blocks_override=case["num_gpu_blocks_override"])
    except UserInputError as err:
        return {"error": str(err)}
    mamba = layout.mamba
    needed = blocks_per_request(plan.kv_groups(), max_model_len=case["max_model_len"],
                                max_in_flight_tokens=case["max_in_flight_tokens"],
                                mamba_state_blocks=mamba.state_blocks_per_request if mamba else 0)
    return {"groups": [{"kind": g.kind, "num_layers": g.num_layers, "block_size": g.block_size,
                        "bytes_per_block": g.bytes_per_block, "sliding_window": g.sliding_window,
                        "attention_chunk_size": g.attention_chunk_size} for g in plan.groups],
            "num_blocks": plan.num_blocks, "blocks_per_request": needed,
            "attention_block_size": layout.block_size,
            "mamba_cache_mode": mamba.mamba_cache_mode if mamba else None,
            "mamba_block_size": mamba.mamba_block_size if mamba else None,
            "mamba_page_size_padded": mamba.mamba_page_size_padded if mamba else None}


@pytest.mark.parametrize("result", CASES)
def test_plan_equals_vllms(result: dict) -> None:
    want, got = result["vllm"], _kvsched_plan(result["case"])
    if "error" in want:
        # vLLM refuses a Mamba hybrid without the hybrid manager; so does kvsched, with the flag named.
        assert "Failed to promote" in want["error"]
        assert "error" in got and "--disable-hybrid-kv-cache-manager" in got["error"]
        return
    assert got == want


def test_goldens_cover_the_models_both_releases() -> None:
    for release in ("0_33", "0_34"):
        models = {r["case"]["model"] for r in _results(release)}
        assert models == {"openai/gpt-oss-120b", "google/gemma-3-27b-it",
                          "meta-llama/Llama-4-Scout-17B-16E-Instruct",
                          "Qwen/Qwen3-Next-80B-A3B-Instruct", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
                          "nvidia/Nemotron-H-8B-Base-8K", "meta-llama/Llama-3.1-8B",
                          "deepseek-ai/DeepSeek-V3",
                          "deepseek-ai/DeepSeek-V3.2", "Qwen/Qwen3.5-27B", "Qwen/Qwen3.5-35B-A3B",
                          "zai-org/GLM-5", "zai-org/GLM-5.2"}


# -- hand-computed cases ------------------------------------------------------------


def test_group_size_rule_pads_the_short_bucket() -> None:
    # docs/hybrid_kv_cache.md's example: 10 full + 20 sliding -> group size 10,
    # one full group and two sliding groups of 10 layers; 2 KiB per token per layer.
    full = LayerSpec(FULL, 16, 2048)
    swa = LayerSpec(SLIDING, 16, 2048, sliding_window=128)
    groups = plan_kv_cache_groups([full, swa, swa] * 10)
    assert [(g.kind, g.num_layers) for g in groups] == [(FULL, 10), (SLIDING, 10), (SLIDING, 10)]
    # 12 sliding + 13 full (gpt-oss-20b with an EAGLE layer): 13 < 1.5 x 12, so groups of 13.
    groups = plan_kv_cache_groups([swa] * 12 + [full] * 13)
    assert [(g.kind, g.num_layers) for g in groups] == [(SLIDING, 12), (FULL, 13)]
    # A block id is the largest group's pages: 13 layers x 16 tokens x 2048 bytes.
    assert plan_kv_cache([swa] * 12 + [full] * 13, 13 * 16 * 2048 * 7 + 5).num_blocks == 7


def test_smaller_page_grows_its_block_size() -> None:
    # Pages of 32 KiB (full, 2 KiB/token) and 16 KiB (sliding, 1 KiB/token): the sliding block doubles.
    groups = plan_kv_cache_groups([LayerSpec(FULL, 16, 2048),
                                   LayerSpec(SLIDING, 16, 1024, sliding_window=64)])
    assert [(g.kind, g.block_size, g.bytes_per_block) for g in groups] == \
        [(FULL, 16, 32768), (SLIDING, 32, 32768)]


def test_mla_page_that_does_not_divide_is_refused() -> None:
    # 1152-byte latent next to a 1000-byte sliding page: not one type, MLA cannot be padded.
    with pytest.raises(UserInputError, match="MLA pages cannot be padded"):
        plan_kv_cache_groups([LayerSpec(MLA, 16, 1000), LayerSpec(SLIDING, 16, 1152, sliding_window=8)])


def test_disable_hybrid_promotes_local_layers() -> None:
    full = LayerSpec(FULL, 16, 2048)
    chunked = LayerSpec(CHUNKED, 16, 2048, attention_chunk_size=8192)
    plan = plan_kv_cache([chunked, chunked, chunked, full], 4 * 16 * 2048 * 3,
                         disable_hybrid_kv_cache_manager=True)
    assert [(g.kind, g.num_layers) for g in plan.groups] == [(FULL, 4)] and plan.num_blocks == 3
    assert plan.kv_groups() == (KVCacheGroup("full_attention", 16, 4),)


def test_attention_free_model_keeps_the_null_block() -> None:
    plan = plan_kv_cache([], 10**9)
    assert (plan.groups, plan.num_blocks) == ((), 1)


def test_mamba_block_size_by_hand() -> None:
    # Qwen3-Next at TP 1: conv 3 x 8192 bf16 + SSM 32 x 128 x 128 bf16 = 1,097,728 bytes;
    # attention 2 KV heads x 256 x 2 (K, V) x 2 bytes = 2048 bytes/token.
    state = 3 * 8192 * 2 + 32 * 128 * 128 * 2
    # align mode, 64-token GDN checkpoints: 64 x cdiv(1097728, 64 x 2048) = 576.
    on = resolve_mamba_cache(block_size=16, enable_prefix_caching=True, max_model_len=4096,
                             attention_bytes_per_token=2048, mamba_state_bytes=state, checkpoint_alignment=64)
    assert (on.block_size, on.mamba_cache_mode, on.mamba_block_size, on.mamba_page_size_padded) == \
        (576, "align", 576, 576 * 2048)
    # Without prefix caching: 16 x cdiv(1097728, 16 x 2048) = 544; one state per request.
    off = resolve_mamba_cache(block_size=16, enable_prefix_caching=False, max_model_len=4096,
                              attention_bytes_per_token=2048, mamba_state_bytes=state,
                              checkpoint_alignment=64)
    assert (off.block_size, off.mamba_cache_mode, off.mamba_block_size) == (544, "none", 4096)
    groups = plan_kv_cache_groups([LayerSpec(MAMBA, 4096, state_bytes=state, page_size_padded=544 * 2048),
                                   LayerSpec(FULL, 544, 2048)])
    assert [(g.kind, g.block_size, g.bytes_per_block) for g in groups] == [(MAMBA, 4096, 544 * 2048),
                                                                          (FULL, 544, 544 * 2048)]


def test_unknown_model_type_is_refused_with_the_list() -> None:
    with pytest.raises(UserInputError, match=r"model_type='bogus' is not supported; supported: bloom"):
        model_kv_layout({"model_type": "bogus", "num_hidden_layers": 2}, block_size=16)


def test_bad_hybrid_fields_name_the_field() -> None:
    nemotron = {"model_type": "nemotron_h", "num_hidden_layers": 3, "hybrid_override_pattern": "M*",
                "num_key_value_heads": 2, "head_dim": 128}
    with pytest.raises(UserInputError, match=r"hybrid_override_pattern='M\*'.*one character per layer"):
        model_kv_layout(nemotron, block_size=16)
    # Llama 4 is read by its model parser (kvsched.perf.model_parsers), which checks the shape first.
    llama4 = {"model_type": "llama4_text", "num_hidden_layers": 2, "num_key_value_heads": 8, "head_dim": 128,
              "hidden_size": 5120, "num_attention_heads": 40, "attention_chunk_size": 8192,
              "no_rope_layers": [1, 2]}
    with pytest.raises(UserInputError, match=r"no_rope_layers.*2 flags"):
        model_kv_layout(llama4, block_size=16)


def test_blocks_one_request_may_hold_per_group() -> None:
    # max_model_len 32768, 8192 tokens in flight, 16-token blocks: full attention
    # 2048; sliding (window 128) cdiv(127 + 8192, 16) + 1 = 521; chunked (8192)
    # cdiv(8192 + 8192, 16) = 1024.
    groups = (KVCacheGroup("full_attention", 16, 1),
              KVCacheGroup("sliding_window", 16, 1, sliding_window=128),
              KVCacheGroup("chunked_local_attention", 16, 1, attention_chunk_size=8192))
    assert blocks_per_request(groups, max_model_len=32768, max_in_flight_tokens=8192) == 2048 + 521 + 1024
    # Capped by max_model_len: a short context holds its whole length in each group (+1 sliding).
    assert blocks_per_request(groups, max_model_len=100, max_in_flight_tokens=8192) == 7 + 8 + 7


def test_sparse_mla_fp8_latent_per_backend() -> None:
    # vLLM's fp8 latent for DeepSeek Sparse Attention: FlashMLA's fp8_ds_mla row of
    # 512 fp8 values + 4 float32 scales + 64 16-bit RoPE values = 656 bytes, or FlashInfer's
    # plain 576; the indexer keys (128 fp8 + one float32 scale) are 132 bytes either way.
    data = json.loads((REPO / "tests/perf/data/hf_configs/deepseek-ai--DeepSeek-V3.2.json").read_text())
    for fp8_ds_mla, latent in ((True, 656), (False, 576)):
        layout = model_kv_layout(data, block_size=64, kv_cache_bytes=1, fp8_ds_mla=fp8_ds_mla)
        assert {spec.bytes_per_token for spec in layout.layers} == {latent, 132}


def test_glm52_shared_indexer_layers_hold_no_indexer_keys() -> None:
    # GLM-5.2: 78 latents, an indexer key cache on the 21 layers that build one.
    data = json.loads((REPO / "tests/perf/data/hf_configs/zai-org--GLM-5.2.json").read_text())
    layers = model_kv_layout(data, block_size=64).layers
    assert [spec.bytes_per_token for spec in layers].count(132) == 21 and len(layers) == 99


def test_hybrid_manager_default_follows_vllms_rule() -> None:
    resolve = resolve_disable_hybrid_kv_cache_manager
    # Sliding windows (gpt-oss, Gemma): on by default; off with a connector lacking HMA support.
    assert resolve(None, attention_chunk_size=False) is False
    assert resolve(None, attention_chunk_size=False, connector_supports_hma=False) is True
    # Llama 4's chunked local attention: off unless the environment allows it, and always with EAGLE.
    assert resolve(None, attention_chunk_size=True) is True
    assert resolve(None, attention_chunk_size=True, allow_chunked_local_with_hybrid=True) is False
    assert resolve(None, attention_chunk_size=True, allow_chunked_local_with_hybrid=True,
                   target_hidden_state_drafter=True) is True
    # An explicit disable is kept; an explicit enable where vLLM needs it off is refused.
    assert resolve(True, attention_chunk_size=False) is True
    with pytest.raises(UserInputError, match="VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE"):
        resolve(False, attention_chunk_size=True)
