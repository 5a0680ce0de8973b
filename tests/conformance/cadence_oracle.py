"""Golden traces for the prefill-cadence corpus, from vLLM 0.33.0's own scheduler.

The shared oracle (../shared/reference/vllm_replay.py) builds its scheduler
without ``prefill_schedule_interval``; this driver builds vLLM's Scheduler
with the scenario's top-level ``prefill_schedule_interval`` (a plain
``SchedulerConfig`` field; no DP, so vLLM applies the cadence locally) and
writes the oracle's trace format. It reuses the oracle's request building and
token script (imported, not modified). Run it with the reference Python:

    ~/.cache/kvsched-reference/venv/bin/python tests/conformance/cadence_oracle.py \\
        tests/conformance/cadence          # every NAME.json -> NAME.vllm.jsonl

``KVSCHED_REFERENCE_DIR`` (default ../shared/reference) locates the oracle.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[2]
REFERENCE = Path(os.environ.get("KVSCHED_REFERENCE_DIR", REPO.parent / "shared" / "reference"))
sys.path.insert(0, str(REFERENCE))

import torch  # noqa: E402
import vllm_replay as oracle  # noqa: E402  (sets vLLM's offline/CPU environment)
from scenario_timeline import scenario_timeline  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

FINISH = {0: "stop", 1: "length", 2: "abort"}



def vllm_step_record(step: int, sched: Any, output: Any, done: list[list[str]]) -> dict[str, Any]:
    """One step of vLLM's scheduler as the oracle's trace line (the fields
    kvsched's step trace has)."""
    cached = output.scheduled_cached_reqs
    admitted = {n.req_id: n.num_computed_tokens for n in output.scheduled_new_reqs}
    admitted.update((rid, cached.num_computed_tokens[i]) for i, rid in enumerate(cached.req_ids)
                    if rid in cached.resumed_req_ids)
    return {
        "step": step,
        "scheduled": [[rid, n] for rid, n in output.num_scheduled_tokens.items()],
        "new": [n.req_id for n in output.scheduled_new_reqs],
        "resumed": sorted(cached.resumed_req_ids),
        "preempted": sorted(output.preempted_req_ids or ()),
        "computed_at_admission": admitted,
        "finished": done,
        "num_free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
        "num_running": len(sched.running),
        "num_waiting": len(sched.waiting),
    }


def vllm_scheduler(scenario: dict[str, Any], data_parallel_size: int = 1) -> Scheduler:
    """vLLM's Scheduler for the scenario. With ``data_parallel_size`` > 1 it is
    one rank of an MoE DP deployment: vLLM then leaves the cadence to the DP
    engine core (its local interval is 1)."""
    sc = scenario.get("scheduler", {})
    cc = scenario.get("cache", {})
    max_model_len = int(sc.get("max_model_len", 8192))
    sched_args: dict[str, Any] = {
        "max_num_seqs": int(sc.get("max_num_seqs", 128)),
        "max_num_batched_tokens": int(sc.get("max_num_batched_tokens", 8192)),
        "max_model_len": max_model_len,
        "enable_chunked_prefill": bool(sc.get("enable_chunked_prefill", True)),
        "long_prefill_token_threshold": int(sc.get("long_prefill_token_threshold", 0)),
        "policy": sc.get("policy", "fcfs"),
        "scheduler_reserve_full_isl": bool(sc.get("scheduler_reserve_full_isl", True)),
        "prefill_schedule_interval": int(scenario.get("prefill_schedule_interval", 1)),
        "is_encoder_decoder": False,
    }
    block_size = int(cc.get("block_size", 16))
    num_blocks = int(cc["num_gpu_blocks"])
    cache = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                        enable_prefix_caching=bool(cc.get("enable_prefix_caching", False)))
    config = VllmConfig(
        scheduler_config=SchedulerConfig(**sched_args),
        model_config=ModelConfig(model=str(REFERENCE / "tiny_model_config"), dtype="float32",
                                 seed=0, skip_tokenizer_init=True, max_model_len=max_model_len),
        cache_config=cache,
        parallel_config=ParallelConfig(data_parallel_size=data_parallel_size),
        observability_config=ObservabilityConfig(),
    )
    assert config.parallel_config.data_parallel_size == data_parallel_size
    assert config.scheduler_config.prefill_schedule_interval == sched_args["prefill_schedule_interval"]
    cache.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(config)
    group = KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=block_size, num_kv_heads=1,
                                                          head_size=1, dtype=torch.float32))
    return Scheduler(vllm_config=config,
                     kv_cache_config=KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                                   kv_cache_groups=[group]),
                     block_size=block_size, log_stats=False,
                     structured_output_manager=StructuredOutputManager(config))


def run(scenario: dict[str, Any], out: TextIO) -> dict[str, Any]:
    """Step the scenario through vLLM; one trace line per step. Also counts the
    steps on which vLLM deferred prefills (to check the corpus exercises it)."""
    sched = vllm_scheduler(scenario)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(int(scenario.get("cache", {}).get("block_size", 16)), sha256)
    specs, by_step, aborts, horizon, limit = scenario_timeline(scenario)
    step = deferred_chunks = deferred_admissions = escaped = 0
    while step <= horizon or sched.has_unfinished_requests():
        if step >= limit:
            raise RuntimeError(f"did not finish within {limit} steps")
        for r in by_step.get(step, ()):
            sched.add_request(oracle.make_request(r, hasher))
        done: list[list[str]] = []
        live = [rid for rid in aborts.get(step, ()) if rid in sched.requests]
        if live:
            sched.finish_requests(live, RequestStatus.FINISHED_ABORTED)
            done += [[rid, "abort"] for rid in live]
        # vLLM's own cadence state, read before the step (the condition of
        # its schedule()), to report how often the corpus really defers.
        gated = (sched.local_prefill_interval > 1
                 and sched.num_executed_steps + 1 - sched.last_prefill_step
                 < sched.local_prefill_interval
                 and any(not r.is_prefill_chunk for r in sched.running))
        deferring = gated and not sched.prefill_capacity_bound
        escaped += gated and sched.prefill_capacity_bound
        chunks = {r.request_id for r in sched.running if r.is_prefill_chunk}
        output = sched.schedule()
        ids = list(output.num_scheduled_tokens)
        deferred_chunks += deferring and bool(chunks)
        deferred_admissions += deferring and bool(sched.waiting)
        tokens = [[] if sched.requests[rid].is_prefill_chunk
                  else [oracle.next_token(specs[rid], sched.requests[rid].num_output_tokens)]
                  for rid in ids]
        engine_out = sched.update_from_output(output, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=tokens, logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        for outs in engine_out.values():
            done += [[o.request_id, FINISH[int(o.finish_reason)]]
                     for o in outs.outputs if o.finish_reason is not None]
        out.write(json.dumps(vllm_step_record(step, sched, output, done),
                             separators=(",", ":")) + "\n")
        step += 1
    return {"steps": step, "deferred_steps_with_chunks": deferred_chunks,
            "deferred_steps_with_waiting": deferred_admissions,
            "capacity_bound_escapes": escaped}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    target = Path(argv[0])
    paths = sorted(target.glob("*.json")) if target.is_dir() else [target]
    for path in paths:
        scenario = json.loads(path.read_text())
        with open(path.with_name(path.stem + ".vllm.jsonl"), "w") as out:
            summary = run(scenario, out)
        print(json.dumps({"scenario": path.name, **summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

