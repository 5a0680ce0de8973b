"""Engine arguments with vLLM's names and defaults, checked before anything loads."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from kvsched.config import (
    check_gpu_memory_utilization,
    check_long_prefill_token_threshold,
    check_num_gpu_blocks_override,
)
from kvsched.scheduler_defaults import check_optional_limit

# vLLM's CPU backend reserves 4 GiB for the KV cache unless told otherwise;
# tensors are allocated lazily, so an unused cache costs no RAM.
DEFAULT_KV_CACHE_MEMORY = 4 << 30

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_bytes(value: int | str, name: str = "kv_cache_memory") -> int:
    """An integer byte count, or text like ``512MiB``, ``4G`` or ``2GiB``."""
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r}: give a byte count such as 4294967296 or '4GiB'")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", str(value), re.I)
        if not m:
            raise ValueError(f"{name}={value!r}: not a size; write a byte count or e.g. '512MiB', '4GiB'")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n <= 0:
        raise ValueError(f"{name}={value!r}: must be positive")
    return n


@dataclass(slots=True)
class EngineArgs:
    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    block_size: int = 16
    num_gpu_blocks_override: int | None = None
    kv_cache_memory: int | str | None = None
    gpu_memory_utilization: float = 0.9

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """``LLM(model, **kwargs)``: unknown names are an error, not ignored."""
        if "kv_cache_memory_bytes" in kwargs:  # vLLM's spelling
            kwargs["kv_cache_memory"] = kwargs.pop("kv_cache_memory_bytes")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine argument(s) {', '.join(unknown)}; kvsched accepts "
                             f"{', '.join(sorted(known - {'model'}))}")
        args = cls(model=model, **kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model={self.model!r}: give the path of a Hugging Face checkpoint directory")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device={self.device!r}: use auto, cpu, cuda or cuda:N")
        check_gpu_memory_utilization(self.gpu_memory_utilization)
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_bytes(self.kv_cache_memory)
        check_num_gpu_blocks_override(self.num_gpu_blocks_override)
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r}: must be a positive integer (vLLM uses 16)")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            check_optional_limit(name, getattr(self, name))
        check_long_prefill_token_threshold(self.long_prefill_token_threshold)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed={self.seed!r}: must be an integer")
