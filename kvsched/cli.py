"""The ``kvsched`` command line."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

from kvsched.core.output import SchedulerOutput
from kvsched.core.scheduler import Scheduler
from kvsched.errors import REPORT_HINT, UserInputError, one_line


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
    lock = sched.livelock()
    if lock is not None:
        print(f"      stuck: {lock.message()}")


def _cmd_replay(args: argparse.Namespace) -> int:
    from kvsched.scenario import check_requests, load_scenario, replay

    scenario = load_scenario(args.scenario, args.vllm_version)
    check_requests(scenario)  # before the trace file is created
    hook = _explain_step if args.explain else None
    if args.trace:
        with open(args.trace, "w") as out:
            result = replay(scenario, out, on_step=hook, explain=args.explain)
    else:
        result = replay(scenario, None, on_step=hook, explain=args.explain)
    print(json.dumps(result.summary()))
    return 0


class _Parser(argparse.ArgumentParser):
    """Every parser of the command line: no abbreviated flags (vLLM's own
    parser refuses ``--num-prom``), and ``--debug`` after the command too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # SUPPRESS: a subcommand without --debug keeps the top level's value.
        self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="show the traceback of an unexpected error instead of one line")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsched", description="vLLM's v1 scheduler, rebuilt: exact, fast, explained.")
    parser.set_defaults(debug=False)
    from kvsched.version import __version__, build

    parser.add_argument("--version", action="version",
                        version=f"kvsched {__version__} ({build()} hot path: see setup.py)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    rp = sub.add_parser("replay", help="replay a scheduler scenario with a scripted fake model")
    rp.add_argument("scenario", help="scenario JSON (see docs/scenarios.md)")
    rp.add_argument("--trace", help="write the per-step trace (JSON Lines) here")
    rp.add_argument("--explain", action="store_true",
                    help="print a per-step table with why waiting requests were not admitted")
    from kvsched.engine_flags import add_declared_flags
    from kvsched.sim.deployment import EngineOptions

    # The release whose scheduler replays the scenario: simulate's flag.
    add_declared_flags(rp, EngineOptions, names=("vllm_version",))
    rp.set_defaults(func=_cmd_replay)
    from kvsched.commands.compare import add_compare_parser
    from kvsched.commands.simulate import add_simulate_parser

    add_simulate_parser(sub)
    add_compare_parser(sub)
    from kvsched.commands.calibrate import add_calibrate_parser

    add_calibrate_parser(sub)
    from kvsched.commands.tune import add_tune_parser

    add_tune_parser(sub)
    from kvsched.commands.profile import add_profile_parser

    add_profile_parser(sub)
    from kvsched.engine.command import add_generate_parser
    from kvsched.model.tiny import add_make_tiny_model_parser
    from kvsched.serve.command import add_serve_parser

    add_generate_parser(sub)
    add_serve_parser(sub)
    add_make_tiny_model_parser(sub)
    return parser


# Exit statuses: 2 for bad input (a flag, a file, a setting: the message says
# what to fix), 3 for an internal error (a bug in kvsched), 130 for Ctrl-C
# (128 + SIGINT, as shells report it).
EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 3
EXIT_INTERRUPTED = 130
_ENGINE_COMMANDS = ("generate", "make-tiny-model", "serve")
# What `kvsched serve` needs beyond the engine (the "serve" extra).
_SERVE_MODULES = ("fastapi", "starlette", "uvicorn", "prometheus_client", "jinja2")


def _error(message: str) -> None:
    print(f"kvsched: error: {one_line(message)}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run a command: bad input is one ``kvsched: error:`` line and exit
    status 2; anything else is a bug, one ``kvsched: internal error:`` line
    and status 3 (``--debug`` raises it with its traceback instead); Ctrl-C
    is one line and status 130."""
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        if debug:
            raise
        print("\nkvsched: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as e:
        if debug:
            raise
        if args.command == "serve" and e.name in _SERVE_MODULES:
            _error(f"serve needs the {e.name} package; install the server's extras with: "
                   "pip install 'kvsched[serve]'")
        elif args.command in _ENGINE_COMMANDS:
            _error(f"{args.command} needs the {e.name} package; install the engine's extras with: "
                   "pip install torch==2.13.0 && pip install 'kvsched[torch]'")
        else:
            _error(f"{args.command} needs the {e.name} module, which is not installed; install it "
                   "with pip")
        return EXIT_BAD_INPUT
    except MemoryError as e:
        if debug:
            raise
        what = f": {e}" if str(e) else ""
        print(f"kvsched: internal error: out of memory (MemoryError{one_line(what, 300)}); inputs "
              f"within kvsched's stated bounds should fit, so {REPORT_HINT}", file=sys.stderr, flush=True)
        return EXIT_INTERNAL_ERROR
    except (UserInputError, OSError) as e:
        # Input from outside: a flag, a file, a setting (an OSError names the file).
        if debug:
            raise
        _error(str(e) or type(e).__name__)
        return EXIT_BAD_INPUT
    except Exception as e:
        if debug:
            raise
        _internal(e)
        return EXIT_INTERNAL_ERROR


def _internal(e: BaseException) -> None:
    where = ""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is not None:
        where = f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}"
    print(f"kvsched: internal error: {type(e).__name__}{where}: {one_line(str(e), 300)}; {REPORT_HINT}",
          file=sys.stderr, flush=True)


def console_main() -> int:
    """The ``kvsched`` console script: ``main`` plus process-wide settings."""
    if hasattr(signal, "SIGPIPE"):
        # `kvsched ... | head` should stop quietly, not print a traceback.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return main()


if __name__ == "__main__":
    sys.exit(console_main())
