"""vLLM 0.33's connector livelocks reached by the simulator from a workload
and flags: the run stops with CannotServe naming the livelock and its
request (Scheduler.livelock(), tests/conformance/test_livelock_detector.py)
on every stepping path: one engine, P/D instances, DP replicas and
lockstep DP ranks; the same workload one block smaller runs through."""

from __future__ import annotations

import re
from typing import Any

import pytest

from kvsched import CacheConfig, Request, SamplingParams, SchedulerConfig
from kvsched.core import explain
from kvsched.core.kv_connector import KVConnectorOutput, KVTransferConfig
from kvsched.core.policies import DPRankStates
from kvsched.core.scripted_connector import ScriptedConnector
from kvsched.errors import CannotServe
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.dp import DPOptions, DPSimulator
from kvsched.sim.flags import parse_spec
from kvsched.sim.instance import LockstepGroup
from kvsched.sim.rank import Rank
from kvsched.sim.run import run
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import Workload, WorkloadRequest
from tests.core.test_kv_connector import Engine

MODEL = "meta-llama/Llama-3.1-8B"
NEVER_FITS = ("vLLM 0.33 livelock (remote_read_never_fits): {rid}: an asynchronous remote read does not fit "
              "the free blocks (with the in-flight reservations and draft slots) and nothing running or "
              "loading will free any; the simulation stops there")


def pd_flags(prompt: int) -> list[str]:
    # 32 KV blocks of 16 (31 usable: 496 tokens) on each instance, n-gram drafts of 4;
    # vLLM 0.33 (its 16-token blocks; the default release, 0.34, has 64-token ones).
    return ["--vllm-version", "0.33", "--model", MODEL, "--hardware", "h100-sxm",
            "--step-time-backend", "roofline",
            "--dataset-name", "random", "--num-prompts", "1", "--request-rate", "inf",
            "--random-input-len", str(prompt), "--random-output-len", "8", "--random-range-ratio", "0",
            "--seed", "1", "--disaggregation", "1P1D", "--num-gpu-blocks-override", "32",
            "--max-model-len", "496", "--no-async-scheduling",
            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 4}']


def test_a_remote_read_needing_every_free_block_with_drafts_livelocks_the_decode_instance() -> None:
    # 481 tokens: the read needs 31 blocks, every free one, and the draft
    # slots (1 + 4 tokens: one block) are reserved beside it: it never fits,
    # and with nothing else on the decode instance nothing frees a block.
    with pytest.raises(CannotServe) as e:
        run(parse_spec(pd_flags(481)))
    assert re.fullmatch(r"at t=\d+\.\d{3}s, " + re.escape(NEVER_FITS.format(rid="random-0")), str(e.value))
    # 480 tokens: 30 blocks + the draft block fit the 31.
    m = run(parse_spec(pd_flags(480))).metrics
    assert (m["completed"], m["failed"]) == (1, 0)


def docs(names: str) -> Workload:
    """One request a second, each a 495-token document (31 blocks of 16, the
    last one not full) by name, answering one token: a document's second
    request finds its first 30 blocks in CPU memory once others evicted them."""
    return Workload("docs", tuple(WorkloadRequest(f"{name}{i}", float(i), ((100 + ord(name), 495),), 1)
                                  for i, name in enumerate(names)))


def offload_config(num_speculative_tokens: int | None, dp: int = 1) -> SimConfig:
    spec = (None if num_speculative_tokens is None
            else f'{{"method": "ngram", "num_speculative_tokens": {num_speculative_tokens}}}')
    # vLLM 0.33: docs() counts its 16-token blocks (the default release, 0.34, has 64-token ones).
    d = build_deployment(EngineOptions(model=MODEL, hardware="h100-sxm", step_time_backend="roofline",
                                       max_model_len=496, num_gpu_blocks_override=32, kv_offloading_size=1.0,
                                       async_scheduling=False, speculative_config=spec,
                                       data_parallel_size=dp, calibration="none", vllm_version="0.33"))
    # Kernel time only ("none"): a request reaches the engine at its send,
    # so the livelock's moment is its arrival's.
    return SimConfig(d.scheduler_config, d.cache_config, d.step_model, offload=d.offload,
                     speculative=d.speculative)


def test_a_cpu_load_with_drafts_that_never_fits_livelocks_one_engine() -> None:
    # A's second request loads 30 blocks from CPU memory; 16 drafts reserve
    # 2 blocks (17 tokens) beside them: 32 > 31 free, nothing else to free any.
    with pytest.raises(CannotServe) as e:
        Simulator(offload_config(16), docs("ACA")).run()
    assert str(e.value) == "at t=2.000s, " + NEVER_FITS.format(rid="A2")
    # Without drafts the load fits and is made.
    result = Simulator(offload_config(None), docs("ACA")).run()
    assert len(result.records) == 3 and result.kv_offload is not None and result.kv_offload.load_count == 1


def test_a_data_parallel_replica_stops_on_the_livelock_its_scheduler_is_in() -> None:
    # Round robin: replica 0 serves A0, C2 and A4 (A's blocks evicted by C),
    # replica 1 the others; replica 0's load of A4 never fits.
    sim = DPSimulator(offload_config(16, dp=2), docs("AXCYA"), DPOptions(2, router="round-robin"))
    with pytest.raises(CannotServe) as e:
        sim.run()
    assert str(e.value) == "at t=4.000s, " + NEVER_FITS.format(rid="A4")
    assert sim.cluster.routed == [3, 2]


class NoWorker:
    """A KV worker with nothing to report (the lockstep group does not run
    the connector's worker; the test drives the scheduler's loads itself)."""

    def start(self, meta: object, now: float) -> None:
        pass

    def report(self, end: float) -> KVConnectorOutput | None:
        return None

    def next_due(self) -> float:
        return float("inf")


def lockstep_rank(scripts: dict[str, dict[str, Any]]) -> Rank:
    connector = ScriptedConnector(KVTransferConfig(kv_role="kv_both"), scripts, 16)
    # The livelocks named here are vLLM 0.33's (the module's subject).
    return Rank(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256,
                                vllm_version="0.33"),
                CacheConfig(num_gpu_blocks=24, block_size=16), workload_name="t", kv_connector=connector,
                kv_worker=NoWorker())


def test_lockstep_ranks_name_the_livelock_of_the_rank_in_it() -> None:
    # Rank 1's one-token prompt is loaded whole, reset and looked up again
    # for ever (tests/core/test_explain_connector.py); rank 0 has no work.
    ranks = [lockstep_rank({}), lockstep_rank({"a": {"external_hit_tokens": 1, "load_async": True}})]
    ranks[1].sched.add_request(Request("a", [5], SamplingParams(max_tokens=2, ignore_eos=True)))
    engine = Engine(ranks[1].sched)
    for _ in range(2):
        engine.step()
    assert ranks[1].sched.livelock() == explain.Livelock(explain.LIVELOCK_WHOLE_ONE_TOKEN_LOAD, ("a",),
                                                         "0.33")
    model = build_deployment(EngineOptions(model=MODEL, step_time_backend="roofline")).step_model
    group = LockstepGroup(ranks, model, DPRankStates(2, 16))
    with pytest.raises(CannotServe, match=r"^DP rank 1: at t=0\.000s, vLLM 0\.33 livelock "
                                          r"\(whole_one_token_load\): a: a one-token prompt loaded whole"):
        group.advance(float("inf"))


def test_lockstep_ranks_stuck_without_a_livelock_say_so() -> None:
    # A load whose worker never reports: the request waits for its KV for
    # ever, which is no livelock of the scheduler's (its load is in flight).
    ranks = [lockstep_rank({"a": {"external_hit_tokens": 32, "load_async": True}}), lockstep_rank({})]
    params = SamplingParams(max_tokens=2, ignore_eos=True)
    ranks[0].sched.add_request(Request("a", list(range(1, 41)), params))
    model = build_deployment(EngineOptions(model=MODEL, step_time_backend="roofline")).step_model
    group = LockstepGroup(ranks, model, DPRankStates(2, 16))
    with pytest.raises(CannotServe, match=r"^no request could be scheduled on any DP rank at t=0\.000s"):
        group.advance(float("inf"))
    assert ranks[0].sched.livelock() is None
