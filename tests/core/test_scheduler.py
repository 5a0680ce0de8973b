"""Scheduler behaviour through the public API, one rule per test.

Block size 4 unless said otherwise; a cache of ``n`` blocks has ``n - 1``
usable ones, handed out in id order. The fake model (``run_step``) samples
token 100 for every scheduled request that is not mid-way through a chunked
prefill, and the invariants are checked after every schedule() and update.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from sched_helpers import (
    fake_sample,
    finished_reasons,
    free_blocks,
    make_request,
    make_scheduler,
    run_step,
    state_snapshot,
)

from kvsched import ModelRunnerOutput, Request, RequestStatus, Scheduler
from kvsched.core import explain

# -- budgets and limits ------------------------------------------------------------


def test_token_budget_is_respected_and_the_rest_is_chunked() -> None:
    sched = make_scheduler(budget=32)
    for rid in "abc":
        sched.add_request(make_request(rid, 20, max_tokens=4))
    out, _ = run_step(sched)
    # a whole (20), then b gets the 12 tokens left; c nothing.
    assert out.num_scheduled_tokens == {"a": 20, "b": 12}
    assert sched.requests["b"].is_prefill_chunk
    assert [r.request_id for r in sched.waiting] == ["c"]
    out, _ = run_step(sched)
    # a decodes 1, b finishes its prompt (8), c fits in the 23 left.
    assert out.num_scheduled_tokens == {"a": 1, "b": 8, "c": 20}
    assert out.total_num_scheduled_tokens == 29
    while sched.has_unfinished_requests():
        out, _ = run_step(sched)
        assert out.total_num_scheduled_tokens <= 32


def test_max_num_seqs_is_respected() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        sched.add_request(make_request(rid, 4, max_tokens=1))
    out, result = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 4, "b": 4}
    assert finished_reasons(result) == {"a": "length", "b": "length"}
    out, result = run_step(sched)
    assert out.num_scheduled_tokens == {"c": 4}
    assert finished_reasons(result) == {"c": "length"}


def test_max_num_seqs_holds_while_the_running_ones_decode() -> None:
    sched = make_scheduler(max_num_seqs=2)
    for rid in "abc":
        sched.add_request(make_request(rid, 4, max_tokens=3))
    for expected in ({"a": 4, "b": 4}, {"a": 1, "b": 1}, {"a": 1, "b": 1}, {"c": 4}):
        out, _ = run_step(sched)
        assert len(sched.running) <= 2
        assert out.num_scheduled_tokens == expected


def test_long_prefill_threshold_caps_chunks_when_several_requests() -> None:
    sched = make_scheduler(budget=64, threshold=8)
    sched.add_request(make_request("a", 20, max_tokens=2))
    sched.add_request(make_request("b", 20, max_tokens=2))
    steps = [run_step(sched)[0].num_scheduled_tokens for _ in range(4)]
    assert steps == [{"a": 8, "b": 8}, {"a": 8, "b": 8}, {"a": 4, "b": 4}, {"a": 1, "b": 1}]
    assert not sched.has_unfinished_requests()


def test_long_prefill_threshold_is_ignored_for_a_single_request() -> None:
    sched = make_scheduler(budget=64, threshold=8)
    sched.add_request(make_request("a", 20, max_tokens=2))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 20}


def test_long_prefill_threshold_drops_once_the_other_request_finishes() -> None:
    sched = make_scheduler(budget=64, threshold=8)
    sched.add_request(make_request("a", 20, max_tokens=2))
    sched.add_request(make_request("b", 2, max_tokens=1))
    out, result = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 8, "b": 2}
    assert finished_reasons(result) == {"b": "length"}
    out, _ = run_step(sched)  # a is alone now: the rest of its prompt at once
    assert out.num_scheduled_tokens == {"a": 12}


def test_without_chunked_prefill_a_prompt_over_the_budget_stops_admission() -> None:
    sched = make_scheduler(budget=64, max_model_len=64, chunked=False)
    sched.add_request(make_request("a", 40, max_tokens=4))
    sched.add_request(make_request("b", 30, max_tokens=4))
    sched.add_request(make_request("c", 10, max_tokens=4))
    out, _ = run_step(sched)
    # b needs 30 with 24 left: not chunked, and c (10) behind it waits too.
    assert out.num_scheduled_tokens == {"a": 40}
    assert [r.request_id for r in sched.waiting] == ["b", "c"]
    assert not sched.requests["a"].is_prefill_chunk
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 1, "b": 30, "c": 10}


# -- preemption ------------------------------------------------------------------------


def _fcfs_tight() -> Scheduler:
    """3 usable blocks, each taken by one of a (4 tokens), b (2), c (4) in step 0."""
    sched = make_scheduler(num_gpu_blocks=4)
    sched.add_request(make_request("a", 4, max_tokens=2))
    sched.add_request(make_request("b", 2, max_tokens=8))
    sched.add_request(make_request("c", 4, max_tokens=8))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 4, "b": 2, "c": 4}
    assert free_blocks(sched) == 0
    return sched


def test_fcfs_preempts_the_last_running_request() -> None:
    sched = _fcfs_tight()
    c = sched.requests["c"]
    out, result = run_step(sched)
    # a's 5th token needs a new block; none is free, so the last running (c)
    # is preempted and its block goes to a. b's 3rd token fits its block.
    assert out.preempted_req_ids == {"c"}
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0
    assert c.num_preemptions == 1
    assert c.output_token_ids == [100]  # sampled tokens survive a preemption
    assert [r.request_id for r in sched.waiting] == ["c"]
    assert sched.kv_cache_manager.get_block_ids("c") == []
    assert finished_reasons(result) == {"a": "length"}
    assert sched.num_preemptions == 1


def test_preempted_request_resumes_recomputing_prompt_and_outputs() -> None:
    sched = _fcfs_tight()
    run_step(sched)  # c preempted, a finished: 2 blocks free
    c = sched.requests["c"]
    out, _ = run_step(sched)
    # c's 4 prompt tokens + 1 output are all recomputed in one go.
    assert out.num_scheduled_tokens == {"b": 1, "c": 5}
    cached = out.scheduled_cached_reqs
    assert cached.resumed_req_ids == {"c"}
    assert cached.num_computed_tokens["c"] == 0
    assert cached.resumed_token_ids["c"] == [*c.prompt_token_ids, 100]
    assert out.scheduled_new_reqs == []
    assert not c.is_prefill_chunk
    assert c.status == RequestStatus.RUNNING
    assert c.output_token_ids == [100, 100]  # and it samples again


def test_priority_preempts_the_max_priority_arrival_and_admits_nothing() -> None:
    sched = make_scheduler(num_gpu_blocks=5, policy="priority", budget=64, explain_admission=True)
    sched.add_request(make_request("b", 6, max_tokens=8, priority=5, arrival_time=0.0))
    run_step(sched)  # b: blocks 1, 2
    sched.add_request(make_request("a", 4, max_tokens=8, priority=0, arrival_time=1.0))
    sched.add_request(make_request("c", 3, max_tokens=8, priority=1, arrival_time=2.0))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"b": 1, "a": 4, "c": 3}
    assert [r.request_id for r in sched.running] == ["b", "a", "c"]
    assert free_blocks(sched) == 0
    d = make_request("d", 2, max_tokens=2, priority=0, arrival_time=3.0)
    sched.add_request(d)
    out, _ = run_step(sched)
    # b was scheduled first (its 8th token fits), then a needed a block: the
    # victim is b (priority 5), not the last running request c. b's token is
    # taken back.
    assert out.preempted_req_ids == {"b"}
    assert out.num_scheduled_tokens == {"a": 1, "c": 1}
    assert out.total_num_scheduled_tokens == 2
    # b freed 2 blocks, a took 1: d (1 block) would fit, but a step that
    # preempted admits nobody.
    assert free_blocks(sched) == 1
    assert d.status == RequestStatus.WAITING
    assert [r.request_id for r in sched.waiting] == ["d", "b"]
    assert out.not_admitted is not None
    assert {n.request_id: n.reason for n in out.not_admitted} == {
        "d": explain.REASON_PREEMPTION, "b": explain.REASON_PREEMPTION}


def test_priority_ties_are_broken_by_the_latest_arrival() -> None:
    sched = make_scheduler(num_gpu_blocks=5, policy="priority", budget=64)
    sched.add_request(make_request("p", 6, max_tokens=8, priority=1, arrival_time=0.0))
    run_step(sched)  # p: blocks 1, 2
    sched.add_request(make_request("y", 3, max_tokens=8, priority=1, arrival_time=10.0))
    run_step(sched)  # y: block 3
    sched.add_request(make_request("q", 2, max_tokens=8, priority=0, arrival_time=20.0))
    run_step(sched)  # q: block 4
    assert [r.request_id for r in sched.running] == ["p", "y", "q"]
    assert free_blocks(sched) == 0
    out, _ = run_step(sched)
    # p's 9th token needs a block. max((1, 0.0), (1, 10.0), (0, 20.0)) is y:
    # neither the last running request (q) nor the first with the largest priority value (p).
    assert out.preempted_req_ids == {"y"}
    assert out.num_scheduled_tokens == {"p": 1, "q": 1}


# -- aborts ----------------------------------------------------------------------------


def test_finish_requests_aborts_waiting_running_and_preempted() -> None:
    sched = make_scheduler(num_gpu_blocks=4)
    for rid, n in (("a", 4), ("b", 2), ("c", 4)):
        sched.add_request(make_request(rid, n, max_tokens=8))
    run_step(sched)
    sched.add_request(make_request("d", 4, max_tokens=8))
    out, _ = run_step(sched)
    assert out.preempted_req_ids == {"c"}
    assert [r.request_id for r in sched.running] == ["a", "b"]
    assert [(r.request_id, r.status) for r in sched.waiting] == [
        ("c", RequestStatus.PREEMPTED), ("d", RequestStatus.WAITING)]
    a, c, d = (sched.requests[x] for x in "acd")
    assert free_blocks(sched) == 0

    done = sched.finish_requests(["a", "c", "nope", "d", "a"])
    sched.check_invariants()
    assert done == [a, c, d]
    for r in done:
        assert r.status == RequestStatus.FINISHED_ABORTED
        assert r.finish_reason == "abort"
    assert set(sched.requests) == {"b"}
    assert [r.request_id for r in sched.running] == ["b"]
    assert len(sched.waiting) == 0
    assert free_blocks(sched) == 2  # a's two blocks
    out, _ = run_step(sched)
    assert {"a", "c", "d"} <= out.finished_req_ids
    assert list(out.num_scheduled_tokens) == ["b"]

    b = sched.requests["b"]
    assert sched.finish_requests("b") == [b]
    sched.check_invariants()
    assert free_blocks(sched) == 3
    assert not sched.has_unfinished_requests()


def test_finish_requests_ignores_unknown_and_finished_ids() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 4, max_tokens=1))
    _, result = run_step(sched)
    assert finished_reasons(result) == {"a": "length"}
    free = free_blocks(sched)
    assert sched.finish_requests(["a", "zzz"]) == []
    assert sched.finish_requests("zzz") == []
    sched.check_invariants()
    assert free_blocks(sched) == free


def test_finish_requests_refuses_a_non_finished_status() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 4))
    with pytest.raises(ValueError, match="finished_status"):
        sched.finish_requests("a", RequestStatus.RUNNING)
    sched.check_invariants()
    assert sched.requests["a"].status == RequestStatus.WAITING


def test_request_aborted_between_schedule_and_update_has_its_tokens_dropped() -> None:
    sched = make_scheduler()
    a = make_request("a", 4, max_tokens=4)
    sched.add_request(a)
    sched.add_request(make_request("b", 4, max_tokens=4))
    out = sched.schedule()
    runner_output = fake_sample(sched, out)
    assert runner_output.sampled_token_ids == [[100], [100]]
    assert sched.finish_requests("a") == [a]
    sched.check_invariants()
    result = sched.update_from_output(out, runner_output)
    sched.check_invariants()
    assert result.dropped == ["a"]
    assert a.output_token_ids == []
    assert result.finished == []
    assert sched.requests["b"].output_token_ids == [100]
    assert [o.request_id for o in result.outputs()] == ["b"]


def test_tokens_of_an_aborted_request_do_not_go_to_a_new_request_with_its_id() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 4, max_tokens=4))
    out = sched.schedule()
    runner_output = fake_sample(sched, out)
    sched.finish_requests("a")
    again = make_request("a", 4, max_tokens=4)
    sched.add_request(again)
    result = sched.update_from_output(out, runner_output)
    sched.check_invariants()
    assert result.dropped == ["a"]
    assert again.output_token_ids == []  # it has not run yet
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 4}  # its prompt, nothing more


# -- stop checks -------------------------------------------------------------------


def _run_until_finished(sched: Scheduler, rid: str, token: int) -> tuple[Request, Any]:
    request = sched.requests[rid]
    for _ in range(100):
        _, result = run_step(sched, {rid: [token]})
        if result.finished:
            assert [o.request_id for o in result.finished] == [rid]
            return request, result.finished[0]
    raise AssertionError(f"{rid} never finished")


@pytest.mark.parametrize("kwargs, token, reason, stop_reason, outputs", [
    ({"eos": 7}, 7, "stop", None, [7]),
    ({"eos": 7, "ignore_eos": True, "max_tokens": 3}, 7, "length", None, [7, 7, 7]),
    ({"stop": (5, 6)}, 6, "stop", 6, [6]),
    ({"eos": 7, "ignore_eos": True, "stop": (7,)}, 7, "stop", 7, [7]),
    ({"max_tokens": 3}, 100, "length", None, [100, 100, 100]),
    # EOS is checked before the length cap.
    ({"eos": 7, "max_tokens": 1}, 7, "stop", None, [7]),
])
def test_stop_checks(kwargs: dict[str, Any], token: int, reason: str, stop_reason: int | None,
                     outputs: list[int]) -> None:
    sched = make_scheduler()
    params = {"max_tokens": 10, **kwargs}
    sched.add_request(make_request("r", 4, **params))
    request, finished = _run_until_finished(sched, "r", token)
    assert finished.finish_reason == reason
    assert finished.stop_reason == stop_reason
    assert request.stop_reason == stop_reason
    assert request.output_token_ids == outputs
    assert request.finish_reason == reason
    assert "r" not in sched.requests
    assert free_blocks(sched) == 63


def test_max_model_len_caps_the_sequence() -> None:
    sched = make_scheduler(max_model_len=12)
    sched.add_request(make_request("r", 10, max_tokens=100))
    request, finished = _run_until_finished(sched, "r", 100)
    assert finished.finish_reason == "length"
    assert request.num_tokens == 12
    assert request.output_token_ids == [100, 100]


@pytest.mark.parametrize("kwargs, sampled, kept, reason, stop_reason", [
    ({"eos": 7}, [100, 7, 100, 100], [100, 7], "stop", None),
    ({"stop": (9,)}, [1, 2, 9, 3], [1, 2, 9], "stop", 9),
    ({"max_tokens": 3}, [1, 2, 3, 4, 5], [1, 2, 3], "length", None),
])
def test_tokens_sampled_past_a_stop_are_trimmed(kwargs: dict[str, Any], sampled: list[int],
                                                kept: list[int], reason: str,
                                                stop_reason: int | None) -> None:
    # Several tokens in one step come only with speculative decoding; the
    # stop checks then keep the tokens up to the stop (apply_stop_checks,
    # which update_from_output runs on one token today).
    sched = make_scheduler()
    params = {"max_tokens": 10, **kwargs}
    params["max_tokens"] += 1  # room for a first, ordinary token
    r = make_request("r", 4, **params)
    sched.add_request(r)
    _, result = run_step(sched, {"r": [50]})
    assert result.finished == []
    r.num_computed_tokens += len(sampled)  # as a step with len(sampled) - 1 drafts would
    assert Scheduler.apply_stop_checks(r, sampled) == len(kept)
    assert (r.finish_reason, r.stop_reason) == (reason, stop_reason)
    assert r.output_token_ids == [50, *kept]
    assert r.all_token_ids == [*r.prompt_token_ids, 50, *kept]
    assert r.num_computed_tokens == r.num_tokens - 1  # the rejected drafts rolled back


def test_more_than_one_token_without_drafts_is_refused() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("r", 4))
    run_step(sched)
    out = sched.schedule()
    before = state_snapshot(sched)
    with pytest.raises(ValueError, match="exactly one token"):
        sched.update_from_output(out, ModelRunnerOutput(["r"], [[1, 2]]))
    assert state_snapshot(sched) == before
    sched.update_from_output(out, ModelRunnerOutput(["r"], [[1]]))
    assert sched.requests["r"].output_token_ids == [100, 1]


# -- explanations and admission policies ------------------------------------------------


def _reasons(sched: Scheduler) -> dict[str, tuple[str, str]]:
    out, _ = run_step(sched)
    assert out.not_admitted is not None
    return {n.request_id: (n.reason, n.detail) for n in out.not_admitted}


class Hold:
    def __init__(self, reason: str | None) -> None:
        self.reason = reason
        self.calls = 0

    def hold_reason(self, scheduler: Scheduler, request: Request) -> str | None:
        self.calls += 1
        return self.reason


class MaxRunning:
    def __init__(self, limit: int) -> None:
        self.limit = limit

    def hold_reason(self, scheduler: Scheduler, request: Request) -> str | None:
        if len(scheduler.running) >= self.limit:
            return f"limit {self.limit}"
        return None


def test_explain_token_budget() -> None:
    sched = make_scheduler(budget=16, explain_admission=True)
    sched.add_request(make_request("a", 16))
    sched.add_request(make_request("b", 4))
    sched.add_request(make_request("c", 4))
    reasons = _reasons(sched)
    assert set(reasons) == {"b", "c"}
    for reason, detail in reasons.values():
        assert reason == explain.REASON_TOKEN_BUDGET
        assert "queued behind" not in detail


def test_explain_max_num_seqs() -> None:
    sched = make_scheduler(max_num_seqs=1, explain_admission=True)
    sched.add_request(make_request("a", 4))
    sched.add_request(make_request("b", 4))
    assert {k: v[0] for k, v in _reasons(sched).items()} == {"b": explain.REASON_MAX_NUM_SEQS}


def test_explain_kv_blocks_and_queued_behind() -> None:
    sched = make_scheduler(num_gpu_blocks=4, explain_admission=True)
    sched.add_request(make_request("a", 8, max_tokens=4))  # 2 of the 3 blocks
    sched.add_request(make_request("b", 8, max_tokens=4))  # needs 2: 1 free
    sched.add_request(make_request("c", 1, max_tokens=4))  # would fit, but queued
    reasons = _reasons(sched)
    assert list(reasons) == ["b", "c"]
    assert reasons["b"][0] == explain.REASON_KV_BLOCKS
    # The detail gives the blocks b needs (2, for its whole prompt) and the free ones (1).
    assert "block" in reasons["b"][1]
    assert re.search(r"\b2\b.*\b1\b", reasons["b"][1]), reasons["b"][1]
    assert reasons["c"] == (explain.REASON_KV_BLOCKS, "queued behind b")


def test_explain_chunked_prefill_off() -> None:
    sched = make_scheduler(budget=64, max_model_len=64, chunked=False, explain_admission=True)
    sched.add_request(make_request("a", 40))
    sched.add_request(make_request("b", 30))
    sched.add_request(make_request("c", 10))
    reasons = _reasons(sched)
    assert reasons["b"][0] == explain.REASON_CHUNKED_PREFILL_OFF
    assert reasons["c"] == (explain.REASON_CHUNKED_PREFILL_OFF, "queued behind b")


def test_explain_admission_policy() -> None:
    sched = make_scheduler(explain_admission=True, admission_policy=Hold("paused for a test"))
    sched.add_request(make_request("a", 4))
    sched.add_request(make_request("b", 4))
    assert _reasons(sched) == {"a": (explain.REASON_ADMISSION_POLICY, "paused for a test"),
                               "b": (explain.REASON_ADMISSION_POLICY, "queued behind a")}


def test_explain_preemption() -> None:
    sched = make_scheduler(num_gpu_blocks=4, explain_admission=True)
    for rid, n in (("a", 4), ("b", 2), ("c", 4)):
        sched.add_request(make_request(rid, n, max_tokens=8))
    assert _reasons(sched) == {}
    sched.add_request(make_request("d", 1, max_tokens=8))
    reasons = _reasons(sched)
    assert list(reasons) == ["c", "d"]  # c preempted to the head of the queue
    assert {r for r, _ in reasons.values()} == {explain.REASON_PREEMPTION}


def test_no_explanations_unless_asked() -> None:
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("a", 4))
    sched.add_request(make_request("b", 4))
    out, _ = run_step(sched)
    assert out.not_admitted is None


def test_admission_policy_holds_admission_but_not_running_requests() -> None:
    sched = make_scheduler(admission_policy=MaxRunning(1), explain_admission=True)
    for rid in "abc":
        sched.add_request(make_request(rid, 4, max_tokens=2))
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.not_admitted is not None
    assert out.not_admitted[0].request_id == "b"
    assert out.not_admitted[0].reason == explain.REASON_ADMISSION_POLICY
    out, result = run_step(sched)
    assert out.num_scheduled_tokens == {"a": 1}
    assert finished_reasons(result) == {"a": "length"}
    out, _ = run_step(sched)
    assert out.num_scheduled_tokens == {"b": 4}


def test_policy_returning_none_changes_nothing() -> None:
    policy = Hold(None)
    schedulers = [make_scheduler(num_gpu_blocks=6, budget=16, admission_policy=p)
                  for p in (None, policy)]
    traces: list[list[Any]] = [[], []]
    for sched, trace in zip(schedulers, traces):
        for i, n in enumerate((9, 5, 12, 3, 7)):
            sched.add_request(make_request(f"r{i}", tokens=[7 * i + t for t in range(n)],
                                           max_tokens=6))
        for _ in range(60):
            if not sched.has_unfinished_requests():
                break
            out, result = run_step(sched)
            trace.append((out.num_scheduled_tokens, out.preempted_req_ids,
                          finished_reasons(result)))
        assert not sched.has_unfinished_requests()
    assert policy.calls > 0
    assert any(step[1] for step in traces[0]), "the scenario should preempt"
    assert traces[0] == traces[1]


# -- stats and runner output validation ---------------------------------------------


def test_make_stats_counts_queues_and_prefix_cache() -> None:
    sched = make_scheduler(num_gpu_blocks=9, max_num_seqs=2, caching=True)
    tokens = list(range(1, 10))  # 9 tokens: 2 full blocks + 1
    sched.add_request(make_request("a", tokens=tokens))
    sched.add_request(make_request("b", tokens=list(tokens)))
    sched.add_request(make_request("c", 4))
    out, _ = run_step(sched)
    # b hit the two full blocks a allocated earlier in the same step.
    assert {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs} == {"a": 0, "b": 8}
    assert out.num_scheduled_tokens == {"a": 9, "b": 1}
    stats = sched.make_stats()
    assert stats.num_running_reqs == 2
    assert stats.num_waiting_reqs == 1
    assert stats.prefix_cache_queries == 18
    assert stats.prefix_cache_hits == 8
    assert stats.num_preemptions == 0
    assert stats.kv_cache_usage == pytest.approx(4 / 8)  # a: 3 blocks, b: 1 of its own


def test_make_stats_counts_preemptions() -> None:
    sched = _fcfs_tight()
    run_step(sched)
    stats = sched.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.num_preemptions) == (1, 1, 1)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (0, 0)  # caching off


BAD_RUNNER_OUTPUTS = {
    "missing": (["a"], [[1]]),
    "extra": (["a", "b", "z"], [[1], [1], [1]]),
    "wrong id": (["a", "z"], [[1], [1]]),
    "duplicate": (["a", "a"], [[1], [1]]),
    "short token lists": (["a", "b"], [[1]]),
    "empty": ([], []),
}


@pytest.mark.parametrize("name", list(BAD_RUNNER_OUTPUTS))
def test_update_from_output_rejects_output_not_matching_the_schedule(name: str) -> None:
    sched = make_scheduler()
    a = make_request("a", 4, max_tokens=1)
    b = make_request("b", 4, max_tokens=5)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    sched.check_invariants()
    req_ids, sampled = BAD_RUNNER_OUTPUTS[name]
    with pytest.raises(ValueError, match="req_ids"):
        sched.update_from_output(out, ModelRunnerOutput(list(req_ids), [list(s) for s in sampled]))
    sched.check_invariants()
    assert a.output_token_ids == [] and b.output_token_ids == []
    assert a.status == b.status == RequestStatus.RUNNING
    assert [r.request_id for r in sched.running] == ["a", "b"]
    # The right output is still accepted afterwards.
    result = sched.update_from_output(out, ModelRunnerOutput(["a", "b"], [[1], [2]]))
    sched.check_invariants()
    assert finished_reasons(result) == {"a": "length"}
    assert b.output_token_ids == [2]


def test_an_idle_step_schedules_nothing() -> None:
    sched = make_scheduler()
    out, result = run_step(sched)
    assert out.num_scheduled_tokens == {}
    assert out.total_num_scheduled_tokens == 0
    assert result.finished == [] and result.dropped == []


# -- runner_inputs=False ----------------------------------------------------------------

@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_without_runner_inputs_only_the_runner_lists_are_left_out(policy: str) -> None:
    # A tight cache: admissions, chunked prefills, preemptions and resumptions.
    scheds = [make_scheduler(num_gpu_blocks=12, block_size=4, budget=16, max_num_seqs=4, caching=True,
                             policy=policy, **({} if full else {"runner_inputs": False}))
              for full in (True, False)]
    for i in range(6):
        tokens = [7] * 8 + [1000 + i] * (6 + i)  # a shared prefix, then private
        for sched in scheds:
            sched.add_request(make_request(f"r{i}", tokens=tokens, max_tokens=9, priority=i % 3,
                                           arrival_time=float(i)))
    seen_resumed = seen_blocks = False
    for _ in range(200):
        if not scheds[0].has_unfinished_requests():
            break
        full, lean = (s.schedule() for s in scheds)
        cached_full, cached_lean = full.scheduled_cached_reqs, lean.scheduled_cached_reqs
        resumed = cached_full.resumed_req_ids
        seen_resumed |= bool(resumed)
        seen_blocks |= any(n.block_ids for n in full.scheduled_new_reqs)
        assert [(n.req_id, n.num_computed_tokens, n.sampling_params) for n in full.scheduled_new_reqs] == \
            [(n.req_id, n.num_computed_tokens, n.sampling_params) for n in lean.scheduled_new_reqs]
        assert all(not n.prompt_token_ids and not n.block_ids for n in lean.scheduled_new_reqs)
        assert (cached_full.req_ids, cached_full.num_computed_tokens, resumed) == \
            (cached_lean.req_ids, cached_lean.num_computed_tokens, cached_lean.resumed_req_ids)
        assert {r: b for r, b in cached_full.new_block_ids.items() if r not in resumed} == \
            cached_lean.new_block_ids
        assert set(cached_full.resumed_token_ids) == resumed and not cached_lean.resumed_token_ids
        for name in ("num_scheduled_tokens", "total_num_scheduled_tokens", "preempted_req_ids",
                     "finished_req_ids", "admission_stop"):
            assert getattr(full, name) == getattr(lean, name), name
        for sched, out in zip(scheds, (full, lean)):
            sched.update_from_output(out, fake_sample(sched, out))
            sched.check_invariants()
    assert seen_resumed and seen_blocks, "the scenario no longer exercises resumption"
