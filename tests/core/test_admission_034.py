"""vLLM 0.34's admission knobs, with expectations worked out by hand from
docs/vllm_versions.md §3, §4 and §14 (and 0.34's scheduler source):

- ``max_num_inflight_kv_loads``: requests the connector may load
  asynchronously wait in ``async_kv_waiting``; the scan merges it with
  ``waiting`` by arrival (FCFS, ties to waiting) or request order
  (priority); a new asynchronous load starts only below the cap; with no
  running slot left the scan starts asynchronous loads only; loads started
  in a step join kv_holding_waiting behind the requests already there.
- cache-aware admission: the window's merely-waiting requests are put back
  into their slots deepest cached prefix first (the probe leaves the last
  token out), ties by position, once KV usage reaches the threshold.

Block size 16, 24 blocks (23 usable) unless said otherwise.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvsched import CacheConfig, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.core import explain
from kvsched.core.kv_connector import KVTransferConfig
from kvsched.core.multi_connector import MultiConnector
from kvsched.core.nixl_connector import NixlConnector
from kvsched.core.output import ModelRunnerOutput, SchedulerOutput
from kvsched.core.scripted_connector import ScriptedConnector, ScriptedMetadata, ScriptedWorker
from kvsched.errors import UserInputError
from kvsched.request import RequestStatus

BS = 16


def make(scripts: dict[str, dict[str, Any]], *, cap: int | None = 4, max_num_seqs: int = 4,
         policy: str = "fcfs", blocks: int = 24) -> Scheduler:
    connector = ScriptedConnector(KVTransferConfig(), scripts, BS)
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=max_num_seqs, max_model_len=256,
                             policy=policy, vllm_version="0.34", max_num_inflight_kv_loads=cap)
    return Scheduler(config, CacheConfig(num_gpu_blocks=blocks, block_size=BS, enable_prefix_caching=True),
                     explain_admission=True, kv_connector=connector)


def request(rid: str, n: int, *, arrival: float = 0.0, priority: int = 0, max_tokens: int = 2,
            tokens: list[int] | None = None) -> Request:
    if tokens is None:
        tokens = [10_000 * (1 + sum(map(ord, rid))) + i for i in range(n)]
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   priority=priority, arrival_time=arrival)


class Engine:
    """schedule(), the scripted worker, a fake model sampling token 7, update_from_output()."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.worker = ScriptedWorker()

    def step(self) -> SchedulerOutput:
        sched = self.sched
        output = sched.schedule()
        sched.check_invariants()
        meta = output.kv_connector_metadata
        assert isinstance(meta, ScriptedMetadata)
        kv_output, _ = self.worker.capture(meta)
        ids = list(output.num_scheduled_tokens)
        sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in ids]
        sched.update_from_output(output, ModelRunnerOutput(ids, sampled, kv_connector_output=kv_output))
        sched.check_invariants()
        return output


def ids(queue: Any) -> list[str]:
    return [r.request_id for r in queue]


def new_ids(output: SchedulerOutput) -> list[str]:
    return [n.req_id for n in output.scheduled_new_reqs]


def reasons(output: SchedulerOutput) -> dict[str, str]:
    assert output.not_admitted is not None  # the scheduler explains
    return {n.request_id: n.reason for n in output.not_admitted}


ASYNC_LOAD = {"external_hit_tokens": 32, "load_async": True, "load_steps": 2}
# may_load_async says yes (a scripted asynchronous load), but the lookup finds
# nothing to load: the request runs as any other, from async_kv_waiting.
ASYNC_NO_HIT = {"external_hit_tokens": 0, "load_async": True}


# -- queues -----------------------------------------------------------------

def test_requests_that_may_load_async_wait_in_their_own_queue() -> None:
    sched = make({"a": ASYNC_LOAD, "b": {"load_async": [False, True]}, "s": {"external_hit_tokens": 16}})
    for rid in ("a", "b", "s", "w"):
        sched.add_request(request(rid, 40))
    assert ids(sched.async_kv_waiting) == ["a", "b"]  # any scripted async load
    assert ids(sched.waiting) == ["s", "w"]
    assert sched.get_request_counts() == (0, 4)
    assert sched.get_num_unfinished_requests() == 4


def test_without_the_cap_every_request_waits_in_waiting() -> None:
    sched = make({"a": ASYNC_LOAD}, cap=None)
    sched.add_request(request("a", 40))
    assert ids(sched.waiting) == ["a"] and not sched.async_kv_waiting


@pytest.mark.parametrize("arrivals, expected", [
    # waiting: w1, w2; async_kv_waiting: a1, a2 (arrival times as given)
    ({"w1": 0.0, "a1": 1.0, "w2": 2.0, "a2": 3.0}, ["w1", "a1", "w2", "a2"]),
    ({"w1": 1.0, "a1": 1.0, "w2": 2.0, "a2": 2.0}, ["w1", "a1", "w2", "a2"]),  # ties: waiting first
    ({"w1": 1.0, "a1": 0.5, "w2": 2.0, "a2": 0.7}, ["a1", "a2", "w1", "w2"]),
])
def test_fcfs_merges_the_queues_by_arrival_ties_to_waiting(arrivals: dict[str, float],
                                                           expected: list[str]) -> None:
    sched = make({"a1": ASYNC_NO_HIT, "a2": ASYNC_NO_HIT})
    for rid in ("w1", "w2", "a1", "a2"):
        sched.add_request(request(rid, 8, arrival=arrivals[rid]))
    assert new_ids(Engine(sched).step()) == expected


def test_priority_merges_the_queues_by_request_order() -> None:
    sched = make({"a1": ASYNC_NO_HIT, "a2": ASYNC_NO_HIT}, policy="priority")
    sched.add_request(request("w1", 8, priority=1, arrival=0.0))
    sched.add_request(request("a1", 8, priority=0, arrival=5.0))   # lower value first
    sched.add_request(request("w2", 8, priority=2, arrival=0.0))
    sched.add_request(request("a2", 8, priority=2, arrival=0.0))   # ties w2: by id, "a2" < "w2"
    assert new_ids(Engine(sched).step()) == ["a1", "w1", "a2", "w2"]


# -- the cap --------------------------------------------------------------------

def test_the_cap_holds_a_load_back_and_the_scan_goes_on_with_waiting() -> None:
    sched = make({"a1": ASYNC_LOAD, "a2": ASYNC_LOAD}, cap=1)
    sched.add_request(request("a1", 40, arrival=0.0))
    sched.add_request(request("a2", 40, arrival=1.0))
    sched.add_request(request("w", 20, arrival=2.0))
    engine = Engine(sched)
    # Step 0: a1's load starts (1 of 1); a2 is over the cap and stays; w runs.
    out = engine.step()
    assert out.kv_loads == {"a1": (32, True)}
    assert new_ids(out) == ["w"]
    assert reasons(out)["a2"] == explain.REASON_KV_LOAD_CAP
    assert ids(sched.async_kv_waiting) == ["a2"]
    # Step 1: a1 still loading (reported done by this batch): still over the cap.
    out = engine.step()
    assert out.kv_loads == {} and out.num_scheduled_tokens == {"w": 1}
    assert reasons(out) == {"a1": explain.REASON_WAITING_FOR_REMOTE_KVS, "a2": explain.REASON_KV_LOAD_CAP}
    # Step 2: a1 loaded, promoted and admitted with 8 tokens left: the cap frees, a2's load starts.
    out = engine.step()
    assert new_ids(out) == ["a1"] and out.num_scheduled_tokens == {"a1": 8}
    assert out.kv_loads == {"a2": (32, True)}


def test_a_loaded_request_counts_until_it_runs() -> None:
    # max_num_seqs 1: a1 loads, then waits for the slot w holds; while it
    # waits it counts, so a2's load does not start.
    sched = make({"a1": {**ASYNC_LOAD, "load_steps": 1}, "a2": ASYNC_LOAD}, cap=1, max_num_seqs=1)
    sched.add_request(request("w", 20, arrival=0.0, max_tokens=5))
    sched.add_request(request("a1", 40, arrival=1.0))
    sched.add_request(request("a2", 40, arrival=2.0))
    engine = Engine(sched)
    out = engine.step()  # w runs; loads only: a1 starts (done with this batch), a2 over the cap
    assert new_ids(out) == ["w"] and out.kv_loads == {"a1": (32, True)}
    for _ in range(3):  # w decodes; a1 is loaded and waits for the slot
        out = engine.step()
        assert out.num_scheduled_tokens == {"w": 1} and out.kv_loads == {}
        assert reasons(out)["a2"] == explain.REASON_KV_LOAD_CAP
    out = engine.step()  # w's 5th token: it finishes after this step
    assert out.num_scheduled_tokens == {"w": 1}
    out = engine.step()  # a1 runs; a2's load starts
    assert new_ids(out) == ["a1"] and out.kv_loads == {"a2": (32, True)}


def test_an_aborted_load_counts_until_the_worker_reports_it() -> None:
    sched = make({"a1": ASYNC_LOAD, "a2": ASYNC_LOAD}, cap=1)
    sched.add_request(request("a1", 40, arrival=0.0))
    sched.add_request(request("a2", 40, arrival=1.0))
    engine = Engine(sched)
    assert engine.step().kv_loads == {"a1": (32, True)}
    sched.finish_requests("a1")  # mid-load: its blocks stay held until the load is reported
    out = engine.step()  # the worker reports a1's load with this batch
    assert out.kv_loads == {}
    assert "a1" not in sched.requests
    assert engine.step().kv_loads == {"a2": (32, True)}


# -- loads only ---------------------------------------------------------------------

def test_with_the_batch_full_loads_start_until_a_request_needs_a_slot() -> None:
    sched = make({"a": {**ASYNC_LOAD, "load_steps": 1}, "b": ASYNC_NO_HIT, "c": ASYNC_LOAD},
                 max_num_seqs=1)
    sched.add_request(request("r", 20, arrival=0.0, max_tokens=10))
    for i, rid in enumerate("abc"):
        sched.add_request(request(rid, 40, arrival=1.0 + i))
    out = Engine(sched).step()
    # r takes the only slot; a's load starts; b would run, not load: the scan stops there.
    assert new_ids(out) == ["r"] and out.kv_loads == {"a": (32, True)}
    assert ids(sched.kv_holding_waiting) == ["a"] and ids(sched.async_kv_waiting) == ["b", "c"]
    assert reasons(out) == {"a": explain.REASON_WAITING_FOR_REMOTE_KVS,
                            "b": explain.REASON_MAX_NUM_SEQS, "c": explain.REASON_MAX_NUM_SEQS}
    assert sched.get_request_counts() == (1, 3)


def test_a_load_that_does_not_fit_while_full_is_explained_apart() -> None:
    # 5 usable blocks, r takes 3; a's load needs its whole 64-token prompt's 4.
    sched = make({"a": ASYNC_LOAD, "b": ASYNC_LOAD}, max_num_seqs=1, blocks=6)
    sched.add_request(request("r", 40, arrival=0.0))
    sched.add_request(request("a", 64, arrival=1.0))
    sched.add_request(request("b", 40, arrival=2.0))
    sched.add_request(request("w", 8, arrival=3.0))
    out = Engine(sched).step()
    assert new_ids(out) == ["r"] and out.kv_loads == {}
    assert out.admission_stop == explain.REASON_MAX_NUM_SEQS
    assert out.not_admitted is not None
    details = {n.request_id: (n.reason, n.detail) for n in out.not_admitted}
    assert details["w"][0] == explain.REASON_MAX_NUM_SEQS
    assert details["a"][0] == explain.REASON_KV_BLOCKS
    assert details["b"] == (explain.REASON_KV_BLOCKS, "queued behind a in async_kv_waiting")


def test_without_the_cap_nothing_loads_while_the_batch_is_full() -> None:
    sched = make({"a": ASYNC_LOAD}, cap=None, max_num_seqs=1)
    sched.add_request(request("r", 20, max_tokens=10))
    sched.add_request(request("a", 40, arrival=1.0))
    out = Engine(sched).step()
    assert new_ids(out) == ["r"] and out.kv_loads == {}


def test_loads_started_while_full_queue_behind_the_block_holders() -> None:
    # x's load (3 batches) is in flight in kv_holding_waiting; with the batch
    # full a's load starts and joins that queue behind x (0.33's scan would
    # have put it in front: it never started loads with holders unscanned).
    sched = make({"x": {**ASYNC_LOAD, "load_steps": 3}, "a": ASYNC_LOAD}, max_num_seqs=1)
    sched.add_request(request("x", 40, arrival=0.0))
    sched.add_request(request("r", 20, arrival=1.0, max_tokens=10))
    engine = Engine(sched)
    out = engine.step()  # x's load starts, r runs
    assert out.kv_loads == {"x": (32, True)} and new_ids(out) == ["r"]
    sched.add_request(request("a", 40, arrival=2.0))
    out = engine.step()  # full: holders are not scanned, a's load starts
    assert out.kv_loads == {"a": (32, True)}
    assert ids(sched.kv_holding_waiting) == ["x", "a"]


def test_finishing_a_request_in_async_kv_waiting() -> None:
    sched = make({"a": ASYNC_LOAD}, max_num_seqs=1)
    sched.add_request(request("a", 40))
    assert [r.request_id for r in sched.finish_requests(["a"])] == ["a"]
    assert not sched.async_kv_waiting and not sched.requests
    assert sched.get_request_counts() == (0, 0)
    sched.check_invariants()


# -- may_load_async -----------------------------------------------------------------

def test_nixl_may_load_a_remote_prefill_until_its_read_is_planned() -> None:
    params = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "remote_engine_id": "p",
              "remote_request_id": "d", "remote_host": "h", "remote_port": 1}
    nixl = NixlConnector(KVTransferConfig(kv_role="kv_consumer"), BS,
                         {"d": params, "p": {"do_remote_decode": True}})
    d, p = request("d", 40), request("p", 40)
    assert nixl.may_load_async(d) and not nixl.may_load_async(p)
    assert not nixl.may_load_async(request("other", 8))  # no params
    nixl.update_state_after_alloc(d, [1, 2, 3], 40)
    assert not nixl.may_load_async(d)  # one read per request


def test_multi_connector_may_load_async_when_any_child_may() -> None:
    yes = ScriptedConnector(KVTransferConfig(), {"a": ASYNC_LOAD}, BS)
    no = ScriptedConnector(KVTransferConfig(), {}, BS)
    multi = MultiConnector(KVTransferConfig(), [no, yes], "0.34")
    assert multi.may_load_async(request("a", 40))
    assert not multi.may_load_async(request("b", 40))


# -- cache-aware admission ----------------------------------------------------------

WARM = list(range(500, 532))  # two blocks


def cache_aware(window: int, threshold: float = 0.0, *, blocks: int = 24,
                policy: str = "fcfs", caching: bool = True) -> Scheduler:
    config = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1, max_model_len=256,
                             policy=policy, vllm_version="0.34", cache_aware_admission_window=window,
                             cache_aware_admission_threshold=threshold)
    return Scheduler(config, CacheConfig(num_gpu_blocks=blocks, block_size=BS,
                                         enable_prefix_caching=caching))


def run_one(sched: Scheduler) -> list[str]:
    """Steps until nothing waits; the ids admitted, in order."""
    admitted: list[str] = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        admitted += new_ids(out)
        ids_ = list(out.num_scheduled_tokens)
        sampled = [[] if sched.requests[r].is_prefill_chunk else [7] for r in ids_]
        sched.update_from_output(out, ModelRunnerOutput(ids_, sampled))
        sched.check_invariants()
    return admitted


def warmed(sched: Scheduler) -> Scheduler:
    """WARM run once: its two blocks are cached (and free)."""
    sched.add_request(request("warm", 0, tokens=[*WARM, 1], max_tokens=1))
    assert run_one(sched) == ["warm"]
    return sched


def queue_six(sched: Scheduler) -> None:
    """In arrival order: run (4 tokens, 3 steps), c0 (cold), h16 (16 cached
    tokens), c2 (cold), h32 (32 cached), e32 (WARM exactly: the probe leaves
    its last token out, so 16). One slot: one request runs at a time."""
    sched.add_request(request("run", 4, max_tokens=3, arrival=0.0))
    sched.add_request(request("c0", 20, arrival=1.0))
    sched.add_request(request("h16", 0, tokens=WARM[:16] + list(range(900, 910)), arrival=2.0))
    sched.add_request(request("c2", 20, arrival=3.0))
    sched.add_request(request("h32", 0, tokens=WARM + list(range(910, 915)), arrival=4.0))
    sched.add_request(request("e32", 0, tokens=WARM, arrival=5.0))


def test_cache_aware_admission_deepest_cached_prefix_first_ties_by_position() -> None:
    sched = warmed(cache_aware(window=8))
    queue_six(sched)
    # cached: run 0, c0 0, h16 16, c2 0, h32 32, e32 16 (capped at 31 tokens):
    # h32, then the 16-token tie by position (h16, e32), then the cold ones
    # by position (run, c0, c2). Later steps find the same hits: no change.
    assert run_one(sched) == ["h32", "h16", "e32", "run", "c0", "c2"]


def test_cache_aware_admission_reorders_only_inside_the_window() -> None:
    sched = warmed(cache_aware(window=3))
    queue_six(sched)
    # Window [run, c0, h16] -> [h16, run, c0]: h16 runs. Then each time the
    # first three of what is left: [run, c0, c2] (all cold) -> run;
    # [c0, c2, h32] -> h32 first; [c0, c2, e32] -> e32 first; then c0, c2.
    assert run_one(sched) == ["h16", "run", "h32", "e32", "c0", "c2"]


def test_cache_aware_admission_waits_for_the_usage_threshold() -> None:
    sched = warmed(cache_aware(window=8, threshold=0.5))
    queue_six(sched)
    # Nothing ever holds half of 23 blocks: arrival order.
    assert run_one(sched) == ["run", "c0", "h16", "c2", "h32", "e32"]


@pytest.mark.parametrize("policy, caching", [("priority", True), ("fcfs", False)])
def test_cache_aware_admission_needs_fcfs_and_prefix_caching(policy: str, caching: bool) -> None:
    sched = warmed(cache_aware(window=8, policy=policy, caching=caching))
    queue_six(sched)
    assert run_one(sched) == ["run", "c0", "h16", "c2", "h32", "e32"]


# -- configuration ----------------------------------------------------------------

@pytest.mark.parametrize("knob, value", [("max_num_inflight_kv_loads", 2),
                                         ("cache_aware_admission_window", 4),
                                         ("cache_aware_admission_threshold", 0.1)])
def test_vllm_033_has_no_such_knob(knob: str, value: object) -> None:
    with pytest.raises(UserInputError, match=rf"{knob}={value!r}: vLLM 0.33's scheduler has no such "
                                             r"setting \(new in vLLM 0.34\); set vllm_version to '0.34'"):
        # Pinned: what 0.33 lacks is the point (the default is 0.34, which has them).
        SchedulerConfig(vllm_version="0.33", **{knob: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("knob, value", [("max_num_inflight_kv_loads", 0),
                                         ("max_num_inflight_kv_loads", True),
                                         ("max_num_inflight_kv_loads", 1.5),
                                         ("cache_aware_admission_window", -1),
                                         ("cache_aware_admission_window", None),
                                         ("cache_aware_admission_threshold", 1.5),
                                         ("cache_aware_admission_threshold", float("nan")),
                                         ("cache_aware_admission_threshold", "0.5")])
def test_bad_knob_values_are_refused_by_name(knob: str, value: object) -> None:
    with pytest.raises(UserInputError, match=rf"^{knob}="):
        SchedulerConfig(vllm_version="0.34", **{knob: value})  # type: ignore[arg-type]


def test_status_of_a_request_in_async_kv_waiting_is_waiting() -> None:
    sched = make({"a": ASYNC_LOAD}, max_num_seqs=1)
    sched.add_request(request("a", 40))
    assert sched.async_kv_waiting.peek_request().status == RequestStatus.WAITING


@pytest.mark.parametrize("window, stable", [(0, True), (8, False)])
def test_a_queue_cache_aware_admission_may_reorder_is_never_decode_stable(window: int, stable: bool) -> None:
    # One slot, held by a decoding request; two wait behind it for a slot
    # (a stable stop) - but each step may reorder them anew, and the order
    # carries over, so a decode stretch may not skip those steps.
    sched = cache_aware(window)
    sched.add_request(request("run", 4, max_tokens=50))
    for rid in ("x", "y"):
        sched.add_request(request(rid, 20, arrival=1.0))
    for _ in range(3):
        out = sched.schedule()
        ids_ = list(out.num_scheduled_tokens)
        sched.update_from_output(out, ModelRunnerOutput(ids_, [[7] for _ in ids_]))
    assert out.num_scheduled_tokens == {"run": 1}
    assert sched.decode_stable is stable
