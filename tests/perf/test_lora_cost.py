"""kvsched.perf.lora: vLLM's LoRA rules, adapter sizes, kernel and load prices, the adapter caches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.lora import (
    Adapter,
    AdapterCaches,
    LoraPricer,
    check_lora_options,
    lora_cost,
    parse_lora_modules,
)
from kvsched.perf.model_catalog import get_model

LLAMA = "meta-llama/Llama-3.1-8B"


def cost(rank: int = 16, tp: int = 1, max_loras: int = 2, max_cpu: int | None = None,
         adapters: tuple[Adapter, ...] = (), fully_sharded: bool = False):  # type: ignore[no-untyped-def]
    return lora_cost(get_model(LLAMA), get_hardware("h100-sxm"), tp, max_loras, rank, max_cpu, fully_sharded,
                     adapters)


def test_vllm_rules_refused_with_the_flag_and_the_fix() -> None:
    check_lora_options(True, 1, 16, None, False, ())  # vLLM's defaults pass
    with pytest.raises(UserInputError, match=r"--max-lora-rank.*8, 16, 32"):
        check_lora_options(True, 1, 12, None, False, ())
    with pytest.raises(UserInputError, match=r"--max-cpu-loras.*max_loras=4"):
        check_lora_options(True, 4, 16, 2, False, ())
    with pytest.raises(UserInputError, match=r"--max-loras"):
        check_lora_options(True, 0, 16, None, False, ())
    with pytest.raises(UserInputError, match=r"--max-loras: a LoRA setting without --enable-lora"):
        check_lora_options(False, 4, 16, None, False, ())
    with pytest.raises(UserInputError, match=r"--lora-modules: a LoRA setting without --enable-lora"):
        check_lora_options(False, 1, 16, None, False, ("a=/x",))


def test_adapter_bytes_llama_8b_by_hand() -> None:
    # Per layer (r x (in + out) per slice): qkv 3x4096 + 4096+1024+1024, o 4096+4096,
    # gate_up 2x4096 + 2x14336, down 14336+4096 = 81920 x r; 32 layers, 2 bytes.
    c = cost()
    assert c.adapter_bytes(Adapter("a", "", 16)) == 16 * 81920 * 32 * 2
    # TP2: column layers keep lora_a whole and halve lora_b; row layers halve lora_a.
    # qkv 12288 + 3072, o 2048 + 4096, gate_up 8192 + 14336, down 7168 + 4096 = 55296 x r.
    assert cost(tp=2).adapter_bytes(Adapter("a", "", 16)) == 16 * 55296 * 32 * 2
    # Fully sharded: every part halves.
    assert cost(tp=2, fully_sharded=True).adapter_bytes(Adapter("a", "", 16)) == 16 * 81920 * 32 * 2 / 2
    # An adapter of q_proj and v_proj only, rank 8: 8 x (4096 + 4096 + 4096 + 1024) per layer.
    qv = Adapter("qv", "", 8, frozenset({"q_proj", "v_proj"}))
    assert c.adapter_bytes(qv) == 8 * 13312 * 32 * 2
    assert c.num_tensors(qv) == 2 * 2 * 32


def test_slot_memory_is_max_loras_padded_slots() -> None:
    assert cost(rank=16, max_loras=8).slot_bytes() == 8 * 16 * 81920 * 32 * 2


def test_kernels_grow_with_rank_and_distinct_adapters() -> None:
    base = cost(rank=16)
    assert base.kernel_seconds(0, 0) == 0.0
    # Prefill-sized batches: above the kernel floor, so every term shows.
    t16 = base.kernel_seconds(8192, 1)
    assert cost(rank=64).kernel_seconds(8192, 1) > t16
    assert cost(rank=512).kernel_seconds(8192, 4) > base.kernel_seconds(8192, 4)
    big = cost(rank=256)
    assert big.kernel_seconds(256, 4) > big.kernel_seconds(256, 1)
    assert base.kernel_seconds(16384, 1) > t16
    # The floor: 2 kernels x 4 layers x 32 decoder layers x 3 us.
    assert base.kernel_seconds(1, 1) == pytest.approx(2 * 4 * 32 * 3e-6)


def test_load_from_disk_costs_more_than_from_cpu() -> None:
    c = cost()
    a = Adapter("a", "", 16)
    gpu = c.load_seconds(a, from_disk=False)
    # 84 MB over H100's PCIe Gen5 host link plus 448 copies' latency: a few ms.
    assert 1e-3 < gpu < 20e-3
    assert c.load_seconds(a, from_disk=True) > gpu + 20e-3


def test_adapter_rank_and_modules_from_adapter_config(tmp_path: Path) -> None:
    config = {"r": 8, "target_modules": ["q_proj", "v_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps(config))
    (a, b) = parse_lora_modules((f"sql={tmp_path}", '{"name": "chat", "path": "org/chat-lora"}'), 16)
    assert (a.name, a.rank, a.modules) == ("sql", 8, frozenset({"q_proj", "v_proj"}))
    assert (b.name, b.rank, b.modules) == ("chat", 16, None)  # no local config: --max-lora-rank
    with pytest.raises(UserInputError, match=r"r=8 is above --max-lora-rank=1"):
        parse_lora_modules((f"sql={tmp_path}",), 1)
    with pytest.raises(UserInputError, match="NAME=PATH"):
        parse_lora_modules(("justaname",), 16)
    with pytest.raises(UserInputError, match="given twice"):
        parse_lora_modules(("a=/x", "a=/y"), 16)


def test_caches_are_vllms_lrus() -> None:
    caches = AdapterCaches(gpu_capacity=2, cpu_capacity=3)
    assert caches.activate([1, 2]) == [(1, True), (2, True)]
    assert caches.activate([1, 2]) == []  # both in GPU slots
    assert caches.activate([3]) == [(3, True)]  # evicts 1 from its GPU slot (oldest)
    assert caches.activate([1]) == [(1, False)]  # still in the CPU cache
    assert caches.activate([4]) == [(4, True)]  # CPU cache full: evicts 2, the least recent
    assert caches.activate([2]) == [(2, True)]


def test_pricer_counts_each_load_once() -> None:
    adapters = (Adapter("a", "", 16), Adapter("b", "", 16))
    pricer = LoraPricer(cost(adapters=adapters))
    first = pricer.step_seconds({1: 100, 2: 100})
    second = pricer.step_seconds({1: 100, 2: 100})
    assert pricer.stats.loads_from_disk == 2 and pricer.stats.loads_from_cpu == 0
    assert first > second > 0.0
    assert pricer.stats.steps_with_lora == 2
    assert pricer.step_seconds({}) == 0.0


def test_moe_refused_with_the_reason() -> None:
    with pytest.raises(UserInputError, match="MoE experts"):
        lora_cost(get_model("Qwen/Qwen3-30B-A3B"), get_hardware("h100-sxm"), 1, 1, 16, None, False, ())


def test_mamba_and_gated_deltanet_layers_refused_with_the_reason() -> None:
    # Dense, but their layers are not attention and an MLP each: Nemotron-H-8B (Mamba-2 mixers
    # and MLPs one per layer) and Qwen3.5-27B (Gated DeltaNet layers).
    data = Path(__file__).parent / "data" / "hf_configs"
    for name in ("nvidia--Nemotron-H-8B-Base-8K", "Qwen--Qwen3.5-27B"):
        with pytest.raises(UserInputError, match="Gated DeltaNet / Mamba-2"):
            lora_cost(get_model(str(data / f"{name}.json")), get_hardware("h100-sxm"), 1, 1, 16, None,
                      False, ())



def test_target_modules_keep_only_those_layers() -> None:
    c = lora_cost(get_model(LLAMA), get_hardware("h100-sxm"), 1, 2, 16, None, False, (), ("q_proj", "o_proj"))
    # q_proj keeps the whole packed qkv_proj layer, as vLLM wraps it: (12288 + 6144) + (4096 + 4096) x r.
    assert [layer.name for layer in c.layers] == ["qkv_proj", "o_proj"]
    assert c.adapter_bytes(Adapter("a", "", 16)) == 16 * (12288 + 6144 + 8192) * 32 * 2
    assert c.kernel_seconds(8192, 1) < cost().kernel_seconds(8192, 1)
    with pytest.raises(UserInputError, match="names no LoRA layer"):
        lora_cost(get_model(LLAMA), get_hardware("h100-sxm"), 1, 2, 16, None, False, (), ("lm_head",))
