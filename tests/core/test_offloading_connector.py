"""The offloading connector's scripted worker timing (the oracle's
OffloadingConnectorWorker model), the connector's input checks, and vLLM
0.34's changes (failed transfer jobs, the finished-request store cap) on
small scenarios whose expected rows are worked out in the comments (and are
what the 0.34 oracle writes for them). The scheduler-side decisions are
checked step by step against vLLM's traces in tests/conformance
(kv_connector/offload_*, kv_connector_0_34/, compare_live_offload.py)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from kvsched.config import CacheConfig
from kvsched.core.kv_cache_manager import KVCacheManager
from kvsched.core.kv_connector import KVConnectorOutput, KVTransferConfig
from kvsched.core.offloading_connector import (
    OffloadingConnector,
    OffloadingMetadata,
    OffloadingWorker,
    OffloadingWorkerMeta,
    OffloadJob,
    completed_jobs,
    failed_jobs,
)
from kvsched.core.output import CachedRequestData, NewRequestData, SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import Request, RequestStatus, SamplingParams
from kvsched.scenario import parse_scenario, replay


def job(rid: str, sync: bool = False) -> OffloadJob:
    return OffloadJob(rid, 0, [1], [0], sync)


def done(worker: OffloadingWorker, meta: OffloadingMetadata) -> tuple[list[int], list[str]]:
    out, failed = worker.capture(meta)
    assert not failed
    return sorted(completed_jobs(out)), sorted(out.finished_recving)


def test_worker_timing() -> None:
    w = OffloadingWorker(load_steps=3, store_steps=2)
    # Batch 0: store 0 (submitted in batch 1, done in 0 + 2 = 2), an
    # asynchronous load 1 (done in 0 + 3 - 1 = 2, its request received) and
    # a synchronous load 2 (done at once, no finished_recving).
    assert done(w, OffloadingMetadata({1: job("a"), 2: job("b", True)}, {0: job("c")})) == ([2], [])
    # Batch 1: store 3, flushed: done in its own batch.
    assert done(w, OffloadingMetadata({}, {3: job("d")}, {3})) == ([3], [])
    assert done(w, OffloadingMetadata()) == ([0, 1], ["a"])
    # Batch 3: store 4 would be done in 5; batch 4 flushes it: done in 4.
    assert done(w, OffloadingMetadata({}, {4: job("e")})) == ([], [])
    assert done(w, OffloadingMetadata({}, {}, {4})) == ([4], [])
    assert done(w, OffloadingMetadata()) == ([], [])


def test_connector_checks_its_inputs() -> None:
    config = KVTransferConfig()
    with pytest.raises(UserInputError, match="block_size_factor=0"):
        OffloadingConnector(config, 16, 4, blocks_per_chunk=0)
    with pytest.raises(UserInputError, match="sync_load_budget_tokens=-1"):
        OffloadingConnector(config, 16, 4, sync_load_budget_tokens=-1)
    with pytest.raises(UserInputError, match="load_steps=0"):
        OffloadingWorker(load_steps=0)
    connector = OffloadingConnector(config, 16, 4)
    # A best-effort cache: a preempted request's batch output is kept.
    assert not connector.requires_kv_delivery
    assert not connector.has_pending_push_work()


# -- vLLM 0.34's failed transfer jobs, the threshold and the finished cap ------

def test_worker_scripts_failed_loads_and_stores() -> None:
    w = OffloadingWorker(load_fail={"a": True, "b": [False, True]}, store_fail=[3])
    # Batch 0: a's and b's first asynchronous loads, a synchronous load of a
    # (never failed: vLLM's worker raises on one), store 3 (scripted to fail).
    out, failed = w.capture(OffloadingMetadata({0: job("a"), 1: job("b"), 2: job("a", True)},
                                               {3: job("c")}))
    assert sorted(completed_jobs(out)) == [0, 1, 2]
    assert failed_jobs(out) == {0} and failed == {"a"}
    assert (out.finished_recving, out.failed_recving) == ({"a", "b"}, {"a"})
    # Batch 1: store 3 completes, failed; b's second asynchronous load fails.
    out, failed = w.capture(OffloadingMetadata({4: job("b")}, {5: job("c")}))
    assert sorted(completed_jobs(out)) == [3, 4] and failed_jobs(out) == {3, 4}
    assert failed == {"b"} and out.failed_recving == {"b"}
    # Batch 2: store 5 (not scripted) completes.
    out, failed = w.capture(OffloadingMetadata())
    assert completed_jobs(out) == {5} and not failed_jobs(out) and not failed


def _offload_scenario(load_fail: bool | None = None, store_fail: list[int] | None = None) -> dict[str, Any]:
    """Request a stores 8 prompt tokens (2 chunks of one 4-token block) and
    finishes in step 0; b, arriving in step 4 with the same 8 tokens and 4
    more, finds them on the CPU (prefix caching off: no local hit)."""
    kvc: dict[str, Any] = {"type": "offloading", "num_cpu_blocks": 8, "load_failure_policy": "recompute"}
    if store_fail is not None:
        kvc["store_fail"] = store_fail
    b: dict[str, Any] = {"request_id": "b", "prompt_token_ids": list(range(1, 13)), "max_tokens": 1,
                         "arrival_step": 4}
    if load_fail is not None:
        b["offload_load_fail"] = load_fail
    return {"scheduler": {"max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 64},
            "cache": {"block_size": 4, "num_gpu_blocks": 32, "enable_prefix_caching": False},
            "kv_connector": kvc, "max_steps": 50,  # a retry loop fails fast
            "requests": [{"request_id": "a", "prompt_token_ids": list(range(1, 9)), "max_tokens": 1}, b]}


def _trace(scenario: dict[str, Any], version: str = "0.34") -> list[dict[str, Any]]:
    out = io.StringIO()
    replay(parse_scenario(scenario, "s.json", version), out, skip_idle=False)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _rows(trace: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(t["step"], t["scheduled"], t["kv_load"], t["load_failed"], t["offload"]) for t in trace]


def _offload(store: list[Any] | None = None, load: list[Any] | None = None, done: list[int] | None = None,
             cpu: int = 0, failed: list[int] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"store": store or [], "load": load or [], "flush": [], "done": done or [],
                           "cpu_chunks": cpu}
    if failed:
        row["failed"] = failed
    return row


# Steps 0-3 of every variant but the failed store: a's store job 0 (2 chunks
# from block 0) is submitted in batch 1 and done there.
_A_STORED: list[tuple[Any, ...]] = [(0, [["a", 8]], {}, [], _offload([[0, "a", 0, 2]], cpu=2)),
             (1, [], {}, [], _offload(done=[0], cpu=2)),
             (2, [], {}, [], _offload(cpu=2)), (3, [], {}, [], _offload(cpu=2))]


def test_loaded_hit_then_b_computes_only_its_tail() -> None:
    # Also the vLLM 0.34 oracle's trace (these fields).
    assert _rows(_trace(_offload_scenario(load_fail=False))) == [
        *_A_STORED,
        # b's 8-token hit loads asynchronously (job 1: blocks 0-1), done in batch 4.
        (4, [], {"b": [8, True]}, [], _offload(load=[[1, "b", 0, 2, False]], done=[1], cpu=2)),
        # b computes its last 4 tokens; its third chunk is stored (job 2, block 2).
        (5, [["b", 4]], {}, [], _offload([[2, "b", 2, 1]], cpu=3)),
        (6, [], {}, [], _offload(done=[2], cpu=3))]


def test_failed_load_is_not_retried() -> None:
    # vLLM 0.34's oracle gives these rows too. b's load fails (recompute
    # policy: back to waiting with nothing computed); b is never looked up
    # on the CPU again, so it computes all 12 tokens at once. (A retry would
    # load again and fail again: b is scripted to fail every load.)
    assert _rows(_trace(_offload_scenario(load_fail=True))) == [
        *_A_STORED,
        (4, [], {"b": [8, True]}, ["b"],
         _offload(load=[[1, "b", 0, 2, False]], done=[1], cpu=2, failed=[1])),
        (5, [["b", 12]], {}, [], _offload([[2, "b", 2, 1]], cpu=3)),
        (6, [], {}, [], _offload(done=[2], cpu=3))]


def test_failed_store_drops_the_chunks() -> None:
    # vLLM 0.34's oracle gives these rows too: a's store job 0 fails in batch
    # 1, its two chunks are dropped; b finds nothing on the CPU and stores
    # its three chunks itself (job 1).
    assert _rows(_trace(_offload_scenario(store_fail=[0]))) == [
        (0, [["a", 8]], {}, [], _offload([[0, "a", 0, 2]], cpu=2)),
        (1, [], {}, [], _offload(done=[0], cpu=0, failed=[0])),
        (2, [], {}, [], _offload()), (3, [], {}, [], _offload()),
        (4, [["b", 12]], {}, [], _offload([[1, "b", 0, 3]], cpu=3)),
        (5, [], {}, [], _offload(done=[1], cpu=3))]


@pytest.mark.parametrize("scenario, path", [
    (_offload_scenario(load_fail=True), "requests[1].offload_load_fail"),
    (_offload_scenario(store_fail=[0]), "kv_connector.store_fail"),
])
def test_033_refuses_scripted_failures(scenario: dict[str, Any], path: str) -> None:
    with pytest.raises(UserInputError, match=rf"{re.escape(path)}.*0\.33's offloading worker asserts"):
        parse_scenario(scenario, "s.json", "0.33")


@pytest.mark.parametrize("change, match", [
    (lambda s: s["kv_connector"].update(store_fail=[-1]), r"kv_connector\.store_fail.*job ids"),
    (lambda s: s["kv_connector"].update(store_fail=3), r"kv_connector\.store_fail.*job ids"),
    (lambda s: s["requests"][1].update(offload_load_fail="yes"), r"offload_load_fail.*true or false"),
    (lambda s: s.update(kv_connector={"type": "scripted"}), r"offload_load_fail.*needs the offloading"),
])
def test_scripted_failure_keys_are_checked(change: Callable[[dict[str, Any]], None], match: str) -> None:
    scenario = _offload_scenario(load_fail=True)
    change(scenario)
    with pytest.raises(UserInputError, match=match):
        parse_scenario(scenario, "s.json", "0.34")


def test_033_connector_refuses_a_failed_job() -> None:
    connector = OffloadingConnector(KVTransferConfig(), 16, 4, vllm_version="0.33")
    report = KVConnectorOutput(kv_connector_worker_meta=OffloadingWorkerMeta({0}, {0}))
    with pytest.raises(ValueError, match=r"jobs \[0\] failed: vLLM 0\.33"):
        connector.update_connector_output(report)


@pytest.mark.parametrize("version, stored", [("0.33", [[1, "r", 2, 2]]), ("0.34", [])])
def test_finished_request_stores_at_most_its_computed_tokens(version: str, stored: list[Any]) -> None:
    # A 16-token prompt (4 blocks of 4) with blocks for all of it, 8 tokens
    # computed, then finished with an error (not an abort). 0.33 offers up to
    # max(prompt, num_tokens - 1) = 16 tokens: chunks 2-3 (job 1, from block
    # index 2); 0.34 caps that at the 8 computed tokens: nothing new.
    kv = KVCacheManager(CacheConfig(num_gpu_blocks=16, block_size=4), 64)
    connector = OffloadingConnector(KVTransferConfig(), 4, 8, vllm_version=version)
    connector.bind_kv_cache_manager(kv)
    req = Request("r", list(range(1, 17)), SamplingParams(max_tokens=4))
    assert connector.get_num_new_matched_tokens(req, 0) == (0, False)
    req.num_computed_tokens = 8  # kvsched counts a batch's tokens when it schedules them
    first = connector.build_connector_meta(SchedulerOutput(
        [NewRequestData("r", req.prompt_token_ids, [1, 2, 3, 4], 0)], CachedRequestData(), {"r": 8}, 8,
        set(), set()))
    assert [[j, e.req_id, e.gpu_start, len(e.gpu_block_ids)] for j, e in first.store_jobs.items()] == [
        [0, "r", 0, 2]]
    req.status = RequestStatus.FINISHED_ERROR
    connector.request_finished(req, [1, 2, 3, 4])
    then = connector.build_connector_meta(SchedulerOutput([], CachedRequestData(), {}, 0, set(), {"r"}))
    assert [[j, e.req_id, e.gpu_start, len(e.gpu_block_ids)] for j, e in then.store_jobs.items()] == stored
