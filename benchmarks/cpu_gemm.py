"""The CPU linear kernels ``kvsched/model/cpu_gemm.py`` chooses between, timed.

For the tiny Llama's shapes (hidden 512, 8 layers: qkv 1024x512, o 512x512,
gate_up 3072x512, down 512x1536, and the 32,000x512 logits) and row counts
1..512, one torch thread: ``F.linear`` (MKL on the [out, in] weight),
``x @ W.T`` with the transpose stored contiguous, oneDNN with the weight
reordered once (``torch.ops.mkldnn._linear_pointwise``), and what
``CpuGemm`` does. Eight copies of each layer weight are cycled so the
weights come from memory as in a real step (164 MB in all), not from cache.

    python benchmarks/cpu_gemm.py [--rows 1 2 4 16 64 512] [--repeats 6]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvsched.model.cpu_gemm import CpuGemm

SHAPES = {"qkv": (1024, 512), "o": (512, 512), "gate_up": (3072, 512), "down": (512, 1536),
          "logits": (32000, 512)}
LAYERS = 8


def _time(fns: list[Callable[[], object]], repeats: int) -> float:
    for f in fns:
        f()
    start = time.perf_counter()
    for _ in range(repeats):
        for f in fns:
            f()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64, 512])
    p.add_argument("--repeats", type=int, default=6)
    args = p.parse_args()
    torch.set_num_threads(1)
    kernels = ("F.linear", "x @ W.T", "oneDNN", "CpuGemm")
    print("| rows | " + " | ".join(f"{k} ms" for k in kernels) + " |")
    print("| --- |" + " --- |" * len(kernels))
    for rows in args.rows:
        total = dict.fromkeys(kernels, 0.0)
        for name, (n, k) in SHAPES.items():
            weights = [torch.randn(n, k) for _ in range(1 if name == "logits" else LAYERS)]
            x = torch.randn(rows, k)
            transposed = [w.t().contiguous() for w in weights]
            packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
            gemms = [CpuGemm(w) for w in weights]
            fns: dict[str, list[Callable[[], object]]] = {
                "F.linear": [lambda w=w, x=x: F.linear(x, w) for w in weights],
                "x @ W.T": [lambda t=t, x=x: x @ t for t in transposed],
                "oneDNN": [lambda p=p, x=x: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                           for p in packed],
                "CpuGemm": [lambda g=g, x=x: g(x) for g in gemms],
            }
            for kernel in kernels:
                total[kernel] += _time(fns[kernel], args.repeats)
        print(f"| {rows} | " + " | ".join(f"{total[k]:.1f}" for k in kernels) + " |", flush=True)


if __name__ == "__main__":
    main()
