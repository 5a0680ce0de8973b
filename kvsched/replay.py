"""Replay a scheduler scenario with a scripted fake model, step by step, exactly
as ../shared/reference/SCENARIO_FORMAT.md says, and write the step trace.

The same scenario through vLLM's oracle (vllm_replay.py) must give the same trace.

A scenario file is checked against a schema before anything is built from it
(:func:`parse_scenario`): unknown keys (with the closest valid key suggested),
duplicate keys, wrong types, numbers out of their stated ranges and missing
keys are each one ``ValueError`` naming the file, the key's path, the value and
the fix. The ranges (``LIMITS``) only keep absurd values out: each is far above
what a real deployment or test uses and keeps memory and time proportional to
the file.
"""

from __future__ import annotations

import bisect
import difflib
import json
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TextIO

from kvsched.config import (
    MAX_PIPELINE_PARALLEL_SIZE,
    MAX_SPECULATIVE_TOKENS,
    MAX_STEP_LIMIT,
    NGRAM_METHODS,
    CacheConfig,
    LoRAConfig,
    SchedulerConfig,
    SpeculativeConfig,
    batch_queue_size,
    check_speculative_with_async,
)
from kvsched.core.kv_connector import (
    KV_ROLES,
    LOAD_FAILURE_POLICIES,
    KVConnectorBase,
    KVConnectorOutput,
    KVTransferConfig,
)
from kvsched.core.multi_connector import MultiConnector, MultiKVConnectorWorkerMetadata, MultiScriptedWorker
from kvsched.core.nixl_connector import (
    NIXL_REQUEST_KEYS,
    NixlConnector,
    NixlScriptedWorker,
    replay_kv_transfer_params,
)
from kvsched.core.offloading_connector import OffloadingConnector, OffloadingWorker
from kvsched.core.offloading_manager import EVICTION_POLICIES
from kvsched.core.output import (
    CachedRequestData,
    DraftTokenIds,
    EngineCoreOutputs,
    ModelRunnerOutput,
    SchedulerOutput,
)
from kvsched.core.policies import AdmissionPolicy, PrefillCadence
from kvsched.core.scheduler import Scheduler
from kvsched.core.scripted_connector import (
    SCRIPTED_REQUEST_KEYS,
    ScriptedConnector,
    ScriptedWorker,
)
from kvsched.core.trace import step_record
from kvsched.errors import CannotServe, UserInputError
from kvsched.files import read_text
from kvsched.jsonfile import DuplicateKeys, json_problem, strict_loads
from kvsched.request import Request, RequestStatus, SamplingParams

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
# Every KV block is a Python object in the block pool (about 48 bytes,
# measured): 2**21 blocks cost about 100 MB and 0.2 s to build, and hold 33M
# tokens at block size 16, more than any single GPU's cache.
NUM_GPU_BLOCKS_LIMIT = 2**21
# vLLM's attention backends use blocks of at most a few hundred tokens.
BLOCK_SIZE_LIMIT = 2**16
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
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                  "enable_chunked_prefill", "long_prefill_token_threshold", "policy",
                  "scheduler_reserve_full_isl", "prefill_schedule_interval")
CACHE_KEYS = ("block_size", "num_gpu_blocks", "enable_prefix_caching")
REQUEST_KEYS = ("request_id", "prompt_token_ids", "max_tokens", "min_tokens", "ignore_eos",
                "eos_token_id", "stop_token_ids", "priority", "arrival_step", "arrival_time",
                "sampled_token_ids", "accepted_drafts", "proposed_drafts", "lora_id", "rank",
                "kv_transfer_params", *SCRIPTED_REQUEST_KEYS)
ABORT_KEYS = ("step", "request_ids")
SPECULATIVE_KEYS = ("num_speculative_tokens", "method")
# kv_connector: the oracle's common keys and each connector type's own.
_KV_COMMON_KEYS = ("type", "kv_role", "load_failure_policy")
KV_CONNECTOR_KEYS: dict[str, tuple[str, ...]] = {
    "scripted": (*_KV_COMMON_KEYS, "pending_block_frees"),
    "nixl": _KV_COMMON_KEYS,
    "offloading": (*_KV_COMMON_KEYS, "num_cpu_blocks", "block_size_factor", "load_steps",
                   "store_steps", "eviction_policy", "store_threshold", "sync_load_budget_tokens"),
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


def parse_scenario(obj: Any, source: str = "scenario") -> Scenario:
    """Check a scenario object against the schema and build its configs;
    ``source`` (the file) starts every error message."""
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
    use_async, speculative, lora = _check_features(c, top)
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
    try:
        scheduler_config = SchedulerConfig(
            max_num_batched_tokens=budget, max_num_seqs=seqs, max_model_len=max_model_len,
            enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
            policy=policy, scheduler_reserve_full_isl=reserve, async_scheduling=use_async,
            pipeline_parallel_size=pp)
    except (ValueError, TypeError) as e:
        raise UserInputError(f"{source}: scheduler.{e}") from None

    if "num_gpu_blocks" not in cc:
        c.missing("cache.num_gpu_blocks", "give the total block count (including vLLM's null block)")
    num_blocks = c.integer(cc, "num_gpu_blocks", "cache", 2, NUM_GPU_BLOCKS_LIMIT,
                           " (each block is an object in memory; a GPU holds far fewer; "
                           "block 0 is vLLM's null block, so at least 2)")
    block_size = c.integer(cc, "block_size", "cache", 1, BLOCK_SIZE_LIMIT,
                           " (vLLM's blocks hold a few hundred tokens at most)", 16)
    prefix = c.boolean(cc, "enable_prefix_caching", "cache", False)
    try:
        cache_config = CacheConfig(num_gpu_blocks=num_blocks, block_size=block_size,
                                   enable_prefix_caching=prefix)
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
                    speculative, lora, kv_connector)


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


def _check_features(c: _Checker, top: Mapping[str, Any]
                    ) -> tuple[bool, SpeculativeConfig | None, LoRAConfig | None]:
    """The oracle's optional features (SCENARIO_FORMAT.md): async
    scheduling, speculative decoding with an n-gram method, the LoRA cap."""
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
            check_speculative_with_async(speculative, use_async)
        except ValueError as e:
            raise UserInputError(f"{c.source}: {e}") from None
    lora = None
    if "max_loras" in top:
        lora = LoRAConfig(max_loras=c.integer(top, "max_loras", "", 1, 2**16 - 1))
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


def load_scenario(path: str) -> Scenario:
    """Read and check a scenario file; every problem is one ValueError naming
    the file (the key's path within it, the value and the fix)."""
    text = read_text(path, FILE_SIZE_LIMIT, "a scenario (JSON)",
                     fix="a scenario this big is not a test: split it")
    try:
        # A repeated key is refused by the checker, which knows the object's path.
        data = strict_loads(text, constants=False, mark_duplicates_for_caller=True)
    except ValueError as e:
        raise UserInputError(f"{path}: {json_problem(e)}; save the scenario as one JSON object") from None
    return parse_scenario(data, path)


def make_request(spec: dict[str, Any]) -> Request:
    params = SamplingParams(
        max_tokens=spec["max_tokens"],
        min_tokens=spec.get("min_tokens", 0),
        ignore_eos=spec.get("ignore_eos", False),
        eos_token_id=spec.get("eos_token_id"),
        stop_token_ids=tuple(spec.get("stop_token_ids", ())),
    )
    return Request(
        request_id=spec["request_id"],
        prompt_token_ids=list(spec["prompt_token_ids"]),
        sampling_params=params,
        priority=spec.get("priority", 0),
        arrival_time=float(spec.get("arrival_time", spec.get("arrival_step", 0))),
        lora_id=spec.get("lora_id") or 0,
    )


def next_token(spec: dict[str, Any], num_output_tokens: int) -> int:
    """The scripted token for output position ``num_output_tokens``; below
    min_tokens a scripted stop token is replaced, as a real sampler masks it."""
    script = spec.get("sampled_token_ids") or ()
    token = script[num_output_tokens] if num_output_tokens < len(script) else DEFAULT_TOKEN
    if num_output_tokens < spec.get("min_tokens", 0):
        stops = set(spec.get("stop_token_ids", ()))
        if not spec.get("ignore_eos", False) and spec.get("eos_token_id") is not None:
            stops.add(spec["eos_token_id"])
        if token in stops:
            token = DEFAULT_TOKEN
    return token


def check_requests(scenario: Scenario) -> None:
    """Raise ValueError for what a replay would refuse: a data-parallel
    scenario, or the first request ``add_request`` would refuse, so a bad
    scenario fails before its first step rather than at an arrival."""
    source = scenario.source
    if scenario.data_parallel_size > 1:
        raise UserInputError(f"{source}: data_parallel_size={scenario.data_parallel_size}: kvsched replay "
                         "runs one scheduler; data-parallel scenarios are run by "
                         "tests/conformance/test_dp_lockstep.py (remove the key for one rank)")
    sched = _build_scheduler(scenario)
    for i, spec in enumerate(scenario.requests):
        try:
            sched.check_request(make_request(spec))
        except ValueError as e:
            raise UserInputError(f"{source}: requests[{i}]: {e}") from None


def _build_scheduler(scenario: Scenario, admission_policy: AdmissionPolicy | None = None,
                     explain: bool = False) -> Scheduler:
    try:
        sched = Scheduler(scenario.scheduler_config, scenario.cache_config, admission_policy,
                          explain_admission=explain, speculative_config=scenario.speculative_config,
                          lora_config=scenario.lora_config, kv_connector=_make_connector(scenario))
    except ValueError as e:
        raise UserInputError(f"{scenario.source}: {e}") from None
    if sched.connector is not None:
        sched.connector.bind_kv_cache_manager(sched.kv_cache_manager)
    return sched


def _make_connector(scenario: Scenario) -> KVConnectorBase | None:
    kvc = scenario.kv_connector
    if kvc is None:
        return None
    policy = kvc.get("load_failure_policy", "fail")
    config = KVTransferConfig(kvc.get("kv_role", "kv_both"), policy)
    if kvc["type"] == "multi":
        return MultiConnector(config, [
            _make_child_connector(scenario, child, KVTransferConfig(child.get("kv_role", "kv_both"), policy))
            for child in kvc["connectors"]])
    return _make_child_connector(scenario, kvc, config)


def _make_child_connector(scenario: Scenario, kvc: Mapping[str, Any],
                          config: KVTransferConfig) -> KVConnectorBase:
    block_size = scenario.cache_config.block_size
    if kvc["type"] == "offloading":
        return OffloadingConnector(
            config, block_size, kvc["num_cpu_blocks"], kvc.get("block_size_factor", 1),
            kvc.get("eviction_policy", "lru"), kvc.get("store_threshold", 0),
            kvc.get("sync_load_budget_tokens", 0), scenario.cache_config.enable_prefix_caching,
            {r["request_id"]: r["kv_transfer_params"] for r in scenario.requests
             if r.get("kv_transfer_params") is not None})
    if kvc["type"] == "nixl":
        return NixlConnector(config, block_size, {
            r["request_id"]: params for r in scenario.requests
            if (params := replay_kv_transfer_params(r, block_size)) is not None})
    scripts = {r["request_id"]: {k: r[k] for k in SCRIPTED_REQUEST_KEYS if k in r}
               for r in scenario.requests}
    return ScriptedConnector(config, scripts, scenario.cache_config.block_size,
                             bool(kvc.get("pending_block_frees", False)))


def _kv_fields(sched: Scheduler, output: SchedulerOutput | None,
               report: tuple[ModelRunnerOutput, set[str]] | None) -> dict[str, Any]:
    """The KV connector's trace keys for one step: ``output`` the batch
    scheduled in it (or None), ``report`` the processed output and the ids
    whose load failed in it (or None)."""
    requests = sched.requests.values()
    kvo = report[0].kv_connector_output if report is not None else None
    loads = output.kv_loads if output is not None and output.kv_loads else {}
    return {
        "waiting_for_remote_kvs": sorted(r.request_id for r in requests
                                         if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS),
        "kv_load": {rid: [n, is_async] for rid, (n, is_async) in loads.items()},
        "finished_recving": sorted(kvo.finished_recving) if kvo is not None else [],
        "finished_sending": sorted(kvo.finished_sending) if kvo is not None else [],
        "load_failed": sorted(report[1]) if report is not None else [],
        "delayed_free": sorted(r.request_id for r in requests if r.is_finished()),
    } | _offload_fields(sched.connector, output.kv_connector_metadata if output else None, kvo)


def _offload_fields(connector: KVConnectorBase | None, meta: Any,
                    kvo: KVConnectorOutput | None) -> dict[str, Any]:
    """The ``offload`` trace key when the connector is (or a MultiConnector
    holds) an OffloadingConnector: its own metadata and worker report."""
    if isinstance(connector, OffloadingConnector):
        return {"offload": connector.trace_fields(meta, kvo)}
    if not isinstance(connector, MultiConnector):
        return {}
    for i, child in enumerate(connector.sub_connectors):
        if isinstance(child, OffloadingConnector):
            child_kvo = None
            if kvo is not None:
                worker_meta = kvo.kv_connector_worker_meta
                child_kvo = KVConnectorOutput(kv_connector_worker_meta=worker_meta.metadata[i]
                                              if isinstance(worker_meta, MultiKVConnectorWorkerMetadata)
                                              else None)
            return {"offload": child.trace_fields(meta.metadata[i] if meta is not None else None, child_kvo)}
    return {}


# The worker's report for a batch and the ids whose load failed in it.
_KVReport = tuple[KVConnectorOutput, set[str]]


class _KVWorker(Protocol):
    """A connector's scripted worker side: one call per executed batch, in
    order, with the batch's connector metadata."""

    def capture(self, meta: Any) -> _KVReport: ...


def _make_worker(scenario: Scenario) -> _KVWorker | None:
    kvc = scenario.kv_connector
    if kvc is None:
        return None
    if kvc["type"] == "multi":
        return MultiScriptedWorker([_make_child_worker(scenario, child) for child in kvc["connectors"]])
    return _make_child_worker(scenario, kvc)


def _make_child_worker(scenario: Scenario, kvc: Mapping[str, Any]) -> _KVWorker:
    if kvc["type"] == "offloading":
        return OffloadingWorker(kvc.get("load_steps", 1), kvc.get("store_steps", 1))
    if kvc["type"] == "nixl":
        return NixlScriptedWorker({r["request_id"]: {k: r[k] for k in NIXL_REQUEST_KEYS if k in r}
                                   for r in scenario.requests})
    return ScriptedWorker()


def _kv_report(worker: _KVWorker, output: SchedulerOutput,
               runner_output: ModelRunnerOutput) -> tuple[ModelRunnerOutput, set[str]]:
    """The worker runs the batch (synchronous loop): its report goes with
    the batch's output."""
    kv_output, failed = worker.capture(output.kv_connector_metadata)
    runner_output.kv_connector_output = kv_output
    return runner_output, failed


# One scheduled request as the fake model saw it: id, the request, whether it
# samples in this batch, drafts scheduled, admitted in this batch.
_Entry = tuple[str, Request, bool, int, bool]


class FakeModel:
    """The scripted model runner and drafter of SCENARIO_FORMAT.md. A batch
    is captured when scheduled and its output produced when the engine
    collects it: at once (synchronous), or when it leaves the batch queue
    (async scheduling)."""

    __slots__ = ("specs", "num_verifications", "num_proposals")

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        self.specs = specs
        self.num_verifications: dict[str, int] = {}
        self.num_proposals: dict[str, int] = {}

    @staticmethod
    def capture(sched: Scheduler, output: SchedulerOutput) -> list[_Entry]:
        admitted = {n.req_id for n in output.scheduled_new_reqs}
        admitted |= output.scheduled_cached_reqs.resumed_req_ids
        spec = output.scheduled_spec_decode_tokens
        requests = sched.requests
        return [(rid, requests[rid], not requests[rid].is_prefill_chunk, len(spec.get(rid, ())),
                 rid in admitted) for rid in output.num_scheduled_tokens]

    def _accepted(self, rid: str, num_drafts: int) -> int:
        i = self.num_verifications.get(rid, 0)
        self.num_verifications[rid] = i + 1
        script = self.specs[rid].get("accepted_drafts") or ()
        n = script[i] if i < len(script) else num_drafts
        return max(0, min(n, num_drafts))

    def output(self, batch: list[_Entry]) -> ModelRunnerOutput:
        sampled: list[list[int]] = []
        for rid, req, samples, num_drafts, admitted in batch:
            if not samples:
                sampled.append([])
                continue
            # Drafts of the step that admits a request are padding: never accepted.
            accepted = self._accepted(rid, num_drafts) if num_drafts and not admitted else 0
            n = len(req.output_token_ids)
            spec = self.specs[rid]
            sampled.append([next_token(spec, n + j) for j in range(1 + accepted)])
        return ModelRunnerOutput([entry[0] for entry in batch], sampled)

    def propose(self, batch: list[_Entry], k: int) -> DraftTokenIds:
        """Drafts after a synchronous step: none for a request that sampled
        nothing, else its next ``proposed_drafts`` entry (default and cap K)."""
        drafts: list[list[int]] = []
        for rid, req, samples, _, _ in batch:
            if not samples:
                drafts.append([])
                continue
            i = self.num_proposals.get(rid, 0)
            self.num_proposals[rid] = i + 1
            script = self.specs[rid].get("proposed_drafts") or ()
            d = max(0, min(script[i] if i < len(script) else k, k))
            n = len(req.output_token_ids)
            drafts.append([next_token(self.specs[rid], n + j) for j in range(d)])
        return DraftTokenIds([entry[0] for entry in batch], drafts)


def record_ids(record: dict[str, Any]) -> list[str]:
    """The scheduled request ids of a trace record, in order."""
    return [rid for rid, _ in record["scheduled"]]


def _empty_output() -> SchedulerOutput:
    """The trace's view of an async step that called no schedule()."""
    return SchedulerOutput([], CachedRequestData(), {}, 0, set(), set())


StepHook = Callable[[int, SchedulerOutput, dict[str, Any], Scheduler], None]
# Idle trace lines are written this many at a time.
_IDLE_CHUNK = 4096


def replay(scenario: Scenario, trace_out: TextIO | None = None,
           on_step: StepHook | None = None, explain: bool = False,
           admission_policy: AdmissionPolicy | None = None, *, skip_idle: bool = True) -> ReplayResult:
    """Run the scenario's step loop; write one JSON line per step to ``trace_out``.
    ``admission_policy`` replaces the scenario's (a PrefillCadence when it sets
    ``prefill_schedule_interval`` > 1).

    Idle stretches (no request in the system, no arrival and no abort until a
    later step) are skipped rather than stepped through when ``skip_idle``
    and there is neither an ``on_step`` hook nor an ``admission_policy``
    (either may count steps): after one idle step, ``schedule()`` and
    ``update_from_output()`` change nothing until the next event, and every
    idle step's trace line is the previous one's with the step number
    changed; those lines are still written (the oracle writes them), but
    without a trace the stretch costs nothing."""
    check_requests(scenario)
    policy = admission_policy
    if policy is None and scenario.prefill_schedule_interval > 1:
        policy = PrefillCadence(scenario.prefill_schedule_interval)
    sched = _build_scheduler(scenario, policy, explain)
    specs = {r["request_id"]: r for r in scenario.requests}
    arrivals: dict[int, list[dict[str, Any]]] = {}
    for r in scenario.requests:
        arrivals.setdefault(r.get("arrival_step", 0), []).append(r)
    aborts = scenario.aborts
    events = sorted({*arrivals, *aborts})
    last_event = max([*events, 0])
    max_steps = scenario.max_steps
    use_async = scenario.scheduler_config.async_scheduling
    # vLLM's engine runs step_with_batch_queue whenever its queue is deeper
    # than one batch (async scheduling, pipeline parallelism).
    queue_size = batch_queue_size(use_async, scenario.scheduler_config.pipeline_parallel_size)
    overlap = queue_size > 1
    use_spec = scenario.speculative_config is not None
    model = FakeModel(specs)
    # The KV connector's worker side sees every executed batch, in order.
    worker = _make_worker(scenario)
    use_kv = worker is not None
    # Async scheduling: vLLM's EngineCore.batch_queue, newest first, with the
    # worker's report for each batch.
    batch_queue: deque[tuple[int, SchedulerOutput, list[_Entry], _KVReport | None]] = deque()
    # A caller's policy or hook may count steps: those see every step. With
    # a connector idle steps poll the worker: none is skipped.
    skip = skip_idle and on_step is None and admission_policy is None and not use_kv
    requests = sched.requests
    perf = time.perf_counter
    seconds = 0.0
    step = 0
    idle_tail: str | None = None  # the previous idle step's trace line after its step number
    scheduled_steps = 0
    while step <= last_event or batch_queue or (
            sched.has_requests() if use_kv else sched.has_unfinished_requests()):
        if step >= max_steps:
            raise CannotServe(f"{scenario.source}: the scenario did not finish within "
                               f"max_steps={max_steps}")
        quiet = (step not in arrivals and step not in aborts and not sched.has_unfinished_requests()
                 and not batch_queue and not (overlap and sched.has_requests()))
        if quiet and idle_tail is not None and skip:
            # Up to the next event (there is one: step <= last_event here).
            stop = min(events[bisect.bisect_right(events, step)], max_steps)
            if trace_out is not None:
                for start in range(step, stop, _IDLE_CHUNK):
                    trace_out.write("".join(f'{{"step":{s},{idle_tail}'
                                            for s in range(start, min(start + _IDLE_CHUNK, stop))))
            step = stop
            continue
        for spec in arrivals.get(step, ()):
            sched.add_request(make_request(spec))
        finished: list[list[str]] = []
        # (A finished request whose blocks a connector still holds is ignored.)
        live = [rid for rid in aborts.get(step, ()) if rid in requests and not requests[rid].is_finished()]
        if live:
            sched.finish_requests(live)
            finished.extend([rid, "abort"] for rid in live)

        processed: int | None = None
        results: EngineCoreOutputs | None = None
        output: SchedulerOutput | None = None
        report: tuple[ModelRunnerOutput, set[str]] | None = None
        if not overlap and (not use_kv or sched.has_requests()):
            # EngineCore.step() (with a connector it skips schedule() when
            # has_requests() is false), then post_step() hands the drafts over.
            t0 = perf()
            output = sched.schedule()
            t1 = perf()
            scheduled_steps += 1
            batch = model.capture(sched, output)
            runner_output = model.output(batch)
            if worker is not None:
                report = _kv_report(worker, output, runner_output)
            t2 = perf()
            results = sched.update_from_output(output, runner_output)
            t3 = perf()
            seconds += (t1 - t0) + (t3 - t2)
            if use_spec and output.total_num_scheduled_tokens > 0:
                drafts = model.propose(batch, output.num_spec_tokens_to_schedule)
                t4 = perf()
                sched.update_draft_token_ids(drafts)
                seconds += perf() - t4
        elif overlap:
            # EngineCore.step_with_batch_queue(): schedule the next batch;
            # collect the oldest once the queue is full or nothing is left
            # to schedule.
            pop = bool(batch_queue)
            if sched.has_requests():
                t0 = perf()
                output = sched.schedule()
                seconds += perf() - t0
                scheduled_steps += 1
                new_report = (worker.capture(output.kv_connector_metadata) if worker is not None
                              else None)
                batch_queue.appendleft((step, output, model.capture(sched, output), new_report))
                pop = not (len(batch_queue) < queue_size and (
                    output.total_num_scheduled_tokens > 0 or sched.has_requests()))
            if pop:
                processed, done_output, done_batch, kv_report = batch_queue.pop()
                runner_output = model.output(done_batch)
                if kv_report is not None:
                    runner_output.kv_connector_output = kv_report[0]
                    report = (runner_output, kv_report[1])
                t2 = perf()
                results = sched.update_from_output(done_output, runner_output)
                seconds += perf() - t2

        if results is not None:
            finished.extend([o.request_id, o.finish_reason or ""] for o in results.finished)
        record = step_record(step, output if output is not None else _empty_output(), finished, sched)
        if use_spec:
            spec_tokens = output.scheduled_spec_decode_tokens if output is not None else {}
            record["spec"] = [[rid, len(spec_tokens[rid])] for rid in record_ids(record)
                              if rid in spec_tokens]
        if overlap:
            record["processed"] = processed
        if use_kv:
            record.update(_kv_fields(sched, output, report))
        idle_tail = None
        if trace_out is not None:
            line = json.dumps(record, separators=(",", ":"))
            trace_out.write(line + "\n")
            prefix = f'{{"step":{step},'
            if quiet and line.startswith(prefix):
                idle_tail = line[len(prefix):] + "\n"
        elif quiet:
            idle_tail = ""
        if on_step is not None:
            on_step(step, output if output is not None else _empty_output(), record, sched)
        step += 1
    return ReplayResult(step, sched.num_preemptions, seconds, scheduled_steps)
