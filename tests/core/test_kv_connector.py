"""The scheduler with a KV connector (the oracle's scripted one): loads,
failures, delayed frees. Expected values are worked out by hand from
SCENARIO_FORMAT.md's rules (block size 16, 23 usable blocks)."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core.kv_connector import KVTransferConfig
from kvsched.core.output import EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput
from kvsched.core.scripted_connector import ScriptedConnector, ScriptedMetadata, ScriptedWorker
from kvsched.errors import UserInputError
from kvsched.request import RequestStatus

BLOCKS = 24  # 23 usable


def make(scripts: dict[str, dict[str, Any]], *, policy: str = "fail", pending_frees: bool = False,
         role: str = "kv_both", budget: int = 64, max_model_len: int = 256) -> Scheduler:
    config = KVTransferConfig(kv_role=role, kv_load_failure_policy=policy)
    connector = ScriptedConnector(config, scripts, 16, pending_block_frees=pending_frees)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4,
                                     max_model_len=max_model_len),
                     CacheConfig(num_gpu_blocks=BLOCKS, block_size=16, enable_prefix_caching=True),
                     kv_connector=connector)


def request(rid: str, n: int, max_tokens: int = 2) -> Request:
    return Request(rid, [1000 * len(rid) + ord(rid[0]) * 100 + i for i in range(n)],
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True))


class Engine:
    """schedule(), the worker, a fake model sampling token 7, update_from_output()."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.worker = ScriptedWorker()

    def step(self) -> tuple[SchedulerOutput, EngineCoreOutputs, set[str]]:
        sched = self.sched
        output = sched.schedule()
        meta = output.kv_connector_metadata
        assert isinstance(meta, ScriptedMetadata)
        kv_output, load_failed = self.worker.capture(meta)
        ids = list(output.num_scheduled_tokens)
        sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in ids]
        results = sched.update_from_output(output, ModelRunnerOutput(ids, sampled,
                                                                     kv_connector_output=kv_output))
        sched.check_invariants()
        return output, results, load_failed


def free(sched: Scheduler) -> int:
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


def test_sync_load_is_admitted_with_the_loaded_tokens_computed() -> None:
    sched = make({"a": {"external_hit_tokens": 32}})
    sched.add_request(request("a", 40))
    output, _, _ = Engine(sched).step()
    assert output.num_scheduled_tokens == {"a": 8}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 32
    assert output.kv_loads == {"a": (32, False)}
    assert free(sched) == 23 - 3  # 40 tokens: 3 blocks


def test_sync_load_leaves_one_token_to_compute() -> None:
    sched = make({"a": {"external_hit_tokens": 100}})
    sched.add_request(request("a", 40))
    output, _, _ = Engine(sched).step()
    assert output.num_scheduled_tokens == {"a": 1}
    assert output.kv_loads == {"a": (39, False)}


def test_async_load_waits_then_is_admitted() -> None:
    sched = make({"a": {"external_hit_tokens": 32, "load_async": True, "load_steps": 2}})
    sched.add_request(request("a", 40))
    engine = Engine(sched)
    output, _, _ = engine.step()
    assert output.num_scheduled_tokens == {}
    assert output.kv_loads == {"a": (32, True)}
    assert sched.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.get_request_counts() == (0, 1)
    assert free(sched) == 23 - 2  # the loaded 32 tokens' blocks only
    output, _, _ = engine.step()  # the load finishes in this (second) batch's output
    assert output.num_scheduled_tokens == {}
    output, _, _ = engine.step()
    assert output.num_scheduled_tokens == {"a": 8}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 32
    assert sched.requests["a"].status == RequestStatus.RUNNING


def test_async_load_of_a_whole_prompt_recomputes_its_last_token() -> None:
    sched = make({"a": {"external_hit_tokens": 32, "load_async": True}})
    sched.add_request(request("a", 32))
    engine = Engine(sched)
    engine.step()
    output, _, _ = engine.step()
    assert output.num_scheduled_tokens == {"a": 1}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 31


def test_failed_async_load_finishes_with_error_under_fail() -> None:
    sched = make({"a": {"external_hit_tokens": 32, "load_async": True, "load_fail": "request"}})
    sched.add_request(request("a", 40))
    _, results, load_failed = Engine(sched).step()
    assert load_failed == {"a"}
    assert [(o.request_id, o.finish_reason) for o in results.finished] == [("a", "error")]
    assert "a" not in sched.requests and free(sched) == 23


def test_failed_async_load_is_looked_up_again_under_recompute() -> None:
    sched = make({"a": {"external_hit_tokens": [32, 0], "load_async": True, "load_fail": "request"}},
                 policy="recompute")
    sched.add_request(request("a", 40))
    engine = Engine(sched)
    engine.step()
    output, _, _ = engine.step()
    # Second lookup: the script's second entry offers nothing; all 40 computed here.
    assert output.num_scheduled_tokens == {"a": 40}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0


def test_delayed_free_holds_blocks_until_sent() -> None:
    sched = make({"a": {"send_steps": 2}})
    sched.add_request(request("a", 20, max_tokens=1))
    engine = Engine(sched)
    _, results, _ = engine.step()
    assert [o.request_id for o in results.finished] == ["a"]
    assert sched.requests["a"].is_finished() and free(sched) == 21
    assert sched.has_requests() and not sched.has_unfinished_requests()
    assert sched.finish_requests("a") == []  # an abort of a held request is ignored
    engine.step()  # the send starts with this batch (its finished_req_ids)
    assert free(sched) == 21
    engine.step()
    assert "a" not in sched.requests and free(sched) == 23
    assert not sched.has_requests()


def test_abort_while_loading_holds_blocks_until_the_load_reports() -> None:
    sched = make({"a": {"external_hit_tokens": 32, "load_async": True, "load_steps": 2}})
    sched.add_request(request("a", 40))
    engine = Engine(sched)
    engine.step()
    assert [r.request_id for r in sched.finish_requests("a")] == ["a"]
    assert free(sched) == 21 and sched.has_requests()
    engine.step()  # finished_recving arrives: the blocks come back
    assert free(sched) == 23 and "a" not in sched.requests


@pytest.mark.parametrize("pending_frees", [True, False])
def test_pending_block_frees_stop_the_running_scan_instead_of_preempting(pending_frees: bool) -> None:
    sched = make({"s": {"send_steps": 3}}, pending_frees=pending_frees, budget=512, max_model_len=512)
    # 1 + 11 + 10 of the 23 blocks; s finishes at once and its block is held
    # until the end of step 3 (its send starts with batch 1).
    sched.add_request(request("s", 16, max_tokens=1))
    sched.add_request(request("a", 176, max_tokens=20))
    sched.add_request(request("b", 160, max_tokens=20))
    engine = Engine(sched)
    engine.step()
    output, _, _ = engine.step()  # a takes the last free block, b needs one more
    if not pending_frees:
        assert output.preempted_req_ids == {"b"}
        return
    for _ in range(3):
        assert output.num_scheduled_tokens == {"a": 1} and not output.preempted_req_ids
        output, _, _ = engine.step()
    assert output.num_scheduled_tokens == {"a": 1, "b": 1}  # s's block came back


def test_producer_role_requires_kv_delivery() -> None:
    assert make({}, role="kv_producer").requires_kv_delivery
    assert not make({}, role="kv_consumer").requires_kv_delivery


def test_bad_settings_are_refused() -> None:
    with pytest.raises(UserInputError, match="kv_role"):
        KVTransferConfig(kv_role="kv_sideways")
    with pytest.raises(UserInputError, match="kv_load_failure_policy"):
        KVTransferConfig(kv_load_failure_policy="retry")
    sched = make({"a": {"external_hit_tokens": 16, "load_fail": "request"}})
    sched.add_request(request("a", 40))
    with pytest.raises(UserInputError, match="asynchronous"):
        sched.schedule()
