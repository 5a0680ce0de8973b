"""``kvsched tune``: the deployment that meets an SLO at the lowest cost.

    kvsched tune --model meta-llama/Llama-3.1-70B --hardware h100-sxm h200 --max-gpus 16 \\
        --dataset-name azure --dataset-path conv.csv --target-rate 5 \\
        --slo ttft:2000 tpot:100 --slo-percentile 99 --save-result tune.json

Every candidate is a run spec (``kvsched simulate``'s); the winners are
printed with the ``vllm serve`` line that runs them and the ``kvsched
simulate`` line that reproduces their numbers. ``--disaggregation auto``
adds prefill/decode disaggregated candidates (every xPyD split of the GPU
budget, per-role TP from --tp), answered with a ``vllm serve`` line per
instance and the proxy's command.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from kvsched.commands import help_description
from kvsched.commands.simulate import check_output_path
from kvsched.engine_flags import vllm_words
from kvsched.errors import UserInputError
from kvsched.progress import ProgressBar
from kvsched.scheduler_defaults import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.flags import add_engine_arguments, add_workload_arguments, workload_spec_from_args
from kvsched.sim.metrics import parse_goodput
from kvsched.sim.pricing import ALLOW_FLAG, check_one_pricing, is_mixed
from kvsched.sim.results import json_safe
from kvsched.sim.run import build_workload
from kvsched.sim.serve_line import RELEASE_DEFAULTED, serve_dests
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec
from kvsched.tune.evaluate import ResultCache, inputs_digest
from kvsched.tune.executors import make_executor
from kvsched.tune.search import (
    OBJECTIVES,
    PERCENTILES,
    Problem,
    Runner,
    Slo,
    TuneResult,
    feasible_with_pricing,
    rank,
    rate_grid,
    search,
)
from kvsched.tune.space import NONE_WORDS, SearchSpace, check_space_values
from kvsched.yamlfile import read_options_file

ON_OFF = {"on": True, "off": False}
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "kvsched", "tune")
# Engine flags every candidate shares (not searched), as simulate names them.
FIXED_ENGINE = ("vllm_version", "max_model_len", "dtype", "quantization", "step_time_backend",
                "step_time_profile", "gpu_memory_utilization", "block_size", "enable_extensible_kv_cache",
                "calibration", "async_scheduling", "speculative_config", "spec_acceptance")
# vLLM's defaults, as EngineOptions (kvsched simulate's flags) holds them.
ENGINE_DEFAULTS = {k: getattr(EngineOptions(), k) for k in FIXED_ENGINE}


def add_tune_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help="find the deployment that meets an SLO at the lowest cost",
                       description=help_description(__doc__))
    g = p.add_argument_group("question")
    # simulate's defaults (EngineOptions'); tune's own help, --hardware a list to search.
    g.add_argument("--model", default=EngineOptions().model, help="catalog name or config.json")
    g.add_argument("--hardware", nargs="+", default=[EngineOptions().hardware],
                   help="hardware ids to consider")
    g.add_argument("--max-gpus", type=int, default=8, help="GPU budget per deployment (default 8)")
    g.add_argument("--gpu-price", nargs="+", default=[], metavar="HW=USD",
                   help="$ per GPU-hour, e.g. h100-sxm=2.5 h200=3.5 (for --objective cost)")
    g.add_argument("--slo", nargs="+", required=True, metavar="KEY:MS",
                   help="SLOs as vllm bench goodput terms, e.g. ttft:2000 tpot:100 e2el:30000")
    g.add_argument("--slo-percentile", choices=PERCENTILES, default="99",
                   help="the statistic the SLOs bound (default 99)")
    g.add_argument("--objective", choices=OBJECTIVES, default="goodput-per-gpu",
                   help="goodput per GPU (default), cost per million output tokens, or fewest GPUs")
    rate = g.add_mutually_exclusive_group()
    rate.add_argument("--target-rate", type=float, metavar="REQ_S",
                      help="serve the workload at this mean rate (a trace is rescaled in time)")
    g.add_argument("--rate-range", nargs=2, type=float, default=[0.25, 16.0], metavar=("LOW", "HIGH"),
                   help="--find-max-rate: rates searched, as multiples of the workload's own mean "
                        "rate (default 0.25 16)")
    g.add_argument("--rate-steps", type=int, default=4,
                   help="--find-max-rate: grid points per doubling of the rate (default 4: 19%% steps)")
    rate.add_argument("--find-max-rate", action="store_true",
                      help="per deployment, the highest rate that meets the SLO")
    s = p.add_argument_group("search space (each a list; --space FILE sets them from YAML/JSON)")
    s.add_argument("--space", metavar="FILE", help="YAML/JSON mapping of dimension -> list of values")
    s.add_argument("--tp", "--tensor-parallel-size", dest="tensor_parallel_size", type=int, nargs="+",
                   metavar="N", help="tensor-parallel sizes to try (default: 1 2 4 8 within --max-gpus)")
    s.add_argument("--pp", "--pipeline-parallel-size", dest="pipeline_parallel_size", type=int, nargs="+",
                   metavar="N", help="pipeline-parallel sizes to try, each candidate's GPUs TP x PP x DP "
                                     "within --max-gpus (default: 1)")
    s.add_argument("--dp", "--data-parallel-size", dest="data_parallel_size", type=int, nargs="+",
                   metavar="N", help="data-parallel sizes to try (default: 1 2 4 ... within --max-gpus)")
    s.add_argument("--expert-parallel", nargs="+", choices=list(ON_OFF),
                   help="expert parallelism on and/or off (MoE models; default: both)")
    s.add_argument("--max-num-seqs", nargs="+", metavar="N",
                   help=f"max_num_seqs values, or 'default' for vLLM's (default: default "
                        f"{DEFAULT_MAX_NUM_SEQS})")
    s.add_argument("--max-num-batched-tokens", nargs="+", metavar="N",
                   help="max_num_batched_tokens values, or 'default' for vLLM's (default: default "
                        f"{DEFAULT_MAX_NUM_BATCHED_TOKENS})")
    s.add_argument("--chunked-prefill", nargs="+", choices=list(ON_OFF),
                   help="chunked prefill on and/or off (default: on)")
    s.add_argument("--prefix-caching", nargs="+", choices=list(ON_OFF),
                   help="prefix caching on and/or off (default: on)")
    s.add_argument("--kv-cache-dtype", nargs="+", metavar="DTYPE",
                   help="KV cache dtypes to try: auto, fp8 (default: auto)")
    s.add_argument("--scheduling-policy", nargs="+", metavar="POLICY",
                   help="scheduling policies to try: fcfs, priority (default: fcfs)")
    s.add_argument("--admission-policy", nargs="+", metavar="POLICY",
                   help="kvsched's admission policies to try: none, balance, prefill-cadence "
                        "(default: none)")
    s.add_argument("--disaggregation", choices=["off", "auto"], default="off",
                   help="auto: also every prefill/decode disaggregated split xPyD of --max-gpus (x "
                        "prefill and y decode instances, per-role TP from --tp, joined by vLLM's "
                        "NixlConnector behind its P/D proxy) beside the colocated candidates "
                        "(default: off)")
    s.add_argument("--router", nargs="+", metavar="ROUTER",
                   help="with --disaggregation auto: how the P/D proxy picks an instance of each role, "
                        "round-robin (vLLM's proxy), least-loaded, prefix-aware (default: round-robin)")
    s.add_argument("--kv-offloading-size", nargs="+", metavar="GIB",
                   help="vLLM's --kv-offloading-size values to try (GiB of CPU KV cache per engine core), "
                        "or 'off'; a P/D candidate's instances get it as vLLM's MultiConnector of NIXL and "
                        "offloading in --kv-transfer-config (default: off)")
    s.add_argument("--kv-offloading-roles", nargs="+", metavar="ROLES",
                   help="with --disaggregation auto and --kv-offloading-size: which roles of a P/D "
                        "candidate offload, both, prefill, decode (the others run NixlConnector alone; "
                        "default: both)")
    add_engine_arguments(p, FIXED_ENGINE, title="engine settings every candidate shares")
    add_workload_arguments(p)
    x = p.add_argument_group("execution and output")
    x.add_argument("--executor", choices=["local", "ray"], default="local")
    x.add_argument("--ray-address", help="join this Ray cluster (default: a local Ray instance)")
    x.add_argument("--workers", type=int, help="local processes (default: all cores)")
    x.add_argument("--cache-dir", default=DEFAULT_CACHE, help="results cache (default: %(default)s)")
    x.add_argument("--no-cache", action="store_true", help="simulate everything again")
    x.add_argument("--save-result", metavar="FILE.json", help="best, pareto, every candidate")
    x.add_argument("--report", metavar="FILE.html",
                   help="a self-contained page: the Pareto plot, the ranked table, the commands")
    x.add_argument("--top", type=int, default=10, help="rows of the ranked table (default 10)")
    x.add_argument(ALLOW_FLAG, dest="allow_mixed_pricing", action="store_true",
                   help="search candidates priced by different step-time backends (e.g. measured kernels "
                        "for TP8, a roofline fallback for TP16) instead of refusing them; each row says "
                        "its pricing")
    x.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_tune)


def _numbers(name: str, raw: list[str]) -> list[int | float | None]:
    """A searched flag's words as values, None for its word (the space's
    :data:`~kvsched.tune.space.NONE_WORDS`)."""
    none_word, kind, what = NONE_WORDS[name]
    out: list[int | float | None] = []
    for v in raw:
        try:
            out.append(None if v == none_word else kind(v))
        except ValueError:
            raise UserInputError(f"--{name.replace('_', '-')}={v!r}: give {what} or {none_word!r}") from None
    return out


def build_space(args: argparse.Namespace, is_moe: bool) -> SearchSpace:
    """Defaults, then the space file, then the flags (each later one wins)."""
    powers = [n for n in (1, 2, 4, 8) if n <= min(8, args.max_gpus)]
    dims: dict[str, list[Any]] = {
        "hardware": list(args.hardware),
        "tensor_parallel_size": powers,
        "data_parallel_size": [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= args.max_gpus],
        "enable_expert_parallel": [False, True] if is_moe else [False],
        # vLLM serve's default for the GPU, and vLLM's generic default.
        "max_num_seqs": [None, DEFAULT_MAX_NUM_SEQS],
        "max_num_batched_tokens": [None, DEFAULT_MAX_NUM_BATCHED_TOKENS],
    }
    tp_given = args.tensor_parallel_size is not None
    if args.space:
        from_file = _read_space(args.space)
        tp_given = tp_given or "tensor_parallel_size" in from_file
        dims.update(from_file)
    flags = {"tensor_parallel_size": args.tensor_parallel_size, "data_parallel_size": args.data_parallel_size,
             "pipeline_parallel_size": args.pipeline_parallel_size,
             "enable_expert_parallel": [ON_OFF[v] for v in args.expert_parallel] if args.expert_parallel
             else None,
             "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
             "enable_chunked_prefill": [ON_OFF[v] for v in args.chunked_prefill] if args.chunked_prefill
             else None,
             "enable_prefix_caching": [ON_OFF[v] for v in args.prefix_caching] if args.prefix_caching
             else None,
             "kv_cache_dtype": args.kv_cache_dtype, "scheduling_policy": args.scheduling_policy,
             "admission_policy": args.admission_policy, "router": args.router,
             "kv_offloading_size": args.kv_offloading_size,
             "kv_offloading_roles": args.kv_offloading_roles}
    for name, raw in flags.items():
        if raw is None:
            continue
        values = _numbers(name, raw) if name in NONE_WORDS else list(raw)
        dims[name] = list(check_space_values(name, values, f"--{name.replace('_', '-')}"))
    dims["hardware"] = list(check_space_values("hardware", dims["hardware"], "--hardware"))
    if args.step_time_profile is not None:
        _pin_to_profile(dims, args.step_time_profile, tp_given)
    disaggregation = args.disaggregation == "auto"
    if not disaggregation and dims.get("router", ["round-robin"]) != ["round-robin"]:
        raise UserInputError(f"--router {' '.join(map(str, dims['router']))}: the proxy's router only "
                             "matters with prefill/decode disaggregation; add --disaggregation auto or "
                             "drop --router")
    if not disaggregation and dims.get("kv_offloading_roles", ["both"]) != ["both"]:
        raise UserInputError(f"--kv-offloading-roles {' '.join(map(str, dims['kv_offloading_roles']))}: "
                             "which roles offload only matters with prefill/decode disaggregation; add "
                             "--disaggregation auto or drop --kv-offloading-roles")
    return SearchSpace(**{k: tuple(v) for k, v in dims.items()}, disaggregation=disaggregation)


def _pin_to_profile(dims: dict[str, list[Any]], path: str, tp_given: bool) -> None:
    """A step profile prices the one machine and TP size it was measured
    with: the search takes that TP (a --tp list, or a space file's, holding
    any other size is refused: those candidates could not be priced) and
    one hardware id (which sizes only what the profile does not say). Other
    dimensions are searched as usual; steps past the profiled range are
    warned about per candidate."""
    from kvsched.perf.profiled import profiled_tensor_parallel_size
    from kvsched.perf.step_profile import load_profile

    profile = load_profile(path)
    tp = profiled_tensor_parallel_size(profile)
    where = f"--step-time-profile {path!r}"
    others = [n for n in dims["tensor_parallel_size"] if n != tp]
    if tp_given and others:
        raise UserInputError(f"{where}: profiled with -tp {tp}, so it cannot price --tp "
                             f"{' '.join(map(str, others))}; give --tp {tp} (or profile those sizes "
                             "and tune each)")
    dims["tensor_parallel_size"] = [tp]
    if len(dims["hardware"]) != 1:
        raise UserInputError(f"{where}: a profile prices the machine it was measured on; give one "
                             f"--hardware (it sizes only what the profile does not say), not "
                             f"{' '.join(map(str, dims['hardware']))}")


def _read_space(path: str) -> dict[str, list[Any]]:
    data = read_options_file(path, "--space")
    if not isinstance(data, dict):
        raise UserInputError(f"--space {path}: expected a mapping of dimension -> list of values")
    return {str(k): list(check_space_values(str(k), v, f"--space {path}")) for k, v in data.items()}


def _prices(items: list[str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in items:
        hw, sep, value = item.partition("=")
        try:
            price = float(value) if sep else math.nan
        except ValueError:
            price = math.nan
        if not sep or not hw or not 0 < price < 1e6:
            raise UserInputError(f"--gpu-price {item!r}: give HW=USD per GPU-hour, e.g. h100-sxm=2.5")
        out[hw] = price
    return out


def run_tune(args: argparse.Namespace) -> int:
    from kvsched.perf import get_model
    from kvsched.version import __version__

    # Output paths are checked before anything is simulated.
    if args.report is not None:
        check_output_path("--report", args.report)
    if args.save_result is not None:
        check_output_path("--save-result", args.save_result)
    slo = Slo(tuple(parse_goodput(args.slo).items()), args.slo_percentile)
    if args.max_gpus < 1 or args.max_gpus > 4096:
        raise UserInputError(f"--max-gpus={args.max_gpus}: must be in [1, 4096]")
    prices = _prices(args.gpu_price)
    if args.objective == "cost":
        missing = [hw for hw in args.hardware if hw not in prices]
        if missing:
            raise UserInputError(f"--objective cost needs --gpu-price for {', '.join(missing)}")
    low, high = args.rate_range
    if not (0 < low < high <= 1e4) or not 1 <= args.rate_steps <= 64:
        raise UserInputError(f"--rate-range {low:g} {high:g} --rate-steps {args.rate_steps}: need "
                         "0 < LOW < HIGH <= 10000 (multiples of the workload's rate) and 1-64 steps "
                         "per doubling")
    if args.target_rate is not None and not 0 < args.target_rate < 1e6:
        raise UserInputError(f"--target-rate={args.target_rate}: must be a rate in (0, 1e6) req/s")
    workload_spec = workload_spec_from_args(args).resolved()
    workload = build_workload(workload_spec, args.model)
    # Paced by --request-rate (random, vllm bench serve's datasets, a re-paced
    # trace: resolved, they have a rate) or by the trace's own times.
    is_random = workload_spec.request_rate is not None
    if is_random and (args.target_rate is not None or args.find_max_rate) and args.request_rate is not None:
        raise UserInputError("--request-rate with --target-rate/--find-max-rate: give one rate")
    span = workload.last_arrival_time
    base_rate = len(workload.requests) / span if span > 0 else math.inf
    rescaled = args.target_rate is not None or args.find_max_rate
    if rescaled and not math.isfinite(base_rate) and not is_random:
        raise UserInputError("the trace's requests all arrive at once: it has no rate to rescale")
    if not math.isfinite(base_rate):
        base_rate = 1.0  # random prompts at an infinite rate: the grid starts from 1 req/s
    model = get_model(args.model)
    # Only what differs from the defaults: the reproducing lines stay short.
    engine = {k: getattr(args, k) for k in FIXED_ENGINE
              if getattr(args, k) is not None and getattr(args, k) != ENGINE_DEFAULTS.get(k)}
    # Those vllm serve takes go on its line too (the others are kvsched's);
    # those whose default is the release's are each candidate's
    # (Problem.vllm_serve: release_serve_words).
    serve_flags = [word for k, v in engine.items()
                   if k in serve_dests(args.vllm_version) and k not in RELEASE_DEFAULTED
                   for word in vllm_words(k, v)]
    base_spec = RunSpec(DeploymentSpec((InstanceGroup(EngineOptions(model=args.model, **engine)),)),
                        workload_spec)
    space = build_space(args, model.is_moe)
    candidates = sorted(space.candidates(args.max_gpus, model.is_moe), key=lambda c: c.order_key())
    if not candidates:
        raise UserInputError("the search space is empty: no combination fits --max-gpus "
                         f"{args.max_gpus}; widen --tp/--dp or raise --max-gpus")
    priced, pruned = feasible_with_pricing(candidates, base_spec)
    feasible = [c for c, _ in priced]
    if not feasible:
        reasons = sorted({why.split(';')[0] for _, why in pruned})
        raise UserInputError(f"no candidate of the {len(candidates)} fits in memory: "
                         f"{'; '.join(reasons[:3])}; allow more GPUs (--max-gpus) or larger ones")
    # A search over candidates priced by different backends would pick one
    # for its pricing: refused before anything is simulated, unless allowed.
    check_one_pricing([(c.label(), p) for c, p in priced], args.allow_mixed_pricing, "candidates")
    problem = Problem(model.name, base_spec, slo, args.objective, prices, is_random, base_rate,
                      inputs_digest([workload_spec.dataset_path, args.calibration, args.step_time_profile]),
                      serve_flags)
    bar = ProgressBar("simulations")
    progress = None
    if not args.no_progress and sys.stderr.isatty():
        def progress(done: int, total: int, best: str) -> None:
            bar.draw(done, total, f"best so far: {best or '-'}")
    cache = ResultCache(None if args.no_cache else args.cache_dir, __version__)
    executor = make_executor(args.executor, args.workers, args.ray_address)
    try:
        runner = Runner(executor, cache, progress)
        grid = (rate_grid(base_rate, args.rate_range[0], args.rate_range[1], args.rate_steps)
                if args.find_max_rate else None)
        answers, failed = search(problem, feasible, runner, args.target_rate, args.find_max_rate, grid)
    finally:
        executor.close()
        bar.close()  # the summary starts on its own line, even when the estimate of the total was high
    result = rank(problem, answers, pruned, runner, failed)
    print(format_result(problem, result, args))
    if args.save_result:
        Path(args.save_result).write_text(json.dumps(json_safe(result_json(problem, result, args)),
                                                     indent=2, allow_nan=False) + "\n")
    if args.report is not None:
        from kvsched.tune.page import question_from_args, write_tune_report

        question = question_from_args(args, workload, base_rate, len(candidates))
        write_tune_report(args.report, problem, result, question, __version__)
        print(f"report: {args.report}")
    return 0


def mixed_pricing(result: TuneResult) -> bool:
    """Whether the answered candidates were priced by more than one backend."""
    return is_mixed([e.pricing for e in result.ranked if e.pricing is not None])


def result_json(problem: Problem, result: TuneResult, args: argparse.Namespace) -> dict[str, Any]:
    m = problem.model
    return {
        "model": m, "vllm_version": problem.base.engine.vllm_version,
        "slo": dict(problem.slo.targets), "slo_percentile": problem.slo.percentile,
        "objective": problem.objective, "target_rate": args.target_rate,
        "find_max_rate": args.find_max_rate, "max_gpus": args.max_gpus,
        "best": result.best.to_json(problem) if result.best else None,
        "closest": result.closest.to_json(problem) if result.closest else None,
        "pareto": [e.to_json(problem) for e in result.pareto],
        "ranked": [e.to_json(problem) for e in result.ranked],
        "pruned": [{"label": c.label(), "candidate": c.to_json(), "reason": why} for c, why in result.pruned],
        "failed": [{"label": c.label(), "candidate": c.to_json(), "reason": why} for c, why in result.failed],
        "num_simulations": result.num_simulations, "num_cached": result.num_cached,
        "mixed_pricing": mixed_pricing(result),
    }


def format_result(problem: Problem, result: TuneResult, args: argparse.Namespace) -> str:
    slo = problem.slo
    stat = "mean" if slo.percentile == "mean" else f"p{slo.percentile}"
    lines = [f"{len(result.ranked)} deployments answered as vLLM {problem.base.engine.vllm_version} "
             f"({result.num_simulations} simulations, "
             f"{result.num_cached} from the cache), {len(result.pruned)} pruned by memory"
             + (f", {len(result.failed)} could not serve the load (in the saved JSON)"
                if result.failed else "")
             + "."]
    # With P/D candidates each row also says its shape (colocated or xPyD, and the TPs).
    shapes = any(e.candidate.disaggregated for e in result.ranked)
    head = f"{'#':>3}  {'deployment':42} {'GPUs':>4} {'rate':>7} {'goodput/GPU':>11}"
    if shapes:
        head = f"{'#':>3}  {'deployment':42} {'shape':26} {'GPUs':>4} {'rate':>7} {'goodput/GPU':>11}"
    for name, _ in slo.targets:
        head += f" {stat + ' ' + name:>12}"
    # Requests that failed (refused, or timed out with --request-timeout):
    # the SLO statistics cover the others only.
    failures = any(e.metrics.get("failed") for e in result.ranked)
    if failures:
        head += f" {'failed':>7}"
    head += "  SLO     pricing"
    lines.append(head)
    for i, e in enumerate(result.ranked[:args.top], 1):
        rate = (">=" if e.rate_is_lower_bound else "") + (f"{e.rate:.3g}" if e.rate is not None else "-")
        shape = f" {e.candidate.shape():26}" if shapes else ""
        row = (f"{i:>3}  {e.candidate.label()[:42]:42}{shape} {e.num_gpus:>4} {rate:>7} "
               f"{e.goodput_per_gpu:>11.3f}")
        for name, _ in slo.targets:
            row += f" {e.metrics.get(slo.key(name), math.nan):>12.1f}"
        if failures:
            failed = e.metrics.get("failed")
            row += f" {failed if failed is not None else '-':>7}"
        row += "  met   " if e.meets_slo else "  missed"
        row += f"  {e.pricing.label if e.pricing is not None else '-'}"
        lines.append(row)
    capped = [e for e in result.ranked if e.rate_is_lower_bound]
    if capped:
        lines.append(f"({len(capped)} met the SLO at the highest rate searched, marked >=: their limits "
                     "are higher; raise --rate-range HIGH)")
    if mixed_pricing(result):
        lines.append(f"warning: {ALLOW_FLAG}: the candidates are priced by different step-time backends "
                     "(column 'pricing'): the ranking mixes the deployments with the pricing")
    if result.best is not None:
        b = result.best
        priced = f", steps priced by {b.pricing.describe()}" if b.pricing is not None else ""
        lines += ["", f"Best: {b.candidate.label()} on {b.num_gpus} GPU{'s' if b.num_gpus > 1 else ''}"
                      + priced,
                  _indent(problem.vllm_serve(b.candidate)),
                  f"  reproduce: kvsched simulate {shlex.join(b.argv)}"]
        if len(result.pareto) > 1:
            lines.append(f"Pareto front (goodput/GPU vs {slo.key(slo.targets[0][0])}): "
                         + "; ".join(f"{e.candidate.label()} ({e.goodput_per_gpu:.3f}, "
                                     f"{e.metrics.get(slo.key(slo.targets[0][0]), math.nan):.0f})"
                                     for e in result.pareto))
    elif result.closest is not None:
        c = result.closest
        misses = ", ".join(f"{stat} {n} {c.metrics.get(slo.key(n), math.nan):.0f} ms > {t:g}"
                           for (n, t), s in zip(slo.targets, c.slack_ms.values()) if s < 0)
        lines += ["", f"No deployment meets the SLO; the closest is {c.candidate.label()} on "
                      f"{c.num_gpus} GPU{'s' if c.num_gpus > 1 else ''} ({misses})",
                  _indent(problem.vllm_serve(c.candidate))]
    return "\n".join(lines)


def _indent(text: str) -> str:
    """Every line of ``text`` two spaces in (a P/D answer is several lines)."""
    return "\n".join(f"  {line}" for line in text.splitlines())
