"""The rule "may this scheduler state fast-forward" has one owner.

``kvsched.core.fast_forward.stretch_refusal`` decides it; the planner
(``decode_stretch_plan``), the jump (``fast_forward_decode``) and the
simulator (``Rank.stretch_limit``) only ask it. The table below pins the
rule state by state: changing the rule (or bypassing it in one of its
callers) fails here.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.config import SpeculativeConfig
from kvsched.core.fast_forward import decode_stretch_plan, fast_forward_decode, stretch_refusal
from kvsched.core.output import SchedulerOutput
from kvsched.core.policies import PrefillCadence


def _sched(async_scheduling: bool = False, **kw: object) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4, max_model_len=128,
                                     async_scheduling=async_scheduling),
                     CacheConfig(num_gpu_blocks=64, block_size=4, enable_prefix_caching=False),
                     **kw)  # type: ignore[arg-type]


def _add(s: Scheduler, rid: str, prompt_len: int) -> None:
    s.add_request(Request(rid, [5] * prompt_len, SamplingParams(max_tokens=50, ignore_eos=True)))


def _apply(s: Scheduler, out: SchedulerOutput) -> None:
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(out, ModelRunnerOutput(ids, [[] if r in out.prefill_chunk_req_ids else [7]
                                                      for r in ids]))


def _sync_steps(s: Scheduler, n: int) -> None:
    for _ in range(n):
        _apply(s, s.schedule())


def _async_iterations(s: Scheduler, queue: list[SchedulerOutput], n: int) -> None:
    for _ in range(n):
        queue.insert(0, s.schedule())
        if len(queue) == 2:
            _apply(s, queue.pop())


def sync_decoding() -> Scheduler:
    s = _sched()
    _add(s, "a", 3)
    _sync_steps(s, 2)
    return s


def sync_step_in_flight() -> Scheduler:
    s = sync_decoding()
    s.schedule()
    return s


def sync_request_waiting() -> Scheduler:
    s = sync_decoding()
    _add(s, "b", 3)
    return s


def sync_policy_installed() -> Scheduler:
    s = _sched(admission_policy=PrefillCadence(2))
    _add(s, "a", 3)
    _sync_steps(s, 2)
    return s


def sync_mid_prefill() -> Scheduler:
    s = _sched()
    _add(s, "a", 20)  # 8 tokens a step
    _sync_steps(s, 1)
    return s


def sync_first_token_pending() -> Scheduler:
    s = _sched()
    _add(s, "a", 17)  # 8 + 8 leaves one prompt token: looks like a decode
    _sync_steps(s, 2)
    return s


def speculative() -> Scheduler:
    s = _sched(speculative_config=SpeculativeConfig(num_speculative_tokens=2, method="ngram"))
    _add(s, "a", 3)
    _sync_steps(s, 2)
    return s


def async_decoding() -> Scheduler:
    s = _sched(async_scheduling=True)
    _add(s, "a", 3)
    _async_iterations(s, [], 3)
    return s


def async_prefill_in_flight() -> Scheduler:
    s = _sched(async_scheduling=True)
    _add(s, "a", 3)
    _async_iterations(s, [], 1)  # a's whole prompt in flight, nothing applied
    return s


def async_chunk_in_flight() -> Scheduler:
    s = _sched(async_scheduling=True)
    _add(s, "a", 20)
    _async_iterations(s, [], 1)  # the first 8 of 20 tokens in flight
    return s


def async_two_in_flight() -> Scheduler:
    s = _sched(async_scheduling=True)
    _add(s, "a", 3)
    _async_iterations(s, [], 3)
    s.schedule()
    return s


RULE: list[tuple[Callable[[], Scheduler], str | None]] = [
    (sync_decoding, None),
    (sync_step_in_flight, "has not been applied"),
    (sync_request_waiting, "not settled"),
    (sync_policy_installed, "not settled"),
    (sync_mid_prefill, "a is not decoding"),
    (sync_first_token_pending, "a is not decoding"),
    (speculative, "not speculative decoding"),
    (async_decoding, None),
    (async_prefill_in_flight, None),
    (async_chunk_in_flight, "a is not decoding"),
    (async_two_in_flight, "exactly one batch in flight"),
]


@pytest.mark.parametrize("build, refusal", RULE, ids=[b.__name__ for b, _ in RULE])
def test_the_rule_state_by_state(build: Callable[[], Scheduler], refusal: str | None) -> None:
    s = build()
    why = stretch_refusal(s)
    if refusal is None:
        assert why is None
        assert decode_stretch_plan(s)[0] > 0  # the planner follows the rule...
        fast_forward_decode(s, 1, [7] * len(s.running))  # ...and so does the jump
    else:
        assert why is not None and refusal in why
        assert decode_stretch_plan(s) == (0, 0, False)
        with pytest.raises(ValueError, match=refusal):
            fast_forward_decode(s, 1, [7] * len(s.running))
