"""Prefill/decode disaggregation: xPyD instances, a proxy, KV transfers.

A disaggregated deployment is ``x`` prefill instances and ``y`` decode
instances of one model, each role with its own engine arguments (TP size,
scheduler flags), joined by vLLM's NixlConnector (pull mode) and fronted by
the proxy of :mod:`kvsched.sim.proxy`. Each instance is one engine core with
its own scheduler (kvsched's exact core, with the NixlConnector's scheduler
side), its own step-time model, and a NIXL worker in simulated time
(:mod:`kvsched.sim.kv_transfer`) whose reads the transfer fabric prices.

With KV offloading (``--kv-offloading-size``, or a MultiConnector
``--kv-transfer-config`` with an OffloadingConnector child) every instance
runs vLLM's MultiConnector of NIXL and offloading (NIXL first unless the
JSON says otherwise: the first connector with a hit loads), with the
offloading worker of :mod:`kvsched.sim.offload_transfer` beside the NIXL
one (:class:`kvsched.sim.kv_transfer.MultiTimedWorker`). With NIXL first a
decode instance loads every prompt over NIXL, so its CPU tier stores but
never loads; a prefill instance's CPU hits shorten its prefills. vLLM's own
``--kv-offloading-size`` replaces a ``--kv-transfer-config`` connector
rather than adding to it: a real deployment needs the MultiConnector JSON.

Placement: instances fill scale-up domains (nodes) in order, prefill first;
an instance never straddles two domains. Two instances in one domain read
each other's KV over its scale-up fabric (NVLink), others over the
scale-out network.

What the client sees: the decode instances' tokens, timed from the client's
send (TTFT = prefill leg + hop + transfer + first decode step). The result
also gives each role's own figures, the transfers' bytes and times, and the
TTFT split.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.kv_connector import MULTI_CONNECTOR, KVConnectorBase, KVTransferConfig, multi_child_configs
from kvsched.core.multi_connector import MultiConnector
from kvsched.core.nixl_connector import NixlConnector
from kvsched.errors import UserInputError
from kvsched.sim.client import Client
from kvsched.sim.cluster import Cluster, Progress
from kvsched.sim.instance import EngineInstance
from kvsched.sim.kv_transfer import KVWorker, MultiTimedWorker, NixlTimedWorker, TransferFabric, transfer_path
from kvsched.sim.metrics import sum_present
from kvsched.sim.offload_transfer import (
    OffloadStats,
    OffloadTimedWorker,
    SimOffloadingConnector,
    transfer_config_offloading_gib,
)
from kvsched.sim.proxy import Proxy, prefill_engine_id
from kvsched.sim.rank import Rank, SimResult, combine_results
from kvsched.sim.router import Router
from kvsched.sim.simulator import SimConfig
from kvsched.sim.spec import PD_ROUTERS
from kvsched.sim.ttft_parts import FloatArray, disaggregated_parts
from kvsched.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class PDConnectors:
    """What each instance's connector is, from ``--kv-transfer-config``:
    ``config`` the instance's own (role, load-failure policy), ``nixl`` the
    NIXL connector's, whether an offloading child comes before NIXL, and
    the CPU GiB the JSON's offloading child asks for (None: none; then
    ``--kv-offloading-size`` decides)."""

    config: KVTransferConfig
    nixl: KVTransferConfig
    offload_first: bool = False
    offload_gib: float | None = None


def pd_connectors(config: KVTransferConfig | None) -> PDConnectors:
    """The connectors of a disaggregated deployment's instances (None:
    NixlConnector, ``kv_both``): a NixlConnector, or a MultiConnector of
    exactly one NixlConnector and at most one OffloadingConnector. The one
    owner of that rule."""
    if config is None:
        config = KVTransferConfig(kv_role="kv_both", kv_connector="NixlConnector")
    if config.kv_connector != MULTI_CONNECTOR:
        return PDConnectors(config, config)
    children = multi_child_configs(config)
    names = [c.kv_connector for c in children]
    nixl = [i for i, name in enumerate(names) if name in ("NixlConnector", "NixlPullConnector")]
    offload = [i for i, name in enumerate(names) if name == "OffloadingConnector"]
    if len(nixl) != 1 or len(offload) > 1:
        raise UserInputError(f"--kv-transfer-config: a MultiConnector of {names}: with --disaggregation "
                             "give exactly one NixlConnector (the P/D transfer) and at most one "
                             "OffloadingConnector")
    return PDConnectors(config, children[nixl[0]], bool(offload) and offload[0] < nixl[0],
                        transfer_config_offloading_gib(config))


@dataclass(frozen=True, slots=True)
class RoleConfig:
    """One role's engine as simulated: its settings, its instances' TP
    size, and how many instances."""

    sim: SimConfig
    tensor_parallel_size: int
    instances: int


@dataclass(slots=True)
class DisaggResult:
    """The client's view (``combined``: every decode rank's requests) and
    each role's ranks, with the transfers and the TTFT split."""

    prefill: list[SimResult]
    decode: list[SimResult]
    combined: SimResult
    kv_transfer: dict[str, Any] = field(default_factory=dict)
    ttft_split: dict[str, float] = field(default_factory=dict)
    # With offloading: each role's prefix-cache hit rate by tier and traffic.
    kv_offload_by_role: dict[str, Any] = field(default_factory=dict)
    # Each completed request's TTFT parts in seconds, aligned with
    # ``combined.records`` (kvsched.sim.ttft_parts).
    ttft_parts: dict[str, FloatArray] = field(default_factory=dict)


def node_of_instances(sizes: list[int], domain: int) -> list[int]:
    """The scale-up domain of each instance (``sizes``: GPUs each), placed
    in order, none straddling two domains."""
    nodes: list[int] = []
    node, used = 0, 0
    for n in sizes:
        if used and used + n > domain:
            node += max(1, -(-used // domain))
            used = 0
        nodes.append(node)
        used += n
        if used >= domain:
            node += used // domain
            used = 0
    return nodes


class DisaggregatedSimulator:
    """xPyD instances of one model on one kind of hardware."""

    def __init__(self, prefill: RoleConfig, decode: RoleConfig, workload: Workload, *,
                 model: Any, hardware: Any, kv_dtype_bytes: float,
                 kv_transfer_config: KVTransferConfig | None = None,
                 router: str = "round-robin", progress: Progress | None = None) -> None:
        if router not in PD_ROUTERS:
            raise UserInputError(f"--router={router!r}: with --disaggregation use one of "
                                 f"{', '.join(PD_ROUTERS)}")
        block_size = prefill.sim.cache_config.block_size
        if decode.sim.cache_config.block_size != block_size:
            raise UserInputError(f"--block-size: prefill instances use {block_size}, decode instances "
                                 f"{decode.sim.cache_config.block_size}; give both roles the same block size")
        layout = pd_connectors(kv_transfer_config)
        config, nixl_config = layout.config, layout.nixl
        sizes = ([prefill.tensor_parallel_size] * prefill.instances
                 + [decode.tensor_parallel_size] * decode.instances)
        nodes = node_of_instances(sizes, hardware.scaleup_domain)
        paths = {(i, j): transfer_path(hardware, nodes[i] == nodes[j])
                 for i in range(prefill.instances) for j in range(prefill.instances, len(sizes))}
        self.fabric = TransferFabric(model, kv_dtype_bytes, sizes, paths, hardware)
        engines = {prefill_engine_id(i): i for i in range(prefill.instances)}
        workers: dict[int, NixlTimedWorker] = {}
        ranks: list[Rank] = []
        instances: list[EngineInstance] = []
        for i, role in enumerate([prefill] * prefill.instances + [decode] * decode.instances):
            is_prefill = i < prefill.instances
            engine_id = prefill_engine_id(i) if is_prefill else f"decode-{i - prefill.instances}"
            nixl = NixlConnector(KVTransferConfig(
                kv_role=nixl_config.kv_role, kv_load_failure_policy=config.kv_load_failure_policy,
                kv_connector="NixlConnector", kv_connector_extra_config=nixl_config.kv_connector_extra_config,
                engine_id=engine_id), block_size)
            nixl_worker = workers[i] = NixlTimedWorker(i, block_size, self.fabric, engines, workers)
            sim = role.sim
            connector: KVConnectorBase = nixl
            worker: KVWorker = nixl_worker
            if sim.offload is not None:
                # vLLM's MultiConnector of NIXL and offloading, in the configured order.
                stats = OffloadStats()
                offload = SimOffloadingConnector(sim.offload, block_size,
                                                 sim.cache_config.enable_prefix_caching, stats,
                                                 sim.scheduler_config.vllm_version)
                offload_worker = OffloadTimedWorker(sim.offload, stats,
                                                    sim.scheduler_config.async_scheduling)
                first = layout.offload_first
                connector = MultiConnector(KVTransferConfig(
                    kv_role=config.kv_role, kv_load_failure_policy=config.kv_load_failure_policy,
                    kv_connector=MULTI_CONNECTOR, engine_id=engine_id),
                    [offload, nixl] if first else [nixl, offload], sim.scheduler_config.vllm_version)
                worker = MultiTimedWorker([offload_worker, nixl_worker] if first
                                          else [nixl_worker, offload_worker])
            rank = Rank(sim.scheduler_config, sim.cache_config, workload_name=workload.name,
                        eos_probability=sim.eos_probability, seed=sim.seed + i,
                        keep_token_times=sim.keep_token_times, keep_step_log=sim.keep_step_log,
                        speculative=sim.speculative, kv_connector=connector, kv_worker=worker,
                        hands_off=is_prefill, request_timeout=workload.request_timeout,
                        encoder=sim.encoder)
            connector.bind_kv_cache_manager(rank.sched.kv_cache_manager)
            ranks.append(rank)
            instances.append(EngineInstance(rank, sim.step_model, sim.fast_forward))
        self.ranks = ranks
        self.num_prefill = prefill.instances
        self.workers = workers
        self.proxy = Proxy(list(range(prefill.instances)), list(range(prefill.instances, len(sizes))),
                           Router(router, prefill.instances), Router(router, decode.instances), block_size,
                           arrival=decode.sim.step_model.host)
        self.cluster = Cluster(instances, Client(workload), Router("round-robin", len(ranks)),
                               progress=progress, arrival=prefill.sim.step_model.host, proxy=self.proxy)

    def run(self) -> DisaggResult:
        results = self.cluster.run()
        prefill, decode = results[:self.num_prefill], results[self.num_prefill:]
        combined = combine_results(decode)
        for r in prefill:
            # Requests a prefill instance refused (or aborted: the client gave
            # up) never reached a decode one.
            combined.failed.extend(r.failed)
            combined.last_timeout = max(combined.last_timeout, r.last_timeout)
        by_role = {}
        for name, results in (("prefill", prefill), ("decode", decode)):
            stats = sum_present(r.kv_offload for r in results)
            if stats is not None:
                by_role[name] = stats.metrics(sum(r.prefix_cache_queries for r in results),
                                              sum(r.prefix_cache_hits for r in results))
        legs = combine_results(prefill)
        parts = disaggregated_parts(combined.records, combined.phases, legs.records, legs.phases,
                                    offloading=bool(by_role))
        return DisaggResult(prefill, decode, combined, self._transfers(), self._ttft_split(decode), by_role,
                            parts)

    def _transfers(self) -> dict[str, Any]:
        stats = self.fabric.stats
        ms = sorted(1e3 * s for s in stats.seconds)
        out: dict[str, Any] = {"count": stats.count, "bytes": stats.bytes}
        if ms:
            out["mean_ms"] = statistics.fmean(ms)
            out["p99_ms"] = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
            out["mean_queued_ms"] = 1e3 * statistics.fmean(stats.queued_seconds)
        paths = sorted({p.name for p in self.fabric.paths.values()})
        out["paths"] = paths
        return out

    def _ttft_split(self, decode: list[SimResult]) -> dict[str, float]:
        """Mean milliseconds of each part of TTFT over the requests served:
        the prefill leg (queue and prefill on the prefill instance), the hop
        to the decode instance, the wait for the read and the read itself,
        and the rest (waiting for and running the first decode step)."""
        reads: dict[str, tuple[float, float]] = {}
        for i in range(self.num_prefill, len(self.ranks)):
            reads.update(self.workers[i].reads)
        parts: dict[str, list[float]] = {"prefill_leg_ms": [], "hop_ms": [], "kv_wait_and_read_ms": [],
                                         "decode_first_step_ms": []}
        for result in decode:
            for rec in result.records:
                legs = self.proxy.legs.get(rec.request_id)
                if legs is None or legs.prefill_done < 0:
                    continue
                parts["prefill_leg_ms"].append(1e3 * (legs.prefill_done - legs.sent))
                parts["hop_ms"].append(1e3 * (legs.decode_arrival - legs.prefill_done))
                read = reads.get(rec.request_id)
                ready = legs.decode_arrival if read is None else read[1]
                parts["kv_wait_and_read_ms"].append(1e3 * (ready - legs.decode_arrival))
                parts["decode_first_step_ms"].append(1e3 * (rec.first_token_time - ready))
        return {k: statistics.fmean(v) for k, v in parts.items() if v}
