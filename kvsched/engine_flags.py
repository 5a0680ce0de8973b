"""vLLM's scheduler and KV-cache engine flags, defined once for every command.

``add_scheduler_cache_flags`` adds them with vLLM's names; the defaults and
rules are their owners' (kvsched.config, kvsched.scheduler_defaults). What
differs between kvsched's entry points (``generate`` runs a PyTorch model on
a CPU, ``simulate`` models ``vllm serve`` on GPUs) is given by the caller in
``EngineFlagDefaults``. A limit left unset is None, so each entry point fills
vLLM's default for its usage context and device
(``scheduler_defaults.resolve_scheduler_limits``). Base layer: argparse and
the config modules only.
"""

from __future__ import annotations

import argparse
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kvsched.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    MAX_BLOCK_SIZE,
    MAX_NUM_GPU_BLOCKS,
    MAX_STEP_LIMIT,
    POLICIES,
    SPECULATIVE_METHODS,
)

# The flags add_scheduler_cache_flags adds, by their argparse dest.
SCHEDULER_CACHE_FLAGS = (
    "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
    "enable_prefix_caching", "block_size", "gpu_memory_utilization", "long_prefill_token_threshold",
    "scheduling_policy", "num_gpu_blocks_override", "async_scheduling", "speculative_config", "dtype",
    "seed")


@dataclass(frozen=True, slots=True)
class EngineFlagDefaults:
    """What one entry point's flags default to where entry points differ.

    ``dtype``/``dtype_help``: the precision flag (vLLM's ``--dtype``; the
    engine loads a checkpoint, the simulator prices one). ``async_scheduling``:
    vLLM turns it on on GPUs; kvsched's CPU engine gains nothing from it.
    ``speculative_methods``: the methods the entry point runs or prices.
    ``scope``: what the limits apply to, e.g. "per engine core". ``seed``:
    the engine's sampling seed (vLLM's ``--seed``), or None where the
    command's ``--seed`` is another one (simulate's seeds its workload).
    """

    dtype: str = "auto"
    dtype_help: str = "precision of the weights and the KV cache"
    async_scheduling: bool = False
    speculative_methods: tuple[str, ...] = SPECULATIVE_METHODS
    scope: str = ""
    seed: int | None = 0


def add_scheduler_cache_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                              defaults: EngineFlagDefaults,
                              names: Collection[str] = SCHEDULER_CACHE_FLAGS) -> None:
    """vLLM's scheduler and KV-cache flags (SCHEDULER_CACHE_FLAGS, or the
    ``names`` of them a command takes as single values) on ``parser`` (a
    parser or an argument group)."""
    unknown = set(names) - set(SCHEDULER_CACHE_FLAGS)
    assert not unknown, f"add_scheduler_cache_flags: no such flags {sorted(unknown)}"
    p = OnlyFlags(parser, names)
    per = f" {defaults.scope}" if defaults.scope else ""
    p.add_argument("--max-num-seqs", type=int,
                   help=f"most requests running at once{per}, at most {MAX_STEP_LIMIT:,} "
                        "(default: vLLM's for this entry point and device)")
    p.add_argument("--max-num-batched-tokens", type=int,
                   help=f"token budget of one engine step{per}, at most {MAX_STEP_LIMIT:,} "
                        "(default: vLLM's for this entry point and device)")
    p.add_argument("--max-model-len", type=int,
                   help="longest prompt + output a request may have; longer ones are refused "
                        "(default: the model's context length)")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="split long prompts over several steps (default: on, as vLLM's v1)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse KV blocks of shared prompt prefixes (default: on, as vLLM's v1)")
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE,
                   help=f"tokens per KV cache block, 1 to {MAX_BLOCK_SIZE} (default: %(default)s)")
    p.add_argument("--gpu-memory-utilization", type=float, default=DEFAULT_GPU_MEMORY_UTILIZATION,
                   help="share of GPU memory vLLM may use; the KV cache gets what the weights "
                        "and activations leave (default: %(default)s)")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0,
                   help="cap on a long prompt's tokens per step when chunking (0: off; "
                        "default: %(default)s)")
    p.add_argument("--scheduling-policy", choices=list(POLICIES), default=POLICIES[0],
                   help="order of the waiting queue (default: %(default)s)")
    p.add_argument("--num-gpu-blocks-override", type=int,
                   help=f"KV cache blocks{per} (counting vLLM's null block), 2 to "
                        f"{MAX_NUM_GPU_BLOCKS:,}, instead of what memory leaves")
    on_off = "on" if defaults.async_scheduling else "off"
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction,
                   default=defaults.async_scheduling,
                   help="vLLM's async scheduling: schedule step N+1 before step N's output is "
                        f"applied (default: {on_off})")
    p.add_argument("--speculative-config", metavar="JSON",
                   help="speculative decoding as vLLM takes it, e.g. '{\"method\": \"ngram\", "
                        "\"num_speculative_tokens\": 3}' (methods: "
                        f"{', '.join(defaults.speculative_methods)}; default: off)")
    p.add_argument("--dtype", default=defaults.dtype,
                   help=f"{defaults.dtype_help} (default: %(default)s)")
    if defaults.seed is not None:
        p.add_argument("--seed", type=int, default=defaults.seed,
                       help="the engine's random seed (vLLM's --seed; default: %(default)s)")


class OnlyFlags:
    """A parser (or group) that adds only the flags whose dest is in
    ``names``: one definition of a flag set serves commands that take part
    of it."""

    def __init__(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                 names: Collection[str]) -> None:
        self.parser, self.names = parser, names

    def add_argument(self, *flags: str, **kwargs: Any) -> None:
        dest = flags[0].lstrip("-").replace("-", "_")
        if dest in self.names:
            self.parser.add_argument(*flags, **kwargs)
