"""Small builders shared by the scheduler tests (not a test module itself)."""

from __future__ import annotations

import copy
from typing import Any

from kvsched import (
    CacheConfig,
    ModelRunnerOutput,
    Request,
    SamplingParams,
    Scheduler,
    SchedulerConfig,
    SchedulerOutput,
)
from kvsched.core.output import EngineCoreOutputs
from kvsched.core.policies import AdmissionPolicy

DEFAULT_TOKEN = 100


def make_scheduler(*, budget: int = 256, max_num_seqs: int = 16, max_model_len: int = 256,
                   num_gpu_blocks: int = 64, block_size: int = 4, caching: bool = False,
                   chunked: bool = True, threshold: int = 0, policy: str = "fcfs",
                   reserve_full_isl: bool = True, explain_admission: bool = False,
                   admission_policy: AdmissionPolicy | None = None,
                   runner_inputs: bool = True) -> Scheduler:
    sched_config = SchedulerConfig(
        max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
        enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold, policy=policy,
        scheduler_reserve_full_isl=reserve_full_isl)
    cache_config = CacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=block_size,
                               enable_prefix_caching=caching)
    return Scheduler(sched_config, cache_config, admission_policy=admission_policy,
                     explain_admission=explain_admission, runner_inputs=runner_inputs)


def prompt(n: int, seed: int) -> list[int]:
    """``n`` tokens no other seed's prompt shares (and never the fake model's 100)."""
    return [1000 * (seed + 1) + i for i in range(n)]


_seed = 0


def make_request(rid: str, num_prompt: int | None = None, *, tokens: list[int] | None = None,
                 max_tokens: int = 16, min_tokens: int = 0, eos: int | None = None,
                 ignore_eos: bool = False, stop: tuple[int, ...] = (), priority: int = 0,
                 arrival_time: float = 0.0) -> Request:
    """A request with a prompt of ``num_prompt`` distinct tokens (or ``tokens``)."""
    global _seed
    if tokens is None:
        assert num_prompt is not None
        _seed += 1
        tokens = prompt(num_prompt, _seed)
    params = SamplingParams(max_tokens=max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos,
                            eos_token_id=eos, stop_token_ids=stop)
    return Request(rid, tokens, params, priority=priority, arrival_time=arrival_time)


def fake_sample(sched: Scheduler, output: SchedulerOutput,
                tokens: dict[str, list[int]] | None = None) -> ModelRunnerOutput:
    """The fake model: every scheduled request not mid-way through a chunked
    prefill samples ``tokens[rid]`` (default: one token 100)."""
    tokens = tokens or {}
    req_ids = list(output.num_scheduled_tokens)
    sampled: list[list[int]] = []
    for rid in req_ids:
        request = sched.requests.get(rid)
        if request is None or request.is_prefill_chunk:
            sampled.append([])
        else:
            sampled.append(list(tokens.get(rid, [DEFAULT_TOKEN])))
    return ModelRunnerOutput(req_ids, sampled)


def run_step(sched: Scheduler, tokens: dict[str, list[int]] | None = None,
             ) -> tuple[SchedulerOutput, EngineCoreOutputs]:
    """schedule() + fake model + update_from_output(), checking invariants and
    the token accounting of the step."""
    output = sched.schedule()
    sched.check_invariants()
    assert sum(output.num_scheduled_tokens.values()) == output.total_num_scheduled_tokens
    assert output.total_num_scheduled_tokens <= sched.scheduler_config.max_num_batched_tokens
    assert all(n > 0 for n in output.num_scheduled_tokens.values())
    result = sched.update_from_output(output, fake_sample(sched, output, tokens))
    sched.check_invariants()
    return output, result


def finished_reasons(result: EngineCoreOutputs) -> dict[str, str | None]:
    return {o.request_id: o.finish_reason for o in result.finished}


def free_blocks(sched: Scheduler) -> int:
    return sched.kv_cache_manager.block_pool.get_num_free_blocks()


def state_snapshot(sched: Scheduler) -> object:
    """Everything a scheduler holds, as nested tuples: every attribute of the
    scheduler, its KV cache manager, block pool and queues, and every field
    of every request it knows (a request is spelled out once and referred to
    by id elsewhere). Two equal snapshots mean equal states; a rejected call
    must leave it unchanged."""
    requests: dict[int, object] = {}

    def freeze(obj: object) -> object:
        if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
            return obj
        if isinstance(obj, Request):
            if id(obj) not in requests:
                requests[id(obj)] = None  # placeholder against cycles
                requests[id(obj)] = tuple((name, freeze(getattr(obj, name)))
                                          for name in Request.__slots__)
            return ("request", obj.request_id, id(obj))
        if isinstance(obj, dict):
            return ("dict", tuple((freeze(k), freeze(v)) for k, v in obj.items()))
        if isinstance(obj, (set, frozenset)):
            return ("set", tuple(sorted((freeze(v) for v in obj), key=repr)))
        if isinstance(obj, (list, tuple)) or type(obj).__name__ == "deque":
            return (type(obj).__name__, tuple(freeze(v) for v in obj))  # type: ignore[attr-defined]
        if callable(obj):
            return ("callable", id(obj))
        names = list(getattr(obj, "__slots__", ())) + list(getattr(obj, "__dict__", {}))
        return (type(obj).__name__, tuple((n, freeze(getattr(obj, n))) for n in names
                                          if hasattr(obj, n)))

    top = freeze(sched)
    return top, tuple(sorted(requests.items(), key=lambda kv: repr(kv[1])))


def scheduler_state(s: Scheduler) -> dict[str, Any]:
    """What a fast-forward must leave as stepping does, beside the KV
    manager's own tables (each test adds its manager's): every request's
    fields and tokens, the queues, and the block pool."""
    pool = s.kv_cache_manager.block_pool
    requests = {rid: tuple((name, copy.copy(getattr(r, name))) for name in Request.__slots__
                           if name not in ("block_hashes", "sampling_params", "prompt_tokens",
                                           "all_token_ids"))
                for rid, r in s.requests.items()}
    return {
        "requests": requests,
        "tokens": {rid: list(r.all_token_ids) for rid, r in s.requests.items()},
        "running": [r.request_id for r in s.running],
        "waiting": [r.request_id for r in s.waiting],
        "free_queue": list(pool.free_queue),
        "ref_cnt": list(pool.ref_cnt),
        "cached": dict(pool.cached),
        "dups": {h: list(v) for h, v in pool.dup_cached.items()},
        "hash_of_block": dict(pool.hash_of_block),
        "finished_req_ids": set(s.finished_req_ids),
        "decode_stable": s.decode_stable,
    }
