"""vLLM's MultiConnector rules (kvsched.core.multi_connector) on stub
children whose answers are fixed by hand, the worker reports combined, and
one small scheduler run with NIXL + offloading. Expected values come from
vLLM 0.33's multi_connector.py rules, not from the code under test."""

from __future__ import annotations

from typing import Any, cast

import pytest

from kvsched import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core.kv_connector import (
    KVConnectorBase,
    KVTransferConfig,
    multi_child_configs,
    parse_kv_transfer_config,
)
from kvsched.core.multi_connector import (
    MultiConnector,
    MultiKVConnectorMetadata,
    MultiKVConnectorWorkerMetadata,
    MultiScriptedWorker,
    combine_reports,
)
from kvsched.core.nixl_connector import NixlConnector, NixlScriptedWorker
from kvsched.core.offloading_connector import OffloadingConnector, OffloadingWorker, OffloadingWorkerMeta
from kvsched.core.output import KVConnectorOutput, ModelRunnerOutput, SchedulerOutput
from kvsched.errors import UserInputError


class Stub(KVConnectorBase):
    """A child with a fixed lookup answer and finish answer; records calls."""

    def __init__(self, hit: tuple[int | None, bool] = (0, False), finish: tuple[bool, dict[str, Any] | None]
                 = (False, None), role: str = "kv_both", pending_frees: bool = False) -> None:
        super().__init__(KVTransferConfig(kv_role=role))
        self.hit = hit
        self.finish = finish
        self.pending_frees = pending_frees
        self.allocs: list[tuple[str, list[int], int]] = []
        self.outputs: list[Any] = []
        self.metas = 0

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        return self.hit

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        self.allocs.append((request.request_id, list(block_ids), num_external_tokens))

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        self.metas += 1
        return f"meta{self.metas}"

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        self.outputs.append(connector_output.kv_connector_worker_meta)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self.finish[0], (dict(self.finish[1]) if self.finish[1] is not None else None)

    def has_pending_block_frees(self) -> bool:
        return self.pending_frees


# The stubs never read the batch.
NO_OUTPUT = cast(SchedulerOutput, object())


def req(rid: str = "r") -> Request:
    return Request(rid, list(range(64)), SamplingParams(max_tokens=2, ignore_eos=True))


def multi(*children: Stub, role: str = "kv_both") -> MultiConnector:
    return MultiConnector(KVTransferConfig(kv_role=role), list(children))


def test_first_child_with_a_hit_loads_and_the_others_get_zero() -> None:
    a, b, c = Stub((0, False)), Stub((32, True)), Stub((48, False))
    m = multi(a, b, c)
    assert m.get_num_new_matched_tokens(req(), 16) == (32, True)
    assert m.loading_connector("r") is b
    m.update_state_after_alloc(req(), [3, 4, 5], 32)
    assert [s.allocs for s in (a, b, c)] == [[("r", [3, 4, 5], 0)], [("r", [3, 4, 5], 32)],
                                             [("r", [3, 4, 5], 0)]]


def test_a_child_that_cannot_tell_yet_makes_the_whole_answer_wait() -> None:
    # vLLM returns None even though the first child already had a hit.
    m = multi(Stub((32, True)), Stub((None, False)))
    assert m.get_num_new_matched_tokens(req(), 0) == (None, False)


def test_no_hit_anywhere_loads_nothing() -> None:
    a, b = Stub(), Stub()
    m = multi(a, b)
    assert m.get_num_new_matched_tokens(req(), 0) == (0, False)
    assert m.loading_connector("r") is None
    m.update_state_after_alloc(req(), [1], 0)
    assert a.allocs == b.allocs == [("r", [1], 0)]


def test_request_finished_holds_if_any_holds_and_merges_params() -> None:
    a = Stub(finish=(False, {"x": 1}))
    b = Stub(finish=(True, {"y": 2}))
    m = multi(a, b)
    assert m.request_finished(req(), [1, 2]) == (True, {"x": 1, "y": 2})
    # One holder: no extra saves in the next metadata.
    assert m.build_connector_meta(NO_OUTPUT).extra_async_saves is None


def test_two_holders_are_sent_once_both_report() -> None:
    m = multi(Stub(finish=(True, None)), Stub(finish=(True, None)))
    assert m.request_finished(req(), [1]) == (True, None)
    meta = m.build_connector_meta(NO_OUTPUT)
    assert meta.metadata == ("meta1", "meta1")
    assert meta.extra_async_saves == {"r": 1}
    pending = dict(meta.extra_async_saves)
    first = combine_reports([KVConnectorOutput(finished_sending={"r"}), None], pending)
    assert first is not None and first.finished_sending == set() and pending == {}
    second = combine_reports([None, KVConnectorOutput(finished_sending={"r"})], pending)
    assert second is not None and second.finished_sending == {"r"}


def test_param_key_clash_is_an_error_naming_the_keys() -> None:
    m = multi(Stub(finish=(False, {"k": 1})), Stub(finish=(False, {"k": 2})))
    with pytest.raises(ValueError, match=r"\['k'\]"):
        m.request_finished(req(), [])


def test_worker_meta_is_split_per_child_and_restored() -> None:
    a, b = Stub(), Stub()
    m = multi(a, b)
    wm = MultiKVConnectorWorkerMetadata((None, "jobs"))
    out = KVConnectorOutput(kv_connector_worker_meta=wm)
    m.update_connector_output(out)
    assert a.outputs == [None] and b.outputs == ["jobs"]
    assert out.kv_connector_worker_meta is wm


def test_flags_are_any_of_the_children() -> None:
    consumer, producer = Stub(role="kv_consumer"), Stub(role="kv_producer", pending_frees=True)
    assert not multi(consumer).requires_kv_delivery
    m = multi(consumer, producer)
    assert m.requires_kv_delivery and m.has_pending_block_frees() and not m.has_pending_push_work()


def test_combine_reports_unions_and_keeps_one_meta_per_child() -> None:
    out = combine_reports([KVConnectorOutput(finished_recving={"a"}, invalid_block_ids={3}),
                           KVConnectorOutput(finished_recving={"b"}, failed_recving={"b"},
                                             kv_connector_worker_meta="m")], {})
    assert out is not None
    assert (out.finished_recving, out.failed_recving, out.invalid_block_ids) == ({"a", "b"}, {"b"}, {3})
    assert out.kv_connector_worker_meta == MultiKVConnectorWorkerMetadata((None, "m"))
    assert combine_reports([None, None], {}) is None
    plain = combine_reports([KVConnectorOutput(finished_sending={"z"}), None], {})
    assert plain is not None and plain.kv_connector_worker_meta is None


def test_multi_json_is_checked_child_by_child() -> None:
    config = parse_kv_transfer_config('{"kv_connector": "MultiConnector", "kv_role": "kv_both", '
                                      '"engine_id": "e0", "kv_connector_extra_config": {"connectors": ['
                                      '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}]}}')
    (child,) = multi_child_configs(config)
    assert (child.kv_connector, child.kv_role, child.engine_id) == ("NixlConnector", "kv_consumer", "e0")
    empty = KVTransferConfig(kv_connector="MultiConnector", kv_connector_extra_config={"connectors": []})
    with pytest.raises(UserInputError, match="non-empty list"):
        multi_child_configs(empty)
    bad = KVTransferConfig(kv_connector="MultiConnector", kv_connector_extra_config={
        "connectors": [{"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_port": "x"}]})
    with pytest.raises(UserInputError, match=r"connectors\[0\].*kv_port"):
        multi_child_configs(bad)


def test_decode_side_with_cpu_hit_loads_from_cpu_when_offloading_comes_first() -> None:
    """A decode request whose prompt the CPU tier holds: with offloading
    first the CPU load wins (synchronous budget 0: asynchronous, 2 chunks of
    16 tokens past no local hit); NIXL then only tells its prefill side to
    free (a notify-only read, awaiting nothing)."""
    cache = CacheConfig(num_gpu_blocks=24, block_size=16, enable_prefix_caching=False)
    params = {"d": {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_request_id": "d",
                    "remote_host": "h", "remote_port": 1, "remote_block_ids": [[1, 2, 3]]}}
    offload = OffloadingConnector(KVTransferConfig(), 16, num_cpu_blocks=8)
    nixl = NixlConnector(KVTransferConfig(kv_role="kv_consumer"), 16, params)
    m = MultiConnector(KVTransferConfig(kv_role="kv_consumer"), [offload, nixl])
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256),
                      cache, kv_connector=m)
    m.bind_kv_cache_manager(sched.kv_cache_manager)
    worker = MultiScriptedWorker([OffloadingWorker(), NixlScriptedWorker({})])
    prompt = list(range(500, 540))  # 40 tokens: 2 full blocks
    # A first request computes the prompt; its 2 full blocks are stored.
    sched.add_request(Request("w", prompt, SamplingParams(max_tokens=1, ignore_eos=True)))
    for _ in range(4):
        out = sched.schedule()
        report, _ = worker.capture(out.kv_connector_metadata)
        ids = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ModelRunnerOutput(ids, [[7] for _ in ids], kv_connector_output=report))
    assert offload.manager.num_used_chunks == 2
    sched.add_request(Request("d", prompt, SamplingParams(max_tokens=1, ignore_eos=True)))
    out = sched.schedule()
    assert out.kv_loads == {"d": (32, True)}
    meta = out.kv_connector_metadata
    assert isinstance(meta, MultiKVConnectorMetadata)
    offload_meta, nixl_meta = meta.metadata
    assert [len(j.gpu_block_ids) for j in offload_meta.load_jobs.values()] == [2]
    recv = nixl_meta.reqs_to_recv["d"]
    assert recv.awaiting_kvs is False and recv.local_block_ids == []
    report, _ = worker.capture(meta)
    assert report.finished_recving == {"d"}
    assert isinstance(report.kv_connector_worker_meta, MultiKVConnectorWorkerMetadata)
    assert isinstance(report.kv_connector_worker_meta.metadata[0], OffloadingWorkerMeta)
    assert report.kv_connector_worker_meta.metadata[1] is None
