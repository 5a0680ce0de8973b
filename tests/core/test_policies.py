"""Admission policies (kvsched.core.policies): each gate on hand-built states,
and that a policy changes nothing in the core but admission."""

from __future__ import annotations

import copy
import io
import random
import sys
from pathlib import Path
from typing import Any

import pytest
from sched_helpers import make_request, make_scheduler, run_step

from kvsched.core import explain
from kvsched.core.output import ModelRunnerOutput
from kvsched.core.policies import AdpBalance, BalanceGate, DPPrefillCadence, DPRankStates, PrefillCadence
from kvsched.core.scheduler import Scheduler
from kvsched.request import Request
from kvsched.scenario import make_request as scenario_request
from kvsched.scenario import next_token, parse_scenario, replay

sys.path.insert(0, str(Path(__file__).parents[1] / "conformance"))
from random_scenarios import random_scenario

# -- BalanceGate ---------------------------------------------------------------


@pytest.mark.parametrize(("threshold", "counts", "held"), [
    ("full", [4, 0], True),             # a rank is full
    ("full", [3, 3], False),            # one below full
    ("full-minus-one", [3, 0], True),   # at max_num_seqs - 1
    ("full-minus-one", [2, 2], False),  # below it
    ("full-minus-one", [0, 4], True),   # another rank, not this one
])
def test_balance_gate(threshold: Any, counts: list[int], held: bool) -> None:
    shared = DPRankStates(2)
    for rank, n in enumerate(counts):
        shared.publish(rank, n)
    gate = BalanceGate(shared, 0, threshold)
    sched = make_scheduler(max_num_seqs=4, admission_policy=gate, explain_admission=True)
    sched.add_request(make_request("a", 8))
    assert (gate.hold_reason(sched, sched.waiting.peek_request()) is not None) == held
    output, _ = run_step(sched)
    assert (output.scheduled_new_reqs == []) == held
    if held:
        assert output.admission_stop == explain.REASON_ADMISSION_POLICY
        assert output.not_admitted and output.not_admitted[0].detail.startswith("balance")


def test_balance_gate_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        BalanceGate(DPRankStates(2), 0, "half")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BalanceGate(DPRankStates(2), 2)


# -- AdpBalance ----------------------------------------------------------------


def _adp_step(policy: AdpBalance, sched: Scheduler, running: list[int],
              waiting: list[int]) -> bool:
    for rank, (r, w) in enumerate(zip(running, waiting)):
        policy.shared.publish(rank, r, w)
    policy.begin_step(sched)
    return policy.hold_reason(sched, make_request("x", 4)) is not None


def test_adp_holds_until_every_rank_has_a_prefill_or_timeout() -> None:
    sched = make_scheduler(max_num_seqs=8)
    adp = AdpBalance(DPRankStates(2), 0, timeout_iters=3)
    # Rank 1 has nothing to prefill: hold, hold, then the timeout releases.
    assert [_adp_step(adp, sched, [2, 2], [1, 0]) for _ in range(4)] == [True, True, False, True]
    # Every rank has a prefill: go at once, and the counter restarts.
    assert not _adp_step(adp, sched, [2, 2], [1, 1])
    assert adp.waiting_iters == 0
    # A rank with no decode work: holding would idle it, so go.
    assert not _adp_step(adp, sched, [2, 0], [1, 0])
    # A full rank cannot take a prefill, so not every rank has one to run.
    assert _adp_step(adp, sched, [8, 2], [1, 1])


def test_adp_batching_wait() -> None:
    sched = make_scheduler(max_num_seqs=8)
    adp = AdpBalance(DPRankStates(2), 1, timeout_iters=50, batching_wait_iters=2)
    assert [_adp_step(adp, sched, [2, 2], [1, 1]) for _ in range(4)] == [True, True, False, True]
    # Without decode work everywhere there is nothing to wait for.
    assert not _adp_step(adp, sched, [0, 2], [1, 1])


# -- PrefillCadence ------------------------------------------------------------


def _decoding(sched: Scheduler) -> None:
    """One request admitted and decoding after one step."""
    sched.add_request(make_request("d", 8, max_tokens=50))
    run_step(sched)


def test_cadence_aligned_and_not_aligned_steps() -> None:
    cadence = PrefillCadence(3)
    sched = make_scheduler(admission_policy=cadence)
    _decoding(sched)                   # executed step 1 carried a prefill
    assert cadence.last_prefill_step == 1
    sched.add_request(make_request("p", 8))
    held = []
    for _ in range(3):
        output, _ = run_step(sched)
        held.append("p" not in output.num_scheduled_tokens)
    # Steps 2 and 3 are within 3 of step 1; step 4 is aligned.
    assert held == [True, True, False]
    assert cadence.last_prefill_step == 4


def test_cadence_skips_running_prefill_chunks() -> None:
    cadence = PrefillCadence(2)
    sched = make_scheduler(budget=16, admission_policy=cadence)
    _decoding(sched)
    run_step(sched)
    sched.add_request(make_request("long", 40))
    output, _ = run_step(sched)            # aligned: 'long' gets its first chunk
    assert output.num_scheduled_tokens["long"] == 15
    output, _ = run_step(sched)            # not aligned: the chunk sits out
    assert "long" not in output.num_scheduled_tokens and "d" in output.num_scheduled_tokens
    output, _ = run_step(sched)
    assert output.num_scheduled_tokens["long"] == 15


def test_dp_cadence_follows_the_shared_step_counter() -> None:
    shared = DPRankStates(2)
    cadence = DPPrefillCadence(shared, 2)
    sched = make_scheduler(admission_policy=cadence, explain_admission=True)
    _decoding(sched)
    sched.add_request(make_request("p", 8))
    held = []
    for counter in (1, 3, 4):  # whatever the local history, only the shared counter counts
        shared.step_counter = counter
        output, _ = run_step(sched)
        held.append("p" not in output.num_scheduled_tokens)
        if held[-1]:
            assert any("DP step" in n.detail for n in output.not_admitted or ())
    assert held == [True, True, False]


def test_dp_cadence_never_defers_without_decode_work() -> None:
    shared = DPRankStates(1)
    shared.step_counter = 1
    sched = make_scheduler(admission_policy=DPPrefillCadence(shared, 4))
    sched.add_request(make_request("p", 8))
    output, _ = run_step(sched)  # nothing decodes: holding would only idle the rank
    assert "p" in output.num_scheduled_tokens


def test_cadence_capacity_bound_escape() -> None:
    cadence = PrefillCadence(4)
    sched = make_scheduler(max_num_seqs=2, admission_policy=cadence)
    _decoding(sched)
    for rid in "abc":
        sched.add_request(make_request(rid, 8, max_tokens=30))
    for _ in range(3):                 # executed steps 2-4: not aligned, held
        run_step(sched)
        assert len(sched.waiting) == 3 and not cadence.capacity_bound
    output, _ = run_step(sched)        # step 5, aligned: admits one, two still wait
    assert [n.req_id for n in output.scheduled_new_reqs] == ["a"]
    assert cadence.capacity_bound
    # Capacity bound: the next step does not defer, even though not aligned.
    sched.finish_requests("d")
    output, _ = run_step(sched)
    assert [n.req_id for n in output.scheduled_new_reqs] == ["b"]


def test_cadence_admits_a_request_with_one_token_left() -> None:
    cadence = PrefillCadence(4)
    sched = make_scheduler(caching=True, block_size=4, admission_policy=cadence)
    tokens = list(range(500, 516))
    sched.add_request(make_request("base", tokens=tokens, max_tokens=40))
    run_step(sched)
    run_step(sched)
    sched.add_request(make_request("hit", tokens=[*tokens, 7], max_tokens=4))   # 16 cached + 1
    sched.add_request(make_request("miss", tokens=tokens[:8] + [9] * 9, max_tokens=4))
    output, _ = run_step(sched)
    assert cadence.deferring
    assert [n.req_id for n in output.scheduled_new_reqs] == ["hit"]
    assert output.num_scheduled_tokens["hit"] == 1


def test_cadence_interval_one_never_defers() -> None:
    with pytest.raises(ValueError):
        PrefillCadence(0)
    cadence = PrefillCadence(1)
    sched = make_scheduler(admission_policy=cadence)
    _decoding(sched)
    sched.add_request(make_request("p", 8))
    output, _ = run_step(sched)
    assert "p" in output.num_scheduled_tokens and not cadence.deferring


# -- a policy changes nothing but admission --------------------------------------

SEEDS = [3, 11, 27, 58, 101, 144]


class NeverHold:
    """Every optional method, holding nothing."""

    def __init__(self) -> None:
        self.calls = 0

    def begin_step(self, scheduler: Scheduler) -> None:
        self.calls += 1

    def defer_prefill_chunks(self, scheduler: Scheduler) -> bool:
        return False

    def hold_reason(self, scheduler: Scheduler, request: Request) -> str | None:
        return None

    def end_step(self, scheduler: Scheduler, output: Any) -> None:
        pass


@pytest.mark.parametrize("seed", SEEDS)
def test_a_policy_that_never_holds_changes_nothing(seed: int) -> None:
    scenario = parse_scenario(random_scenario(seed))
    plain, with_policy = io.StringIO(), io.StringIO()
    replay(scenario, plain)
    policy = NeverHold()
    result = replay(scenario, with_policy, admission_policy=policy)
    assert plain.getvalue() == with_policy.getvalue()
    assert policy.calls == result.steps


class RandomHold:
    """Holds admission at random (seeded): only hold_reason, like BalanceGate."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def hold_reason(self, scheduler: Scheduler, request: Request) -> str | None:
        return "random" if self.rng.random() < 0.4 else None


@pytest.mark.parametrize("seed", SEEDS)
def test_a_holding_policy_changes_only_admission(seed: int) -> None:
    """From the same state, a step with the policy and one without schedule
    the running requests identically (tokens and preemptions), and the policy
    run admits a prefix of what the plain run admits, with the same tokens."""
    scenario = parse_scenario(random_scenario(seed))
    policy = RandomHold(seed)
    sched = Scheduler(scenario.scheduler_config, scenario.cache_config, policy)
    specs = {r["request_id"]: r for r in scenario.requests}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in scenario.requests:
        arrivals.setdefault(r.get("arrival_step", 0), []).append(r)
    held = 0
    step = 0
    while step <= max([*arrivals, *scenario.aborts, 0]) or sched.has_unfinished_requests():
        assert step < 20_000
        for spec in arrivals.get(step, ()):
            sched.add_request(scenario_request(spec))
        sched.finish_requests([r for r in scenario.aborts.get(step, ()) if r in sched.requests])
        twin = copy.deepcopy(sched, {id(policy): None})
        assert twin.admission_policy is None
        out, ref = sched.schedule(), twin.schedule()
        n_run = len(out.scheduled_cached_reqs.req_ids) - len(out.scheduled_cached_reqs.resumed_req_ids)
        ran = list(out.num_scheduled_tokens.items())
        ref_ran = list(ref.num_scheduled_tokens.items())
        assert ran[:n_run] == ref_ran[:n_run]
        assert out.preempted_req_ids == ref.preempted_req_ids
        admitted = ran[n_run:]
        assert admitted == ref_ran[n_run:n_run + len(admitted)]
        held += len(admitted) < len(ref_ran) - n_run
        req_ids = list(out.num_scheduled_tokens)
        sampled = [[] if sched.requests[rid].is_prefill_chunk else
                   [next_token(specs[rid], len(sched.requests[rid].output_token_ids))]
                   for rid in req_ids]
        sched.update_from_output(out, ModelRunnerOutput(req_ids, sampled))
        sched.check_invariants()
        step += 1
    assert held, "the policy never changed an admission"


# -- vLLM's DP step counter and waves (DPEngineCoreProc) -------------------------

def test_dp_wave_ends_only_at_a_finish_sync_step() -> None:
    shared = DPRankStates(2, dp_sync_interval=4)
    # Work on the first three steps, then every rank idle: the idle ranks keep
    # stepping until counter 4, the next finish-sync, ends the wave.
    assert [shared.end_step(u) for u in (True, True, True, False)] == [True, True, True, False]
    assert (shared.step_counter, shared.current_wave) == (0, 1)
    # Idle at step 2 is not seen before step 4 either; step 8 is the next sync.
    assert [shared.end_step(u) for u in (True, False, False, False)] == [True, True, True, False]
    assert (shared.step_counter, shared.current_wave) == (0, 2)


def test_dp_first_step_of_a_wave_syncs() -> None:
    # A wave whose work is done in its first step ends right there.
    shared = DPRankStates(2)
    assert shared.end_step(False) is False
    assert (shared.step_counter, shared.current_wave) == (0, 1)
    # Otherwise the default interval (16) applies: work gone after step 1 is
    # noticed at step 16.
    flags = [shared.end_step(i == 0) for i in range(16)]
    assert flags == [True] * 15 + [False]
    assert shared.current_wave == 2
    with pytest.raises(ValueError, match="dp_sync_interval"):
        DPRankStates(2, dp_sync_interval=0)
