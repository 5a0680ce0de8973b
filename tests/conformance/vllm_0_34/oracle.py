"""The vLLM 0.34.0 oracle: replays scheduler scenarios through vLLM 0.34.0's real v1
Scheduler / AsyncScheduler (CPU only, no weights) and writes the per-step trace.
It also runs under the 0.33.0 reference venv (see SUPPORTED_VERSIONS).

    VENV=~/.cache/kvsched-reference/venv-0.34      # built by setup.sh beside this file
    $VENV/bin/python tests/conformance/vllm_0_34/oracle.py SCENARIO.json TRACE.jsonl
    $VENV/bin/python tests/conformance/vllm_0_34/oracle.py DIR --out OUTDIR

A folder replays every DIR/NAME.json into OUTDIR/NAME.vllm.jsonl (one summary line per
scenario on stdout); a scenario that reaches `max_steps` leaves OUTDIR/NAME.vllm.jsonl.stuck
(its partial trace), one on which vLLM fails an assertion OUTDIR/NAME.vllm.jsonl.crash.
Run it with PYTHONHASHSEED=0 (the 0.33 connector corpus's setting: vLLM frees some sets
of requests in hash order).

Scenario and trace formats are those of the shared 0.33 oracle
(../../../../shared/reference/SCENARIO_FORMAT.md), with three additions for 0.34's
new scheduler knobs (docs/vllm_versions.md): `scheduler.max_num_inflight_kv_loads`,
`scheduler.cache_aware_admission_window`, `scheduler.cache_aware_admission_threshold`;
and the top-level `prefill_schedule_interval` the cadence corpus uses. A scenario
without them replays as the 0.33 oracle replays it on 0.33.

Multimodal scenarios (tests/conformance/README.md, "Multimodal"): per request
`mm_items` [{identifier, offset, length, modality, is_embed}] become vLLM's
MultiModalFeatureSpec (data None, as for an item the front end had cached;
mm_position a PlaceholderRange), and the scheduler keys
`max_num_encoder_input_tokens`, `encoder_cache_size`, `disable_chunked_mm_input`
configure the encoder. The tiny model config is text-only, so vLLM's
Scheduler.__init__ gives it a zero encoder budget and a zero-size
EncoderCacheManager. `install_encoder` then does what that constructor does
for a multimodal model, with vLLM's own compute_mm_encoder_budget: the
scenario's two sizes (absent: max_num_batched_tokens, SchedulerConfig's
value) are set on the SchedulerConfig where its __post_init__ would have put
them, the model's largest item per modality is taken to be the scenario's
largest placeholder range of that modality (what MultiModalBudget asks the
processor for), and the resulting budget and a fresh EncoderCacheManager
replace the zero ones. Nothing else of the scheduler reads the model's
modalities. The worker side needs nothing: the fake model samples the
decoder's tokens as before (vLLM's runner encodes scheduled_encoder_inputs
and drops free_encoder_mm_hashes, neither of which reaches the scheduler).
Each trace line of such a scenario adds `encoder_inputs` ([[id, [item
indices]]] in scheduling order), `freed_mm_hashes` (the step's
free_encoder_mm_hashes), `encoder_free_slots` and `encoder_freeable_slots`
(the manager's counters after the step).

Why this is not the shared vllm_replay.py: that driver cannot run on 0.34 (it reads
`CachedRequestData.resumed_req_ids` and passes `ModelRunnerOutput.req_id_to_index`,
both removed in 0.34). Differences forced by 0.34, none of them a scheduling decision:

- vLLM 0.34's CpuPlatform.check_and_update_config refuses an x86 CPU without Triton
  ("vLLM on x86 CPUs requires Triton (triton-cpu)"); triton-cpu is not on PyPI, and the
  PyPI triton wheel reports no active driver without a GPU. The oracle sets
  `vllm.triton_utils.HAS_TRITON = True` before building the config (that check reads it
  lazily; no scheduler, KV cache manager or connector scheduler code reads it).
- 0.34 sends a resumed request in full among `scheduled_new_reqs` (no
  `resumed_req_ids`); the trace's `resumed` is the admitted requests with
  `num_preemptions > 0` (the rule vLLM itself uses to give a promoted async-KV load
  the PREEMPTED status), `new` the others, in scheduler output order.
- `num_waiting` is vLLM's `get_request_counts()` waiting count (0.34 adds the
  `async_kv_waiting` queue to it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))  # oracle_connectors: vLLM's factory imports it by name
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))  # scenario_timeline, shared with the 0.33 drivers
for key, value in (
    ("HF_HUB_OFFLINE", "1"),
    ("TRANSFORMERS_OFFLINE", "1"),
    ("VLLM_NO_USAGE_STATS", "1"),
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("VLLM_CACHE_ROOT", os.path.join(tempfile.gettempdir(), f"kvsched-{Path(sys.prefix).name}-cache")),
):
    os.environ.setdefault(key, value)

import torch  # noqa: E402
import vllm  # noqa: E402
import vllm.triton_utils  # noqa: E402

# See the module docstring: only CpuPlatform's config check reads it from here.
# 0.33 only warns without Triton, so there the flag is left as it is.
if vllm.__version__ != "0.33.0":
    vllm.triton_utils.HAS_TRITON = True

import oracle_connectors as kvc  # noqa: E402
from scenario_timeline import scenario_timeline  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    LoRAConfig,
    ModelConfig,
    ObservabilityConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, compute_mm_encoder_budget  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

# The releases this driver replays: 0.34.0, its own, and 0.33.0, for the
# scenario keys the shared 0.33 driver lacks (hybrid KV cache groups,
# multimodal requests). On 0.33 it reproduces the shared driver's goldens
# byte for byte (tests/conformance/scenarios, random and random_features:
# 792 traces, checked 2026-12-06 with `--out` into a scratch folder and cmp).
# Two things differ on 0.33: it reports a resumed request among the cached
# requests (`resumed_req_ids`), and its model output wants `req_id_to_index`.
SUPPORTED_VERSIONS = ("0.33.0", "0.34.0")
VLLM_VERSION = vllm.__version__
ON_0_33 = VLLM_VERSION == "0.33.0"
TRACE_SUFFIX = ".vllm.jsonl"
MODEL_DIR = (
    Path(os.environ.get("KVSCHED_REFERENCE_DIR", REPO.parent / "shared" / "reference")) / "tiny_model_config"
)
FILLER_TOKEN = 100
FINISH_REASONS = {0: "stop", 1: "length", 2: "abort", 3: "error", 4: "repetition"}
DRAFTLESS_METHODS = ("ngram", "ngram_gpu")
# scheduler.* keys passed to SchedulerConfig as they are (0.34's new knobs included).
SCHEDULER_KEYS = {
    "max_num_inflight_kv_loads": int,
    "cache_aware_admission_window": int,
    "cache_aware_admission_threshold": float,
    "scheduler_reserve_full_isl": bool,
    "disable_chunked_mm_input": bool,
}
# scheduler.* keys of the encoder that SchedulerConfig computes itself
# (init=False fields): install_encoder sets them.
ENCODER_SIZE_KEYS = ("max_num_encoder_input_tokens", "encoder_cache_size")


def check_version() -> None:
    if VLLM_VERSION not in SUPPORTED_VERSIONS:
        raise SystemExit(f"this oracle replays vLLM {' or '.join(SUPPORTED_VERSIONS)}, found {VLLM_VERSION}")


# ---------------------------------------------------------------------------
# Building vLLM's scheduler and requests
# ---------------------------------------------------------------------------


def make_vllm_config(
    scenario: dict, pipeline_parallel_size: int = 1, data_parallel_size: int = 1
) -> VllmConfig:
    sc = scenario.get("scheduler", {})
    cc = scenario.get("cache", {})
    is_async = bool(scenario.get("async_scheduling", False))
    spec = scenario.get("speculative")
    max_model_len = int(sc.get("max_model_len", 8192))
    model_config = ModelConfig(
        model=str(MODEL_DIR),
        dtype="float32",
        seed=0,
        skip_tokenizer_init=True,
        max_model_len=max_model_len,
    )
    sched_kwargs: dict = {
        "max_num_seqs": int(sc.get("max_num_seqs", 128)),
        "max_num_batched_tokens": int(sc.get("max_num_batched_tokens", 8192)),
        "max_model_len": max_model_len,
        "enable_chunked_prefill": bool(sc.get("enable_chunked_prefill", True)),
        "long_prefill_token_threshold": int(sc.get("long_prefill_token_threshold", 0)),
        "is_encoder_decoder": False,
        "policy": sc.get("policy", "fcfs"),
    }
    for key, cast in SCHEDULER_KEYS.items():
        if sc.get(key) is not None:
            sched_kwargs[key] = cast(sc[key])
    if "prefill_schedule_interval" in scenario:
        sched_kwargs["prefill_schedule_interval"] = int(scenario["prefill_schedule_interval"])
    if is_async:
        sched_kwargs["async_scheduling"] = True
    elif spec is not None:
        sched_kwargs["async_scheduling"] = False
    cache_config = CacheConfig(
        block_size=int(cc.get("block_size", 16)),
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=bool(cc.get("enable_prefix_caching", False)),
    )
    parallel_config = ParallelConfig(
        pipeline_parallel_size=pipeline_parallel_size, data_parallel_size=data_parallel_size
    )
    extra: dict = {}
    if spec is not None:
        method = spec.get("method", "ngram_gpu" if is_async else "ngram")
        if method not in DRAFTLESS_METHODS:
            raise ValueError(f"speculative method {method!r}: one of {DRAFTLESS_METHODS}")
        extra["speculative_config"] = SpeculativeConfig(
            method=method,
            num_speculative_tokens=int(spec["num_speculative_tokens"]),
            target_model_config=model_config,
            target_parallel_config=parallel_config,
        )
    if "max_loras" in scenario:
        extra["lora_config"] = LoRAConfig(max_loras=int(scenario["max_loras"]))
    transfer = kvc.kv_transfer_config(scenario)
    if transfer is not None:
        extra["kv_transfer_config"] = transfer
    config = VllmConfig(
        scheduler_config=SchedulerConfig(**sched_kwargs),
        model_config=model_config,
        cache_config=cache_config,
        parallel_config=parallel_config,
        observability_config=ObservabilityConfig(),
        **extra,
    )
    if is_async:
        # CpuPlatform switches async scheduling off after validating the config; on
        # a GPU it stays on (AsyncScheduler, two batches in flight).
        config.scheduler_config.async_scheduling = True
    for key, cast in SCHEDULER_KEYS.items():
        if sc.get(key) is not None:
            assert getattr(config.scheduler_config, key) == cast(sc[key]), key
    return config


def make_scheduler(scenario: dict, pipeline_parallel_size: int = 1, data_parallel_size: int = 1) -> Scheduler:
    config = make_vllm_config(scenario, pipeline_parallel_size, data_parallel_size)
    assert config.parallel_config.data_parallel_size == data_parallel_size
    block_size = config.cache_config.block_size
    assert block_size == int(scenario.get("cache", {}).get("block_size", 16)), block_size
    num_blocks = int(scenario["cache"]["num_gpu_blocks"])
    groups = scenario["cache"].get("kv_groups")
    if groups:
        kv_cache_config = hybrid_kv_cache_config(scenario, config, num_blocks)
        # As EngineCore: the scheduler's granularity and the hash granularity
        # come from vLLM's own resolution over the groups.
        sched_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, config)
        kv_cache_config.hash_block_size = hash_block_size
    else:
        layer_spec = FullAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["layer"], layer_spec)],
        )
        sched_block_size, hash_block_size = block_size, None
    config.cache_config.num_gpu_blocks = num_blocks
    register_all_kvcache_specs(config)
    cls = config.scheduler_config.get_scheduler_cls()
    expected = AsyncScheduler if scenario.get("async_scheduling") else Scheduler
    assert cls is expected, (cls, expected)
    kwargs = {} if hash_block_size is None else {"hash_block_size": hash_block_size}
    return cls(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        block_size=sched_block_size,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(config),
        **kwargs,
    )


def hybrid_kv_cache_config(scenario: dict, config: VllmConfig, num_blocks: int) -> KVCacheConfig:
    """vLLM's KVCacheConfig for `cache.kv_groups`: one KVCacheGroupSpec per group
    (the specs the model's layers would give, with a 1-head, 1-wide float32 page:
    the scheduler never touches tensors), `num_blocks` shared by all, and
    CacheConfig's prefix_cache_retention_interval / mamba_cache_mode resolved as
    the planner and MambaModelConfig resolve them."""
    cc = scenario["cache"]
    caching = bool(cc.get("enable_prefix_caching", False))
    # MambaModelConfig.verify_and_update_config: prefix caching needs "align",
    # none forces "none".
    mode = "align" if caching else "none"
    config.cache_config.mamba_cache_mode = mode
    retention = cc.get("prefix_cache_retention_interval", 0)
    config.cache_config.prefix_cache_retention_interval = retention
    specs = []
    for i, g in enumerate(cc["kv_groups"]):
        bs = int(g.get("block_size", cc.get("block_size", 16)))
        common = {"block_size": bs, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float32}
        kind = g["kind"]
        if kind == "full_attention":
            spec = FullAttentionSpec(**common)
        elif kind == "sliding_window":
            spec = SlidingWindowSpec(**common, sliding_window=int(g["sliding_window"]))
        elif kind == "chunked_local_attention":
            spec = ChunkedLocalAttentionSpec(**common, attention_chunk_size=int(g["attention_chunk_size"]))
        elif kind == "mamba":
            # The layers' prefill checkpoint (MambaMixer2's, FlashInfer GDN's), as given.
            checkpoint = {k: g[k] for k in ("num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment")
                          if k in g}
            spec = MambaSpec(block_size=bs, shapes=((1,),), dtypes=(torch.float32,), mamba_cache_mode=mode,
                             **checkpoint)
        else:
            raise ValueError(f"cache.kv_groups[{i}].kind={kind!r}")
        layers = [f"group{i}.layer{j}" for j in range(int(g.get("num_layers", 1)))]
        specs.append(KVCacheGroupSpec(layers, spec))
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=specs,
        prefix_cache_retention_interval=retention,
    )


def block_hasher(scenario: dict, sched: Scheduler | None = None):
    init_none_hash(sha256)
    # The scheduler's hash granularity (vLLM's resolution with kv_groups).
    if sched is not None:
        return get_request_block_hasher(sched.hash_block_size, sha256)
    size = int(scenario.get("cache", {}).get("block_size", 16))
    return get_request_block_hasher(size, sha256)


def make_request(spec: dict, hasher, scenario: dict) -> Request:
    extra = {}
    params = kvc.request_kv_transfer_params(spec, scenario)
    if params is not None:
        extra["extra_args"] = {"kv_transfer_params": params}
    sampling = SamplingParams(
        max_tokens=int(spec["max_tokens"]),
        min_tokens=int(spec.get("min_tokens", 0)),
        ignore_eos=bool(spec.get("ignore_eos", False)),
        stop_token_ids=list(spec.get("stop_token_ids", [])),
        **extra,
    )
    sampling.update_from_generation_config({}, spec.get("eos_token_id"))
    lora = None
    lora_id = int(spec.get("lora_id") or 0)
    if lora_id:
        if "max_loras" not in scenario:
            raise ValueError(f"request {spec['request_id']}: lora_id without max_loras")
        lora = LoRARequest(lora_name=f"lora{lora_id}", lora_int_id=lora_id, lora_path=f"/fake-lora/{lora_id}")
    mm_features = [
        MultiModalFeatureSpec(
            data=None,
            modality=item.get("modality", "image"),
            identifier=item["identifier"],
            mm_position=PlaceholderRange(
                offset=int(item["offset"]),
                length=int(item["length"]),
                is_embed=None if item.get("is_embed") is None
                else torch.tensor(item["is_embed"], dtype=torch.bool),
            ),
        )
        for item in spec.get("mm_items", ())
    ]
    return Request(
        request_id=spec["request_id"],
        prompt_token_ids=list(spec["prompt_token_ids"]),
        sampling_params=sampling,
        pooling_params=None,
        arrival_time=float(spec.get("arrival_time", spec.get("arrival_step", 0))),
        priority=int(spec.get("priority", 0)),
        block_hasher=hasher,
        lora_request=lora,
        mm_features=mm_features or None,
    )


def mm_max_tokens_per_item(scenario: dict) -> dict[str, int]:
    """The multimodal model a scenario implies: its largest placeholder range
    per modality (empty: text only)."""
    largest: dict[str, int] = {}
    for spec in scenario.get("requests", ()):
        for item in spec.get("mm_items", ()):
            modality = item.get("modality", "image")
            largest[modality] = max(largest.get(modality, 0), int(item["length"]))
    return largest


def install_encoder(sched: Scheduler, scenario: dict) -> bool:
    """Give the scheduler the encoder budget and cache of a multimodal model
    (see the module docstring); False for a text-only scenario."""
    largest = mm_max_tokens_per_item(scenario)
    if not largest:
        return False
    sc = scenario.get("scheduler", {})
    config = sched.scheduler_config
    for key in ENCODER_SIZE_KEYS:
        setattr(config, key, int(sc[key]) if sc.get(key) is not None else config.max_num_batched_tokens)
    budget, cache_size = compute_mm_encoder_budget(config, largest)
    sched.max_num_encoder_input_tokens = budget
    sched.encoder_cache_manager = EncoderCacheManager(cache_size=cache_size)
    return True


# ---------------------------------------------------------------------------
# The scripted model
# ---------------------------------------------------------------------------


def scripted_token(spec: dict, position: int) -> int:
    """The request's token for output position `position` (stop tokens masked below
    min_tokens, as a sampler does)."""
    script = spec.get("sampled_token_ids") or []
    token = script[position] if position < len(script) else FILLER_TOKEN
    if position < int(spec.get("min_tokens", 0)):
        stops = set(spec.get("stop_token_ids", []))
        if spec.get("eos_token_id") is not None and not spec.get("ignore_eos", False):
            stops.add(spec["eos_token_id"])
        if token in stops:
            token = FILLER_TOKEN
    return token


class Executed(list):
    """A batch as the worker saw it: (req id, request, samples?, drafts, admitted?)
    per scheduled request, and the fake worker connector's output for it."""

    kv_output = None


class ScriptedModel:
    def __init__(self, specs: dict[str, dict], kv_worker=None):
        self.specs = specs
        self.kv_worker = kv_worker
        self.verifications: dict[str, int] = {}
        self.proposals: dict[str, int] = {}

    def execute(self, sched: Scheduler, so) -> Executed:
        """What the worker sees when `so` is scheduled (is_prefill_chunk is fixed by
        schedule()); every batch reaches the fake worker connector, empty ones too."""
        admitted = {n.req_id for n in so.scheduled_new_reqs}
        if ON_0_33:
            admitted |= so.scheduled_cached_reqs.resumed_req_ids
        batch = Executed()
        if self.kv_worker is not None:
            batch.kv_output = self.kv_worker.capture(so)
        for rid in so.num_scheduled_tokens:
            req = sched.requests[rid]
            drafts = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            batch.append((rid, req, not req.is_prefill_chunk, drafts, rid in admitted))
        return batch

    def _num_accepted(self, rid: str, drafts: int) -> int:
        n = self.verifications.get(rid, 0)
        self.verifications[rid] = n + 1
        script = self.specs[rid].get("accepted_drafts") or []
        accepted = int(script[n]) if n < len(script) else drafts
        return min(max(accepted, 0), drafts)

    def output(self, batch: Executed) -> ModelRunnerOutput:
        kv_output = batch.kv_output
        if not batch and kv_output is not None and kv_output.is_empty():
            kv_output = None  # an empty step with nothing to report: the empty output
        sampled = []
        for rid, req, samples, drafts, admitted in batch:
            if not samples:
                sampled.append([])
                continue
            # Drafts of the admitting step are padding (-1): never accepted.
            accepted = self._num_accepted(rid, drafts) if drafts and not admitted else 0
            base = req.num_output_tokens
            sampled.append([scripted_token(self.specs[rid], base + i) for i in range(accepted + 1)])
        req_ids = [entry[0] for entry in batch]
        extra = {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}} if ON_0_33 else {}
        return ModelRunnerOutput(
            req_ids=req_ids,
            **extra,
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
            kv_connector_output=kv_output,
        )

    def drafts(self, batch: Executed, k: int) -> DraftTokenIds:
        """The synchronous drafter's proposals after a step (take_draft_token_ids)."""
        ids, proposals = [], []
        for rid, req, samples, _drafts, _admitted in batch:
            ids.append(rid)
            if not samples:
                proposals.append([])
                continue
            n = self.proposals.get(rid, 0)
            self.proposals[rid] = n + 1
            script = self.specs[rid].get("proposed_drafts") or []
            count = min(max(int(script[n]) if n < len(script) else k, 0), k)
            base = req.num_output_tokens
            proposals.append([scripted_token(self.specs[rid], base + i) for i in range(count)])
        return DraftTokenIds(req_ids=ids, draft_token_ids=proposals)


# ---------------------------------------------------------------------------
# Trace
# ---------------------------------------------------------------------------


def admissions(sched: Scheduler, so) -> tuple[list[str], list[str], dict[str, int]]:
    """(new ids in output order, resumed ids sorted, {id: computed tokens at admission})."""
    if ON_0_33:
        cached = so.scheduled_cached_reqs
        computed = {data.req_id: data.num_computed_tokens for data in so.scheduled_new_reqs}
        for i, rid in enumerate(cached.req_ids):
            if rid in cached.resumed_req_ids:
                computed[rid] = cached.num_computed_tokens[i]
        return [data.req_id for data in so.scheduled_new_reqs], sorted(cached.resumed_req_ids), computed
    new, resumed, computed = [], [], {}
    for data in so.scheduled_new_reqs:
        computed[data.req_id] = data.num_computed_tokens
        if sched.requests[data.req_id].num_preemptions > 0:
            resumed.append(data.req_id)
        else:
            new.append(data.req_id)
    # New ids first, then resumed ones, each in admission order: the key order of the
    # 0.33 oracle's lines, so that a trace equal to its 0.33 golden is byte-identical.
    computed = {rid: computed[rid] for rid in new + resumed}
    return new, sorted(resumed), computed


def step_line(
    step, so, admitted, finished, sched, use_spec, use_async, processed, kv_fields=None, use_mm=False,
    groups=False,
) -> dict:
    """`admitted` is admissions(sched, so), taken right after schedule() (a request
    admitted and finished in the same step has left sched.requests by now)."""
    if so is not None:
        new, resumed, computed = admitted
        scheduled = [[rid, n] for rid, n in so.num_scheduled_tokens.items()]
        preempted = sorted(so.preempted_req_ids or ())
        drafts = so.scheduled_spec_decode_tokens
        spec = [[rid, len(drafts[rid])] for rid in so.num_scheduled_tokens if rid in drafts]
    else:
        new, resumed, computed, scheduled, preempted, spec = [], [], {}, [], [], []
    line = {
        "step": step,
        "scheduled": scheduled,
        "new": new,
        "resumed": resumed,
        "preempted": preempted,
        "computed_at_admission": computed,
        "finished": finished,
        "num_free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
        "num_running": len(sched.running),
        "num_waiting": sched.get_request_counts()[1],
    }
    if use_spec:
        line["spec"] = spec
    if use_async:
        line["processed"] = processed
    if kv_fields is not None:
        line.update(kv_fields)
    if groups:
        line["group_blocks"] = group_blocks(sched)
    if use_mm:
        ecm = sched.encoder_cache_manager
        inputs = so.scheduled_encoder_inputs if so else {}
        line["encoder_inputs"] = [[rid, list(ids)] for rid, ids in inputs.items()]
        line["freed_mm_hashes"] = list(so.free_encoder_mm_hashes) if so else []
        line["encoder_free_slots"] = ecm.num_free_slots
        line["encoder_freeable_slots"] = ecm.num_freeable_slots
    return line


def group_blocks(sched: Scheduler) -> dict:
    """Per running request (running order), per KV cache group: [table length,
    real blocks] (the rest are vLLM's null block). Only with cache.kv_groups."""
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    out = {}
    for req in sched.running:
        counts = []
        for manager in managers:
            blocks = manager.req_to_blocks.get(req.request_id) or []
            counts.append([len(blocks), sum(1 for b in blocks if not b.is_null)])
        out[req.request_id] = counts
    return out


def abortable(sched: Scheduler, ids: list[str]) -> list[str]:
    return [rid for rid in ids if rid in sched.requests and not sched.requests[rid].is_finished()]


def finishes(engine_outputs) -> list[list[str]]:
    return [
        [o.request_id, FINISH_REASONS[int(o.finish_reason)]]
        for outs in engine_outputs.values()
        for o in outs.outputs
        if o.finish_reason is not None
    ]


# ---------------------------------------------------------------------------
# The engine loops
# ---------------------------------------------------------------------------


def replay(scenario: dict, out) -> dict:
    """Replay one scenario, writing one trace line per step to `out`."""
    use_async = bool(scenario.get("async_scheduling", False))
    use_spec = scenario.get("speculative") is not None
    kv_type = (scenario.get("kv_connector") or {}).get("type")
    sched = make_scheduler(scenario)
    use_mm = install_encoder(sched, scenario)
    hasher = block_hasher(scenario, sched)
    specs, arrivals, aborts, last_event, max_steps = scenario_timeline(scenario)

    model = ScriptedModel(specs, kvc.make_kv_worker(scenario))
    observer = kvc.KVObserver(sched, kv_type) if kv_type else None
    queue: deque = deque()  # EngineCore.batch_queue
    queue_size = sched.vllm_config.max_concurrent_batches
    if use_async:
        assert queue_size == 2, queue_size

    def engine_busy() -> bool:
        return sched.has_requests() if kv_type else sched.has_unfinished_requests()

    step = preemptions = 0
    seconds = 0.0
    while step <= last_event or engine_busy() or queue:
        if step >= max_steps:
            raise RuntimeError(f"scenario did not finish within {max_steps} steps")
        if observer is not None:
            observer.begin_step()
        for r in arrivals.get(step, ()):
            sched.add_request(make_request(r, hasher, scenario))
        finished: list[list[str]] = []
        ids = abortable(sched, aborts.get(step, []))
        if ids:
            sched.finish_requests(ids, RequestStatus.FINISHED_ABORTED)
            finished += [[rid, "abort"] for rid in ids]

        so = mro = processed = admitted = None
        engine_outputs: dict = {}
        if not use_async:
            # EngineCore.step() then post_step().
            if not kv_type or sched.has_requests():
                t0 = time.perf_counter()
                so = sched.schedule()
                seconds += time.perf_counter() - t0
                admitted = admissions(sched, so)
                batch = model.execute(sched, so)
                mro = model.output(batch)
                t0 = time.perf_counter()
                engine_outputs = sched.update_from_output(so, mro)
                seconds += time.perf_counter() - t0
                if use_spec and so.total_num_scheduled_tokens > 0:
                    proposals = model.drafts(batch, so.num_spec_tokens_to_schedule)
                    t0 = time.perf_counter()
                    sched.update_draft_token_ids(proposals)
                    seconds += time.perf_counter() - t0
        else:
            # EngineCore.step_with_batch_queue(); post_step() does nothing here.
            collect = bool(queue)
            if sched.has_requests():
                t0 = time.perf_counter()
                so = sched.schedule()
                seconds += time.perf_counter() - t0
                admitted = admissions(sched, so)
                assert not so.pending_structured_output_tokens
                executed = so.total_num_scheduled_tokens > 0
                queue.appendleft((step, so, model.execute(sched, so)))
                collect = not (len(queue) < queue_size and (executed or sched.has_requests()))
            if collect:
                processed, old_so, old_batch = queue.pop()
                mro = model.output(old_batch)
                t0 = time.perf_counter()
                engine_outputs = sched.update_from_output(old_so, mro)
                seconds += time.perf_counter() - t0
        finished += finishes(engine_outputs)
        if so is not None:
            preemptions += len(so.preempted_req_ids or ())
        kv_fields = observer.record(so, mro) if observer is not None else None
        line = step_line(
            step, so, admitted, finished, sched, use_spec, use_async, processed, kv_fields, use_mm,
            groups=bool(scenario["cache"].get("kv_groups")),
        )
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        step += 1
    return {
        "engine": f"vllm-{VLLM_VERSION}",
        "steps": step,
        "preemptions": preemptions,
        "scheduler_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    check_version()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", help="a scenario file or a folder of NAME.json")
    ap.add_argument("trace", nargs="?", help="the trace file (single scenario)")
    ap.add_argument(
        "--out",
        help="folder for the traces of a folder (required with a folder, so that "
        "the 0.33 goldens beside the scenarios are never overwritten)",
    )
    ap.add_argument("--suffix", default=TRACE_SUFFIX, help=f"trace name suffix (default {TRACE_SUFFIX})")
    args = ap.parse_args(argv)
    src = Path(args.scenario)
    if src.is_dir():
        if not args.out:
            ap.error("--out is needed with a folder")
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        pairs = [(p, out_dir / (p.stem + args.suffix)) for p in sorted(src.glob("*.json"))]
    elif args.trace:
        pairs = [(src, Path(args.trace))]
    else:
        ap.error("a trace path is needed for a single scenario")
    for scenario_path, trace_path in pairs:
        scenario = json.loads(scenario_path.read_text())
        for stale in (
            trace_path.with_name(trace_path.name + ".stuck"),
            trace_path.with_name(trace_path.name + ".crash"),
        ):
            stale.unlink(missing_ok=True)
        try:
            with open(trace_path, "w") as out:
                summary = replay(scenario, out)
        except RuntimeError as exc:
            # max_steps reached: the partial trace is kept as TRACE.stuck (the 0.33
            # corpus's convention for vLLM livelocks).
            if "did not finish" not in str(exc):
                raise
            trace_path.rename(trace_path.with_name(trace_path.name + ".stuck"))
            summary = {"engine": f"vllm-{VLLM_VERSION}", "stuck": True}
        except AssertionError:
            # vLLM failed one of its own assertions: TRACE.crash holds the error.
            trace_path.unlink()
            trace_path.with_name(trace_path.name + ".crash").write_text(traceback.format_exc())
            summary = {"engine": f"vllm-{VLLM_VERSION}", "crash": True}
        summary["scenario"] = scenario_path.name
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
