"""Scheduler.add_request: what it refuses, and that a refusal changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched import (
    CacheConfig,
    ModelRunnerOutput,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
)
from kvsched.request import TokenRuns

BLOCK_SIZE = 4
USABLE_BLOCKS = 5  # 20 tokens of KV; num_gpu_blocks counts the null block too
MAX_MODEL_LEN = 24


def _request(rid: str, n: int, max_tokens: int = 4, min_tokens: int = 0) -> Request:
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens,
                                                              min_tokens=min_tokens))


def _step(sched: Scheduler) -> None:
    output = sched.schedule()
    req_ids = list(output.num_scheduled_tokens)
    sampled = [[] if sched.requests[r].is_prefill_chunk else [100] for r in req_ids]
    sched.update_from_output(output, ModelRunnerOutput(req_ids, sampled))
    sched.check_invariants()


@pytest.fixture
def sched() -> Scheduler:
    """r1 running (holding 2 blocks), r2 waiting behind max_num_seqs=1."""
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1,
                                  max_model_len=MAX_MODEL_LEN),
                  CacheConfig(num_gpu_blocks=USABLE_BLOCKS + 1, block_size=BLOCK_SIZE))
    s.add_request(_request("r1", 6))
    s.add_request(_request("r2", 3))
    _step(s)
    assert [r.request_id for r in s.running] == ["r1"]
    assert [r.request_id for r in s.waiting] == ["r2"]
    return s


def _snapshot(s: Scheduler) -> dict[str, Any]:
    return {
        "requests": dict(s.requests),
        "running": [r.request_id for r in s.running],
        "waiting": [r.request_id for r in s.waiting],
        "free": s.kv_cache_manager.block_pool.get_num_free_blocks(),
        "tables": {k: list(v) for k, v in s.kv_cache_manager.req_to_blocks.items()},
    }


REJECTED: list[tuple[str, Callable[[], Request], tuple[str, ...]]] = [
    ("empty prompt", lambda: _request("x", 0), ("x", "empty")),
    ("prompt == max_model_len", lambda: _request("x", MAX_MODEL_LEN), ("max_model_len", "24")),
    ("prompt > max_model_len", lambda: _request("x", 30), ("max_model_len", "30")),
    ("max_tokens 0", lambda: _request("x", 3, max_tokens=0), ("max_tokens", "0")),
    ("max_tokens negative", lambda: _request("x", 3, max_tokens=-2), ("max_tokens", "-2")),
    ("min_tokens > max_tokens", lambda: _request("x", 3, max_tokens=2, min_tokens=3),
     ("min_tokens=3", "max_tokens=2")),
    ("duplicate of running", lambda: _request("r1", 3), ("r1", "already")),
    ("duplicate of waiting", lambda: _request("r2", 3), ("r2", "already")),
    # 10 + 11 tokens: the last one never needs KV, so 20 tokens = 6 blocks of 4 > 5.
    ("never fits the cache", lambda: _request("x", 10, max_tokens=12), ("x", "blocks", "max_tokens")),
]


@pytest.mark.parametrize("make, expected", [(m, e) for _, m, e in REJECTED],
                         ids=[name for name, _, _ in REJECTED])
def test_rejected_request_changes_nothing(sched: Scheduler, make: Callable[[], Request],
                                          expected: tuple[str, ...]) -> None:
    before = _snapshot(sched)
    request = make()
    with pytest.raises(ValueError) as info:
        sched.add_request(request)
    for text in expected:
        assert text in str(info.value), str(info.value)
    assert _snapshot(sched) == before
    sched.check_invariants()
    # The scheduler still works afterwards.
    _step(sched)


def test_request_that_exactly_fits_the_cache_is_accepted_and_runs(sched: Scheduler) -> None:
    # 10 + 11 = 21 tokens; KV is needed for the first 20 = exactly the 5 usable blocks.
    fits = _request("fits", 10, max_tokens=11)
    sched.add_request(fits)
    sched.check_invariants()
    assert sched.requests["fits"] is fits
    assert [r.request_id for r in sched.waiting] == ["r2", "fits"]
    for _ in range(200):
        if not sched.has_unfinished_requests():
            break
        _step(sched)
    assert not sched.has_unfinished_requests()
    assert fits.status == RequestStatus.FINISHED_LENGTH_CAPPED
    assert fits.num_output_tokens == 11


def test_max_model_len_caps_the_kv_a_request_can_need() -> None:
    # max_tokens is huge, but the sequence stops at max_model_len=17: 16 tokens of KV.
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=17),
                  CacheConfig(num_gpu_blocks=5, block_size=4))
    s.add_request(_request("capped", 10, max_tokens=1000))
    assert "capped" in s.requests
    s.check_invariants()


def test_a_used_request_object_is_rejected(sched: Scheduler) -> None:
    r1 = sched.requests["r1"]
    sched.finish_requests("r1")
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="r1"):
        sched.add_request(r1)  # finished, not fresh
    assert _snapshot(sched) == before


def test_an_id_can_be_reused_after_its_request_finished(sched: Scheduler) -> None:
    sched.finish_requests("r1")
    again = _request("r1", 3)
    sched.add_request(again)
    assert sched.requests["r1"] is again
    sched.check_invariants()


# -- TokenRuns: a runs prompt behaves as its expanded token list ---------------

_runs = st.lists(st.tuples(st.integers(0, 4), st.integers(1, 9)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_runs, st.lists(st.integers(-3, 3), max_size=8), st.data())
def test_token_runs_reads_as_its_list(runs: list[tuple[int, int]], tail: list[int],
                                      data: st.DataObject) -> None:
    expanded = [t for t, c in runs for _ in range(c)]
    seq = TokenRuns(runs)
    assert len(seq) == len(expanded) and list(seq) == expanded and seq == expanded
    copy = seq.copy()
    for t in tail:
        copy.append(t)
    expanded_all = expanded + tail
    assert seq == expanded, "a copy's appends do not reach the original"
    assert len(copy) == len(expanded_all) and list(copy) == expanded_all
    n = len(expanded_all)
    for i in range(-n, n):
        assert copy[i] == expanded_all[i]
    with pytest.raises(IndexError):
        copy[n]
    a = data.draw(st.integers(-n - 2, n + 2))
    b = data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    assert copy[a:b:step] == expanded_all[a:b:step]
    bs = data.draw(st.integers(1, 5))
    first = data.draw(st.integers(0, n // bs))
    blocks = list(copy.block_contents(first, n // bs - first, bs))
    for j, block in enumerate(blocks, first):
        want = expanded_all[j * bs:(j + 1) * bs]
        assert (want == [block] * bs) if isinstance(block, int) else block == want
    copy.extend([7, 8])
    assert list(copy) == [*expanded_all, 7, 8]


def test_runs_request_matches_list_request() -> None:
    runs = ((5, 3), (1_000_000_007, 4))
    lazy = Request("a", TokenRuns(runs), SamplingParams(max_tokens=4))
    plain = Request("a", [5, 5, 5] + [1_000_000_007] * 4, SamplingParams(max_tokens=4))
    assert lazy.prompt_token_ids == plain.prompt_token_ids
    assert type(lazy.prompt_token_ids) is list
    assert (lazy.num_prompt_tokens, lazy.stop_len, lazy.num_tokens) == (7, 11, 7)
    lazy.all_token_ids.append(-1)
    assert lazy.all_token_ids == [*plain.prompt_token_ids, -1]
    assert lazy.prompt_token_ids == plain.prompt_token_ids, "the prompt does not grow"
