"""Engine arguments with vLLM's names and defaults, checked before anything loads."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, fields
from typing import Any

from kvsched.config import (
    SpeculativeConfig,
    check_gpu_memory_utilization,
    check_long_prefill_token_threshold,
    check_num_gpu_blocks_override,
    check_speculative_with_async,
    speculative_object,
)
from kvsched.errors import UserInputError
from kvsched.scheduler_defaults import check_optional_limit

# vLLM's CPU backend reserves 4 GiB for the KV cache unless told otherwise;
# tensors are allocated lazily, so an unused cache costs no RAM.
DEFAULT_KV_CACHE_MEMORY = 4 << 30

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_bytes(value: int | str, name: str = "kv_cache_memory") -> int:
    """An integer byte count, or text like ``512MiB``, ``4G`` or ``2GiB``."""
    if isinstance(value, bool):
        raise UserInputError(f"{name}={value!r}: give a byte count such as 4294967296 or '4GiB'")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", str(value), re.I)
        if not m:
            raise UserInputError(f"{name}={value!r}: not a size; write a byte count or e.g. '512MiB', '4GiB'")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n <= 0:
        raise UserInputError(f"{name}={value!r}: must be positive")
    return n


# The keys of --speculative-config the engine takes (vLLM's names).
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
# vLLM's methods that run a drafter model (kvsched's engine runs none).
DRAFTER_METHODS = ("eagle", "eagle3", "mtp", "draft_model", "medusa", "mlp_speculator", "dflash")


def parse_speculative_config(value: object, async_scheduling: bool = False) -> SpeculativeConfig | None:
    """vLLM's ``speculative_config``: a dict, its JSON text (the CLI's
    ``--speculative-config '{"method": "ngram", ...}'``), a SpeculativeConfig,
    or None (off). Every problem is one ValueError naming the field."""
    if value is None or isinstance(value, SpeculativeConfig):
        config = value
    else:
        value = speculative_object(value)
        for key in value:
            if key not in SPECULATIVE_KEYS:
                close = difflib.get_close_matches(str(key), SPECULATIVE_KEYS, n=1, cutoff=0.6)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise UserInputError(f"speculative_config.{key}: unknown key; {hint}kvsched's engine "
                                 f"takes {', '.join(SPECULATIVE_KEYS)}")
        method = value.get("method")
        if method is None:
            raise UserInputError("speculative_config.method: missing; give the proposer, 'ngram' "
                             "(or 'ngram_gpu' with async scheduling)")
        if method == "[ngram]":  # vLLM's alias
            method = "ngram"
        if method in DRAFTER_METHODS:
            raise UserInputError(f"speculative_config.method={method!r}: eagle/mtp need a drafter model "
                             "kvsched's engine does not run; use method 'ngram' (or 'ngram_gpu' with "
                             "async scheduling)")
        if method not in ("ngram", "ngram_gpu"):
            close = difflib.get_close_matches(str(method), ("ngram", "ngram_gpu"), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserInputError(f"speculative_config.method={method!r}: unknown speculative method; "
                             f"{hint}kvsched's engine runs 'ngram' ('ngram_gpu' with async "
                             "scheduling)")
        if "num_speculative_tokens" not in value:
            raise UserInputError("speculative_config.num_speculative_tokens: missing; give the number of "
                             "draft tokens proposed per step, e.g. 3")
        config = SpeculativeConfig(
            method=method, num_speculative_tokens=value["num_speculative_tokens"],
            prompt_lookup_min=value.get("prompt_lookup_min"),
            prompt_lookup_max=value.get("prompt_lookup_max"))
    if config is None:
        return None
    if config.uses_drafter:
        raise UserInputError(f"speculative_config.method={config.method!r}: eagle/mtp need a drafter "
                         "model kvsched's engine does not run; use method 'ngram'")
    check_speculative_with_async(config, async_scheduling)
    if config.method == "ngram_gpu" and not async_scheduling:
        raise UserInputError(
            "speculative_config.method='ngram_gpu': kvsched's engine runs the GPU n-gram proposer "
            "only with async scheduling (synchronously, vLLM hands its -1-padded drafts to the "
            "scheduler, which kvsched's scheduler does not take); use method 'ngram', or turn "
            "async_scheduling on")
    return config


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
    # vLLM's --speculative-config (a dict or its JSON text); validate() turns
    # it into a SpeculativeConfig.
    speculative_config: dict[str, Any] | str | SpeculativeConfig | None = None
    # vLLM's --async-scheduling: schedule step N+1 before step N's output is
    # applied. Off by default here: on CPU the model runs each step to the
    # end before the next is scheduled, so it buys no overlap.
    async_scheduling: bool = False

    @classmethod
    def from_kwargs(cls, model: str, **kwargs: Any) -> EngineArgs:
        """``LLM(model, **kwargs)``: unknown names are an error, not ignored."""
        if "kv_cache_memory_bytes" in kwargs:  # vLLM's spelling
            kwargs["kv_cache_memory"] = kwargs.pop("kv_cache_memory_bytes")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise UserInputError(f"unknown engine argument(s) {', '.join(unknown)}; kvsched accepts "
                             f"{', '.join(sorted(known - {'model'}))}")
        args = cls(model=model, **kwargs)
        args.validate()
        return args

    def validate(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise UserInputError(f"model={self.model!r}: give the path of a Hugging Face checkpoint "
                                 f"directory")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UserInputError(f"device={self.device!r}: use auto, cpu, cuda or cuda:N")
        check_gpu_memory_utilization(self.gpu_memory_utilization)
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_bytes(self.kv_cache_memory)
        check_num_gpu_blocks_override(self.num_gpu_blocks_override)
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise UserInputError(f"block_size={self.block_size!r}: must be a positive integer (vLLM uses 16)")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            check_optional_limit(name, getattr(self, name))
        check_long_prefill_token_threshold(self.long_prefill_token_threshold)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UserInputError(f"seed={self.seed!r}: must be an integer")
        if type(self.async_scheduling) is not bool:
            raise UserInputError(f"async_scheduling={self.async_scheduling!r}: must be True or False")
        self.speculative_config = parse_speculative_config(self.speculative_config,
                                                           self.async_scheduling)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The speculative config as a SpeculativeConfig (validate() stores it so;
        parsed here if it has not run)."""
        config = self.speculative_config
        if config is not None and not isinstance(config, SpeculativeConfig):
            config = parse_speculative_config(config, self.async_scheduling)
        return config
