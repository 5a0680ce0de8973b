"""vLLM's engine flags, declared once: the argparse flags of every command,
the fields of the engine's and the simulator's arguments, the words of a
``vllm serve`` line and the tuner's defaults all come from here.

The declaration is :class:`SchedulerCacheOptions`: a frozen dataclass of
the scheduler and KV-cache settings every entry point shares, each field
named as vLLM's engine argument, typed, with vLLM's default (None: vLLM
fills its default for the usage context and device,
``scheduler_defaults.resolve_scheduler_limits``) and its help in the
field's metadata (:func:`flag`, :class:`FlagHelp`).

Why a dataclass that the engine's ``EngineArgs`` and the simulator's
``EngineOptions`` both extend, rather than a table of names each of them
redeclares, or a field holding it: as vLLM derives its CLI from
``EngineArgs``, a field added here is at once a field of both, a flag and
a serve-line word, and a type checker sees every use of it; extending
(not nesting) keeps ``options.max_num_seqs`` and the run spec's JSON as
they were. The fields are keyword-only, so an extending class keeps its
own positional fields (``EngineArgs(model)``).

From it:

- :func:`add_scheduler_cache_flags` adds the flags (type, default, choices
  and help from the fields, by :func:`add_declared_flags`), plus the few
  whose default differs between entry points (``dtype``,
  ``async_scheduling``, ``speculative_config``, ``seed``: ``generate`` runs
  a PyTorch model on a CPU, ``simulate`` models ``vllm serve`` on GPUs),
  given by the caller in ``EngineFlagDefaults``;
- :func:`add_declared_flags` adds the flags of any dataclass declared so
  (a field's short spellings, value name, choices, a tuple as one or more
  words, a switch): the simulator's own engine options (``EngineOptions``'
  fields), its instance groups' DP routing and admission
  (``InstanceGroup``) and its deployment's P/D connector and proxy
  (``DeploymentSpec``) are declared there, each field with its flag, and
  vllm bench serve's dataset options; ``kvsched profile`` spells the serve
  flags it passes on from the same names (:func:`option`,
  :func:`negation`, :func:`declared_flag`);
- the run spec reads the fields through ``EngineOptions``' type hints;
- :func:`vllm_words` writes a setting as a ``vllm serve`` line spells it,
  nothing at vLLM's default (the tuner's serve lines; which settings vllm
  serve takes at all is vLLM's own flag list's, kvsched.sim.serve_line);
- the tuner's candidates take their defaults from ``EngineOptions()``.

The rules of each value are their owners' (kvsched.config,
kvsched.scheduler_defaults). Base layer: argparse, dataclasses and the
config module only.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
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


@dataclass(frozen=True, slots=True)
class FlagHelp:
    """What a field's type and default do not say about its flag: the help
    (``{scope}`` stands for what the limits apply to, e.g. " per engine
    core"; ``{default}`` for the field's default; ``%(default)s`` is
    argparse's, the parser's default), the values it takes, its other
    spellings (vLLM's ``-tp`` for ``--tensor-parallel-size``) and the name
    of its value in ``--help`` (None: argparse's, the flag in capitals)."""

    help: str
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    metavar: str | None = None


def flag(default: Any, help: str, choices: tuple[str, ...] = (), *, aliases: tuple[str, ...] = (),
         metavar: str | None = None) -> Any:
    """A dataclass field declaring a flag: its default, and its help in the
    field's metadata (:func:`add_declared_flags` adds the flag)."""
    # Any: dataclass() takes the field for the default it declares.
    return field(default=default, metadata={"flag": FlagHelp(help, choices, aliases, metavar)})


_BY_CONTEXT = "(default: vLLM's for this entry point and device)"


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerCacheOptions:
    """vLLM's scheduler and KV-cache engine arguments, as every entry point
    takes them (vLLM's names, types and defaults; None: vLLM's default for
    the entry point and device). The order is the flags' in ``--help``."""

    max_num_seqs: int | None = flag(
        None, f"most requests running at once{{scope}}, at most {MAX_STEP_LIMIT:,} {_BY_CONTEXT}")
    max_num_batched_tokens: int | None = flag(
        None, f"token budget of one engine step{{scope}}, at most {MAX_STEP_LIMIT:,} {_BY_CONTEXT}")
    max_model_len: int | None = flag(
        None, "longest prompt + output a request may have; longer ones are refused "
              "(default: the model's context length)")
    enable_chunked_prefill: bool = flag(
        True, "split long prompts over several steps (default: on, as vLLM's v1)")
    enable_prefix_caching: bool = flag(
        True, "reuse KV blocks of shared prompt prefixes (default: on, as vLLM's v1)")
    block_size: int = flag(
        DEFAULT_BLOCK_SIZE, f"tokens per KV cache block, 1 to {MAX_BLOCK_SIZE} (default: %(default)s)")
    gpu_memory_utilization: float = flag(
        DEFAULT_GPU_MEMORY_UTILIZATION,
        "share of GPU memory vLLM may use; the KV cache gets what the weights and activations "
        "leave (default: %(default)s)")
    long_prefill_token_threshold: int = flag(
        0, "cap on a long prompt's tokens per step when chunking (0: off; default: %(default)s)")
    scheduling_policy: str = flag(
        POLICIES[0], "order of the waiting queue (default: %(default)s)", POLICIES)
    num_gpu_blocks_override: int | None = flag(
        None, f"KV cache blocks{{scope}} (counting vLLM's null block), 2 to {MAX_NUM_GPU_BLOCKS:,}, "
              "instead of what memory leaves")
    # vLLM 0.34's admission knobs (kvsched.config checks them, and refuses
    # them for a release without them).
    max_num_inflight_kv_loads: int | None = flag(
        None, "vLLM 0.34: most requests holding KV blocks for an asynchronous KV connector load "
              "before they run; also lets such loads start while the batch is full "
              "(default: no cap)")
    cache_aware_admission_window: int = flag(
        0, "vLLM 0.34: among the first N waiting requests, admit those with a cached prefix "
           "first (FCFS with prefix caching; 0: off; default: %(default)s)")
    cache_aware_admission_threshold: float = flag(
        0.5, "vLLM 0.34: KV cache usage from which --cache-aware-admission-window reorders "
             "(default: %(default)s)")


# The fields of the declaration, in its order.
SHARED_FLAGS = tuple(f.name for f in dataclasses.fields(SchedulerCacheOptions))
# The flags add_scheduler_cache_flags adds, by their argparse dest: the
# declaration's and those whose default is the entry point's.
SCHEDULER_CACHE_FLAGS = (*SHARED_FLAGS, "async_scheduling", "speculative_config", "dtype", "seed")


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


def option(name: str) -> str:
    """The flag of an engine argument, as vLLM spells it: ``max_num_seqs`` -> ``--max-num-seqs``."""
    return "--" + name.replace("_", "-")


def declared_flag(declared: type, name: str) -> FlagHelp:
    """The help, choices and spellings ``declared`` gives its field ``name``
    (a KeyError for a field declared without a flag)."""
    f = next((f for f in dataclasses.fields(declared) if f.name == name), None)
    if f is None or "flag" not in f.metadata:
        raise KeyError(f"{declared.__name__}.{name} declares no flag")
    doc: FlagHelp = f.metadata["flag"]
    return doc


def _argparse_kwargs(f: dataclasses.Field[Any], kind: Any, scope: str) -> dict[str, Any]:
    """add_argument's keywords for one declared field."""
    doc: FlagHelp = f.metadata["flag"]
    # replace, not str.format: a help may show JSON, braces and all.
    # {default} is the declared default, which a command may leave out of
    # its parser (simulate's --model is None until a pasted serve line is read).
    kwargs: dict[str, Any] = {"help": doc.help.replace("{scope}", scope).replace("{default}", str(f.default))}
    if doc.metavar is not None:
        kwargs["metavar"] = doc.metavar
    if kind is bool:
        # A switch on by default takes --no-X (vLLM's BooleanOptionalAction);
        # one off by default is turned on by its name alone (store_true).
        kwargs["action"] = argparse.BooleanOptionalAction if f.default else "store_true"
    else:
        # int | None -> int: None is the flag left out (a tuple's own
        # arguments, tuple[str, ...], are not unwrapped).
        parts = typing.get_args(kind)
        item = next(t for t in parts if t is not type(None)) if type(None) in parts else kind
        if typing.get_origin(item) is tuple:
            # tuple[str, ...]: one or more words, as vLLM's list flags (--lora-modules).
            kwargs["nargs"] = "+"
            item = typing.get_args(item)[0]
        if doc.choices:
            kwargs["choices"] = list(doc.choices)
        elif item is not str:  # argparse's values are text already
            kwargs["type"] = item
    if isinstance(f.default, tuple):
        # argparse gives an nargs="+" flag's words as a list; so its default.
        kwargs["default"] = list(f.default)
    elif f.default is not None and f.default is not False:
        kwargs["default"] = f.default
    return kwargs


def add_declared_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup | OnlyFlags,
                       declared: type, scope: str = "", names: Sequence[str] | None = None) -> None:
    """The flags of a dataclass whose fields are declared with :func:`flag`
    (vLLM's scheduler and cache options, the simulator's engine options and
    its instance groups' routing, vllm bench serve's dataset options): each
    named as its field, typed as it, defaulting to its default; ``scope``
    fills the help's ``{scope}``. ``names``: only those fields' flags, in
    that order (a command's ``--help`` puts other flags between a
    declaration's); None: every declared field's, in the fields' order
    (fields without a flag, such as a group's engine, are not flags)."""
    hints = typing.get_type_hints(declared)
    flagged = {f.name: f for f in dataclasses.fields(declared) if "flag" in f.metadata}
    for name in flagged if names is None else names:
        f = flagged[name]
        parser.add_argument(option(name), *f.metadata["flag"].aliases,
                            **_argparse_kwargs(f, hints[name], scope))


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
    add_declared_flags(p, SchedulerCacheOptions, per)
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


def negation(name: str) -> str:
    """The flag turning a switch off, as vLLM spells it: ``enable_prefix_caching`` ->
    ``--no-enable-prefix-caching``."""
    return "--no-" + name.replace("_", "-")


def vllm_words(name: str, value: object, default: object = None) -> list[str]:
    """One engine argument as a ``vllm serve`` line writes it: nothing at
    ``default`` (vLLM's) or None (vLLM's per-context default); a switch as
    ``--flag``/``--no-flag``; a number as short as it reads back exactly
    (4.0 as ``4``, 0.95 as ``0.95``)."""
    if value is None or value == default:
        return []
    if isinstance(value, bool):
        return [option(name)] if value else [negation(name)]
    if isinstance(value, float):
        short = f"{value:g}"
        return [option(name), short if float(short) == value else repr(value)]
    return [option(name), str(value)]


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
