"""Issue 11's reproducers for the scheduler API: each bad call raises
ValueError/TypeError naming what is wrong, and changes nothing."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
from sched_helpers import fake_sample, make_request, make_scheduler, run_step, state_snapshot

from kvsched import ModelRunnerOutput, Request, RequestStatus, SamplingParams, Scheduler
from kvsched.core.fast_forward import fast_forward_decode


def _two_running() -> tuple[Scheduler, Any]:
    """'a' (max_tokens=1) and 'b' scheduled for their prefill, output pending."""
    sched = make_scheduler(caching=True)
    sched.add_request(make_request("a", 4, max_tokens=1))
    sched.add_request(make_request("b", 4))
    return sched, sched.schedule()


@pytest.mark.parametrize("sampled, match", [
    ([[100], 7], "must be a list"),              # an int where a list belongs
    ([[100], [[1]]], "not an int"),              # an unhashable token
    ([[100], ["x"]], "not an int"),
    ([[100], [None]], "not an int"),
    ([[100], [2.5]], "not an int"),
    ([[100], [-9]], "out of range"),
    ([[100], [True]], "not an int"),
    ([[100], []], "exactly one token"),
    ([[100], [1, 2]], "exactly one token"),
])
def test_a_bad_runner_output_changes_nothing(sampled: list[Any], match: str) -> None:
    sched, out = _two_running()
    before = state_snapshot(sched)
    with pytest.raises((ValueError, TypeError), match=match):
        sched.update_from_output(out, ModelRunnerOutput(["a", "b"], sampled))
    assert state_snapshot(sched) == before
    sched.check_invariants()
    # The follow-up: once both are aborted nothing is left and the
    # next schedule() works (it raised KeyError: 'a' before).
    sched.finish_requests(["a", "b"])
    assert not sched.has_unfinished_requests()
    # The step still wants its answer; for aborted requests the tokens are dropped.
    result = sched.update_from_output(out, ModelRunnerOutput(["a", "b"], [[100], [100]]))
    assert result.dropped == ["a", "b"] and result.finished == []
    sched.add_request(make_request("c", 4))
    run_step(sched)
    sched.check_invariants()


def test_an_output_applies_once_and_in_order() -> None:
    sched, out = _two_running()
    good = fake_sample(sched, out)
    sched.update_from_output(out, good)
    before = state_snapshot(sched)
    with pytest.raises(ValueError, match="applied already"):
        sched.update_from_output(out, good)  # twice
    assert state_snapshot(sched) == before
    second = sched.schedule()
    with pytest.raises(ValueError, match="applied already"):
        sched.update_from_output(out, good)  # stale: from an earlier step
    with pytest.raises(ValueError, match="has not been applied"):
        sched.schedule()  # a second step while one is in flight
    sched.update_from_output(second, fake_sample(sched, second))
    sched.check_invariants()


def test_tokens_for_a_request_mid_prefill_are_refused() -> None:
    sched = make_scheduler(budget=8, max_num_seqs=4)
    sched.add_request(make_request("p", 20))
    out = sched.schedule()
    assert sched.requests["p"].is_prefill_chunk
    before = state_snapshot(sched)
    with pytest.raises(ValueError, match="mid-way through its prefill"):
        sched.update_from_output(out, ModelRunnerOutput(["p"], [[100]]))
    assert state_snapshot(sched) == before


@pytest.mark.parametrize("call, match", [
    (lambda s, o: s.update_from_output(o, None), "must be a ModelRunnerOutput"),
    (lambda s, o: s.update_from_output(None, ModelRunnerOutput([], [])), "must be the SchedulerOutput"),
    (lambda s, o: s.add_request(None), "must be a kvsched Request"),
    (lambda s, o: s.finish_requests("a", 99), "not a finished status"),
    (lambda s, o: s.finish_requests("a", RequestStatus.RUNNING), "not a finished status"),
    (lambda s, o: s.finish_requests(["a", None]), "not a request id"),
    (lambda s, o: s.finish_requests(7), "iterable"),
    (lambda s, o: fast_forward_decode(s, 1, [100, 100]), "has not been applied"),
])
def test_bad_arguments_are_named(call: Any, match: str) -> None:
    sched, out = _two_running()
    before = state_snapshot(sched)
    with pytest.raises((ValueError, TypeError), match=match):
        call(sched, out)
    assert state_snapshot(sched) == before
    assert sched.requests["a"].status is RequestStatus.RUNNING  # 'a' not aborted halfway


def _request(**changes: Any) -> Request:
    tokens = changes.pop("tokens", [1, 2, 3])
    params = dataclasses.replace(SamplingParams(max_tokens=4), **changes.pop("params", {}))
    return Request("r", tokens, params, **changes)


@pytest.mark.parametrize("make, match", [
    (lambda: _request(tokens=["a", "b"]), "not an int"),
    (lambda: _request(tokens=[1.0, 2.0]), "not an int"),
    (lambda: _request(tokens=[None]), "not an int"),
    (lambda: _request(tokens=[[1]]), "not an int"),       # unhashable: broke schedule() halfway
    (lambda: _request(tokens=[5, -1]), "out of range"),
    (lambda: _request(tokens=[10**30]), "out of range"),
    (lambda: _request(tokens=[True]), "not an int"),
    (lambda: _request(arrival_time=math.nan), "arrival_time"),
    (lambda: _request(arrival_time=math.inf), "arrival_time"),
    (lambda: _request(arrival_time=-5.0), "arrival_time"),
    (lambda: _request(params={"min_tokens": True}), "min_tokens"),
    (lambda: _request(params={"ignore_eos": 1}), "ignore_eos"),
    (lambda: _request(priority=1.5), "priority"),
    (lambda: _request(private="yes"), "private"),
])
def test_garbage_requests_are_refused(make: Any, match: str) -> None:
    sched = make_scheduler(caching=True)
    sched.add_request(make_request("ok", 4))
    before = state_snapshot(sched)
    with pytest.raises(ValueError, match=match):
        sched.add_request(make())
    assert state_snapshot(sched) == before
    run_step(sched)  # and the scheduler goes on


@pytest.mark.parametrize("tokens", ["abc", b"abc", 5])
def test_a_prompt_that_is_not_a_token_sequence_is_refused(tokens: Any) -> None:
    # Request("r", "abc") became ['a', 'b', 'c'] before.
    with pytest.raises(TypeError, match="sequence of int token ids"):
        Request("r", tokens)


def test_the_vocabulary_bounds_tokens() -> None:
    sched = Scheduler(make_scheduler().scheduler_config, make_scheduler().cache_config,
                      vocab_size=1000)
    with pytest.raises(ValueError, match=r"out of range; ids must be in \[0, 1000\)"):
        sched.add_request(Request("r", [5, 1000]))
    sched.add_request(Request("r", [5, 999]))
    out = sched.schedule()
    before = state_snapshot(sched)
    with pytest.raises(ValueError, match="out of range"):
        sched.update_from_output(out, ModelRunnerOutput(["r"], [[1000]]))
    assert state_snapshot(sched) == before
    sched.update_from_output(out, ModelRunnerOutput(["r"], [[999]]))
    assert sched.requests["r"].output_token_ids == [999]


@pytest.mark.parametrize("vocab_size", [0, -1, True, 2**64, 10.0])
def test_a_bad_vocab_size_is_refused(vocab_size: Any) -> None:
    base = make_scheduler()
    with pytest.raises(ValueError, match="vocab_size"):
        Scheduler(base.scheduler_config, base.cache_config, vocab_size=vocab_size)
