"""LoRA adapters: vLLM's settings, the adapters' sizes and their cost.

vLLM 0.33 (``--enable-lora``) wraps every linear layer of a supported model
(``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj`` of a dense
decoder) in a LoRA layer that holds ``max_loras`` GPU slots of stacked
``lora_a`` / ``lora_b`` buffers, each ``max_lora_rank`` wide (an adapter of
lower rank is zero-padded into its slot). Each step its worker

- activates the batch's adapters (``LRUCacheWorkerLoRAManager``): an adapter
  not in the CPU cache (``max_cpu_loras`` adapters, LRU) is read from disk
  first; one not in a GPU slot (``max_loras``, LRU) is copied into one from
  CPU memory over the host link. :class:`AdapterCaches` keeps both LRUs,
  :meth:`LoraCost.load_seconds` prices a load;
- runs, per LoRA layer, a *shrink* (``x @ A^T``: tokens x rank) and an
  *expand* (``+= (x A^T) @ B^T``) Triton kernel over the tokens of requests
  with an adapter, reading each active adapter's padded slot once
  (:meth:`LoraCost.kernel_seconds`).

Under tensor parallelism a column-parallel layer (``qkv``, ``gate_up``)
keeps ``lora_a`` whole and shards ``lora_b``'s output; a row-parallel one
(``o``, ``down``) shards ``lora_a``'s input and keeps ``lora_b`` whole.
``--fully-sharded-loras`` shards the whole parts too (``lora_a``'s rank of
column layers, ``lora_b``'s output of row layers) at the price of a small
collective per layer. The numbers, their sources and a worked example are
in docs/lora.md.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvsched.config import MAX_LORAS
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.jsonfile import show
from kvsched.perf.hardware import Hardware
from kvsched.perf.models import ModelSpec
from kvsched.perf.roofline_factors import KERNEL_LATENCY_S, roofline_factors

# vLLM's LoRAConfig: max_lora_rank takes these values only (MaxLoRARanks),
# 16 by default; max_loras >= 1, default 1; max_cpu_loras defaults to
# max_loras and must not be below it.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORA_RANK = 16
DEFAULT_MAX_LORAS = 1
# lora_dtype "auto" is the model's activation dtype: 16-bit on every
# deployment kvsched prices (an FP8 checkpoint still runs bf16 activations).
LORA_DTYPE_BYTES = 2
# Reading an adapter that is in no CPU cache: vLLM reads the safetensors
# file into CPU tensors (PEFT config, per-module tensors, dtype cast).
# Assumptions, not measurements (docs/lora.md): a local NVMe SSD's read at
# 2 GB/s (datacenter PCIe 4.0 drives read 6-7 GB/s sequentially; the load
# is not one sequential read) plus 20 ms of fixed work per adapter.
DISK_READ_BW = 2e9
DISK_LOAD_FIXED_S = 20e-3
# Copying an adapter into a GPU slot is one pageable host-to-device copy per
# tensor (lora_a and lora_b of every module of every layer); each costs
# about 10 µs of fixed latency beyond its bytes (an assumption,
# docs/lora.md).
COPY_LATENCY_S = 10e-6
# Kernels per LoRA layer per step: shrink and expand (vLLM's punica GPU
# wrapper launches one of each for all slices of a packed layer).
KERNELS_PER_LORA_LAYER = 2
# The linear modules a PEFT adapter names, by the vLLM layer that holds them.
PEFT_MODULES = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "o_proj": "o_proj",
                "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"}


@dataclass(frozen=True, slots=True)
class LoraLayer:
    """One LoRA-wrapped linear layer of a decoder layer: its name, input
    and output widths per slice (``outputs``: one per packed slice, e.g.
    q, k, v), whether it is column-parallel (output sharded) or
    row-parallel (input sharded), and the PEFT module names of its slices."""

    name: str
    in_features: int
    outputs: tuple[int, ...]
    column: bool
    peft_names: tuple[str, ...]


def lora_layers(model: ModelSpec) -> tuple[LoraLayer, ...]:
    """The LoRA layers of one decoder layer of ``model``; refused where
    kvsched does not price them (MoE experts, MLA projections)."""
    if model.is_moe:
        raise UserInputError(f"--enable-lora with {model.name}: LoRA on MoE experts (vLLM's "
                             "FusedMoEWithLoRA) is not priced by kvsched yet; use a dense model or drop "
                             "--enable-lora")
    if model.is_mla:
        raise UserInputError(f"--enable-lora with {model.name}: LoRA on MLA projections is not priced by "
                             "kvsched yet; drop --enable-lora")
    hybrid = model.hybrid
    if hybrid is not None and (hybrid.num_linear_layers or hybrid.num_mamba_layers
                               or hybrid.num_mixer_only_layers):
        # Every layer here is attention and an MLP; Gated DeltaNet and Mamba-2
        # mixers (their own LoRA targets in vLLM) and single-block layers are not.
        raise UserInputError(f"--enable-lora with {model.name}: LoRA on Gated DeltaNet / Mamba-2 layers "
                             "and on layers holding one block alone is not priced by kvsched yet; drop "
                             "--enable-lora")
    h, d = model.hidden_size, model.head_dim
    q, kv = model.num_heads * d, model.num_kv_heads * d
    ffn = model.intermediate_size
    mlp_up = (ffn, ffn) if model.mlp_kind == "swiglu" else (ffn,)
    up_names = ("gate_proj", "up_proj") if model.mlp_kind == "swiglu" else ("up_proj",)
    return (LoraLayer("qkv_proj", h, (q, kv, kv), True, ("q_proj", "k_proj", "v_proj")),
            LoraLayer("o_proj", q, (h,), False, ("o_proj",)),
            LoraLayer("gate_up_proj", h, mlp_up, True, up_names),
            LoraLayer("down_proj", ffn, (h,), False, ("down_proj",)))


@dataclass(frozen=True, slots=True)
class Adapter:
    """One adapter the server holds (``--lora-modules name=path``): its
    rank and the PEFT modules it adapts (None: every module), read from
    the path's ``adapter_config.json`` when there is one."""

    name: str
    path: str
    rank: int
    modules: frozenset[str] | None = None


def check_lora_options(enable_lora: bool, max_loras: int, max_lora_rank: int, max_cpu_loras: int | None,
                       fully_sharded_loras: bool, lora_modules: Sequence[str],
                       target_modules: Sequence[str] = ()) -> None:
    """vLLM's rules for its LoRA flags (LoRAConfig's validators), each
    failure naming the flag, the value and the fix. The one owner."""
    if type(enable_lora) is not bool or type(fully_sharded_loras) is not bool:
        raise UserInputError(f"enable_lora={enable_lora!r}, fully_sharded_loras={fully_sharded_loras!r}: "
                             "must be true or false")
    if not is_int(max_loras) or not 1 <= max_loras <= MAX_LORAS:
        raise UserInputError(f"max_loras={show(max_loras)} (--max-loras): must be an integer in [1, "
                             f"{MAX_LORAS}] (adapters in one batch; vLLM's default is 1)")
    if max_lora_rank not in LORA_RANKS or isinstance(max_lora_rank, bool):
        raise UserInputError(f"max_lora_rank={show(max_lora_rank)} (--max-lora-rank): vLLM takes one of "
                             f"{', '.join(map(str, LORA_RANKS))} (default {DEFAULT_MAX_LORA_RANK}); use the "
                             "smallest at or above your adapters' rank")
    if max_cpu_loras is not None and (not is_int(max_cpu_loras)
                                      or not max_loras <= max_cpu_loras <= MAX_LORAS):
        raise UserInputError(f"max_cpu_loras={show(max_cpu_loras)} (--max-cpu-loras): must be an integer "
                             f"in [max_loras={max_loras}, {MAX_LORAS}] (vLLM refuses a CPU cache "
                             "smaller than the GPU slots); leave it out for max_loras")
    if not isinstance(lora_modules, tuple) or not all(isinstance(m, str) for m in lora_modules):
        raise UserInputError(f"lora_modules={lora_modules!r}: must be a list of NAME=PATH strings")
    if not isinstance(target_modules, tuple) or not all(isinstance(m, str) and m for m in target_modules):
        raise UserInputError(f"lora_target_modules={target_modules!r}: must be a list of module names")
    if not enable_lora:
        given = [flag for flag, on in (("--max-loras", max_loras != DEFAULT_MAX_LORAS),
                                       ("--max-lora-rank", max_lora_rank != DEFAULT_MAX_LORA_RANK),
                                       ("--max-cpu-loras", max_cpu_loras is not None),
                                       ("--fully-sharded-loras", fully_sharded_loras),
                                       ("--lora-modules", bool(lora_modules)),
                                       ("--lora-target-modules", bool(target_modules))) if on]
        if given:
            raise UserInputError(f"{given[0]}: a LoRA setting without --enable-lora; add --enable-lora "
                                 f"or drop {given[0]}")


def resolved_max_cpu_loras(max_loras: int, max_cpu_loras: int | None) -> int:
    """vLLM's default: the CPU cache holds ``max_loras`` adapters."""
    return max_loras if max_cpu_loras is None else max_cpu_loras


def parse_lora_modules(items: Sequence[str], max_lora_rank: int) -> tuple[Adapter, ...]:
    """vLLM serve's ``--lora-modules``: ``name=path`` or a JSON object with
    ``name`` and ``path``. Each adapter's rank is its
    ``adapter_config.json``'s ``r`` when the path holds one, else
    ``max_lora_rank``; a rank above ``max_lora_rank`` is refused as vLLM
    refuses the adapter."""
    adapters: list[Adapter] = []
    for item in items:
        if item.lstrip().startswith("{"):
            try:
                data = json.loads(item)
            except json.JSONDecodeError as e:
                raise UserInputError(f"--lora-modules {item!r}: not valid JSON ({e.msg}); give NAME=PATH or "
                                     '{"name": ..., "path": ...}') from None
            name, path = (data.get("name"), data.get("path")) if isinstance(data, dict) else (None, None)
        else:
            name, _, path = item.partition("=")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise UserInputError(f"--lora-modules {item!r}: give NAME=PATH (vLLM serve's form) or "
                                 '{"name": ..., "path": ...}')
        if any(a.name == name for a in adapters):
            raise UserInputError(f"--lora-modules: adapter name {name!r} given twice; give each adapter once")
        rank, modules = _adapter_config(name, path)
        if rank is None:
            rank = max_lora_rank
        elif rank > max_lora_rank:
            raise UserInputError(f"--lora-modules {name}={path}: the adapter's rank r={rank} is above "
                                 f"--max-lora-rank={max_lora_rank} (vLLM refuses to load it); raise "
                                 "--max-lora-rank")
        adapters.append(Adapter(name, path, rank, modules))
    return tuple(adapters)


def _adapter_config(name: str, path: str) -> tuple[int | None, frozenset[str] | None]:
    """(rank, PEFT modules) of the adapter_config.json at ``path`` (a
    directory), (None, None) when there is none: the path may name a Hugging
    Face repo the simulator does not fetch."""
    config = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(config):
        return None, None
    try:
        with open(config) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"--lora-modules {name}={path}: cannot read adapter_config.json ({e})") from None
    rank = data.get("r") if isinstance(data, dict) else None
    if not is_int(rank) or rank < 1:
        raise UserInputError(f"--lora-modules {name}={path}: adapter_config.json's r={show(rank)} must be "
                             "a positive integer (the adapter's rank)")
    targets = data.get("target_modules")
    modules: frozenset[str] | None = None
    if isinstance(targets, list) and targets != ["all-linear"]:
        modules = frozenset(t.rsplit(".", 1)[-1] for t in targets if isinstance(t, str)) & set(PEFT_MODULES)
    return rank, modules


def synthetic_adapters(count: int, rank: int) -> tuple[Adapter, ...]:
    """``count`` adapters of ``rank`` on every module (``--num-lora-adapters``
    without ``--lora-modules``): lora-1, lora-2, ..."""
    return tuple(Adapter(f"lora-{i}", "", rank) for i in range(1, count + 1))


@dataclass(frozen=True, slots=True)
class LoraCost:
    """The price of LoRA on one engine core of ``tensor_parallel_size``
    GPUs (each GPU runs its shard at the same time): kernels per step and
    adapter loads. Built once per deployment (:func:`lora_cost`)."""

    model_name: str
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    fully_sharded: bool
    tensor_parallel_size: int
    layers: tuple[LoraLayer, ...]
    num_layers: int
    # Per GPU: activation elements per token the shrink kernels read and the
    # expand kernels read and write, over one decoder layer.
    shrink_in_per_token: float
    expand_out_per_token: float
    # Per GPU: weight elements of one padded slot (max_lora_rank) per decoder layer.
    slot_elems_per_layer: float
    flop_rate: float
    mem_bw: float
    host_bw: float
    comm_latency_s: float
    adapters: tuple[Adapter, ...]

    def kernel_seconds(self, num_tokens: int, num_adapters: int) -> float:
        """GPU seconds of one step's shrink and expand kernels over
        ``num_tokens`` tokens of requests with an adapter, ``num_adapters``
        distinct adapters among them (0 tokens: vLLM skips the kernels).
        FLOPs ``2 x tokens x rank x (in + out)`` per layer, as the padded
        slots compute; bytes: the activations read and written, plus each
        active adapter's slot read once. Each kernel costs at least the
        roofline's kernel floor; fully sharded layers add a collective."""
        if num_tokens <= 0 or num_adapters <= 0:
            return 0.0
        flops = 2.0 * num_tokens * self.slot_elems_per_layer
        act = (self.shrink_in_per_token + self.expand_out_per_token) * num_tokens * LORA_DTYPE_BYTES
        weights = num_adapters * self.slot_elems_per_layer * LORA_DTYPE_BYTES
        per_layer = max(flops / self.flop_rate, (act + weights) / self.mem_bw)
        floor = KERNELS_PER_LORA_LAYER * len(self.layers) * KERNEL_LATENCY_S
        sharded = self.fully_sharded and self.tensor_parallel_size > 1
        comm = len(self.layers) * self.comm_latency_s if sharded else 0.0
        return self.num_layers * (max(per_layer, floor) + comm)

    def adapter_bytes(self, adapter: Adapter) -> float:
        """Bytes one GPU copies into a slot for ``adapter``: its own rank
        (not the padded one) over the modules it adapts, this GPU's shard."""
        tp = self.tensor_parallel_size
        r = adapter.rank
        elems = 0.0
        for layer in self.layers:
            for out, peft in zip(layer.outputs, layer.peft_names, strict=True):
                if adapter.modules is None or peft in adapter.modules:
                    elems += r * (_a_width(layer, tp, self.fully_sharded)
                                  + _b_height(layer, out, tp, self.fully_sharded))
        return self.num_layers * elems * LORA_DTYPE_BYTES

    def num_tensors(self, adapter: Adapter) -> int:
        """Host-to-device copies of one slot load: lora_a and lora_b of every module of every layer."""
        modules = sum(1 for layer in self.layers for peft in layer.peft_names
                      if adapter.modules is None or peft in adapter.modules)
        return 2 * modules * self.num_layers

    def load_seconds(self, adapter: Adapter, from_disk: bool) -> float:
        """Seconds the worker spends making ``adapter`` active: its copy into
        a GPU slot over the host link, after a read from disk when it is in
        no CPU cache (``from_disk``; the whole adapter, every GPU's shard)."""
        nbytes = self.adapter_bytes(adapter)
        gpu = nbytes / self.host_bw + self.num_tensors(adapter) * COPY_LATENCY_S
        if not from_disk:
            return gpu
        whole = nbytes * self.tensor_parallel_size if not self.fully_sharded else nbytes
        return gpu + DISK_LOAD_FIXED_S + whole / DISK_READ_BW

    def slot_bytes(self) -> float:
        """GPU memory of the stacked LoRA buffers on one GPU: ``max_loras``
        padded slots per layer (vLLM allocates them at start-up)."""
        return self.max_loras * self.num_layers * self.slot_elems_per_layer * LORA_DTYPE_BYTES

    def to_json(self) -> dict[str, object]:
        """The settings as simulated (vLLM's names, defaults resolved), with
        the adapters and the slots' memory."""
        return {"max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank,
                "max_cpu_loras": self.max_cpu_loras, "fully_sharded_loras": self.fully_sharded,
                "lora_layers": [layer.name for layer in self.layers],
                "slot_gib_per_gpu": round(self.slot_bytes() / 2**30, 4),
                "adapters": [{"name": a.name, "path": a.path, "rank": a.rank,
                              "modules": sorted(a.modules) if a.modules is not None else None}
                             for a in self.adapters]}

    def describe(self) -> str:
        return (f"LoRA: max_loras {self.max_loras}, max_lora_rank {self.max_lora_rank}, max_cpu_loras "
                f"{self.max_cpu_loras}{', fully sharded' if self.fully_sharded else ''}, "
                f"{len(self.adapters)} adapters")


def _a_width(layer: LoraLayer, tp: int, fully_sharded: bool) -> float:
    """lora_a's input width on one GPU (its rows are the rank): a row layer's
    input is sharded; a column layer's is whole (fully sharded: its rank is
    sharded instead, the same share of elements)."""
    if not layer.column:
        return layer.in_features / tp
    return layer.in_features / tp if fully_sharded else float(layer.in_features)


def _b_height(layer: LoraLayer, out: int, tp: int, fully_sharded: bool) -> float:
    """lora_b's output height on one GPU: a column layer's output is sharded;
    a row layer's is whole unless fully sharded."""
    if layer.column or fully_sharded:
        return out / tp
    return float(out)


def targeted_layers(layers: tuple[LoraLayer, ...], target_modules: Sequence[str]) -> tuple[LoraLayer, ...]:
    """vLLM's ``--lora-target-modules``: the layers whose name or one of
    whose packed slices' PEFT names is listed (empty: every layer); a list
    that names none is refused."""
    if not target_modules:
        return layers
    wanted = set(target_modules)
    kept = tuple(layer for layer in layers if layer.name in wanted or wanted & set(layer.peft_names))
    if not kept:
        names = sorted({layer.name for layer in layers} | {n for layer in layers for n in layer.peft_names})
        raise UserInputError(f"--lora-target-modules {' '.join(target_modules)}: names no LoRA layer of the "
                             f"model; use some of {', '.join(names)} (or leave it out for all)")
    return kept


def lora_cost(model: ModelSpec, hardware: Hardware, tensor_parallel_size: int, max_loras: int,
              max_lora_rank: int, max_cpu_loras: int | None, fully_sharded: bool,
              adapters: Sequence[Adapter], target_modules: Sequence[str] = ()) -> LoraCost:
    """The LoRA price of a deployment (refused where it cannot be priced)."""
    layers = targeted_layers(lora_layers(model), target_modules)
    tp = tensor_parallel_size
    r = max_lora_rank
    shrink_in = sum(_a_width(layer, tp, False) for layer in layers)
    expand_out = 2.0 * sum(_b_height(layer, out, tp, False) for layer in layers for out in layer.outputs)
    slot = sum(r * _a_width(layer, tp, fully_sharded) * len(layer.outputs)
               + r * sum(_b_height(layer, out, tp, fully_sharded) for out in layer.outputs)
               for layer in layers)
    if hardware.host_link_bw is None:
        raise UserInputError(f"--enable-lora: {hardware.name} ({hardware.id}) has no host_link_bw in the "
                             "hardware data, so adapter loads into GPU slots cannot be priced; use a "
                             "hardware file with host_link_bw (bytes/s per GPU per direction: PCIe Gen5 "
                             "x16 64e9)")
    factors = roofline_factors(hardware).gemm_bf16
    return LoraCost(model.name, max_loras, r, resolved_max_cpu_loras(max_loras, max_cpu_loras), fully_sharded,
                    tp, layers, model.num_layers, shrink_in, expand_out, slot,
                    hardware.bf16_flops * factors.flops_eff, hardware.mem_bw * factors.bw_eff,
                    hardware.copy_bw(hardware.host_link_bw), hardware.comm_latency_s, tuple(adapters))


@dataclass(slots=True)
class LoraStats:
    """What LoRA cost one engine core over a run."""

    loads_from_cpu: int = 0
    loads_from_disk: int = 0
    load_seconds: float = 0.0
    kernel_seconds: float = 0.0
    steps_with_lora: int = 0

    def merge(self, other: LoraStats) -> None:
        self.loads_from_cpu += other.loads_from_cpu
        self.loads_from_disk += other.loads_from_disk
        self.load_seconds += other.load_seconds
        self.kernel_seconds += other.kernel_seconds
        self.steps_with_lora += other.steps_with_lora

    def to_json(self) -> dict[str, float]:
        return {"loads_from_cpu": self.loads_from_cpu, "loads_from_disk": self.loads_from_disk,
                "load_seconds": self.load_seconds, "kernel_seconds": self.kernel_seconds,
                "steps_with_lora": self.steps_with_lora}


class AdapterCaches:
    """One engine core's adapter caches as vLLM's worker keeps them: the
    CPU cache (``max_cpu_loras`` adapters, LRU) and the GPU slots
    (``max_loras``, LRU), the GPU's adapters a subset of the CPU's (an
    adapter evicted from the CPU cache leaves its GPU slot too)."""

    __slots__ = ("cpu", "cpu_capacity", "gpu", "gpu_capacity")

    def __init__(self, gpu_capacity: int, cpu_capacity: int) -> None:
        if not 1 <= gpu_capacity <= cpu_capacity:
            raise ValueError(f"AdapterCaches: need 1 <= max_loras ({gpu_capacity}) <= max_cpu_loras "
                             f"({cpu_capacity})")
        self.gpu_capacity = gpu_capacity
        self.cpu_capacity = cpu_capacity
        self.cpu: OrderedDict[int, None] = OrderedDict()
        self.gpu: OrderedDict[int, None] = OrderedDict()

    def activate(self, lora_ids: Iterable[int]) -> list[tuple[int, bool]]:
        """Make the batch's adapters active, in order: the ones loaded, each
        with whether it came from disk (in no CPU cache). vLLM walks a set
        of the batch's LoRA requests, in no defined order; the simulator
        takes batch order (it only decides LRU ties within one batch)."""
        loads: list[tuple[int, bool]] = []
        for lid in lora_ids:
            cpu, gpu = self.cpu, self.gpu
            from_disk = lid not in cpu
            if from_disk:
                if len(cpu) >= self.cpu_capacity:
                    oldest, _ = cpu.popitem(last=False)
                    gpu.pop(oldest, None)
                cpu[lid] = None
            else:
                cpu.move_to_end(lid)
            if lid in gpu:
                gpu.move_to_end(lid)
                continue
            if len(gpu) >= self.gpu_capacity:
                gpu.popitem(last=False)
            gpu[lid] = None
            loads.append((lid, from_disk))
        return loads


class LoraPricer:
    """One engine core's LoRA: its caches and the GPU seconds each step
    adds (loads, then kernels), tallied in ``stats``. Adapters are
    ``cost.adapters[lora_id - 1]`` (vLLM numbers --lora-modules from 1)."""

    __slots__ = ("caches", "cost", "stats")

    def __init__(self, cost: LoraCost) -> None:
        self.cost = cost
        self.caches = AdapterCaches(cost.max_loras, cost.max_cpu_loras)
        self.stats = LoraStats()

    def step_seconds(self, tokens_by_adapter: Mapping[int, int]) -> float:
        """GPU seconds LoRA adds to a step whose requests with an adapter
        schedule ``tokens_by_adapter[lora_id]`` tokens (in batch order)."""
        if not tokens_by_adapter:
            return 0.0
        cost, stats = self.cost, self.stats
        if len(tokens_by_adapter) > cost.max_loras:
            raise AssertionError(f"a batch of {len(tokens_by_adapter)} adapters over max_loras="
                                 f"{cost.max_loras}: the scheduler's cap failed")
        load = 0.0
        for lid, from_disk in self.caches.activate(tokens_by_adapter):
            load += cost.load_seconds(cost.adapters[lid - 1], from_disk)
            if from_disk:
                stats.loads_from_disk += 1
            else:
                stats.loads_from_cpu += 1
        kernels = cost.kernel_seconds(sum(tokens_by_adapter.values()), len(tokens_by_adapter))
        stats.load_seconds += load
        stats.kernel_seconds += kernels
        stats.steps_with_lora += 1
        return load + kernels

