"""The engine on a CUDA GPU: greedy parity with transformers and speed.

Issue 24 item 4: whenever a GPU machine is lent, run the engine there (CUDA,
float32 and bfloat16) in one short prepared script and record the figures.
Three parts, all on random checkpoints made by ``make_tiny_model``:

1. **Parity.** Llama, Qwen3 and Mistral checkpoints (hidden 512, 8 layers,
   vocab 2048); 50 prompts of 16-256 random tokens, 64 greedy tokens each.
   kvsched.LLM on the GPU against transformers' ``generate`` on the GPU, one
   prompt at a time (no padding), in float32 and in bfloat16. Where the
   outputs part, the first differing position is explained by the float32
   reference's logits of both tokens at that position (a near tie that
   bfloat16 rounding can flip).
2. **Engine variants on the GPU.** Async scheduling, n-gram speculative
   decoding (K=3) and both with the async n-gram proposer must reproduce the
   synchronous engine's tokens exactly (same dtype, same device).
3. **Speed.** Llama-3.2-1B's shape (hidden 2048, 16 layers, 32 heads, 8 KV
   heads, intermediate 8192, vocab 128256, tied embeddings), random bfloat16
   weights; 256 requests of 16-512 prompt and 16-256 output tokens (EOS
   ignored), all at once. kvsched.LLM against transformers' static batches of
   64 (left-padded, each batch runs until its longest request is done; only
   requested tokens count). Output tokens per second.

    python benchmarks/gpu_check.py --out gpu_check.json      # ~4 min on an H100
    python benchmarks/gpu_check.py --device cpu --quick      # the script's own smoke test
"""

from __future__ import annotations

import argparse
import gc
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
from bench_generate import run_hf, run_kvsched, workload  # type: ignore[import-not-found]

from kvsched.engine.llm import LLM
from kvsched.model.tiny import make_tiny_model
from kvsched.request import SamplingParams

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PARITY_VOCAB = 2048
VARIANTS: dict[str, dict[str, Any]] = {
    "async": {"async_scheduling": True},
    "ngram-k3": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 4}},
    "async-ngram_gpu-k3": {"async_scheduling": True,
                           "speculative_config": {"method": "ngram_gpu", "num_speculative_tokens": 3,
                                                  "prompt_lookup_min": 1, "prompt_lookup_max": 3}},
}


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts(n: int, seed: int, max_len: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        # Every third prompt repeats a short unit so the n-gram proposer finds matches.
        length = rng.randint(16, max_len)
        if i % 3 == 0:
            unit = [rng.randrange(4, PARITY_VOCAB) for _ in range(rng.randint(3, 8))]
            out.append((unit * (length // len(unit) + 1))[:length])
        else:
            out.append([rng.randrange(4, PARITY_VOCAB) for _ in range(length)])
    return out


def kvsched_greedy(path: Path, batch: list[list[int]], max_tokens: int, device: str, dtype: str,
                   **engine: Any) -> list[list[int]]:
    llm = LLM(str(path), device=device, dtype=dtype, kv_cache_memory="2GiB", **engine)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
    del llm
    release()
    return [list(o.outputs[0].token_ids) for o in outs]


def hf_model(path: Path, device: str, dtype: torch.dtype) -> Any:
    import transformers

    transformers.utils.logging.set_verbosity_error()
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def hf_greedy(model: Any, batch: list[list[int]], max_tokens: int, device: str) -> list[list[int]]:
    outs = []
    for p in batch:
        ids = torch.tensor([p], device=device)
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, do_sample=False,
                                 pad_token_id=model.generation_config.eos_token_id)
        outs.append(out[0, len(p):].tolist())
    return outs


def explain(ref32: Any, prompt: list[int], ours: list[int], theirs: list[int], device: str) -> dict[str, Any]:
    """The first position where the outputs part, and the float32 reference's
    logits of both tokens there."""
    pos = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    ids = torch.tensor([prompt + ours[:pos]], device=device)
    with torch.no_grad():
        logits = ref32(ids).logits[0, -1].float()
    top2 = torch.topk(logits, 2).values.tolist()
    return {"position": pos, "kvsched_token": ours[pos], "reference_token": theirs[pos],
            "fp32_logit_kvsched_token": logits[ours[pos]].item(),
            "fp32_logit_reference_token": logits[theirs[pos]].item(),
            "fp32_top2_gap": top2[0] - top2[1]}


def parity(tmp: Path, archs: list[str], n: int, max_len: int, max_tokens: int, device: str,
           dtypes: list[str]) -> list[dict[str, Any]]:
    rows = []
    batch = prompts(n, 0, max_len)
    for arch in archs:
        path = make_tiny_model(tmp / f"parity-{arch}", arch=arch, hidden_size=512, num_layers=8,
                               num_heads=8, num_kv_heads=4, intermediate_size=1408,
                               vocab_size=PARITY_VOCAB, initializer_range=0.05, seed=1)
        ref32 = hf_model(path, device, torch.float32)
        for dtype in dtypes:
            ours = kvsched_greedy(path, batch, max_tokens, device, dtype)
            ref = ref32 if dtype == "float32" else hf_model(path, device, DTYPES[dtype])
            theirs = hf_greedy(ref, batch, max_tokens, device)
            if ref is not ref32:
                del ref
                release()
            differing = [explain(ref32, p, a, b, device) | {"request": i}
                         for i, (p, a, b) in enumerate(zip(batch, ours, theirs)) if a != b]
            row = {"arch": arch, "dtype": dtype, "prompts": n, "identical": n - len(differing),
                   "differences": differing}
            rows.append(row)
            gaps = [d["fp32_top2_gap"] for d in differing]
            print(f"parity {arch:8s} {dtype:9s}: {row['identical']}/{n} identical"
                  + (f"; first differences at positions {[d['position'] for d in differing]}, "
                     f"fp32 top-2 logit gaps there {[round(g, 4) for g in gaps]}" if differing else ""),
                  flush=True)
        del ref32
        release()
    return rows


def variants(tmp: Path, n: int, max_len: int, max_tokens: int, device: str,
             dtypes: list[str]) -> list[dict[str, Any]]:
    rows = []
    batch = prompts(n, 1, max_len)
    path = make_tiny_model(tmp / "variants", arch="llama", hidden_size=512, num_layers=8, num_heads=8,
                           num_kv_heads=4, intermediate_size=1408, vocab_size=PARITY_VOCAB,
                           initializer_range=0.05, seed=2)
    for dtype in dtypes:
        sync = kvsched_greedy(path, batch, max_tokens, device, dtype)
        for name, engine in VARIANTS.items():
            got = kvsched_greedy(path, batch, max_tokens, device, dtype, **engine)
            same = sum(a == b for a, b in zip(sync, got))
            rows.append({"variant": name, "dtype": dtype, "prompts": n, "identical_to_sync": same})
            print(f"variant {name:20s} {dtype:9s}: {same}/{n} identical to the synchronous engine",
                  flush=True)
    return rows


def speed(tmp: Path, n: int, device: str, hf_batch: int, quick: bool) -> dict[str, Any]:
    shape: dict[str, Any] = (
        {"hidden_size": 256, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 512,
         "vocab_size": 4096} if quick else
        {"hidden_size": 2048, "num_layers": 16, "num_heads": 32, "num_kv_heads": 8,
         "intermediate_size": 8192, "vocab_size": 128256})
    path = make_tiny_model(tmp / "speed", arch="llama", tie_word_embeddings=True, dtype="bfloat16",
                           initializer_range=0.02, seed=3, **shape)
    reqs = workload(n, 0, vocab=shape["vocab_size"])
    useful = sum(m for _, m in reqs)
    # Warm the device (kernels, allocator) with a few requests first.
    run_kvsched(path, reqs[:8], 256, device, "bfloat16")
    release()
    ours_s, ours = run_kvsched(path, reqs, 256, device, "bfloat16")
    release()
    hf_s, theirs = run_hf(path, reqs, hf_batch, device, torch.bfloat16)
    release()
    row = {"model": "Llama-3.2-1B shape, random bf16 weights", "shape": shape, "requests": n,
           "output_tokens": useful, "input_tokens": sum(len(p) for p, _ in reqs),
           "kvsched_s": ours_s, "kvsched_output_tok_s": useful / ours_s,
           "transformers_batch": hf_batch, "transformers_s": hf_s, "transformers_output_tok_s": useful / hf_s,
           "speedup": hf_s / ours_s, "identical_outputs": sum(a == b for a, b in zip(ours, theirs))}
    print(f"speed: kvsched {useful / ours_s:.0f} output tok/s ({ours_s:.1f} s), transformers static "
          f"batches of {hf_batch} {useful / hf_s:.0f} ({hf_s:.1f} s): {hf_s / ours_s:.2f}x; "
          f"identical outputs {row['identical_outputs']}/{n} (bf16)", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes: check the script itself")
    ap.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["float32", "bfloat16"])
    ap.add_argument("--parts", nargs="+", choices=["parity", "variants", "speed"],
                    default=["parity", "variants", "speed"])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device; pass --device cpu --quick to test the script",
              file=sys.stderr)
        return 2
    dtypes = args.dtypes
    n, max_len, max_tokens = (6, 48, 12) if args.quick else (50, 256, 64)
    result: dict[str, Any] = {"device": args.device, "torch": torch.__version__}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(args.device)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if "parity" in args.parts:
            result["parity"] = parity(Path(tmp), ["llama", "qwen3", "mistral"], n, max_len, max_tokens,
                                      args.device, dtypes)
        if "variants" in args.parts:
            result["variants"] = variants(Path(tmp), n, max_len, max_tokens, args.device, dtypes)
        if "speed" in args.parts:
            result["speed"] = speed(Path(tmp), 16 if args.quick else 256, args.device,
                                    4 if args.quick else 64, args.quick)
    result["seconds"] = time.perf_counter() - t0
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"done in {result['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
