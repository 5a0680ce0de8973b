"""Pipeline-parallel scheduler traces from vLLM 0.33.0's own engine loop (the oracle).

Run in the reference environment (``bash ../shared/reference/setup.sh``), not in
kvsched's:

    REF/bin/python tests/conformance/pp_oracle.py OUTDIR --seeds 0-39
    REF/bin/python tests/conformance/pp_oracle.py FOLDER      # re-trace FOLDER/*.json

For each seed it writes ``pp_SEED.json`` (a random_scenarios.py scenario with a
``pipeline_parallel_size`` of 2 or 4 and async scheduling on or off) and its trace
``pp_SEED.vllm.jsonl``. The trace comes from vLLM's ``EngineCore.step_with_batch_queue``
itself (as ``check_engine_loop.py`` drives it: an EngineCore skeleton whose executor
is the reference's scripted fake model) on a scheduler built with
``ParallelConfig(pipeline_parallel_size=N)``, so vLLM decides the queue depth
(``VllmConfig.max_concurrent_batches``) and the scheduler's PP path:

- synchronous scheduling (the V1 model runner, which is what the reference resolves
  to without Triton): depth N; a request whose prompt is all scheduled waits for its
  output before it is scheduled again;
- async scheduling: vLLM 0.33's V1 runner refuses PP with async scheduling, the V2
  runner (the default on GPUs) runs it with depth N + 1 and its decode stagger (a
  request decodes at most once every N scheduler steps). The driver selects the V2
  runner for these (``VLLM_USE_V2_MODEL_RUNNER=1``). The V2 runner lists resumed
  requests among the new ones in its scheduler output; the trace moves them back to
  ``resumed`` (a request scheduled before is a resumed one), the only change.

The trace format is SCENARIO_FORMAT.md's, with ``processed`` on every line (the
batch queue is deeper than one). tests/conformance/pp/ holds the committed goldens;
test_pipeline_parallel.py compares kvsched's replay with them, and compare_live_pp.py
runs fresh seeds through both.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
from collections import deque
from pathlib import Path
from typing import Any

# regenerate.py's default (../shared/reference from the repository root) or KVSCHED_REFERENCE_DIR.
REFERENCE = Path(os.environ.get("KVSCHED_REFERENCE_DIR",
                                Path(__file__).resolve().parents[3] / "shared" / "reference"))
HERE = Path(__file__).resolve().parent
for folder in (str(REFERENCE), str(HERE)):
    if folder not in sys.path:
        sys.path.insert(0, folder)

import check_engine_loop as cel  # noqa: E402
import torch  # noqa: E402
import vllm_replay as vr  # noqa: E402
from pp_scenarios import (  # noqa: E402
    FEATURE_PREFIX,
    FILE_PREFIX,
    PP_SIZES,
    parse_pp_sizes,
    pp_feature_scenario,
    pp_scenario,
)
from random_scenarios import format_scenario, parse_seeds  # noqa: E402
from scenario_timeline import scenario_timeline  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    LoRAConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402


def build_scheduler(scenario: dict[str, Any]) -> Scheduler:
    """vLLM's scheduler for the scenario, with ParallelConfig(pipeline_parallel_size=N)."""
    sc, cc = scenario.get("scheduler", {}), scenario["cache"]
    use_async = bool(scenario.get("async_scheduling", False))
    pp = int(scenario.get("pipeline_parallel_size", 1))
    if scenario.get("speculative") or scenario.get("kv_connector"):
        raise ValueError("this driver replays PP scenarios without speculative decoding or a KV "
                         "connector")
    # Read by VllmConfig.use_v2_model_runner each time it is asked.
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if use_async else "0"
    max_model_len = int(sc.get("max_model_len", 8192))
    model_config = ModelConfig(model=str(REFERENCE / "tiny_model_config"), dtype="float32", seed=0,
                               skip_tokenizer_init=True, max_model_len=max_model_len)
    kwargs: dict[str, Any] = dict(
        max_num_seqs=int(sc.get("max_num_seqs", 128)),
        max_num_batched_tokens=int(sc.get("max_num_batched_tokens", 8192)),
        max_model_len=max_model_len,
        enable_chunked_prefill=bool(sc.get("enable_chunked_prefill", True)),
        long_prefill_token_threshold=int(sc.get("long_prefill_token_threshold", 0)),
        is_encoder_decoder=False,
        policy=sc.get("policy", "fcfs"),
        async_scheduling=use_async,
    )
    if "scheduler_reserve_full_isl" in sc:
        kwargs["scheduler_reserve_full_isl"] = bool(sc["scheduler_reserve_full_isl"])
    block_size = int(cc.get("block_size", 16))
    num_blocks = int(cc["num_gpu_blocks"])
    cache_config = CacheConfig(block_size=block_size, gpu_memory_utilization=0.9, cache_dtype="auto",
                               enable_prefix_caching=bool(cc.get("enable_prefix_caching", False)))
    extra: dict[str, Any] = {}
    if "max_loras" in scenario:
        extra["lora_config"] = LoRAConfig(max_loras=int(scenario["max_loras"]))
    vllm_config = VllmConfig(
        scheduler_config=SchedulerConfig(**kwargs), model_config=model_config,
        cache_config=cache_config, parallel_config=ParallelConfig(pipeline_parallel_size=pp),
        observability_config=ObservabilityConfig(), **extra)
    if use_async:
        # As vllm_replay.py: the CPU platform turns async scheduling off after
        # validation; on a GPU it stays on.
        vllm_config.scheduler_config.async_scheduling = True
    assert vllm_config.use_v2_model_runner == use_async
    expected_depth = pp + 1 if use_async else pp
    assert vllm_config.max_concurrent_batches == expected_depth, vllm_config.max_concurrent_batches
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    cache_config.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(vllm_config)
    cls = vllm_config.scheduler_config.get_scheduler_cls()
    assert cls is (AsyncScheduler if use_async else Scheduler), cls
    sched = cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config, block_size=block_size,
                log_stats=False, structured_output_manager=StructuredOutputManager(vllm_config))
    assert sched.use_pp == (pp > 1)
    return sched


def engine_trace(scenario: dict[str, Any], out) -> int:
    """Drive vLLM's EngineCore.step_with_batch_queue step by step; one trace line a step."""
    sched = build_scheduler(scenario)
    cc = scenario["cache"]
    init_none_hash(sha256)
    hasher = get_request_block_hasher(int(cc.get("block_size", 16)), sha256)
    specs, arrivals, aborts, last_event, max_steps = scenario_timeline(scenario)

    executor = cel.ScriptedExecutor(sched, vr.FakeModel(specs))
    processed_sos: list = []
    real_update = sched.update_from_output

    def update_from_output(so, mro):
        processed_sos.append(so)
        return real_update(so, mro)

    sched.update_from_output = update_from_output
    # The attributes EngineCore.__init__ sets that step_with_batch_queue and
    # post_step read (as check_engine_loop.py).
    engine = object.__new__(EngineCore)
    engine.vllm_config = sched.vllm_config
    engine.scheduler = sched
    engine.model_executor = executor
    engine.log_stats = False
    engine._weight_version = "default"
    engine.is_mm_encoder_only = False
    engine.is_pooling_model = False
    engine.use_spec_decode = False
    engine.check_for_draft_tokens = False
    engine.async_scheduling = sched.vllm_config.scheduler_config.async_scheduling
    engine.batch_queue_size = sched.vllm_config.max_concurrent_batches
    engine.batch_queue = deque(maxlen=engine.batch_queue_size)
    engine.aborts_queue = queue.Queue()
    assert engine.batch_queue_size > 1

    seen: set[str] = set()  # requests scheduled before: a "new" one of them is resumed
    step_of: dict[int, int] = {}
    step = 0
    while step <= last_event or sched.has_unfinished_requests() or engine.batch_queue:
        if step >= max_steps:
            raise RuntimeError(f"scenario did not finish within {max_steps} steps")
        for r in arrivals.get(step, []):
            engine.add_request(vr.make_request(r, hasher, "max_loras" in scenario, scenario))
        finished = []
        live = vr.live_aborts(sched, aborts.get(step, []))
        if live:
            engine.abort_requests(live)
            finished.extend([rid, "abort"] for rid in live)
        n_sched, n_proc = len(executor.scheduled), len(processed_sos)
        outputs, model_executed = engine.step_with_batch_queue()
        engine.post_step(model_executed)
        for outs in (outputs or {}).values():
            for o in outs.outputs:
                if o.finish_reason is not None:
                    finished.append([o.request_id, vr.FINISH_NAMES[int(o.finish_reason)]])
        new_sos = executor.scheduled[n_sched:]
        assert len(new_sos) <= 1
        so = new_sos[0] if new_sos else None
        if so is not None:
            step_of[id(so)] = step
        proc = processed_sos[n_proc:]
        assert len(proc) <= 1
        processed = step_of.get(id(proc[0])) if proc else None
        record = vr.trace_record(step, so, finished, sched, False, True, processed)
        if so is not None:
            # The V2 runner's new requests include the resumed ones.
            resumed = [rid for rid in record["new"] if rid in seen]
            if resumed:
                record["new"] = [rid for rid in record["new"] if rid not in seen]
                record["resumed"] = sorted(set(record["resumed"]) | set(resumed))
            seen.update(so.num_scheduled_tokens)
        out.write(json.dumps(record, separators=(",", ":")) + "\n")
        step += 1
    return step


def trace_file(scenario_path: Path) -> int:
    scenario = json.loads(scenario_path.read_text())
    with scenario_path.with_name(scenario_path.stem + ".vllm.jsonl").open("w") as out:
        return engine_trace(scenario, out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="where pp_SEED.json and its trace go")
    ap.add_argument("--seeds", help="write fresh scenarios for these seeds first (e.g. 0-39)")
    ap.add_argument("--features", action="store_true",
                    help="with --seeds: feature scenarios (pp_feature_scenario) instead of plain ones")
    ap.add_argument("--pp-sizes", type=parse_pp_sizes, default=PP_SIZES,
                    help="with --seeds: the pipeline sizes a seed draws from (default 2,4)")
    args = ap.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    if args.seeds:
        make, prefix = (pp_feature_scenario, FEATURE_PREFIX) if args.features else (pp_scenario, FILE_PREFIX)
        for seed in parse_seeds(args.seeds):
            (args.folder / f"{prefix}{seed}.json").write_text(format_scenario(make(seed, args.pp_sizes)))
    for path in sorted(args.folder.glob("*.json")):
        steps = trace_file(path)
        print(json.dumps({"scenario": path.name, "steps": steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
