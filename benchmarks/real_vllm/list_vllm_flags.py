"""Write every ``vllm serve`` and ``vllm bench serve`` flag of one vLLM
release to ``kvsched/sim/data/vllm_flags_<major.minor>.json``, from vLLM's
own argument parsers.

Run it with the Python of an installed vLLM (the CPU build is enough), once
per release kvsched simulates:

    ~/.cache/kvsched-reference/venv/bin/python benchmarks/real_vllm/list_vllm_flags.py       # 0.33
    ~/.cache/kvsched-reference/venv-0.34/bin/python benchmarks/real_vllm/list_vllm_flags.py  # 0.34

``kvsched.sim.serve_line`` reads the file of the release being simulated
(``--vllm-version``) to take a pasted serve or bench line as that release's
vLLM would (which flags it has, which take a value, which are switches)
without vLLM installed, and tests/sim/test_serve_line.py checks that its
classification covers every flag of every release's file. For a new
release, run it with that release's vLLM and commit the file beside the
others. Only the parsers are built: no engine, model or device is touched.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "kvsched" / "sim" / "data"


def out_path(version: str) -> Path:
    """The file of release ``version`` ("0.34.0" -> vllm_flags_0.34.json:
    kvsched's releases are major.minor, as --vllm-version names them)."""
    major_minor = ".".join(version.split(".")[:2])
    return DATA / f"vllm_flags_{major_minor}.json"


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


def spellings_of(parser: argparse.ArgumentParser) -> dict[int, list[str]]:
    """Every spelling the parser takes, by action: those the action shows
    first, then the ones registered but hidden from help (0.33's
    EnableDisableAction shows --enable-x / --disable-x and still takes
    --no-enable-x; argparse keeps no public table of either)."""
    registered: dict[int, list[str]] = {}
    for option, action in parser._option_string_actions.items():
        registered.setdefault(id(action), []).append(option)
    out: dict[int, list[str]] = {}
    for action in parser._actions:
        shown = [o for o in action.option_strings if o in registered.get(id(action), [])]
        out[id(action)] = [*shown, *(o for o in registered.get(id(action), []) if o not in shown)]
    return out


def turns_off(parser: argparse.ArgumentParser, action: argparse.Action, option: str) -> bool:
    """Whether ``option`` sets the switch False, asked of the action itself
    (0.32's BooleanOptionalAction: the --no- spellings; 0.33's
    EnableDisableAction also --disable-x for --enable-x and the reverse)."""
    namespace = argparse.Namespace()
    action(parser, namespace, None, option)
    value = getattr(namespace, action.dest, None)
    if not isinstance(value, bool):
        raise SystemExit(f"{option}: the switch set {value!r}, not True or False")
    return not value


def flags_of(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The parser's flags in order (help excluded) and its positionals."""
    flags = []
    positionals = []
    spellings = spellings_of(parser)
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:
            positionals.append(action.dest)
            continue
        options = spellings[id(action)]
        negations = ([o for o in options if turns_off(parser, action, o)]
                     if isinstance(action, argparse.BooleanOptionalAction) else [])
        flags.append({"options": [o for o in options if o not in negations],
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


def serve_parser_builder() -> Any:
    """vLLM's ``make_arg_parser`` for ``vllm serve`` (its module moved: 0.32
    had it in vllm.entrypoints.launchers.cli_args, 0.33 and 0.34 in
    vllm.entrypoints.common.cli_args; both are what vllm/entrypoints/cli/
    serve.py imports in its release)."""
    import importlib

    for module in ("vllm.entrypoints.common.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            return importlib.import_module(module).make_arg_parser
        except ModuleNotFoundError as e:
            if e.name is None or not module.startswith(e.name):
                raise  # the module exists but an import inside it failed: show it
    raise SystemExit("no make_arg_parser in vllm.entrypoints.common.cli_args or "
                     "vllm.entrypoints.launchers.cli_args: find where vllm/entrypoints/cli/serve.py "
                     "imports it from and add that module here")


def main() -> int:
    # vLLM 0.34's CPU platform refuses an x86 CPU without triton-cpu when a
    # config is checked; the flag only says whether Triton kernels may run,
    # nothing here runs one (tests/conformance/vllm_0_34/oracle.py does the
    # same). 0.32 and 0.33 have it too and read it the same way.
    import vllm.triton_utils

    vllm.triton_utils.HAS_TRITON = True
    import vllm
    from vllm.benchmarks.serve import add_cli_args
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    make_arg_parser = serve_parser_builder()
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
    out = out_path(vllm.__version__)
    out.write_text(to_text(data))
    print(f"{out}: vLLM {vllm.__version__}: {len(data['serve']['flags'])} serve flags, "
          f"{len(data['bench']['flags'])} bench flags", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
