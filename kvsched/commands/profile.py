"""``kvsched profile``: the command line (flags, checks, output)."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import Any, Literal

from kvsched.engine_flags import declared_flag, negation, option
from kvsched.errors import UserInputError
from kvsched.perf.step_profile import serve_flag
from kvsched.perf.step_time import FP32_DTYPES
from kvsched.profile.runner import ProfileRequest, run_profile
from kvsched.sim.deployment import EngineOptions


@dataclass(frozen=True, slots=True)
class PassedOn:
    """A vllm serve flag profile passes on as given, by its engine argument
    (vLLM's name: the flag is :func:`~kvsched.engine_flags.option`'s
    spelling of it): ``kind`` "value" takes one word, unchecked (vLLM checks
    it), "on" is the switch's ``--X``, "off" its ``--no-X``; ``short``: its
    short spelling too, as simulate's flag declares it (``-tp``)."""

    name: str
    kind: Literal["value", "on", "off"] = "value"
    short: bool = False

    @property
    def dest(self) -> str:
        return "no_" + self.name if self.kind == "off" else self.name

    @property
    def flag(self) -> str:
        return negation(self.name) if self.kind == "off" else option(self.name)

    def spellings(self) -> list[str]:
        return [self.flag, *(declared_flag(EngineOptions, self.name).aliases if self.short else ())]


# vLLM server flags that change what a step costs, passed on as given.
# Async scheduling both ways: vLLM's default for it depends on the platform.
SERVE_FLAGS: tuple[PassedOn, ...] = (
    PassedOn("dtype"), PassedOn("max_model_len"), PassedOn("max_num_seqs"),
    PassedOn("max_num_batched_tokens"), PassedOn("tensor_parallel_size", short=True),
    PassedOn("kv_cache_dtype"), PassedOn("block_size"), PassedOn("quantization"),
    PassedOn("enforce_eager", "on"), PassedOn("async_scheduling", "on"), PassedOn("async_scheduling", "off"),
    PassedOn("enable_prefix_caching", "off"), PassedOn("enable_chunked_prefill", "off"),
)
# The server flags the printed simulate line repeats (simulate's flags of the same names).
SIMULATE_AGAIN = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size", "dtype",
                  "kv_cache_dtype")


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
    for passed in SERVE_FLAGS:
        if passed.kind == "value":
            g.add_argument(*passed.spellings(), dest=passed.dest, metavar="VALUE",
                           help=f"vLLM's {passed.flag}")
        else:
            g.add_argument(*passed.spellings(), dest=passed.dest, action="store_true",
                           help=f"vLLM's {passed.flag}")
    g.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="-- FLAG ...",
                   help="after --: any other vllm serve flags, passed on as they are")
    p.set_defaults(func=cmd_profile)


def serve_flags_of(args: argparse.Namespace) -> list[str]:
    """The server flags of a parsed command line, in SERVE_FLAGS' order."""
    out: list[str] = []
    for passed in SERVE_FLAGS:
        value = getattr(args, passed.dest)
        if passed.kind != "value":
            if value:
                out.append(passed.flag)
        elif value is not None:
            out += [passed.flag, str(value)]
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
    for name in SIMULATE_AGAIN:
        value = serve_flag(flags, (option(name),))
        if value is not None and not (name == "dtype" and value.lower() in FP32_DTYPES):
            sim += [option(name), value]  # a float32 profile prices a 16-bit simulation
    if prof.hardware.get("device") == "cpu" and option("async_scheduling") not in flags:
        sim.append(negation("async_scheduling"))  # vLLM's CPU platform turns it off
    print("simulate it: " + shlex.join(sim) + " [workload flags]")
    print(f"wrote {args.output}")
    return 0
