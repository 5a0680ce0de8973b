"""The roofline's efficiency factors per kernel kind: learned from measured tables, or the hardware's own.

A roofline kernel takes ``max(FLOPs / (peak x flops_eff), bytes / (bandwidth
x bw_eff)) + latency_s``. The peaks are always the hardware's
(:mod:`kvsched.perf.hardware`); the factors come from one of two places,
decided here (:func:`roofline_factors`, the one owner):

- *learned*: ``data/roofline_factors_vllm-0.24.json``, fitted by
  ``benchmarks/fit_roofline.py`` on aiconfigurator-core's vLLM kernel
  tables and judged on GPUs left out of the fit; per kernel kind, by GPU
  generation where the fit chose that, pooled otherwise. Used for the
  NVIDIA catalog GPUs the file names (a generation's, or ``pooled_ids``)
  whose efficiencies nobody overrode. A kind the fit did not ship keeps the
  hardware's factors.
- *the hardware's*: its efficiency fields (the catalog's medians, a
  hardware file's, or an ``--efficiency-file``'s) and a fixed latency per
  kernel: the roofline as it was before the fit, for every other device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvsched.errors import UserInputError
from kvsched.fields import is_number
from kvsched.jsonfile import read_json_file
from kvsched.perf.hardware import HARDWARE, Hardware

DEFAULT_FILE = Path(__file__).resolve().parent / "data" / "roofline_factors_vllm-0.24.json"
# The kernel kinds a factors file may hold, in the order the fit lists them.
KINDS = ("gemm_bf16", "gemm_fp8", "attention_prefill", "attention_decode", "moe_bf16", "moe_fp8", "allreduce")
# The hardware factors' latency per kernel: aiconfigurator's mem_empirical_constant_latency.
KERNEL_LATENCY_S = 3e-6
MAX_FILE_BYTES = 2**20
# No kernel's fixed cost is a millisecond (fitted ones are microseconds).
MAX_LATENCY_S = 1e-3


@dataclass(frozen=True, slots=True)
class KernelFactors:
    """One kernel kind's efficiencies (fractions of peak) and fixed seconds per call."""

    flops_eff: float
    bw_eff: float
    latency_s: float

    def __post_init__(self) -> None:
        for name in ("flops_eff", "bw_eff"):
            value = getattr(self, name)
            if not is_number(value) or not 0 < value <= 1:
                raise UserInputError(f"roofline factor {name}={value!r}: must be a fraction of peak in "
                                     "(0, 1]")
        lat = self.latency_s
        if not is_number(lat) or not math.isfinite(lat) \
                or not 0 <= lat <= MAX_LATENCY_S:
            raise UserInputError(f"roofline factor latency_s={lat!r}: must be seconds in "
                                 f"[0, {MAX_LATENCY_S:g}]")

    def to_json(self) -> dict[str, float]:
        return {"flops_eff": self.flops_eff, "bw_eff": self.bw_eff, "latency_s": self.latency_s}


@dataclass(frozen=True, slots=True)
class RooflineFactors:
    """Every kind's factors for one device, and where they came from."""

    gemm_bf16: KernelFactors
    gemm_fp8: KernelFactors
    attention_prefill: KernelFactors
    attention_decode: KernelFactors
    # One MoE layer's routed experts by their math (16-bit, FP8/FP4); the
    # hardware's: its GEMM factors, their latency in the per-layer kernels.
    moe_bf16: KernelFactors
    moe_fp8: KernelFactors
    allreduce: KernelFactors
    # "learned (...)" or "hardware efficiencies": for describe_backend.
    source: str
    # The kinds whose factors are learned (the others are the hardware's).
    learned_kinds: frozenset[str] = frozenset()


def hardware_factors(hw: Hardware) -> RooflineFactors:
    """The hardware's own efficiency fields, 3 us per kernel: the roofline before the fit."""
    attention = KernelFactors(hw.prefill_attn_mfu, hw.attn_bw_frac, KERNEL_LATENCY_S)
    return RooflineFactors(
        gemm_bf16=KernelFactors(hw.gemm_mfu, hw.weight_bw_frac, KERNEL_LATENCY_S),
        gemm_fp8=KernelFactors(hw.fp8_gemm_mfu, hw.weight_bw_frac, KERNEL_LATENCY_S),
        attention_prefill=attention, attention_decode=attention,
        moe_bf16=KernelFactors(hw.gemm_mfu, hw.weight_bw_frac, 0.0),
        moe_fp8=KernelFactors(hw.fp8_gemm_mfu, hw.weight_bw_frac, 0.0),
        allreduce=KernelFactors(1.0, hw.comm_bw_frac, hw.comm_latency_s),
        source="hardware efficiencies")


@dataclass(frozen=True, slots=True)
class LearnedFile:
    """A factors file as read: kind factors per group ("pooled" and generations)."""

    path: str
    fitted: str
    vllm_version: str
    generations: dict[str, tuple[str, ...]]
    pooled_ids: tuple[str, ...]     # devices of no generation that take the pooled factors
    factors: dict[str, dict[str, KernelFactors]]

    def covers(self, hardware_id: str) -> bool:
        return hardware_id in self.pooled_ids or any(hardware_id in ids for ids in self.generations.values())


def _fail(path: Path, what: str) -> UserInputError:
    return UserInputError(f"roofline factors file {str(path)!r}: {what}; regenerate it with "
                          "benchmarks/fit_roofline.py")


def load_learned(path: str | Path = DEFAULT_FILE) -> LearnedFile:
    """A factors file, checked (every factor in range, kinds and groups known)."""
    p = Path(path)
    data = read_json_file(str(p), MAX_FILE_BYTES, "a roofline factors file (JSON)",
                          fix="a roofline factors file is a few kilobytes: check the path",
                          label=f"roofline factors file {str(p)!r} (regenerate it with "
                                "benchmarks/fit_roofline.py)")
    if not isinstance(data, dict):
        raise _fail(p, "expected a JSON object")
    for key in ("fitted", "vllm_version", "generations", "pooled_ids", "factors"):
        if key not in data:
            raise _fail(p, f"missing {key!r}")
    gens = data["generations"]
    if not isinstance(gens, dict) or not all(isinstance(v, list) and all(isinstance(i, str) for i in v)
                                             for v in gens.values()):
        raise _fail(p, "'generations' must map a generation to a list of hardware ids")
    pooled_ids = data["pooled_ids"]
    if not isinstance(pooled_ids, list) or not all(isinstance(i, str) for i in pooled_ids):
        raise _fail(p, "'pooled_ids' must be a list of hardware ids")
    groups = data["factors"]
    if not isinstance(groups, dict) or "pooled" not in groups:
        raise _fail(p, "'factors' must map 'pooled' (and generations) to kinds")
    factors: dict[str, dict[str, KernelFactors]] = {}
    for group, kinds in groups.items():
        if group != "pooled" and group not in gens:
            raise _fail(p, f"factors for unknown generation {group!r} (known: {', '.join(gens)})")
        if not isinstance(kinds, dict):
            raise _fail(p, f"factors[{group!r}] must map kinds to factors")
        factors[group] = {}
        for kind, values in kinds.items():
            if kind not in KINDS:
                raise _fail(p, f"unknown kernel kind {kind!r} (known: {', '.join(KINDS)})")
            if not isinstance(values, dict) or set(values) != {"flops_eff", "bw_eff", "latency_s"}:
                raise _fail(p, f"factors[{group!r}][{kind!r}] must hold flops_eff, bw_eff, latency_s")
            try:
                factors[group][kind] = KernelFactors(**values)
            except UserInputError as e:
                raise _fail(p, f"factors[{group!r}][{kind!r}]: {e}") from None
    return LearnedFile(str(p), str(data["fitted"]), str(data["vllm_version"]),
                       {g: tuple(v) for g, v in gens.items()}, tuple(pooled_ids), factors)


@cache
def _default_learned() -> LearnedFile | None:
    # The shipped file is immutable package data: read once per process (a cache, not state).
    return load_learned(DEFAULT_FILE) if DEFAULT_FILE.is_file() else None


def is_catalog_hardware(hw: Hardware) -> bool:
    """Whether ``hw`` is a catalog entry as shipped: not a hardware file, no
    overridden efficiency (equal field by field to the catalog's entry)."""
    return HARDWARE.get(hw.id) == hw


def learned_factors(hw: Hardware, learned: LearnedFile) -> RooflineFactors:
    """``learned``'s factors for ``hw``: its generation's where the file has
    them, pooled otherwise, the hardware's own for kinds the file lacks and
    for devices it does not cover."""
    if not learned.covers(hw.id):
        return hardware_factors(hw)
    gen = next((g for g, ids in learned.generations.items() if hw.id in ids), None)
    own = hardware_factors(hw)
    pooled = learned.factors.get("pooled", {})
    by_gen = learned.factors.get(gen, {}) if gen is not None else {}
    picked: dict[str, KernelFactors] = {}
    used: list[str] = []
    for kind in KINDS:
        name = kind.replace("_", " ")
        if kind in by_gen:
            picked[kind] = by_gen[kind]
            used.append(f"{name} ({gen})")
        elif kind in pooled:
            picked[kind] = pooled[kind]
            used.append(f"{name} (pooled)")
        else:
            picked[kind] = getattr(own, kind)
    source = (f"learned from vLLM {learned.vllm_version} kernel tables (fitted {learned.fitted}) for "
              f"{', '.join(used)}; the hardware's for the rest")
    if not used:
        return own
    return RooflineFactors(**picked, source=source,
                           learned_kinds=frozenset(k for k in KINDS if k in by_gen or k in pooled))


def roofline_factors(hw: Hardware) -> RooflineFactors:
    """The factors the roofline prices ``hw`` with (see the module doc)."""
    learned = _default_learned() if is_catalog_hardware(hw) else None
    if learned is None:
        return hardware_factors(hw)
    return learned_factors(hw, learned)
