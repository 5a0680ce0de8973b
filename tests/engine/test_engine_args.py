"""Engine arguments, KV capacity rules and dtypes of the engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvsched.engine.args import DEFAULT_KV_CACHE_MEMORY, EngineArgs, parse_bytes  # noqa: E402
from kvsched.engine.core import cuda_kv_budget, kv_bytes_per_block, num_kv_blocks  # noqa: E402
from kvsched.engine.llm import LLM  # noqa: E402
from kvsched.model.config import load_model_config  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402

GIB = 1 << 30


@pytest.mark.parametrize(("text", "expected"), [
    (4096, 4096), ("4096", 4096), ("512MiB", 512 << 20), ("2GiB", 2 * GIB), ("1.5 GiB", 3 * GIB // 2),
    ("4G", 4 * 10**9), ("64kib", 64 << 10)])
def test_parse_bytes(text: int | str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-3", 0, True, "4 parsecs"])
def test_parse_bytes_rejects(bad: int | str) -> None:
    with pytest.raises(ValueError, match="kv_cache_memory"):
        parse_bytes(bad)


def test_cuda_budget_is_a_fraction_of_the_device_minus_use_and_activations() -> None:
    # 80 GiB device, 20 GiB in use (weights), 2 GiB activation peak, 0.9 utilisation.
    assert cuda_kv_budget(80 * GIB, 60 * GIB, 2 * GIB, 0.9) == int(80 * GIB * 0.9) - 20 * GIB - 2 * GIB
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        cuda_kv_budget(80 * GIB, 10 * GIB, 0, 0.5)  # 70 GiB used > 40 GiB allowed


def test_cpu_kv_blocks(tiny: Callable[..., Path]) -> None:
    path = tiny(arch="llama")
    config = load_model_config(path)
    per_block = kv_bytes_per_block(config, 16, torch.float32)
    # K and V x 2 layers x 16 tokens x 2 KV heads x head_dim x 4 bytes
    assert per_block == 2 * 2 * 16 * 2 * config.head_dim * 4
    cpu = torch.device("cpu")
    args = EngineArgs.from_kwargs(str(path), kv_cache_memory="1MiB")
    assert num_kv_blocks(args, config, torch.float32, cpu, 10**9) == (1 << 20) // per_block
    args = EngineArgs.from_kwargs(str(path))
    # The default is capped at what max_num_seqs x max_model_len tokens can use, plus the null block.
    assert num_kv_blocks(args, config, torch.float32, cpu, 1000) == -(-1000 // 16) + 1
    assert num_kv_blocks(args, config, torch.float32, cpu, 10**12) == DEFAULT_KV_CACHE_MEMORY // per_block
    args = EngineArgs.from_kwargs(str(path), num_gpu_blocks_override=7, kv_cache_memory="1GiB")
    assert num_kv_blocks(args, config, torch.float32, cpu, 10**9) == 7
    args = EngineArgs.from_kwargs(str(path), kv_cache_memory=per_block)
    with pytest.raises(ValueError, match="two are the minimum"):
        num_kv_blocks(args, config, torch.float32, cpu, 10**9)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_gpu_blocks_override": 1}, "num_gpu_blocks_override"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"device": "tpu"}, "device"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"scheduling_policy": "lifo"}, "policy"),
    ({"max_model_len": 10**6}, "max_model_len"),
    ({"block_size": 0}, "block_size"),
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
])
def test_bad_engine_arguments_fail_before_the_weights_load(
        tiny: Callable[..., Path], tmp_path: Path, kwargs: dict[str, object], match: str) -> None:
    # A checkpoint without weights: loading them first would fail with another error.
    for f in tiny(arch="llama").iterdir():
        if not f.name.endswith(".safetensors"):
            (tmp_path / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match=match):
        LLM(str(tmp_path), **kwargs)
    with pytest.raises(ValueError, match="safetensors"):
        LLM(str(tmp_path))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_engines_run(tiny: Callable[..., Path], dtype: str) -> None:
    llm = LLM(str(tiny(arch="qwen3")), dtype=dtype, kv_cache_memory="4MiB")
    assert llm.engine.dtype == getattr(torch, dtype)
    assert llm.engine.runner.kv_caches[0][0].dtype == getattr(torch, dtype)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8, 9]}] * 3 + [{"prompt_token_ids": list(range(10, 60))}]
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs]
    assert all(len(t) == 6 for t in tokens)
    assert tokens[0] == tokens[1] == tokens[2]  # same prompt, same greedy tokens, whatever the batch


def test_llm_takes_vllms_offline_defaults_for_its_device(tiny: Callable[..., Path]) -> None:
    # LLM_CLASS on a CPU: 4096 tokens, 256 sequences; max_model_len the model's 2048.
    sc = LLM(str(tiny(arch="llama")), kv_cache_memory="1MiB").engine.scheduler_config
    assert (sc.max_num_batched_tokens, sc.max_num_seqs, sc.max_model_len) == (4096, 256, 2048)
    # The default budget is capped at max_num_seqs x max_model_len, as vLLM does.
    sc = LLM(str(tiny(arch="llama")), max_num_seqs=2, max_model_len=64,
             kv_cache_memory="1MiB").engine.scheduler_config
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (128, 2)
    # Chunked prefill off raises the default budget to max_model_len.
    long = str(tiny(arch="llama", max_position_embeddings=8192))
    sc = LLM(long, enable_chunked_prefill=False, kv_cache_memory="1MiB").engine.scheduler_config
    assert (sc.max_num_batched_tokens, sc.max_model_len) == (8192, 8192)


def test_llm_refuses_zero_limits_instead_of_defaulting(tiny: Callable[..., Path]) -> None:
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=0 \(--max-num-batched-tokens\)"):
        LLM(str(tiny(arch="llama")), max_num_batched_tokens=0)
