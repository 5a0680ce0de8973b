"""Write the prefill-cadence corpus (tests/conformance/cadence/NAME.json).

Deterministic: rerunning rewrites the same files. Goldens come from
cadence_oracle.py (vLLM 0.33.0 with ``prefill_schedule_interval``).

    python tests/conformance/make_cadence_scenarios.py
    ~/.cache/kvsched-reference/venv/bin/python tests/conformance/cadence_oracle.py tests/conformance/cadence
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from random_scenarios import validate_scenario  # noqa: E402

OUT = HERE / "cadence"


def _req(rng: random.Random, rid: str, prompt_len: int, max_tokens: int, arrival: int = 0,
         prefix: list[int] | None = None, **extra: Any) -> dict[str, Any]:
    prompt = list(prefix or [])
    prompt += [rng.randrange(200, 500) for _ in range(prompt_len - len(prompt))]
    r: dict[str, Any] = {"request_id": rid, "prompt_token_ids": prompt, "max_tokens": max_tokens}
    if arrival:
        r["arrival_step"] = arrival
    r.update(extra)
    return r


def _scenario(desc: str, interval: int, sched: dict[str, Any], cache: dict[str, Any],
              reqs: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"description": desc, "prefill_schedule_interval": interval,
            "scheduler": {"max_model_len": 2048, **sched}, "cache": cache, "requests": reqs,
            "max_steps": 5000, **extra}


def build() -> dict[str, dict[str, Any]]:
    s: dict[str, dict[str, Any]] = {}
    rng = random.Random(4)
    s["interval2_basic"] = _scenario(
        "Interval 2: short prompts arriving while two requests decode wait for an aligned step.",
        2, {"max_num_seqs": 8, "max_num_batched_tokens": 256}, {"num_gpu_blocks": 128},
        [_req(rng, f"r{i}", 20 + 7 * i, 12, arrival=i + (i > 0)) for i in range(6)])
    s["interval3_chunked_long"] = _scenario(
        "Interval 3: long prompts chunked by a 64-token budget; their chunks skip deferred steps.",
        3, {"max_num_seqs": 8, "max_num_batched_tokens": 64}, {"num_gpu_blocks": 256},
        [_req(rng, "d0", 10, 40), _req(rng, "d1", 12, 40)]
        + [_req(rng, f"p{i}", 300 + 50 * i, 8, arrival=2 + 5 * i) for i in range(4)])
    s["interval4_chunked_threshold"] = _scenario(
        "Interval 4 with long_prefill_token_threshold 48: several prompts chunk side by side.",
        4, {"max_num_seqs": 16, "max_num_batched_tokens": 128, "long_prefill_token_threshold": 48},
        {"num_gpu_blocks": 256},
        [_req(rng, f"r{i}", rng.randrange(40, 400), rng.randrange(5, 30), arrival=rng.randrange(0, 20))
         for i in range(10)])
    s["interval2_stream"] = _scenario(
        "Interval 2: one arrival per step for 30 steps, moderate prompts, roomy cache.",
        2, {"max_num_seqs": 32, "max_num_batched_tokens": 512}, {"num_gpu_blocks": 512},
        [_req(rng, f"r{i}", rng.randrange(10, 120), rng.randrange(3, 25), arrival=i) for i in range(30)])
    s["interval3_tight_kv"] = _scenario(
        "Interval 3 with a tight KV cache: decodes preempt each other while prefills are held.",
        3, {"max_num_seqs": 8, "max_num_batched_tokens": 96, "scheduler_reserve_full_isl": False},
        {"num_gpu_blocks": 24, "block_size": 8},
        [_req(rng, f"r{i}", rng.randrange(10, 60), rng.randrange(10, 40), arrival=rng.randrange(0, 8))
         for i in range(8)])
    s["interval2_capacity_bound"] = _scenario(
        "Interval 2: more arrivals than max_num_seqs, so release steps leave a queue and the "
        "capacity-bound escape switches the cadence off until the queue drains.",
        2, {"max_num_seqs": 4, "max_num_batched_tokens": 128}, {"num_gpu_blocks": 256},
        [_req(rng, "d0", 12, 60), _req(rng, "d1", 12, 60)]
        + [_req(rng, f"r{i}", rng.randrange(10, 50), rng.randrange(4, 16), arrival=3 + (i // 6) * 25)
           for i in range(12)]
        + [_req(rng, f"s{i}", rng.randrange(10, 50), 8, arrival=45 + 3 * i) for i in range(4)])
    shared = [rng.randrange(200, 500) for _ in range(64)]
    s["interval3_prefix_one_token_left"] = _scenario(
        "Interval 3 with prefix caching: a prompt of 4 cached blocks plus one token has one token "
        "left after its hit and is admitted even on a deferring step.",
        3, {"max_num_seqs": 8, "max_num_batched_tokens": 256},
        {"num_gpu_blocks": 128, "enable_prefix_caching": True},
        [_req(rng, "base", 64, 30, prefix=shared)]
        + [_req(rng, f"h{i}", 65, 6, arrival=2 + i, prefix=shared) for i in range(5)]
        + [_req(rng, f"m{i}", 90, 6, arrival=3 + 2 * i, prefix=shared[:32]) for i in range(3)])
    s["interval2_priority_preempt"] = _scenario(
        "Interval 2, priority policy, tight cache: preemptions of already scheduled requests.",
        2, {"max_num_seqs": 6, "max_num_batched_tokens": 48, "policy": "priority",
            "scheduler_reserve_full_isl": False, "long_prefill_token_threshold": 16},
        {"num_gpu_blocks": 20, "block_size": 4},
        [_req(rng, f"r{i}", rng.randrange(8, 30), rng.randrange(8, 24), arrival=rng.randrange(0, 10),
              priority=rng.randrange(0, 4), arrival_time=float(i) + 0.5) for i in range(8)])
    s["interval4_no_chunked"] = _scenario(
        "Interval 4 with chunked prefill off: whole prompts wait for aligned steps.",
        4, {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "enable_chunked_prefill": False},
        {"num_gpu_blocks": 256},
        [_req(rng, f"r{i}", rng.randrange(100, 900), rng.randrange(4, 20), arrival=rng.randrange(0, 30))
         for i in range(8)])
    s["interval2_aborts"] = _scenario(
        "Interval 2 with aborts of running, chunking and waiting requests.",
        2, {"max_num_seqs": 8, "max_num_batched_tokens": 64}, {"num_gpu_blocks": 128},
        [_req(rng, f"r{i}", rng.randrange(20, 200), rng.randrange(10, 30), arrival=rng.randrange(0, 12))
         for i in range(8)],
        aborts=[{"step": 12, "request_ids": ["r1", "r5"]}, {"step": 16, "request_ids": ["r2", "r7"]}])
    s["interval3_resume"] = _scenario(
        "Interval 3, FCFS, tight cache: preempted requests resume with their outputs as prefill.",
        3, {"max_num_seqs": 6, "max_num_batched_tokens": 80, "scheduler_reserve_full_isl": False},
        {"num_gpu_blocks": 18, "block_size": 8},
        [_req(rng, f"r{i}", rng.randrange(10, 40), rng.randrange(20, 50), arrival=rng.randrange(0, 6))
         for i in range(6)])
    s["interval4_lone_request"] = _scenario(
        "Interval 4 with no decode running at first: a lone long prompt is never held, later "
        "ones are.",
        4, {"max_num_seqs": 4, "max_num_batched_tokens": 32}, {"num_gpu_blocks": 128},
        [_req(rng, "a", 200, 10), _req(rng, "b", 150, 10, arrival=12), _req(rng, "c", 40, 10, arrival=14)])
    s["interval2_stops"] = _scenario(
        "Interval 2 with EOS and stop tokens ending requests early, freeing room between steps.",
        2, {"max_num_seqs": 6, "max_num_batched_tokens": 96}, {"num_gpu_blocks": 96},
        [_req(rng, f"r{i}", rng.randrange(10, 80), 30, arrival=i, eos_token_id=7,
              stop_token_ids=[9], sampled_token_ids=[100] * (3 + i) + [7 if i % 2 else 9])
         for i in range(8)])
    s["interval3_idle_gap"] = _scenario(
        "Interval 3 with an idle gap: empty steps are not executed steps and do not advance the "
        "cadence.",
        3, {"max_num_seqs": 8, "max_num_batched_tokens": 64}, {"num_gpu_blocks": 128},
        [_req(rng, "a", 30, 5), _req(rng, "b", 90, 8, arrival=2),
         _req(rng, "c", 30, 6, arrival=30), _req(rng, "d", 120, 6, arrival=32),
         _req(rng, "e", 20, 4, arrival=33)])
    s["interval4_mixed"] = _scenario(
        "Interval 4, a larger mix: 40 requests, prefix sharing, threshold, staggered arrivals.",
        4, {"max_num_seqs": 16, "max_num_batched_tokens": 192, "long_prefill_token_threshold": 64},
        {"num_gpu_blocks": 160, "enable_prefix_caching": True},
        [_req(rng, f"r{i}", rng.randrange(20, 300), rng.randrange(2, 40), arrival=rng.randrange(0, 60),
              prefix=shared[:rng.choice([0, 16, 48])]) for i in range(40)])
    s["interval2_max_num_seqs"] = _scenario(
        "Interval 2 with max_num_seqs 2: slots free up on deferring steps and stay empty.",
        2, {"max_num_seqs": 2, "max_num_batched_tokens": 64}, {"num_gpu_blocks": 64},
        [_req(rng, f"r{i}", rng.randrange(10, 100), rng.randrange(2, 12), arrival=i) for i in range(8)])
    return s


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, scenario in build().items():
        problems = validate_scenario(scenario)
        if problems:
            raise SystemExit(f"{name}: {problems}")
        (OUT / f"{name}.json").write_text(json.dumps(scenario) + "\n")
    print(f"wrote {len(build())} scenarios to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
