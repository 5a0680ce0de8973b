"""The deployments ``kvsched tune`` searches: one :class:`Candidate` per
combination of hardware, parallelism and scheduler settings, each written as
``kvsched simulate`` flags and as the ``vllm serve`` line that runs it."""

from __future__ import annotations

import difflib
import itertools
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from kvsched.errors import UserInputError
from kvsched.sim.spec import RunSpec

# vLLM's scheduler defaults, left to vLLM (None): the flag is then not passed.
DEFAULT = None


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment: every field is a ``kvsched simulate`` / ``vllm serve``
    flag (None: vLLM's default for the deployment)."""

    hardware: str
    tensor_parallel_size: int
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    scheduling_policy: str = "fcfs"
    # kvsched's admission hooks (not vLLM flags): none, balance (seed 001's
    # data-parallel gate), prefill-cadence.
    admission_policy: str = "none"

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel_size * self.data_parallel_size

    def apply(self, base: RunSpec) -> RunSpec:
        """``base`` (model, shared engine settings, workload) deployed as this candidate."""
        engine = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "admission_policy"}
        return base.with_engine(**engine).with_group(admission_policy=self.admission_policy)

    def vllm_serve(self, model: str, fixed: Sequence[str] = ()) -> str:
        """The ``vllm serve`` command line (vLLM's flags) of this deployment;
        ``fixed``: vLLM flags every candidate shares."""
        parts = ["vllm", "serve", model, "--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.data_parallel_size > 1:
            parts += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.enable_expert_parallel:
            parts.append("--enable-expert-parallel")
        parts += _serve_flags(self)  # vLLM's defaults are not spelled out
        parts += fixed
        line = shlex.join(parts)
        if self.admission_policy == "balance":
            line += "  # plus seed 001's balance-scheduling patch (not in vLLM 0.33)"
        elif self.admission_policy == "prefill-cadence":
            line += "  # plus prefill_schedule_interval 2 in the scheduler config"
        return line

    def label(self) -> str:
        """A short name for tables."""
        parts = [f"{self.hardware} TP{self.tensor_parallel_size}"]
        if self.data_parallel_size > 1:
            parts.append(f"DP{self.data_parallel_size}")
        if self.enable_expert_parallel:
            parts.append("EP")
        for value, name in ((self.max_num_seqs, "seqs"), (self.max_num_batched_tokens, "mbt")):
            if value is not None:
                parts.append(f"{name} {value}")
        if not self.enable_chunked_prefill:
            parts.append("no-chunked")
        if not self.enable_prefix_caching:
            parts.append("no-prefix-cache")
        if self.kv_cache_dtype != "auto":
            parts.append(f"kv {self.kv_cache_dtype}")
        if self.scheduling_policy != "fcfs":
            parts.append(self.scheduling_policy)
        if self.admission_policy != "none":
            parts.append(self.admission_policy)
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def order_key(self) -> tuple[Any, ...]:
        """A total order (vLLM's default, None, before any value): the
        search's tie-break, so its answer does not depend on arrival order."""
        return tuple((0, 0) if v is None else (1, v) for v in (getattr(self, f.name) for f in fields(self)))


def _serve_flags(c: Candidate) -> list[str]:
    """The scheduler and cache flags that differ from vLLM's defaults (which
    are ``kvsched simulate``'s too): the same words on both command lines."""
    flags: list[str] = []
    if c.max_num_seqs is not None:
        flags += ["--max-num-seqs", str(c.max_num_seqs)]
    if c.max_num_batched_tokens is not None:
        flags += ["--max-num-batched-tokens", str(c.max_num_batched_tokens)]
    if not c.enable_chunked_prefill:
        flags.append("--no-enable-chunked-prefill")
    if not c.enable_prefix_caching:
        flags.append("--no-enable-prefix-caching")
    if c.kv_cache_dtype != "auto":
        flags += ["--kv-cache-dtype", c.kv_cache_dtype]
    if c.scheduling_policy != "fcfs":
        flags += ["--scheduling-policy", c.scheduling_policy]
    return flags


# The dimensions a space file or the flags may list, with their types.
DIMENSIONS: Mapping[str, type] = {f.name: (bool if f.type == "bool" else str if f.type == "str" else int)
                                  for f in fields(Candidate)}
ADMISSION_POLICIES = ("none", "balance", "prefill-cadence")
KV_CACHE_DTYPES = ("auto", "fp8")
POLICIES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class SearchSpace:
    """Lists of values per dimension; the candidates are their product,
    minus combinations that mean nothing (expert parallelism on a dense
    model, an admission gate with one data-parallel rank) or exceed the GPU
    budget."""

    hardware: tuple[str, ...]
    tensor_parallel_size: tuple[int, ...]
    data_parallel_size: tuple[int, ...]
    enable_expert_parallel: tuple[bool, ...] = (False,)
    max_num_seqs: tuple[int | None, ...] = (None,)
    max_num_batched_tokens: tuple[int | None, ...] = (None,)
    enable_chunked_prefill: tuple[bool, ...] = (True,)
    enable_prefix_caching: tuple[bool, ...] = (True,)
    kv_cache_dtype: tuple[str, ...] = ("auto",)
    scheduling_policy: tuple[str, ...] = ("fcfs",)
    admission_policy: tuple[str, ...] = ("none",)

    def candidates(self, max_gpus: int, is_moe: bool) -> Iterator[Candidate]:
        names = [f.name for f in fields(Candidate)]
        for values in itertools.product(*(getattr(self, n) for n in names)):
            c = Candidate(**dict(zip(names, values)))
            if c.num_gpus > max_gpus or (c.enable_expert_parallel and not is_moe):
                continue
            if c.admission_policy == "balance" and c.data_parallel_size == 1:
                continue  # the gate balances ranks: with one there is nothing to do
            yield c


def check_space_values(name: str, values: Sequence[object], where: str) -> tuple[Any, ...]:
    """A dimension's values from a flag or a space file, checked."""
    if name not in DIMENSIONS:
        close = difflib.get_close_matches(name, list(DIMENSIONS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserInputError(f"{where}: unknown dimension {name!r}; "
                             f"{hint}choose from {', '.join(DIMENSIONS)}")
    if not isinstance(values, list | tuple) or not values:
        raise UserInputError(f"{where}: {name} must be a non-empty list of values")
    out: list[Any] = []
    for v in values:
        if name in ("max_num_seqs", "max_num_batched_tokens") and v in (None, "default"):
            out.append(None)
            continue
        kind = DIMENSIONS[name]
        if kind is bool:
            if not isinstance(v, bool):
                raise UserInputError(f"{where}: {name}={v!r}: must be true or false")
        elif kind is int:
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2**24:
                raise UserInputError(f"{where}: {name}={v!r}: must be an integer in [1, 2**24]")
        elif not isinstance(v, str):
            raise UserInputError(f"{where}: {name}={v!r}: must be a string")
        choices = {"admission_policy": ADMISSION_POLICIES, "kv_cache_dtype": KV_CACHE_DTYPES,
                   "scheduling_policy": POLICIES}.get(name)
        if choices is not None and v not in choices:
            raise UserInputError(f"{where}: {name}={v!r}: choose from {', '.join(choices)}")
        out.append(v)
    if len(set(out)) != len(out):
        raise UserInputError(f"{where}: {name} lists a value twice: {values!r}")
    return tuple(out)
