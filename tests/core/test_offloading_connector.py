"""The offloading connector's scripted worker timing (the oracle's
OffloadingConnectorWorker model) and the connector's input checks. The
scheduler-side decisions are checked step by step against vLLM's traces in
tests/conformance (kv_connector/offload_*, compare_live_offload.py)."""

from __future__ import annotations

import pytest

from kvsched.core.kv_connector import KVTransferConfig
from kvsched.core.offloading_connector import (
    OffloadingConnector,
    OffloadingMetadata,
    OffloadingWorker,
    OffloadJob,
    completed_jobs,
)
from kvsched.errors import UserInputError


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
