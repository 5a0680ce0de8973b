"""Accelerators: peak rates, visible memory, and achieved-efficiency factors.

The catalog's devices are data, ``data/hardware.yaml`` (:data:`HARDWARE`):
each item is a hardware file (:func:`load_hardware_file`), read and checked
by the same rules. Its numbers come from ``/work/shared/facts/hardware.md``
unless an entry's ``source`` names other pages; the source keys in each
entry's ``source`` (``[DS-H100]``, ``[SMI]``, ``[AIC]`` ...) are that file's.
Peaks are dense (no 2:4 sparsity). The efficiency factors are fractions of
those peaks that a real kernel reaches: measured medians from
aiconfigurator's silicon database where hardware.md gives them (the vLLM
columns, not the TRT-LLM brackets), otherwise the documented defaults here,
named in the entry's ``notes``. ``docs/catalogs.md`` has the tables and the
reasoning. The roofline reads these fields through
:mod:`kvsched.perf.roofline_factors`, which replaces them, kind by kind,
with factors learned from measured kernel tables for the NVIDIA catalog
GPUs whose efficiencies nobody overrode.

Units are SI throughout: bytes, bytes/s, FLOP/s, seconds (GB = 1e9 B).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeGuard

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.files import read_text
from kvsched.hf_config import parse_json
from kvsched.jsonfile import show
from kvsched.perf.catalog_file import DATA_DIR, FileCatalog
from kvsched.scheduler_defaults import Platform
from kvsched.yamlfile import parse_yaml

# Defaults for devices without measurements (and for hardware files that omit
# efficiency fields). The GEMM/attention ones are the medians over the seven
# devices measured in hardware.md's aiconfigurator table; the bandwidth ones
# are aiconfigurator's own `mem_bw_empirical_scaling_factor` (0.8, every NVIDIA
# system), which sits just below the measured medians (0.82).
DEFAULT_GEMM_MFU = 0.77           # median of 0.79 0.77 0.91 0.69 0.51 0.61 0.80
DEFAULT_FP8_GEMM_MFU = 0.52       # median of 0.53 0.60 0.47 0.46 0.50 0.72 (0.515)
DEFAULT_WEIGHT_BW_FRAC = 0.80     # aiconfigurator mem_bw_empirical_scaling_factor
DEFAULT_ATTN_BW_FRAC = 0.80       # same constant; measured medians 0.74-0.87
DEFAULT_PREFILL_ATTN_MFU = 0.53   # median of 0.56 0.56 0.54 0.49 0.46 0.45 0.53
# Collectives: no measurement in the facts. Chosen below the 0.8 memory factor
# because all-reduce/all-to-all add synchronisation and protocol overhead on
# top of a plain copy (NCCL's low-latency protocols spend part of each line on
# flags). Applies to bus bandwidth (the per-GPU bytes each link must carry).
DEFAULT_COMM_BW_FRAC = 0.70
# Per-collective fixed cost: an assumption of a few µs (kernel launch plus a
# handshake across the fabric); same order as aiconfigurator's 3 µs constant
# memory latency. PCIe-only devices route peer traffic through the host
# bridge, so the catalog (data/hardware.yaml) gives them twice that.
DEFAULT_COMM_LATENCY_S = 5e-6

EFFICIENCY_FIELDS: tuple[str, ...] = (
    "gemm_mfu", "fp8_gemm_mfu", "weight_bw_frac", "attn_bw_frac",
    "prefill_attn_mfu", "comm_bw_frac", "comm_latency_s",
)
_FRACTION_FIELDS = EFFICIENCY_FIELDS[:-1]
_REQUIRED_FIELDS: tuple[str, ...] = (
    "id", "name", "memory_bytes", "mem_bw", "bf16_flops", "fp8_flops", "scaleup_bw", "scaleup_kind",
)
_ID_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")

# -- stated bounds ----------------------------------------------------------------
# Every number of a Hardware (from the catalog, a hardware file, an
# efficiency file or code) is checked against these ranges before anything
# is computed from it. Each holds for every accelerator that serves LLMs with
# a wide margin; a value beyond it is a unit mistake or a corrupt file.
# (lowest, highest, why), inclusive.
_RATE_BOUNDS: Mapping[str, tuple[float, float, str]] = MappingProxyType({
    # HBM/GDDR devices have 0.3-8 TB/s; 1 GB/s is below any memory bus.
    "mem_bw": (1e9, 1e15, "bytes/s: accelerators have 0.3-8 TB/s"),
    # Dense tensor rates are 1e14-1e16 FLOP/s per device (B200 FP4: 9e15).
    "bf16_flops": (1e11, 1e18, "dense FLOP/s: accelerators have 1e14-1e16"),
    "fp8_flops": (1e11, 1e18, "dense FLOP/s: accelerators have 1e14-1e16"),
    "fp4_flops": (1e11, 1e18, "dense FLOP/s: accelerators have 1e14-1e16"),
    # Scale-up links are 8 GB/s (PCIe3 x8) to 900 GB/s (NVLink5) per direction.
    "scaleup_bw": (1e8, 1e15, "bytes/s per direction: links have 8-900 GB/s"),
    "scaleup_link_bw": (1e8, 1e15, "bytes/s per direction: links have 8-900 GB/s"),
    # Scale-out NICs are 10-800 Gb/s (1.25-100 GB/s) per device per direction.
    "scaleout_bw": (1e8, 1e15, "bytes/s per direction: NICs have 1-100 GB/s"),
    # A GPU's link to host memory: PCIe Gen3 x16 (16 GB/s) to NVLink-C2C
    # (450 GB/s per direction on GH200) per direction.
    "host_link_bw": (1e8, 1e15, "bytes/s per direction: host links have 8-450 GB/s"),
    # A collective's fixed cost is microseconds; 0.1 s is 10,000x that.
    "comm_latency_s": (0.0, 0.1, "seconds: a collective's fixed cost is a few microseconds"),
})
# Devices one scale-up fabric joins: 1 to 2**16 (the largest, CloudMatrix384
# and NVL576, join a few hundred).
MAX_SCALEUP_DOMAIN = 2**16
# An HGX board / an 8-accelerator host: NVLink, Infinity Fabric, HCCS or PCIe
# join its devices, and no more.
DEFAULT_SCALEUP_DOMAIN = 8
# Visible memory: accelerators that serve LLMs have 16-288 GB. vLLM keeps
# ~1 GiB of each for non-torch memory (kvsched.perf.memory), so below 2 GiB
# no model has room; 16 TiB (2**44) leaves room for future devices.
MIN_MEMORY_BYTES = 2**31
MAX_MEMORY_BYTES = 2**44
# Labels (name, scaleup_kind) are one line in reports; notes and source are prose.
_MAX_LABEL = 128
_MAX_PROSE = 8192
# A hardware or efficiency file is a few dozen lines; read at most 256 KiB.
MAX_FILE_BYTES = 2**18


def _fail(hw_id: object, field: str, value: object, rule: str, fix: str) -> UserInputError:
    return UserInputError(f"hardware {show(hw_id)}: {field}={show(value)}: {rule}; {fix}")


def _real(value: object) -> float | None:
    """``value`` as a finite float, or None if it is not a real number."""
    # bool is an int subclass; a YAML `true` must not pass as 1.0.
    if not is_number(value):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) else None


def check_efficiency(hw_id: object, name: str, value: object) -> None:
    """One efficiency field's rule: a fraction of peak in (0, 1], or the
    collectives' fixed latency in seconds."""
    if name == "comm_latency_s":
        _require_range(hw_id, name, value)
        return
    frac = _real(value)
    if frac is None or not 0.0 < frac <= 1.0:
        raise _fail(hw_id, name, value, "must be a fraction of peak in (0, 1]", f"set {name} to e.g. 0.8")


def _require_range(hid: object, name: str, value: object) -> None:
    low, high, why = _RATE_BOUNDS[name]
    number = _real(value)
    if number is None or not low <= number <= high:
        sign = "non-negative" if low == 0 else "positive"
        raise _fail(hid, name, value, f"must be a {sign} number from {low:g} to {high:g} ({why})",
                    f"give {name} in SI units")


def _did_you_mean(key: object, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(key), choices, n=1) if isinstance(key, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""



# CUDA compute capability majors by device name (upper case), first match:
# what vLLM's backend choices read (``DeviceCapability.major``).
_CUDA_MAJOR_BY_NAME: tuple[tuple[str, int], ...] = (
    (r"\bG?B[23]00\b", 10),                                   # B200, GB200, B300, GB300
    (r"RTX PRO \d000 BLACKWELL|RTX 50\d0\b", 12),
    (r"\bG?H(100|200|20)\b", 9),
    (r"\bA(100|10G?|30|40)\b|\bL40S?\b|\bL4\b|RTX (30|40)\d0\b|RTX 6000 ADA|RTX A\d000", 8),
)


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator (per GPU / NPU package), as the performance model sees it.

    ``memory_bytes`` is what the driver reports (visible), not the marketed
    size. ``scaleup_bw`` is per device, per direction, on the fabric used for
    tensor/expert-parallel collectives (NVLink, Infinity Fabric, HCCS, UB; PCIe
    when there is none). On a switchless full mesh (MI300X, Ascend 910B) a
    device reaches ``scaleup_bw`` only when talking to all peers at once;
    ``scaleup_link_bw`` is then the per-peer link rate, see
    :meth:`scaleup_bw_for_group`. ``scaleup_domain`` is how many devices that
    fabric joins (an HGX board or host: 8; GB200 NVL72: 72); beyond it
    collectives cross the scale-out network (InfiniBand, RoCE), whose
    per-device, per-direction rate is ``scaleout_bw`` (None: not in the
    hardware data), see :meth:`tensor_parallel_bw`. ``host_link_bw`` is one
    device's link to host (CPU) memory, per direction (``host_link_kind``:
    PCIe Gen4/Gen5 x16, or NVLink-C2C on Grace systems); KV offloading to
    CPU memory moves its blocks over it (None: not in the hardware data).
    """

    id: str
    name: str
    memory_bytes: int
    mem_bw: float
    bf16_flops: float
    fp8_flops: float | None
    scaleup_bw: float
    scaleup_kind: str
    gemm_mfu: float = DEFAULT_GEMM_MFU
    fp8_gemm_mfu: float = DEFAULT_FP8_GEMM_MFU  # unused when fp8_flops is None
    weight_bw_frac: float = DEFAULT_WEIGHT_BW_FRAC
    attn_bw_frac: float = DEFAULT_ATTN_BW_FRAC
    prefill_attn_mfu: float = DEFAULT_PREFILL_ATTN_MFU
    comm_bw_frac: float = DEFAULT_COMM_BW_FRAC
    comm_latency_s: float = DEFAULT_COMM_LATENCY_S
    scaleup_link_bw: float | None = None
    # Dense FP4 (NVFP4, W4A4) tensor-core peak; None: no FP4 math (Hopper and
    # older run 4-bit weights through 16-bit math). Optional in hardware files.
    fp4_flops: float | None = None
    scaleup_domain: int = DEFAULT_SCALEUP_DOMAIN
    scaleout_bw: float | None = None
    host_link_bw: float | None = None
    host_link_kind: str | None = None
    source: str = ""
    notes: str = ""

    def __post_init__(self) -> None:
        hid = self.id
        if not isinstance(hid, str) or len(hid) > 64 or _ID_RE.fullmatch(hid) is None:
            raise _fail(hid, "id", hid, "must be lower-case letters/digits joined by hyphens "
                        "(at most 64 characters)", "use an id like 'h100-sxm'")
        for name in ("name", "scaleup_kind"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value or len(value) > _MAX_LABEL \
                    or not value.isprintable():
                raise _fail(hid, name, value, f"must be a non-empty one-line string of at most "
                            f"{_MAX_LABEL} characters", f"set {name}")
        mem = self.memory_bytes
        if not is_int(mem) \
                or not MIN_MEMORY_BYTES <= mem <= MAX_MEMORY_BYTES:
            raise _fail(hid, "memory_bytes", mem, "must be an integer number of bytes from 2**31 "
                        "(2 GiB) to 2**44 (16 TiB) (accelerators have 16-288 GB)",
                        "give the visible memory in bytes (GB x 1e9)")
        for name in ("mem_bw", "bf16_flops", "scaleup_bw"):
            _require_range(hid, name, getattr(self, name))
        domain = self.scaleup_domain
        if not is_int(domain) or not 1 <= domain <= MAX_SCALEUP_DOMAIN:
            raise _fail(hid, "scaleup_domain", domain, f"must be an integer from 1 to {MAX_SCALEUP_DOMAIN}",
                        "give the devices one scale-up fabric joins (8 for an HGX board)")
        for name in ("fp8_flops", "scaleup_link_bw", "fp4_flops", "scaleout_bw", "host_link_bw"):
            if getattr(self, name) is not None:
                _require_range(hid, name, getattr(self, name))
        for name in EFFICIENCY_FIELDS:
            check_efficiency(hid, name, getattr(self, name))
        kind = self.host_link_kind
        if kind is not None and (not isinstance(kind, str) or not kind or len(kind) > _MAX_LABEL
                                 or not kind.isprintable()):
            raise _fail(hid, "host_link_kind", kind, f"must be a non-empty one-line string of at most "
                        f"{_MAX_LABEL} characters", "name the link, e.g. pcie5 or nvlink-c2c")
        if self.scaleup_link_bw is not None and self.scaleup_link_bw > self.scaleup_bw:
            raise _fail(hid, "scaleup_link_bw", self.scaleup_link_bw,
                        f"cannot exceed scaleup_bw ({self.scaleup_bw!r})",
                        "scaleup_link_bw is one peer link; scaleup_bw is the device total")
        for name in ("source", "notes"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > _MAX_PROSE:
                raise _fail(hid, name, value, f"must be a string of at most {_MAX_PROSE} characters",
                            f"quote {name}")

    @property
    def has_fp8(self) -> bool:
        return self.fp8_flops is not None

    @property
    def has_fp4(self) -> bool:
        return self.fp4_flops is not None

    @property
    def platform(self) -> Platform:
        """vLLM's platform on this device, read from its name (the catalog
        names every part by its vendor): AMD's run ROCm, Huawei's Ascend
        (vllm-ascend), Google's TPUs and Intel's Gaudi another platform,
        every other device CUDA. It decides the KV cache's sizing
        (kvsched.scheduler_defaults.resolve_cache_defaults)."""
        name = self.name.lower()
        if name.startswith("amd") or "instinct" in name:
            return "rocm"
        if any(word in name for word in ("ascend", "huawei", "tpu", "gaudi")):
            return "other"
        return "cuda"

    @property
    def cuda_capability_major(self) -> int | None:
        """The CUDA compute capability's major version, read from the name as
        :attr:`platform` is (:data:`_CUDA_MAJOR_BY_NAME`): 10 datacenter
        Blackwell, 12 workstation/consumer Blackwell, 9 Hopper, 8 Ampere and
        Ada. None: not a CUDA device, or a name kvsched does not know (a
        user's hardware file), where nothing is decided from it."""
        if self.platform != "cuda":
            return None
        name = self.name.upper()
        return next((major for pattern, major in _CUDA_MAJOR_BY_NAME if re.search(pattern, name)), None)

    @property
    def sm100_family(self) -> bool:
        """A datacenter Blackwell GPU (B200, GB200, B300, GB300: CUDA compute
        capability 10.x, vLLM's ``is_device_capability_family(100)``), read
        from its name as :attr:`platform` is. vLLM picks other sparse MLA
        backends there, and GLM-5 an fp8 KV cache under ``auto``
        (kvsched.perf.kv_cache_planning)."""
        return self.cuda_capability_major == 10

    def scaleup_bw_for_group(self, group_size: int) -> float:
        """Per-direction scale-up bandwidth one device can use in a collective of ``group_size``.

        On a switched fabric that is ``scaleup_bw``. On a full mesh each peer is
        one link, so a group of n reaches only (n - 1) links' worth.
        """
        if group_size < 2:
            return 0.0
        if self.scaleup_link_bw is None:
            return self.scaleup_bw
        return min(self.scaleup_bw, (group_size - 1) * self.scaleup_link_bw)

    def copy_bw(self, link_bw: float) -> float:
        """Bytes/s of a DMA copy between this device's memory and a link of
        ``link_bw`` (a KV read over NVLink or RDMA, a store or load over the
        host link): every byte is read from or written into the device's
        memory, so the copy runs no faster than ``mem_bw``, the slower of the
        two. On every device in the catalog the link is the slower (at most
        a quarter of ``mem_bw``); a hardware file may say otherwise. The one
        owner of that floor (docs/simulator.md, "KV copies and GPU memory
        bandwidth")."""
        return min(link_bw, self.mem_bw)

    def tensor_parallel_bw(self, tensor_parallel_size: int) -> float:
        """Per-direction bandwidth one device has in a tensor-parallel
        all-reduce over ``tensor_parallel_size`` devices: the scale-up fabric
        within its domain, the scale-out network beyond it; refused beyond it
        when the hardware data has no scale-out rate. The one owner of which
        network a TP group runs on."""
        if tensor_parallel_size <= self.scaleup_domain:
            return self.scaleup_bw_for_group(tensor_parallel_size)
        if self.scaleout_bw is None:
            raise UserInputError(
                f"tensor_parallel_size={tensor_parallel_size} (--tensor-parallel-size): {self.name}'s "
                f"{self.scaleup_kind} joins {self.scaleup_domain} devices, and the hardware data has no "
                "scale-out bandwidth to price a tensor-parallel group beyond them; use at most "
                f"{self.scaleup_domain} (--data-parallel-size for more devices), or give scaleout_bw "
                "(bytes/s per device per direction) in a hardware file")
        return self.scaleout_bw


_ALL_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Hardware))


# The catalog is data: kvsched/perf/data/hardware.yaml, a list whose every
# item is a hardware file's mapping, read and checked by the rules that read
# a user's hardware file (_hardware_from_mapping), so those rules have one
# owner. It is read on first use, not at import, so that importing
# kvsched.perf does not import PyYAML.
CATALOG_FILE = DATA_DIR / "hardware.yaml"


@functools.cache
def _catalog() -> Mapping[str, Hardware]:
    """The catalog file's devices by id, in the file's order (read once)."""
    items = _read_document(CATALOG_FILE)
    if not isinstance(items, list):
        raise UserInputError(f"{CATALOG_FILE}: top level must be a list of hardware entries (each a "
                             "mapping as in a hardware file)")
    devices: dict[str, Hardware] = {}
    for index, item in enumerate(items):
        hw = _hardware_from_mapping(CATALOG_FILE, f"{CATALOG_FILE}: item {index + 1}", item)
        if hw.id in devices:
            raise UserInputError(f"{CATALOG_FILE}: item {index + 1}: id {hw.id!r} is already item "
                                 f"{list(devices).index(hw.id) + 1}'s; give each device one entry")
        devices[hw.id] = hw
    return MappingProxyType(devices)


HARDWARE: Mapping[str, Hardware] = FileCatalog(_catalog, CATALOG_FILE, "hardware catalog")

# Obvious short names. Keys are already normalised (see _normalise).
_ALIASES: Mapping[str, str] = MappingProxyType({
    "h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100sxm": "h100-sxm",
    "h100pcie": "h100-pcie",
    "h200-sxm": "h200",
    "a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-sxm": "a100-80gb", "a100-40g": "a100-40gb",
    "b200-sxm": "b200", "gb200-nvl72": "gb200",
    "4090": "rtx-4090", "rtx4090": "rtx-4090",
    "rtx-pro-6000-blackwell": "rtx-pro-6000", "rtx-pro-6000-server": "rtx-pro-6000",
    "rtx6000-ada": "rtx-6000-ada",
    "mi300": "mi300x",
    "910b": "ascend-910b", "910c": "ascend-910c",
    "nvidia-a10g": "a10g", "nvidia-l4": "l4", "h20-96gb": "h20",
    "mi325": "mi325x", "mi355": "mi355x", "b300-sxm": "b300", "gb300-nvl72": "gb300",
})


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def resolve_hardware_id(name: str) -> str | None:
    """The catalog id ``name`` refers to (id or alias, any case, ``_`` for ``-``), or None."""
    key = _normalise(name)
    key = _ALIASES.get(key, key)
    return key if key in HARDWARE else None


def get_hardware(name: str) -> Hardware:
    """A catalog device by id/alias, or a device defined in a YAML/JSON file.

    A name ending in ``.yaml``/``.yml``/``.json`` or containing a path
    separator is read as a file (see :func:`load_hardware_file`).
    """
    hw_id = resolve_hardware_id(name)
    if hw_id is not None:
        return HARDWARE[hw_id]
    if _looks_like_path(name):
        return load_hardware_file(name)
    raise UserInputError(
        f"unknown hardware {name!r}; known ids: {', '.join(HARDWARE)}; "
        "or pass a path to a .yaml/.json hardware file (see docs/catalogs.md)")


def _looks_like_path(name: str) -> bool:
    return name.lower().endswith((".yaml", ".yml", ".json")) or "/" in name or "\\" in name


def with_overrides(hw: Hardware, **fields: Any) -> Hardware:
    """A copy of ``hw`` with ``fields`` replaced (validated like any Hardware)."""
    for name in fields:
        if name not in _ALL_FIELDS:
            raise UserInputError(f"hardware {hw.id!r}: unknown field {show(name)}"
                             f"{_did_you_mean(name, _ALL_FIELDS)}; fields are: {', '.join(_ALL_FIELDS)}")
    return dataclasses.replace(hw, **fields)


def _read_document(path: Path) -> object:
    """The document in a YAML or JSON file (JSON for a .json name)."""
    text = read_text(path, MAX_FILE_BYTES, "a hardware or efficiency file (YAML/JSON)")
    if _is_json(path):
        return parse_json(path, text, "fix the file")
    return parse_yaml(str(path), text)


def _is_json(path: Path) -> bool:
    return path.suffix.lower() == ".json"


def _read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping with string keys."""
    data = _read_document(path)
    if not _is_field_mapping(data):
        raise UserInputError(f"{path}: top level must be a mapping of field names to values")
    return data


def _is_field_mapping(data: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(data, dict) and all(isinstance(k, str) for k in data)


# What YAML 1.2 reads as a number but PyYAML (YAML 1.1) as a string: 3.35e12, 80e9.
_YAML_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _coerce_number(path: Path, field: str, value: object, where: str | None = None) -> object:
    """``value`` of ``field`` read from ``path`` (named ``where`` in errors,
    the path by default) as a number where YAML 1.1 left one a string."""
    if not isinstance(value, str):
        return value
    if _is_json(path):
        raise UserInputError(f"{where or path}: {field}={show(value)}: must be a number, not a string; "
                             "write it without quotes")
    # PyYAML reads `3.35e12` (no dot, no sign) as a string; accept exactly that spelling.
    if _YAML_NUMBER.fullmatch(value) is None:
        raise UserInputError(f"{where or path}: {field}={show(value)}: must be a number; write it like "
                             "3.35e12")
    return float(value)


def load_hardware_file(path: str | Path) -> Hardware:
    """Read a Hardware from YAML/JSON: a flat mapping of the Hardware field names.

    Required: id, name, memory_bytes, mem_bw, bf16_flops, fp8_flops (``null``
    when there is no FP8 path), scaleup_bw, scaleup_kind. Efficiency fields,
    scaleup_link_bw, fp4_flops, scaleup_domain (default 8), scaleout_bw,
    host_link_bw, host_link_kind, source and notes are optional. Unknown keys are errors.
    """
    p = Path(path)
    return _hardware_from_mapping(p, str(p), _read_mapping(p))


def _hardware_from_mapping(path: Path, where: str, data: object) -> Hardware:
    """One device from a hardware file's mapping read from ``path`` (a user's
    file, or an item of the catalog file); ``where`` names it in errors. The
    one owner of the hardware-file rules."""
    if not _is_field_mapping(data):
        raise UserInputError(f"{where}: must be a mapping of field names to values, as in a hardware file")
    for key in data:
        if key not in _ALL_FIELDS:
            raise UserInputError(f"{where}: unknown field {show(key)}{_did_you_mean(key, _ALL_FIELDS)}; "
                                 f"allowed fields: {', '.join(_ALL_FIELDS)}")
    for key in _REQUIRED_FIELDS:
        if key not in data:
            raise UserInputError(f"{where}: missing required field {key!r} "
                                 f"(required: {', '.join(_REQUIRED_FIELDS)})")
    fields = dict(data)
    for key, value in data.items():
        if key in ("id", "name", "scaleup_kind", "host_link_kind", "source", "notes") or value is None:
            continue
        fields[key] = _coerce_number(path, key, value, where)
    mem = fields["memory_bytes"]
    # Accept 85.5e9 (a float) for memory_bytes, but not 85.5 (a GB figure by mistake).
    mem_value = _real(mem)
    if mem_value is not None and mem_value.is_integer():
        fields["memory_bytes"] = int(mem_value)
    fields.setdefault("source", f"file {path}")
    try:
        return Hardware(**fields)
    except ValueError as err:
        raise UserInputError(f"{where}: {err}") from None


def load_efficiency_overrides(path: str | Path, hw: Hardware) -> Hardware:
    """``hw`` with efficiency factors overridden from a YAML/JSON file.

    The file maps efficiency fields to values; those apply to any device. A
    key naming a hardware id (catalog id/alias, or ``hw.id``) maps to a nested
    mapping applied only to that device, after the global ones::

        comm_bw_frac: 0.6
        h100-sxm:
          gemm_mfu: 0.72

    Only efficiency fields can be overridden this way; peak numbers belong in
    a hardware file (:func:`load_hardware_file`).
    """
    p = Path(path)
    data = _read_mapping(p)
    fields_hint = f"overridable fields are {', '.join(EFFICIENCY_FIELDS)}"
    common: dict[str, object] = {}
    own: dict[str, object] = {}
    sections: dict[str, str] = {}
    for key, value in data.items():
        if key in EFFICIENCY_FIELDS:
            common[key] = _coerce_number(p, key, value)
            continue
        if key in _ALL_FIELDS:
            raise UserInputError(f"{p}: {key}: not an efficiency field; {fields_hint} (define a hardware "
                             "file to change peaks)")
        target = resolve_hardware_id(key) or _normalise(key)
        known = target == hw.id or target in HARDWARE
        if not isinstance(value, dict):
            if known:
                raise UserInputError(f"{p}: {show(key)}={show(value)}: a hardware section must be a mapping "
                                 f"of efficiency fields ({', '.join(EFFICIENCY_FIELDS)}) to values")
            raise UserInputError(
                f"{p}: unknown key {show(key)}{_did_you_mean(key, EFFICIENCY_FIELDS)}: expected an "
                f"efficiency field ({', '.join(EFFICIENCY_FIELDS)}) or a hardware id mapping to such "
                "fields")
        if not known:
            raise UserInputError(f"{p}: unknown hardware id {show(key)}"
                                 f"{_did_you_mean(target, tuple(HARDWARE))}; "
                             f"known ids: {', '.join(HARDWARE)} (and {hw.id!r}, the device being "
                             "configured)")
        if target in sections:
            raise UserInputError(f"{p}: {show(key)} and {show(sections[target])} both name hardware "
                             f"{target!r}; merge them into one section")
        sections[target] = key
        for field, fvalue in value.items():
            if field not in EFFICIENCY_FIELDS:
                name = field if isinstance(field, str) and len(field) <= 60 else show(field)
                raise UserInputError(
                    f"{p}: {key}.{name}: not an efficiency field"
                    f"{_did_you_mean(field, EFFICIENCY_FIELDS)}; {fields_hint} (define a hardware "
                    "file to change peaks)")
            number = _coerce_number(p, f"{key}.{field}", fvalue)
            # Every section is checked, not only the one that applies here.
            try:
                check_efficiency(target, field, number)
            except ValueError as err:
                raise UserInputError(f"{p}: {key}.{field}: {err}") from None
            if target == hw.id:
                own[field] = number
    try:
        return with_overrides(hw, **{**common, **own})
    except ValueError as err:
        raise UserInputError(f"{p}: {err}") from None
