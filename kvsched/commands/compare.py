"""``kvsched compare``: several variants of a deployment on the same workload,
side by side (the columns of seed 001's table, plus p99s).

    kvsched compare --model Qwen3-8B --num-prompts 500 --request-rate 8 \\
        --variant "baseline:" --variant "cadence 2: --prefill-schedule-interval 2" \\
        --variant "seqs 64: --max-num-seqs 64"

A variant is ``NAME: FLAGS``; its flags are ``kvsched simulate``'s and override
the common ones given outside ``--variant``. ``--variants FILE`` reads them
from YAML/JSON: a mapping ``{name: "flags"}`` (or ``{name: [flags...]}``).
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from kvsched.commands import help_description
from kvsched.commands.simulate import check_output_paths, describe_workload
from kvsched.errors import REPORT_HINT, UserInputError, one_line
from kvsched.sim.flags import (
    add_engine_arguments,
    add_output_arguments,
    add_workload_arguments,
    spec_argv,
    spec_from_args,
)
from kvsched.sim.pricing import ALLOW_FLAG, Pricing, check_one_pricing, pricing_of
from kvsched.sim.refusals import format_failures
from kvsched.sim.results import describe_run, json_safe
from kvsched.sim.run import PreparedRun, RunResult, run_prepared
from kvsched.sim.run import prepare as prepare_spec
from kvsched.sim.simulator import stderr_progress
from kvsched.sim.spec import RunSpec
from kvsched.yamlfile import read_options_file

# Exit status when a variant hit a bug in kvsched (as the command line's).
EXIT_INTERNAL_ERROR = 3

# (label, metrics key, scale, format): seed 001's columns, then tails.
COLUMNS = (
    ("Mean TTFT ms", "mean_ttft_ms", 1.0, "{:.1f}"),
    ("Mean TPOT ms", "mean_tpot_ms", 1.0, "{:.2f}"),
    ("Duration s", "duration", 1.0, "{:.1f}"),
    ("Mean E2EL ms", "mean_e2el_ms", 1.0, "{:.1f}"),
    ("Input tok/s", "input_throughput", 1.0, "{:.1f}"),
    ("Output tok/s", "output_throughput", 1.0, "{:.1f}"),
    ("Req/s", "request_throughput", 1.0, "{:.3f}"),
    ("P99 TTFT ms", "p99_ttft_ms", 1.0, "{:.1f}"),
    ("P99 TPOT ms", "p99_tpot_ms", 1.0, "{:.2f}"),
    ("P99 E2EL ms", "p99_e2el_ms", 1.0, "{:.1f}"),
    ("Preempt", "num_preemptions", 1.0, "{:.0f}"),
    # How the variant's steps were priced (kvsched.sim.pricing: measured,
    # roofline, roofline-fallback, ...; "(mixed)" when the set mixes them).
    ("Steps", "step_times", 1.0, "{}"),
)
# Shown when --goodput gives SLOs.
GOODPUT_COLUMN = ("Goodput req/s", "request_goodput", 1.0, "{:.3f}")
# Shown when a variant has failed requests (refused, or timed out with
# --request-timeout): its latencies and throughputs cover the others only.
FAILED_COLUMN = ("Failed", "failed", 1.0, "{:.0f}")


class _VariantParser(argparse.ArgumentParser):
    """Raises on every error: argparse still exits from some (an ambiguous
    abbreviation, Python 3.11) even with ``exit_on_error=False``, printing
    its usage; a variant's bad flag is one error line naming the variant."""

    def error(self, message: str) -> NoReturn:
        raise argparse.ArgumentError(None, message)


def variant_parser() -> argparse.ArgumentParser:
    p = _VariantParser(prog="variant", add_help=False, exit_on_error=False, allow_abbrev=False)
    add_engine_arguments(p)
    add_workload_arguments(p)
    return p


# Seed 001's experiment: DeepSeek-V3.1, 3,500 in / 1,500 out, 512 requests at
# concurrency 128, on a deployment chosen in docs/balance.md.
_SEED_FLAGS = ["--model", "DeepSeek-V3.1-BF16", "--hardware", "ascend-910c", "--tensor-parallel-size", "4",
               "--data-parallel-size", "4", "--enable-expert-parallel", "--max-num-seqs", "32",
               "--max-model-len", "8192", "--num-prompts", "512", "--random-input-len", "3500",
               "--random-output-len", "1500", "--max-concurrency", "128"]
_SEED_VARIANTS = [
    ("baseline", []),
    ("balance full", ["--admission-policy", "balance", "--balance-threshold", "full"]),
    ("balance full-1", ["--admission-policy", "balance", "--balance-threshold", "full-minus-one"]),
    ("prefill-cadence 2", ["--admission-policy", "prefill-cadence", "--prefill-schedule-interval", "2"]),
    ("adp-balance", ["--admission-policy", "adp-balance"]),
]
PRESETS: dict[str, tuple[list[str], list[tuple[str, list[str]]]]] = {
    "balance-seed": (_SEED_FLAGS, _SEED_VARIANTS),
    # Request lengths spread ±10 %: the ranks' prefills fall out of step as on
    # real hardware, which exact fixed lengths in a deterministic simulation
    # never do (docs/balance.md).
    "balance-seed-jitter": ([*_SEED_FLAGS, "--random-range-ratio", "0.1"], _SEED_VARIANTS),
}
# The seed's own table (vllm-ascend, hardware not stated): baseline and balance.
SEED_001 = [
    ("seed baseline", {"mean_ttft_ms": 6600.0, "mean_tpot_ms": 86.85, "duration": 591.9,
                       "input_throughput": 3030.5, "output_throughput": 1297.3,
                       "request_throughput": 0.86}),
    ("seed balance", {"mean_ttft_ms": 7012.0, "mean_tpot_ms": 70.63, "duration": 501.7,
                      "input_throughput": 3575.7, "output_throughput": 1530.7,
                      "request_throughput": 1.02}),
]


def add_compare_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="simulate several variants on the same workload, side by side",
                       description=help_description(__doc__))
    add_engine_arguments(p)
    add_workload_arguments(p)
    add_output_arguments(p)
    p.add_argument("--variant", action="append", default=[], metavar='"NAME: FLAGS"',
                   help="a variant: its name, a colon, then simulate flags (repeatable)")
    p.add_argument("--variants", metavar="FILE", help="YAML/JSON mapping of variant name -> flags")
    p.add_argument(ALLOW_FLAG, dest="allow_mixed_pricing", action="store_true",
                   help="run variants priced by different step-time backends (e.g. measured kernels for "
                        "one, a roofline fallback for another) instead of refusing them; each row is marked")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="a built-in experiment: balance-seed (seed 001's table) or balance-seed-jitter "
                        "(the same with lengths spread ±10 %%); see docs/balance.md")
    p.set_defaults(func=run_compare)


def _split_flags(name: str, flags: str, where: str) -> list[str]:
    try:
        return shlex.split(flags)
    except ValueError as e:  # an unclosed quote
        raise UserInputError(f"{where}variant {name!r}: cannot split its flags {flags!r} ({e}); "
                         "check the quotes") from None


# A variants or search-space file: a mapping of a few names to flags.
def parse_variants(specs: list[str], path: str | None,
                   origins: dict[str, str] | None = None) -> list[tuple[str, list[str]]]:
    """``(name, flags)`` of every variant, ``--variant`` ones first; a name
    read from the file maps to ``--variants=FILE`` in ``origins``, so an
    error in its flags names the file."""
    variants: list[tuple[str, list[str]]] = []
    for spec in specs:
        name, sep, flags = spec.partition(":")
        if not sep or not name.strip():
            raise UserInputError(f"--variant {spec!r}: write it as 'NAME: FLAGS' (flags may be empty)")
        variants.append((name.strip(), _split_flags(name.strip(), flags, "--variant: ")))
    if path:
        data = read_options_file(path, "--variants")
        if not isinstance(data, dict):
            raise UserInputError(f"--variants={path}: must map variant names to flags, "
                             f"e.g. 'small: --max-num-seqs 8'; it holds a {type(data).__name__}")
        if not data:
            raise UserInputError(f"--variants={path}: holds no variants; map each variant's name to its "
                             "flags, e.g. 'small: --max-num-seqs 8'")
        for name, flags in data.items():
            if not str(name).strip():
                raise UserInputError(f"--variants={path}: a variant has an empty name; name every variant")
            if origins is not None:
                origins[str(name).strip()] = f"--variants={path}: "
            if isinstance(flags, str):
                variants.append((str(name).strip(), _split_flags(str(name), flags, f"--variants={path}: ")))
            elif isinstance(flags, list) and all(isinstance(f, str | int | float) for f in flags):
                variants.append((str(name).strip(), [str(f) for f in flags]))
            elif flags is None:
                variants.append((str(name).strip(), []))
            else:
                raise UserInputError(f"--variants={path}: variant {name!r}: flags must be a string or a list "
                                 f"of strings, not {type(flags).__name__}")
    if not variants:
        raise UserInputError("no variants: give --variant 'NAME: FLAGS' (repeatable) or --variants FILE")
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        raise UserInputError(f"variant names must be unique: {names}")
    return variants


@dataclass(slots=True)
class Prepared:
    """A variant checked and built, ready to run."""

    name: str
    flags: list[str]
    run: PreparedRun


def prepare(name: str, flags: list[str], args: argparse.Namespace,
            parser: argparse.ArgumentParser, where: str = "") -> Prepared:
    """Parse a variant's flags over the common ones, then build its deployment
    and workload: every error a variant can have before it runs (``where``:
    the file it came from, for the message)."""
    ns = copy.copy(args)
    try:
        # Only flags the variant names change: argparse keeps the rest.
        _, unknown = parser.parse_known_args(flags, namespace=ns)
    except argparse.ArgumentError as e:
        raise UserInputError(f"{where}variant {name!r}: bad flags {' '.join(flags)!r} ({e})") from None
    if unknown:
        raise UserInputError(f"{where}variant {name!r}: unknown flags {' '.join(unknown)!r}; "
                             "use kvsched simulate's engine and workload flags")
    try:
        run = prepare_spec(spec_from_args(ns))
    except ValueError as e:
        raise UserInputError(f"{where}variant {name!r}: {e}") from None
    return Prepared(name, flags, run)


def check_same_workload(prepared: list[Prepared]) -> None:
    """Variants compare deployments on one workload: a variant whose flags
    change the workload is refused (its numbers would differ for that reason)."""
    first = prepared[0]
    for v in prepared[1:]:
        if v.run.spec.workload != first.run.spec.workload:
            mine = set(_workload_words(v))
            theirs = set(_workload_words(first))
            diff = " ".join(sorted(mine ^ theirs)) or "(the workload flags)"
            raise UserInputError(
                f"variant {v.name!r} runs a different workload than {first.name!r} (differing "
                f"flags: {diff}); compare runs every variant on the same workload: put workload "
                "flags outside --variant, or run the workloads with kvsched simulate")


def _workload_words(v: Prepared) -> list[str]:
    words = spec_argv(RunSpec(workload=v.run.spec.workload))
    return [f"{a}={b}" for a, b in zip(words[::2], words[1::2])]


def pricing(run: PreparedRun) -> Pricing:
    """How a variant's steps are priced, for its table row."""
    return pricing_of(run.deployment)


def run_compare(args: argparse.Namespace) -> int:
    origins: dict[str, str] = {}
    if args.preset:
        base, preset_variants = PRESETS[args.preset]
        # The preset sets what the command line left at its default.
        parser = variant_parser()
        defaults = vars(parser.parse_args([]))
        for key, value in vars(parser.parse_args(base)).items():
            if value != defaults[key] and getattr(args, key) == defaults[key]:
                setattr(args, key, value)
        variants = preset_variants + (parse_variants(args.variant, args.variants, origins)
                                      if args.variant or args.variants else [])
    else:
        variants = parse_variants(args.variant, args.variants, origins)
    if args.trace_steps:
        raise UserInputError("--trace-steps: one trace per run; use kvsched simulate with the "
                             "variant's flags")
    check_output_paths(args)
    parser = variant_parser()
    # Every variant is checked before any runs: a typo in the last one should
    # not cost the time of the others.
    prepared = [prepare(name, flags, args, parser, origins.get(name, "")) for name, flags in variants]
    check_same_workload(prepared)
    # Variants priced by different backends are refused before any runs
    # (or, when allowed, each row is marked).
    mixed = check_one_pricing([(v.name, pricing(v.run)) for v in prepared], args.allow_mixed_pricing,
                              "variants")
    done: list[tuple[Prepared, RunResult]] = []
    failed: list[str] = []
    internal = False
    progress = None if args.no_progress or not sys.stderr.isatty() else stderr_progress
    for v in prepared:
        for note in v.run.notes:
            print(f"kvsched: note: variant {v.name!r}: {note}", file=sys.stderr, flush=True)
        print(f"[{v.name}] {v.run.deployment.describe()}; "
              f"{describe_workload(v.run.spec.workload, v.run.workload)}", flush=True)
        try:
            result = run_prepared(v.run, progress)
        except Exception as e:  # keep the other variants' results
            if isinstance(e, UserInputError | OSError):
                # As kvsched.cli treats them: the input's problem, not a bug.
                print(f"kvsched: error: variant {v.name!r}: {one_line(str(e))}", file=sys.stderr,
                      flush=True)
                failed.append(v.name)
                continue
            # Anything else is a bug: say so (the others' results are still shown).
            if getattr(args, "debug", False):
                raise
            print(f"kvsched: internal error: variant {v.name!r}: {type(e).__name__}: "
                  f"{one_line(str(e), 300)}; {REPORT_HINT}", file=sys.stderr, flush=True)
            failed.append(v.name)
            internal = True
            continue
        m = result.metrics
        m["input_throughput"] = (m.get("total_input_tokens", 0) / m["duration"]
                                 if m.get("duration") else 0.0)
        priced = pricing(v.run)
        m["step_times"] = priced.label + (" (mixed)" if mixed else "")
        for line in format_failures(result.result.failed, len(v.run.workload.requests)):
            print(f"[{v.name}] {line}")
        done.append((v, result))
    slos = bool(prepared[0].run.spec.options.goodput)
    columns = (*COLUMNS, GOODPUT_COLUMN) if slos else COLUMNS
    if any(r.metrics.get("failed") for _, r in done):
        columns = (*columns, FAILED_COLUMN)
    if done:
        print(format_comparison([(v.name, r.metrics) for v, r in done], columns))
        if mixed:
            print(f"warning: {ALLOW_FLAG}: the variants' steps are priced by different backends (column "
                  "'Steps', marked '(mixed)'): their differences mix the deployments with the pricing; "
                  "see docs/validation.md", file=sys.stderr)
    if args.preset and args.preset.startswith("balance-seed"):
        print("\nSeed 001's measurement (vllm-ascend; hardware not stated), for reference:")
        print(format_comparison(SEED_001))
    runs = [describe_run(v.run.deployment, v.run.spec, v.run.workload) for v, _ in done]
    if args.save_result and done:
        out = [{"name": v.name, "flags": v.flags, **r.metrics, **pricing(v.run).to_json(),
                "mixed_pricing": mixed, **run}
               for (v, r), run in zip(done, runs)]
        Path(args.save_result).write_text(
            json.dumps(json_safe(out), indent=2, allow_nan=False, default=str) + "\n")
    if args.report and done:
        from kvsched.report.simulate_page import write_report

        write_report(args.report, [(v.name, r.result) for v, r in done], "kvsched compare",
                     [f"{v.name}: {' '.join(v.flags) or '(common flags)'} -> {v.run.deployment.describe()}; "
                      f"{describe_workload(v.run.spec.workload, v.run.workload)}" for v, _ in done],
                     metrics=[r.metrics for _, r in done], descriptions=runs)
        print(f"report: {args.report}")
    if failed:
        print(f"kvsched: error: {len(failed)} of {len(prepared)} variants failed: "
              f"{', '.join(map(repr, failed))}", file=sys.stderr)
        return EXIT_INTERNAL_ERROR if internal else 1
    return 0


def format_comparison(rows: list[tuple[str, dict[str, Any]]],
                      columns: tuple[tuple[str, str, float, str], ...] = COLUMNS) -> str:
    width = max(12, *(len(n) for n, _ in rows)) + 2
    # At least two spaces between columns, labels and text cells alike.
    widths = [max(14, len(label) + 2, *(len(v) + 2 for _, m in rows if isinstance(v := m.get(key), str)))
              for label, key, *_ in columns]
    head = f"{'variant':<{width}}" + "".join(f"{label:>{w}}" for (label, *_), w in zip(columns, widths))
    lines = [head, "-" * len(head)]
    base = rows[0][1]
    for name, m in rows:
        cells = []
        for (_, key, scale, fmt), w in zip(columns, widths):
            value = m.get(key)
            if isinstance(value, str):
                cells.append(f"{value:>{w}}")
                continue
            cells.append(f"{'-':>{w}}" if value is None else f"{fmt.format(value * scale):>{w}}")
        lines.append(f"{name:<{width}}" + "".join(cells))
        if m is not base:
            rel = []
            for (_, key, _, _), w in zip(columns, widths):
                a, b = base.get(key), m.get(key)
                numbers = isinstance(a, int | float) and isinstance(b, int | float)
                rel.append(f"{(b - a) / a:>+{w}.1%}" if numbers and a else f"{'':>{w}}")
            lines.append(f"{'  vs ' + rows[0][0]:<{width}}" + "".join(rel))
    return "\n".join(lines)
