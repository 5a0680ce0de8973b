"""Prefill/decode disaggregation with KV offloading: every instance runs
vLLM's MultiConnector of NIXL and the OffloadingConnector (from
``--kv-offloading-size`` or a MultiConnector ``--kv-transfer-config``), the
hit rate by tier per role, the connector order, fast-forward, refusals."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from test_disagg import pd_spec
from test_offload_sim import doc_workload, engine

from kvsched.core.kv_connector import KVTransferConfig, parse_kv_transfer_config
from kvsched.errors import UserInputError
from kvsched.sim.deployment import build_deployment
from kvsched.sim.disagg import DisaggregatedSimulator, DisaggResult, RoleConfig
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.run import run
from kvsched.sim.simulator import SimConfig

GIB = 1 << 30
# CI replays the same examples; KVSCHED_FUZZ_SEED=N draws a fresh set.
FUZZ_SEED = os.environ.get("KVSCHED_FUZZ_SEED")
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
OFFLOAD = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
           "kv_connector_extra_config": {"cpu_bytes_to_use": GIB}}
# The docs workload: 4 prompts of 512 + 8 tokens; A's second prompt finds
# A's 32 blocks (512 tokens) in CPU memory only (test_offload_sim.py).
QUERIES = 4 * 520


def multi_json(*children: dict[str, Any]) -> str:
    return json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {"connectors": list(children)}})


def run_docs_pd(offload: bool,
                config: KVTransferConfig | None = None) -> tuple[DisaggResult, dict[str, float]]:
    """1P1D, each instance a 64-block GPU cache and, with ``offload``, 1 GiB of CPU cache."""
    d = build_deployment(engine(kv_offloading_size=1.0 if offload else None))
    role = RoleConfig(SimConfig(d.scheduler_config, d.cache_config, d.step_model, offload=d.offload), 1, 1)
    sim = DisaggregatedSimulator(role, role, doc_workload(), model=d.model, hardware=d.hardware,
                                 kv_dtype_bytes=d.runtime.kv_bytes, kv_transfer_config=config)
    result = sim.run()
    ttft = {r.request_id: r.first_token_time - r.send_time for r in result.combined.records}
    return result, ttft


def test_prefill_instances_hit_the_cpu_tier_and_decode_reads_over_nixl() -> None:
    plain, ttft_plain = run_docs_pd(False)
    result, ttft = run_docs_pd(True)
    assert plain.kv_offload_by_role == {}
    by_role = result.kv_offload_by_role
    # NIXL first (the default order): the prefill instance finds A's 512
    # tokens in CPU memory; the decode instance reads every prompt over NIXL.
    assert by_role["prefill"]["prefix_cache_hit_rate_by_tier"] == {
        "gpu": 0.0, "cpu": 512 / QUERIES, "total": 512 / QUERIES}
    assert by_role["prefill"]["kv_offload"]["cpu_hit_tokens"] == 512
    assert by_role["decode"]["kv_offload"]["cpu_hit_tokens"] == 0
    # Both store the three documents' 32 full blocks each, once.
    assert by_role["prefill"]["kv_offload"]["stores"] == by_role["decode"]["kv_offload"]["stores"] == 3
    assert result.kv_transfer["count"] == plain.kv_transfer["count"] == 4
    assert result.kv_transfer["bytes"] == plain.kv_transfer["bytes"]
    # Only A's second prompt changes: its prefill loads 32 blocks instead of computing them.
    assert ttft["A3"] < ttft_plain["A3"]
    for rid in ("A0", "B1", "C2"):
        assert ttft[rid] == ttft_plain[rid]


def test_the_multiconnector_json_is_the_same_deployment_as_the_flag() -> None:
    by_flag, ttft_flag = run_docs_pd(True)
    by_json, ttft_json = run_docs_pd(True, parse_kv_transfer_config(multi_json(NIXL, OFFLOAD)))
    assert by_json.kv_offload_by_role == by_flag.kv_offload_by_role
    assert by_json.kv_transfer == by_flag.kv_transfer and ttft_json == ttft_flag


def test_offloading_first_lets_a_decode_instance_load_from_cpu_instead_of_reading() -> None:
    """vLLM's rule: the first connector with a hit loads. With offloading
    first, A's second prompt on the decode instance hits its CPU tier (it
    stored A's prompt after the first read), so NIXL reads only 3 prompts and
    just tells the prefill side to free the fourth."""
    result, _ = run_docs_pd(True, parse_kv_transfer_config(multi_json(OFFLOAD, NIXL)))
    assert result.kv_transfer["count"] == 3
    assert result.kv_offload_by_role["decode"]["kv_offload"]["cpu_hit_tokens"] == 512
    assert result.kv_offload_by_role["prefill"]["kv_offload"]["cpu_hit_tokens"] == 512


def test_simulate_reports_transfers_and_tiers_per_role() -> None:
    m = run(pd_spec("--disaggregation", "1P2D", "--kv-offloading-size", "8", "--max-model-len", "4096",
                    "--random-prefix-len", "1024", prompts=12, rate="8", input_len="1500")).metrics
    assert m["completed"] == 12
    assert m["kv_transfer"]["count"] == 12
    assert set(m["kv_offload_by_role"]) == {"prefill", "decode"}
    for role in m["kv_offload_by_role"].values():
        tiers = role["prefix_cache_hit_rate_by_tier"]
        assert tiers["total"] == pytest.approx(tiers["gpu"] + tiers["cpu"])
        assert role["kv_offload"]["stores"] > 0


@settings(max_examples=int(os.environ.get("KVSCHED_FUZZ_EXAMPLES", "4")), deadline=None,
          derandomize=FUZZ_SEED is None, database=None)
@hypothesis_seed(int(FUZZ_SEED or 0))
@given(async_scheduling=st.booleans(), seed=st.integers(0, 3), offload_first=st.booleans())
def test_fast_forward_never_changes_a_pd_run_with_offloading(async_scheduling: bool, seed: int,
                                                            offload_first: bool) -> None:
    children = (OFFLOAD, NIXL) if offload_first else (NIXL, OFFLOAD)
    argv = ["--disaggregation", "1P2D", "--kv-transfer-config", multi_json(*children),
            "--random-prefix-len", "256", "--seed", str(seed), "--max-model-len", "2048",
            "--num-gpu-blocks-override", "200", "--max-num-seqs", "8",
            "--async-scheduling" if async_scheduling else "--no-async-scheduling"]
    on = run(pd_spec(*argv, prompts=12, rate="20", input_len="700", output_len="20")).metrics
    off = run(pd_spec(*argv, "--no-fast-forward", prompts=12, rate="20", input_len="700",
                      output_len="20")).metrics
    # Stretches are taken where every connector is idle (none with it off).
    skip = ("simulation_wall_seconds", "fast_forwarded_steps")
    assert off["fast_forwarded_steps"] == 0
    assert {k: v for k, v in on.items() if k not in skip} == {k: v for k, v in off.items() if k not in skip}
    assert on["kv_offload_by_role"]["prefill"]["kv_offload"]["stores"] > 0


@pytest.mark.parametrize("config, words", [
    (multi_json(OFFLOAD), ["exactly one NixlConnector"]),
    (multi_json(NIXL, NIXL), ["exactly one NixlConnector"]),
    (multi_json(NIXL, {**OFFLOAD, "kv_connector_extra_config": {"cpu_bytes_to_use": GIB, "block_size": 64}}),
     ["connectors[1].kv_connector_extra_config.block_size", "remove"]),
    (multi_json(NIXL, {**OFFLOAD, "kv_connector_extra_config": {}}), ["cpu_bytes_to_use=None"]),
    (multi_json(NIXL, {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}),
     ["connectors[1]", "LMCacheConnectorV1", "OffloadingConnector"]),
    (json.dumps({"kv_connector": "MultiConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"connectors": []}}), ["non-empty list"]),
])
def test_a_bad_multiconnector_is_refused_by_name(config: str, words: list[str]) -> None:
    with pytest.raises(UserInputError) as e:
        run(pd_spec("--disaggregation", "1P1D", "--max-model-len", "4096", "--kv-transfer-config", config,
                    prompts=1))
    for w in words:
        assert w in str(e.value), str(e.value)


def test_simulate_prints_each_roles_cpu_tier() -> None:
    from kvsched.commands.simulate import format_table

    def part(cpu: float, loads: int) -> dict[str, Any]:
        return {"prefix_cache_hit_rate_by_tier": {"gpu": 0.5, "cpu": cpu, "total": 0.5 + cpu},
                "kv_offload": {"num_cpu_blocks": 64, "stores": 4, "loads": loads, "store_bytes": 1e9,
                               "load_bytes": 0.0}}
    m = {"kv_offload": part(0.0, 0)["kv_offload"], "kv_offload_by_role": {
        "prefill": part(0.25, 2), "decode": part(0.0, 0)}}
    lines = format_table(m, (99.0,)).splitlines()
    prefill = next(i for i, line in enumerate(lines) if "KV offloading to CPU (prefill)" in line)
    decode = next(i for i, line in enumerate(lines) if "KV offloading to CPU (decode)" in line)
    assert prefill < decode
    assert any("Prefix hit rate, CPU:" in line and "25.0%" in line for line in lines[prefill:decode])
    assert any("Stores / loads:" in line and "4 / 0" in line for line in lines[decode:])
    assert not any(line.strip("- ") == "KV offloading to CPU" for line in lines)


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_one_role_offloads_with_its_own_flag(role: str) -> None:
    """--prefill-kv-offloading-size / --decode-kv-offloading-size: only
    that role's instances get the MultiConnector (in vLLM: their own
    --kv-transfer-config); the flag round-trips and needs --disaggregation."""
    spec = pd_spec("--disaggregation", "1P1D", f"--{role}-kv-offloading-size", "8", "--max-model-len", "4096",
                   prompts=6, rate="8", input_len="1500")
    assert {g.role: g.engine.kv_offloading_size for g in spec.deployment.groups} == {
        "prefill": 8.0 if role == "prefill" else None, "decode": 8.0 if role == "decode" else None}
    assert parse_spec(spec_argv(spec)) == spec
    m = run(spec).metrics
    assert set(m["kv_offload_by_role"]) == {role}
    assert m["kv_offload_by_role"][role]["kv_offload"]["stores"] > 0
    with pytest.raises(UserInputError, match=f"--{role}-kv-offloading-size=8.0: only with --disaggregation"):
        pd_spec(f"--{role}-kv-offloading-size", "8")
