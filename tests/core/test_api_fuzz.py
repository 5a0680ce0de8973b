"""The scheduler API under valid and invalid calls mixed (issue 11).

A random walk over ``add_request``, ``schedule``, ``update_from_output``,
``finish_requests`` and ``fast_forward_decode`` in which some calls are bad
the way a careless user or a buggy model runner makes them: garbage prompt
tokens, NaN arrival times, booleans for counts, unknown statuses, runner
outputs with wrong ids, wrong token counts, tokens for a request still
prefilling, non-int or out-of-range tokens, an output applied twice or late,
``schedule()`` while a step is in flight. Every bad call must raise
ValueError or TypeError and leave the scheduler exactly as it was (a full
state snapshot, ``sched_helpers.state_snapshot``); after every call the
invariants hold; at the end every request finishes and every block comes
back (nothing stuck, nothing leaked).

CI runs a fixed, derandomized set. ``KVSCHED_API_FUZZ_EXAMPLES=N`` runs N
random walks on a fresh seed (``KVSCHED_API_FUZZ_SEED``) and
``KVSCHED_API_FUZZ_REPORT=path`` writes the tally of calls made.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from sched_helpers import state_snapshot
from test_properties import Model, _abort, _add, _check_output, scheduler_configs

from kvsched import (
    CacheConfig,
    ModelRunnerOutput,
    Request,
    RequestStatus,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
)
from kvsched.core.fast_forward import decode_stretch_plan, fast_forward_decode
from kvsched.core.output import SchedulerOutput

EXAMPLES = int(os.environ.get("KVSCHED_API_FUZZ_EXAMPLES", "0"))
TALLY: Counter[str] = Counter()  # calls made, by kind (reported by the long run)
GOOD_TOKEN = 100

if EXAMPLES:
    SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                        suppress_health_check=list(HealthCheck))
else:
    SETTINGS = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    path = os.environ.get("KVSCHED_API_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"calls": sum(TALLY.values()), "by_kind": dict(sorted(TALLY.items()))}, f,
                      indent=1)


def _refused(m: Model, kind: str, call: Callable[[], object]) -> None:
    """A bad call: ValueError or TypeError, and not one bit of state changed."""
    TALLY[kind] += 1
    before = state_snapshot(m.sched)
    with pytest.raises((ValueError, TypeError)):
        call()
    assert state_snapshot(m.sched) == before, f"{kind}: a refused call changed the state"
    m.check()


# -- bad requests ---------------------------------------------------------------------------

def _bad_request(data: st.DataObject, m: Model) -> Callable[[], object]:
    live = m.live_ids()
    rid = f"bad{m.next_id}"
    kind = data.draw(st.sampled_from([
        "str_prompt", "float_token", "none_token", "negative", "huge", "bool_token", "nested",
        "empty", "nan_arrival", "inf_arrival", "negative_arrival", "float_priority",
        "bool_min_tokens", "int_ignore_eos", "str_private", "none", "params_type", "duplicate",
        "zero_max_tokens"]))
    ok = [1, 2, 3]
    if kind == "duplicate":
        if live:
            return lambda: m.sched.add_request(Request(data.draw(st.sampled_from(live)), ok))
        kind = "empty"
    if kind == "none":
        return lambda: m.sched.add_request(None)  # type: ignore[arg-type]
    if kind == "str_prompt":
        return lambda: m.sched.add_request(Request(rid, "abc"))
    if kind == "params_type":
        return lambda: m.sched.add_request(Request(rid, ok, {"max_tokens": 4}))  # type: ignore[arg-type]
    tokens: list[Any] = {
        "float_token": [1, 2.5], "none_token": [1, None], "negative": [3, -1], "huge": [2**63],
        "bool_token": [True, 1], "nested": [[1], 2], "empty": []}.get(kind, ok)
    params = SamplingParams(max_tokens=4)
    if kind == "bool_min_tokens":
        params = dataclasses.replace(params, min_tokens=True)
    elif kind == "int_ignore_eos":
        params = dataclasses.replace(params, ignore_eos=1)  # type: ignore[arg-type]
    elif kind == "zero_max_tokens":
        params = dataclasses.replace(params, max_tokens=0)
    arrival = {"nan_arrival": math.nan, "inf_arrival": math.inf,
               "negative_arrival": -5.0}.get(kind, 0.0)
    request = Request(rid, tokens, params, arrival_time=arrival)
    if kind == "float_priority":
        request.priority = 1.5  # type: ignore[assignment]
    if kind == "str_private":
        request.private = "yes"  # type: ignore[assignment]
    return lambda: m.sched.add_request(request)


# -- bad aborts -----------------------------------------------------------------------------

def _bad_finish(data: st.DataObject, m: Model) -> Callable[[], object]:
    live = m.live_ids() or ["nobody"]
    rid = data.draw(st.sampled_from(live))
    return data.draw(st.sampled_from([
        lambda: m.sched.finish_requests(rid, 99),  # type: ignore[arg-type]
        lambda: m.sched.finish_requests([rid], RequestStatus.RUNNING),
        lambda: m.sched.finish_requests([rid], 6),  # type: ignore[arg-type]
        lambda: m.sched.finish_requests(5),  # type: ignore[arg-type]
        lambda: m.sched.finish_requests([rid, None]),  # type: ignore[list-item]
        lambda: m.sched.finish_requests([rid, 3]),  # type: ignore[list-item]
    ]))


# -- bad runner outputs ---------------------------------------------------------------------

def _valid_sample(sched: Scheduler, output: SchedulerOutput, data: st.DataObject | None
                  ) -> ModelRunnerOutput:
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        request = sched.requests.get(rid)
        if request is not None and request.is_prefill_chunk:
            sampled.append([])
        else:
            sampled.append([GOOD_TOKEN if data is None
                            else data.draw(st.sampled_from([GOOD_TOKEN, GOOD_TOKEN, 8, 5, 6, 7]))])
    return ModelRunnerOutput(req_ids, sampled)


def _bad_outputs(data: st.DataObject, sched: Scheduler, output: SchedulerOutput,
                 good: ModelRunnerOutput) -> list[tuple[str, Callable[[], object]]]:
    """Runner outputs that must be refused for the step ``output``."""
    ids, sampled = good.req_ids, good.sampled_token_ids
    bad: list[tuple[str, Callable[[], object]]] = [
        ("output_none", lambda: sched.update_from_output(output, None)),  # type: ignore[arg-type]
        ("output_sched_none", lambda: sched.update_from_output(None, good)),  # type: ignore[arg-type]
        ("output_other_step", lambda: sched.update_from_output(dataclasses.replace(output), good)),
        ("output_tuple_ids", lambda: sched.update_from_output(
            output, ModelRunnerOutput(tuple(ids), sampled))),  # type: ignore[arg-type]
        ("output_extra_id", lambda: sched.update_from_output(
            output, ModelRunnerOutput([*ids, "zzz"], [*sampled, [GOOD_TOKEN]]))),
        ("output_missing_id", lambda: sched.update_from_output(
            output, ModelRunnerOutput(ids[1:], sampled[1:]))),
        ("output_short_sampled", lambda: sched.update_from_output(
            output, ModelRunnerOutput(ids, sampled[:-1]))),
    ]
    if len(ids) > 1:
        bad.append(("output_duplicate_id", lambda: sched.update_from_output(
            output, ModelRunnerOutput([ids[0], *ids[:-1]], sampled))))
    i = data.draw(st.integers(0, len(ids) - 1))
    token_lists: list[Any]
    if sampled[i]:  # a request that samples this step
        token_lists = [[], [GOOD_TOKEN, GOOD_TOKEN], ["x"], [None], [2.5], [-9], [2**63], [True],
                       (GOOD_TOKEN,), GOOD_TOKEN, [[GOOD_TOKEN]]]
    else:  # a request mid-way through its prefill
        token_lists = [[GOOD_TOKEN], [0], (), None]
    entry = data.draw(st.sampled_from(token_lists))
    broken = [*sampled[:i], entry, *sampled[i + 1:]]
    bad.append(("output_bad_tokens", lambda: sched.update_from_output(
        output, ModelRunnerOutput(ids, broken))))
    chosen = data.draw(st.lists(st.sampled_from(bad), min_size=1, max_size=3, unique_by=lambda b: b[0]))
    return chosen


# -- the walk -------------------------------------------------------------------------------

def _step(data: st.DataObject | None, m: Model, mode: str = "step") -> None:
    sched = m.sched
    TALLY["schedule"] += 1
    output = sched.schedule()
    m.check()
    _check_output(m, output)
    good = _valid_sample(sched, output, data)
    if data is not None and output.num_scheduled_tokens:
        if mode == "bad":
            for kind, call in _bad_outputs(data, sched, output, good):
                _refused(m, kind, call)
            _refused(m, "schedule_in_flight", sched.schedule)
            _refused(m, "fast_forward_in_flight", lambda: fast_forward_decode(sched, 1, [GOOD_TOKEN]))
        elif mode == "mid":
            victim = data.draw(st.sampled_from(good.req_ids))
            TALLY["finish_requests"] += 1
            for r in sched.finish_requests([victim]):
                m.finished[r.request_id] += 1
            m.check()
    TALLY["update_from_output"] += 1
    result = sched.update_from_output(output, good)
    for o in result.finished:
        assert o.finish_reason in ("stop", "length")
        m.finished[o.request_id] += 1
    m.check()
    if data is not None and output.num_scheduled_tokens and data.draw(st.integers(0, 3)) == 0:
        _refused(m, "output_applied_twice", lambda: sched.update_from_output(output, good))


def _fast_forward(data: st.DataObject, m: Model) -> None:
    sched = m.sched
    k, _, _ = decode_stretch_plan(sched, through_finish=False)
    n = len(sched.running)
    if k > 0:
        steps = data.draw(st.integers(1, k))
        TALLY["fast_forward_decode"] += 1
        fast_forward_decode(sched, steps, [GOOD_TOKEN] * n)
        m.check()
    bad = [
        ("ff_zero_steps", lambda: fast_forward_decode(sched, 0, [GOOD_TOKEN] * n)),
        ("ff_str_steps", lambda: fast_forward_decode(sched, "2", [GOOD_TOKEN] * n)),  # type: ignore[arg-type]
        ("ff_token_count", lambda: fast_forward_decode(sched, 1, [GOOD_TOKEN] * (n + 1))),
        ("ff_bad_token", lambda: fast_forward_decode(sched, 1, ["x"] * n)),  # type: ignore[list-item]
        ("ff_negative_token", lambda: fast_forward_decode(sched, 1, [-1] * n)),
        ("ff_too_far", lambda: fast_forward_decode(sched, 10**6, [GOOD_TOKEN] * n)),
    ]
    kind, call = data.draw(st.sampled_from(bad))
    if kind == "ff_too_far" and not n:
        return
    _refused(m, kind, call)


def run_walk(configs: tuple[SchedulerConfig, CacheConfig], data: st.DataObject) -> None:
    sched_config, cache_config = configs
    m = Model(Scheduler(sched_config, cache_config))
    m.check()
    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(st.sampled_from([
            "add", "add", "add", "step", "step", "step", "step", "abort", "mid", "ff",
            "bad_add", "bad_finish", "bad_step", "bad_step"]))
        if op == "add":
            TALLY["add_request"] += 1
            _add(data, m)
        elif op == "abort":
            TALLY["finish_requests"] += 1
            _abort(data, m)
        elif op == "ff":
            _fast_forward(data, m)
        elif op == "bad_add":
            _refused(m, "bad_add_request", _bad_request(data, m))
        elif op == "bad_finish":
            _refused(m, "bad_finish_requests", _bad_finish(data, m))
        else:
            _step(data, m, {"step": "step", "mid": "mid", "bad_step": "bad"}[op])
    # Drain: every request must finish and every block come back.
    bound = 20 + 4 * sum(r.num_prompt_tokens + r.max_tokens for r in m.sched.requests.values())
    for _ in range(bound):
        if not m.sched.has_unfinished_requests():
            break
        _step(None, m)
    assert not m.sched.has_unfinished_requests(), "requests never finished (stuck)"
    assert set(m.finished) == m.added
    pool = m.sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == cache_config.num_gpu_blocks - 1, "blocks leaked"


# ~6 s: the input fuzzers' slow tier.
@pytest.mark.slow
@seed(int(os.environ.get("KVSCHED_API_FUZZ_SEED", "0")))
@SETTINGS
@given(scheduler_configs(), st.data())
def test_valid_and_invalid_calls_mixed(configs: tuple[SchedulerConfig, CacheConfig],
                                       data: st.DataObject) -> None:
    run_walk(configs, data)
