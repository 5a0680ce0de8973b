"""KV offloading to CPU in the simulator: vLLM's sizing of the CPU cache,
a job's price over the host link, the timed worker's reports, CPU hits that
survive GPU eviction (and what they do to TTFT), the flags, fast-forward."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.core.offloading_connector import OffloadingMetadata, OffloadJob, completed_jobs
from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware, load_hardware_file
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.offload_transfer import OffloadConfig, OffloadStats, OffloadTimedWorker, num_cpu_blocks
from kvsched.sim.run import prepare, sim_config
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.spec import RunSpec
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest

MODEL = "meta-llama/Llama-3.1-8B"
# Llama-3.1-8B's KV per token: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes.
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
BLOCK = 16
MIB = 1 << 20


def engine(**changes: object) -> EngineOptions:
    # vLLM 0.33: the block counts and sizes here are worked out in its
    # 16-token blocks (BLOCK; the default release, 0.34, has 64-token ones).
    base = EngineOptions(model=MODEL, hardware="h100-sxm", step_time_backend="roofline", max_model_len=960,
                         num_gpu_blocks_override=64, kv_offloading_size=1.0, vllm_version="0.33")
    return dataclasses.replace(base, **changes)


# -- sizing and price -----------------------------------------------------------------
def test_the_cpu_cache_holds_the_gib_over_a_block_of_every_rank_as_vllm_sizes_it() -> None:
    # One block: 16 tokens x 128 KiB = 2 MiB on one rank; 1 GiB holds 512.
    assert build_deployment(engine()).offload == OffloadConfig(1.0, 512, 2 * MIB, 1, 64e9)
    # TP2: 1 MiB per rank, 2 MiB over both ranks: still 512 for the 1 GiB in all.
    tp2 = build_deployment(engine(tensor_parallel_size=2)).offload
    assert tp2 is not None and (tp2.num_cpu_blocks, tp2.bytes_per_block) == (512, MIB)
    # A chunk is rounded up to the 4 KiB page: 4097 bytes take 8192.
    assert num_cpu_blocks(1.0, 4097, 1) == (1 << 30) // 8192
    # MLA under TP keeps one copy for every rank.
    assert num_cpu_blocks(1.0, MIB, 4, replicated=True) == 1024


def test_a_job_takes_its_bytes_per_rank_over_the_host_link() -> None:
    cfg = build_deployment(engine(tensor_parallel_size=2)).offload
    assert cfg is not None
    assert get_hardware("h100-sxm").host_link_bw == 64e9  # PCIe Gen5 x16, per direction
    # 32 blocks x 16 tokens x half of 128 KiB per rank, both ranks at once, over 64 GB/s.
    assert cfg.job_seconds(32) == pytest.approx(32 * BLOCK * KV_BYTES_PER_TOKEN / 2 / 64e9)
    assert cfg.job_bytes(32) == 32 * BLOCK * KV_BYTES_PER_TOKEN


# -- the worker -------------------------------------------------------------------------
CFG = OffloadConfig(1.0, 512, 2 * MIB, 1, 64e9)
ONE_BLOCK_S = 2 * MIB / 64e9


def job(rid: str, blocks: int, sync: bool = False) -> OffloadJob:
    return OffloadJob(rid, 0, list(range(1, blocks + 1)), list(range(blocks)), sync)


def test_a_store_is_submitted_when_its_batch_ends_and_reported_when_done() -> None:
    worker = OffloadTimedWorker(CFG, OffloadStats())
    worker.start(OffloadingMetadata(store_jobs={7: job("a", 4)}), 0.0)
    assert worker.report(0.010) is None  # submitted at 10 ms, 4 blocks on the link
    assert worker.next_due() == pytest.approx(0.010 + 4 * ONE_BLOCK_S)
    worker.start(OffloadingMetadata(), 0.010)
    out = worker.report(0.020)
    assert completed_jobs(out) == {7} and out is not None and not out.finished_recving


def test_async_loads_queue_on_the_link_and_end_in_finished_recving() -> None:
    stats = OffloadStats()
    worker = OffloadTimedWorker(CFG, stats)
    worker.start(OffloadingMetadata(load_jobs={1: job("a", 10), 2: job("b", 10)}), 1.0)
    first, second = 1.0 + 10 * ONE_BLOCK_S, 1.0 + 20 * ONE_BLOCK_S  # FIFO: b waits for a
    assert worker.report(first - 1e-9) is None
    out = worker.report(first)
    assert out is not None and out.finished_recving == {"a"} and completed_jobs(out) == {1}
    out = worker.report(second)
    assert out is not None and out.finished_recving == {"b"} and completed_jobs(out) == {2}
    assert stats.load_seconds == pytest.approx([10 * ONE_BLOCK_S, 20 * ONE_BLOCK_S])
    assert stats.load_bytes == 20 * 2 * MIB


def test_sync_loads_and_flushed_jobs_complete_with_their_batch() -> None:
    worker = OffloadTimedWorker(CFG, OffloadStats())
    worker.start(OffloadingMetadata(store_jobs={3: job("a", 100)}, jobs_to_flush={3},
                                    load_jobs={4: job("b", 100, sync=True)}), 0.0)
    out = worker.report(1e-6)  # far sooner than 100 blocks take
    assert completed_jobs(out) == {3, 4} and out is not None and not out.finished_recving


# -- hits that survive GPU eviction -----------------------------------------------------
def doc_workload() -> Workload:
    """A, B, C: three documents of 512 tokens (32 blocks) with 8 tokens of
    question each, one at a time; then A again with another question. The
    GPU cache (64 blocks, 63 usable) holds two such prompts: B and C evict
    A's blocks, so A's second prompt finds nothing on the GPU."""
    doc = {name: (100 + i, 512) for i, name in enumerate("ABC")}

    def req(i: int, name: str, at: float) -> WorkloadRequest:
        return WorkloadRequest(f"{name}{i}", at, (doc[name], (UNIQUE_TOKEN_BASE + i, 8)), 4)

    return Workload("docs", (req(0, "A", 0.0), req(1, "B", 1.0), req(2, "C", 2.0), req(3, "A", 3.0)))


def run_docs(offload: bool, fast_forward: bool = True) -> dict[str, object]:
    deployment = build_deployment(engine(kv_offloading_size=1.0 if offload else None))
    config = SimConfig(deployment.scheduler_config, deployment.cache_config, deployment.step_model,
                       fast_forward=fast_forward, offload=deployment.offload)
    result = Simulator(config, doc_workload()).run()
    metrics = result.metrics()
    metrics["ttft_by_request"] = {r.request_id: r.first_token_time - r.send_time for r in result.records}
    return metrics


def test_offloaded_blocks_are_hit_after_gpu_eviction_and_cut_ttft() -> None:
    without, with_cpu = run_docs(False), run_docs(True)
    queries = 4 * 520
    # Without offloading nothing is ever hit: A's blocks were evicted.
    assert without["prefix_cache_hit_rate"] == 0.0
    assert "kv_offload" not in without
    # With it, A's 32 stored blocks come back from CPU memory: 512 tokens.
    tiers = with_cpu["prefix_cache_hit_rate_by_tier"]
    assert tiers == {"gpu": 0.0, "cpu": 512 / queries, "total": 512 / queries}
    offload = with_cpu["kv_offload"]
    assert isinstance(offload, dict)
    assert offload["cpu_hit_tokens"] == 512 and offload["loads"] == 1
    assert offload["load_bytes"] == 32 * 2 * MIB
    assert offload["mean_load_ms"] == pytest.approx(1e3 * 32 * ONE_BLOCK_S)
    # Every full block of the four prompts stored once (A's second prompt
    # adds none: its 32 blocks are in CPU memory already).
    assert offload["store_bytes"] == 3 * 32 * 2 * MIB
    ttft_without, ttft_with = without["ttft_by_request"], with_cpu["ttft_by_request"]
    assert isinstance(ttft_without, dict) and isinstance(ttft_with, dict)
    assert ttft_with["A3"] < ttft_without["A3"]
    for rid in ("A0", "B1", "C2"):  # nothing to load: the same TTFT
        assert ttft_with[rid] == ttft_without[rid]
    assert with_cpu["mean_ttft_ms"] < without["mean_ttft_ms"]  # type: ignore[operator]


@settings(max_examples=4, deadline=None)
@given(rate=st.sampled_from(["4", "16", "inf"]), seed=st.integers(0, 3))
def test_fast_forward_changes_nothing_with_offloading(rate: str, seed: int) -> None:
    spec = parse_spec(["--model", MODEL, "--hardware", "h100-sxm", "--step-time-backend", "roofline",
                       "--num-prompts", "12", "--random-input-len", "256", "--random-prefix-len", "128",
                       "--random-output-len", "32", "--request-rate", rate, "--seed", str(seed),
                       "--max-model-len", "1024", "--num-gpu-blocks-override", "80",
                       "--kv-offloading-size", "0.5"])
    prepared = prepare(spec)
    runs = []
    for ff in (True, False):
        config = dataclasses.replace(sim_config(prepared.deployment, spec), fast_forward=ff)
        result = Simulator(config, prepared.accepted).run()
        metrics = result.metrics()
        metrics.pop("simulation_wall_seconds")
        runs.append(metrics)
    # Stretches are taken where the connector is idle (none with it off).
    assert runs[1].pop("fast_forwarded_steps") == 0
    runs[0].pop("fast_forwarded_steps")
    assert runs[0] == runs[1]
    assert runs[0]["kv_offload"]["stores"] > 0


# -- flags ------------------------------------------------------------------------------
def flags(*extra: str) -> RunSpec:
    return parse_spec(["--model", MODEL, "--num-prompts", "4", "--max-model-len", "1024", *extra])


def test_the_flags_round_trip() -> None:
    spec = flags("--kv-offloading-size", "2.5", "--kv-offloading-backend", "native")
    assert spec.engine.kv_offloading_size == 2.5 and spec.engine.kv_offloading_backend == "native"
    assert parse_spec(spec_argv(spec)) == spec


@pytest.mark.parametrize("extra, match", [
    (("--kv-offloading-size", "0"), r"kv_offloading_size=0.* \(--kv-offloading-size\)"),
    (("--kv-offloading-size", "-1"), r"--kv-offloading-size"),
    (("--kv-offloading-size", "nan"), r"--kv-offloading-size"),
    (("--kv-offloading-size", "4", "--kv-offloading-backend", "lmcache"), r"--kv-offloading-backend.*native"),
    (("--kv-offloading-size", "4", "--kv-offloading-backend", "fancy"), r"--kv-offloading-backend"),
    (("--kv-offloading-size", "4", "--disaggregation", "1P1D", "--kv-transfer-config",
      '{"kv_connector": "MultiConnector", "kv_role": "kv_both", "kv_connector_extra_config": {"connectors": ['
      '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}, {"kv_connector": "OffloadingConnector", '
      '"kv_role": "kv_both", "kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824}}]}}'),
     r"two CPU cache sizes"),
])
def test_bad_offloading_flags_are_refused_by_name(extra: tuple[str, ...], match: str) -> None:
    with pytest.raises(UserInputError, match=match):
        prepare(flags(*extra))


def test_hardware_without_a_host_link_is_refused_naming_the_field(tmp_path: object) -> None:
    with pytest.raises(UserInputError, match=r"host_link_bw"):
        prepare(flags("--hardware", "ascend-910b", "--kv-offloading-size", "4"))
    # A hardware file without it stays valid, without offloading.
    path = __import__("pathlib").Path(str(tmp_path)) / "gpu.yaml"
    path.write_text("id: my-gpu\nname: My GPU\nmemory_bytes: 85.5e9\nmem_bw: 3.35e12\nbf16_flops: 989e12\n"
                    "fp8_flops: null\nscaleup_bw: 450e9\nscaleup_kind: nvlink4\n")
    assert load_hardware_file(path).host_link_bw is None
    path.write_text(path.read_text() + "host_link_bw: 64e9\nhost_link_kind: pcie5\n")
    hw = load_hardware_file(path)
    assert (hw.host_link_bw, hw.host_link_kind) == (64e9, "pcie5")


def test_simulate_prints_the_offloading_section() -> None:
    from kvsched.commands.simulate import format_table
    m = {"prefix_cache_hit_rate_by_tier": {"gpu": 0.25, "cpu": 0.125, "total": 0.375},
         "kv_offload": {"num_cpu_blocks": 512, "stores": 3, "loads": 1, "store_bytes": 2e9, "load_bytes": 1e9,
                        "mean_load_ms": 1.5, "p99_load_ms": 2.5}}
    table = format_table(m, (99.0,))
    for line in ("CPU KV blocks:", "Prefix hit rate, CPU:", "12.5%", "Prefix hit rate, total:", "37.5%",
                 "3 / 1", "2.00 / 1.00", "P99 load (ms):"):
        assert line in table


def test_every_dp_replica_gets_its_own_cpu_cache() -> None:
    spec = parse_spec(["--model", MODEL, "--hardware", "h100-sxm", "--step-time-backend", "roofline",
                       "--num-prompts", "8", "--random-input-len", "256", "--random-output-len", "8",
                       "--max-model-len", "1024", "--num-gpu-blocks-override", "80", "-dp", "2",
                       "--dp-routing", "round-robin", "--kv-offloading-size", "0.5",
                       "--vllm-version", "0.33"])  # the 2 MiB blocks are 0.33's 16 tokens
    from kvsched.sim.run import run
    m = run(spec).metrics
    # 0.5 GiB of 2 MiB blocks on each of the two engine cores.
    assert m["kv_offload"]["num_cpu_blocks"] == 2 * 256
    # Every prompt's 16 full blocks stored once, on its own replica.
    assert m["kv_offload"]["store_bytes"] == 8 * 16 * 2 * MIB
