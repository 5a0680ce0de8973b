"""``kvsched generate``: run prompts through a local checkpoint."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kvsched.errors import UserInputError
from kvsched.jsonfile import json_problem, strict_loads

BOOL = argparse.BooleanOptionalAction


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
    s.add_argument("--max-tokens", type=int, default=16)
    s.add_argument("--min-tokens", type=int, default=0)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=0)
    s.add_argument("--min-p", type=float, default=0.0)
    s.add_argument("--repetition-penalty", type=float, default=1.0)
    s.add_argument("--presence-penalty", type=float, default=0.0)
    s.add_argument("--frequency-penalty", type=float, default=0.0)
    s.add_argument("--sampling-seed", type=int, help="per-request seed (SamplingParams.seed)")
    s.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    s.add_argument("--ignore-eos", action="store_true")
    s.add_argument("--logprobs", type=int, help="return this many top logprobs per token")
    e = p.add_argument_group("engine (vLLM's engine arguments)")
    e.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    e.add_argument("--device", default="auto", help="auto, cpu or cuda")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--max-model-len", type=int)
    e.add_argument("--max-num-seqs", type=int)
    e.add_argument("--max-num-batched-tokens", type=int)
    e.add_argument("--enable-chunked-prefill", action=BOOL, default=True)
    e.add_argument("--enable-prefix-caching", action=BOOL, default=True)
    e.add_argument("--long-prefill-token-threshold", type=int, default=0)
    e.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs")
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument("--num-gpu-blocks-override", type=int)
    e.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", dest="kv_cache_memory",
                   help="KV cache size on CPU, e.g. 512MiB (default: 4 GiB as vLLM's CPU backend, "
                        "capped at what max_num_seqs x max_model_len tokens can fill)")
    e.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    e.add_argument("--speculative-config", help="speculative decoding as JSON, e.g. "
                   '\'{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}\' '
                   "(n-gram drafts; 'ngram_gpu' with --async-scheduling)")
    e.add_argument("--async-scheduling", action=BOOL, default=False,
                   help="schedule step N+1 before step N's output is applied (vLLM's async "
                        "scheduling; the decisions and outputs are vLLM's, the CPU gains no overlap)")
    o = p.add_argument_group("output")
    o.add_argument("--output-json", help="write every output (text, token ids, timings) here")
    o.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_generate)


def read_prompts(args: argparse.Namespace) -> list[Any]:
    prompts: list[Any] = list(args.prompt)
    if args.prompts_file:
        path = Path(args.prompts_file)
        if not path.is_file():
            raise UserInputError(f"--prompts-file={args.prompts_file!r}: no such file")
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix in (".jsonl", ".json"):
                try:
                    item = strict_loads(line)
                except ValueError as err:
                    raise UserInputError(f"{path}:{n}: {json_problem(err)}") from None
                if isinstance(item, dict) and "prompt_token_ids" in item:
                    prompts.append({"prompt_token_ids": item["prompt_token_ids"]})
                elif isinstance(item, dict) and isinstance(item.get("prompt"), str):
                    prompts.append(item["prompt"])
                else:
                    raise UserInputError(f"{path}:{n}: needs a 'prompt' string or 'prompt_token_ids'")
            else:
                prompts.append(line)
    if not prompts:
        raise UserInputError("no prompts: give --prompt TEXT (repeatable) or --prompts-file FILE")
    return prompts


def run_generate(args: argparse.Namespace) -> int:
    from kvsched.engine.llm import LLM
    from kvsched.request import SamplingParams

    prompts = read_prompts(args)
    params = SamplingParams(
        max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty, seed=args.sampling_seed, stop=tuple(args.stop),
        ignore_eos=args.ignore_eos, logprobs=args.logprobs)
    llm = LLM(args.model, dtype=args.dtype, device=args.device, seed=args.seed,
              max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              enable_chunked_prefill=args.enable_chunked_prefill,
              enable_prefix_caching=args.enable_prefix_caching,
              long_prefill_token_threshold=args.long_prefill_token_threshold,
              scheduling_policy=args.scheduling_policy, block_size=args.block_size,
              num_gpu_blocks_override=args.num_gpu_blocks_override,
              kv_cache_memory=args.kv_cache_memory, gpu_memory_utilization=args.gpu_memory_utilization,
              speculative_config=args.speculative_config, async_scheduling=args.async_scheduling)
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
