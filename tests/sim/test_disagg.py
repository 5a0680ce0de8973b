"""Prefill/decode disaggregation in the simulator: the proxy's two legs, the
KV read's price, the TTFT split, the flags, and P/D's known shape."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.sim.disagg import node_of_instances
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.run import run
from kvsched.sim.spec import RunSpec, parse_disaggregation, spec_from_json, spec_to_json

# CI replays the same examples; KVSCHED_FUZZ_SEED=N draws a fresh set.
FUZZ_SEED = os.environ.get("KVSCHED_FUZZ_SEED")

MODEL = "meta-llama/Llama-3.1-8B"
# Llama-3.1-8B's KV per token: 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes.
KV_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2
# The read sizes below are worked out in vLLM 0.33's 16-token blocks: those
# tests simulate 0.33 (the default release, 0.34, has 64-token blocks).
VLLM_0_33 = ("--vllm-version", "0.33")


def pd_spec(*extra: str, prompts: int = 24, rate: str = "4", input_len: str = "2000",
            output_len: str = "64") -> RunSpec:
    return parse_spec(["--model", MODEL, "--hardware", "h100-sxm", "--step-time-backend", "roofline",
                       "--dataset-name", "random", "--num-prompts", str(prompts), "--request-rate", rate,
                       "--random-input-len", input_len, "--random-output-len", output_len,
                       "--random-range-ratio", "0", "--seed", "3", *extra])


@pytest.mark.parametrize("text, expected", [("1P1D", (1, 1)), ("2p3d", (2, 3)), (" 4P12D ", (4, 12))])
def test_disaggregation_is_read_as_vllm_users_write_it(text: str, expected: tuple[int, int]) -> None:
    assert parse_disaggregation(text) == expected


@pytest.mark.parametrize("text", ["0P1D", "1P0D", "PD", "1D1P", "1P1D1", "x", "-1P2D"])
def test_a_bad_disaggregation_is_refused_by_name(text: str) -> None:
    with pytest.raises(UserInputError, match=r"--disaggregation=.*xPyD"):
        parse_disaggregation(text)


def test_instances_fill_scale_up_domains_in_order_without_straddling() -> None:
    # 8-GPU domains: TP4, TP4 | TP2, TP2, TP4 | TP8 | TP2
    assert node_of_instances([4, 4, 2, 2, 4, 8, 2], 8) == [0, 0, 1, 1, 1, 2, 3]
    # A 6-GPU instance after a 4-GPU one does not fit the rest of the domain.
    assert node_of_instances([4, 6, 2], 8) == [0, 1, 1]


def test_flags_make_a_prefill_and_a_decode_group() -> None:
    spec = pd_spec("--disaggregation", "2P3D", "-tp", "2", "--decode-tensor-parallel-size", "1",
                   "--max-num-seqs", "32")
    prefill, decode = spec.deployment.groups
    assert (prefill.role, decode.role) == ("prefill", "decode")
    assert (prefill.engine.data_parallel_size, prefill.engine.tensor_parallel_size) == (2, 2)
    assert (decode.engine.data_parallel_size, decode.engine.tensor_parallel_size) == (3, 1)
    assert prefill.engine.max_num_seqs == decode.engine.max_num_seqs == 32
    assert parse_spec(spec_argv(spec)) == spec
    assert spec_from_json(spec_to_json(spec)) == spec


@pytest.mark.parametrize("argv, words", [
    (["--prefill-tensor-parallel-size", "2"], ["--prefill-tensor-parallel-size=2", "--disaggregation"]),
    (["--kv-transfer-config", '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'],
     ["--kv-transfer-config", "--disaggregation"]),
    (["--disaggregation", "1P1D", "-dp", "2"], ["--data-parallel-size=2", "xPyD"]),
    (["--disaggregation", "1P1D", "--kv-transfer-config", "{"], ["--kv-transfer-config", "not valid JSON"]),
])
def test_bad_pd_flags_are_refused_by_name(argv: list[str], words: list[str]) -> None:
    with pytest.raises(UserInputError) as e:
        run(pd_spec(*argv))
    for w in words:
        assert w in str(e.value)


def test_every_request_takes_both_legs_and_one_kv_read() -> None:
    result = run(pd_spec("--disaggregation", "1P1D", *VLLM_0_33))
    m = result.metrics
    assert m["completed"] == 24 and m["failed"] == 0
    kv = m["kv_transfer"]
    assert kv["count"] == 24
    # Every prompt is 2000 tokens: 125 blocks of 16 read whole (no local hit).
    assert kv["bytes"] == 24 * 125 * 16 * KV_BYTES_PER_TOKEN
    assert kv["paths"] == [get_hardware("h100-sxm").scaleup_kind]  # NVLink 4
    split = m["ttft_split_ms"]
    assert set(split) == {"prefill_leg_ms", "hop_ms", "kv_wait_and_read_ms", "decode_first_step_ms"}
    assert all(v >= 0 for v in split.values())
    assert split["prefill_leg_ms"] > 0 and split["kv_wait_and_read_ms"] > 0
    # The parts add up to TTFT (per request, so the means too).
    assert math.isclose(sum(split.values()), m["mean_ttft_ms"], rel_tol=1e-9)


def test_one_read_costs_latency_plus_bytes_over_the_path() -> None:
    # One request alone: its read never waits for a busy port.
    result = run(pd_spec("--disaggregation", "1P1D", *VLLM_0_33, prompts=1))
    h100 = get_hardware("h100-sxm")
    expected_ms = 1e3 * (h100.comm_latency_s + 125 * 16 * KV_BYTES_PER_TOKEN / h100.scaleup_bw)
    assert math.isclose(result.metrics["kv_transfer"]["mean_ms"], expected_ms, rel_tol=1e-9)
    assert math.isclose(result.metrics["ttft_split_ms"]["kv_wait_and_read_ms"], expected_ms, rel_tol=1e-9)


def test_tp_sharded_reads_move_each_ranks_share() -> None:
    one = run(pd_spec("--disaggregation", "1P1D", prompts=1)).metrics["kv_transfer"]
    four = run(pd_spec("--disaggregation", "1P1D", "-tp", "4", prompts=1)).metrics["kv_transfer"]
    h100 = get_hardware("h100-sxm")
    # Same bytes in all; each of 4 ranks moves a quarter of them in parallel.
    assert four["bytes"] == one["bytes"]
    assert math.isclose(four["mean_ms"] - 1e3 * h100.comm_latency_s,
                        (one["mean_ms"] - 1e3 * h100.comm_latency_s) / 4, rel_tol=1e-9)


def h100_with_nics(tmp_path: Path, scaleout_bw: float | None) -> str:
    """An H100 SXM hardware file, with a per-GPU scale-out bandwidth or without."""
    h = get_hardware("h100-sxm")
    lines = ["id: h100-test", "name: H100 test", f"memory_bytes: {h.memory_bytes}", f"mem_bw: {h.mem_bw}",
             f"bf16_flops: {h.bf16_flops}", f"fp8_flops: {h.fp8_flops}", f"scaleup_bw: {h.scaleup_bw}",
             f"scaleup_kind: {h.scaleup_kind}", "source: test"]
    if scaleout_bw is not None:
        lines.append(f"scaleout_bw: {scaleout_bw}")
    path = tmp_path / "h100.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_instances_beyond_one_node_read_over_the_scale_out_network(tmp_path: Path) -> None:
    # 1P1D at TP8: each instance fills an 8-GPU node; 50 GB/s per GPU (a 400 Gb/s NIC each).
    hw = h100_with_nics(tmp_path, 50e9)
    m = run(pd_spec("--disaggregation", "1P1D", "-tp", "8", "--hardware", hw, *VLLM_0_33, prompts=1)).metrics
    kv = m["kv_transfer"]
    assert kv["paths"] == ["rdma"]
    latency = get_hardware("h100-sxm").comm_latency_s
    expected_s = latency + 125 * 16 * KV_BYTES_PER_TOKEN / 8 / 50e9
    assert math.isclose(kv["mean_ms"], 1e3 * expected_s, rel_tol=1e-9)


def test_crossing_nodes_without_a_scale_out_bandwidth_is_refused_by_name(tmp_path: Path) -> None:
    hw = h100_with_nics(tmp_path, None)
    with pytest.raises(UserInputError, match="scaleout_bw"):
        run(pd_spec("--disaggregation", "1P1D", "-tp", "8", "--hardware", hw, prompts=1))


def test_pd_has_its_known_shape_against_colocated_serving_on_the_same_gpus() -> None:
    """Prefill-heavy traffic: colocated engines interleave long prefills with
    decodes, so every decode step waits for prefill chunks; decode instances
    never run a prefill, so their TPOT is lower and steadier, and their TTFT
    includes a KV read."""
    argv = ("--max-num-batched-tokens", "2048")
    colocated = run(pd_spec(*argv, "-dp", "2", prompts=60, rate="8", input_len="6000", output_len="128"))
    pd = run(pd_spec(*argv, "--disaggregation", "1P1D", prompts=60, rate="8", input_len="6000",
                     output_len="128"))
    c, p = colocated.metrics, pd.metrics
    assert c["completed"] == p["completed"] == 60
    assert p["mean_tpot_ms"] < 0.8 * c["mean_tpot_ms"]
    assert p["p99_tpot_ms"] < c["p99_tpot_ms"]
    assert p["ttft_split_ms"]["kv_wait_and_read_ms"] > 0


@settings(max_examples=int(os.environ.get("KVSCHED_FUZZ_EXAMPLES", "15")), deadline=None,
          derandomize=FUZZ_SEED is None, database=None)
@seed(int(FUZZ_SEED or 0))
@given(x=st.integers(1, 2), y=st.integers(1, 3), async_scheduling=st.booleans(),
       prefix=st.sampled_from(["0", "512"]), seed_=st.integers(0, 3),
       max_num_seqs=st.sampled_from(["2", "8"]), offload=st.sampled_from(["", "", "0.05", "1"]))
def test_fast_forward_never_changes_a_disaggregated_run(x: int, y: int, async_scheduling: bool, prefix: str,
                                                       seed_: int, max_num_seqs: str, offload: str) -> None:
    """Prefill and decode instances (NIXL connectors), or as many
    colocated replicas with KV offloading (the OffloadingConnector), jump
    only where their connectors and workers are idle: fast-forward on and
    off give the same run."""
    argv = ["--random-prefix-len", prefix, "--seed", str(seed_), "--max-num-seqs", max_num_seqs,
            "--async-scheduling" if async_scheduling else "--no-async-scheduling"]
    if offload:
        # A CPU cache too small for one prompt (stores retried) or roomy.
        argv += ["-dp", str(x + y), "--kv-offloading-size", offload, "--enable-prefix-caching"]
    else:
        argv += ["--disaggregation", f"{x}P{y}D"]
    on = run(pd_spec(*argv, prompts=12, rate="20", input_len="700", output_len="20"))
    off = run(pd_spec(*argv, "--no-fast-forward", prompts=12, rate="20", input_len="700",
                      output_len="20"))
    skip = ("simulation_wall_seconds", "fast_forwarded_steps")
    assert off.metrics["fast_forwarded_steps"] == 0
    assert ({k: v for k, v in on.metrics.items() if k not in skip}
            == {k: v for k, v in off.metrics.items() if k not in skip})


def test_disaggregated_decode_instances_fast_forward() -> None:
    """The decode side jumps once its reads are done (the fuzzer above
    would pass with no jump at all)."""
    argv = ["--disaggregation", "1P1D", "--seed", "0", "--max-num-seqs", "8"]
    for mode in ("--async-scheduling", "--no-async-scheduling"):
        on = run(pd_spec(*argv, mode, prompts=12, rate="20", input_len="700", output_len="60"))
        off = run(pd_spec(*argv, mode, "--no-fast-forward", prompts=12, rate="20", input_len="700",
                          output_len="60"))
        assert on.metrics["fast_forwarded_steps"] > 0, mode
        assert on.metrics["mean_tpot_ms"] == off.metrics["mean_tpot_ms"]
        assert on.metrics["kv_transfer"] == off.metrics["kv_transfer"]
