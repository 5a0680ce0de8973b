"""Client timeouts (``--request-timeout``): the client gives up on a request
S seconds after its send, its slot frees then, and the engine aborts it
through the scheduler's abort path (vLLM's ``finish_requests(...,
FINISHED_ABORTED)``), wherever it is; it counts as failed, as vllm bench
serve counts it.

The engine below takes STEP seconds a step whatever the batch, so every
expected time is counted by hand from the steps (STEP is a power of two:
the sums are exact)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.errors import UserInputError
from kvsched.perf import get_hardware, get_model
from kvsched.perf.step_time import BatchShape, StepTimeModel
from kvsched.request import RequestStatus
from kvsched.sim.disagg import DisaggregatedSimulator, DisaggResult
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.proxy import Proxy
from kvsched.sim.rank import Rank, SimResult
from kvsched.sim.run import prepare, run
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.spec import RunSpec, WorkloadSpec, spec_from_json, spec_to_json
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest

STEP = 0.125
BLOCK = 16
BLOCKS = 64  # one of them is vLLM's null block: 63 usable


class FixedSteps(StepTimeModel):
    """Every step STEP seconds, prefill or decode, one request or many."""

    def step_time(self, shape: BatchShape, global_tokens: int | None = None) -> float:
        return STEP

    def decode_step_times(self, num_reqs: int, first_kv_tokens: int, kv_step: int, count: int,
                          global_tokens: int | None = None) -> list[float]:
        return [STEP] * count


MODEL = FixedSteps(get_model("Llama-3.1-8B"), get_hardware("h100-sxm"))
# One request at a time: the second waits in the engine for the first.
ONE_AT_A_TIME = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=1, max_model_len=1024)
CACHE = CacheConfig(num_gpu_blocks=BLOCKS, block_size=BLOCK, enable_prefix_caching=False)


def request(rid: str, arrival: float, output: int, prompt: int = 100, index: int = 0) -> WorkloadRequest:
    return WorkloadRequest(rid, arrival, ((UNIQUE_TOKEN_BASE + index, prompt),), output)


def simulate(workload: Workload, fast_forward: bool = True,
             sched: SchedulerConfig = ONE_AT_A_TIME) -> tuple[SimResult, Simulator]:
    sim = Simulator(SimConfig(sched, CACHE, MODEL, fast_forward=fast_forward), workload)
    return sim.run(), sim


def note_aborts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Each request the engine aborts, with its state then (a prefill leg's
    marked as such), as the simulation goes."""
    seen: list[tuple[str, str]] = []
    abort = Rank.abort

    def noting(self: Rank, rid: str, t: float) -> bool:
        r = self.sched.requests.get(rid)
        seen.append((rid, ("prefill " if self.hands_off else "") + (r.status.name if r is not None else "-")))
        return abort(self, rid, t)

    monkeypatch.setattr(Rank, "abort", noting)
    return seen


def by_id(result: SimResult) -> dict[str, tuple[float, float, float]]:
    """Each completed request's (send, TTFT, finish)."""
    return {r.request_id: (r.send_time, r.ttft, r.finish_time) for r in result.records}


# A runs first (steps 0-19: its prefill, then 19 decodes; 20 tokens, done at
# 2.5 s); B arrives at 0.5 s and waits for A's slot.
A_THEN_B = (request("a", 0.0, 20, index=0), request("b", 0.5, 3, index=1))


@pytest.mark.parametrize("fast_forward", [True, False])
def test_without_a_timeout_the_second_request_waits_for_the_first(fast_forward: bool) -> None:
    result, _ = simulate(Workload("w", A_THEN_B), fast_forward)
    # B's prefill is step 20 (2.5-2.625 s), its last token the end of step 22.
    assert by_id(result) == {"a": (0.0, 0.125, 2.5), "b": (0.5, 2.125, 2.875)}
    assert result.failed == []


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_timed_out_request_is_aborted_its_blocks_freed_and_the_next_admitted(fast_forward: bool) -> None:
    result, sim = simulate(Workload("w", A_THEN_B, request_timeout=0.95), fast_forward)
    # A's deadline, 0.95 s, falls in step 7 (0.875-1 s): the engine aborts A
    # before step 8, so B's prefill is step 8 (1-1.125 s) and B's last token
    # the end of step 10, before B's own deadline (0.5 + 0.95 s).
    assert by_id(result) == {"b": (0.5, 0.625, 1.375)}
    assert [rid for rid, _ in result.failed] == ["a"]
    assert result.failed[0][1].startswith("timeout: ")
    m = result.metrics()
    assert (m["completed"], m["failed"], m["failed_reasons"]) == (1, 1, {"timeout": 1})
    # vllm bench serve's clock runs to the last answer: B's, after A's deadline.
    assert m["duration"] == 1.375
    # The metrics are B's alone: its two gaps, its three tokens.
    assert len(result.itls) == 2 and m["mean_itl_ms"] == 125.0
    assert m["max_output_tokens_per_s"] == 3.0
    # A's 7 blocks (107 tokens) went back to the pool: step 8 holds B's 7
    # blocks (its 100-token prompt) only, of 63.
    steps = result.steps
    assert steps is not None
    assert list(steps.free_blocks[6:9]) == [63 - 7, 63 - 7, 63 - 7]
    assert list(steps.num_running[7:9]) == [1, 1]
    assert steps.prefill_tokens[8] == 100
    sched = sim.sched
    sched.check_invariants()
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == BLOCKS - 1
    assert not sched.requests


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_closed_loop_client_sends_the_next_request_as_it_gives_up(fast_forward: bool) -> None:
    # One slot: B waits at the client until A's deadline frees it.
    workload = Workload("w", (request("a", 0.0, 20, index=0), request("b", 0.0, 3, index=1)),
                        max_concurrency=1, request_timeout=0.95)
    result, _ = simulate(workload, fast_forward)
    # B is sent at 0.95 s and reaches the engine mid-step 7; its prefill is step 8.
    assert by_id(result) == {"b": (0.95, 1.125 - 0.95, 1.375)}
    assert result.records[0].client_queue_time == 0.95
    assert [rid for rid, _ in result.failed] == ["a"]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_response_finished_past_its_deadline_fails_and_frees_the_slot_at_the_deadline(
        fast_forward: bool) -> None:
    # A's 8th and last token comes at the end of step 7, 1 s: after its
    # 0.95 s deadline. The client gave up at 0.95 s (B is sent then); the
    # engine had finished A before the abort could matter.
    workload = Workload("w", (request("a", 0.0, 8, index=0), request("b", 0.0, 3, index=1)),
                        max_concurrency=1, request_timeout=0.95)
    result, sim = simulate(workload, fast_forward)
    assert by_id(result) == {"b": (0.95, 1.125 - 0.95, 1.375)}
    assert [rid for rid, _ in result.failed] == ["a"]
    assert result.failed[0][1].startswith("timeout: ")
    # A's seven gaps and eight tokens are not B's: out of the pools.
    assert len(result.itls) == 2 and len(result.token_times) == 3
    sim.sched.check_invariants()


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_request_finished_on_its_deadline_is_in_time(fast_forward: bool) -> None:
    # A's 8th token comes at the end of step 7, 1 s: exactly its deadline.
    workload = Workload("w", (request("a", 0.0, 8),), request_timeout=1.0)
    result, _ = simulate(workload, fast_forward)
    assert by_id(result) == {"a": (0.0, 0.125, 1.0)} and result.failed == []


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_waiting_request_is_aborted_from_the_queue(fast_forward: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    statuses = note_aborts(monkeypatch)
    # A (7 tokens) is done at 0.875 s, in time; X, next, has its prefill in
    # step 7 (0.875-1 s) and its deadline at 0.95 s; W waits behind X and
    # its deadline, 0.96 s, comes before step 8 could admit it.
    workload = Workload("w", (request("a", 0.0, 7, index=0), request("x", 0.05, 3, index=1),
                              request("w", 0.06, 3, index=2)), request_timeout=0.9)
    result, sim = simulate(workload, fast_forward)
    assert by_id(result) == {"a": (0.0, 0.125, 0.875)}
    assert [rid for rid, _ in result.failed] == ["x", "w"]
    assert statuses == [("x", "RUNNING"), ("w", "WAITING")]
    steps = result.steps
    assert steps is not None and len(steps) == 8  # A's 7, X's prefill; then nothing runs
    sim.sched.check_invariants()
    assert sim.sched.kv_cache_manager.block_pool.get_num_free_blocks() == BLOCKS - 1


def test_a_timeout_that_never_fires_changes_nothing() -> None:
    plain, _ = simulate(Workload("w", A_THEN_B))
    patient, _ = simulate(Workload("w", A_THEN_B, request_timeout=1e9))
    assert by_id(patient) == by_id(plain)
    drop = ("simulation_wall_seconds",)
    assert ({k: v for k, v in patient.metrics().items() if k not in drop}
            == {k: v for k, v in plain.metrics().items() if k not in drop})


# -- the engine's side: Rank.abort ---------------------------------------------------

def _rank(sched: SchedulerConfig, cache: CacheConfig) -> Rank:
    return Rank(sched, cache, workload_name="w", request_timeout=1.0)


def _step(rank: Rank, start: float) -> None:
    plan = rank.plan()
    assert plan is not None
    rank.complete(plan, start, STEP)


def test_abort_frees_a_running_and_a_waiting_request() -> None:
    rank = _rank(ONE_AT_A_TIME, CACHE)
    assert rank.receive(request("a", 0.0, 20, index=0), 0.0)
    assert rank.receive(request("b", 0.0, 20, index=1), 0.0)
    _step(rank, 0.0)
    sched = rank.sched
    pool = sched.kv_cache_manager.block_pool
    assert [r.request_id for r in sched.running] == ["a"] and len(sched.waiting) == 1
    assert pool.get_num_free_blocks() == BLOCKS - 1 - 7  # A's 100 prompt tokens
    assert rank.abort("a", 0.5)
    sched.check_invariants()
    assert pool.get_num_free_blocks() == BLOCKS - 1 and not sched.running
    assert rank.abort("b", 0.5)  # still waiting: it never had blocks
    sched.check_invariants()
    assert not sched.requests and not rank.live
    assert not rank.abort("a", 0.6)  # gone already
    assert [rid for rid, _ in rank.failed] == ["a", "b"]
    # The next step reports both as finished to the runner, as vLLM's does.
    assert sched.schedule().finished_req_ids == {"a", "b"}


def test_abort_frees_a_preempted_request() -> None:
    # 8 usable blocks (128 tokens) for two requests that grow to 7 each: one is preempted.
    sched_config = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=2, max_model_len=1024)
    cache = CacheConfig(num_gpu_blocks=9, block_size=BLOCK, enable_prefix_caching=False)
    rank = _rank(sched_config, cache)
    assert rank.receive(request("a", 0.0, 64, prompt=48, index=0), 0.0)
    assert rank.receive(request("b", 0.0, 64, prompt=48, index=1), 0.0)
    sched = rank.sched
    t = 0.0
    while not any(r.status == RequestStatus.PREEMPTED for r in sched.waiting):
        _step(rank, t)
        t += STEP
        assert t < 100 * STEP, "no preemption"
    (victim,) = [r.request_id for r in sched.waiting]
    (runner,) = [r.request_id for r in sched.running]
    held = len(sched.kv_cache_manager.req_to_blocks[runner])
    assert rank.abort(victim, t)
    sched.check_invariants()
    # A preempted request holds no blocks: only the running one's are taken.
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 8 - held
    assert victim not in sched.requests
    _step(rank, t)  # the survivor goes on
    sched.check_invariants()


# -- the run spec and its flag ---------------------------------------------------------

@pytest.mark.parametrize("value", [0, 0.0, -1.0, math.inf, -math.inf, math.nan, "30", True])
def test_a_bad_timeout_is_refused_naming_the_flag(value: object) -> None:
    spec = RunSpec(workload=WorkloadSpec(num_prompts=2, request_timeout=value))  # type: ignore[arg-type]
    with pytest.raises(UserInputError) as e:
        prepare(spec)
    text = str(e.value)
    assert text.startswith("--request-timeout=") and "seconds > 0" in text
    assert "leave it out for no timeout" in text
    with pytest.raises(UserInputError, match="--request-timeout="):
        Workload("w", A_THEN_B, request_timeout=value)  # type: ignore[arg-type]


def test_a_bad_timeout_in_a_json_spec_names_the_field() -> None:
    with pytest.raises(UserInputError, match=r"run spec.workload.request_timeout='30': expected a number"):
        spec_from_json({"workload": {"request_timeout": "30"}})
    zero = spec_from_json({"workload": {"num_prompts": 2, "request_timeout": 0}})
    with pytest.raises(UserInputError, match=r"--request-timeout=0\.0:"):
        prepare(zero)


def test_the_timeout_round_trips_through_flags_and_json() -> None:
    spec = parse_spec(["--num-prompts", "5", "--request-timeout", "2.5"])
    assert spec.workload.request_timeout == 2.5
    assert parse_spec(spec_argv(spec)) == spec
    assert spec_from_json(spec_to_json(spec)) == spec
    assert parse_spec([]).workload.request_timeout is None
    # It reaches the client through the workload, as --max-concurrency does.
    prepared = prepare(spec)
    assert prepared.accepted.request_timeout == 2.5


def test_the_timeout_survives_the_workload_s_copies() -> None:
    workload = Workload("w", A_THEN_B, max_concurrency=3, request_timeout=2.0)
    for copy in (workload.scaled(0.5), workload.truncated(num_requests=1), workload.truncated(duration=1.0)):
        assert (copy.max_concurrency, copy.request_timeout) == (3, 2.0)


# -- disaggregated prefill/decode, data parallelism ----------------------------------------

def _comparable(result: SimResult) -> dict[str, object]:
    metrics = result.metrics()
    for key in ("simulation_wall_seconds", "fast_forwarded_steps"):
        metrics.pop(key)
    return {"metrics": metrics, "records": sorted(dataclasses.astuple(r) for r in result.records),
            "failed": sorted(result.failed), "itls": sorted(result.itls.to_array().tolist())}


PD = ["--model", "meta-llama/Llama-3.1-8B", "--hardware", "h100-sxm", "--step-time-backend", "roofline",
      "--num-prompts", "40", "--request-rate", "20", "--random-input-len", "3000",
      "--random-output-len", "200", "--random-range-ratio", "0.9", "--seed", "5",
      # The host terms the timeouts below were sized with (to reach each
      # state), pinned: a refit of the default terms must not move them.
      "--calibration", str(Path(__file__).parents[1] / "data" / "host_terms" / "pinned_2026-11-26.json")]


@pytest.mark.parametrize("extra, timeout, states", [
    # Decode instance: running requests.
    (["--disaggregation", "1P1D"], "1.5", {"RUNNING"}),
    # Prefill instance: waiting and running prefill legs; and decode legs on
    # their way to the decode instance (dropped: Proxy.drop_decode_leg).
    (["--disaggregation", "1P1D", "--no-async-scheduling"], "0.2", {"prefill WAITING", "prefill RUNNING"}),
    # Decode instance: requests reading their KV from the prefill instance.
    (["--disaggregation", "2P1D", "--decode-max-num-seqs", "8"], "0.2", {"WAITING_FOR_REMOTE_KVS"}),
    # Data-parallel replicas: waiting and running.
    (["-dp", "2", "--dp-routing", "round-robin"], "0.05", {"WAITING", "RUNNING"}),
])
def test_timeouts_on_pd_and_dp_are_the_same_with_and_without_fast_forward(
        extra: list[str], timeout: str, states: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    aborted = note_aborts(monkeypatch)
    dropped: list[str] = []
    drop = Proxy.drop_decode_leg

    def dropping(self: Proxy, rid: str) -> bool:
        if drop(self, rid):
            dropped.append(rid)
            return True
        return False

    monkeypatch.setattr(Proxy, "drop_decode_leg", dropping)
    ranks: list[Rank] = []
    serve = DisaggregatedSimulator.run

    def keeping(self: DisaggregatedSimulator) -> DisaggResult:
        ranks[:] = self.ranks
        return serve(self)

    monkeypatch.setattr(DisaggregatedSimulator, "run", keeping)
    spec = parse_spec([*PD, *extra, "--request-timeout", timeout])
    jumped = run(spec)
    stepped = run(spec.with_options(fast_forward=False))
    assert _comparable(jumped.result) == _comparable(stepped.result)
    m = jumped.metrics
    assert m["failed"] > 0 and m["failed_reasons"] == {"timeout": m["failed"]}
    assert m["completed"] + m["failed"] == 40
    assert states <= {state for _, state in aborted}, aborted
    if "prefill WAITING" in states:
        assert dropped  # a decode leg given up on during the hop
    for rank in ranks:
        rank.sched.check_invariants()
        assert not rank.live and not rank.sched.has_unfinished_requests()
