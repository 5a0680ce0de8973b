"""``kvsched profile``: the command line (flags, checks, output)."""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from kvsched.errors import UserInputError
from kvsched.perf.step_profile import serve_flag
from kvsched.perf.step_time import FP32_DTYPES
from kvsched.profile.runner import ProfileRequest, run_profile

# vLLM server flags that change what a step costs, passed on as given
# (dest, flag, kind): kind "value" takes one argument, "switch" none.
SERVE_FLAGS: tuple[tuple[str, str, str], ...] = (
    ("dtype", "--dtype", "value"),
    ("max_model_len", "--max-model-len", "value"),
    ("max_num_seqs", "--max-num-seqs", "value"),
    ("max_num_batched_tokens", "--max-num-batched-tokens", "value"),
    ("tensor_parallel_size", "--tensor-parallel-size", "value"),
    ("kv_cache_dtype", "--kv-cache-dtype", "value"),
    ("block_size", "--block-size", "value"),
    ("quantization", "--quantization", "value"),
    ("enforce_eager", "--enforce-eager", "switch"),
    ("async_scheduling", "--async-scheduling", "switch"),
    ("no_async_scheduling", "--no-async-scheduling", "switch"),
    ("no_enable_prefix_caching", "--no-enable-prefix-caching", "switch"),
    ("no_enable_chunked_prefill", "--no-enable-chunked-prefill", "switch"),
)


def add_profile_parser(sub: Any) -> None:
    p = sub.add_parser(
        "profile", help="measure engine step times through your own vLLM (for --step-time-profile)",
        description="Start your vLLM server (from the Python you name; kvsched never imports vLLM), "
                    "drive a designed set of batches over HTTP (prefill chunks of several sizes and "
                    "contexts, decode batches of several sizes and contexts, mixed steps), read each "
                    "step's batch and time from vLLM's iteration log, stream every request to time "
                    "the serving path around the steps (per step, per streamed token, per request's "
                    "arrival), and write a step profile for simulate --step-time-profile. KV cache "
                    "size on CPU: VLLM_CPU_KVCACHE_SPACE (GiB) in the environment, as vLLM reads it. A "
                    "few minutes for a small model.")
    p.add_argument("--vllm-python", required=True, metavar="PATH",
                   help="the python of the environment vLLM is installed in (e.g. venv/bin/python)")
    p.add_argument("--model", required=True, metavar="DIR_OR_NAME",
                   help="the model as vLLM's --model takes it (a local directory works offline)")
    p.add_argument("--output", "-o", required=True, metavar="FILE.json", help="the step profile to write")
    p.add_argument("--resume", action="store_true",
                   help="go on with --output's points not yet run (same model, flags and vLLM)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g = p.add_argument_group("vLLM server flags (passed on; the profile records them)")
    for dest, flag, kind in SERVE_FLAGS:
        names = [flag, "-tp"] if dest == "tensor_parallel_size" else [flag]
        if kind == "switch":
            g.add_argument(*names, dest=dest, action="store_true", help=f"vLLM's {flag}")
        else:
            g.add_argument(*names, dest=dest, metavar="VALUE", help=f"vLLM's {flag}")
    g.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="-- FLAG ...",
                   help="after --: any other vllm serve flags, passed on as they are")
    p.set_defaults(func=cmd_profile)


def serve_flags_of(args: argparse.Namespace) -> list[str]:
    """The server flags of a parsed command line, in SERVE_FLAGS' order."""
    out: list[str] = []
    for dest, flag, kind in SERVE_FLAGS:
        value = getattr(args, dest)
        if kind == "switch":
            if value:
                out.append(flag)
        elif value is not None:
            out += [flag, str(value)]
    extra = list(args.serve_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    for word in ("--port", "--host", "--model"):
        if serve_flag(extra, (word,)) is not None:
            raise UserInputError(f"{word} after --: kvsched profile sets it (give --model before --)")
    return out + extra


def cmd_profile(args: argparse.Namespace) -> int:
    flags = serve_flags_of(args)
    req = ProfileRequest(args.vllm_python, args.model, tuple(flags), args.output, args.resume,
                         not args.no_progress)
    outcome = run_profile(req)
    prof, fit = outcome.profile, outcome.fit
    warm = sum(1 for s in prof.steps if s.warmup)
    print(f"profiled {prof.model['name']} on {prof.hardware['name']} with vLLM {prof.vllm['version']} "
          f"in {outcome.wall_s:.0f} s: {len(prof.steps)} steps ({warm} warm-up, not fitted)")
    print("fit: " + fit.describe())
    print("terms: " + ", ".join(f"{k} {v:.4g}" for k, v in fit.terms.items()))
    if outcome.serving is not None:
        # The simulate line below prices its host time with these.
        print(outcome.serving.describe())
    else:
        print("serving path: not fitted (see the notes); simulate prices no host time unless given "
              "--calibration")
    for note in prof.notes:
        print("note: " + note)
    sim = ["kvsched", "simulate", "--model", str(prof.model["path"]), "--step-time-profile", args.output]
    for name in ("--max-model-len", "--max-num-seqs", "--max-num-batched-tokens", "--block-size", "--dtype",
                 "--kv-cache-dtype"):
        value = serve_flag(flags, (name,))
        if value is not None and not (name == "--dtype" and value.lower() in FP32_DTYPES):
            sim += [name, value]  # a float32 profile prices a 16-bit simulation
    if prof.hardware.get("device") == "cpu" and "--async-scheduling" not in flags:
        sim.append("--no-async-scheduling")  # vLLM's CPU platform turns it off
    print("simulate it: " + shlex.join(sim) + " [workload flags]")
    print(f"wrote {args.output}")
    return 0
