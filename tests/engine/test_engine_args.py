"""Engine arguments, KV capacity rules and dtypes of the engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvsched.config import MAX_NUM_GPU_BLOCKS  # noqa: E402
from kvsched.engine.args import (  # noqa: E402
    DEFAULT_KV_CACHE_MEMORY,
    MAX_SEED,
    MIN_SEED,
    EngineArgs,
    check_seed,
    parse_bytes,
)
from kvsched.engine.core import (  # noqa: E402
    check_kv_cache,
    cuda_kv_budget,
    host_available_memory,
    kv_bytes_per_block,
    num_kv_blocks,
    weight_bytes,
)
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
    args = EngineArgs.from_kwargs(str(path), kv_cache_memory="1MiB", block_size=16).with_cache_defaults("cpu")
    assert num_kv_blocks(args, config, torch.float32, cpu, 10**9) == (1 << 20) // per_block
    # Unset, the block size is the default release's (vLLM 0.34) on a CPU: its
    # 64 is a multiple of 32, a size CPU_ATTN takes, so it stays 64 (0.33's 16
    # became 32: test_scheduler_defaults covers the backend's rounding).
    args = EngineArgs.from_kwargs(str(path)).with_cache_defaults("cpu")
    assert args.block_size == 64
    per_block_64 = kv_bytes_per_block(config, 64, torch.float32)
    # The default is capped at what max_num_seqs x max_model_len tokens can use, plus the null block.
    assert num_kv_blocks(args, config, torch.float32, cpu, 1000) == -(-1000 // 64) + 1
    assert num_kv_blocks(args, config, torch.float32, cpu, 10**12) == DEFAULT_KV_CACHE_MEMORY // per_block_64
    args = EngineArgs.from_kwargs(str(path), num_gpu_blocks_override=7, kv_cache_memory="1GiB")
    assert num_kv_blocks(args, config, torch.float32, cpu, 10**9) == 7
    args = EngineArgs.from_kwargs(str(path), kv_cache_memory=per_block,
                                  block_size=16).with_cache_defaults("cpu")
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


# -- the KV cache's bounds: what the machine holds and the block pool ---------------

def test_kv_cache_is_checked_against_the_memory_available(tiny: Callable[..., Path]) -> None:
    path = str(tiny(arch="llama"))
    cpu = torch.device("cpu")
    per_block = 8192  # the bytes of one block, given (nothing is allocated here)
    where = "of RAM available on this machine (MemAvailable)"
    given = EngineArgs.from_kwargs(path, kv_cache_memory="10TB", block_size=16).with_cache_defaults("cpu")
    # 1,000 blocks of 8 KiB, 48 bytes of pool each, 1 MiB of weights: 9,288,576 bytes.
    check_kv_cache(given, cpu, 1000, per_block, 1 << 20, 9_288_576, where)  # exactly fits
    with pytest.raises(ValueError) as info:
        check_kv_cache(given, cpu, 1000, per_block, 1 << 20, 9_288_575, where)
    message = str(info.value)
    assert message.startswith("kv_cache_memory=10000000000000 (--kv-cache-memory, 9,313.23 GiB): "
                              "1,000 KV blocks of 8,192 bytes and the weights (1.00 MiB) need 8.86 MiB, "
                              "more than the 8.86 MiB of RAM available on this machine (MemAvailable); ")
    assert message.endswith("give at most 7.80 MiB")  # 999 blocks of 8 KiB
    override = EngineArgs.from_kwargs(path, num_gpu_blocks_override=1000)
    with pytest.raises(ValueError, match=r"^num_gpu_blocks_override=1000 \(--num-gpu-blocks-override\): "
                                         r".*; lower it to at most 999$"):
        check_kv_cache(override, cpu, 1000, per_block, 1 << 20, 9_288_575, where)
    default = EngineArgs.from_kwargs(path)
    with pytest.raises(ValueError, match=r"^the default KV cache .*pass --kv-cache-memory of at most "
                                         r"7\.80 MiB, or lower --max-num-seqs or --max-model-len$"):
        check_kv_cache(default, cpu, 1000, per_block, 1 << 20, 9_288_575, where)
    # On CUDA the pool is host memory: the device holds K/V and weights only
    # (a torch.device names CUDA without needing one).
    cuda = torch.device("cuda")
    check_kv_cache(given, cuda, 1000, per_block, 1 << 20, 1000 * per_block + (1 << 20), "free")
    with pytest.raises(ValueError, match=r"more than the 8\.81 MiB free; give at most 7\.80 MiB$"):
        check_kv_cache(given, cuda, 1000, per_block, 1 << 20, 1000 * per_block + (1 << 20) - 1, "free")
    # Unknown memory: only the block pool's bound (2**24 blocks).
    check_kv_cache(given, cpu, MAX_NUM_GPU_BLOCKS, 1, 0, None, where)
    with pytest.raises(ValueError, match=r"16,777,217 KV blocks of 16 tokens, above the 16,777,216 a "
                                         r"block pool holds .*raise --block-size"):
        check_kv_cache(given, cpu, MAX_NUM_GPU_BLOCKS + 1, 1, 0, None, where)


def test_weight_bytes_are_the_checkpoints_tensors_in_the_dtype(tiny: Callable[..., Path]) -> None:
    path = tiny(arch="llama")
    config = load_model_config(path)
    model = LLM(str(path), kv_cache_memory="1MiB").engine.model
    params = sum(p.numel() for p in model.parameters())
    assert weight_bytes(config, torch.float32) == 4 * params
    assert weight_bytes(config, torch.bfloat16) == 2 * params


def test_host_available_memory_is_a_plausible_byte_count() -> None:
    available = host_available_memory()
    assert available is not None  # Linux: /proc/meminfo
    assert 2**20 < available < 2**50


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kv_cache_is_allocated_once_in_the_model_dtype(tiny: Callable[..., Path], dtype: str) -> None:
    # --kv-cache-memory 1GiB measured 1.32 GB max RSS against 0.27 GB with two
    # blocks: the cache itself is 1 GiB, the rest is Python and torch. Here:
    # the tensors the runner holds are num_blocks blocks of the model's dtype.
    path = tiny(arch="llama")
    llm = LLM(str(path), dtype=dtype, kv_cache_memory="4MiB")
    engine = llm.engine
    # On a CPU, the default release's (vLLM 0.34) block is 64 tokens, a size
    # CPU_ATTN (multiples of 32) takes.
    assert engine.cache_config.block_size == 64
    per_block = kv_bytes_per_block(engine.model_config, 64, getattr(torch, dtype))
    held = sum(t.numel() * t.element_size() for pair in engine.runner.kv_caches for t in pair)
    assert engine.cache_config.num_gpu_blocks == (4 << 20) // per_block
    assert held == engine.cache_config.num_gpu_blocks * per_block <= 4 << 20
    assert {t.dtype for pair in engine.runner.kv_caches for t in pair} == {getattr(torch, dtype)}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"seed": 2**64}, r"seed=18446744073709551616: outside the seeds torch takes"),
    ({"seed": -(2**63) - 1}, r"seed=-9223372036854775809: outside"),
    ({"seed": None}, r"seed=None: must be an integer"),
    ({"seed": 1.5}, r"seed=1.5: must be an integer"),
    ({"block_size": 4097}, r"block_size=4097 \(--block-size\): must be an integer in \[1, 4096\]"),
    ({"max_num_seqs": 2**24 + 1}, r"max_num_seqs=16777217 \(--max-num-seqs\): must be at most 16,777,216"),
    ({"num_gpu_blocks_override": 2**24 + 1}, r"num_gpu_blocks_override=16777217: must be at most"),
    ({"kv_cache_memory": "lots"}, r"kv_cache_memory='lots' \(--kv-cache-memory\): not a size"),
])
def test_engine_arguments_are_bounded(tiny: Callable[..., Path], kwargs: dict[str, object],
                                      match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineArgs.from_kwargs(str(tiny(arch="llama")), **kwargs)


def test_seeds_at_torchs_limits_are_taken(tiny: Callable[..., Path]) -> None:
    path = str(tiny(arch="llama"))
    for seed in (MIN_SEED, MAX_SEED):
        assert EngineArgs.from_kwargs(path, seed=seed).seed == seed
        check_seed("sampling_params.seed", seed)
    llm = LLM(path, kv_cache_memory="1MiB")
    with pytest.raises(ValueError, match=r"sampling_params.seed=<a 31-digit integer>: outside"):
        llm.generate("hi", SamplingParams(seed=10**30), use_tqdm=False)
    assert not llm.has_unfinished_requests()
