"""The `kv_connector` scenario key for the vLLM 0.34.0 oracle (oracle.py).

Same contract as the shared 0.33 oracle's connector support (SCENARIO_FORMAT.md, "KV
connectors"): the scheduler side is a real vLLM 0.34 connector built by vLLM's
KVConnectorFactory ("scripted": a KVConnectorBase_V1 subclass answering from
per-request scripts; "offloading": vLLM's OffloadingConnector with its CPU manager;
"nixl": vLLM's NixlConnector scheduler side; "multi": vLLM's MultiConnector over
`connectors`, a list of nixl / offloading child objects, the corpus's
kv_connector_multi/ scenarios, as tests/conformance/multi_oracle.py runs them on 0.33),
and only the worker side is scripted, from the connector metadata each scheduled
batch carries.

0.34 additions: the scripted connector answers `may_load_async` (new in 0.34's
KVConnectorBase_V1, read when a request enters the waiting queues with
`max_num_inflight_kv_loads` set) from the request's script: true when any of its
scripted loads is asynchronous. The fake offloading worker scripts failed transfer
jobs, which 0.34's OffloadingConnectorWorker reports (`OffloadingWorkerMetadata.
failed_jobs`; a failed asynchronous load also in `failed_recving`, from
`take_failed_recving`): a request's `offload_load_fail` (true, or a list with one
entry per asynchronous offloading load of the request) and the offloading
connector's `store_fail` (the job ids of store jobs that fail). A synchronous load
never fails here (0.34's worker raises on one: the engine stops). The `offload` trace
key gets `failed` (the failed job ids) in a step whose completed jobs include some.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.utils.math_utils import cdiv
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

CONNECTOR_TYPES = ("scripted", "offloading", "nixl", "multi")
MULTI_CHILD_TYPES = ("nixl", "offloading")
ROLES = ("kv_both", "kv_producer", "kv_consumer")
SCRIPTED_CLASS = "KvschedScriptedConnector034"
ENGINE_ID = "kvsched-replay"  # fixed: KVTransferConfig would draw a random one
REMOTE_PREFILL_DEFAULTS = {
    "remote_engine_id": "kvsched-prefill",
    "remote_host": "localhost",
    "remote_port": 5600,
}
SCRIPT_KEYS = ("external_hit_tokens", "load_async", "load_steps", "load_fail", "send_steps")


def script_value(script: dict, key: str, attempt: int, default):
    """A scalar applies to every load attempt; a list gives one value per attempt."""
    value = script.get(key, default)
    if isinstance(value, list):
        return value[attempt] if attempt < len(value) else default
    return default if value is None else value


class ScriptedMeta(KVConnectorMetadata):
    def __init__(self, loads: list[dict], sends: list[tuple[str, int]]):
        self.loads = loads
        self.sends = sends


class KvschedScriptedConnector034(KVConnectorBase_V1):
    """Scheduler side answering from kv_connector_extra_config["requests"][id]:
    external hits (capped to leave a token for a synchronous load), async or not,
    delayed frees (`send_steps`), optionally has_pending_block_frees()."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.scripts: dict[str, dict] = extra.get("requests", {})
        self.pending_frees_flag = bool(extra.get("pending_block_frees", False))
        self.block_size = vllm_config.cache_config.block_size
        self.loads_started: dict[str, int] = {}
        self.lookup: dict[str, tuple[int, int, bool]] = {}
        self.loading: set[str] = set()
        self.sending: set[str] = set()
        self.pending_loads: list[dict] = []
        self.pending_sends: list[tuple[str, int]] = []

    def _script(self, rid: str, key: str, default):
        return script_value(self.scripts.get(rid, {}), key, self.loads_started.get(rid, 0), default)

    def may_load_async(self, request) -> bool:
        value = self.scripts.get(request.request_id, {}).get("load_async", False)
        return any(value) if isinstance(value, list) else bool(value)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        rid = request.request_id
        wanted = int(self._script(rid, "external_hit_tokens", 0))
        is_async = bool(self._script(rid, "load_async", False))
        room = request.num_tokens - num_computed_tokens - (0 if is_async else 1)
        hit = max(0, min(wanted, room))
        self.lookup[rid] = (num_computed_tokens, hit, is_async and hit > 0)
        return hit, is_async and hit > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        if num_external_tokens == 0:
            return
        rid = request.request_id
        local, hit, is_async = self.lookup[rid]
        assert hit == num_external_tokens, (hit, num_external_tokens)
        steps = int(self._script(rid, "load_steps", 1))
        if steps < 1:
            raise ValueError(f"request {rid}: load_steps must be >= 1")
        fail = self._script(rid, "load_fail", None)
        invalid: list[int] = []
        if fail == "request":
            if not is_async:
                raise ValueError(f"request {rid}: load_fail 'request' needs an asynchronous load")
        elif fail is not None:
            if isinstance(fail, bool) or not isinstance(fail, int) or fail < 0:
                raise ValueError(f"request {rid}: load_fail must be 'request' or an int >= 0")
            ids = blocks.get_block_ids()[0]
            first = local // self.block_size
            invalid = ids[first + fail : cdiv(local + hit, self.block_size)]
        self.loads_started[rid] = self.loads_started.get(rid, 0) + 1
        self.pending_loads.append(
            {
                "req_id": rid,
                "async": is_async,
                "steps": steps,
                "fail_request": fail == "request",
                "invalid_block_ids": invalid,
            }
        )
        if is_async:
            self.loading.add(rid)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = ScriptedMeta(self.pending_loads, self.pending_sends)
        self.pending_loads, self.pending_sends = [], []
        return meta

    def update_connector_output(self, connector_output: KVConnectorOutput):
        self.loading.difference_update(connector_output.finished_recving or ())
        self.sending.difference_update(connector_output.finished_sending or ())

    def request_finished(self, request, block_ids: list[int]):
        rid = request.request_id
        steps = self.scripts.get(rid, {}).get("send_steps")
        if steps is None or rid in self.loading:
            return False, None
        if int(steps) < 1:
            raise ValueError(f"request {rid}: send_steps must be >= 1")
        self.sending.add(rid)
        self.pending_sends.append((rid, int(steps)))
        return True, None

    def has_pending_block_frees(self) -> bool:
        return self.pending_frees_flag and bool(self.sending)

    # Worker side: played by ScriptedWorker below, never called.
    def start_load_kv(self, forward_context, **kwargs) -> None:
        return

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        return

    def wait_for_save(self):
        return


if SCRIPTED_CLASS not in KVConnectorFactory._registry:
    KVConnectorFactory.register_connector(SCRIPTED_CLASS, __name__, SCRIPTED_CLASS)


def _only_keys(obj: dict, allowed: set[str], what: str) -> None:
    extra = set(obj) - allowed
    if extra:
        raise ValueError(f"{what}: unknown keys {sorted(extra)}")


def kv_transfer_config(scenario: dict) -> KVTransferConfig | None:
    conf = scenario.get("kv_connector")
    if conf is None:
        return None
    kind = conf.get("type")
    if kind not in CONNECTOR_TYPES:
        raise ValueError(f"kv_connector.type {kind!r}: one of {CONNECTOR_TYPES}")
    role = conf.get("kv_role", "kv_both")
    if role not in ROLES:
        raise ValueError(f"kv_connector.kv_role {role!r}: one of {ROLES}")
    policy = conf.get("load_failure_policy", "fail")
    if policy not in ("fail", "recompute"):
        raise ValueError("kv_connector.load_failure_policy: 'fail' or 'recompute'")
    common = {"type", "kv_role", "load_failure_policy"}
    block_size = int(scenario.get("cache", {}).get("block_size", 16))
    if kind == "multi":
        _only_keys(conf, common | {"connectors"}, "kv_connector")
        children = []
        for child in conf["connectors"]:
            if child.get("type") not in MULTI_CHILD_TYPES:
                raise ValueError(
                    f"kv_connector.connectors: type {child.get('type')!r}: one of {MULTI_CHILD_TYPES}"
                )
            own = kv_transfer_config(child_scenario(scenario, child))
            children.append(
                {
                    "kv_connector": own.kv_connector,
                    "kv_role": own.kv_role,
                    "kv_connector_extra_config": own.kv_connector_extra_config,
                    "kv_load_failure_policy": own.kv_load_failure_policy,
                }
            )
        return KVTransferConfig(
            kv_connector="MultiConnector",
            kv_role=role,
            engine_id=ENGINE_ID,
            kv_connector_extra_config={"connectors": children},
            kv_load_failure_policy=policy,
        )
    if kind == "scripted":
        _only_keys(conf, common | {"pending_block_frees"}, "kv_connector")
        scripts = {}
        for r in scenario["requests"]:
            script = {k: r[k] for k in SCRIPT_KEYS if k in r}
            if script:
                scripts[r["request_id"]] = script
        name = SCRIPTED_CLASS
        extra: dict[str, Any] = {
            "requests": scripts,
            "pending_block_frees": bool(conf.get("pending_block_frees", False)),
        }
    elif kind == "offloading":
        _only_keys(
            conf,
            common
            | {
                "num_cpu_blocks",
                "block_size_factor",
                "load_steps",
                "store_steps",
                "eviction_policy",
                "store_threshold",
                "sync_load_budget_tokens",
                "store_fail",
            },
            "kv_connector",
        )
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        factor = int(conf.get("block_size_factor", 1))
        if factor < 1:
            raise ValueError("kv_connector.block_size_factor must be >= 1")
        # One layer, one KV head of size 1, float32: keys and values of a block take
        # 2 * block_size * 4 bytes; a CPU chunk is that times the factor, aligned.
        align = CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT
        chunk_bytes = cdiv(2 * block_size * 4 * factor, align) * align
        name = "OffloadingConnector"
        extra = {
            "cpu_bytes_to_use": int(conf["num_cpu_blocks"]) * chunk_bytes,
            "blocks_per_chunk": factor,
            "eviction_policy": conf.get("eviction_policy", "lru"),
        }
        if "store_threshold" in conf:
            extra["store_threshold"] = int(conf["store_threshold"])
        if conf.get("sync_load_budget_tokens"):
            extra["sync_load_budget_bytes"] = int(conf["sync_load_budget_tokens"]) * 8  # 8 bytes a token
    else:
        _only_keys(conf, common, "kv_connector")
        name, extra = "NixlConnector", {}
    return KVTransferConfig(
        kv_connector=name,
        kv_role=role,
        engine_id=ENGINE_ID,
        kv_connector_extra_config=extra,
        kv_load_failure_policy=policy,
    )


def child_scenario(scenario: dict, child: dict) -> dict:
    """The scenario with `child` as its only connector, under the parent's policy."""
    policy = scenario["kv_connector"].get("load_failure_policy", "fail")
    return {**scenario, "kv_connector": {**child, "load_failure_policy": policy}}


def request_kv_transfer_params(spec: dict, scenario: dict) -> dict | None:
    params = spec.get("kv_transfer_params")
    if params is None:
        return None
    if scenario.get("kv_connector") is None:
        raise ValueError(f"request {spec['request_id']} has kv_transfer_params but no kv_connector")
    params = copy.deepcopy(params)  # the connectors mutate it
    if params.get("do_remote_prefill"):
        block_size = int(scenario.get("cache", {}).get("block_size", 16))
        for k, v in REMOTE_PREFILL_DEFAULTS.items():
            params.setdefault(k, v)
        params.setdefault("remote_request_id", spec["request_id"])
        params.setdefault(
            "remote_block_ids", [list(range(1, 1 + cdiv(len(spec["prompt_token_ids"]), block_size)))]
        )
    return params


# ---------------------------------------------------------------------------
# Scripted worker sides: batch b + s - 1 reports what batch b started for s batches.
# ---------------------------------------------------------------------------


class _Reports:
    def __init__(self):
        self.recv: set[str] = set()
        self.send: set[str] = set()
        self.failed: set[str] = set()
        self.invalid: set[int] = set()
        self.jobs: set[int] = set()
        self.failed_jobs: set[int] = set()
        self.load_failed: set[str] = set()


class FakeWorker:
    def __init__(self, specs: dict[str, dict]):
        self.specs = specs
        self.batch = -1
        self.due: dict[int, _Reports] = defaultdict(_Reports)

    def capture(self, so) -> KVConnectorOutput:
        self.batch += 1
        self.start(so.kv_connector_metadata)
        rep = self.due.pop(self.batch, _Reports())
        out = KVConnectorOutput(
            finished_sending=set(rep.send),
            finished_recving=set(rep.recv),
            failed_recving=set(rep.failed),
            invalid_block_ids=set(rep.invalid),
            kv_connector_worker_meta=self.worker_meta(rep),
        )
        out.kvsched_load_failed = set(rep.load_failed)  # for the trace only
        return out

    def start(self, meta) -> None:
        raise NotImplementedError

    def worker_meta(self, rep: _Reports):
        return None

    def steps(self, rid: str, key: str) -> int:
        value = self.specs.get(rid, {}).get(key)
        value = 1 if value is None else int(value)
        if value < 1:
            raise ValueError(f"request {rid}: {key} must be >= 1")
        return value


class ScriptedWorker(FakeWorker):
    def start(self, meta: ScriptedMeta) -> None:
        for load in meta.loads:
            rid = load["req_id"]
            rep = self.due[self.batch + load["steps"] - 1 if load["async"] else self.batch]
            if load["async"]:
                rep.recv.add(rid)
            if load["fail_request"]:
                rep.failed.add(rid)
                rep.load_failed.add(rid)
            if load["invalid_block_ids"]:
                rep.invalid.update(load["invalid_block_ids"])
                rep.load_failed.add(rid)
        for rid, steps in meta.sends:
            self.due[self.batch + steps - 1].send.add(rid)


class NixlWorker(FakeWorker):
    """A receive parked in WAITING_FOR_REMOTE_KVS (awaiting_kvs) reports after
    `load_steps` batches (with `load_fail`: failed, its local blocks invalid); a send
    (reqs_to_send) after `send_steps` batches."""

    def start(self, meta) -> None:
        for rid, m in meta.reqs_to_recv.items():
            if not m.awaiting_kvs:
                continue
            rep = self.due[self.batch + self.steps(rid, "load_steps") - 1]
            rep.recv.add(rid)
            if self.specs.get(rid, {}).get("load_fail"):
                rep.failed.add(rid)
                rep.load_failed.add(rid)
                if m.local_block_ids:
                    rep.invalid.update(m.local_block_ids[0])
        for rid in meta.reqs_to_send:
            self.due[self.batch + self.steps(rid, "send_steps") - 1].send.add(rid)


class OffloadingWorker(FakeWorker):
    """OffloadingConnectorWorker's timing: a batch's stores are submitted in the next
    batch and complete `store_steps` batches later; a flushed job completes in the
    batch that flushes it; a sync load completes in its batch, an async one after
    `load_steps` batches (its request then in finished_recving). A job scripted to
    fail completes at the same time as failed (`failed_jobs`; an async load's request
    also in failed_recving)."""

    def __init__(self, specs, load_steps: int, store_steps: int, store_fail=()):
        super().__init__(specs)
        if load_steps < 1 or store_steps < 1:
            raise ValueError("kv_connector load_steps / store_steps must be >= 1")
        if not isinstance(store_fail, list) or any(
            isinstance(j, bool) or not isinstance(j, int) or j < 0 for j in store_fail
        ):
            raise ValueError("kv_connector store_fail: a list of job ids >= 0")
        self.load_steps, self.store_steps = load_steps, store_steps
        self.store_fail = set(store_fail)
        self.deferred_stores: list[int] = []
        self.job_due: dict[int, int] = {}
        self.load_owner: dict[int, str] = {}
        self.async_loads_started: dict[str, int] = {}
        self.failing: set[int] = set()

    def _async_load_fails(self, rid: str) -> bool:
        n = self.async_loads_started.get(rid, 0)
        self.async_loads_started[rid] = n + 1
        script = self.specs.get(rid, {}).get("offload_load_fail", False)
        if isinstance(script, bool):
            return script
        if not isinstance(script, list) or any(not isinstance(v, bool) for v in script):
            raise ValueError(f"request {rid}: offload_load_fail: true/false or a list of them")
        return n < len(script) and script[n]

    def _due_at(self, job: int, batch: int) -> None:
        old = self.job_due.get(job)
        if old is not None:
            if old <= batch:
                return
            self.due[old].jobs.discard(job)
        self.job_due[job] = batch
        self.due[batch].jobs.add(job)

    def start(self, meta) -> None:
        b = self.batch
        flush = set(meta.jobs_to_flush or ())
        for job in self.deferred_stores:
            self._due_at(job, b + self.store_steps - 1)
        for job in flush:
            if job in self.job_due or job in meta.store_jobs:
                self._due_at(job, b)
        for job, entry in meta.load_jobs.items():
            if entry.sync:
                self._due_at(job, b)
            else:
                self._due_at(job, b + self.load_steps - 1)
                self.load_owner[job] = entry.req_id
                if self._async_load_fails(entry.req_id):
                    self.failing.add(job)
        self.failing.update(j for j in meta.store_jobs if j in self.store_fail)
        self.deferred_stores = [j for j in meta.store_jobs if j not in flush]
        rep = self.due.get(b)
        if rep is not None:
            for job in rep.jobs:
                del self.job_due[job]
                failed = job in self.failing
                self.failing.discard(job)
                if failed:
                    rep.failed_jobs.add(job)
                owner = self.load_owner.pop(job, None)
                if owner is not None:
                    rep.recv.add(owner)
                    if failed:
                        rep.failed.add(owner)
                        rep.load_failed.add(owner)

    def worker_meta(self, rep: _Reports):
        if not rep.jobs:
            return None
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata

        return OffloadingWorkerMetadata(
            completed_jobs={j: 1 for j in sorted(rep.jobs)}, failed_jobs=set(rep.failed_jobs)
        )


class MultiWorker:
    """vLLM's worker-side MultiConnector over one fake worker per child: each child
    sees its own metadata; reports are unions, a request several children send is
    reported sent once all of them sent it (extra_async_saves), worker metadata one
    per child."""

    def __init__(self, workers: list[FakeWorker]):
        self.workers = workers
        self.extra_saves: dict[str, int] = {}

    def capture(self, so) -> KVConnectorOutput:
        from types import SimpleNamespace

        from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
            MultiKVConnectorMetadata,
            MultiKVConnectorWorkerMetadata,
        )

        meta = so.kv_connector_metadata
        assert isinstance(meta, MultiKVConnectorMetadata), type(meta)
        if meta.extra_async_saves:
            self.extra_saves.update(meta.extra_async_saves)
        outs = [
            w.capture(SimpleNamespace(kv_connector_metadata=m))
            for w, m in zip(self.workers, meta.metadata, strict=True)
        ]
        sent: set[str] = set()
        for out in outs:
            for rid in out.finished_sending:
                left = self.extra_saves.get(rid)
                if left is None:
                    sent.add(rid)
                elif left == 1:
                    del self.extra_saves[rid]
                else:
                    self.extra_saves[rid] = left - 1
        metas = tuple(out.kv_connector_worker_meta for out in outs)
        combined = KVConnectorOutput(
            finished_sending=sent,
            finished_recving=set().union(*(o.finished_recving for o in outs)),
            failed_recving=set().union(*(o.failed_recving for o in outs)),
            invalid_block_ids=set().union(*(o.invalid_block_ids for o in outs)),
            kv_connector_worker_meta=(
                MultiKVConnectorWorkerMetadata(metadata=metas) if any(m is not None for m in metas) else None
            ),
        )
        combined.kvsched_load_failed = set().union(*(o.kvsched_load_failed for o in outs))
        return combined


def make_kv_worker(scenario: dict) -> FakeWorker | MultiWorker | None:
    conf = scenario.get("kv_connector")
    if conf is None:
        return None
    if conf["type"] == "multi":
        return MultiWorker([make_kv_worker(child_scenario(scenario, c)) for c in conf["connectors"]])
    specs = {r["request_id"]: r for r in scenario["requests"]}
    if conf["type"] == "scripted":
        return ScriptedWorker(specs)
    if conf["type"] == "nixl":
        return NixlWorker(specs)
    return OffloadingWorker(
        specs, int(conf.get("load_steps", 1)), int(conf.get("store_steps", 1)), conf.get("store_fail", [])
    )


# ---------------------------------------------------------------------------
# Trace keys
# ---------------------------------------------------------------------------


class KVObserver:
    """Records the loads each schedule() starts (update_state_after_alloc with
    external tokens) and, for offloading, the jobs in the batch's metadata; every
    call goes through to vLLM unchanged."""

    def __init__(self, sched, kind: str):
        self.sched, self.kind = sched, kind
        self.calls: list[tuple[Any, int]] = []
        self.loads: dict[str, list] = {}
        connector = sched.connector
        inner_alloc = connector.update_state_after_alloc

        def update_state_after_alloc(request, blocks, num_external_tokens):
            if num_external_tokens > 0:
                self.calls.append((request, num_external_tokens))
            return inner_alloc(request, blocks, num_external_tokens)

        connector.update_state_after_alloc = update_state_after_alloc
        inner_schedule = sched.schedule

        def schedule(*args, **kwargs):
            self.calls = []
            so = inner_schedule(*args, **kwargs)
            self.loads = {
                req.request_id: [n, req.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
                for req, n in self.calls
            }
            return so

        sched.schedule = schedule

    def begin_step(self) -> None:
        self.loads = {}

    def record(self, so, mro) -> dict:
        sched = self.sched
        kvo = mro.kv_connector_output if mro is not None else None
        line = {
            "waiting_for_remote_kvs": sorted(
                rid for rid, r in sched.requests.items() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
            ),
            "kv_load": dict(self.loads),
            "finished_recving": sorted(kvo.finished_recving or ()) if kvo else [],
            "finished_sending": sorted(kvo.finished_sending or ()) if kvo else [],
            "load_failed": sorted(getattr(kvo, "kvsched_load_failed", ())) if kvo else [],
            "delayed_free": sorted(rid for rid, r in sched.requests.items() if r.is_finished()),
        }
        child = None
        if self.kind == "multi":
            child = next(
                (
                    i
                    for i, c in enumerate(sched.connector.sub_connectors)
                    if type(c).__name__ == "OffloadingConnector"
                ),
                None,
            )
        if self.kind == "offloading" or child is not None:
            meta = so.kv_connector_metadata if so is not None else None
            wm = kvo.kv_connector_worker_meta if kvo is not None else None
            connector = sched.connector
            if child is not None:
                meta = meta.metadata[child] if meta is not None else None
                wm = wm.metadata[child] if wm is not None else None
                connector = connector.sub_connectors[child]
            manager = connector.connector_scheduler.manager
            line["offload"] = {
                "store": [job_entry(j, e) for j, e in sorted(meta.store_jobs.items())] if meta else [],
                "load": [[*job_entry(j, e), e.sync] for j, e in sorted(meta.load_jobs.items())]
                if meta
                else [],
                "flush": sorted(meta.jobs_to_flush or ()) if meta else [],
                "done": sorted(wm.completed_jobs) if wm is not None else [],
                "cpu_chunks": manager._num_allocated_chunks - len(manager._free_list),
            }
            if wm is not None and wm.failed_jobs:
                line["offload"]["failed"] = sorted(wm.failed_jobs)
        return line


def job_entry(job_id: int, entry) -> list:
    """[job, request id, first GPU block's index in the block table, GPU blocks]."""
    from vllm.v1.kv_offload.base import GPULoadStoreSpec

    gpu = entry.dst_spec if isinstance(entry.dst_spec, GPULoadStoreSpec) else entry.src_spec
    first = gpu.block_indices[0] if gpu.block_indices else 0
    count = gpu.group_sizes[0] if gpu.group_sizes else len(gpu.block_ids)
    return [job_id, entry.req_id, int(first), int(count)]
