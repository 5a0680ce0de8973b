"""Command-line flags onto the run spec, and back.

The flags are vLLM's engine arguments (``vllm serve``'s names and defaults)
and ``vllm bench serve``'s workload arguments; :func:`spec_from_args` is the
one place a parsed command line becomes a :class:`~kvsched.sim.spec.RunSpec`,
and :func:`spec_argv` the one place a spec becomes flags again (the
``kvsched simulate`` line that reproduces a tuner's answer). Nothing past
this module sees an argparse ``Namespace``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Collection, Sequence
from dataclasses import fields
from typing import Any, NoReturn

from kvsched.engine_flags import (
    SCHEDULER_CACHE_FLAGS,
    EngineFlagDefaults,
    OnlyFlags,
    add_declared_flags,
    add_scheduler_cache_flags,
    option,
    vllm_words,
)
from kvsched.errors import UserInputError
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.metrics import DEFAULT_PERCENTILE_METRICS, PERCENTILE_METRICS, parse_goodput
from kvsched.sim.results import RESULT_BACKEND, ResultFile, parse_metadata
from kvsched.sim.serve_line import KvschedFlags, Pasted, paste
from kvsched.sim.spec import (
    DeploymentSpec,
    InstanceGroup,
    RunOptions,
    RunSpec,
    WorkloadSpec,
    deployment_spec,
)
from kvsched.sim.workload import (
    DATASET_NAMES,
    DEFAULT_INPUT_LEN,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_OUTPUT_LEN,
    BenchDatasetOptions,
)
from kvsched.sim.workload.lora import LORA_ASSIGNMENTS

# The roles of a disaggregated deployment, and the scheduler settings each
# can set apart (--prefill-max-num-seqs, --decode-max-num-batched-tokens, ...:
# in vLLM each role is its own vllm serve with its own flags).
ROLES = ("prefill", "decode")
ROLE_SCHEDULER_FLAGS = {"max_num_seqs": "requests in a batch at most",
                        "max_num_batched_tokens": "tokens in a step at most",
                        "long_prefill_token_threshold": "prompt tokens of one request in a step at most"}

# How simulate's scheduler and cache flags differ from the engine's (they
# model vllm serve on GPUs).
SIMULATE_ENGINE_FLAGS = EngineFlagDefaults(
    dtype=EngineOptions().dtype, async_scheduling=EngineOptions().async_scheduling,
    scope="per engine core", seed=None,
    dtype_help="precision of an unquantized checkpoint's weights and activations, as vLLM's "
               "--dtype: auto, bfloat16 (bf16), half/float16 (fp16); a quantized format is "
               "--quantization's")


# EngineOptions' own flags (each field declares its flag, kvsched.sim.deployment)
# in the order --help lists them, by the part of the engine they set, with the
# flags that are not one field between them: the release, the model, where it
# runs and how its steps are priced; precision and cadence; CPU offloading; LoRA and the
# speculative decoding kvsched prices.
PLACEMENT_FIELDS = ("vllm_version", "model", "hardware", "efficiency_file", "calibration",
                    "step_time_backend", "step_time_profile", "tensor_parallel_size",
                    "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel")
PRECISION_FIELDS = ("quantization", "kv_cache_dtype", "prefill_schedule_interval")
LORA_FIELDS = ("enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "fully_sharded_loras",
               "lora_modules", "lora_target_modules")


def add_engine_arguments(p: argparse.ArgumentParser, names: Collection[str] | None = None,
                         title: str = "engine (vLLM's engine arguments)") -> None:
    """simulate's engine flags: vLLM's engine arguments plus the DP routing,
    admission and pricing settings (``names``: only those of them, by dest,
    for a command that takes the rest its own way, as tune's search space).
    A flag that is one field of EngineOptions, InstanceGroup or
    DeploymentSpec is its field's declaration; those written here are not
    one field (a deployment's disaggregation, its roles' own settings)."""
    group = p.add_argument_group(title)
    g = group if names is None else OnlyFlags(group, names)
    add_declared_flags(g, EngineOptions, names=PLACEMENT_FIELDS)
    add_declared_flags(g, InstanceGroup)
    # vLLM's scheduler and KV-cache flags, defined once for every command.
    add_scheduler_cache_flags(group, SIMULATE_ENGINE_FLAGS,
                              SCHEDULER_CACHE_FLAGS if names is None else
                              [n for n in SCHEDULER_CACHE_FLAGS if n in names])
    add_declared_flags(g, EngineOptions, names=(*PRECISION_FIELDS, "enable_extensible_kv_cache"))
    g.add_argument("--disaggregation", metavar="xPyD",
                   help="prefill/decode disaggregation: x prefill and y decode instances (e.g. 1P2D) "
                        "joined by vLLM's NixlConnector behind vLLM's P/D proxy; each instance "
                        "-tp GPUs unless --prefill/--decode-tensor-parallel-size say otherwise")
    for role in ROLES:
        g.add_argument(f"--{role}-tensor-parallel-size", type=int, metavar="N",
                       help=f"with --disaggregation: GPUs per {role} instance (default: -tp)")
    for role in ROLES:
        for name, what in ROLE_SCHEDULER_FLAGS.items():
            g.add_argument(f"--{role}-{name.replace('_', '-')}", type=int, metavar="N",
                           dest=f"{role}_{name}",
                           help=f"with --disaggregation: the {role} instances' --{name.replace('_', '-')} "
                                f"({what}; default: the one given for every instance)")
    add_declared_flags(g, DeploymentSpec)
    add_declared_flags(g, EngineOptions, names=("kv_offloading_size",))
    for role in ROLES:
        g.add_argument(f"--{role}-kv-offloading-size", type=float, metavar="GIB",
                       dest=f"{role}_kv_offloading_size",
                       help=f"with --disaggregation: CPU offloading on the {role} instances only, GiB per "
                            "instance (in vLLM: a MultiConnector --kv-transfer-config of NIXL and offloading "
                            "on those instances, NixlConnector alone on the others; default: "
                            "--kv-offloading-size's)")
    add_declared_flags(g, EngineOptions, names=("kv_offloading_backend", *LORA_FIELDS, "spec_acceptance"))


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload (vllm bench serve's arguments)")
    w = WorkloadSpec()
    g.add_argument("--dataset-name", choices=DATASET_NAMES, default=w.dataset_name,
                   help="vllm bench serve's datasets (random, random-mm and custom_image: with images, "
                        "sharegpt, burstgpt, sonnet, prefix_repetition, custom), sampled as vLLM samples "
                        "them, or a trace replayed: azure, mooncake, jsonl (default: random)")
    g.add_argument("--dataset-path", help="the file of sharegpt (JSON), burstgpt (CSV), sonnet (text), "
                                          "custom (JSONL of prompts), custom_image (JSONL of prompts and "
                                          "image files) or a trace")
    g.add_argument("--num-prompts", type=int,
                   help=f"prompts to send (vllm bench serve's datasets: default {DEFAULT_NUM_PROMPTS}; "
                        "traces: default all)")
    g.add_argument("--tokenizer", help="the tokenizer the datasets count tokens with: a directory with "
                                       "tokenizer.json, or a Hugging Face id in the local cache (default: "
                                       "the model's where on disk, else ~4 bytes a token, with a warning)")
    # vllm bench serve's dataset flags, declared with their fields.
    add_declared_flags(g, BenchDatasetOptions)
    g.add_argument("--random-input-len", type=int,
                   help=f"random: prompt tokens per request (default {DEFAULT_INPUT_LEN})")
    g.add_argument("--random-output-len", type=int,
                   help=f"random: output tokens per request (default {DEFAULT_OUTPUT_LEN})")
    g.add_argument("--random-range-ratio", type=parse_range_ratio,
                   help="random: lengths drawn uniformly within +-ratio of the above (default 0); "
                        'vLLM\'s \'{"input": 0.3, "output": 0.5}\' sets the two apart')
    g.add_argument("--random-output-range-ratio", type=float,
                   help="random: the output lengths' own ratio (what the 'output' key of "
                        "--random-range-ratio's JSON form sets; default: --random-range-ratio's)")
    g.add_argument("--random-prefix-len", type=int,
                   help="random: tokens of a prefix shared by every prompt (default 0)")
    g.add_argument("--request-rate", type=float,
                   help="requests/s with vllm bench serve's gamma arrivals (default inf: all at once); a "
                        "trace keeps its own arrival times unless this re-paces it (lengths kept)")
    g.add_argument("--burstiness", type=float,
                   help="gamma shape of the arrival gaps, 1 = Poisson (default 1)")
    g.add_argument("--max-concurrency", type=int,
                   help="most requests in flight; later ones wait at the client (default: no limit)")
    g.add_argument("--request-timeout", type=_number_or_text, metavar="S",
                   help="kvsched's: seconds after its send (after any --max-concurrency wait) the client "
                        "gives up on a request that has not finished; vLLM's server then aborts it, its "
                        "KV blocks freed, and it counts as failed (reason: timeout). vllm bench serve has "
                        "no such flag: its client waits up to 6 hours (default: no timeout)")
    g.add_argument("--seed", type=int, default=w.seed,
                   help="seed of the random dataset and of EOS draws (default: %(default)s)")
    g.add_argument("--time-scale", type=float, default=w.time_scale,
                   help="multiply arrival times (0.5 = twice the request rate; default 1)")
    g.add_argument("--duration", type=float,
                   help="keep only requests arriving before this many seconds")
    g.add_argument("--lora-share", type=float,
                   help="with --enable-lora: share of requests that name an adapter (default 1, as vllm "
                        "bench serve with --lora-modules; 0: every request runs the base model)")
    g.add_argument("--lora-assignment", choices=list(LORA_ASSIGNMENTS), default=w.lora_assignment,
                   help="how a request picks its adapter, as vllm bench serve's flag: random (uniform, "
                        "or Zipf with --lora-zipf-alpha) or round-robin (default: %(default)s)")
    g.add_argument("--lora-zipf-alpha", type=float,
                   help="with --lora-assignment random: adapter k (1-based, in --lora-modules order) drawn "
                        "with weight 1/k^alpha (default: uniform)")
    g.add_argument("--lora-names", nargs="+", metavar="NAME", default=list(w.lora_names),
                   help="with --enable-lora: the adapters requests pick from, by name (vllm bench serve's "
                        "--lora-modules; default: every adapter)")
    g.add_argument("--num-lora-adapters", type=int,
                   help="with --enable-lora and no --lora-modules: N synthetic adapters lora-1..lora-N of "
                        "--max-lora-rank on every module")
    g.add_argument("--eos-probability", type=float, default=w.eos_probability,
                   help="per-token EOS probability; 0 (default) generates each request's output "
                        "length, as ignore_eos does")


def _number_or_text(text: str) -> float | str:
    """A number flag's value as a float, or the text as given when it is not
    one: the spec's check then refuses it in one line naming the flag
    (argparse's own refusal prints the whole usage)."""
    try:
        return float(text)
    except ValueError:
        return text


def add_output_arguments(p: argparse.ArgumentParser, result_files: bool = False) -> None:
    """The output flags; ``result_files``: also vllm bench serve's result-file
    flags, ``--save-result`` then taking its file name as optional."""
    g = p.add_argument_group("output")
    if result_files:
        g.add_argument("--save-result", metavar="FILE.json", nargs="?", const="",
                       help="results with vllm bench's keys, plus the deployment and workload; "
                            "without FILE, named as vllm bench serve names it "
                            "({label}-{rate}qps-{model}-{date}.json)")
        g.add_argument("--append-result", action="store_true",
                       help="add the result to the file as one more JSON line, as vllm bench serve")
        g.add_argument("--result-dir", metavar="DIR", help="folder of the result file (made if missing)")
        g.add_argument("--result-filename", metavar="NAME", help="name of the result file")
        g.add_argument("--label", help=f"the result's label (default: {RESULT_BACKEND}), in its file name")
        g.add_argument("--metadata", metavar="KEY=VALUE", nargs="*",
                       help="pairs saved in the result JSON, as vllm bench serve's")
        g.add_argument("--percentile-metrics", metavar="METRICS",
                       help="comma-separated metrics to report percentiles of: "
                            f"{', '.join(PERCENTILE_METRICS)} "
                            f"(default: {','.join(DEFAULT_PERCENTILE_METRICS)})")
    else:
        g.add_argument("--save-result", metavar="FILE.json",
                       help="results with vllm bench's keys, plus the deployment and workload")
    g.add_argument("--save-detailed", action="store_true",
                   help="with --save-result: also vllm bench's per-request lists and records")
    g.add_argument("--report", metavar="FILE.html", help="a self-contained page with plots")
    g.add_argument("--trace-steps", metavar="FILE.jsonl",
                   help="the scheduler's step trace plus each step's start and duration "
                        "(steps every step: no fast-forward)")
    g.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50")
    g.add_argument("--metric-percentiles", default="50,90,99",
                   help="percentiles to report, comma-separated (default: %(default)s)")
    g.add_argument("--no-fast-forward", action="store_true",
                   help="step through pure-decode stretches one by one (same results, slower)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


# Flags whose default a command with --serve/--bench leaves unset, to tell
# a value given from the default (filled in by with_pasted).
PASTE_UNSET = ("model", "hardware")


def add_paste_arguments(p: argparse.ArgumentParser) -> None:
    """--serve and --bench: a vllm serve line and a vllm bench serve line as
    written (kvsched.sim.serve_line reads them)."""
    g = p.add_argument_group("pasted vLLM command lines")
    g.add_argument("--serve", metavar='"vllm serve ..."',
                   help="a vllm serve command line as you run it (quoted): its engine flags become "
                        "kvsched's; flags that do not affect the prediction are listed as ignored, "
                        "those kvsched cannot model are refused; a serve line names no GPU, so "
                        "--hardware is required with it")
    g.add_argument("--bench", metavar='"vllm bench serve ..."',
                   help="a vllm bench serve command line as you run it (quoted): its workload flags "
                        "become kvsched's")
    # None: not given. A serve line names no GPU, so --hardware must then be
    # given; and a --model beside a serve line is told apart from the default.
    p.set_defaults(**{dest: None for dest in PASTE_UNSET})


def with_pasted(args: argparse.Namespace) -> tuple[argparse.Namespace, Pasted]:
    """``args`` with the flags of its --serve and --bench lines merged in (a
    flag given both ways with different values is an error naming both),
    and what the lines said (:class:`~kvsched.sim.serve_line.Pasted`). A
    flag given beside the lines at kvsched's default value is taken as not
    given (except :data:`PASTE_UNSET`'s, left unset by the parser). Fills
    the defaults of those left unset."""
    serve, bench = getattr(args, "serve", None), getattr(args, "bench", None)
    out = argparse.Namespace(**vars(args))
    unset = EngineOptions()
    if serve is None and bench is None:
        for dest in PASTE_UNSET:
            if getattr(out, dest, None) is None:
                setattr(out, dest, getattr(unset, dest))
        return out, Pasted()
    parser = simulate_flag_parser()
    # The lines are read as the simulated release's vllm serve reads them.
    pasted = paste(serve, bench, KvschedFlags(parser), args.vllm_version)
    if pasted.has_serve and out.hardware is None:
        raise UserInputError("--serve: a vllm serve line names no GPU; give kvsched's --hardware too "
                             f"(e.g. --hardware {unset.hardware}; ids: h100-sxm, h200, a100-80gb, "
                             "b200, l40s, mi300x, ...)")
    defaults = parser.parse_args([])
    for dest in PASTE_UNSET:  # None (not given) never equals a pasted value
        setattr(defaults, dest, None)
    try:
        got = parser.parse_args(list(pasted.argv))
    except (UserInputError, argparse.ArgumentError) as e:
        lines = " and ".join(f for f, line in (("--serve", serve), ("--bench", bench)) if line is not None)
        raise UserInputError(f"{lines}: {e}") from None
    for dest, origin in pasted.origins:
        mine, theirs = getattr(args, dest, None), getattr(got, dest)
        if mine != getattr(defaults, dest) and mine != theirs:
            flag = option(dest)
            raise UserInputError(f"{flag}={_show_value(mine)} and {origin} disagree; give {flag} once "
                                 "(on the pasted line or beside it)")
        setattr(out, dest, theirs)
    for dest in PASTE_UNSET:
        if getattr(out, dest) is None:
            setattr(out, dest, getattr(unset, dest))
    return out, pasted


def _show_value(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


class FlagParser(argparse.ArgumentParser):
    """A parser that raises :class:`UserInputError` instead of exiting, and
    takes no abbreviated flags (vLLM's own parser refuses ``--num-prom``)."""

    def __init__(self, prog: str = "kvsched simulate") -> None:
        super().__init__(prog=prog, add_help=False, allow_abbrev=False, exit_on_error=False)

    def error(self, message: str) -> NoReturn:
        raise UserInputError(f"bad flags: {message}")


def simulate_flag_parser(prog: str = "kvsched simulate") -> argparse.ArgumentParser:
    """``kvsched simulate``'s flags in a parser that raises instead of exiting."""
    p = FlagParser(prog)
    add_engine_arguments(p)
    add_workload_arguments(p)
    add_output_arguments(p, result_files=True)
    return p


@functools.cache
def engine_fields() -> tuple[str, ...]:
    """EngineOptions' fields in the order simulate's ``--help`` lists their
    flags: the order :func:`spec_argv` writes them in (the model and its
    placement first, as a user writes them)."""
    names = {f.name for f in fields(EngineOptions)}
    order = tuple(dict.fromkeys(a.dest for a in simulate_flag_parser()._actions if a.dest in names))
    assert set(order) == names, f"EngineOptions fields without a flag: {sorted(names - set(order))}"
    return order


def parse_percentile_metrics(text: str | None) -> tuple[str, ...]:
    """``--percentile-metrics`` (None: kvsched's default)."""
    if text is None:
        return DEFAULT_PERCENTILE_METRICS
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    unknown = [m for m in names if m not in PERCENTILE_METRICS]
    if not names or unknown:
        raise UserInputError(f"--percentile-metrics={text!r}: choose from {','.join(PERCENTILE_METRICS)}")
    return names


def result_file_from_args(args: argparse.Namespace) -> ResultFile:
    """vllm bench serve's result-file flags of a parsed command line."""
    return ResultFile(save_result=args.save_result,
                      append_result=bool(getattr(args, "append_result", False)),
                      result_dir=getattr(args, "result_dir", None),
                      result_filename=getattr(args, "result_filename", None),
                      label=getattr(args, "label", None),
                      metadata=parse_metadata(getattr(args, "metadata", None)))


def parse_percentiles(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserInputError(f"--metric-percentiles={text!r}: give numbers like 50,90,99") from None
    if not values or any(not 0 <= v <= 100 for v in values):
        raise UserInputError(f"--metric-percentiles={text!r}: each must be in [0, 100]")
    return values


_GROUP_FIELDS = tuple(f.name for f in fields(InstanceGroup) if f.name not in ("engine", "role"))
_WORKLOAD_FIELDS = tuple(f.name for f in fields(WorkloadSpec))


def parse_range_ratio(text: str) -> float | tuple[float, float]:
    """``--random-range-ratio`` as vLLM takes it: a number, or a JSON object
    ``{"input": a, "output": b}``."""
    if not text.strip().startswith("{"):
        return float(text)
    # argparse reports an ArgumentTypeError's message with the flag's name.
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON; give a number or "
                                         '\'{"input": 0.3, "output": 0.5}\'') from None
    if not isinstance(value, dict) or set(value) != {"input", "output"} or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()):
        raise argparse.ArgumentTypeError(f"{text!r}: the JSON form is an object with the numbers "
                                         '"input" and "output" exactly')
    return float(value["input"]), float(value["output"])


def workload_spec_from_args(args: argparse.Namespace) -> WorkloadSpec:
    """The workload flags of a parsed command line."""
    given = {name: _field_value(name, getattr(args, name)) for name in _WORKLOAD_FIELDS
             if hasattr(args, name)}
    ratio = given.get("random_range_ratio")
    if isinstance(ratio, tuple):
        if given.get("random_output_range_ratio") is not None:
            raise UserInputError("--random-output-range-ratio with --random-range-ratio's JSON form: give "
                                 "the output ratio once")
        given["random_range_ratio"], given["random_output_range_ratio"] = ratio
    return WorkloadSpec(**given)


def _field_value(name: str, value: Any) -> Any:
    # argparse's nargs="+" gives a list; the spec keeps tuples.
    return tuple(value) if isinstance(value, list) else value


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The run spec a parsed command line describes (engine, workload and,
    where present, output flags)."""
    engine = EngineOptions(**{name: _field_value(name, getattr(args, name)) for name in engine_fields()
                              if hasattr(args, name)})
    group = InstanceGroup(engine, **{name: getattr(args, name) for name in _GROUP_FIELDS
                                     if hasattr(args, name)})
    deployment = deployment_spec(group, getattr(args, "disaggregation", None),
                                 getattr(args, "prefill_tensor_parallel_size", None),
                                 getattr(args, "decode_tensor_parallel_size", None),
                                 getattr(args, "kv_transfer_config", None),
                                 getattr(args, "router", DeploymentSpec().router),
                                 role_scheduler={role: {name: getattr(args, f"{role}_{name}", None)
                                                        for name in ROLE_SCHEDULER_FLAGS}
                                                 for role in ROLES},
                                 role_offloading={role: getattr(args, f"{role}_kv_offloading_size", None)
                                                  for role in ROLES})
    workload = workload_spec_from_args(args)
    options = RunOptions()
    if hasattr(args, "metric_percentiles"):
        options = RunOptions(
            fast_forward=not args.no_fast_forward,
            percentiles=parse_percentiles(args.metric_percentiles),
            percentile_metrics=parse_percentile_metrics(getattr(args, "percentile_metrics", None)),
            goodput=tuple(parse_goodput(args.goodput).items()) if args.goodput else (),
            keep_token_times=bool(args.save_detailed),
            # The step log grows with the run; only the report plots it.
            keep_step_log=bool(args.report),
            trace_steps=args.trace_steps)
    return RunSpec(deployment, workload, options)


def parse_spec(argv: Sequence[str], prog: str = "kvsched simulate") -> RunSpec:
    """The run spec of ``kvsched simulate``'s flags (a tuner job, a variant)."""
    return spec_from_args(simulate_flag_parser(prog).parse_args(list(argv)))


def _words(name: str, value: object, default: object) -> list[str]:
    """One field as simulate's flags: vLLM's spelling (:func:`vllm_words`)
    but for a number, written exactly (``repr``: parse_spec gives the spec
    back), and the flags vLLM has no ``--no-`` form or list of."""
    flag = option(name)
    if value == default or value is None:
        return []
    if name == "enable_expert_parallel":  # a store_true flag, as vLLM's
        return [flag] if value else []
    if isinstance(value, float):
        return [flag, "inf" if math.isinf(value) else repr(value)]
    if isinstance(value, tuple):  # an nargs="+" flag (--lora-modules)
        return [flag, *map(str, value)] if value else []
    return vllm_words(name, value, default)


def spec_argv(spec: RunSpec) -> list[str]:
    """``kvsched simulate``'s flags for ``spec``'s deployment and workload
    (only values that differ from the defaults; the output options are the
    command's own), such that :func:`parse_spec` gives the spec back."""
    deployment = spec.deployment
    group = deployment.group
    d_engine, d_group, d_workload = EngineOptions(), InstanceGroup(), WorkloadSpec()
    out: list[str] = []
    skip: tuple[str, ...] = ()
    if deployment.disaggregated:
        prefill, decode = deployment.groups
        pe, de = prefill.engine, decode.engine
        out += ["--disaggregation", f"{pe.data_parallel_size}P{de.data_parallel_size}D",
                "--prefill-tensor-parallel-size", str(pe.tensor_parallel_size),
                "--decode-tensor-parallel-size", str(de.tensor_parallel_size)]
        # Scheduler settings the roles do not share: each role's own flag
        # (none where a role keeps the default), not the shared one.
        differ = tuple(name for name in ROLE_SCHEDULER_FLAGS if getattr(pe, name) != getattr(de, name))
        for name in differ:
            for role, e in (("prefill", pe), ("decode", de)):
                if getattr(e, name) is not None:
                    out += [f"--{role}-{name.replace('_', '-')}", str(getattr(e, name))]
        # CPU offloading the roles do not share: each role's own flag.
        if pe.kv_offloading_size != de.kv_offloading_size:
            differ += ("kv_offloading_size",)
            for role, e in (("prefill", pe), ("decode", de)):
                if e.kv_offloading_size is not None:
                    out += [f"--{role}-kv-offloading-size", repr(e.kv_offloading_size)]
        if deployment.kv_transfer_config is not None:
            out += ["--kv-transfer-config", deployment.kv_transfer_config]
        out += _words("router", deployment.router, DeploymentSpec().router)
        skip = ("tensor_parallel_size", "data_parallel_size", *differ)
    for name in engine_fields():
        if name in skip:
            continue
        out += _words(name, getattr(group.engine, name), getattr(d_engine, name))
    for name in _GROUP_FIELDS:
        out += _words(name, getattr(group, name), getattr(d_group, name))
    for name in _WORKLOAD_FIELDS:
        out += _words(name, getattr(spec.workload, name), getattr(d_workload, name))
    return out


