"""``kvsched calibrate``: the command line (flags, checks, output)."""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from typing import Any

from kvsched.calibrate.fit import DEFAULT_MAX_ITERATIONS, Calibrator
from kvsched.calibrate.loss import DEFAULT_GROUPS, MIN_GROUP
from kvsched.calibrate.reanchor import measure_drift, read_iteration_log, reanchored
from kvsched.calibrate.report import format_report, provenance
from kvsched.calibrate.resimulate import check_run, workload_of
from kvsched.calibrate.run_files import VLLM_DEFAULT_SEED, load_run
from kvsched.calibrate.step_matching import replay_iteration_log
from kvsched.calibrate.terms import DEFAULT_FIT, parse_fit_names, typical_start
from kvsched.commands.simulate import check_output_path
from kvsched.errors import UserInputError
from kvsched.perf.host import DEFAULT_FILE, TERMS, HostTerms, format_term, load_host_terms, save_host_terms
from kvsched.perf.profiled import ProfiledStepTimeModel
from kvsched.perf.step_profile import save_profile
from kvsched.sim.deployment import Deployment
from kvsched.sim.flags import add_engine_arguments, spec_argv, spec_from_args
from kvsched.sim.run import build_group_deployment, sim_config
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec

DEFAULT_OUTPUT = "calibration.json"


def engine_flags(group: InstanceGroup) -> str:
    """The deployment's engine flags that differ from the defaults, as a command line."""
    words = spec_argv(RunSpec(DeploymentSpec((group,))))
    return shlex.join(words) if words else "defaults"


def add_calibrate_parser(sub: Any) -> None:
    p = sub.add_parser(
        "calibrate", help="fit the host terms of any step-time backend to real serving runs",
        description="Fit the host terms (kvsched.perf.host) of the deployment's step-time backend "
                    "(measured, roofline or profiled) to serving runs of one deployment, given as "
                    "simulate's engine flags; write a file for simulate/compare --calibration. Here "
                    "--calibration FILE gives the start values (and the terms not fitted; default: "
                    "the measured backend's fitted file, each term's typical size for the "
                    "others). See docs/calibrate.md.")
    add_engine_arguments(p)
    g = p.add_argument_group("calibration")
    g.add_argument("--bench", action="append", default=[], metavar="FILE.json",
                   help="a vllm bench serve --save-result --save-detailed JSON (or kvsched simulate's) "
                        "to fit on (repeatable)")
    g.add_argument("--requests", action="append", default=[], metavar="FILE.jsonl",
                   help="per-request JSON lines: arrival_time, first_token_time, last_token_time, "
                        "prompt_tokens, output_tokens (repeatable)")
    g.add_argument("--held-out", action="append", default=[], metavar="FILE",
                   help="a run of the same deployment (either format) only to judge the fit on "
                        "(repeatable)")
    g.add_argument("--fit", metavar="TERMS",
                   help=f"comma-separated terms to fit, of {', '.join(TERMS)} (default: "
                        f"{', '.join(DEFAULT_FIT)}; dp_sync_s "
                        "only with --data-parallel-size > 1); the others keep their start values")
    g.add_argument("--output", "-o", default=DEFAULT_OUTPUT, metavar="FILE.json",
                   help="where to write the fitted terms (default: %(default)s)")
    g.add_argument("--groups", type=int, default=DEFAULT_GROUPS,
                   help="the loss compares mean TTFT and TPOT over at most this many groups of "
                        f"requests of similar length per run, of {MIN_GROUP} requests at least "
                        "(1: each run's means; default: %(default)s)")
    g.add_argument("--max-iterations", type=int, default=DEFAULT_MAX_ITERATIONS,
                   help="iterations of each of the two fits at most (docs/calibrate.md; default: "
                        "%(default)s)")
    g.add_argument("--seed", type=int, default=VLLM_DEFAULT_SEED,
                   help="the runs' vllm bench serve --seed, to redraw the arrival times of a finite "
                        "--request-rate run whose file has neither start_times nor a seed "
                        "(default: %(default)s, vLLM's)")
    g.add_argument("--served-model-name", metavar="NAME",
                   help="the name the runs' files give the model (vllm serve --served-model-name), "
                        "taken as the deployment's model")
    r = p.add_argument_group("re-anchoring a step profile (docs/calibrate.md)")
    r.add_argument("--reanchor", action="store_true",
                   help="instead of fitting host terms: scale --step-time-profile to the machine as it "
                        "ran the one --bench run, from that run's --server-log, and write the new "
                        "profile to --output")
    r.add_argument("--server-log", metavar="FILE",
                   help="the log of the vllm serve (--enable-logging-iteration-details) that served "
                        "the --bench run, holding that run's steps only (plain or .gz)")
    p.set_defaults(func=run_calibrate)


def start_terms(path: str | None, deployment: Deployment) -> tuple[HostTerms, str]:
    """The fit's start values and how to name them: ``--calibration FILE``,
    else the backend's own terms (the measured backend's fitted file, the
    serving path a step profile measured), else (none) each term's typical
    size."""
    if path:
        return load_host_terms(path), path
    own = deployment.step_model.host
    if isinstance(deployment.step_model, ProfiledStepTimeModel) and own is not None:
        return own, "the serving path the step profile measured"
    if own is not None:
        return own, f"the default {DEFAULT_FILE.name}"
    return typical_start(deployment.parallel.data_parallel_size), "typical sizes (the backend has none)"


def run_reanchor(args: argparse.Namespace) -> int:
    """``--reanchor``: the profile scaled to the machine as one logged run found it."""
    if len(args.bench) != 1 or args.requests or args.held_out:
        raise UserInputError("--reanchor takes exactly one --bench FILE.json (the run the --server-log "
                             "logged) and no --requests or --held-out")
    if args.server_log is None:
        raise UserInputError("--reanchor needs --server-log FILE: the vllm serve log of the --bench run")
    if args.calibration is not None:
        raise UserInputError("--reanchor re-anchors the forward pass alone: drop --calibration (apply "
                             "it to the new profile in simulate)")
    check_output_path("--output", args.output)
    spec = spec_from_args(args)
    deployment, _ = build_group_deployment(spec.deployment.group)
    model = deployment.step_model
    if not isinstance(model, ProfiledStepTimeModel):
        raise UserInputError("--reanchor re-anchors a step profile: give --step-time-profile FILE "
                             "(kvsched profile's output)")
    run = load_run(args.bench[0], "bench", seed=args.seed)
    check_run(run, deployment, args.served_model_name)
    if run.ttfts is None:
        raise UserInputError(f"--bench {args.bench[0]!r}: no per-request TTFTs (save it with "
                             "vllm bench serve --save-detailed)")
    log = read_iteration_log(args.server_log)
    first_token = [t + ttft for t, ttft in zip(run.arrivals, run.ttfts)]
    replay = replay_iteration_log(sim_config(deployment, spec), workload_of(run), log, first_token)
    drift = measure_drift(model, replay, log)
    profile = reanchored(model.profile, drift, f"{args.bench[0]} + {args.server_log}")
    save_profile(profile, args.output)
    kinds = ", ".join(f"{name} x{value:.3f}" for name, value in
                      (("with prompt tokens", drift.prefill_factor), ("pure decode", drift.decode_factor))
                      if value is not None)
    print(f"{len(log)} logged steps explained by kvsched's scheduler; logged/profiled over {drift.steps} "
          f"steps: x{drift.factor:.3f} (p10-p90 {drift.p10:.3f}-{drift.p90:.3f}; {kinds})")
    print(f"wrote {args.output}: use it with --step-time-profile {args.output}")
    return 0


def run_calibrate(args: argparse.Namespace) -> int:
    if args.reanchor:
        return run_reanchor(args)
    if args.server_log is not None:
        raise UserInputError("--server-log is read with --reanchor only")
    if not args.bench and not args.requests:
        raise UserInputError("calibrate needs a run to fit on: --bench FILE.json (vllm bench serve "
                         "--save-result --save-detailed) or --requests FILE.jsonl")
    if args.max_iterations < 1:
        raise UserInputError(f"--max-iterations={args.max_iterations}: must be at least 1")
    if args.groups < 1:
        raise UserInputError(f"--groups={args.groups}: must be at least 1 (1: each run's means)")
    if args.seed < 0:
        raise UserInputError(f"--seed={args.seed}: must be >= 0 (vllm bench serve's --seed)")
    check_output_path("--output", args.output)
    # Any backend: auto falls back to the roofline where the tables do not
    # reach (the note says so), and its host terms are fitted as well.
    group = spec_from_args(args).deployment.group
    deployment, notes = build_group_deployment(group)
    for note in notes:
        print(f"kvsched: note: {note}", file=sys.stderr, flush=True)
    fitted = parse_fit_names(args.fit, deployment.parallel.data_parallel_size)
    runs = [load_run(p, "bench", seed=args.seed) for p in args.bench]
    runs += [load_run(p, "requests", seed=args.seed) for p in args.requests]
    held = [load_run(p, "auto", seed=args.seed) for p in args.held_out]
    for run in [*runs, *held]:
        check_run(run, deployment, args.served_model_name)
    start, start_name = start_terms(args.calibration, deployment)
    print(f"Calibrating {', '.join(fitted)} for {deployment.describe()}.", flush=True)
    print(f"Start: {start_name} ({', '.join(f'{n} {format_term(n, v)}' for n, v in start.terms().items())}).")
    for run in runs:
        print(f"fit on   {run.describe()}")
    for run in held:
        print(f"held out {run.describe()}")
    calibrator = Calibrator(deployment, runs, start, fitted, held_out=held, group=group,
                            groups=args.groups, out=lambda line: print(line, flush=True))
    c = calibrator.run(args.max_iterations)
    fit_files = [*args.bench, *args.requests]
    c.terms = dataclasses.replace(
        c.terms, hardware_class=deployment.hardware.id,
        # The release the runs were simulated as (--vllm-version, the engine's).
        vllm_version=deployment.vllm_version,
        provenance=provenance(c, fit_files, args.held_out, engine_flags(group),
                              start_name))
    print(format_report(c))
    save_host_terms(c.terms, args.output)
    print(f"wrote {args.output}: use it with kvsched simulate/compare --calibration {args.output}")
    sys.stdout.flush()
    return 0
