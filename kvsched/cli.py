"""The ``kvsched`` command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from kvsched.core.output import SchedulerOutput
from kvsched.core.scheduler import Scheduler


def _format_ids(ids: list[str], limit: int = 6) -> str:
    if not ids:
        return "-"
    shown = ", ".join(ids[:limit])
    return shown + (f" (+{len(ids) - limit})" if len(ids) > limit else "")


def _explain_step(step: int, output: SchedulerOutput, record: dict[str, Any],
                  sched: Scheduler) -> None:
    scheduled = record["scheduled"]
    tokens = sum(n for _, n in scheduled)
    budget = sched.max_num_scheduled_tokens
    parts = [f"step {step:>5}  {len(scheduled):>4} reqs {tokens:>6}/{budget} tok"
             f"  free {record['num_free_blocks']:>5} blk"
             f"  run {record['num_running']:>4} wait {record['num_waiting']:>4}"]
    for key in ("new", "resumed", "preempted"):
        if record[key]:
            parts.append(f"  {key}: {_format_ids(record[key])}")
    if record["finished"]:
        parts.append("  finished: " + _format_ids([f"{r}({why})" for r, why in record["finished"]]))
    print("".join(parts))
    # One line per distinct reason: the request admission stopped at, then
    # those queued behind it (or everyone, for a step-wide reason).
    groups: dict[tuple[str, str], list[str]] = {}
    for item in output.not_admitted or ():
        groups.setdefault((item.reason, item.detail), []).append(item.request_id)
    for (reason, detail), ids in groups.items():
        print(f"      not admitted {_format_ids(ids, 8)}: {reason} - {detail}")


def _cmd_replay(args: argparse.Namespace) -> int:
    from kvsched.replay import check_requests, load_scenario, replay

    scenario = load_scenario(args.scenario)
    check_requests(scenario)  # before the trace file is created
    hook = _explain_step if args.explain else None
    if args.trace:
        with open(args.trace, "w") as out:
            result = replay(scenario, out, on_step=hook, explain=args.explain)
    else:
        result = replay(scenario, None, on_step=hook, explain=args.explain)
    print(json.dumps(result.summary()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvsched", description="vLLM's v1 scheduler, rebuilt: exact, fast, explained.")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="replay a scheduler scenario with a scripted fake model")
    rp.add_argument("scenario", help="scenario JSON (see docs/scenarios.md)")
    rp.add_argument("--trace", help="write the per-step trace (JSON Lines) here")
    rp.add_argument("--explain", action="store_true",
                    help="print a per-step table with why waiting requests were not admitted")
    rp.set_defaults(func=_cmd_replay)
    from kvsched.sim.command import add_simulate_parser
    from kvsched.sim.compare import add_compare_parser

    add_simulate_parser(sub)
    add_compare_parser(sub)
    from kvsched.calibrate import add_calibrate_parser

    add_calibrate_parser(sub)
    from kvsched.engine.command import add_generate_parser
    from kvsched.model.tiny import add_make_tiny_model_parser

    add_generate_parser(sub)
    add_make_tiny_model_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ModuleNotFoundError as e:
        print(f"kvsched: error: {args.command} needs the {e.name} package; install the engine's "
              "extras with: pip install torch==2.13.0 && pip install 'kvsched[torch]'", file=sys.stderr)
        return 2
    except (ValueError, OSError, RuntimeError) as e:
        print(f"kvsched: error: {e}", file=sys.stderr)
        return 2


def console_main() -> int:
    """The ``kvsched`` console script: ``main`` plus process-wide settings."""
    if hasattr(signal, "SIGPIPE"):
        # `kvsched ... | head` should stop quietly, not print a traceback.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
