"""KV offloading to CPU memory in simulated time (vLLM's native backend).

``vllm serve --kv-offloading-size GIB`` (``--kv-offloading-backend native``,
the default) gives every engine core vLLM's OffloadingConnector with a CPU
cache of ``GIB`` GiB summed over its tensor-parallel ranks: each GPU block's
KV is copied to host memory after it is computed (a store, device to host)
and copied back when a later prompt's prefix misses the GPU prefix cache but
hits the CPU one (a load, host to device), so hits survive GPU eviction.
kvsched's core has the connector's scheduler side
(:class:`kvsched.core.offloading_connector.OffloadingConnector`, exact
against vLLM); this module is the rest:

- :func:`num_cpu_blocks` is vLLM's sizing rule (the one owner): the GiB as
  bytes over one chunk's bytes on every rank, page aligned.
- :class:`OffloadConfig` is what a deployment with offloading knows: CPU
  capacity, KV bytes per block per rank, the host link's bandwidth
  (:func:`host_link_bandwidth`), and the price of a job
  (:meth:`OffloadConfig.job_seconds`).
- :class:`OffloadTimedWorker` is the connector's worker side in simulated
  time, with the same three methods as the NIXL worker
  (:class:`kvsched.sim.kv_transfer.NixlTimedWorker`).
- :class:`OffloadStats` counts the CPU tier's hits and the traffic.

The worker follows the oracle's scripted worker
(:class:`kvsched.core.offloading_connector.OffloadingWorker`) for *when* a
job is submitted, and prices it: a job moves its GPU blocks x bytes per
block per rank; every tensor-parallel rank moves its own share over its own
host link at the same time, so a job takes ``blocks x bytes per block per
rank / host-link bandwidth``. Each direction is one FIFO queue (loads
host-to-device, stores device-to-host), so a burst of jobs waits behind
itself.

- A batch's stores are submitted when the batch has computed the KV they
  copy (vLLM's worker defers them by one batch): at the engine's next
  report, a batch end or an idle step; with async scheduling the batch
  scheduled while another runs keeps its stores until its own end. A
  store is reported complete with the first report at or after its end.
- Jobs listed in ``jobs_to_flush`` (a preempted request's jobs, a finished
  request's stores whose GPU blocks are handed out again) are submitted at
  once if not yet submitted and are reported complete with the batch
  (vLLM's worker waits for them before the batch runs).
- Synchronous loads are reported complete with their batch; asynchronous
  loads start when their batch is scheduled and are reported (their request
  in ``finished_recving``) with the first report at or after their end.

Not modelled: the time a flush or a synchronous load adds to its step
(vLLM's worker waits for them before the forward pass; here the step takes
its usual time, the copies only occupy their queue), a fixed per-job
latency, the memory bandwidth the copies take from the steps beside them
(at most the host link's share of the GPU's memory bandwidth while a copy
runs: 1.9 % on H100 SXM; the copy itself runs no faster than the GPU's
memory, :meth:`Hardware.copy_bw`, a floor no catalog device reaches), the
host link's achievable fraction of its peak (the catalog's peak is used),
host memory bandwidth, and several TP ranks sharing one host link (each
rank has its own).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvsched.core.kv_connector import MULTI_CONNECTOR, KVTransferConfig, multi_child_configs
from kvsched.core.offloading_connector import OffloadingConnector, OffloadingMetadata, OffloadingWorkerMeta
from kvsched.core.output import KVConnectorOutput
from kvsched.errors import UserInputError
from kvsched.fields import is_number
from kvsched.jsonfile import show
from kvsched.perf.hardware import Hardware
from kvsched.perf.models import ModelSpec
from kvsched.request import Request
from kvsched.vllm_versions import DEFAULT_VLLM_VERSION

__all__ = [
    "CPU_PAGE_BYTES",
    "OFFLOADING_BACKENDS",
    "OffloadConfig",
    "OffloadStats",
    "OffloadTimedWorker",
    "SimOffloadingConnector",
    "check_offloading_options",
    "host_link_bandwidth",
    "make_offload_config",
    "num_cpu_blocks",
    "transfer_config_offloading_gib",
]

# vLLM's --kv-offloading-backend values; kvsched simulates the native one.
OFFLOADING_BACKENDS = ("native", "lmcache")
GIB = 1 << 30
# vLLM's CPUOffloadingSpec aligns a chunk's bytes to the host page size
# (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE: 4 KiB on the
# x86-64 and arm64 Linux hosts GPU servers run).
CPU_PAGE_BYTES = 4096
# Bigger than any host holds (64 TiB): a larger figure is a unit mistake.
MAX_OFFLOADING_GIB = float(1 << 16)


def check_offloading_options(size: object, backend: object) -> None:
    """``--kv-offloading-size`` and ``--kv-offloading-backend`` on their own
    (the one check, for flags and run specs alike)."""
    if backend not in OFFLOADING_BACKENDS:
        raise UserInputError(f"kv_offloading_backend={show(backend)} (--kv-offloading-backend): use one of "
                             f"{', '.join(OFFLOADING_BACKENDS)} (vLLM's)")
    if size is None:
        return
    if (not is_number(size) or not math.isfinite(size)
            or not 0 < size <= MAX_OFFLOADING_GIB):
        raise UserInputError(f"kv_offloading_size={show(size)} (--kv-offloading-size): must be a number of "
                             f"GiB in (0, {MAX_OFFLOADING_GIB:g}] (the CPU KV cache of one engine core, "
                             "summed over its tensor-parallel ranks, as vLLM reads it)")
    if backend == "lmcache":
        raise UserInputError("kv_offloading_backend='lmcache' (--kv-offloading-backend): kvsched simulates "
                             "vLLM's native OffloadingConnector only (LMCache runs its own server and "
                             "policies); use --kv-offloading-backend native")


def transfer_config_offloading_gib(config: KVTransferConfig) -> float | None:
    """The CPU offloading a ``--kv-transfer-config`` asks for: its
    MultiConnector's OffloadingConnector child's ``cpu_bytes_to_use`` in GiB
    (None: no such child). The simulator prices vLLM's defaults for the
    child's other settings, so any other setting is refused by name."""
    if config.kv_connector != MULTI_CONNECTOR:
        return None
    for i, child in enumerate(multi_child_configs(config)):
        if child.kv_connector != "OffloadingConnector":
            continue
        where = f"--kv-transfer-config: kv_connector_extra_config.connectors[{i}].kv_connector_extra_config"
        extra = child.kv_connector_extra_config
        for key in extra:
            if key != "cpu_bytes_to_use":
                raise UserInputError(f"{where}.{key}: kvsched simulates the OffloadingConnector with vLLM's "
                                     "defaults and cpu_bytes_to_use only; remove the setting")
        size = extra.get("cpu_bytes_to_use")
        if not is_number(size) or not size > 0:
            raise UserInputError(f"{where}.cpu_bytes_to_use={show(size)}: give the CPU KV cache's bytes "
                                 "(vLLM refuses an OffloadingConnector without it), e.g. 8589934592 "
                                 "for 8 GiB")
        gib = float(size) / GIB
        check_offloading_options(gib, "native")
        return gib
    return None


def num_cpu_blocks(size_gib: float, bytes_per_block_per_rank: int, world_size: int,
                   blocks_per_chunk: int = 1, replicated: bool = False) -> int:
    """vLLM's CPU cache capacity in offload chunks for ``--kv-offloading-size
    size_gib``: ``size_gib`` x 2**30 bytes (``cpu_bytes_to_use``, summed over
    the engine core's ``world_size`` ranks) over one chunk's bytes on every
    rank (``replicated``: one copy for all, vLLM's layout for MLA under TP),
    rounded up to the host page. The one owner of that rule."""
    copies = 1 if replicated else world_size
    chunk = bytes_per_block_per_rank * copies * blocks_per_chunk
    aligned = -(-chunk // CPU_PAGE_BYTES) * CPU_PAGE_BYTES
    return int(size_gib * GIB) // aligned


def host_link_bandwidth(hardware: Hardware) -> float:
    """Bytes/s one GPU moves to or from host memory (per direction): the
    hardware data's ``host_link_bw`` at the rate a copy from or into the
    GPU's memory reaches over it (:meth:`Hardware.copy_bw`), refused when
    it has none."""
    if hardware.host_link_bw is None:
        raise UserInputError(
            f"--kv-offloading-size: {hardware.name} ({hardware.id}) has no host_link_bw in the hardware "
            "data, so KV stores and loads to CPU memory cannot be priced; use a hardware file with "
            "host_link_bw (bytes/s per GPU per direction: PCIe Gen4 x16 32e9, Gen5 x16 64e9) or drop "
            "--kv-offloading-size")
    return hardware.copy_bw(hardware.host_link_bw)


@dataclass(frozen=True, slots=True)
class OffloadConfig:
    """One engine core's CPU offloading as simulated: ``size_gib`` (vLLM's
    ``--kv-offloading-size``), the CPU cache's ``num_cpu_blocks`` (chunks of
    one GPU block), ``bytes_per_block`` the KV of one GPU block on one TP
    rank, ``tensor_parallel_size`` ranks, and ``host_link_bw`` bytes/s per
    rank and direction."""

    size_gib: float
    num_cpu_blocks: int
    bytes_per_block: int
    tensor_parallel_size: int
    host_link_bw: float

    def job_seconds(self, num_blocks: int) -> float:
        """How long one job of ``num_blocks`` GPU blocks takes on the link:
        every rank moves its own share in parallel. The one owner of it."""
        return num_blocks * self.bytes_per_block / self.host_link_bw

    def job_bytes(self, num_blocks: int) -> float:
        """The bytes a job of ``num_blocks`` GPU blocks moves over every rank."""
        return float(num_blocks * self.bytes_per_block * self.tensor_parallel_size)

    def transfer_config(self) -> KVTransferConfig:
        """The KVTransferConfig ``--kv-offloading-backend native`` makes (vLLM's
        ``_post_init_kv_transfer_config``)."""
        return KVTransferConfig(kv_role="kv_both", kv_connector="OffloadingConnector",
                                kv_connector_extra_config={"cpu_bytes_to_use": self.size_gib * GIB})


def make_offload_config(size_gib: float | None, model: ModelSpec, hardware: Hardware,
                        tensor_parallel_size: int, bytes_per_block: float,
                        drafter_kv_layers: int = 0) -> OffloadConfig | None:
    """The offloading of a deployment (None without ``--kv-offloading-size``):
    what the core's connector cannot rebuild is refused here, by name."""
    if size_gib is None:
        return None
    if model.num_sliding_layers:
        raise UserInputError(f"--kv-offloading-size with {model.name}: its sliding-window layers make a "
                             "second KV group, and kvsched's OffloadingConnector rebuilds one "
                             "full-attention group; drop --kv-offloading-size or use a model with full "
                             "attention only")
    if drafter_kv_layers:
        raise UserInputError("--kv-offloading-size with a drafter model (--speculative-config): its KV "
                             "layers make a second KV group the OffloadingConnector is not rebuilt for; "
                             "drop one of them (ngram drafting works with offloading)")
    bandwidth = host_link_bandwidth(hardware)
    per_block = int(bytes_per_block)
    replicated = model.is_mla and tensor_parallel_size > 1
    blocks = num_cpu_blocks(size_gib, per_block, tensor_parallel_size, replicated=replicated)
    if blocks < 1:
        raise UserInputError(f"--kv-offloading-size={show(size_gib)}: holds no KV block of {model.name} "
                             f"({per_block * tensor_parallel_size:,} bytes over {tensor_parallel_size} "
                             "rank(s)); vLLM refuses an empty CPU cache: give more GiB")
    return OffloadConfig(size_gib, blocks, per_block, tensor_parallel_size, bandwidth)


@dataclass(slots=True)
class OffloadStats:
    """One engine core's CPU tier: the prompt tokens its lookups found in
    CPU memory (loaded instead of computed), and every job priced: count,
    bytes (all ranks) and, per job, its time from submission to done
    (queueing included)."""

    num_cpu_blocks: int = 0
    cpu_hit_tokens: int = 0
    store_count: int = 0
    store_bytes: float = 0.0
    store_seconds: list[float] = field(default_factory=list)
    load_count: int = 0
    load_bytes: float = 0.0
    load_seconds: list[float] = field(default_factory=list)

    def merge(self, other: OffloadStats) -> None:
        """Add another engine core's CPU tier."""
        self.num_cpu_blocks += other.num_cpu_blocks
        self.cpu_hit_tokens += other.cpu_hit_tokens
        self.store_count += other.store_count
        self.store_bytes += other.store_bytes
        self.store_seconds.extend(other.store_seconds)
        self.load_count += other.load_count
        self.load_bytes += other.load_bytes
        self.load_seconds.extend(other.load_seconds)

    def metrics(self, queries: int, gpu_hits: int) -> dict[str, Any]:
        """The result keys: the prefix-cache hit rate by tier (tokens found
        over tokens looked up: ``gpu_hits`` in the GPU prefix cache, this
        tier's in CPU memory) and the offload traffic."""
        def share(n: int) -> float:
            return n / queries if queries else 0.0
        offload: dict[str, Any] = {
            "num_cpu_blocks": self.num_cpu_blocks,
            "cpu_hit_tokens": self.cpu_hit_tokens,
            "stores": self.store_count, "store_bytes": self.store_bytes,
            "loads": self.load_count, "load_bytes": self.load_bytes,
        }
        for name, seconds in (("store", self.store_seconds), ("load", self.load_seconds)):
            if seconds:
                ms = sorted(1e3 * s for s in seconds)
                offload[f"mean_{name}_ms"] = statistics.fmean(ms)
                offload[f"p99_{name}_ms"] = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
        return {
            "prefix_cache_hit_rate_by_tier": {"gpu": share(gpu_hits), "cpu": share(self.cpu_hit_tokens),
                                              "total": share(gpu_hits + self.cpu_hit_tokens)},
            "kv_offload": offload,
        }


class SimOffloadingConnector(OffloadingConnector):
    """The core's OffloadingConnector, counting the tokens each admission
    loads from CPU memory (vLLM's external prefix-cache hits) into
    ``stats``: the CPU tier's share of the prefix-cache hit rate.
    ``vllm_version``: the release whose rules apply (SchedulerConfig's)."""

    def __init__(self, config: OffloadConfig, block_size: int, enable_prefix_caching: bool,
                 stats: OffloadStats, vllm_version: str = DEFAULT_VLLM_VERSION) -> None:
        super().__init__(config.transfer_config(), block_size, config.num_cpu_blocks,
                         enable_prefix_caching=enable_prefix_caching, vllm_version=vllm_version)
        self.stats = stats

    def update_state_after_alloc(self, request: Request, block_ids: list[int],
                                 num_external_tokens: int) -> None:
        super().update_state_after_alloc(request, block_ids, num_external_tokens)
        self.stats.cpu_hit_tokens += num_external_tokens


class _Queue:
    """One direction of the host link: jobs run one at a time, in order."""

    __slots__ = ("free",)

    def __init__(self) -> None:
        self.free = 0.0

    def run(self, start: float, seconds: float) -> float:
        """A job submitted at ``start`` taking ``seconds``: when it is done."""
        begin = start if start > self.free else self.free
        self.free = begin + seconds
        return self.free


class OffloadTimedWorker:
    """The OffloadingConnector's worker side in simulated time (see the
    module). ``async_scheduling``: the engine keeps a second batch in flight,
    whose stores wait for its own end."""

    def __init__(self, config: OffloadConfig, stats: OffloadStats, async_scheduling: bool = False) -> None:
        self.config = config
        self.stats = stats
        stats.num_cpu_blocks = config.num_cpu_blocks
        self._loads = _Queue()   # host to device
        self._stores = _Queue()  # device to host
        self._in_flight = 1 if async_scheduling else 0
        # Each scheduled batch's store jobs, not submitted yet, oldest first.
        self._unsubmitted: deque[dict[int, int]] = deque()
        self._last_start = -math.inf
        # Submitted, not reported: job id -> done time.
        self._due: dict[int, float] = {}
        # Reported with the next report, whatever their time (flushes, sync loads).
        self._with_batch: set[int] = set()
        # Asynchronous loads in flight: job id -> request id.
        self._recv: dict[int, str] = {}
        # Each request's first asynchronous load: request id -> (start, done)
        # (the TTFT split's load, kvsched.sim.ttft_parts).
        self.loads: dict[str, tuple[float, float]] = {}

    def next_due(self) -> float:
        """The earliest time this worker has something to report (inf: none)."""
        if self._with_batch or len(self._unsubmitted) > self._in_flight:
            return -math.inf
        return min(self._due.values(), default=math.inf)

    def _store(self, job_id: int, num_blocks: int, now: float) -> float:
        cfg, stats = self.config, self.stats
        done = self._stores.run(now, cfg.job_seconds(num_blocks))
        stats.store_count += 1
        stats.store_bytes += cfg.job_bytes(num_blocks)
        stats.store_seconds.append(done - now)
        return done

    def start(self, meta: object, now: float) -> None:
        """A batch scheduled at ``now`` with connector metadata ``meta``."""
        if not isinstance(meta, OffloadingMetadata):
            return
        self._last_start = now
        stores = {j: len(job.gpu_block_ids) for j, job in meta.store_jobs.items()}
        for job_id in meta.jobs_to_flush:
            if job_id in stores:
                self._store(job_id, stores.pop(job_id), now)
                self._with_batch.add(job_id)
                continue
            for group in self._unsubmitted:
                if job_id in group:
                    self._store(job_id, group.pop(job_id), now)
                    self._with_batch.add(job_id)
                    break
            else:
                if self._due.pop(job_id, None) is not None:
                    self._with_batch.add(job_id)
        self._unsubmitted.append(stores)
        cfg, stats = self.config, self.stats
        for job_id, job in meta.load_jobs.items():
            n = len(job.gpu_block_ids)
            done = self._loads.run(now, cfg.job_seconds(n))
            stats.load_count += 1
            stats.load_bytes += cfg.job_bytes(n)
            stats.load_seconds.append(done - now)
            if job.sync:
                self._with_batch.add(job_id)
            else:
                self._due[job_id] = done
                self._recv[job_id] = job.req_id
                self.loads.setdefault(job.req_id, (now, done))

    def report(self, end: float) -> KVConnectorOutput | None:
        """What is done by ``end`` (None: nothing). The stores of batches
        that have ended are submitted first."""
        keep = self._in_flight if end > self._last_start else 0
        while len(self._unsubmitted) > keep:
            for job_id, n in self._unsubmitted.popleft().items():
                self._due[job_id] = self._store(job_id, n, end)
        done = self._with_batch
        self._with_batch = set()
        for job_id, t in list(self._due.items()):
            if t <= end:
                done.add(job_id)
                del self._due[job_id]
        if not done:
            return None
        recv = {self._recv.pop(j) for j in done if j in self._recv}
        return KVConnectorOutput(finished_recving=recv, kv_connector_worker_meta=OffloadingWorkerMeta(done))
