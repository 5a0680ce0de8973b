"""Engine arguments with vLLM's names and defaults, checked before anything loads."""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, fields
from typing import Any

from kvsched.config import (
    DEFAULT_BLOCK_SIZE,
    MAX_BLOCK_SIZE,
    NGRAM_METHODS,
    SpeculativeConfig,
    check_cache_aware_admission_threshold,
    check_cache_aware_admission_window,
    check_gpu_memory_utilization,
    check_long_prefill_token_threshold,
    check_max_num_inflight_kv_loads,
    check_num_gpu_blocks_override,
    check_speculative_with_async,
    resolve_speculative_method,
    speculative_object,
)
from kvsched.engine_flags import SchedulerCacheOptions
from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.jsonfile import show
from kvsched.scheduler_defaults import UsageContext, check_optional_limit

# vLLM's CPU backend reserves 4 GiB for the KV cache unless told otherwise.
# The engine zeroes its cache (every page is touched), so the default is
# capped at what max_num_seqs x max_model_len tokens can fill (see
# kvsched.engine.core.num_kv_blocks).
DEFAULT_KV_CACHE_MEMORY = 4 << 30

_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}

# The seeds torch's generators take (torch.Generator.manual_seed's documented
# range; a negative seed is read modulo 2**64): beyond it torch raises a bare
# "Overflow when unpacking long".
MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1


def check_seed(field: str, value: object) -> None:
    """None or an integer torch can seed a generator with."""
    if value is None:
        return
    if not is_int(value):
        raise UserInputError(f"{field}={show(value)}: must be an integer")
    if not MIN_SEED <= value <= MAX_SEED:
        raise UserInputError(f"{field}={show(value)}: outside the seeds torch takes "
                         f"[-2**63, 2**64 - 1]; give a smaller seed")


def parse_bytes(value: int | str, name: str = "kv_cache_memory") -> int:
    """An integer byte count, or text like ``512MiB``, ``4G`` or ``2GiB``."""
    field = f"{name}={show(value)} (--{name.replace('_', '-')})"
    if isinstance(value, bool):
        raise UserInputError(f"{field}: give a byte count such as 4294967296 or '4GiB'")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", str(value), re.I)
        if not m:
            raise UserInputError(f"{field}: not a size; write a byte count or e.g. '512MiB', '4GiB'")
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
    if n <= 0:
        raise UserInputError(f"{field}: must be positive")
    return n


# The keys of --speculative-config the engine takes (vLLM's names).
SPECULATIVE_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
# vLLM's methods other than these need a drafter model the engine does not run.
_NO_DRAFTER = ("eagle/mtp need a drafter model kvsched's engine does not run (nor does it run vLLM's "
               "other proposers); use method 'ngram' (or 'ngram_gpu' with async scheduling)")


def engine_speculative_config(value: object, async_scheduling: bool = False) -> SpeculativeConfig | None:
    """The engine's reading of vLLM's ``speculative_config``: a dict, its
    JSON text (the CLI's ``--speculative-config '{"method": "ngram", ...}'``),
    a SpeculativeConfig, or None (off); the engine runs the n-gram methods
    only (the simulator's reading, which prices drafter models too, is
    kvsched.sim.speculative.parse_speculative_config). The method names and
    aliases are kvsched.config's. Every problem is one ValueError naming the
    field."""
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
        if value.get("method") is None:
            raise UserInputError("speculative_config.method: missing; give the proposer, 'ngram' "
                             "(or 'ngram_gpu' with async scheduling)")
        method = resolve_speculative_method(value["method"], NGRAM_METHODS, _NO_DRAFTER)
        if "num_speculative_tokens" not in value:
            raise UserInputError("speculative_config.num_speculative_tokens: missing; give the number of "
                             "draft tokens proposed per step, e.g. 3")
        config = SpeculativeConfig(
            method=method, num_speculative_tokens=value["num_speculative_tokens"],
            prompt_lookup_min=value.get("prompt_lookup_min"),
            prompt_lookup_max=value.get("prompt_lookup_max"))
    if config is None:
        return None
    if config.method not in NGRAM_METHODS:
        raise UserInputError(f"speculative_config.method={config.method!r}: {_NO_DRAFTER}")
    check_speculative_with_async(config, async_scheduling)
    if config.method == "ngram_gpu" and not async_scheduling:
        raise UserInputError(
            "speculative_config.method='ngram_gpu': kvsched's engine runs the GPU n-gram proposer "
            "only with async scheduling (synchronously, vLLM hands its -1-padded drafts to the "
            "scheduler, which kvsched's scheduler does not take); use method 'ngram', or turn "
            "async_scheduling on")
    return config


@dataclass(frozen=True, slots=True)
class EngineArgs(SchedulerCacheOptions):
    """The engine's arguments: vLLM's scheduler and KV-cache ones
    (:class:`~kvsched.engine_flags.SchedulerCacheOptions`, declared once
    for every entry point) and the engine's own. :meth:`from_kwargs` checks
    them; frozen, so what was checked is what runs."""

    model: str
    tokenizer: str | None = None
    dtype: str = "auto"
    device: str = "auto"
    seed: int = 0
    kv_cache_memory: int | str | None = None
    # vLLM's --speculative-config (a dict or its JSON text); validated() turns
    # it into a SpeculativeConfig.
    speculative_config: dict[str, Any] | str | SpeculativeConfig | None = None
    # vLLM's --async-scheduling: schedule step N+1 before step N's output is
    # applied. Off by default here: on CPU the model runs each step to the
    # end before the next is scheduled, so it buys no overlap.
    async_scheduling: bool = False
    # The entry point, which picks vLLM's batch defaults: kvsched.LLM is
    # vLLM's LLM class; `kvsched serve` is its API server.
    usage_context: UsageContext = UsageContext.LLM_CLASS

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
        return cls(model=model, **kwargs).validated()

    def validated(self) -> EngineArgs:
        """These arguments checked, each bad one named; the copy returned
        holds ``kv_cache_memory`` in bytes and ``speculative_config`` as a
        SpeculativeConfig."""
        if not isinstance(self.model, str) or not self.model:
            raise UserInputError(f"model={self.model!r}: give the path of a Hugging Face checkpoint "
                                 f"directory")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise UserInputError(f"device={self.device!r}: use auto, cpu, cuda or cuda:N")
        check_gpu_memory_utilization(self.gpu_memory_utilization)
        kv_cache_memory = None if self.kv_cache_memory is None else parse_bytes(self.kv_cache_memory)
        check_num_gpu_blocks_override(self.num_gpu_blocks_override)
        block = self.block_size
        if not is_int(block) or not 1 <= block <= MAX_BLOCK_SIZE:
            raise UserInputError(f"block_size={show(block)} (--block-size): must be an integer in "
                             f"[1, {MAX_BLOCK_SIZE}] (a longer block outgrows most requests' whole "
                             f"context); vLLM's default is {DEFAULT_BLOCK_SIZE}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens"):
            check_optional_limit(name, getattr(self, name))
        check_long_prefill_token_threshold(self.long_prefill_token_threshold)
        check_max_num_inflight_kv_loads(self.max_num_inflight_kv_loads)
        check_cache_aware_admission_window(self.cache_aware_admission_window)
        check_cache_aware_admission_threshold(self.cache_aware_admission_threshold)
        if self.seed is None:
            raise UserInputError("seed=None: must be an integer (vLLM's default is 0)")
        check_seed("seed", self.seed)
        if not isinstance(self.usage_context, UsageContext):
            raise UserInputError(f"usage_context={self.usage_context!r}: must be a kvsched "
                                 "UsageContext (LLM_CLASS or OPENAI_API_SERVER)")
        if type(self.async_scheduling) is not bool:
            raise UserInputError(f"async_scheduling={self.async_scheduling!r}: must be True or False")
        speculative = engine_speculative_config(self.speculative_config, self.async_scheduling)
        return dataclasses.replace(self, kv_cache_memory=kv_cache_memory, speculative_config=speculative)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """The speculative config as a SpeculativeConfig (validated() stores it so;
        parsed here if it has not run)."""
        config = self.speculative_config
        if config is not None and not isinstance(config, SpeculativeConfig):
            config = engine_speculative_config(config, self.async_scheduling)
        return config
