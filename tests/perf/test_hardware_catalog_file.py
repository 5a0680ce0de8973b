"""The hardware catalog is a data file whose every item is a hardware file:
each item loads on its own through load_hardware_file to the same device,
and a few entries hold the facts' numbers, written here by hand
(tests/test_package_data.py checks that the file ships with the package)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvsched.perf.hardware import CATALOG_FILE, HARDWARE, load_hardware_file


def test_every_item_is_a_hardware_file(tmp_path: Path) -> None:
    items = yaml.safe_load(CATALOG_FILE.read_text(encoding="utf-8"))
    assert [item["id"] for item in items] == list(HARDWARE)
    for item in items:
        path = tmp_path / f"{item['id']}.yaml"
        path.write_text(yaml.safe_dump(item), encoding="utf-8")
        assert load_hardware_file(path) == HARDWARE[item["id"]], item["id"]


def test_entries_hold_the_facts() -> None:
    h100 = HARDWARE["h100-sxm"]
    assert h100.memory_bytes == 85_520_809_984       # 81559 MiB (nvidia-smi)
    assert h100.mem_bw == 3.35e12
    assert h100.bf16_flops == 989.4e12 and h100.fp8_flops == 1978.9e12
    assert h100.scaleout_bw == 50e9 and h100.host_link_bw == 64e9 and h100.host_link_kind == "pcie5"
    assert h100.source == "[SMI] [DS-H100] [GK-H100] [AIC] [DGX-RA]"
    assert h100.notes == "efficiencies: aiconfigurator silicon-DB medians, vLLM 0.24.0 [AIC]"
    b200 = HARDWARE["b200"]
    assert (b200.fp4_flops, b200.scaleup_bw, b200.scaleup_kind) == (9000e12, 900e9, "nvlink5")
    gb200 = HARDWARE["gb200"]
    assert (gb200.scaleup_domain, gb200.host_link_bw, gb200.host_link_kind) == (72, 225e9, "nvlink-c2c")
    assert gb200.source == "[AIC-gb200] [DS-BW] [AIC]"
    assert gb200.notes.endswith("; NVLink5 bandwidth holds within the 72-GPU domain")
    # The PCIe devices' collective latency (10 µs), an anchor in the file.
    for hw_id in ("h100-pcie", "l40s", "rtx-4090", "rtx-pro-6000", "rtx-6000-ada", "a10g", "l4"):
        assert HARDWARE[hw_id].comm_latency_s == 10e-6, hw_id
    ascend = HARDWARE["ascend-910c"]
    assert ascend.memory_bytes == 2 * 65536 * 2**20 and ascend.scaleup_domain == 384
    assert ascend.weight_bw_frac == ascend.attn_bw_frac == 0.85
    gb300 = HARDWARE["gb300"]
    assert (gb300.memory_bytes, gb300.fp4_flops, gb300.scaleout_bw) == (279_000_000_000, 15000e12, 100e9)
    assert isinstance(gb300.memory_bytes, int)


def test_a100_bandwidth_is_the_float_it_always_was() -> None:
    # 2.039 x 1e12 rounds one ulp above 2.039e12; the file keeps that float,
    # so no result moved when the catalog became data.
    assert HARDWARE["a100-80gb"].mem_bw == 2.039 * 1e12 == 2039000000000.0002


def test_catalog_is_read_on_first_use() -> None:
    code = ("import sys, kvsched.perf.hardware as h; before = 'yaml' in sys.modules; "
            "n = len(h.HARDWARE); print(before, 'yaml' in sys.modules, n)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "21"]


@pytest.mark.parametrize("hw_id", ["h100-sxm", "mi355x"])
def test_catalog_entries_are_the_same_objects_each_time(hw_id: str) -> None:
    assert HARDWARE[hw_id] is HARDWARE[hw_id]
