"""NixlConnector's scheduler side (pull mode) with the oracle's NIXL worker:
the decode side reads the prompt asynchronously, the prefill side holds its
blocks until they are sent; and a user's --kv-transfer-config. Expected
values are worked out by hand from vLLM's rules (SCENARIO_FORMAT.md, "`nixl`";
block size 16, 23 usable blocks, budget 64)."""

from __future__ import annotations

from typing import Any

import pytest

from kvsched import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core.kv_connector import KVTransferConfig, parse_kv_transfer_config
from kvsched.core.nixl_connector import NixlConnector, NixlMetadata, NixlScriptedWorker
from kvsched.core.output import EngineCoreOutputs, ModelRunnerOutput, SchedulerOutput
from kvsched.errors import UserInputError
from kvsched.request import RequestStatus

TOKENS = list(range(1000, 1100))


def remote(rid: str, num_blocks: int) -> dict[str, Any]:
    """A decode request's params as the prefill side hands them over."""
    return {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_request_id": rid,
            "remote_host": "h", "remote_port": 1, "remote_block_ids": [list(range(1, num_blocks + 1))]}


def make(params: dict[str, dict[str, Any]], *, role: str = "kv_consumer", policy: str = "fail",
         budget: int = 64, async_scheduling: bool = False) -> Scheduler:
    connector = NixlConnector(KVTransferConfig(kv_role=role, kv_load_failure_policy=policy), 16, params)
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=256,
                                     async_scheduling=async_scheduling),
                     CacheConfig(num_gpu_blocks=24, block_size=16, enable_prefix_caching=True),
                     kv_connector=connector)


def request(rid: str, prompt: list[int], max_tokens: int = 2) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


class Engine:
    """schedule(), the NIXL worker, a fake model sampling token 7, update_from_output()."""

    def __init__(self, sched: Scheduler, specs: dict[str, dict[str, Any]] | None = None) -> None:
        self.sched = sched
        self.worker = NixlScriptedWorker(specs or {})

    def step(self) -> tuple[SchedulerOutput, NixlMetadata, EngineCoreOutputs, set[str]]:
        sched = self.sched
        output = sched.schedule()
        meta = output.kv_connector_metadata
        assert isinstance(meta, NixlMetadata)
        kv_output, load_failed = self.worker.capture(meta)
        ids = list(output.num_scheduled_tokens)
        sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in ids]
        results = sched.update_from_output(output, ModelRunnerOutput(ids, sampled,
                                                                     kv_connector_output=kv_output))
        sched.check_invariants()
        return output, meta, results, load_failed


def free(sched: Scheduler) -> int:
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


# -- decode side --------------------------------------------------------------
def test_decode_side_reads_the_whole_prompt_then_computes_its_last_token() -> None:
    sched = make({"d": remote("d", 3)})
    sched.add_request(request("d", TOKENS[:40]))
    engine = Engine(sched, {"d": {"load_steps": 2}})
    output, meta, _, _ = engine.step()
    assert output.num_scheduled_tokens == {}
    assert output.kv_loads == {"d": (40, True)}
    assert sched.requests["d"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.get_request_counts() == (0, 1)
    assert free(sched) == 23 - 3  # ceil(40 / 16) blocks to read into
    recv = meta.reqs_to_recv["d"]
    assert recv.awaiting_kvs and len(recv.local_block_ids) == 3 and recv.local_num_computed_blocks == 0
    output, _, _, _ = engine.step()  # batch 0 + 2 - 1: the read is reported in this output
    assert output.num_scheduled_tokens == {}
    output, meta, _, _ = engine.step()
    assert output.num_scheduled_tokens == {"d": 1}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 39
    assert meta.reqs_to_recv == {}  # one read per request


def test_a_local_prefix_hit_shortens_the_read() -> None:
    sched = make({"d": remote("d", 4)})
    sched.add_request(request("a", TOKENS[:32], max_tokens=1))
    engine = Engine(sched)
    engine.step()  # a computes 32 tokens (2 full blocks, cached) and finishes
    sched.add_request(request("d", TOKENS[:50]))
    output, meta, _, _ = engine.step()
    assert output.kv_loads == {"d": (50 - 32, True)}
    recv = meta.reqs_to_recv["d"]
    assert recv.local_num_computed_blocks == 2 and len(recv.local_block_ids) == 4 - 2
    output, _, _, _ = engine.step()
    assert output.num_scheduled_tokens == {"d": 1}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 49


def test_a_failed_read_is_recomputed_locally_under_recompute() -> None:
    sched = make({"d": remote("d", 3)}, policy="recompute")
    sched.add_request(request("d", TOKENS[:40]))
    engine = Engine(sched, {"d": {"load_fail": True}})
    _, meta, _, load_failed = engine.step()
    assert load_failed == {"d"} and len(meta.reqs_to_recv["d"].local_block_ids) == 3
    output, _, _, _ = engine.step()
    # No second read (do_remote_prefill is spent): the whole prompt is computed here.
    assert output.kv_loads == {}
    assert output.num_scheduled_tokens == {"d": 40}
    assert output.scheduled_new_reqs[0].num_computed_tokens == 0


def test_a_failed_read_finishes_with_error_under_fail() -> None:
    sched = make({"d": remote("d", 3)})
    sched.add_request(request("d", TOKENS[:40]))
    _, _, results, _ = Engine(sched, {"d": {"load_fail": True}}).step()
    assert [(o.request_id, o.finish_reason) for o in results.finished] == [("d", "error")]
    assert "d" not in sched.requests and free(sched) == 23


def test_abort_while_reading_holds_the_blocks_until_the_read_reports() -> None:
    sched = make({"d": remote("d", 3)})
    sched.add_request(request("d", TOKENS[:40]))
    engine = Engine(sched, {"d": {"load_steps": 2}})
    engine.step()
    assert [r.request_id for r in sched.finish_requests("d")] == ["d"]
    assert free(sched) == 20 and sched.has_requests()
    engine.step()
    assert free(sched) == 23 and "d" not in sched.requests


def test_abort_before_admission_only_notifies_the_prefill_side() -> None:
    sched = make({"d": remote("d", 3)})
    sched.add_request(request("d", TOKENS[:40]))
    sched.finish_requests("d")
    assert "d" not in sched.requests and free(sched) == 23
    _, meta, _, _ = Engine(sched).step()
    recv = meta.reqs_to_recv["d"]
    assert not recv.awaiting_kvs and recv.local_block_ids == []


def test_a_plain_request_on_the_decode_side_loads_nothing() -> None:
    sched = make({})
    sched.add_request(request("x", TOKENS[:20]))
    output, meta, _, _ = Engine(sched).step()
    assert output.num_scheduled_tokens == {"x": 20} and output.kv_loads == {}
    assert meta == NixlMetadata()


# -- prefill side -------------------------------------------------------------
def test_prefill_side_holds_blocks_until_the_decode_side_read_them() -> None:
    sched = make({"p": {"do_remote_decode": True}}, role="kv_producer")
    sched.add_request(request("p", TOKENS[:40], max_tokens=1))
    engine = Engine(sched, {"p": {"send_steps": 2}})
    output, meta, results, _ = engine.step()
    assert output.num_scheduled_tokens == {"p": 40}
    assert meta.reqs_in_batch == {"p"}
    assert [(o.request_id, o.finish_reason) for o in results.finished] == [("p", "length")]
    assert sched.requests["p"].is_finished() and free(sched) == 20
    assert sched.finish_requests("p") == []  # an abort of a held request is ignored
    _, meta, _, _ = engine.step()  # the finish reaches the worker with this batch
    assert meta.reqs_to_send == {"p": 30.0}  # vLLM's default lease, seconds
    assert free(sched) == 20
    engine.step()  # batch 1 + 2 - 1: sent
    assert free(sched) == 23 and "p" not in sched.requests and not sched.has_requests()


def test_an_aborted_prefill_frees_at_once() -> None:
    sched = make({"p": {"do_remote_decode": True}}, role="kv_producer", budget=32)
    sched.add_request(request("p", TOKENS[:40], max_tokens=1))
    engine = Engine(sched)
    engine.step()  # a 32-token chunk
    sched.finish_requests("p")
    assert free(sched) == 23 and "p" not in sched.requests
    _, meta, _, _ = engine.step()
    assert meta.reqs_not_processed == {"p"} and meta.reqs_to_send == {}


def test_request_finished_hands_the_computed_blocks_over() -> None:
    connector = NixlConnector(KVTransferConfig(kv_role="kv_producer"), 16,
                              {"p": {"do_remote_decode": True}})
    p = request("p", TOKENS[:40], max_tokens=1)
    p.status = RequestStatus.FINISHED_LENGTH_CAPPED
    p.num_computed_tokens = 40
    delay, params = connector.request_finished(p, [5, 6, 7, 8])
    assert delay
    assert params is not None
    assert params["remote_block_ids"] == [[5, 6, 7]]  # ceil(40 / 16) blocks
    assert params["remote_num_tokens"] == 40 and params["do_remote_prefill"]
    assert params["remote_request_id"] == "p"


def test_a_second_turn_read_below_the_recompute_threshold_is_skipped() -> None:
    params = {"do_remote_decode": True, "remote_engine_id": "d0", "remote_request_id": "t",
              "remote_host": "h", "remote_port": 1, "remote_block_ids": [[1, 2, 3]]}
    connector = NixlConnector(KVTransferConfig(kv_role="kv_producer"), 16,
                              {"a": {**params, "remote_num_tokens": 40},
                               "b": {**params, "remote_num_tokens": 100}})
    # 40 - 0 < 64 (vLLM's kv_recompute_threshold); min(100, 80) - 16 = 64.
    assert connector.get_num_new_matched_tokens(request("a", TOKENS[:80]), 0) == (0, False)
    assert connector.get_num_new_matched_tokens(request("b", TOKENS[:80]), 16) == (64, True)


# -- roles and settings -------------------------------------------------------
def test_roles_set_delivery_and_deferred_frees() -> None:
    assert make({}, role="kv_producer").requires_kv_delivery
    assert not make({}, role="kv_consumer").requires_kv_delivery
    assert make({}, role="kv_consumer", async_scheduling=True).defer_block_free
    assert not make({}, role="kv_producer", async_scheduling=True).defer_block_free


def test_a_read_without_the_remote_fields_is_refused() -> None:
    with pytest.raises(UserInputError, match="remote_block_ids, remote_engine_id"):
        make({"d": {"do_remote_prefill": True, "remote_request_id": "d", "remote_host": "h",
                    "remote_port": 1}})


def test_user_kv_transfer_config_parses_as_vllm_takes_it() -> None:
    config = parse_kv_transfer_config('{"kv_connector": "NixlConnector", "kv_role": "kv_consumer", '
                                      '"kv_buffer_device": "cuda", "kv_port": 14579, '
                                      '"kv_connector_extra_config": {"kv_lease_duration": 60}}')
    assert config.kv_role == "kv_consumer" and config.kv_load_failure_policy == "fail"
    assert config.is_kv_consumer and not config.is_kv_producer
    connector = NixlConnector(config, 16)
    assert connector.kv_lease_duration == 60.0 and connector.kv_recompute_threshold == 64
    producer = parse_kv_transfer_config({"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                                         "kv_load_failure_policy": "recompute"})
    assert producer.is_kv_producer and producer.kv_load_failure_policy == "recompute"


@pytest.mark.parametrize(("value", "words"), [
    ("{not json", ("not valid JSON",)),
    ("[1]", ("must be a JSON object",)),
    ({"kv_connector": "NixlConnector", "kv_rol": "kv_consumer"}, ("'kv_rol'", "did you mean 'kv_role'")),
    ({"kv_connector": "NixlConnector"}, ("kv_role is missing", "kv_producer")),
    ({"kv_connector": "NixlConnector", "kv_role": "decode"}, ("kv_role='decode'", "kv_consumer")),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_port": "x"}, ("kv_port", "an integer")),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_port": True}, ("kv_port",)),
    ({"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}, ("LMCacheConnectorV1", "NixlConnector")),
    ({"kv_role": "kv_both"}, ("kv_connector is missing",)),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "retry"},
     ("kv_load_failure_policy='retry'", "recompute")),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_module_path": "x.y"},
     ("kv_connector_module_path",)),
    ({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_connector_extra_config": []},
     ("kv_connector_extra_config", "an object")),
])
def test_bad_kv_transfer_config_fields_are_named(value: Any, words: tuple[str, ...]) -> None:
    with pytest.raises(UserInputError) as err:
        parse_kv_transfer_config(value)
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(("extra", "words"), [
    ({"kv_lease_duraton": 5}, ("kv_lease_duraton", "did you mean 'kv_lease_duration'")),
    ({"kv_lease_duration": "long"}, ("kv_lease_duration='long'", "number")),
    ({"kv_recompute_threshold": -1}, ("kv_recompute_threshold", ">= 0")),
    ({"bidirectional_kv_xfer": True}, ("bidirectional_kv_xfer", "does not model")),
])
def test_bad_nixl_extra_config_is_named(extra: dict[str, Any], words: tuple[str, ...]) -> None:
    config = parse_kv_transfer_config({"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                                       "kv_connector_extra_config": extra})
    with pytest.raises(UserInputError) as err:
        NixlConnector(config, 16)
    for word in words:
        assert word in str(err.value)


def test_worker_side_extra_config_is_accepted() -> None:
    config = parse_kv_transfer_config({"kv_connector": "NixlConnector", "kv_role": "kv_producer",
                                       "kv_connector_extra_config": {"backends": ["UCX"]}})
    assert NixlConnector(config, 16).kv_lease_duration == 30.0
