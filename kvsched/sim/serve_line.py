"""A pasted ``vllm serve`` line and ``vllm bench serve`` line, as kvsched's flags.

``kvsched simulate --serve "vllm serve MODEL ..." --bench "vllm bench serve
..."`` takes both lines as a user runs them. Each line is split as a shell
would (quotes, ``\\`` line continuations, ``NAME=value`` environment
prefixes) and read against the flag list of the vLLM release simulated
(``--vllm-version``: ``data/vllm_flags_<release>.json``, written from that
release's parsers by ``benchmarks/real_vllm/list_vllm_flags.py``), so a
flag takes a value exactly when that release's does, and a flag the release
does not have is refused as its ``vllm serve`` refuses it, naming the
releases that have it. :func:`classify` then sorts every flag of every
release, by the one table here, into:

- ``used``: it becomes the kvsched flag of the same name (vLLM's engine
  arguments and ``vllm bench serve``'s workload arguments are kvsched's
  names), or one of the few mapped below (the positional model,
  ``--spec-*``, ``--input-len``/``--output-len``, ``--ignore-eos``);
- ``no effect``: known and left out of the prediction, with the reason
  (the server's address, API keys, logging, chat templates, ...): listed
  once in an "ignored" note, never dropped silently;
- ``refused``: it would change the prediction and kvsched does not model
  it: an error naming the flag, the reason and what to do (a value equal
  to vLLM's default is taken as no effect).

A flag that is no vLLM flag at all is an error with a did-you-mean.
:func:`paste` returns the kvsched flags (:class:`Pasted`);
:func:`kvsched.sim.flags.with_pasted` merges them with the flags given
beside ``--serve``/``--bench``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from kvsched.engine_flags import vllm_words
from kvsched.errors import UserInputError
from kvsched.jsonfile import strict_loads
from kvsched.perf.hardware import Hardware
from kvsched.sim.deployment import EngineOptions, resolve_cache
from kvsched.vllm_versions import VLLM_VERSIONS, check_vllm_version

DATA = Path(__file__).resolve().parent / "data"


def flags_file(release: str) -> Path:
    """The flag list of a modelled release (``release``: major.minor, as
    --vllm-version names it)."""
    return DATA / f"vllm_flags_{release}.json"


SERVE, BENCH = "serve", "bench"
# How each line names itself in messages (the kvsched flag it came in).
LINE_FLAG = {SERVE: "--serve", BENCH: "--bench"}
LINE_NAME = {SERVE: "vllm serve", BENCH: "vllm bench serve"}

USED, NO_EFFECT, REFUSED = "used", "no effect", "refused"


@dataclass(frozen=True, slots=True)
class VllmFlag:
    """One flag of vLLM's parser: its spellings, the ``--no-`` spellings
    that turn a switch off, its argparse dest, and how many words follow it
    (none, one, optional, many)."""

    options: tuple[str, ...]
    negations: tuple[str, ...]
    dest: str
    arity: str


@dataclass(frozen=True, slots=True)
class VllmFlags:
    """One release's flags for both commands, as its
    ``data/vllm_flags_<release>.json`` lists them: ``release`` as kvsched
    names it (major.minor), ``version`` the vLLM the list was written from."""

    release: str
    version: str
    serve_default_model: str
    serve: tuple[VllmFlag, ...]
    bench: tuple[VllmFlag, ...]

    def of(self, command: str) -> tuple[VllmFlag, ...]:
        return self.serve if command == SERVE else self.bench

    def lookup(self, command: str) -> dict[str, tuple[VllmFlag, bool]]:
        """Every spelling of the command's flags -> (flag, whether the
        spelling turns it off)."""
        out: dict[str, tuple[VllmFlag, bool]] = {}
        for flag in self.of(command):
            out.update({o: (flag, False) for o in flag.options})
            out.update({o: (flag, True) for o in flag.negations})
        return out


@functools.cache
def vllm_flags(release: str) -> VllmFlags:
    """The committed flag list of ``release`` (read once; it is part of the
    package)."""
    check_vllm_version(release, flag="--vllm-version")
    data = json.loads(flags_file(release).read_text(encoding="utf-8"))
    if not str(data["vllm_version"]).startswith(release + "."):
        raise AssertionError(f"{flags_file(release)} was written from vLLM {data['vllm_version']}, "
                             f"not {release}")

    def read(part: dict[str, list[dict[str, object]]]) -> tuple[VllmFlag, ...]:
        return tuple(VllmFlag(tuple(f["options"]), tuple(f["negations"]), str(f["dest"]),  # type: ignore[arg-type]
                              str(f["arity"])) for f in part["flags"])

    return VllmFlags(release, data["vllm_version"], data["serve_default_model"], read(data["serve"]),
                     read(data["bench"]))


def every_release() -> dict[str, VllmFlags]:
    """Each modelled release's flag list, oldest first."""
    return {release: vllm_flags(release) for release in VLLM_VERSIONS}


@functools.cache
def serve_dests(release: str) -> frozenset[str]:
    """The engine arguments ``release``'s ``vllm serve`` line can carry (the
    dests of its serve flags): which of kvsched's settings a written serve
    line spells out, the others being kvsched's own."""
    return frozenset(f.dest for f in vllm_flags(release).serve)


@functools.cache
def serve_dests_of_every_release() -> frozenset[str]:
    """The engine arguments every modelled release's ``vllm serve`` takes
    (a tuner candidate's line, written before a release is chosen)."""
    return frozenset.intersection(*(serve_dests(release) for release in VLLM_VERSIONS))


def missing_from_release(command: str, spelling: str, release: str,
                         releases: Mapping[str, VllmFlags]) -> str | None:
    """Why ``release`` refuses ``spelling`` though another release of
    ``releases`` takes it, with the fix; None when no other release takes it
    either (a flag vLLM never had: the caller's did-you-mean), or when
    ``release`` takes it."""
    having = [r for r, flags in releases.items() if spelling in flags.lookup(command)]
    if not having or release in having:
        return None
    order = list(releases)
    newer = [r for r in having if order.index(r) > order.index(release)]
    # A newer release added it; an older one had it and a later one dropped it.
    change = f"vLLM {newer[0]} added it" if newer else f"vLLM {having[-1]} had it"
    use = newer[0] if newer else having[-1]
    return (f"vLLM {release} has no {spelling} ({change}); drop it, or simulate vLLM {use} with "
            f"--vllm-version {use}")


# The settings whose vLLM default is the release's (and the deployment's):
# a written serve line spells them only where they differ from what that
# release would run with unset (release_serve_words).
RELEASE_DEFAULTED = ("block_size", "gpu_memory_utilization", "enable_extensible_kv_cache")


def release_serve_words(opts: EngineOptions, hardware: Hardware,
                        registers_kv_cache: bool = False) -> list[str]:
    """:data:`RELEASE_DEFAULTED` as ``opts.vllm_version``'s ``vllm serve``
    takes them on ``hardware``: nothing for a setting unset or equal to what
    that release resolves it to unset (0.33's block size 16 is left out,
    0.34's written; 0.34's gpu_memory_utilization 0.92 is written where its
    extensible KV cache would take 1.0), nor for one the release has no flag
    for (0.33's extensible KV cache). ``registers_kv_cache``: the line's
    connector registers the cache (NIXL)."""
    given = resolve_cache(opts, hardware, registers_kv_cache)
    unset = resolve_cache(dataclasses.replace(opts, block_size=None, gpu_memory_utilization=None),
                          hardware, registers_kv_cache)
    automatic = resolve_cache(dataclasses.replace(opts, enable_extensible_kv_cache=None, block_size=None,
                                                  gpu_memory_utilization=None), hardware, registers_kv_cache)
    defaults = {"block_size": unset.block_size, "gpu_memory_utilization": unset.gpu_memory_utilization,
                "enable_extensible_kv_cache": automatic.extensible_kv_cache}
    values = {"block_size": opts.block_size, "gpu_memory_utilization": opts.gpu_memory_utilization,
              "enable_extensible_kv_cache": (None if opts.enable_extensible_kv_cache is None
                                             else given.extensible_kv_cache)}
    # A release without the flag cannot have the setting either
    # (check_release_flags refuses a value for it, and its default is off):
    # nothing to write, and the line stays one that release's vllm serve takes.
    names = [name for name in RELEASE_DEFAULTED if name in serve_dests(opts.vllm_version)]
    return [word for name in names for word in vllm_words(name, values[name], defaults[name])]


# -- the classification: one table -------------------------------------------

@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a flag that changes the prediction is refused, and what to do;
    ``harmless``: values (as written, or True/False for a switch) that are
    vLLM's default and so change nothing."""

    reason: str
    fix: str
    harmless: tuple[object, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str
    reason: str
    refusal: Refusal | None = None


# Flags of vllm serve kvsched maps itself (the rest of its used flags are
# kvsched's flags of the same name).
SERVE_MAPPED = {
    "model_tag": "the model (vllm serve's positional argument): kvsched's --model",
    "model": "the model: kvsched's --model",
    "spec_method": "speculative decoding's method: a key of kvsched's --speculative-config",
    "spec_model": "speculative decoding's draft model: a key of kvsched's --speculative-config",
    "spec_tokens": "speculative decoding's draft length: a key of kvsched's --speculative-config",
}
BENCH_MAPPED = {
    "model": "must be the served model (or one of its --served-model-name); kvsched's --model "
             "without --serve",
    "input_len": "vLLM maps it to --random-input-len",
    "output_len": "vLLM maps it to every dataset's output length (--random-output-len, ...)",
    "ignore_eos": "every request generates its whole output length: kvsched's default "
                  "(--eos-probability 0)",
    "lora_modules": "the adapters requests pick from, by name: kvsched's --lora-names (--serve's "
                    "--lora-modules NAME=PATH declares them)",
}
# Same name, another meaning: not forwarded (the tables below say why).
# vllm bench serve's result-file flags name where the real benchmark writes;
# kvsched takes the same flags, but a pasted line's must not make the
# prediction overwrite a measurement.
# vllm serve's --tokenizer is the server's; the datasets count with the bench
# line's (vLLM's client tokenizer, the model's unless its --tokenizer says).
NOT_FORWARDED = {SERVE: ("seed", "tokenizer"),
                 BENCH: ("save_result", "save_detailed", "append_result", "result_dir", "result_filename",
                         "metadata", "label")}

# vLLM's flags that change nothing kvsched predicts, by the reason, for each
# line: data (a list of vLLM's names), in data/vllm_flags_no_effect.json.
NO_EFFECT_FILE = Path(__file__).resolve().parent / "data" / "vllm_flags_no_effect.json"


def _read_no_effect(command: str) -> Mapping[str, tuple[str, ...]]:
    data = strict_loads(NO_EFFECT_FILE.read_text(encoding="utf-8"))  # a reason given twice is refused
    return MappingProxyType({why: tuple(dests) for why, dests in data[command].items()})


SERVE_NO_EFFECT = _read_no_effect(SERVE)
_KERNELS = Refusal("a kernel or compilation choice: kvsched prices vLLM's default kernels and CUDA graphs",
                   "drop it, or price your own vLLM's steps with kvsched profile and --step-time-profile")
_NOT_SIMULATED = "kvsched does not simulate it"
SERVE_REFUSED: dict[str, Refusal] = {
    **{d: _KERNELS for d in (
        "attention_backend", "moe_backend", "linear_backend", "sparse_indexer_topk_backend",
        "all2all_backend", "attention_config", "kernel_config", "ir_op_priority", "compilation_config",
        "cudagraph_capture_sizes", "max_cudagraph_capture_size")},
    "enable_flashinfer_autotune": Refusal(_KERNELS.reason, _KERNELS.fix, (False,)),
    # 0.33's persistent decode kernel (a few ROCm models): other decode step times.
    "monokernel": Refusal(_KERNELS.reason, _KERNELS.fix, (False,)),
    "optimization_level": Refusal(_KERNELS.reason, _KERNELS.fix, ("2",)),
    "performance_mode": Refusal(_KERNELS.reason, _KERNELS.fix, ("balanced",)),
    "enforce_eager": Refusal("no CUDA graphs: every decode step pays kernel launches kvsched's prices "
                             "leave out", "drop --enforce-eager to predict vLLM's default", (False,)),
    "decode_context_parallel_size": Refusal(f"decode context parallelism: {_NOT_SIMULATED}",
                                            "drop it", ("1",)),
    "prefill_context_parallel_size": Refusal(f"prefill context parallelism: {_NOT_SIMULATED}",
                                             "drop it", ("1",)),
    "enable_dbo": Refusal(f"dual-batch overlap: {_NOT_SIMULATED}", "drop it", (False,)),
    "ubatch_size": Refusal(f"micro-batching: {_NOT_SIMULATED}", "drop it", ("0",)),
    "enable_hc_sp": Refusal(f"an alternative parallel layout: {_NOT_SIMULATED}", "drop it", (False,)),
    "enable_batch_sharded_sampling": Refusal(f"sharded sampling: {_NOT_SIMULATED}", "drop it", (False,)),
    "enable_eplb": Refusal(f"expert-parallel load balancing: {_NOT_SIMULATED}", "drop it", (False,)),
    "expert_placement_strategy": Refusal(f"another expert placement: {_NOT_SIMULATED}", "drop it",
                                         ("linear",)),
    "enable_elastic_ep": Refusal(f"elastic expert parallelism: {_NOT_SIMULATED}", "drop it", (False,)),
    "disable_custom_all_reduce": Refusal("NCCL all-reduce in place of vLLM's custom one: kvsched prices "
                                         "the custom one", "drop it", (False,)),
    "disable_nccl_for_dp_synchronization": Refusal("DP synchronisation over the CPU: kvsched prices NCCL's",
                                                   "drop it", (False,)),
    "data_parallel_hybrid_lb": Refusal("an external load balancer routes between DP ranks",
                                       "drop it and choose kvsched's --dp-routing", (False,)),
    "data_parallel_external_lb": Refusal("an external load balancer routes between DP ranks",
                                         "drop it and choose kvsched's --dp-routing", (False,)),
    "data_parallel_multi_port_external_lb": Refusal("an external load balancer routes between DP ranks",
                                                    "drop it and choose kvsched's --dp-routing", (False,)),
    "runner": Refusal("a pooling (embedding, scoring) runner: kvsched simulates generation",
                      "drop it", ("auto", "generate")),
    "convert": Refusal("a model converted to pooling or classification: kvsched simulates generation",
                       "drop it", ("auto", "none")),
    "pooler_config": Refusal("a pooling model: kvsched simulates generation", "drop it"),
    "model_impl": Refusal("the Transformers backend's model code: kvsched prices vLLM's own",
                          "drop it", ("auto", "vllm")),
    "worker_cls": Refusal("a custom worker", "drop it", ("auto",)),
    "scheduler_cls": Refusal("a custom scheduler: kvsched is vLLM's own", "drop it"),
    "hf_config_path": Refusal("a model config read from elsewhere",
                              "give that config's directory as the model"),
    "hf_overrides": Refusal("changes to the model's config",
                            "write them into a config.json and give its directory as the model", ("{}",)),
    "model_class_overrides": Refusal("another model class", "drop it", ("{}",)),
    "quantization_config": Refusal("a quantization config kvsched does not read",
                                   "give --quantization (fp8, modelopt_fp4, mxfp4) instead"),
    "kv_cache_memory_bytes": Refusal("a KV cache size in bytes: kvsched sizes the cache from "
                                     "--gpu-memory-utilization or --num-gpu-blocks-override",
                                     "give --num-gpu-blocks-override or --gpu-memory-utilization instead"),
    "kv_cache_dtype_skip_layers": Refusal("layers kept out of the KV cache's dtype", "drop it", ("[]",)),
    "kv_sharing_fast_prefill": Refusal(f"KV sharing across layers: {_NOT_SIMULATED}", "drop it", (False,)),
    "swa_bounded_replay": Refusal("unbounded sliding-window replay", "drop it", (True,)),
    "prefix_cache_retention_interval": Refusal(f"prefix-cache retention: {_NOT_SIMULATED}", "drop it",
                                               ("0",)),
    "disable_sliding_window": Refusal("sliding-window layers read as full attention: another KV layout",
                                      "drop it", (False,)),
    "disable_hybrid_kv_cache_manager": Refusal("another KV cache layout for hybrid models", "drop it",
                                               (False,)),
    "offload_backend": Refusal("weights offloaded to CPU memory: kvsched keeps them on the GPU",
                               "drop it", ("auto",)),
    "cpu_offload_gb": Refusal("weights offloaded to CPU memory: kvsched keeps them on the GPU", "drop it",
                              ("0",)),
    "cpu_offload_params": Refusal("weights offloaded to CPU memory", "drop it", ("[]",)),
    "offload_group_size": Refusal("weights offloaded to CPU memory", "drop it", ("0",)),
    "offload_num_in_group": Refusal("weights offloaded to CPU memory", "drop it", ("1",)),
    "offload_prefetch_step": Refusal("weights offloaded to CPU memory", "drop it", ("1",)),
    "offload_params": Refusal("weights offloaded to CPU memory", "drop it", ("[]",)),
    "mm_encoder_only": Refusal("an encoder-only instance", "drop it", (False,)),
    "mm_ipc_gpu_memory_gb": Refusal("GPU memory set aside for multimodal inputs", "drop it", ("0",)),
    "logits_processors": Refusal("custom logits processors: their cost is not priced", "drop them"),
    "max_num_scheduled_tokens": Refusal(f"a scheduled-token cap apart from the batch budget: "
                                        f"{_NOT_SIMULATED}", "give --max-num-batched-tokens instead"),
    "max_num_active_seqs": Refusal(f"an active-request cap apart from --max-num-seqs: {_NOT_SIMULATED}",
                                   "give --max-num-seqs instead"),
    "max_num_queued_reqs": Refusal(f"a waiting-queue cap that rejects requests: {_NOT_SIMULATED}",
                                   "drop it"),
    "max_num_queued_tokens": Refusal(f"a waiting-queue cap that rejects requests: {_NOT_SIMULATED}",
                                     "drop it"),
    "long_prefill_token_threshold_adaptive": Refusal(f"an adaptive prefill chunk: {_NOT_SIMULATED}",
                                                     "give --long-prefill-token-threshold", (False,)),
    "scheduler_reserve_full_isl": Refusal("admission without reserving the whole prompt: kvsched's "
                                          "scheduler reserves it, as vLLM's default", "drop it", (True,)),
    "watermark": Refusal(f"a KV-cache watermark: {_NOT_SIMULATED}", "drop it", ("0", "0.0")),
    "stream_interval": Refusal("tokens streamed in groups: the client's inter-token latencies differ",
                               "drop it (vLLM's default streams every token)", ("1",)),
    "additional_config": Refusal("platform-specific settings", "drop it", ("{}",)),
    "watermark_config": Refusal("output watermarking", "drop it"),
    "diffusion_config": Refusal("a diffusion model: kvsched simulates autoregressive generation", "drop it"),
    "engram_config": Refusal(f"engram memory: {_NOT_SIMULATED}", "drop it"),
    "enable_trace_replay": Refusal(f"trace replay in the engine: {_NOT_SIMULATED}", "drop it", (False,)),
    "config": Refusal("flags read from a YAML file kvsched cannot see",
                      "paste the file's settings as flags on the line"),
}

BENCH_NO_EFFECT = _read_no_effect(BENCH)
BENCH_REFUSED: dict[str, Refusal] = {
    "use_beam_search": Refusal("beam search: kvsched simulates one sequence per request", "drop it",
                               (False,)),
    "ramp_up_strategy": Refusal("a ramped request rate: kvsched's arrivals have one rate",
                                "give --request-rate"),
    "ramp_up_start_rps": Refusal("a ramped request rate: kvsched's arrivals have one rate",
                                 "give --request-rate"),
    "ramp_up_end_rps": Refusal("a ramped request rate: kvsched's arrivals have one rate",
                               "give --request-rate"),
    "probe_request_rate": Refusal("probe requests beside the workload: kvsched does not send them",
                                  "drop it", ("0", "0.0")),
    "self_timed": Refusal("a trace's own timestamps: kvsched's traces (azure, mooncake, jsonl) use "
                          "their own already", "drop it", (False,)),
}
# vllm bench serve's dataset-specific flags by name prefix, and their
# datasets: a flag of another dataset than the one in use has no effect
# (as in vLLM); one of the dataset in use is forwarded when kvsched takes
# it, refused when not.
BENCH_DATASET_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("random_mm_", ("random-mm",)), ("random_batch_size", ("random-rerank",)),
    ("no_reranker", ("random-rerank",)), ("random_", ("random", "random-mm", "random-rerank")),
    ("sharegpt_", ("sharegpt",)), ("custom_", ("custom", "custom_audio", "custom_image")),
    ("spec_bench_", ("spec_bench",)), ("speed_bench_", ("speed_bench",)), ("timed_trace_", ("timed_trace",)),
    ("prefix_repetition_", ("prefix_repetition",)), ("hf_", ("hf",)), ("blazedit_", ("hf",)),
    ("asr_", ("hf",)), ("bfcl_", ("hf",)), ("burstgpt_", ("burstgpt",)), ("sonnet_", ("sonnet",)),
)

# Flags older vLLM took that pasted lines from older guides still carry;
# no release kvsched simulates takes them, kvsched names what became of
# them. (--disable-log-requests is no longer one: 0.33 takes it again, as
# --enable-log-requests' off switch.) Each with what it was and how many
# words followed it then (arity, as VllmFlag's), so its value is skipped too.
RETIRED: dict[str, tuple[str, str]] = {
    "--swap-space": ("V0's CPU swap space (V1 preempts by recomputing)", "one"),
    "--use-v2-block-manager": ("V0's block manager switch", "none"),
    "--num-scheduler-steps": ("V0's multi-step scheduling", "one"),
}


def _tables(command: str) -> tuple[dict[str, str], Mapping[str, Refusal], Mapping[str, str]]:
    no_effect = SERVE_NO_EFFECT if command == SERVE else BENCH_NO_EFFECT
    reasons = {dest: why for why, dests in no_effect.items() for dest in dests}
    return reasons, SERVE_REFUSED if command == SERVE else BENCH_REFUSED, (
        SERVE_MAPPED if command == SERVE else BENCH_MAPPED)


def dataset_of_flag(dest: str) -> tuple[str, ...] | None:
    """The datasets a vllm bench serve flag belongs to (by its name), or None."""
    for prefix, datasets in BENCH_DATASET_PREFIXES:
        if dest.startswith(prefix):
            return datasets
    return None


def classify(command: str, dest: str, kvsched: KvschedFlags) -> Verdict | None:
    """What kvsched does with vLLM's flag ``dest`` of ``command`` (serve or
    bench); None: no rule covers it (tests keep every listed flag covered)."""
    reasons, refused, mapped = _tables(command)
    if dest in mapped:
        return Verdict(USED, mapped[dest])
    if dest not in NOT_FORWARDED[command] and kvsched.action(dest) is not None:
        return Verdict(USED, f"kvsched's {kvsched.option(dest)}")
    if dest in reasons:
        return Verdict(NO_EFFECT, reasons[dest])
    if dest in refused:
        return Verdict(REFUSED, refused[dest].reason, refused[dest])
    if command == BENCH:
        datasets = dataset_of_flag(dest)
        if datasets is not None:
            why = Refusal(f"a flag of vLLM's {'/'.join(datasets)} dataset kvsched does not take yet",
                          "drop it or use a dataset kvsched takes")
            return Verdict(REFUSED, why.reason, why)
    return None


class KvschedFlags:
    """kvsched simulate's own flags, by dest: what a vLLM flag of the same
    name is forwarded to."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        # argparse keeps no public list of a parser's actions.
        self._by_dest = {a.dest: a for a in parser._actions if a.option_strings}

    def action(self, dest: str) -> argparse.Action | None:
        return self._by_dest.get(dest)

    def option(self, dest: str) -> str:
        action = self._by_dest[dest]
        return next(o for o in action.option_strings if o.startswith("--"))

    def words(self, dest: str, value: object) -> list[str]:
        """kvsched's flag and value words for ``value`` (True/False for a
        switch, a string or list of strings otherwise)."""
        action = self._by_dest[dest]
        option = self.option(dest)
        if isinstance(value, bool):
            if isinstance(action, argparse.BooleanOptionalAction):
                return [option] if value else ["--no-" + option[2:]]
            if action.nargs == 0:  # a store_true flag: off is its default
                return [option] if value else []
            return [option, str(value).lower()]
        if isinstance(value, list):
            return [option, *value]
        if action.type is int:
            value = human_int(str(value))
        return [option, str(value)]


# vLLM reads 1k as 1,000 and 1K as 1,024 in its integer flags.
_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kmgtKMGT])$")


def human_int(text: str) -> str:
    """``text`` with vLLM's human-readable integer suffix spelled out."""
    m = _HUMAN_INT.match(text)
    if m is None:
        return text
    number, suffix = m.groups()
    power = "kmgt".index(suffix.lower()) + 1
    if suffix.islower():
        return str(int(float(number) * 1000 ** power))
    if "." in number:
        raise UserInputError(f"{text}: a binary suffix ({suffix}) takes a whole number, e.g. 32{suffix}")
    return str(int(number) * 1024 ** power)


# -- splitting a pasted line ---------------------------------------------------

_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_CONTINUATION = re.compile(r"\\[ \t]*\r?\n")
_SHELL_STOP = ("|", "||", "&&", ";", "&")
# $MODEL, ${C}, $((C*20)), $(cmd): left for the shell to fill in.
_SHELL_VARIABLE = re.compile(r"\$[{(A-Za-z_]")
# A shell redirection: `> out.log`, `2>&1`, `>>log`, `&> log`, `< in` (not a
# `<placeholder>` of a guide's line).
_REDIRECT = re.compile(r"^(\d*(>>?|<)|&>|\d*>&\d+|(\d*>>?|&>)[^<>]+)$")


def _after_command(command: str, words: list[str]) -> int | None:
    """Where the flags start: after ``vllm serve`` / ``vllm bench serve``,
    or the older ``python -m vllm.entrypoints.openai.api_server`` /
    ``python benchmarks/benchmark_serving.py``; None if the line has none."""
    for i, w in enumerate(words):
        if command == SERVE:
            if words[i:i + 2] == ["vllm", "serve"]:
                return i + 2
            if words[i:i + 2] == ["-m", "vllm.entrypoints.openai.api_server"]:
                return i + 2
        else:
            if words[i:i + 3] == ["vllm", "bench", "serve"]:
                return i + 3
            if w.endswith("benchmark_serving.py"):
                return i + 1
    return None


def split_line(command: str, line: str) -> tuple[list[str], list[str], list[str]]:
    """The words after ``vllm serve`` / ``vllm bench serve`` in ``line``
    (or all of them, for a line of flags alone), the environment
    assignments before it, and the shell words after the command (``&``,
    ``| tee log``, ``> out``), which change nothing."""
    where = LINE_FLAG[command]
    text = _CONTINUATION.sub(" ", line)
    # bash's $'...' quoting (vLLM's docs use it for JSON over several lines).
    text = re.sub(r"(?<![\w$])\$'", "'", text)
    try:
        words = shlex.split(text, comments=True)
    except ValueError as e:
        raise UserInputError(f"{where}: cannot split the line as a shell would ({e}); check its quotes") \
            from None
    env: list[str] = []
    while words and _ENV.match(words[0]):
        env.append(words.pop(0))
    shell: list[str] = []
    for i, w in enumerate(words):
        if w in _SHELL_STOP or _REDIRECT.match(w):
            words, shell = words[:i], words[i:]
            break
    unexpanded = [w for w in words if _SHELL_VARIABLE.search(w)]
    if unexpanded:
        raise UserInputError(f"{where}: {unexpanded[0]} is a shell variable or expression; paste the line "
                             "with its value")
    start = _after_command(command, words)
    if start is not None:
        return words[start:], env, shell
    other = BENCH if command == SERVE else SERVE
    if _after_command(other, words) is not None:
        raise UserInputError(f"{where}: that is a {LINE_NAME[other]} line; give it to {LINE_FLAG[other]}")
    if words and words[0] in ("vllm", "python", "python3"):
        raise UserInputError(f"{where}: expected a line that runs `{LINE_NAME[command]}`, got "
                             f"`{' '.join(words[:3])}`")
    return words, env, shell  # the flags alone


@dataclass(frozen=True, slots=True)
class Given:
    """One flag as the line gave it: the vLLM flag, how it was spelled, and
    its value (True/False for a switch, a string, or a list of strings)."""

    flag: VllmFlag
    spelled: str
    value: object


def read_flags(command: str, words: Sequence[str], release: str) -> tuple[list[Given], list[str]]:
    """The flags of a line's words, as ``release``'s parser reads them, and
    its positional words."""
    where = LINE_FLAG[command]
    known = vllm_flags(release).lookup(command)
    given: list[Given] = []
    positional: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if not word.startswith("-") or _is_number(word):
            positional.append(word)
            continue
        name, eq, inline = word.partition("=")
        # vLLM's parser takes --max_num_seqs as --max-num-seqs, -O3 as
        # --optimization-level 3, and --json-arg.key value as one key of it.
        if name.startswith("-O") and not name.startswith("--") and name != "-O":
            name, eq, inline = "--optimization-level", "=", name[2:]
        base, dot, key = name.partition(".")
        if base.startswith("--"):
            base = "--" + base[2:].replace("_", "-")
        name = base + dot + key
        hit = known.get(base)
        if hit is None:
            if base in RETIRED:
                hit = VllmFlag((base,), (), "retired:" + base, RETIRED[base][1]), False
            else:
                elsewhere = missing_from_release(command, base, release, every_release())
                if elsewhere is not None:
                    raise UserInputError(f"{where}: {elsewhere}")
                raise UserInputError(f"{where}: {base} is not a {LINE_NAME[command]} flag of vLLM "
                                     f"{release}{did_you_mean(base, known)}")
        flag, negated = hit
        if negated or flag.arity == "none":
            if eq:
                raise UserInputError(f"{where}: {base} is a switch and takes no value (got {word!r})")
            given.append(Given(flag, base, not negated))
            continue
        if eq:
            values = [inline]
        else:
            values = []
            while i < len(words) and (not words[i].startswith("-") or _is_number(words[i])):
                values.append(words[i])
                i += 1
                if flag.arity in ("one", "optional"):
                    break
            if not values and flag.arity != "optional":
                raise UserInputError(f"{where}: {base} needs a value (e.g. {base} VALUE)")
        value: object = values if flag.arity == "many" else (values[0] if values else True)
        if dot:
            value = {key: values[0] if len(values) == 1 else values}
        given.append(Given(flag, name if not dot else base, value))
    return given, positional


def merge_dotted(given: list[Given]) -> list[Given]:
    """``given`` as vLLM's parser leaves it: a flag given twice counts
    once, as the last one says, and ``--json-arg.key value`` flags of one
    JSON flag make one JSON object (each value read as JSON where it
    parses)."""
    out: list[Given] = []
    objects: dict[str, dict[str, object]] = {}
    # A flag given twice: the last one counts, as in argparse.
    last = {g.flag.dest: i for i, g in enumerate(given) if not isinstance(g.value, dict)}
    for i, g in enumerate(given):
        if not isinstance(g.value, dict):
            if last[g.flag.dest] == i:
                out.append(g)
            continue
        obj = objects.get(g.flag.dest)
        if obj is None:
            obj = objects[g.flag.dest] = {}
            out.append(Given(g.flag, g.spelled, obj))
        for key, raw in g.value.items():
            try:
                obj[key] = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                obj[key] = raw
    return out


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def did_you_mean(flag: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(flag, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""


# -- the whole paste -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Pasted:
    """What the pasted lines say, as kvsched flags.

    ``argv``: kvsched simulate's flags; ``origins``: for each kvsched dest
    they set, how the line gave it (for a conflict's message); ``ignored``:
    the flags and words that do not affect the prediction, with the line
    (``--serve``/``--bench``) each came in; ``notes``: what
    the user should know about the rest.
    """

    argv: tuple[str, ...] = ()
    origins: tuple[tuple[str, str], ...] = ()
    ignored: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    has_serve: bool = False

    def report(self) -> list[str]:
        """The lines to print before the run."""
        out = [f"note: {n}" for n in self.notes]
        if self.ignored:
            by_line: dict[str, list[str]] = {}
            for where, what in self.ignored:
                by_line.setdefault(where, []).append(what)
            out.append("ignored (does not affect the prediction): "
                       + "; ".join(f"{where} {', '.join(whats)}" for where, whats in by_line.items()))
        return out


@dataclass(slots=True)
class _Builder:
    kvsched: KvschedFlags
    argv: list[str] = field(default_factory=list)
    origins: dict[str, str] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def set(self, dest: str, value: object, origin: str) -> None:
        if dest in self.origins:
            raise UserInputError(f"{origin} and {self.origins[dest]} both set {self.kvsched.option(dest)}; "
                                 "give it once")
        self.argv += self.kvsched.words(dest, value)
        self.origins[dest] = origin


def _shown(g: Given) -> str:
    if isinstance(g.value, bool):
        return g.spelled
    if isinstance(g.value, list):
        return f"{g.spelled} {' '.join(g.value)}"
    if isinstance(g.value, dict):
        return f"{g.spelled}.{next(iter(g.value))}"
    return f"{g.spelled} {g.value}"


def _harmless(value: object, refusal: Refusal) -> bool:
    if isinstance(value, list):
        value = json.dumps(value) if value else "[]"
    return value in refusal.harmless


def paste(serve: str | None, bench: str | None, kvsched: KvschedFlags, release: str) -> Pasted:
    """kvsched's flags for a pasted serve line and bench line (either may
    be None), read as vLLM ``release``'s (the one simulated) reads them."""
    b = _Builder(kvsched)
    served_names: list[str] = []
    model: str | None = None
    dataset = "random"
    if bench is not None:
        words, _, _ = split_line(BENCH, bench)
        for g in read_flags(BENCH, words, release)[0]:
            if g.flag.dest == "dataset_name" and isinstance(g.value, str):
                dataset = g.value
    for command, line in ((SERVE, serve), (BENCH, bench)):
        if line is None:
            continue
        where = LINE_FLAG[command]
        words, env, shell = split_line(command, line)
        given, positional = read_flags(command, words, release)
        given = merge_dotted(given)
        b.ignored += [(where, f"{w} (environment)") for w in env]
        b.ignored += [(where, " ".join(shell))] if shell else []
        if command == SERVE:
            if len(positional) > 1:
                raise UserInputError(f"{where}: vllm serve takes one model; got {' '.join(positional)}")
            tag = positional[0] if positional else None
            named = [g for g in given if g.flag.dest == "model"]
            if tag is not None and named and named[0].value != tag:
                raise UserInputError(f"{where}: the model {tag} and --model {named[0].value} differ; "
                                     "give one")
            model = tag if tag is not None else (str(named[0].value) if named else None)
            if model is None:
                model = vllm_flags(release).serve_default_model
                b.notes.append(f"{where}: no model given: vLLM {release} serves {model}")
            b.set("model", model, f"{where}'s model {model}")
            given = [g for g in given if g.flag.dest != "model"]
            served_names = [v for g in given if g.flag.dest == "served_model_name"
                            for v in (g.value if isinstance(g.value, list) else [str(g.value)])]
        elif positional:
            raise UserInputError(f"{where}: vllm bench serve takes no positional words; got "
                                 f"{' '.join(positional)}")
        if command == BENCH and not any(g.flag.dest == "ignore_eos" for g in given):
            b.notes.append("--bench has no --ignore-eos: vLLM may end a request at an EOS token before "
                           "its output length; kvsched generates every output token (as --ignore-eos; "
                           "--eos-probability models early ends)")
        spec: dict[str, object] = {}
        for g in given:
            _apply(b, command, g, dataset, spec, model, served_names, release)
        if spec:
            _merge_speculative(b, given, spec)
    return Pasted(tuple(b.argv), tuple(b.origins.items()), tuple(b.ignored), tuple(b.notes),
                  has_serve=serve is not None)


def _apply(b: _Builder, command: str, g: Given, dataset: str, spec: dict[str, object], model: str | None,
           served_names: list[str], release: str) -> None:
    where = LINE_FLAG[command]
    dest = g.flag.dest
    origin = f"{where}'s {_shown(g)}"
    if dest.startswith("retired:"):
        b.ignored.append((where, f"{g.spelled} ({RETIRED[g.spelled][0]}; vLLM {release} no longer takes it)"))
        return
    verdict = classify(command, dest, b.kvsched)
    if verdict is None:
        raise AssertionError(f"{command} flag {dest}: not classified (see kvsched.sim.serve_line)")
    if verdict.kind == NO_EFFECT:
        b.ignored.append((where, g.spelled))
        return
    # Another dataset's flag has no effect in vLLM, whether kvsched takes it or not.
    datasets = dataset_of_flag(dest) if command == BENCH else None
    if datasets is not None and dataset not in datasets:
        b.ignored.append((where, f"{g.spelled} (applies to --dataset-name {'/'.join(datasets)} only)"))
        return
    if verdict.kind == REFUSED:
        refusal = verdict.refusal
        assert refusal is not None
        if _harmless(g.value, refusal):
            b.ignored.append((where, g.spelled))
            return
        raise UserInputError(f"{where}: {_shown(g)}: {refusal.reason}; {refusal.fix}")
    # Used.
    if command == SERVE and dest in ("spec_method", "spec_model", "spec_tokens"):
        key = {"spec_method": "method", "spec_model": "model", "spec_tokens": "num_speculative_tokens"}[dest]
        if key == "num_speculative_tokens":
            try:
                spec[key] = int(str(g.value))
            except ValueError:
                raise UserInputError(f"{where}: {_shown(g)}: give a whole number of draft tokens") from None
        else:
            spec[key] = g.value
        return
    if command == BENCH and dest == "model":
        if model is None:
            b.set("model", g.value, origin)
        elif g.value != model and g.value not in served_names:
            raise UserInputError(f"{where}: --model {g.value} is not the model --serve serves ({model}"
                                 f"{', served as ' + ', '.join(served_names) if served_names else ''})")
        return
    if command == BENCH and dest == "ignore_eos":
        return  # kvsched's default
    if command == BENCH and dest == "input_len":
        b.set("random_input_len", g.value, origin)
        return
    if command == BENCH and dest == "lora_modules":
        b.set("lora_names", g.value, origin)
        return
    if command == BENCH and dest == "output_len":
        for target in ("random_output_len", f"{dataset.replace('-', '_')}_output_len"):
            if b.kvsched.action(target) is not None and target not in b.origins:
                b.set(target, g.value, origin)
        return
    if isinstance(g.value, dict):  # --json-arg.key value: one key of a JSON flag
        b.set(dest, json.dumps(g.value), origin)
        return
    b.set(dest, g.value, origin)


def _merge_speculative(b: _Builder, given: list[Given], spec: dict[str, object]) -> None:
    """--spec-method/--spec-model/--spec-tokens into --speculative-config,
    as vLLM merges them (a key given both ways is an error there too)."""
    config: dict[str, object] = {}
    if "speculative_config" in b.origins:
        i = b.argv.index("--speculative-config")
        try:
            loaded = json.loads(b.argv[i + 1])
        except ValueError:
            raise UserInputError(f"--serve: --speculative-config {b.argv[i + 1]!r} is not JSON") from None
        if not isinstance(loaded, dict):
            raise UserInputError("--serve: --speculative-config must be a JSON object")
        config = loaded
        del b.argv[i:i + 2]
        del b.origins["speculative_config"]
    both = sorted(set(spec) & set(config))
    if both:
        raise UserInputError(f"--serve: --spec-* and --speculative-config both set {', '.join(both)}; "
                             "give it once")
    b.set("speculative_config", json.dumps({**config, **spec}), "--serve's --spec-* flags")
