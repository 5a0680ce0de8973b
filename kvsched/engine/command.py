"""``kvsched generate``: run prompts through a local checkpoint."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kvsched.config import MAX_STEP_LIMIT, NGRAM_METHODS
from kvsched.engine.args import check_seed
from kvsched.engine_flags import SCHEDULER_CACHE_FLAGS, EngineFlagDefaults, add_scheduler_cache_flags
from kvsched.errors import UserInputError
from kvsched.files import read_text
from kvsched.jsonfile import json_problem, show, strict_loads

# Where generate's engine flags differ from simulate's: it loads the
# checkpoint (its dtype by default), runs n-gram drafts only, and keeps async
# scheduling off (the model runs each step to the end before the next is
# scheduled, so it overlaps nothing; see EngineArgs.async_scheduling).
ENGINE_FLAG_DEFAULTS = EngineFlagDefaults(
    dtype="auto", dtype_help="auto (the checkpoint's; float16 becomes float32 on CPU), float32, "
                             "bfloat16 or float16",
    async_scheduling=False, speculative_methods=NGRAM_METHODS, seed=0)

# --prompts-file is read whole before anything else runs: 256 MiB of text is
# ~64M tokens, days of CPU generation.
MAX_PROMPTS_FILE_BYTES = 2**28
# Prompts one run takes: each holds a request, its output state and text
# (kilobytes), and a million is days of CPU generation.
MAX_NUM_PROMPTS = 1_000_000


def add_generate_parser(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate text with a local Hugging Face checkpoint",
                       description="Generate text with kvsched's engine (vLLM's scheduler on a "
                                   "PyTorch model with a paged KV cache).")
    p.add_argument("--model", required=True, help="checkpoint directory (config.json, *.safetensors, "
                   "tokenizer.json); `kvsched make-tiny-model DIR` writes one")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts-file", help="a file of prompts: one per line, or JSON Lines with "
                   "'prompt' or 'prompt_token_ids'")
    s = p.add_argument_group("sampling (vLLM's SamplingParams)")
    s.add_argument("--max-tokens", type=int, default=16,
                   help=f"most tokens to generate per prompt, 1 to {MAX_STEP_LIMIT:,} (default: "
                        "%(default)s)")
    s.add_argument("--min-tokens", type=int, default=0,
                   help="tokens to generate before EOS or a stop may end a prompt (default: %(default)s)")
    s.add_argument("--temperature", type=float, default=1.0, help="0: greedy (default: %(default)s)")
    s.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1: off (default: %(default)s)")
    s.add_argument("--top-k", type=int, default=0, help="0 or -1: off (default: %(default)s)")
    s.add_argument("--min-p", type=float, default=0.0, help="in [0, 1]; 0: off (default: %(default)s)")
    s.add_argument("--repetition-penalty", type=float, default=1.0, help="1: off (default: %(default)s)")
    s.add_argument("--presence-penalty", type=float, default=0.0,
                   help="in [-2, 2]; 0: off (default: %(default)s)")
    s.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="in [-2, 2]; 0: off (default: %(default)s)")
    s.add_argument("--sampling-seed", type=int, help="per-request seed (SamplingParams.seed)")
    s.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    s.add_argument("--ignore-eos", action="store_true", help="generate past the model's EOS tokens")
    s.add_argument("--logprobs", type=int, help="return this many top logprobs per token")
    add_engine_flags(p.add_argument_group("engine (vLLM's engine arguments)"))
    o = p.add_argument_group("output")
    o.add_argument("--output-json", help="write every output (text, token ids, timings) here")
    o.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_generate)


def add_engine_flags(group: argparse._ArgumentGroup) -> None:
    """The engine's flags (vLLM's names), for every command that loads a
    checkpoint (``generate``, ``serve``); :func:`engine_kwargs` reads them."""
    add_scheduler_cache_flags(group, ENGINE_FLAG_DEFAULTS)
    group.add_argument("--device", default="auto", help="auto, cpu or cuda (default: %(default)s)")
    group.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", dest="kv_cache_memory",
                       help="KV cache size, e.g. 512MiB, at most what the machine has available "
                            "(default on CPU: 4 GiB as vLLM's CPU backend, capped at what max_num_seqs "
                            "x max_model_len tokens can fill; on CUDA: --gpu-memory-utilization's "
                            "share)")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``LLM``'s keyword arguments from the flags :func:`add_engine_flags` adds."""
    # Every flag of the shared set is an engine argument of the same name.
    return {name: getattr(args, name) for name in (*SCHEDULER_CACHE_FLAGS, "device", "kv_cache_memory")}


def read_prompts(args: argparse.Namespace, max_file_bytes: int = MAX_PROMPTS_FILE_BYTES,
                 max_prompts: int = MAX_NUM_PROMPTS) -> list[Any]:
    """``--prompt`` (repeatable) and ``--prompts-file``'s lines or JSON Lines:
    the file is UTF-8 text of at most ``max_file_bytes`` without NUL bytes,
    and at most ``max_prompts`` prompts in all; every problem names the file
    (and line)."""
    prompts: list[Any] = list(args.prompt)
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise UserInputError(f"--prompts-file={args.prompts_file!r}: no such file")
        what = "prompts (one per line, or JSON Lines)"
        text = read_text(path, max_file_bytes, what)
        nul = text.find("\0")
        if nul >= 0:
            line = text.count("\n", 0, nul) + 1
            raise UserInputError(f"{path}:{line}: a NUL byte (offset {nul}), so not a text file; give "
                             f"--prompts-file a UTF-8 text file of {what}")
        for n, line_text in enumerate(text.splitlines(), 1):
            if not line_text.strip():
                continue
            if len(prompts) >= max_prompts:
                raise UserInputError(f"{path}:{n}: more than {max_prompts:,} prompts, the most one run "
                                 "takes; split the file")
            if path.suffix in (".jsonl", ".json"):
                try:
                    item = strict_loads(line_text)
                except ValueError as err:
                    raise UserInputError(f"{path}:{n}: {json_problem(err)}") from None
                if isinstance(item, dict) and "prompt_token_ids" in item:
                    prompts.append({"prompt_token_ids": item["prompt_token_ids"]})
                elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
                    prompts.append(item["prompt"])
                else:
                    raise UserInputError(f"{path}:{n}: needs a 'prompt' string or 'prompt_token_ids'")
            else:
                prompts.append(line_text)
    if not prompts:
        raise UserInputError("no prompts: give --prompt TEXT (repeatable) or --prompts-file FILE")
    if len(prompts) > max_prompts:
        raise UserInputError(f"--prompt: {len(prompts):,} prompts, more than the {max_prompts:,} one run "
                         "takes")
    return prompts


def check_sampling_flags(args: argparse.Namespace) -> None:
    """The sampling flags' sizes, before the engine allocates anything (the
    rest of SamplingParams' rules are its own, and the request's lengths are
    checked against max_model_len when it is added)."""
    for flag, value, low in (("--max-tokens", args.max_tokens, 1), ("--min-tokens", args.min_tokens, 0)):
        if not low <= value <= MAX_STEP_LIMIT:
            raise UserInputError(f"{flag}={show(value)}: must be in [{low}, {MAX_STEP_LIMIT:,}] (2**24: no "
                             "sequence is longer than max_model_len, itself at most 2**24)")
    if args.logprobs is not None and not 0 <= args.logprobs <= MAX_STEP_LIMIT:
        raise UserInputError(f"--logprobs={show(args.logprobs)}: must be in [0, {MAX_STEP_LIMIT:,}] (the "
                         "top tokens reported per step, at most the vocabulary)")
    check_seed("--sampling-seed", args.sampling_seed)


def run_generate(args: argparse.Namespace) -> int:
    from kvsched.engine.llm import LLM
    from kvsched.request import SamplingParams

    check_sampling_flags(args)
    prompts = read_prompts(args)
    params = SamplingParams(
        max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.sampling_seed, stop=tuple(args.stop),
        ignore_eos=args.ignore_eos, logprobs=args.logprobs)
    llm = LLM(args.model, **engine_kwargs(args))
    t0 = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=not args.no_progress)
    elapsed = time.perf_counter() - t0
    for out in outputs:
        c = out.outputs[0]
        shown = out.prompt if out.prompt is not None else f"<{len(out.prompt_token_ids)} prompt tokens>"
        print(f"Prompt: {shown!r}")
        print(f"Output: {c.text!r}  [{len(c.token_ids)} tokens, finish_reason={c.finish_reason}]")
    total = sum(len(o.outputs[0].token_ids) for o in outputs)
    print(f"{len(outputs)} requests, {total} output tokens in {elapsed:.2f} s "
          f"({total / elapsed if elapsed > 0 else 0.0:.1f} tok/s)")
    if args.output_json:
        rows = [{"request_id": o.request_id, "prompt": o.prompt, "prompt_token_ids": o.prompt_token_ids,
                 "text": o.outputs[0].text, "token_ids": o.outputs[0].token_ids,
                 "finish_reason": o.outputs[0].finish_reason, "stop_reason": o.outputs[0].stop_reason,
                 "arrival_time": o.metrics.arrival_time, "first_token_time": o.metrics.first_token_time,
                 "finished_time": o.metrics.finished_time, "num_cached_tokens": o.num_cached_tokens}
                for o in outputs]
        Path(args.output_json).write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    return 0
