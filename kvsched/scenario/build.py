"""What a checked scenario builds: its requests, the scheduler, the KV
connector (scheduler side) and the connector's scripted worker side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kvsched.core.kv_connector import (
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
from kvsched.core.output import (
    ModelRunnerOutput,
    SchedulerOutput,
)
from kvsched.core.policies import AdmissionPolicy
from kvsched.core.scheduler import Scheduler
from kvsched.core.scripted_connector import (
    SCRIPTED_REQUEST_KEYS,
    ScriptedConnector,
    ScriptedWorker,
)
from kvsched.errors import UserInputError
from kvsched.request import MultiModalFeature, Request, RequestStatus, SamplingParams
from kvsched.scenario.schema import Scenario


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
        mm_features=tuple(MultiModalFeature(m["identifier"], m["offset"], m["length"],
                                            m.get("modality", "image"), m.get("is_embed"))
                          for m in spec.get("mm_items", ())),
    )


def check_requests(scenario: Scenario) -> None:
    """Raise ValueError for what a replay would refuse: a data-parallel
    scenario, or the first request ``add_request`` would refuse, so a bad
    scenario fails before its first step rather than at an arrival."""
    source = scenario.source
    if scenario.data_parallel_size > 1:
        raise UserInputError(f"{source}: data_parallel_size={scenario.data_parallel_size}: kvsched replay "
                         "runs one scheduler; data-parallel scenarios are run by "
                         "tests/conformance/test_dp_lockstep.py (remove the key for one rank)")
    sched = build_scheduler(scenario)
    for i, spec in enumerate(scenario.requests):
        try:
            sched.check_request(make_request(spec))
        except ValueError as e:
            raise UserInputError(f"{source}: requests[{i}]: {e}") from None


def build_scheduler(scenario: Scenario, admission_policy: AdmissionPolicy | None = None,
                     explain: bool = False) -> Scheduler:
    try:
        sched = Scheduler(scenario.scheduler_config, scenario.cache_config, admission_policy,
                          explain_admission=explain, speculative_config=scenario.speculative_config,
                          lora_config=scenario.lora_config, kv_connector=_make_connector(scenario),
                          mm_max_tokens_per_item=scenario.mm_max_tokens_per_item)
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
            for child in kvc["connectors"]], scenario.scheduler_config.vllm_version)
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
             if r.get("kv_transfer_params") is not None}, scenario.scheduler_config.vllm_version)
    if kvc["type"] == "nixl":
        return NixlConnector(config, block_size, {
            r["request_id"]: params for r in scenario.requests
            if (params := replay_kv_transfer_params(r, block_size)) is not None})
    scripts = {r["request_id"]: {k: r[k] for k in SCRIPTED_REQUEST_KEYS if k in r}
               for r in scenario.requests}
    return ScriptedConnector(config, scripts, scenario.cache_config.block_size,
                             bool(kvc.get("pending_block_frees", False)))


def encoder_fields(sched: Scheduler, output: SchedulerOutput | None) -> dict[str, Any]:
    """The encoder's trace keys for one step (a multimodal scenario): the mm
    items scheduled for encoding per request in scheduling order, the
    identifiers the step's output tells the workers to drop, and the encoder
    cache's free and freeable slots after the step."""
    ecm = sched.encoder_cache_manager
    assert ecm is not None
    inputs = output.scheduled_encoder_inputs if output is not None else {}
    return {
        "encoder_inputs": [[rid, ids] for rid, ids in inputs.items()],
        "freed_mm_hashes": output.free_encoder_mm_hashes if output is not None else [],
        "encoder_free_slots": ecm.num_free_slots,
        "encoder_freeable_slots": ecm.num_freeable_slots,
    }


def kv_fields(sched: Scheduler, output: SchedulerOutput | None,
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
KVReport = tuple[KVConnectorOutput, set[str]]


class KVWorker(Protocol):
    """A connector's scripted worker side: one call per executed batch, in
    order, with the batch's connector metadata."""

    def capture(self, meta: Any) -> KVReport: ...


def make_worker(scenario: Scenario) -> KVWorker | None:
    kvc = scenario.kv_connector
    if kvc is None:
        return None
    if kvc["type"] == "multi":
        return MultiScriptedWorker([_make_child_worker(scenario, child) for child in kvc["connectors"]])
    return _make_child_worker(scenario, kvc)


def _make_child_worker(scenario: Scenario, kvc: Mapping[str, Any]) -> KVWorker:
    if kvc["type"] == "offloading":
        # The scripted failures (vLLM 0.34; the schema refuses them for 0.33).
        return OffloadingWorker(kvc.get("load_steps", 1), kvc.get("store_steps", 1),
                                {r["request_id"]: r["offload_load_fail"] for r in scenario.requests
                                 if "offload_load_fail" in r}, kvc.get("store_fail", ()))
    if kvc["type"] == "nixl":
        return NixlScriptedWorker({r["request_id"]: {k: r[k] for k in NIXL_REQUEST_KEYS if k in r}
                                   for r in scenario.requests})
    return ScriptedWorker()


def collect_kv_report(worker: KVWorker, output: SchedulerOutput,
               runner_output: ModelRunnerOutput) -> tuple[ModelRunnerOutput, set[str]]:
    """The worker runs the batch (synchronous loop): its report goes with
    the batch's output."""
    kv_output, failed = worker.capture(output.kv_connector_metadata)
    runner_output.kv_connector_output = kv_output
    return runner_output, failed


