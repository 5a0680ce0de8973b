"""Output tokens/s of kvsched.LLM against transformers' generate on the CPU.

256 requests, prompts of 16-512 tokens and outputs of 16-256 tokens (seeded,
EOS ignored so every request produces exactly its length), on a random
checkpoint with hidden size 512 and 8 layers made by ``make_tiny_model``.
transformers runs the same requests in arrival order as static batches
(left-padded, each batch generating until its longest request is done);
only the tokens the requests asked for count. Both run in this process, one
after the other, with the same torch thread count.

    python benchmarks/bench_generate.py                      # ~10 min here
    python benchmarks/bench_generate.py --hf-batch-sizes 8 32 --out benchmarks/results_generate.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from kvsched.engine.llm import LLM
from kvsched.model.tiny import make_tiny_model
from kvsched.request import SamplingParams

VOCAB = 2048


def workload(n: int, seed: int, vocab: int = VOCAB) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randrange(4, vocab) for _ in range(rng.randint(16, 512))], rng.randint(16, 256))
            for _ in range(n)]


def run_kvsched(path: Path, reqs: list[tuple[list[int], int]], max_num_seqs: int,
                device: str = "cpu", dtype: str = "float32") -> tuple[float, list[list[int]]]:
    llm = LLM(str(path), max_num_seqs=max_num_seqs, kv_cache_memory="2GiB", device=device, dtype=dtype)
    prompts = [{"prompt_token_ids": p} for p, _ in reqs]
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in reqs]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=sys.stderr.isatty())
    elapsed = time.perf_counter() - t0
    return elapsed, [o.outputs[0].token_ids for o in outs]


def run_hf(path: Path, reqs: list[tuple[list[int], int]], batch_size: int, device: str = "cpu",
           dtype: torch.dtype = torch.float32) -> tuple[float, list[list[int]]]:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    pad = model.generation_config.pad_token_id or 3
    outputs: list[list[int]] = []
    t0 = time.perf_counter()
    for start in range(0, len(reqs), batch_size):
        batch = reqs[start:start + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device)
        longest = max(m for _, m in batch)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                                 do_sample=False, pad_token_id=pad)
        outputs += [out[i, width:width + m].tolist() for i, (_, m) in enumerate(batch)]
        print(f"  hf batch {start // batch_size + 1}/{-(-len(reqs) // batch_size)}: "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return time.perf_counter() - t0, outputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--hf-batch-sizes", type=int, nargs="+", default=[32])
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    reqs = workload(args.num_requests, args.seed)
    useful = sum(m for _, m in reqs)
    result: dict[str, Any] = {
        "num_requests": len(reqs), "total_input_tokens": sum(len(p) for p, _ in reqs),
        "total_output_tokens": useful, "torch_threads": torch.get_num_threads(),
        "model": "make_tiny_model(hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 1408, vocab 2048)"}
    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_model(Path(tmp) / "m", arch="llama", hidden_size=512, num_layers=8, num_heads=8,
                               num_kv_heads=4, intermediate_size=1408, vocab_size=VOCAB,
                               initializer_range=0.05, seed=0)
        elapsed, ours = run_kvsched(path, reqs, args.max_num_seqs)
        result["kvsched"] = {"seconds": elapsed, "output_tok_s": useful / elapsed,
                             "max_num_seqs": args.max_num_seqs}
        print(f"kvsched: {elapsed:.1f} s, {useful / elapsed:.1f} output tok/s", flush=True)
        result["transformers"] = []
        for bs in args.hf_batch_sizes:
            hf_elapsed, theirs = run_hf(path, reqs, bs)
            same = sum(a == b for a, b in zip(ours, theirs))
            row = {"batch_size": bs, "seconds": hf_elapsed, "output_tok_s": useful / hf_elapsed,
                   "speedup": hf_elapsed / elapsed, "identical_outputs": same}
            result["transformers"].append(row)
            print(f"transformers static batches of {bs}: {hf_elapsed:.1f} s, {useful / hf_elapsed:.1f} "
                  f"output tok/s; kvsched is {hf_elapsed / elapsed:.2f}x; "
                  f"identical outputs {same}/{len(reqs)}",
                  flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
