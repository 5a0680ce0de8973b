"""KV copies and GPU memory bandwidth: a NIXL read and an offloading job are
DMA copies out of one GPU memory and into another (or into host memory),
priced at the slower of the link and the GPU's memory
(:meth:`kvsched.perf.hardware.Hardware.copy_bw`)."""

from __future__ import annotations

import dataclasses

import pytest

from kvsched.perf.hardware import HARDWARE, Hardware, get_hardware
from kvsched.perf.model_catalog import get_model
from kvsched.sim.kv_transfer import TransferFabric, transfer_path
from kvsched.sim.offload_transfer import host_link_bandwidth, make_offload_config

GB = 1e9
# Llama-3.1-8B's KV per token on one rank at TP1: 32 layers x 8 KV heads x
# 128 dims x K and V x 2 bytes.
LLAMA8B_KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2


def slow_memory(mem_bw: float) -> Hardware:
    """An H100 SXM whose memory is slower than its links (no real device is)."""
    return dataclasses.replace(get_hardware("h100-sxm"), id="slow-memory", mem_bw=mem_bw)


def test_the_link_sets_the_rate_on_an_h100() -> None:
    h100 = get_hardware("h100-sxm")
    assert transfer_path(h100, True).bandwidth == 450 * GB    # NVLink 4, per direction
    assert transfer_path(h100, False).bandwidth == 50 * GB    # one 400 Gb/s NIC per GPU
    assert host_link_bandwidth(h100) == 64 * GB               # PCIe Gen5 x16


def test_memory_slower_than_the_link_sets_the_rate() -> None:
    hw = slow_memory(100 * GB)
    assert transfer_path(hw, True).bandwidth == 100 * GB      # NVLink's 450 capped
    assert transfer_path(hw, False).bandwidth == 50 * GB      # the NIC is still the slower
    assert host_link_bandwidth(hw) == 64 * GB
    assert host_link_bandwidth(slow_memory(20 * GB)) == 20 * GB


def test_a_read_takes_the_copys_time_through_the_slower_memory() -> None:
    model = get_model("meta-llama/Llama-3.1-8B")
    for hw, rate in ((get_hardware("h100-sxm"), 450 * GB), (slow_memory(100 * GB), 100 * GB)):
        fabric = TransferFabric(model, 2, [1, 1], {(0, 1): transfer_path(hw, True)}, hw)
        done = fabric.read(0, 1, 0.0, 1000)
        assert done == pytest.approx(hw.comm_latency_s + 1000 * LLAMA8B_KV_PER_TOKEN / rate)


def test_an_offloading_job_takes_the_copys_time_through_the_slower_memory() -> None:
    model = get_model("meta-llama/Llama-3.1-8B")
    block = 16 * LLAMA8B_KV_PER_TOKEN  # 2 MiB
    fast = make_offload_config(1.0, model, get_hardware("h100-sxm"), 1, block)
    slow = make_offload_config(1.0, model, slow_memory(20 * GB), 1, block)
    assert fast is not None and slow is not None
    assert fast.job_seconds(10) == pytest.approx(10 * block / (64 * GB))
    assert slow.job_seconds(10) == pytest.approx(10 * block / (20 * GB))


def test_no_catalog_device_has_a_link_faster_than_its_memory() -> None:
    # docs/simulator.md's claim: the floor changes no catalog device's
    # transfer (its fastest link is at most a quarter of its memory bandwidth).
    for hw in HARDWARE.values():
        for link in (hw.scaleup_bw, hw.scaleout_bw, hw.host_link_bw):
            if link is not None:
                assert hw.copy_bw(link) == link
                assert link <= 0.25 * hw.mem_bw, (hw.id, link)
