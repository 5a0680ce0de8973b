"""A scheduler scenario (../shared/reference/SCENARIO_FORMAT.md) read and
checked against its schema before anything is built from it
(:func:`parse_scenario`): unknown keys (with the closest valid key
suggested), duplicate keys, wrong types, numbers out of their stated ranges
and missing keys are each one ``ValueError`` naming the file, the key's
path, the value and the fix. The ranges only keep absurd values out: each is
far above what a real deployment or test uses and keeps memory and time
proportional to the file.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kvsched.config import (
    KV_GROUP_KINDS,
    MAMBA_CACHE_MODES,
    MAX_BLOCK_SIZE,
    MAX_LORAS,
    MAX_PIPELINE_PARALLEL_SIZE,
    MAX_SCENARIO_GPU_BLOCKS,
    MAX_SPECULATIVE_TOKENS,
    MAX_STEP_LIMIT,
    NGRAM_METHODS,
    CacheConfig,
    KVCacheGroup,
    LoRAConfig,
    SchedulerConfig,
    SpeculativeConfig,
    check_speculative_with_async,
)
from kvsched.core.hybrid_kv_cache import check_hybrid_config
from kvsched.core.kv_connector import (
    KV_ROLES,
    LOAD_FAILURE_POLICIES,
)
from kvsched.core.offloading_manager import EVICTION_POLICIES
from kvsched.core.scripted_connector import (
    SCRIPTED_REQUEST_KEYS,
)
from kvsched.errors import UserInputError
from kvsched.files import read_text
from kvsched.jsonfile import DuplicateKeys, json_problem, strict_loads
from kvsched.request import MultiModalFeature, check_mm_features
from kvsched.vllm_versions import (
    DEFAULT_VLLM_VERSION,
    VERSIONED_SCHEDULER_KNOBS,
    check_vllm_version,
    rules_for,
)

DEFAULT_TOKEN = 100
# The oracle's defaults for keys a scenario leaves out.
_SCHEDULER_DEFAULTS: dict[str, Any] = {
    "max_num_seqs": 128, "max_num_batched_tokens": 8192, "max_model_len": 8192,
    "enable_chunked_prefill": True, "long_prefill_token_threshold": 0, "policy": "fcfs",
    "scheduler_reserve_full_isl": True,
}
DEFAULT_MAX_STEPS = 1_000_000  # the oracle's

# --------------------------------------------------------------------------
# Bounds, with the reason for each.

# The step loop runs every step up to the last arrival or abort (idle steps
# are cheap but each writes a trace line): 10**7 steps is about 1.7 GB of
# trace. Arrivals and aborts must come before max_steps (the oracle would
# fail at max_steps before reaching them).
MAX_STEPS_LIMIT = 10**7
# Token ids, max_tokens, min_tokens, priority: int32, as vLLM's tensors and
# protocol hold them (no vocabulary reaches 2**31).
INT32_LIMIT = 2**31
# arrival_time is in seconds (the priority tie-break): 1e12 s is 31,700
# years; time.time() is 1.8e9.
ARRIVAL_TIME_LIMIT = 1e12
# prefill_schedule_interval (steps) and the DP lockstep corpus' sizes.
INTERVAL_LIMIT = 2**20
DATA_PARALLEL_LIMIT = 1024
# A scenario file is read whole and every token id becomes a Python int
# (about 10x the bytes): 64 MiB holds ~10M token ids and parses into < 1 GB.
FILE_SIZE_LIMIT = 64 * 2**20

# The keys each object may have. Besides the oracle's (SCENARIO_FORMAT.md):
# `description` and `name` (notes, any string), `prefill_schedule_interval`
# (kvsched's cadence corpus, top level or among the scheduler keys), and the
# data-parallel lockstep corpus' `data_parallel_size`, `dp_sync_interval` and
# per-request `rank` (tests/conformance/test_dp_lockstep.py runs those; a
# single-scheduler replay refuses data_parallel_size > 1).
TOP_KEYS = ("scheduler", "cache", "requests", "aborts", "max_steps", "async_scheduling",
            "speculative", "max_loras", "description", "name", "prefill_schedule_interval",
            "data_parallel_size", "dp_sync_interval", "kv_connector", "pipeline_parallel_size")
# The encoder's settings (kvsched.config.SchedulerConfig; the multimodal
# corpus, tests/conformance/README.md).
MM_SCHEDULER_KEYS = ("max_num_encoder_input_tokens", "encoder_cache_size", "disable_chunked_mm_input")
# A request's multimodal items: {"identifier", "offset", "length",
# "modality", "is_embed"} (kvsched.request.MultiModalFeature).
MM_ITEM_KEYS = ("identifier", "offset", "length", "modality", "is_embed")
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                  "enable_chunked_prefill", "long_prefill_token_threshold", "policy",
                  "scheduler_reserve_full_isl", "prefill_schedule_interval",
                  *sorted(VERSIONED_SCHEDULER_KNOBS), *MM_SCHEDULER_KEYS)
CACHE_KEYS = ("block_size", "num_gpu_blocks", "enable_prefix_caching", "kv_groups",
              "hash_block_size", "mamba_cache_mode", "prefix_cache_retention_interval")
# One entry of cache.kv_groups (kvsched.config.KVCacheGroup).
KV_GROUP_KEYS = ("kind", "block_size", "num_layers", "sliding_window", "attention_chunk_size",
                 "num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment")
REQUEST_KEYS = ("request_id", "prompt_token_ids", "max_tokens", "min_tokens", "ignore_eos",
                "eos_token_id", "stop_token_ids", "priority", "arrival_step", "arrival_time",
                "sampled_token_ids", "accepted_drafts", "proposed_drafts", "lora_id", "rank",
                "kv_transfer_params", *SCRIPTED_REQUEST_KEYS, "offload_load_fail", "mm_items")
ABORT_KEYS = ("step", "request_ids")
SPECULATIVE_KEYS = ("num_speculative_tokens", "method")
# kv_connector: the oracle's common keys and each connector type's own.
_KV_COMMON_KEYS = ("type", "kv_role", "load_failure_policy")
KV_CONNECTOR_KEYS: dict[str, tuple[str, ...]] = {
    "scripted": (*_KV_COMMON_KEYS, "pending_block_frees"),
    "nixl": _KV_COMMON_KEYS,
    "offloading": (*_KV_COMMON_KEYS, "num_cpu_blocks", "block_size_factor", "load_steps",
                   "store_steps", "eviction_policy", "store_threshold", "sync_load_budget_tokens",
                   "store_fail"),
    # vLLM's MultiConnector of the types above (tests/conformance/compare_live_multi.py).
    "multi": (*_KV_COMMON_KEYS, "connectors"),
}
# A MultiConnector's children: a NIXL and an offloading connector, in either
# order (the scheduler reads the policy from the MultiConnector's config).
MULTI_CHILD_TYPES = ("nixl", "offloading")
# The oracle's connector types kvsched does not rebuild yet.
KV_CONNECTOR_TYPES_LATER: tuple[str, ...] = ()
# The oracle's methods: no drafter model, so no KV slots of their own.
# The scripted oracle runs n-gram drafts only (kvsched.config owns the names).
SPEC_METHODS = NGRAM_METHODS


@dataclass(slots=True)
class Scenario:
    scheduler_config: SchedulerConfig
    cache_config: CacheConfig
    requests: list[dict[str, Any]]
    aborts: dict[int, list[str]] = field(default_factory=dict)
    max_steps: int = DEFAULT_MAX_STEPS
    # vLLM's prefill_schedule_interval; > 1 installs a PrefillCadence policy.
    prefill_schedule_interval: int = 1
    # Where the scenario came from, for messages (the file's path).
    source: str = "scenario"
    # The DP lockstep corpus' rank count; replay() runs one scheduler.
    data_parallel_size: int = 1
    # The optional features: drafts with scripted acceptance, the LoRA cap.
    # (Async scheduling is scheduler_config.async_scheduling.)
    speculative_config: SpeculativeConfig | None = None
    lora_config: LoRAConfig | None = None
    # The KV connector (the scenario's kv_connector, checked), or None.
    kv_connector: dict[str, Any] | None = None
    # A scenario with mm items replays a multimodal model whose largest item
    # per modality is the scenario's largest (in placeholder tokens); None:
    # a text-only model.
    mm_max_tokens_per_item: dict[str, int] | None = None


@dataclass(slots=True)
class ReplayResult:
    steps: int
    preemptions: int
    scheduler_seconds: float
    # Steps run through schedule(); the rest were idle steps skipped.
    steps_scheduled: int = 0

    def summary(self) -> dict[str, Any]:
        return {"engine": "kvsched", "steps": self.steps, "preemptions": self.preemptions,
                "scheduler_seconds": self.scheduler_seconds}


# --------------------------------------------------------------------------
# Reading and checking a scenario


def _show(value: object, limit: int = 60) -> str:
    """A value as the file has it, shortened for a one-line message."""
    if isinstance(value, (dict, list)):
        try:
            text = json.dumps(value, separators=(",", ":"), default=repr)
        except (RecursionError, ValueError):
            text = "[...]" if isinstance(value, list) else "{...}"
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int) and abs(value) >= 10**24:
        text = f"an integer of {len(str(abs(value)))} digits"
    else:
        text = repr(value)
    text = text.replace("\n", "\\n").replace("\r", "\\r")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction" if math.isfinite(value) else "not a finite number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


class _Checker:
    """Schema checks; every failure is one ValueError naming the source,
    the key's path, the value and the fix."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, value: object, problem: str, fix: str) -> NoReturn:
        raise UserInputError(f"{self.source}: {path}={_show(value)}: {problem}; {fix}")

    def missing(self, path: str, fix: str) -> NoReturn:
        raise UserInputError(f"{self.source}: {path}: missing; {fix}")

    def obj(self, value: object, path: str, keys: Collection[str], what: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, value, f"must be a JSON object ({what}), not {_type_name(value)}",
                      "write it as {\"key\": value, ...}")
        if isinstance(value, DuplicateKeys):
            key, first, second = value.duplicate
            raise UserInputError(f"{self.source}: {_join(path, key)}: the key appears twice in one "
                             f"object (values {_show(first, 30)} and {_show(second, 30)}); keep one")
        for key in value:
            if key not in keys:
                close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}?" if close else "remove it or fix its name?"
                raise UserInputError(f"{self.source}: {_join(path, key)}: unknown key; {hint} "
                                 f"(the keys of {what}: {', '.join(keys)})")
        return value

    def integer(self, obj: Mapping[str, Any], key: str, path: str, lo: int, hi: int,
                why: str = "", default: int | None = None) -> int:
        """obj[key] (or ``default`` when absent), an int in [lo, hi]."""
        where = _join(path, key)
        if key not in obj:
            if default is None:
                self.missing(where, f"give an integer in [{_bound(lo)}, {_bound(hi)}]")
            return default
        value = obj[key]
        if type(value) is not int:
            hint = "write it without quotes" if isinstance(value, str) else "give a whole number"
            self.fail(where, value, f"must be an integer, not {_type_name(value)}", hint)
        if not lo <= value <= hi:
            side = f">= {_bound(lo)}" if value < lo else f"<= {_bound(hi)}{why}"
            self.fail(where, value, f"must be {side}", f"give an integer in [{_bound(lo)}, {_bound(hi)}]")
        return value

    def boolean(self, obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = obj.get(key, default)
        if type(value) is not bool:
            self.fail(_join(path, key), value, f"must be true or false, not {_type_name(value)}",
                      "write true or false (without quotes)")
        return value

    def tokens(self, obj: Mapping[str, Any], key: str, path: str, *, required: bool = False,
               what: str = "token ids") -> list[int]:
        where = _join(path, key)
        if key not in obj:
            if required:
                self.missing(where, f"give the {what} as a list of integers, e.g. [1, 2, 3]")
            return []
        value = obj[key]
        if type(value) is not list:
            self.fail(where, value, f"must be a list of {what}, not {_type_name(value)}",
                      "write it as [1, 2, 3]")
        if value and set(map(type, value)) != {int}:
            i, bad = next((i, t) for i, t in enumerate(value) if type(t) is not int)
            self.fail(f"{where}[{i}]", bad, f"must be an integer, not {_type_name(bad)}",
                      f"{what} are whole numbers in [0, 2**31)")
        if value and (min(value) < 0 or max(value) >= INT32_LIMIT):
            i = next(i for i, t in enumerate(value) if not 0 <= t < INT32_LIMIT)
            self.fail(f"{where}[{i}]", value[i], "is out of range",
                      f"{what} are whole numbers in [0, 2**31)")
        return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _bound(n: int) -> str:
    """n, as a power of two or ten when it is one (or one less than 2**k)."""
    m = abs(n)
    for e in range(10, 64):
        if m == 2**e:
            return f"{'-' if n < 0 else ''}2**{e}"
        if m == 2**e - 1 and n > 0:
            return f"2**{e} - 1"
    for e in range(6, 30):
        if m == 10**e:
            return f"{'-' if n < 0 else ''}10**{e}"
    return str(n)


def parse_scenario(obj: Any, source: str = "scenario",
                   vllm_version: str = DEFAULT_VLLM_VERSION) -> Scenario:
    """Check a scenario object against the schema and build its configs;
    ``source`` (the file) starts every error message. ``vllm_version``: the
    release whose scheduler replays it (the scenario format has no key for
    it: one scenario is replayed by every release's oracle)."""
    check_vllm_version(vllm_version)
    c = _Checker(source)
    top = c.obj(obj, "", TOP_KEYS, "a scenario") if isinstance(obj, dict) else None
    if top is None:
        raise UserInputError(f"{source}: the scenario must be a JSON object with scheduler, cache and "
                         f"requests, not {_type_name(obj)}")
    for key in ("description", "name"):
        if key in top and not isinstance(top[key], str):
            c.fail(key, top[key], f"must be a string, not {_type_name(top[key])}",
                   "write the note in quotes")
    max_steps = c.integer(top, "max_steps", "", 1, MAX_STEPS_LIMIT,
                          " (the replay runs every step up to the last arrival or abort)",
                          DEFAULT_MAX_STEPS)
    use_async, speculative, lora = _check_features(c, top, vllm_version)
    kv_connector = _check_kv_connector(c, top)
    # vLLM's ParallelConfig.pipeline_parallel_size (tests/conformance/pp_oracle.py).
    pp = c.integer(top, "pipeline_parallel_size", "", 1, MAX_PIPELINE_PARALLEL_SIZE, "", 1)
    if pp > 1 and (speculative is not None or kv_connector is not None):
        c.fail("pipeline_parallel_size", pp, "kvsched replays pipeline parallelism without "
               "speculative decoding or a KV connector", "drop one of them")

    sc = c.obj(top.get("scheduler", {}), "scheduler", SCHEDULER_KEYS, "the scheduler's settings")
    if "cache" not in top:
        c.missing("cache", "give {\"num_gpu_blocks\": N, ...} (N counts vLLM's null block)")
    cc = c.obj(top["cache"], "cache", CACHE_KEYS, "the KV cache's settings")
    d = _SCHEDULER_DEFAULTS
    why_tokens = " (no model's context is that long)"
    max_model_len = c.integer(sc, "max_model_len", "scheduler", 1, MAX_STEP_LIMIT, why_tokens,
                              d["max_model_len"])
    budget = c.integer(sc, "max_num_batched_tokens", "scheduler", 1, MAX_STEP_LIMIT, why_tokens,
                       d["max_num_batched_tokens"])
    seqs = c.integer(sc, "max_num_seqs", "scheduler", 1, MAX_STEP_LIMIT, "",
                     d["max_num_seqs"])
    threshold = c.integer(sc, "long_prefill_token_threshold", "scheduler", 0,
                          MAX_STEP_LIMIT, why_tokens, d["long_prefill_token_threshold"])
    policy = sc.get("policy", d["policy"])
    if policy not in ("fcfs", "priority"):
        c.fail("scheduler.policy", policy, "unknown scheduling policy", "use \"fcfs\" or \"priority\"")
    chunked = c.boolean(sc, "enable_chunked_prefill", "scheduler", d["enable_chunked_prefill"])
    reserve = c.boolean(sc, "scheduler_reserve_full_isl", "scheduler", d["scheduler_reserve_full_isl"])
    # vLLM 0.34's knobs (the 0.34 oracle's keys; null: unset), checked by
    # SchedulerConfig, which also refuses them on a release without them.
    knobs = {key: sc[key] for key in VERSIONED_SCHEDULER_KNOBS if sc.get(key) is not None}
    for key in ("max_num_encoder_input_tokens", "encoder_cache_size"):
        if sc.get(key) is not None:
            knobs[key] = c.integer(sc, key, "scheduler", 1, MAX_STEP_LIMIT, why_tokens)
    knobs["disable_chunked_mm_input"] = c.boolean(sc, "disable_chunked_mm_input", "scheduler", False)
    try:
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=seqs, max_model_len=max_model_len,
            enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
            policy=policy, scheduler_reserve_full_isl=reserve, async_scheduling=use_async,
            pipeline_parallel_size=pp, vllm_version=vllm_version, **knobs)
    except (ValueError, TypeError) as e:
        raise UserInputError(f"{source}: scheduler.{e}") from None

    if "num_gpu_blocks" not in cc:
        c.missing("cache.num_gpu_blocks", "give the total block count (including vLLM's null block)")
    num_blocks = c.integer(cc, "num_gpu_blocks", "cache", 2, MAX_SCENARIO_GPU_BLOCKS,
                           " (each block is an object in memory; a GPU holds far fewer; "
                           "block 0 is vLLM's null block, so at least 2)")
    block_size = c.integer(cc, "block_size", "cache", 1, MAX_BLOCK_SIZE,
                           " (vLLM's blocks hold a few hundred tokens at most)", 16)
    prefix = c.boolean(cc, "enable_prefix_caching", "cache", False)
    hybrid = _check_kv_groups(c, cc, block_size)
    try:
        cache_config = CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size,
                                   enable_prefix_caching=prefix, **hybrid)
        check_hybrid_config(cache_config)
    except (ValueError, TypeError) as e:
        raise UserInputError(f"{source}: cache.{e}") from None

    # Top level (the cadence corpus) or among the scheduler keys, not both.
    if "prefill_schedule_interval" in top and "prefill_schedule_interval" in sc:
        c.fail("prefill_schedule_interval", top["prefill_schedule_interval"],
               "given both at the top level and in scheduler", "keep one of the two")
    where, holder = ("", top) if "prefill_schedule_interval" in top else ("scheduler", sc)
    interval = c.integer(holder, "prefill_schedule_interval", where, 1, INTERVAL_LIMIT, "", 1)
    dp = c.integer(top, "data_parallel_size", "", 1, DATA_PARALLEL_LIMIT, "", 1)
    c.integer(top, "dp_sync_interval", "", 1, INTERVAL_LIMIT, "", 1)

    if "requests" not in top:
        c.missing("requests", "give the list of requests (it may be empty: [])")
    requests = top["requests"]
    if type(requests) is not list:
        c.fail("requests", requests, f"must be a list of request objects, not {_type_name(requests)}",
               "write it as [{\"request_id\": ..., \"prompt_token_ids\": [...], \"max_tokens\": N}, ...]")
    seen: set[str] = set()
    for i, r in enumerate(requests):
        rid = _check_request(c, r, f"requests[{i}]", max_steps, max_model_len, dp, lora is not None)
        _check_kv_request(c, r, f"requests[{i}]", _request_keys_kind(kv_connector))
        if rid in seen:
            c.fail(f"requests[{i}].request_id", rid, "duplicate id", "request ids must be unique")
        seen.add(rid)
    _check_offload_failures(c, kv_connector, requests, vllm_version)
    mm_max = _check_mm_items(c, requests)
    if mm_max is not None and pp > 1:
        # The PP oracle (engine_oracle.py) installs no encoder: unchecked.
        c.fail("pipeline_parallel_size", pp, "kvsched replays multimodal requests (mm_items) without "
               "pipeline parallelism only (not checked against vLLM with it)",
               "drop pipeline_parallel_size or the mm_items")

    aborts: dict[int, list[str]] = {}
    raw_aborts = top.get("aborts", [])
    if type(raw_aborts) is not list:
        c.fail("aborts", raw_aborts, f"must be a list, not {_type_name(raw_aborts)}",
               "write it as [{\"step\": k, \"request_ids\": [...]}, ...]")
    for i, a in enumerate(raw_aborts):
        where = f"aborts[{i}]"
        a = c.obj(a, where, ABORT_KEYS, "an abort")
        step = c.integer(a, "step", where, 0, max_steps - 1,
                         f" (below max_steps={max_steps}: the replay stops there)")
        if "request_ids" not in a:
            c.missing(f"{where}.request_ids", "give the ids to abort as a list of strings")
        ids = a["request_ids"]
        if type(ids) is not list:
            c.fail(f"{where}.request_ids", ids, f"must be a list of request ids, not {_type_name(ids)}",
                   "write it as [\"a\", \"b\"]")
        for j, x in enumerate(ids):
            if not isinstance(x, str):
                c.fail(f"{where}.request_ids[{j}]", x, f"is not a string request id but {_type_name(x)}",
                       "request ids are strings")
        aborts.setdefault(step, []).extend(ids)
    return Scenario(scheduler_config, cache_config, requests, aborts, max_steps, interval, source, dp,
                    speculative, lora, kv_connector, mm_max)


def _check_mm_items(c: _Checker, requests: list[Any]) -> dict[str, int] | None:
    """The requests' ``mm_items`` (each a MultiModalFeature: in prompt
    order, disjoint, inside the prompt; one identifier, one size), and the
    model they imply: each modality's largest item (None: no request has
    any, a text-only model)."""
    largest: dict[str, int] = {}
    sizes: dict[str, tuple[int, str]] = {}
    for i, r in enumerate(requests):
        if "mm_items" not in r:
            continue
        where = f"requests[{i}].mm_items"
        items = r["mm_items"]
        if type(items) is not list:
            c.fail(where, items, f"must be a list of items, not {_type_name(items)}",
                   'write it as [{"identifier": "img-a", "offset": 4, "length": 64}]')
        features = []
        for j, raw in enumerate(items):
            at = f"{where}[{j}]"
            item = c.obj(raw, at, MM_ITEM_KEYS, "a multimodal item")
            if "identifier" not in item:
                c.missing(f"{at}.identifier", "give the item's mm hash, a string")
            c.integer(item, "offset", at, 0, MAX_STEP_LIMIT)
            c.integer(item, "length", at, 1, MAX_STEP_LIMIT)
            mask = item.get("is_embed")
            if mask is not None and (type(mask) is not list or any(type(v) is not bool for v in mask)):
                c.fail(f"{at}.is_embed", mask, "must be a list of true/false (one per placeholder "
                       "position) or null", "write it as [false, true, true, ...]")
            try:
                feature = MultiModalFeature(item["identifier"], item["offset"], item["length"],
                                            item.get("modality", "image"), mask)
            except UserInputError as e:
                raise UserInputError(f"{c.source}: {at}: {e}") from None
            known = sizes.setdefault(feature.identifier, (feature.num_embeds, at))
            if known[0] != feature.num_embeds:
                c.fail(f"{at}.identifier", feature.identifier,
                       f"{known[1]} gives this identifier {known[0]} embeddings, this item "
                       f"{feature.num_embeds}", "an identifier names one item's content: give each "
                       "content its own identifier")
            largest[feature.modality] = max(largest.get(feature.modality, 0), feature.length)
            features.append(feature)
        try:
            check_mm_features(r["request_id"], features, len(r["prompt_token_ids"]))
        except (UserInputError, TypeError) as e:
            raise UserInputError(f"{c.source}: {where}: {e}") from None
    return largest or None


def _check_kv_groups(c: _Checker, cc: Mapping[str, Any], block_size: int) -> dict[str, Any]:
    """The hybrid KV cache keys (tests/conformance/README.md): CacheConfig's
    keyword arguments for those present. Absent: vLLM's single
    full-attention group of ``block_size``."""
    out: dict[str, Any] = {}
    if "hash_block_size" in cc:
        out["hash_block_size"] = c.integer(cc, "hash_block_size", "cache", 1, MAX_BLOCK_SIZE)
    if "mamba_cache_mode" in cc:
        mode = cc["mamba_cache_mode"]
        if mode not in MAMBA_CACHE_MODES:
            c.fail("cache.mamba_cache_mode", mode, "unknown Mamba cache mode",
                   f"use one of {', '.join(map(repr, MAMBA_CACHE_MODES))}")
        out["mamba_cache_mode"] = mode
    if "prefix_cache_retention_interval" in cc:
        value = cc["prefix_cache_retention_interval"]
        out["prefix_cache_retention_interval"] = None if value is None else c.integer(
            cc, "prefix_cache_retention_interval", "cache", 0, MAX_STEP_LIMIT)
    if "kv_groups" not in cc:
        return out
    raw = cc["kv_groups"]
    if type(raw) is not list or not raw:
        c.fail("cache.kv_groups", raw, "must be a non-empty list of groups",
               "write it as [{\"kind\": \"full_attention\", \"block_size\": 16}, ...] or drop it")
    groups = []
    for i, g in enumerate(raw):
        where = f"cache.kv_groups[{i}]"
        g = c.obj(g, where, KV_GROUP_KEYS, "a KV cache group")
        if "kind" not in g:
            c.missing(f"{where}.kind", f"give one of {', '.join(KV_GROUP_KINDS)}")
        kind = g["kind"]
        if kind not in KV_GROUP_KINDS:
            c.fail(f"{where}.kind", kind, "unknown KV cache group kind",
                   f"use one of {', '.join(KV_GROUP_KINDS)}")
        size = c.integer(g, "block_size", where, 1, MAX_BLOCK_SIZE, "", block_size)
        layers = c.integer(g, "num_layers", where, 1, MAX_STEP_LIMIT, "", 1)
        extra: dict[str, int] = {}
        for key in ("sliding_window", "attention_chunk_size"):
            if key in g:
                extra[key] = c.integer(g, key, where, 1, MAX_STEP_LIMIT)
        # A Mamba group's prefill checkpoint (KVCacheGroup checks the kind).
        if "num_prefill_checkpoint_blocks" in g:
            extra["num_prefill_checkpoint_blocks"] = c.integer(g, "num_prefill_checkpoint_blocks", where,
                                                               0, MAX_STEP_LIMIT)
        if g.get("prefill_checkpoint_alignment") is not None:
            extra["prefill_checkpoint_alignment"] = c.integer(g, "prefill_checkpoint_alignment", where,
                                                              1, MAX_BLOCK_SIZE)
        try:
            groups.append(KVCacheGroup(kind, size, layers, **extra))
        except (ValueError, TypeError) as e:
            c.fail(where, g, str(e), "fix the group")
    out["kv_groups"] = tuple(groups)
    return out


def _check_kv_connector(c: _Checker, top: Mapping[str, Any]) -> dict[str, Any] | None:
    """The oracle's ``kv_connector`` (SCENARIO_FORMAT.md, "KV connectors");
    kvsched has the scripted connector, NixlConnector and OffloadingConnector."""
    if "kv_connector" not in top:
        return None
    raw = top["kv_connector"]
    # The type first: the other types' keys are unknown to the scripted one.
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind in KV_CONNECTOR_TYPES_LATER:
        c.fail("kv_connector.type", kind, "kvsched does not rebuild this connector yet",
               f"use one of {', '.join(KV_CONNECTOR_KEYS)}")
    if kind not in KV_CONNECTOR_KEYS:
        c.fail("kv_connector.type", kind, "unknown connector type",
               f"use one of {', '.join(KV_CONNECTOR_KEYS)}")
    kvc = c.obj(raw, "kv_connector", KV_CONNECTOR_KEYS[kind], "a KV connector")
    role = kvc.get("kv_role", "kv_both")
    if role not in KV_ROLES:
        c.fail("kv_connector.kv_role", role, "unknown role", f"use one of {', '.join(KV_ROLES)}")
    policy = kvc.get("load_failure_policy", "fail")
    if policy not in LOAD_FAILURE_POLICIES:
        c.fail("kv_connector.load_failure_policy", policy, "unknown policy",
               f"use one of {', '.join(LOAD_FAILURE_POLICIES)}")
    c.boolean(kvc, "pending_block_frees", "kv_connector", False)
    if kind == "offloading":
        _check_offloading(c, kvc)
    if kind == "multi":
        _check_multi(c, kvc)
    return kvc


def _check_multi(c: _Checker, kvc: Mapping[str, Any]) -> None:
    """A MultiConnector's ``connectors``: one to two children of distinct
    MULTI_CHILD_TYPES, each with its own ``kv_role``."""
    where = "kv_connector.connectors"
    children = kvc.get("connectors")
    if type(children) is not list or not 1 <= len(children) <= len(MULTI_CHILD_TYPES):
        c.fail(where, children, f"must be a list of 1 to {len(MULTI_CHILD_TYPES)} connectors",
               'give [{"type": "nixl"}, {"type": "offloading", "num_cpu_blocks": 8}]')
    seen: set[str] = set()
    for i, child in enumerate(children):
        kind = child.get("type") if isinstance(child, dict) else None
        if kind not in MULTI_CHILD_TYPES or kind in seen:
            c.fail(f"{where}[{i}].type", kind, "unknown or repeated child type",
                   f"use each of {', '.join(MULTI_CHILD_TYPES)} at most once")
        seen.add(kind)
        keys = [k for k in KV_CONNECTOR_KEYS[kind] if k != "load_failure_policy"]
        obj = c.obj(child, f"{where}[{i}]", keys, "a child connector")
        role = obj.get("kv_role", "kv_both")
        if role not in KV_ROLES:
            c.fail(f"{where}[{i}].kv_role", role, "unknown role", f"use one of {', '.join(KV_ROLES)}")
        if kind == "offloading":
            _check_offloading(c, obj, f"{where}[{i}]")


def _multi_child(kvc: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """A MultiConnector scenario's child of ``kind`` (None: it has none)."""
    return next((ch for ch in kvc.get("connectors", ()) if ch["type"] == kind), None)


def _request_keys_kind(kvc: Mapping[str, Any] | None) -> str | None:
    """Whose per-request keys a scenario's requests carry: a MultiConnector's
    are its NIXL child's (which also takes the offloading child's
    ``kv_transfer_params``), else its offloading child's."""
    if kvc is None:
        return None
    if kvc["type"] != "multi":
        return str(kvc["type"])
    return "nixl" if _multi_child(kvc, "nixl") is not None else "offloading"


def _check_offloading(c: _Checker, kvc: Mapping[str, Any], where: str = "kv_connector") -> None:
    """The offloading connector's keys (SCENARIO_FORMAT.md, "`offloading`")."""
    c.integer(kvc, "num_cpu_blocks", where, 1, INT32_LIMIT - 1, " (CPU chunks; vLLM refuses 0)")
    for key in ("block_size_factor", "load_steps", "store_steps"):
        c.integer(kvc, key, where, 1, INT32_LIMIT - 1, "", 1)
    for key in ("store_threshold", "sync_load_budget_tokens"):
        c.integer(kvc, key, where, 0, INT32_LIMIT - 1, "", 0)
    policy = kvc.get("eviction_policy", "lru")
    if policy not in EVICTION_POLICIES:
        c.fail(f"{where}.eviction_policy", policy, "unknown policy",
               f"use one of {', '.join(EVICTION_POLICIES)}")


def offloading_of(kvc: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A checked ``kv_connector``'s offloading connector: itself, or a
    MultiConnector's offloading child (None: neither)."""
    if kvc is None:
        return None
    if kvc["type"] == "offloading":
        return kvc
    return _multi_child(kvc, "offloading") if kvc["type"] == "multi" else None


def _check_offload_failures(c: _Checker, kvc: Mapping[str, Any] | None, requests: list[Any],
                            vllm_version: str) -> None:
    """The offloading worker's scripted failures (vLLM 0.34's failed jobs):
    the connector's ``store_fail`` (store job ids) and the requests'
    ``offload_load_fail`` (true, or one entry per asynchronous load)."""
    offload = offloading_of(kvc)
    where = "kv_connector"
    if kvc is not None and offload is not None and offload is not kvc:
        where += f".connectors[{[ch['type'] for ch in kvc['connectors']].index('offloading')}]"
    used: list[tuple[str, object]] = []
    if offload is not None and "store_fail" in offload:
        ids = offload["store_fail"]
        if type(ids) is not list or any(type(j) is not int or not 0 <= j < INT32_LIMIT for j in ids):
            c.fail(f"{where}.store_fail", ids, "must be a list of job ids (integers >= 0)",
                   "give the ids of the store jobs that fail, e.g. [0, 3] (the trace's offload.store)")
        used.append((f"{where}.store_fail", ids))
    for i, r in enumerate(requests):
        if "offload_load_fail" not in r:
            continue
        path = f"requests[{i}].offload_load_fail"
        value = r["offload_load_fail"]
        if offload is None:
            c.fail(path, value, "needs the offloading connector (alone or in a MultiConnector)",
                   "remove the key, or add \"kv_connector\": {\"type\": \"offloading\", ...}")
        if type(value) is not bool and (type(value) is not list
                                        or any(type(v) is not bool for v in value)):
            c.fail(path, value, "must be true or false, or a list of them (one per asynchronous load)",
                   "give true for a failed load")
        used.append((path, value))
    if used and not rules_for(vllm_version).offload_transfer_failures:
        path, value = used[0]
        c.fail(path, value, f"vLLM {vllm_version}'s offloading worker asserts that every transfer "
               "succeeds (failed jobs are vLLM 0.34's)",
               "replay the scenario as vLLM 0.34, or remove the key")


def _check_kv_request(c: _Checker, r: Mapping[str, Any], where: str, kind: str | None) -> None:
    """The connector's per-request keys (SCENARIO_FORMAT.md): the scripted
    connector's take a value, or a list with one entry per load; NIXL's
    worker reads ``load_steps``, ``load_fail`` and ``send_steps`` (single
    values) and the connector the ``kv_transfer_params``."""
    keys = [k for k in (*SCRIPTED_REQUEST_KEYS, "kv_transfer_params") if k in r]
    if keys and kind is None:
        c.fail(_join(where, keys[0]), r[keys[0]], "needs a KV connector: the scenario sets no "
               "kv_connector", "add \"kv_connector\": {\"type\": \"scripted\"} or remove the key")
    if kind == "nixl":
        _check_nixl_request(c, r, where)
        return
    if kind == "offloading":
        if keys and keys[0] != "kv_transfer_params":
            c.fail(_join(where, keys[0]), r[keys[0]], "is the scripted connector's; the offloading "
                   "connector's loads and stores are vLLM's decisions", "remove the key")
        params = r.get("kv_transfer_params")
        if params is not None and not isinstance(params, dict):
            c.fail(_join(where, "kv_transfer_params"), params,
                   f"must be an object, not {_type_name(params)}", "give {\"max_load_tokens\": 64}")
        return
    if "kv_transfer_params" in r:
        c.fail(_join(where, "kv_transfer_params"), r["kv_transfer_params"],
               "only the nixl and offloading connectors read it",
               "remove the key, or use \"kv_connector\": {\"type\": \"nixl\"}")

    def each(key: str, ok: Callable[[Any], bool], what: str) -> None:
        if key not in r:
            return
        value = r[key]
        for i, v in enumerate(value if isinstance(value, list) else [value]):
            if not ok(v):
                path = _join(where, key) + (f"[{i}]" if isinstance(value, list) else "")
                c.fail(path, v, f"must be {what}", f"give {what}, or a list of them (one per load)")

    def count(lo: int) -> Callable[[Any], bool]:
        return lambda v: type(v) is int and lo <= v < INT32_LIMIT

    each("external_hit_tokens", count(0), "an integer >= 0")
    each("load_async", lambda v: type(v) is bool, "true or false")
    each("load_steps", count(1), "an integer >= 1 (batches)")
    each("load_fail", lambda v: v is None or v == "request" or count(0)(v),
         "\"request\", a block index >= 0 or null")
    if "send_steps" in r and r["send_steps"] is not None:
        c.integer(r, "send_steps", where, 1, INT32_LIMIT - 1, "")


def _check_nixl_request(c: _Checker, r: Mapping[str, Any], where: str) -> None:
    for key in ("external_hit_tokens", "load_async"):
        if key in r:
            c.fail(_join(where, key), r[key], "is the scripted connector's; NixlConnector reads the "
                   "whole prompt asynchronously", "remove the key")
    for key in ("load_steps", "send_steps"):
        if r.get(key) is not None:
            c.integer(r, key, where, 1, INT32_LIMIT - 1, " (batches; NIXL reads a request once)")
    fail = r.get("load_fail")
    if fail is not None and type(fail) is not bool:
        c.fail(_join(where, "load_fail"), fail, "must be true or false (NIXL reads a request once)",
               "give true for a failed read")
    params = r.get("kv_transfer_params")
    if params is not None and not isinstance(params, dict):
        c.fail(_join(where, "kv_transfer_params"), params, f"must be an object, not {_type_name(params)}",
               "give {\"do_remote_prefill\": true} (decode side) or {\"do_remote_decode\": true} "
               "(prefill side)")


def _check_features(c: _Checker, top: Mapping[str, Any], vllm_version: str
                    ) -> tuple[bool, SpeculativeConfig | None, LoRAConfig | None]:
    """The oracle's optional features (SCENARIO_FORMAT.md): async
    scheduling, speculative decoding with an n-gram method (``ngram`` with
    async scheduling only where ``vllm_version`` runs it), the LoRA cap."""
    use_async = c.boolean(top, "async_scheduling", "", False)
    speculative = None
    spec = top.get("speculative")
    if spec is not None:
        spec = c.obj(spec, "speculative", SPECULATIVE_KEYS, "speculative decoding's settings")
        k = c.integer(spec, "num_speculative_tokens", "speculative", 1, MAX_SPECULATIVE_TOKENS)
        method = spec.get("method", "ngram_gpu" if use_async else "ngram")
        if method not in SPEC_METHODS:
            c.fail("speculative.method", method, "unknown method (the oracle scripts drafts without "
                   "a drafter model)", "use \"ngram\" or \"ngram_gpu\"")
        speculative = SpeculativeConfig(method=method, num_speculative_tokens=k)
        try:
            check_speculative_with_async(speculative, use_async, vllm_version)
        except ValueError as e:
            raise UserInputError(f"{c.source}: {e}") from None
    lora = None
    if "max_loras" in top:
        lora = LoRAConfig(max_loras=c.integer(top, "max_loras", "", 1, MAX_LORAS))
    return use_async, speculative, lora


def _check_request(c: _Checker, value: object, where: str, max_steps: int, max_model_len: int,
                   dp: int, lora_enabled: bool) -> str:
    r = c.obj(value, where, REQUEST_KEYS, "a request")
    if "request_id" not in r:
        c.missing(f"{where}.request_id", "give each request a unique string id")
    rid = r["request_id"]
    if not isinstance(rid, str) or not rid:
        c.fail(f"{where}.request_id", rid, "must be a non-empty string", "give a unique name in quotes")
    prompt = c.tokens(r, "prompt_token_ids", where, required=True, what="prompt token ids")
    if not prompt:
        c.fail(f"{where}.prompt_token_ids", prompt, "is empty", "give at least one token id")
    if len(prompt) >= max_model_len:
        c.fail(f"{where}.prompt_token_ids", f"{len(prompt)} tokens",
               f"the prompt must be shorter than scheduler.max_model_len={max_model_len}",
               "shorten the prompt or raise max_model_len")
    c.tokens(r, "sampled_token_ids", where, what="scripted output token ids")
    c.tokens(r, "stop_token_ids", where, what="stop token ids")
    if "max_tokens" not in r:
        c.missing(f"{where}.max_tokens", "give the request's output length limit (an integer >= 1)")
    why = " (int32, as vLLM holds it)"
    max_tokens = c.integer(r, "max_tokens", where, 1, INT32_LIMIT - 1, why)
    min_tokens = c.integer(r, "min_tokens", where, 0, INT32_LIMIT - 1, why, 0)
    if min_tokens > max_tokens:
        c.fail(f"{where}.min_tokens", min_tokens, f"exceeds max_tokens={max_tokens} (vLLM refuses it)",
               "lower min_tokens or raise max_tokens")
    c.integer(r, "priority", where, -INT32_LIMIT, INT32_LIMIT - 1, why, 0)
    step = c.integer(r, "arrival_step", where, 0, max_steps - 1,
                     f" (below max_steps={max_steps}: the replay stops there)", 0)
    c.boolean(r, "ignore_eos", where, False)
    eos = r.get("eos_token_id")
    if eos is not None and (type(eos) is not int or not 0 <= eos < INT32_LIMIT):
        c.fail(f"{where}.eos_token_id", eos, "must be a token id (an integer in [0, 2**31)) or null",
               "give the id without quotes, or null for no EOS")
    if "arrival_time" in r:
        at = r["arrival_time"]
        if type(at) not in (int, float) or (type(at) is float and not math.isfinite(at)):
            c.fail(f"{where}.arrival_time", at, f"must be a number of seconds, not {_type_name(at)}",
                   f"give a number (it defaults to arrival_step={step})")
        if not 0 <= at <= ARRIVAL_TIME_LIMIT:
            c.fail(f"{where}.arrival_time", at, "is out of range (seconds, the priority tie-break)",
                   f"give a number in [0, {ARRIVAL_TIME_LIMIT:g}]")
    c.integer(r, "rank", where, 0, dp - 1, f" (below data_parallel_size={dp})", 0)
    for key in ("accepted_drafts", "proposed_drafts"):
        # Counts per verification / proposal; each is clamped to [0, drafts].
        c.tokens(r, key, where, what="draft counts")
    lora = r.get("lora_id")
    if lora is not None:
        lora = c.integer(r, "lora_id", where, 0, INT32_LIMIT - 1)
        if lora and not lora_enabled:
            c.fail(f"{where}.lora_id", lora, "needs LoRA: the scenario sets no max_loras",
                   "add \"max_loras\": N at the top level, or set lora_id to 0")
    return rid


def load_scenario(path: str, vllm_version: str = DEFAULT_VLLM_VERSION) -> Scenario:
    """Read and check a scenario file; every problem is one ValueError naming
    the file (the key's path within it, the value and the fix)."""
    text = read_text(path, FILE_SIZE_LIMIT, "a scenario (JSON)",
                     fix="a scenario this big is not a test: split it")
    try:
        # A repeated key is refused by the checker, which knows the object's path.
        data = strict_loads(text, constants=False, mark_duplicates_for_caller=True)
    except ValueError as e:
        raise UserInputError(f"{path}: {json_problem(e)}; save the scenario as one JSON object") from None
    return parse_scenario(data, path, vllm_version)


