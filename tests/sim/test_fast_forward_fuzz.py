"""Fast-forward is exact: a differential fuzzer over random simulator configs.

Each example draws a deployment (one engine; dense data-parallel replicas
with a router; lockstep MoE ranks with an admission policy), synchronous or
async scheduling (vLLM's async engine loop), scheduler and
cache settings (chunking, threshold, budgets, ``max_num_seqs``, prefix
caching, KV pressure that preempts, priority), a workload (random with or
without a shared prefix, or a trace with its own arrival times and shared
hash blocks; open-loop or ``--max-concurrency``; a client timeout a third
of the time, which aborts requests wherever they are) and an EOS
probability, and runs it twice: stepping one by one and with fast-forward.
Every request's send, token times and finish (or failure), every rank's
step log, the metrics, the routing and the final KV cache must be identical.

CI runs ``KVSCHED_FUZZ_EXAMPLES`` examples (default 150); the closing note of
issue 9 reports a run of 2,000.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kvsched.config import CacheConfig, KVCacheGroup, SchedulerConfig
from kvsched.core.hybrid_kv_cache import HybridKVCacheManager
from kvsched.core.offloading_connector import OffloadingConnector
from kvsched.core.offloading_manager import LRUPolicy
from kvsched.core.policies import AdpBalance, BalanceGate, DPRankStates
from kvsched.core.scheduler import Scheduler
from kvsched.errors import CannotServe
from kvsched.perf import get_hardware, get_model
from kvsched.perf.host import HostTerms
from kvsched.perf.measured import MeasuredStepTimeModel
from kvsched.perf.model_parsers import load_model_spec
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.step_profile import load_profile
from kvsched.perf.step_time import ParallelConfig, RuntimeConfig, StepTimeModel
from kvsched.sim.dp import DPOptions, DPSimulator
from kvsched.sim.offload_transfer import OffloadConfig
from kvsched.sim.rank import SimResult
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import (
    HASH_BLOCK_TOKEN_BASE,
    UNIQUE_TOKEN_BASE,
    MMItem,
    Workload,
    WorkloadRequest,
    random_workload,
)

EXAMPLES = int(os.environ.get("KVSCHED_FUZZ_EXAMPLES", "150"))
# CI replays the same examples; KVSCHED_FUZZ_SEED=N draws a fresh set.
FUZZ_SEED = os.environ.get("KVSCHED_FUZZ_SEED")
H100 = get_hardware("h100-sxm")
DENSE = StepTimeModel(get_model("Llama-3.1-8B"), H100)
# Measured kernels price steps by table lookups: the same exactness is required.
DENSE_MEASURED = MeasuredStepTimeModel(get_model("Llama-3.1-8B"), H100)
# Every host term on: per-step gaps, and requests reaching the engine after
# a delay that depends on their prompt (sends and arrivals interleave).
HOST = HostTerms(0.2e-3, "test", "test", "fuzzer", step_s=0.3e-3, per_sampled_request_s=10e-6,
                 dp_sync_s=0.5e-3, arrival_s=2e-3, per_prompt_token_s=20e-6)
DENSE_HOST = MeasuredStepTimeModel(get_model("Llama-3.1-8B"), H100, host=HOST)
MOE_MODEL = get_model("Qwen3-30B-A3B")
# A step profile's fit (the committed tiny-Llama CPU profile): its 1-4-token
# steps carry costs of their own, which a fast-forwarded decode stretch must
# price as each step alone. Lockstep MoE ranks stay on the roofline (a
# profile is of one dense model).
_TINY = Path(__file__).parents[1] / "perf" / "data"
DENSE_PROFILED = ProfiledStepTimeModel(load_model_spec(_TINY / "tiny_llama"), H100, ParallelConfig(),
                                       RuntimeConfig(), load_profile(_TINY / "tiny_llama_profile.json"))


@st.composite
def trace_workloads(draw: st.DrawFn, max_concurrency: int | None) -> Workload:
    """A trace: its own arrival times (bursts and gaps), prompts built from
    shared hash blocks and private tails, as Mooncake's."""
    n = draw(st.integers(1, 24))
    block = draw(st.sampled_from([4, 16, 32]))
    t = 0.0
    requests = []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05, 0.3, 2.0]))
        shared = draw(st.lists(st.integers(0, 5), max_size=4))
        runs = [(HASH_BLOCK_TOKEN_BASE + h, block) for h in shared]
        tail = draw(st.integers(0 if runs else 1, 150))
        if tail:
            runs.append((UNIQUE_TOKEN_BASE + i, tail))
        requests.append(WorkloadRequest(f"t{i}", t, tuple(runs), draw(st.integers(1, 90))))
    return Workload("trace", tuple(requests), max_concurrency)


# Images of a vision-language model: an identifier always names the same
# image (vLLM's mm hash), so its length is fixed; requests share them.
IMAGES = {"img-0": 16, "img-1": 40, "img-2": 64}


class _Encoder:
    """A vision encoder's pricer: a cost per image and per patch."""

    def max_tokens_per_item(self) -> dict[str, int]:
        return {"image": max(IMAGES.values())}

    def seconds(self, patches: Sequence[int]) -> float:
        return 2e-4 * len(patches) + 1e-7 * sum(patches)


@st.composite
def with_images(draw: st.DrawFn, workload: Workload) -> Workload:
    """Images placed in some prompts, apart, inside the prompt."""
    requests = []
    for r in workload.requests:
        items: list[MMItem] = []
        at = draw(st.integers(0, 40))
        for _ in range(draw(st.integers(0, 2))):
            name = draw(st.sampled_from(sorted(IMAGES)))
            length = IMAGES[name]
            if at + length > r.num_prompt_tokens:
                break
            items.append(MMItem(name, "image", at, length, length, 4 * length, 64, 64))
            at += length + draw(st.integers(0, 30))
        requests.append(dataclasses.replace(r, mm_items=tuple(items)))
    return dataclasses.replace(workload, requests=tuple(requests))


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    max_concurrency = draw(st.one_of(st.none(), st.integers(1, 8)))
    if draw(st.booleans()):
        workload = draw(trace_workloads(max_concurrency))
    else:
        workload = random_workload(
            num_prompts=draw(st.integers(1, 30)), input_len=draw(st.integers(4, 300)),
            output_len=draw(st.integers(1, 120)), range_ratio=draw(st.sampled_from([0.0, 0.5, 0.7])),
            prefix_len=draw(st.sampled_from([0, 0, 16, 40])),
            request_rate=draw(st.sampled_from([math.inf, 5.0, 40.0, 200.0])),
            burstiness=draw(st.sampled_from([1.0, 0.5, 3.0])), max_concurrency=max_concurrency,
            seed=draw(st.integers(0, 1000)))
    # A client timeout, a third of the time: from one that fails requests
    # still on their way to the engine (the host terms' arrival delay is 2 ms
    # and up) through ones that abort them queued, mid-prefill or decoding, to
    # one that rarely fires. Each deadline must stop a stretch as a step does.
    if draw(st.integers(0, 2)) == 0:
        timeout = draw(st.sampled_from([0.001, 0.004, 0.02, 0.05, 0.15, 0.4, 1.0, 3.0]))
        workload = dataclasses.replace(workload, request_timeout=timeout)
    return workload


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str                 # "single", "dense-dp" or "lockstep"
    size: int
    router: str
    policy: str               # "none", "cadence", "balance", "balance-1", "adp"
    interval: int
    sched: SchedulerConfig
    cache: CacheConfig
    eos: float
    seed: int
    workload: Workload
    backend: str = "roofline"  # "roofline", "measured", "measured-host" (host terms on), "profiled"
    offload: OffloadConfig | None = None  # KV offloading to CPU (vLLM's OffloadingConnector)
    images: bool = False      # a vision-language model: images through the encoder path


@st.composite
def cases(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["single", "single", "dense-dp", "lockstep"]))
    size = 1 if kind == "single" else draw(st.integers(1 if kind == "dense-dp" else 2, 4))
    router = draw(st.sampled_from(["vllm", "round-robin", "least-loaded"]))
    policy = "none"
    interval = 1
    if kind == "lockstep":
        policy = draw(st.sampled_from(["none", "none", "cadence", "balance", "balance-1", "adp"]))
    elif draw(st.integers(0, 5)) == 0:
        policy = "cadence"
    if policy == "cadence":
        interval = draw(st.integers(2, 4))
    chunked = draw(st.booleans())
    max_model_len = draw(st.sampled_from([512, 1024]))
    budget = draw(st.sampled_from([8, 32, 64, 200, 512]))
    if not chunked:
        budget = max(budget, max_model_len)
    max_num_seqs = draw(st.sampled_from([1, 2, 5, 16, 64]))
    sched = SchedulerConfig(
        max_num_batched_tokens=max(budget, max_num_seqs), max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 17, 64])),
        policy=draw(st.sampled_from(["fcfs", "fcfs", "priority"])),
        async_scheduling=draw(st.booleans()))
    block_size = draw(st.sampled_from([1, 4, 16]))
    # From barely one request's worth (preemption) to roomy.
    min_blocks = -(-max_model_len // block_size) + 1
    cache = CacheConfig(num_gpu_blocks=draw(st.integers(min_blocks, min_blocks * 4)),
                        block_size=block_size, enable_prefix_caching=draw(st.booleans()))
    eos = draw(st.sampled_from([0.0, 0.0, 0.02, 0.2]))
    if policy == "balance-1" and max_num_seqs < 2:
        policy = "balance"  # a threshold of 0 running would hold admission forever
    offload = None
    if kind != "lockstep" and draw(st.integers(0, 2)) == 0:
        # A CPU cache from one chunk (evicting at every store) to roomy, and
        # a host link from slow (jobs in flight over many steps) to fast.
        offload = OffloadConfig(size_gib=1.0, num_cpu_blocks=draw(st.sampled_from([1, 4, 16, 64, 512])),
                                bytes_per_block=draw(st.sampled_from([1 << 14, 1 << 17, 1 << 21])),
                                tensor_parallel_size=1, host_link_bw=draw(st.sampled_from([1e9, 5e10])))
    backend = draw(st.sampled_from(["roofline", "measured", "measured-host", "profiled"]))
    workload = draw(workloads())
    # Images: one engine with a trace's requests, a quarter of the time
    # (an encoder budget and cache in the scheduler, encoder time in steps).
    images = kind == "single" and isinstance(workload.requests, tuple) and draw(st.integers(0, 3)) == 0
    if images:
        workload = draw(with_images(workload))
    elif offload is None and draw(st.booleans()):
        # A hybrid KV cache half of the time (KV connectors are refused
        # with one): full attention beside sliding windows, as gpt-oss and
        # Gemma, or one window, as Mistral.
        cache = draw(hybrid_caches(max_model_len, sched.max_num_batched_tokens, cache.enable_prefix_caching))
    return Case(kind, size, router, policy, interval, sched, cache, eos, draw(st.integers(0, 99)),
                workload, backend, offload, images)


@st.composite
def hybrid_caches(draw: st.DrawFn, max_model_len: int, budget: int, caching: bool) -> CacheConfig:
    """Full attention and sliding-window groups: random windows (below a
    block to past the prompts), block sizes (one for all, or per group),
    retention intervals (0, None, multiples of the scheduler block) and a
    pool from about one request's worth (preemption) to roomy."""
    layout = draw(st.sampled_from(["full+swa", "full+swa", "swa", "full+swa+swa"]))
    groups: list[KVCacheGroup] = []
    for kind in layout.split("+"):
        bs = draw(st.sampled_from([1, 4, 8, 16]))
        if kind == "full":
            groups.append(KVCacheGroup("full_attention", bs))
        else:
            groups.append(KVCacheGroup("sliding_window", bs,
                                       sliding_window=draw(st.sampled_from([1, 5, 16, 32, 100, 128, 600]))))
    if draw(st.booleans()):
        groups = [dataclasses.replace(g, block_size=groups[0].block_size) for g in groups]
    scheduler_block = math.lcm(*(g.block_size for g in groups))
    retention = draw(st.sampled_from([0, 0, None, scheduler_block, 4 * scheduler_block]))
    # One request's worth: every full-attention block, and a window plus a
    # budget's worth in each sliding group.
    one = 1 + sum(-(-max_model_len // g.block_size) if g.kind == "full_attention"
                  else -(-min(max_model_len, (g.sliding_window or 0) + budget) // g.block_size) + 1
                  for g in groups)
    return CacheConfig(num_gpu_blocks=draw(st.integers(one, one * 4)), block_size=scheduler_block,
                       enable_prefix_caching=caching, kv_groups=tuple(groups),
                       prefix_cache_retention_interval=retention)


def _lockstep_model(size: int, backend: str) -> StepTimeModel:
    parallel = ParallelConfig(1, size, enable_expert_parallel=True)
    if backend in ("roofline", "profiled"):
        return StepTimeModel(MOE_MODEL, H100, parallel)
    return MeasuredStepTimeModel(MOE_MODEL, H100, parallel, host=HOST if backend == "measured-host" else None)


def _dense_model(backend: str) -> StepTimeModel:
    return {"roofline": DENSE, "measured": DENSE_MEASURED, "measured-host": DENSE_HOST,
            "profiled": DENSE_PROFILED}[backend]


def _kv_state(sched: Scheduler) -> tuple[Any, ...]:
    sched.check_invariants()
    pool = sched.kv_cache_manager.block_pool
    connector = sched.connector
    offload: tuple[Any, ...] = ()
    if isinstance(connector, OffloadingConnector):
        # The CPU cache (slots, readiness, LRU ranks) and the connector's
        # view of every request it still tracks.
        policy = connector.manager.policy
        assert isinstance(policy, LRUPolicy)
        offload = ({k: (c.chunk_id, c.ref_cnt) for k, c in policy.chunks.items()}, dict(policy.ranks),
                   connector.next_job_id, sched.sched_step_seq, sched.processed_step_seq,
                   {rid: (list(st.keys), list(st.block_ids), st.next_stored_chunk, st.num_local_tokens,
                          dict(st.access.positions))
                    for rid, st in connector.reqs.items()})
    kv = sched.kv_cache_manager
    groups: tuple[Any, ...] = ()
    if isinstance(kv, HybridKVCacheManager):
        # Every group's tables and cached counts, and the lookups' junctions.
        groups = ([{rid: list(t) for rid, t in m.tables.items()} for m in kv.managers],
                  [dict(m.num_cached_block) for m in kv.managers], dict(kv.shared_prefix_boundary))
    return (list(pool.free_queue), list(pool.ref_cnt), dict(pool.hash_of_block), dict(pool.cached),
            dict(pool.dup_cached),
            {rid: list(b) for rid, b in kv.req_to_blocks.items()}, groups, offload)


def _snapshot(result: SimResult) -> dict[str, Any]:
    metrics = result.metrics()
    for key in ("simulation_wall_seconds", "fast_forwarded_steps"):
        metrics.pop(key)
    steps = {f.name: list(getattr(result.steps, f.name)) for f in dataclasses.fields(result.steps)}
    return {"metrics": metrics, "records": sorted(dataclasses.astuple(r) for r in result.records),
            "failed": sorted(result.failed), "steps": steps,
            "itls": sorted(result.itls.to_array().tolist()),
            "token_times": sorted(result.token_times.to_array().tolist())}


def run_case(case: Case, fast_forward: bool) -> tuple[dict[str, Any], int]:
    """Everything observable of one run, and how many steps it jumped."""
    if case.kind == "single":
        config = SimConfig(case.sched, case.cache, _dense_model(case.backend), eos_probability=case.eos,
                           seed=case.seed,
                           fast_forward=fast_forward, prefill_schedule_interval=case.interval,
                           keep_token_times=True, offload=case.offload,
                           encoder=_Encoder() if case.images else None)  # type: ignore[arg-type]
        sim = Simulator(config, case.workload)
        result = sim.run()
        state = {"result": _snapshot(result), "kv": _kv_state(sim.sched), "clock": sim.now}
        return state, result.num_fast_forwarded_steps
    lockstep = case.kind == "lockstep"
    model = _lockstep_model(case.size, case.backend) if lockstep else _dense_model(case.backend)
    config = SimConfig(case.sched, case.cache, model, eos_probability=case.eos, seed=case.seed,
                       fast_forward=fast_forward, prefill_schedule_interval=case.interval,
                       keep_token_times=True, offload=case.offload)
    shared = DPRankStates(case.size)
    policies: list[Any] | None = None
    if case.policy in ("balance", "balance-1"):
        threshold = "full" if case.policy == "balance" else "full-minus-one"
        policies = [BalanceGate(shared, r, threshold) for r in range(case.size)]
    elif case.policy == "adp":
        policies = [AdpBalance(shared, r, timeout_iters=5, batching_wait_iters=2)
                    for r in range(case.size)]
    dp = DPSimulator(config, case.workload, DPOptions(case.size, lockstep, case.router, 0.05),
                     policies, shared)
    dp.after_step.append(lambda d: shared.publish_all([r.sched for r in d.ranks]))
    out = dp.run()
    state = {"ranks": [_snapshot(r) for r in out.ranks], "routed": out.routed,
             "combined": _snapshot(out.combined()),
             "kv": [_kv_state(r.sched) for r in dp.ranks],
             "clocks": [inst.now for inst in dp.instances]}
    return state, sum(r.num_fast_forwarded_steps for r in out.ranks)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=FUZZ_SEED is None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@seed(int(FUZZ_SEED or 0))
@given(cases())
def test_fast_forward_is_exact_on_random_configs(case: Case) -> None:
    stepped, stepped_jumps = _outcome(case, fast_forward=False)
    jumped, jumps = _outcome(case, fast_forward=True)
    assert stepped_jumps == 0
    assert jumped == stepped
    if os.environ.get("KVSCHED_FUZZ_REPORT"):
        # What the examples reached (printed with -s): runs, hybrid runs,
        # and how many of each jumped.
        hybrid = bool(case.cache.kv_groups)
        REACHED["runs"] += 1
        REACHED["jumped"] += jumps > 0
        REACHED["hybrid"] += hybrid
        REACHED["hybrid_jumped"] += hybrid and jumps > 0
        REACHED["hybrid_steps_jumped"] += jumps if hybrid else 0
        print("REACHED", REACHED)


REACHED = {"runs": 0, "jumped": 0, "hybrid": 0, "hybrid_jumped": 0, "hybrid_steps_jumped": 0}


def _outcome(case: Case, fast_forward: bool) -> tuple[dict[str, Any], int]:
    """``run_case``, or the simulator's refusal to go on (a run no request
    of which can ever be scheduled again, as some offloading runs on tiny
    caches are): both modes must then stop with the same words."""
    try:
        return run_case(case, fast_forward)
    except CannotServe as e:
        return {"cannot_serve": str(e)}, 0


def test_the_fuzzer_reaches_fast_forward() -> None:
    # Guard against a fuzzer that compares two step-by-step runs: fixed
    # configs of each kind must jump.
    wl = random_workload(num_prompts=12, input_len=100, output_len=80, request_rate=50.0, seed=1)
    sched = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=1024)
    cache = CacheConfig(num_gpu_blocks=400, block_size=16)
    async_sched = dataclasses.replace(sched, async_scheduling=True)
    for kind, size, config in (("single", 1, sched), ("dense-dp", 3, sched), ("lockstep", 2, sched),
                               ("single", 1, async_sched), ("dense-dp", 3, async_sched),
                               ("lockstep", 2, async_sched)):
        case = Case(kind, size, "round-robin", "none", 1, config, cache, 0.0, 0, wl)
        stepped, _ = run_case(case, fast_forward=False)
        jumped, jumps = run_case(case, fast_forward=True)
        assert jumps > 0, (kind, config.async_scheduling)
        assert jumped == stepped
        assert jumped == stepped, kind
    # With images (the scheduler's encoder path; images shared by requests):
    # the scheduler keeps its general path there, so these runs step (no
    # jumps yet); fast-forward must still change nothing.
    pictured = Workload("images", tuple(
        WorkloadRequest(f"m{i}", 0.01 * i, ((UNIQUE_TOKEN_BASE + i, 150),), 80,
                        mm_items=(MMItem(f"img-{i % 3}", "image", 20, IMAGES[f"img-{i % 3}"],
                                         IMAGES[f"img-{i % 3}"], 64, 64, 64),))
        for i in range(12)))
    for config in (sched, async_sched):
        case = Case("single", 1, "round-robin", "none", 1, config, cache, 0.0, 0, pictured, images=True)
        stepped, _ = run_case(case, fast_forward=False)
        jumped, _ = run_case(case, fast_forward=True)
        assert jumped == stepped, ("images", config.async_scheduling)
    # With KV offloading (its connector and timed worker) too, with a CPU
    # cache small enough to evict.
    offload = OffloadConfig(size_gib=1.0, num_cpu_blocks=8, bytes_per_block=1 << 17, tensor_parallel_size=1,
                            host_link_bw=5e10)
    prefixed = random_workload(num_prompts=12, input_len=100, output_len=80, request_rate=50.0, seed=1,
                               prefix_len=40)
    for kind, size, config in (("single", 1, sched), ("dense-dp", 3, sched), ("single", 1, async_sched),
                               ("dense-dp", 2, async_sched)):
        cached = dataclasses.replace(cache, enable_prefix_caching=True)
        case = Case(kind, size, "round-robin", "none", 1, config, cached, 0.0, 0, prefixed, offload=offload)
        stepped, _ = run_case(case, fast_forward=False)
        jumped, jumps = run_case(case, fast_forward=True)
        assert jumps > 0, ("offload", kind, config.async_scheduling)
        assert jumped == stepped, ("offload", kind, config.async_scheduling)
        # The CPU cache was used: chunks are stored.
        assert stepped["kv"][-1][0] if kind == "single" else stepped["kv"][0][-1][0]


def test_the_fuzzer_reaches_timeouts() -> None:
    # Fixed configs of each kind where the client's timeout fails some
    # requests mid-decode and others finish, and the runs still jump: each
    # deadline stops a stretch exactly where stepping takes the abort.
    wl = random_workload(num_prompts=12, input_len=100, output_len=80, range_ratio=0.5, request_rate=50.0,
                         seed=1)
    sched = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=1024)
    cache = CacheConfig(num_gpu_blocks=400, block_size=16)
    for async_scheduling in (False, True):
        config = dataclasses.replace(sched, async_scheduling=async_scheduling)
        for kind, size, timeout in (("single", 1, 0.4), ("dense-dp", 3, 0.4), ("lockstep", 2, 0.5)):
            case = Case(kind, size, "round-robin", "none", 1, config, cache, 0.0, 0,
                        dataclasses.replace(wl, request_timeout=timeout))
            stepped, _ = run_case(case, fast_forward=False)
            jumped, jumps = run_case(case, fast_forward=True)
            assert jumped == stepped, (kind, async_scheduling)
            result = stepped["result"] if kind == "single" else stepped["combined"]
            failed = result["metrics"]["failed"]
            assert jumps > 0 and 0 < failed < 12, (kind, async_scheduling, jumps, failed)
            assert result["metrics"]["failed_reasons"] == {"timeout": failed}


def test_the_fuzzer_reaches_hybrid_fast_forward() -> None:
    # Hybrid KV caches (gpt-oss's full attention beside a 128-token window,
    # Mistral's one window) jump in every kind of run, sync and async, with
    # prefix caching on (a shared prefix) and off, and under preemption.
    wl = random_workload(num_prompts=12, input_len=100, output_len=80, request_rate=50.0, seed=1,
                         prefix_len=40)
    sched = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=1024)
    gpt_oss = (KVCacheGroup("full_attention", 16), KVCacheGroup("sliding_window", 16, sliding_window=128))
    mistral = (KVCacheGroup("sliding_window", 16, sliding_window=64),)
    for groups, blocks, caching in ((gpt_oss, 400, True), (gpt_oss, 90, False), (mistral, 200, True)):
        cache = CacheConfig(num_gpu_blocks=blocks, block_size=16, enable_prefix_caching=caching,
                            kv_groups=groups)
        for async_scheduling in (False, True):
            config = dataclasses.replace(sched, async_scheduling=async_scheduling)
            for kind, size in (("single", 1), ("dense-dp", 2), ("lockstep", 2)):
                case = Case(kind, size, "round-robin", "none", 1, config, cache, 0.0, 0, wl)
                stepped, _ = run_case(case, fast_forward=False)
                jumped, jumps = run_case(case, fast_forward=True)
                assert jumps > 0, (groups, kind, async_scheduling)
                assert jumped == stepped, (groups, kind, async_scheduling)
