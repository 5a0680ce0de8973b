"""The roofline's factors: which device gets the learned ones, and the factors file's checks."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from kvsched.errors import UserInputError
from kvsched.perf import get_hardware
from kvsched.perf.hardware import load_efficiency_overrides, with_overrides
from kvsched.perf.roofline_factors import (
    DEFAULT_FILE,
    KernelFactors,
    hardware_factors,
    is_catalog_hardware,
    learned_factors,
    load_learned,
    roofline_factors,
)

SHIPPED: dict[str, Any] = json.loads(DEFAULT_FILE.read_text())


def _kind(group: str, kind: str) -> KernelFactors:
    return KernelFactors(**SHIPPED["factors"][group][kind])


def test_the_shipped_file_says_where_it_came_from_and_what_won_held_out() -> None:
    assert SHIPPED["vllm_version"] == "0.24.0"
    assert "aiconfigurator-core" in SHIPPED["source"] and SHIPPED["fitted"]
    # Every kind has its held-out errors, for both protocols, and a choice.
    for kind, choice in SHIPPED["choices"].items():
        folds = SHIPPED["held_out_median_abs_error"][kind]
        assert set(folds["issue_3_gpus"]) == {"h100_sxm", "h200_sxm", "b200_sxm"}
        shipped = kind in SHIPPED["factors"]["pooled"]
        assert shipped == (choice != "today")
        if shipped:
            # Shipped only where it beat today's roofline on the GPUs left out.
            for protocol in ("issue_3_gpus", "all_6_gpus"):
                rows = folds[protocol].values()
                mean = {col: sum(r[col] for r in rows) / len(rows) for col in ("today", choice)}
                assert mean[choice] < mean["today"], (kind, protocol)


def test_each_catalog_gpu_reads_its_generations_factors_or_the_pooled_ones() -> None:
    h100 = roofline_factors(get_hardware("h100-sxm"))
    assert h100.attention_prefill == _kind("hopper", "attention_prefill")
    assert h100.attention_decode == _kind("pooled", "attention_decode")
    assert h100.gemm_fp8 == _kind("pooled", "gemm_fp8")
    assert h100.moe_bf16 == _kind("hopper", "moe_bf16")
    b200 = roofline_factors(get_hardware("b200"))
    assert b200.attention_prefill == _kind("blackwell", "attention_prefill")
    assert b200.moe_bf16 == _kind("blackwell", "moe_bf16")
    # The RTX 4090 has no tables; it takes the workstation parts' (Ada, FA2).
    assert roofline_factors(get_hardware("rtx-4090")).attention_prefill == \
        _kind("workstation", "attention_prefill")
    # The A100 is of no fitted generation: the pooled factors.
    a100 = roofline_factors(get_hardware("a100-80gb"))
    assert a100.attention_prefill == _kind("pooled", "attention_prefill")
    # Kinds that did not ship keep the catalog's factors.
    hw = get_hardware("h100-sxm")
    assert h100.gemm_bf16 == KernelFactors(hw.gemm_mfu, hw.weight_bw_frac, 3e-6)
    assert h100.allreduce == KernelFactors(1.0, hw.comm_bw_frac, hw.comm_latency_s)


@pytest.mark.parametrize("hw_id", ["mi300x", "ascend-910b", "ascend-910c"])
def test_devices_the_fit_does_not_cover_keep_their_own_efficiencies(hw_id: str) -> None:
    # Other vendors run other kernels: NVIDIA's vLLM tables say nothing of them.
    hw = get_hardware(hw_id)
    assert roofline_factors(hw) == hardware_factors(hw)
    assert roofline_factors(hw).learned_kinds == frozenset()


def test_an_override_or_a_hardware_file_keeps_the_users_efficiencies(tmp_path: Path) -> None:
    hw = get_hardware("h100-sxm")
    tuned = with_overrides(hw, prefill_attn_mfu=0.3)
    assert roofline_factors(tuned).attention_prefill.flops_eff == 0.3
    path = tmp_path / "eff.yaml"
    path.write_text("attn_bw_frac: 0.5\n")
    from_file = load_efficiency_overrides(path, hw)
    assert roofline_factors(from_file).attention_decode.bw_eff == 0.5
    assert roofline_factors(from_file).source == "hardware efficiencies"


def test_the_catalog_test_compares_values_not_identity() -> None:
    # A copy equal field by field is the catalog entry (learned factors); an
    # override that restates the catalog's own value changes nothing; a renamed
    # copy is the user's hardware (its own efficiencies).
    hw = get_hardware("h100-sxm")
    assert is_catalog_hardware(dataclasses.replace(hw))
    assert roofline_factors(dataclasses.replace(hw)) == roofline_factors(hw)
    assert is_catalog_hardware(with_overrides(hw, scaleout_bw=hw.scaleout_bw))
    renamed = dataclasses.replace(hw, id="h100-mine")
    assert not is_catalog_hardware(renamed)
    assert roofline_factors(renamed) == hardware_factors(renamed)
    assert not is_catalog_hardware(with_overrides(hw, scaleout_bw=25e9))


def _write(tmp_path: Path, change: dict[str, Any]) -> Path:
    data = json.loads(DEFAULT_FILE.read_text())
    data.update(change)
    path = tmp_path / "factors.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("change, words", [
    ({"factors": {"pooled": {"gemm_fp8": {"flops_eff": 1.5, "bw_eff": 0.8, "latency_s": 1e-5}}}},
     "flops_eff=1.5: must be a fraction of peak"),
    ({"factors": {"pooled": {"gemm_fp4": {"flops_eff": 0.5, "bw_eff": 0.8, "latency_s": 1e-5}}}},
     "unknown kernel kind 'gemm_fp4'"),
    ({"factors": {"pooled": {}, "ampere": {}}}, "unknown generation 'ampere'"),
    ({"factors": {"pooled": {"gemm_fp8": {"flops_eff": 0.5, "bw_eff": 0.8, "latency_s": 2.0}}}},
     "latency_s=2.0: must be seconds"),
    ({"factors": {"pooled": {"gemm_fp8": {"flops_eff": 0.5}}}}, "must hold flops_eff, bw_eff, latency_s"),
])
def test_a_bad_factors_file_is_one_clear_error(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    path = _write(tmp_path, change)
    with pytest.raises(UserInputError, match="roofline factors file") as err:
        load_learned(path)
    assert words in str(err.value) and "benchmarks/fit_roofline.py" in str(err.value)


def test_a_file_with_one_kind_prices_only_that_kind_learned(tmp_path: Path) -> None:
    one = {"flops_eff": 0.25, "bw_eff": 0.5, "latency_s": 2e-5}
    learned = load_learned(_write(tmp_path, {"factors": {"pooled": {"attention_decode": one}}}))
    hw = get_hardware("h100-sxm")
    f = learned_factors(hw, learned)
    assert f.attention_decode == KernelFactors(0.25, 0.5, 2e-5)
    assert f.learned_kinds == frozenset({"attention_decode"})
    assert f.attention_prefill == hardware_factors(hw).attention_prefill
    assert "attention decode (pooled)" in f.source
