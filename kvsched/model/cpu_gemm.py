"""The linear layers' matrix products on a CPU, in float32.

A serving step multiplies a few rows (one per decoding request) by every
weight of the model, so at small batches a step is a stream through the
weights and the kernel's reading speed is the step time. Measured on this
project's 2-core AMD EPYC (AVX2, one thread, the tiny Llama's shapes with the
weights cold, `benchmarks/cpu_gemm.py`, run 2026-11-27 on a busy machine):

- ``F.linear`` (MKL sgemm on the [out, in] weight) reaches about half the
  memory bandwidth at 1 row and falls further behind from 2 rows on;
- ``x @ W.T`` with the transpose stored contiguous ([in, out]) streams at the
  bandwidth for 1 and 2 rows, then is the slowest choice;
- oneDNN with the weight reordered once into its blocked layout (the
  library vLLM's CPU build uses for the same products) is the fastest from 3
  rows on: 1.4-1.5x ``F.linear`` at 4-16 rows, ~1.25x at 64, ~1.1x at 512.

So each layer keeps both layouts and picks by row count: the model's weight
memory doubles on a CPU, the price of a decode step near the bandwidth at
every batch size. The rule lives in ``CpuGemm.__call__``; ``use_cpu_gemm``
is the one place that decides whether a model gets it.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Up to this many rows the contiguous transpose streams faster than oneDNN's
# blocked layout (see the module's measurements).
MAX_STREAMING_ROWS = 2


def use_cpu_gemm(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether a model in ``dtype`` on ``device`` runs its linear layers
    through :class:`CpuGemm`: float32 on a CPU with oneDNN in the torch
    build. (16-bit GEMMs on CPUs without native 16-bit units are the slow
    path either way; vLLM's CPU build falls back to ``F.linear`` there too.)"""
    return (torch.device(device).type == "cpu" and dtype == torch.float32
            and torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]


class CpuGemm:
    """``x @ weight.T (+ bias)`` for one weight [out, in], in two layouts.

    ``transposed`` ([in, out], contiguous) serves up to
    ``MAX_STREAMING_ROWS`` rows; ``packed`` (oneDNN's layout) serves more."""

    __slots__ = ("transposed", "packed")

    def __init__(self, weight: Tensor) -> None:
        if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"CpuGemm takes a 2-D float32 CPU weight, got {tuple(weight.shape)} "
                             f"{weight.dtype} on {weight.device}")
        self.transposed = weight.detach().t().contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)

    def __call__(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        if x.shape[0] <= MAX_STREAMING_ROWS:
            if bias is None:
                return x @ self.transposed
            return torch.addmm(bias, x, self.transposed)
        out: Tensor = torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        return out
