"""KV transfers between simulated instances: what they cost and when they end.

Prefill/decode disaggregation moves each prompt's KV from the prefill
instance that computed it to the decode instance that continues it. vLLM's
NixlConnector does it in pull mode: the decode worker reads the prefill
instance's blocks (one RDMA read per block range, every tensor-parallel rank
its own KV heads, in parallel) and, when the read is done, tells the prefill
side, which frees the blocks it held. kvsched's core has the scheduler side
of both ends (:class:`kvsched.core.nixl_connector.NixlConnector`); this
module is the worker side, in simulated time:

- :class:`TransferFabric` prices a read: the bytes one rank moves
  (:func:`transfer_bytes_per_rank`) over the path between the two instances
  (:func:`transfer_path`: the scale-up fabric, NVLink, when both sit in one
  scale-up domain; the scale-out network, a GPU's share of the node's RDMA
  NICs, otherwise), plus the path's latency. Reads queue: an instance's
  ports carry one read at a time in each direction, first come first served,
  so a burst of hand-offs waits behind itself (contention).
- :class:`NixlTimedWorker` is one instance's NIXL worker: it starts the reads
  a batch's metadata asks for when the batch starts, and reports each read
  done (``finished_recving``) with the first batch that ends after it; on
  the prefill side it reports blocks sent (``finished_sending``) once the
  decode side's read is done or the lease (``kv_lease_duration``) ran out.

A read is a DMA copy (NIXL over UCX: GPUDirect RDMA, the NIC reading and
writing GPU memory; CUDA IPC copies over NVLink within a node): it reads
the prefill GPU's memory and writes the decode GPU's, so it runs no faster
than either memory (:meth:`kvsched.perf.hardware.Hardware.copy_bw`, a floor
that no catalog device reaches: its links are at most a quarter of its
memory bandwidth).

Not modelled: load failures (every read succeeds), a read that overlaps the
prefill still being computed (vLLM reads only finished requests), the
memory bandwidth a read takes from the steps that run beside it on either
GPU (at most the link's share of it while the read runs: 13 % on H100 SXM's
NVLink, 1.5 % on its 50 GB/s NIC; no published measurement of a DMA copy's
effect on an LLM step to calibrate it; docs/simulator.md, "KV copies and
GPU memory bandwidth").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from kvsched.core.kv_connector import KVConnectorOutput
from kvsched.core.multi_connector import MultiKVConnectorMetadata, combine_reports
from kvsched.core.nixl_connector import NixlMetadata
from kvsched.errors import UserInputError
from kvsched.perf.hardware import Hardware
from kvsched.perf.kv_cache_planning import INDEXER_QUANT_BLOCK, attention_bytes_per_token
from kvsched.perf.models import ModelSpec


class KVWorker(Protocol):
    """A KV connector's worker side in simulated time, as a rank drives it:
    ``start`` when a batch is scheduled, ``report`` at each batch end or
    idle step, ``next_due`` for when an idle engine should look again
    (:class:`NixlTimedWorker`; the offloading one in
    kvsched.sim.offload_transfer)."""

    def start(self, meta: object, now: float) -> None: ...

    def report(self, end: float) -> KVConnectorOutput | None: ...

    def next_due(self) -> float: ...


class MultiTimedWorker:
    """The worker side of vLLM's MultiConnector in simulated time: each
    child's timed worker (NIXL, offloading) gets its own metadata of every
    batch, and their reports are combined as vLLM's worker-side
    MultiConnector combines them (kvsched.core.multi_connector.combine_reports)."""

    def __init__(self, workers: list[KVWorker]) -> None:
        self.workers = workers
        self._pending_saves: dict[str, int] = {}

    def start(self, meta: object, now: float) -> None:
        if not isinstance(meta, MultiKVConnectorMetadata):
            return
        if meta.extra_async_saves:
            self._pending_saves.update(meta.extra_async_saves)
        for worker, child_meta in zip(self.workers, meta.metadata, strict=True):
            worker.start(child_meta, now)

    def report(self, end: float) -> KVConnectorOutput | None:
        return combine_reports([w.report(end) for w in self.workers], self._pending_saves)

    def next_due(self) -> float:
        return min(w.next_due() for w in self.workers)


@dataclass(frozen=True, slots=True)
class TransferPath:
    """How two instances reach each other: ``name`` (``nvlink`` or ``rdma``),
    bytes per second per GPU and direction, and a fixed latency per read."""

    name: str
    bandwidth: float
    latency_s: float


def transfer_path(hardware: Hardware, same_domain: bool) -> TransferPath:
    """The path between two instances on ``hardware``: its scale-up fabric
    when both lie in one scale-up domain, else its scale-out network (the
    hardware data's per-GPU ``scaleout_bw``), at the rate a copy between the
    two GPUs' memories reaches over it (:meth:`Hardware.copy_bw`). The one
    owner of that rule."""
    latency = hardware.comm_latency_s
    # A read moves bytes from one GPU's memory into another's: no faster
    # than either memory (Hardware.copy_bw; both roles run on one hardware).
    if same_domain:
        return TransferPath(hardware.scaleup_kind, hardware.copy_bw(hardware.scaleup_bw), latency)
    if hardware.scaleout_bw is None:
        raise UserInputError(
            f"{hardware.name}: the prefill and decode instances do not fit in one "
            f"{hardware.scaleup_kind} domain of {hardware.scaleup_domain} devices, so their KV "
            "crosses the scale-out network, and the hardware data gives no scale-out bandwidth; use "
            "a hardware file with scaleout_bw (bytes/s per GPU per direction), or fewer instances")
    return TransferPath("rdma", hardware.copy_bw(hardware.scaleout_bw), latency)


def transfer_bytes_per_rank(model: ModelSpec, kv_dtype_bytes: float, tensor_parallel_size: int,
                            num_tokens: int, hardware: Hardware) -> float:
    """KV bytes one tensor-parallel rank holds for ``num_tokens`` tokens of
    one request (full-attention layers hold every token, sliding-window
    layers at most their window): what that rank sends or receives.

    Hybrid models: Llama 4's chunked local layers hold every token too (vLLM
    pages them as full attention, the hybrid manager being off for chunked
    local attention), DeepSeek Sparse Attention's blocks also hold the
    indexer keys of each layer with an indexer; a linear-attention / Mamba
    state is not sized for transfer."""
    per_layer = attention_bytes_per_token(model, kv_dtype_bytes, tensor_parallel_size, hardware)
    window = model.sliding_window if model.num_sliding_layers else 0
    h = model.hybrid
    if h is not None and (h.num_linear_layers or h.num_mamba_layers):
        raise UserInputError(f"{model.name}: a P/D KV transfer of its linear-attention / Mamba state is not "
                             "modelled by kvsched; drop --disaggregation")
    full = model.num_full_attention_layers + (h.num_chunked_layers if h is not None else 0)
    index = 0.0
    if h is not None and h.index_topk:
        index = (h.index_head_dim + h.index_head_dim // INDEXER_QUANT_BLOCK * 4) * model.num_index_layers
    return (full * num_tokens + model.num_sliding_layers * min(num_tokens, window)) * per_layer \
        + index * num_tokens


@dataclass(slots=True)
class TransferStats:
    """Every read the fabric priced: count, bytes (all ranks), and per read
    its time from request to done, and its time waiting for a busy port."""

    count: int = 0
    bytes: float = 0.0
    seconds: list[float] = field(default_factory=list)
    queued_seconds: list[float] = field(default_factory=list)


class TransferFabric:
    """The ports of every instance (index) and the paths between them.
    ``paths[(src, dst)]``: the path from instance ``src`` to ``dst``;
    ``tensor_parallel[i]``: instance ``i``'s TP size."""

    def __init__(self, model: ModelSpec, kv_dtype_bytes: float, tensor_parallel: list[int],
                 paths: dict[tuple[int, int], TransferPath], hardware: Hardware) -> None:
        self.model = model
        self.hardware = hardware
        self.kv_dtype_bytes = kv_dtype_bytes
        self.tensor_parallel = tensor_parallel
        self.paths = paths
        self._egress_free = [0.0] * len(tensor_parallel)
        self._ingress_free = [0.0] * len(tensor_parallel)
        self.stats = TransferStats()

    def read(self, src: int, dst: int, start: float, num_tokens: int) -> float:
        """A read of ``num_tokens`` tokens' KV from instance ``src`` by ``dst``
        asked for at ``start``: when it is done. Every rank moves its own
        share in parallel; the slower side (fewer ranks, more bytes each)
        sets the time."""
        path = self.paths[(src, dst)]
        tp_dst = self.tensor_parallel[dst]
        received = transfer_bytes_per_rank(self.model, self.kv_dtype_bytes, tp_dst, num_tokens, self.hardware)
        sent = transfer_bytes_per_rank(self.model, self.kv_dtype_bytes, self.tensor_parallel[src], num_tokens,
                                       self.hardware)
        per_rank = max(received, sent)
        begin = max(start, self._egress_free[src], self._ingress_free[dst])
        done = begin + path.latency_s + per_rank / path.bandwidth
        self._egress_free[src] = self._ingress_free[dst] = done
        stats = self.stats
        stats.count += 1
        stats.bytes += received * tp_dst  # what the decode side's ranks receive, together
        stats.seconds.append(done - start)
        stats.queued_seconds.append(begin - start)
        return done


class NixlTimedWorker:
    """One instance's NIXL worker side in simulated time (see the module).
    ``index``: the instance's index in the fabric; ``block_size``: its
    cache's; ``instance_of_engine``: the fabric index of an instance by its
    engine id (the prefill side's ``remote_engine_id``); ``peers``: every
    worker by fabric index (a read tells its source when it will be done).

    A report is made when the instance asks (each batch's end, or an idle
    step): a prefill instance that sits idle holds its sent blocks until
    then, which changes nothing it decides, since it decides only when it
    steps."""

    def __init__(self, index: int, block_size: int, fabric: TransferFabric,
                 instance_of_engine: dict[str, int], peers: dict[int, NixlTimedWorker]) -> None:
        self.index = index
        self.block_size = block_size
        self.fabric = fabric
        self.instance_of_engine = instance_of_engine
        self.peers = peers
        # Decode side: reads in flight, request id -> done time.
        self._recv_due: dict[str, float] = {}
        # Prefill side: blocks held, request id -> when the lease runs out;
        # reads of them done, request id -> when (may come before the hold).
        self._held: dict[str, float] = {}
        self._read_done: dict[str, float] = {}
        # Per read started here: request id -> (start, done).
        self.reads: dict[str, tuple[float, float]] = {}

    def notify_read(self, request_id: str, done: float) -> None:
        """The decode side's read of ``request_id``'s blocks ends at ``done``."""
        self._read_done[request_id] = done

    def next_due(self) -> float:
        """The earliest time this worker has something to report (inf: none)."""
        t = min(self._recv_due.values(), default=math.inf)
        for rid, lease_end in self._held.items():
            t = min(t, lease_end, self._read_done.get(rid, math.inf))
        return t

    def start(self, meta: object, now: float) -> None:
        """A batch scheduled at ``now`` with connector metadata ``meta``: its
        reads start, its finished requests' blocks are held."""
        if not isinstance(meta, NixlMetadata):
            return
        for rid, recv in meta.reqs_to_recv.items():
            params = recv.kv_transfer_params
            src = self.instance_of_engine[str(params["remote_engine_id"])]
            if recv.awaiting_kvs:
                num_tokens = len(recv.local_block_ids) * self.block_size
                done = self.fabric.read(src, self.index, now, num_tokens)
                self._recv_due[rid] = done
                self.reads[rid] = (now, done)
            else:
                done = now  # nothing to read: the prefill side only frees its blocks
            self.peers[src].notify_read(str(params["remote_request_id"]), done)
        for rid, lease in meta.reqs_to_send.items():
            self._held[rid] = now + lease

    def report(self, end: float) -> KVConnectorOutput | None:
        """What is done by ``end`` (None: nothing): reads finished here,
        held blocks read (or their lease run out)."""
        recv = {rid for rid, t in self._recv_due.items() if t <= end}
        for rid in recv:
            del self._recv_due[rid]
        read_done = self._read_done
        sent = {rid for rid, lease_end in self._held.items()
                if min(lease_end, read_done.get(rid, math.inf)) <= end}
        for rid in sent:
            del self._held[rid]
            read_done.pop(rid, None)
        if not recv and not sent:
            return None
        return KVConnectorOutput(finished_sending=sent, finished_recving=recv)
