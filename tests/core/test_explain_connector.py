"""--explain with a KV connector, and Scheduler.livelock(): the reasons a
request waits on the connector and vLLM 0.33.0's connector livelocks, worked
out by hand with the scripted connector (block size 16, 23 usable blocks)."""

from __future__ import annotations

from typing import Any

from kvsched import Request, SamplingParams, Scheduler
from kvsched.core import explain
from kvsched.core.output import NotAdmitted
from tests.core.test_kv_connector import Engine, make, request


def explaining(scripts: dict[str, dict[str, Any]], **kw: Any) -> Scheduler:
    sched = make(scripts, **kw)
    sched.explain_admission = True
    return sched


def test_async_load_in_flight_is_waiting_for_remote_kvs() -> None:
    sched = explaining({"a": {"external_hit_tokens": 32, "load_async": True, "load_steps": 3}})
    sched.add_request(request("a", 40))
    engine = Engine(sched)
    output, _, _ = engine.step()
    assert output.not_admitted == [NotAdmitted(
        "a", "waiting_for_remote_kvs",
        "WAITING_FOR_REMOTE_KVS: asynchronous KV load of 32 tokens started")]
    output, _, _ = engine.step()  # still loading: the holding queue is explained too
    assert output.not_admitted == [NotAdmitted(
        "a", "waiting_for_remote_kvs", "WAITING_FOR_REMOTE_KVS: its asynchronous KV load is in flight")]
    assert sched.livelock() is None


def test_kv_blocks_names_the_reservation_and_delayed_frees() -> None:
    # b finishes at once (max_tokens 1) and holds its 3 blocks while its KV
    # is sent for 3 steps; c's asynchronous load of 176 tokens (11 blocks)
    # then waits behind a's reservation.
    sched = explaining({"a": {"external_hit_tokens": 16, "load_async": True, "load_steps": 2},
                        "b": {"send_steps": 3},
                        "c": {"external_hit_tokens": 176, "load_async": True}}, budget=256)
    sched.add_request(request("b", 40, max_tokens=1))
    engine = Engine(sched)
    engine.step()  # b prefills, finishes, holds 3 blocks until sent
    assert [r.request_id for r in sched.requests.values() if r.is_finished()] == ["b"]
    sched.add_request(request("a", 200))
    sched.add_request(request("c", 200))
    output, _, _ = engine.step()
    # a loads 1 block and reserves its other 12; c's 11 blocks do not fit the
    # 23 - 3 - 1 = 19 free less 12 reserved.
    assert output.not_admitted == [
        NotAdmitted("a", "waiting_for_remote_kvs",
                    "WAITING_FOR_REMOTE_KVS: asynchronous KV load of 16 tokens started"),
        NotAdmitted("c", "kv_blocks", "19 blocks free; 12 reserved for prefills and loads in "
                    "flight; finished b hold theirs until their KV is sent (delayed free)")]
    assert sched.livelock() is None  # a still loads: blocks will move


def test_one_token_prompt_loaded_whole_is_a_livelock_from_its_second_load() -> None:
    sched = explaining({"a": {"external_hit_tokens": 1, "load_async": True}})
    sched.add_request(Request("a", [5], SamplingParams(max_tokens=2, ignore_eos=True)))
    engine = Engine(sched)
    output, _, _ = engine.step()
    assert output.kv_loads == {"a": (1, True)}
    assert sched.livelock() is None  # the first whole load: not yet a loop
    for _ in range(3):
        output, _, _ = engine.step()
        assert output.num_scheduled_tokens == {} and output.kv_loads == {"a": (1, True)}
        lock = sched.livelock()
        assert lock == explain.Livelock(explain.LIVELOCK_WHOLE_ONE_TOKEN_LOAD, ("a",), "0.34")
    assert lock is not None
    assert lock.message().startswith("vLLM 0.34 livelock (whole_one_token_load): a: a one-token prompt")


def test_failed_load_under_recompute_keeps_its_reservation_for_ever() -> None:
    # 200 tokens = 13 blocks. The retry loads 176 tokens (11 blocks) while a
    # still reserves its own 13: 24 > 23 free, with nothing else to free any.
    sched = explaining({"a": {"external_hit_tokens": 176, "load_async": True,
                              "load_fail": ["request", None]}}, policy="recompute")
    sched.add_request(request("a", 200))
    engine = Engine(sched)
    engine.step()
    assert sched.livelock() is None
    for _ in range(3):
        output, _, _ = engine.step()
        assert output.num_scheduled_tokens == {}
        assert output.not_admitted == [NotAdmitted(
            "a", "kv_blocks", "23 blocks free; 13 reserved for prefills and loads in flight")]
        assert sched.livelock() == explain.Livelock(explain.LIVELOCK_FAILED_LOAD_SELF_RESERVED, ("a",),
                                                    "0.34")


def test_the_same_retry_that_fits_is_no_livelock() -> None:
    # 160 tokens = 10 blocks: 10 + 13 = 23 fit; the retry loads and a runs.
    sched = explaining({"a": {"external_hit_tokens": 160, "load_async": True,
                              "load_fail": ["request", None]}}, policy="recompute")
    sched.add_request(request("a", 200))
    engine = Engine(sched)
    seen = []
    for _ in range(4):
        output, _, _ = engine.step()
        seen.append(sched.livelock())
    assert seen == [None] * 4
    assert output.num_scheduled_tokens == {"a": 1}
