"""Check kvsched's performance model against every usable published number.

Reads ``../shared/facts/`` (``splitwise_perf_model.csv``, ``measurements.md``'s
serving figures, ``hardware.md``'s published figures) and prints, for every
comparison, the model's prediction, the measurement, the relative error
``(predicted - measured) / measured`` and what differs between the two set-ups.
The efficiency factors are the catalog's; nothing here is tuned to the data.

    python benchmarks/validate_perf.py                      # every table, full Splitwise table last
    python benchmarks/validate_perf.py --update-doc docs/validation.md
    python benchmarks/validate_perf.py --check-doc docs/validation.md   # exit 1 if the doc is stale

``docs/validation.md`` holds the generated tables between
``<!-- BEGIN validate_perf:NAME -->`` / ``<!-- END validate_perf:NAME -->``
markers; ``--update-doc`` rewrites them from this run.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf import get_hardware, get_model
from kvsched.perf.memory import plan_memory
from kvsched.perf.models import ModelSpec
from kvsched.perf.step_time import (
    KERNEL_LATENCY_S,
    KERNELS_PER_LAYER,
    BatchShape,
    ParallelConfig,
    RuntimeConfig,
    StepTimeModel,
)
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import random_workload

REPO = Path(__file__).resolve().parent.parent
FACTS = Path(os.environ.get("KVSCHED_FACTS_DIR") or next(
    (p for p in (REPO.parent / "shared" / "facts", Path("/work/shared/facts")) if p.is_dir()),
    REPO.parent / "shared" / "facts"))

# --------------------------------------------------------------------------
# Splitwise static batches

SPLITWISE_MODELS = {"llama2-70b": "meta-llama/Llama-2-70b-hf", "bloom-176b": "bigscience/bloom"}
# The power-capped H100 has no entry of its own: the model has no power term,
# so it is predicted as an uncapped H100 SXM (and its rows turn out to be
# derived from the uncapped ones, see check_pcap_rows).
SPLITWISE_HARDWARE = {"a100-80gb": "a100-80gb", "h100-80gb": "h100-sxm", "h100-80gb-pcap": "h100-sxm"}
PCAP = "h100-80gb-pcap"
# 2023 vLLM: fp16, no CUDA graphs, no async scheduling. cudagraph_max_size=1
# turns off decode padding (all Splitwise batch sizes are capture sizes anyway);
# the CPU costs stay the catalog defaults (0.5 ms per step + 4 us per request),
# added to the GPU time because nothing overlaps them.
SPLITWISE_RUNTIME = RuntimeConfig(dtype="fp16", async_scheduling=False, cudagraph_max_size=1)
# Used only to flag batches that cannot be one static batch: vLLM's default
# memory fraction, 16-token blocks, and the 8192-token profile run the 8192-token
# prompts need (vLLM v0's default max_num_seqs 256).
SPLITWISE_BLOCK_SIZE = 16
SPLITWISE_GPU_MEMORY_UTILIZATION = 0.9
SPLITWISE_PROFILE_TOKENS = 8192
SPLITWISE_MAX_NUM_SEQS = 256
EARLY_STOP_TOLERANCE = 0.05  # implied output tokens this far from token_size: the run stopped early


@dataclass(frozen=True, slots=True)
class SplitwiseGroup:
    model: str
    hardware: str
    tp: int
    prompt: int
    batch: int
    tokens: int
    runs: int
    prompt_ms: float
    token_ms: float
    e2e_ms: float

    @property
    def implied_tokens(self) -> float:
        """Output tokens the run generated: e2e = prompt + (n - 1) x token."""
        return 1.0 + (self.e2e_ms - self.prompt_ms) / self.token_ms


@dataclass(frozen=True, slots=True)
class SplitwiseResult:
    group: SplitwiseGroup
    prompt_ms: float
    token_ms: float
    e2e_ms: float
    decode_steps: int
    kv_capacity: int
    flags: tuple[str, ...]

    def metric(self, name: str) -> tuple[float, float]:
        g = self.group
        return {"prompt": (self.prompt_ms, g.prompt_ms), "token": (self.token_ms, g.token_ms),
                "e2e": (self.e2e_ms, g.e2e_ms)}[name]

    def counts(self, name: str) -> bool:
        """Whether metric ``name`` of this row enters the aggregates: not when the
        batch overflows the KV cache, not the e2e of a run that stopped early, and
        of the derived power-capped rows only prompt_time (the rest are copies)."""
        if "kv>capacity" in self.flags:
            return False
        if "derived" in self.flags:
            return name == "prompt"
        return not (name == "e2e" and any(f.startswith("stopped@") for f in self.flags))


def rel_err(predicted: float, measured: float) -> float:
    return (predicted - measured) / measured


def load_splitwise(path: Path) -> list[SplitwiseGroup]:
    """The CSV's rows averaged over repeats of the same configuration."""
    sums: dict[tuple[str, str, int, int, int, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            key = (row["model"], row["hardware"], int(row["tensor_parallel"]), int(row["prompt_size"]),
                   int(row["batch_size"]), int(row["token_size"]))
            acc = sums[key]
            acc[0] += 1
            acc[1] += float(row["prompt_time"])
            acc[2] += float(row["token_time"])
            acc[3] += float(row["e2e_time"])
    groups = [SplitwiseGroup(*key, int(n), p / n, t / n, e / n) for key, (n, p, t, e) in sums.items()]
    order = {name: i for i, name in enumerate(SPLITWISE_HARDWARE)}
    groups.sort(key=lambda g: (g.model, order[g.hardware], g.tp, g.batch, g.prompt, g.tokens))
    return groups


def check_pcap_rows(path: Path) -> tuple[int, float, float, bool]:
    """(rows, min and max pcap/uncapped prompt_time ratio, token and e2e identical)."""
    rows: dict[str, list[dict[str, str]]] = {"h100-80gb": [], PCAP: []}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["hardware"] in rows:
                rows[row["hardware"]].append(row)
    pairs = list(zip(rows["h100-80gb"], rows[PCAP]))
    keys = ("model", "prompt_size", "batch_size", "token_size", "tensor_parallel")
    ratios = [float(c["prompt_time"]) / float(u["prompt_time"]) for u, c in pairs
              if all(u[k] == c[k] for k in keys)]
    same = all(u["token_time"] == c["token_time"] and u["e2e_time"] == c["e2e_time"] for u, c in pairs)
    return len(pairs), min(ratios), max(ratios), same and len(ratios) == len(pairs)


def prefill_shape(batch: int, prompt: int) -> BatchShape:
    """``batch`` whole prompts of ``prompt`` tokens in one step, each sampling its first token."""
    tokens = batch * prompt
    return BatchShape(tokens, batch, batch, 0, 0, tokens, tokens, batch * (prompt * (prompt + 1) // 2))


@cache
def _step_model(model: str, hardware: str, parallel: ParallelConfig, runtime: RuntimeConfig) -> StepTimeModel:
    return StepTimeModel(get_model(model), get_hardware(hardware), parallel, runtime)


@cache
def _kv_capacity(model: str, hardware: str, tp: int) -> int:
    plan = plan_memory(get_model(model), get_hardware(hardware), ParallelConfig(tp), SPLITWISE_RUNTIME,
                       SPLITWISE_BLOCK_SIZE, SPLITWISE_GPU_MEMORY_UTILIZATION, SPLITWISE_PROFILE_TOKENS,
                       SPLITWISE_MAX_NUM_SEQS)
    return (plan.num_gpu_blocks - 1) * SPLITWISE_BLOCK_SIZE


@cache
def _predict_static(model: str, hardware: str, tp: int, prompt: int, batch: int,
                    out_tokens: int) -> tuple[float, float, float]:
    """(prefill s, mean decode step s, e2e s): one prefill step of the whole batch,
    then ``out_tokens - 1`` decode steps, each reading the batch's growing KV."""
    sm = _step_model(model, hardware, ParallelConfig(tp), SPLITWISE_RUNTIME)
    prefill = sm.step_time(prefill_shape(batch, prompt))
    decode = 0.0
    for j in range(1, out_tokens):
        decode += sm.step_time(BatchShape.decode(batch, batch * (prompt + j)))
    steps = max(out_tokens - 1, 1)
    mean = decode / steps if out_tokens > 1 else sm.step_time(BatchShape.decode(batch, batch * (prompt + 1)))
    return prefill, mean, prefill + decode


def predict_splitwise(g: SplitwiseGroup, implied: float | None = None) -> SplitwiseResult:
    """``implied``: output tokens the run generated, if not ``g.implied_tokens``
    (the power-capped rows carry the uncapped run's e2e)."""
    model = SPLITWISE_MODELS[g.model]
    hardware = SPLITWISE_HARDWARE[g.hardware]
    flags: list[str] = []
    if g.hardware == PCAP:
        flags.append("derived")
    capacity = _kv_capacity(model, hardware, g.tp)
    if g.batch * (g.prompt + g.tokens) > capacity:
        flags.append("kv>capacity")
    out = g.tokens
    if implied is None:
        implied = g.implied_tokens
    if abs(implied - g.tokens) > EARLY_STOP_TOLERANCE * g.tokens:
        out = max(2, min(g.tokens, round(implied)))
        flags.append(f"stopped@{round(implied)}")
    prefill, token, e2e = _predict_static(model, hardware, g.tp, g.prompt, g.batch, out)
    return SplitwiseResult(g, prefill * 1e3, token * 1e3, e2e * 1e3, out - 1, capacity, tuple(flags))


def splitwise_results(facts: Path = FACTS) -> list[SplitwiseResult]:
    groups = load_splitwise(facts / "splitwise_perf_model.csv")
    uncapped = {(g.model, g.tp, g.prompt, g.batch, g.tokens): g for g in groups if g.hardware == "h100-80gb"}
    results = []
    for g in groups:
        twin = uncapped.get((g.model, g.tp, g.prompt, g.batch, g.tokens)) if g.hardware == PCAP else None
        results.append(predict_splitwise(g, twin.implied_tokens if twin else None))
    return results


# --------------------------------------------------------------------------
# Serving comparisons


@dataclass(frozen=True, slots=True)
class Comparison:
    name: str
    metric: str
    predicted: float | None
    measured: float | None
    status: str          # compared | closest | not comparable | in balance.md
    note: str

    @property
    def error(self) -> float | None:
        if self.predicted is None or self.measured is None:
            return None
        return rel_err(self.predicted, self.measured)


@cache
def simulate(model: str, hardware: str, parallel: ParallelConfig, runtime: RuntimeConfig, input_len: int,
             output_len: int, num_prompts: int, concurrency: int, max_num_batched_tokens: int = 8192,
             max_num_seqs: int = 256) -> dict[str, float]:
    """``vllm bench serve --dataset-name random`` (fixed lengths, all sent at t=0,
    ``--max-concurrency``) through the simulator; KV blocks from plan_memory at 0.9."""
    m = get_model(model)
    hw = get_hardware(hardware)
    plan = plan_memory(m, hw, parallel, runtime, 16, 0.9, max_num_batched_tokens, max_num_seqs)
    config = SimConfig(
        SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                        max_model_len=input_len + output_len),
        CacheConfig(num_gpu_blocks=plan.num_gpu_blocks, block_size=16),
        _step_model(model, hardware, parallel, runtime))
    workload = random_workload(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                               max_concurrency=concurrency)
    metrics = Simulator(config, workload).run().metrics()
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def ep_step_time(model: str, hardware: str, dtype: str, dp: int, shape: BatchShape) -> float:
    """One DP rank's step with experts sharded over all ``dp`` ranks (EP = DP, TP 1),
    every rank running the same batch (perfect balance)."""
    sm = _step_model(model, hardware, ParallelConfig(1, dp, True), RuntimeConfig(dtype=dtype))
    return sm.step_time(shape, global_tokens=shape.num_tokens * dp)


DSV3 = "deepseek-ai/DeepSeek-V3"
DSR1 = "deepseek-ai/DeepSeek-R1"
FP8 = RuntimeConfig(dtype="fp8")


def serving_comparisons() -> list[Comparison]:
    rows: list[Comparison] = []
    tp8 = ParallelConfig(8)
    # SGLang v0.4.1.post2, DeepSeek-V3, 8xH200, TP8 + DP attention, in 128 / out 256.
    for batch, measured in ((1, 30.29), (8, 206.32), (32, 760.52)):
        r = simulate(DSV3, "h200", tp8, FP8, 128, 256, batch, batch)
        decode = _step_model(DSV3, "h200", tp8, FP8).step_time(BatchShape.decode(batch, batch * 256))
        rows.append(Comparison(
            f"SGLang DeepSeek-V3 8xH200 TP8, batch {batch}, 128/256", "output tok/s",
            r["output_throughput"], measured, "closest",
            f"model: one wave of {batch} (prefill + 255 decode steps), TP8 attention instead of DP "
            f"attention, FP8 weights, CUDA graphs + async; decode alone {batch / decode:,.0f} tok/s "
            f"({decode * 1e3:.2f} ms/step) vs measured {batch / measured * 1e3:.1f} ms per output "
            "position incl. prefill"))
    # InferenceX, DeepSeek-R1-0528 FP8, SGLang 0.5.7, 8xH200 TP8, concurrency 4.
    for isl, osl, tpot, ttft in ((1024, 1024, 22.73, 267.0), (8192, 1024, 12.05, 474.0),
                                 (1024, 8192, 10.93, None)):
        r = simulate(DSR1, "h200", tp8, FP8, isl, osl, 20, 4)
        label = f"InferenceX DeepSeek-R1 FP8 8xH200 TP8, conc 4, {isl // 1024}k/{osl // 1024}k"
        note = ("model: 20 prompts of fixed length sent at t=0 (real: randomised lengths), TP8 without "
                "EP, FP8 weights, BF16 KV, CUDA graphs + async, max_num_batched_tokens 8192; no MTP")
        if isl == osl:
            note += ("; the three rows come from different runners, and this one's TPOT is the highest "
                     "despite the shortest context")
        rows.append(Comparison(label, "median TPOT ms", r["median_tpot_ms"], tpot, "compared", note))
        if ttft is not None:
            rows.append(Comparison(
                label, "median TTFT ms", r["median_ttft_ms"], ttft, "compared",
                f"each wave of 4 prompts is prefilled together ({4 * isl:,} tokens, "
                f"{-(-4 * isl // 8192)} step(s)) while the previous wave has finished: lock-step, no "
                "decode interference"))
    # CloudMatrix384 prefill: DeepSeek-R1 INT8 on Ascend 910C, 4K prompts, per NPU.
    shape = prefill_shape(1, 4096)
    rates = {dp: 4096 / ep_step_time(DSR1, "ascend-910c", "bf16", dp, shape) for dp in (8, 16, 32)}
    rows.append(Comparison(
        "CloudMatrix384 DeepSeek-R1 prefill, 4K prompts, per 910C", "input tok/s", rates[16], 6688.0,
        "closest", "model: one 910C package per rank, BF16 (no INT8 path: INT8 has 2x the rate, half the "
        "bytes), one 4K prompt per rank and step, EP16 = DP16 perfectly balanced (EP8 / EP32: "
        f"{rates[8]:,.0f} / {rates[32]:,.0f}), all-to-all on UB; DP scheduling not simulated; no MTP"))
    shape = prefill_shape(4, 2000)
    rates = {dp: 8000 / ep_step_time(DSV3, "h100-sxm", "fp8", dp, shape) for dp in (8, 32)}
    rows.append(Comparison(
        "SGLang large-scale EP DeepSeek-V3 prefill, 2000-token inputs, per H100", "input tok/s",
        rates[32], 52300.0 / 8, "closest",
        "measured 52.3k per node / 8; model: FP8, 4 prompts per rank and step, EP32 = DP32 perfectly "
        f"balanced (EP8: {rates[8]:,.0f}), all-to-all at NVLink rate (real: 12 nodes, cross-node traffic on "
        "the scale-out network, not modelled); PD disaggregation"))
    # Not comparable.
    floor = ep_step_time(DSR1, "ascend-910c", "bf16", 160, BatchShape.decode(1, 4096))
    rows += [
        Comparison("CloudMatrix384 DeepSeek-R1 decode, TPOT < 50 ms, per 910C", "output tok/s", None, 1943.0,
                   "not comparable",
                   "EP320 over 160 NPUs with DP attention (DP not built), INT8 (no INT8 path), per-NPU "
                   "batch and context not in the facts"),
        Comparison("CloudMatrix384 DeepSeek-R1 decode, TPOT 15 ms, per 910C", "output tok/s", None, 538.0,
                   "not comparable", "as above; in BF16 the model's fastest step (1 sequence of 4K per rank, "
                   f"EP160 = DP160) is {floor * 1e3:.1f} ms: the replicated dense weights alone are read "
                   "in BF16 every step"),
        Comparison("SGLang large-scale EP DeepSeek-V3 decode, per H100", "output tok/s", None, 22300.0 / 8,
                   "not comparable", "PD disaggregation, cross-node EP, DP attention; decode batch and "
                   "context not in the facts"),
        Comparison("SGLang DeepSeek-V3 8xH200 ShareGPT 5,000 prompts", "output tok/s", None, 2673.55,
                   "not comparable",
                   "ShareGPT length distribution not in the facts (no loader); DP attention"),
        Comparison("DeepSeek production (H800), prefill per node", "input tok/s", None, 73700.0,
                   "not comparable",
                   "H800 not in the catalog or facts; PD disaggregation, EP32 over 4 nodes, "
                   "56.3 % prefix-cache hits counted as input"),
        Comparison("DeepSeek production (H800), decode per node", "output tok/s", None, 14800.0,
                   "not comparable", "H800 not in the catalog; EP144 over 18 nodes (DP), MTP"),
    ]
    return rows


def decode_breakdown(sm: StepTimeModel, shape: BatchShape) -> dict[str, float] | None:
    """The model's decode step split into its terms (seconds), from the model's own
    internals; None if they no longer add up to ``gpu_time`` (the model changed)."""
    try:
        T = sm.padded_tokens(shape.num_tokens)
        wb = sm.weight_bytes
        parts = {
            "dense weights": max(2.0 * T * sm.dense_params / sm.lin_flops,
                                 sm.dense_params * wb / sm.weight_bw),
            "routed experts": sm.moe_layers * sm._routed_expert_time(T, T) if sm.moe_layers else 0.0,
            "attention": sm._attention_time(shape),
            "LM head": max(2.0 * shape.num_sampled * sm.lm_head_params / sm.head_flops,
                           2.0 * sm.lm_head_params / sm.weight_bw),
            "all-reduce": (2 * sm.num_layers * (sm.comm_latency + 2.0 * (sm.tp - 1) / sm.tp
                                                * T * sm.hidden * 2.0 / sm.ar_bw)) if sm.tp > 1 else 0.0,
            "fixed kernel latency": sm.fixed_gpu_s,
        }
    except AttributeError:
        return None
    if not math.isclose(sum(parts.values()), sm.gpu_time(shape), rel_tol=1e-9):
        return None
    return parts


def serving_diagnostics() -> str:
    """Where the DeepSeek decode gap is: the residual per layer against the model's
    fixed per-layer kernel term and the size of the expert slices it streams."""
    m = get_model(DSR1)
    hw = get_hardware("h200")
    tp = 8
    layers = m.num_layers
    slice_mb = m.expert_params() / tp / 1e6  # FP8: one byte per weight
    rows = []
    for isl, osl, tpot in ((1024, 1024, 22.73), (8192, 1024, 12.05), (1024, 8192, 10.93)):
        r = simulate(DSR1, "h200", ParallelConfig(tp), FP8, isl, osl, 20, 4)
        resid = tpot - r["median_tpot_ms"]
        rows.append([f"InferenceX conc 4, {isl // 1024}k/{osl // 1024}k", num(tpot), num(r["median_tpot_ms"]),
                     num(resid), f"{resid * 1e3 / layers:.0f}"])
    for batch, measured in ((1, 30.29), (8, 206.32), (32, 760.52)):
        per_token = batch / measured * 1e3  # run duration / 256 output positions
        pred = _step_model(DSV3, "h200", ParallelConfig(tp), FP8).step_time(
            BatchShape.decode(batch, batch * 256)) * 1e3
        rows.append([f"SGLang v0.4.1 batch {batch} (ms per output position incl. prefill)", num(per_token),
                     num(pred), num(per_token - pred), f"{(per_token - pred) * 1e3 / layers:.0f}"])
    touched = m.num_experts * (1.0 - (1.0 - m.experts_per_token / m.num_experts) ** 4)
    header = ["DeepSeek decode, 8xH200 TP8", "measured ms", "model ms", "unmodelled ms", "µs/layer"]
    ctx = 8192 + 512
    sm = _step_model(DSR1, "h200", ParallelConfig(tp), FP8)
    parts = decode_breakdown(sm, BatchShape.decode(4, 4 * ctx))
    if parts is None:
        split = "(breakdown unavailable: the model's terms changed; update decode_breakdown)"
    else:
        split = (f"The model's step at 4 sequences of {ctx:,} tokens: {sum(parts.values()) * 1e3:.2f} ms = "
                 + " + ".join(f"{name} {t * 1e3:.2f}" for name, t in parts.items()) + " ms.")
    return table(header, rows) + "\n\n" + split + (
        f" Fixed kernel latency = {layers} layers x {KERNELS_PER_LAYER} kernels x "
        f"{KERNEL_LATENCY_S * 1e6:.0f} µs; each MoE layer touches ≈{touched:.0f} of {m.num_experts} experts "
        f"at 4 sequences, each a {slice_mb:.1f} MB FP8 slice per GPU under TP8, streamed at weight_bw_frac "
        f"{hw.weight_bw_frac} (measured on GEMMs with >= 128 MiB of weights).")


def pending_comparisons() -> list[Comparison]:
    """The DP measurements: compared as relative policy effects in docs/balance.md."""
    note = "relative effect of the policy compared in docs/balance.md (benchmarks/validate_dp.py)"
    return [
        Comparison("vllm-ascend balance scheduling, DeepSeek-V3.1, 3500/1500, batch 128",
                   "TPOT ms baseline -> balance", None, None, "in balance.md",
                   f"{note}; measured 86.85 -> 70.63 ms, output 1,297.3 -> 1,530.7 tok/s; "
                   "hardware not stated"),
        Comparison("TensorRT-LLM ADP Balance, DeepSeek-V3 8xGB200, ADP8 + EP8",
                   "output tok/s", None, None, "in balance.md",
                   f"{note}; measured 25,664 -> 33,499 (timeout_iters=50) -> 34,140 (+batching_wait_iters)"),
        Comparison("vLLM PR 44558 prefill schedule interval, DeepSeek-R1 DP8 + EP", "P50 ITL ms",
                   None, None, "not comparable", "lengths and rate not stated (docs/balance.md); "
                   "measured 275 -> 32 ms at interval 2, mean TTFT -38 %"),
        Comparison("vLLM wide-EP DeepSeek decode, per H200", "output tok/s", None, 2200.0, "not comparable",
                   "multi-node EP; per-rank batch and context not in the facts"),
    ]


def kernel_comparisons() -> list[Comparison]:
    hw = get_hardware("h100-sxm")
    rate = hw.bf16_flops * hw.prefill_attn_mfu / 1e12
    return [
        Comparison("FlashAttention-3 FP16 forward on H100 (best case)", "attention TFLOP/s", rate, 740.0,
                   "compared", "model: prefill_attn_mfu 0.56 (aiconfigurator's vLLM median, causal, "
                   "seq >= 4096) x 989.4; FA3's figure is its best point"),
        Comparison("FlashAttention-2 on H100 (hardware.md: ~35 % of peak)", "attention TFLOP/s", rate,
                   0.35 * hw.bf16_flops / 1e12, "compared", "same model rate against the older kernel"),
    ]


# --------------------------------------------------------------------------
# KV capacity


@dataclass(frozen=True, slots=True)
class KvCapacity:
    tokens: int
    blocks: int
    describe: str


def kv_capacity_llama8b(max_num_batched_tokens: int = 8192, max_num_seqs: int = 256) -> KvCapacity:
    plan = plan_memory(get_model("meta-llama/Llama-3.1-8B"), get_hardware("h100-sxm"), ParallelConfig(),
                       RuntimeConfig(), 16, 0.9, max_num_batched_tokens, max_num_seqs)
    return KvCapacity((plan.num_gpu_blocks - 1) * 16, plan.num_gpu_blocks, plan.describe())


# --------------------------------------------------------------------------
# Formatting


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f} %"


def num(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


HW_LABEL = {"a100-80gb": "A100", "h100-80gb": "H100", PCAP: "H100-pcap"}
MODEL_LABEL = {"llama2-70b": "Llama-2-70B", "bloom-176b": "BLOOM-176B"}
METRICS = (("prompt", "prefill (prompt_time)"), ("token", "decode step (token_time)"), ("e2e", "e2e_time"))


def _stats(errors: list[float]) -> tuple[str, str, str, str]:
    if not errors:
        return "0", "-", "-", "-"
    abs_e = [abs(e) for e in errors]
    return (str(len(errors)), f"{statistics.median(abs_e) * 100:.1f} %",
            f"{statistics.fmean(abs_e) * 100:.1f} %", pct(statistics.median(errors)))


def splitwise_summary(results: list[SplitwiseResult]) -> str:
    groups: dict[tuple[str, str], list[SplitwiseResult]] = defaultdict(list)
    for r in results:
        groups[(r.group.model, r.group.hardware)].append(r)
    rows = []
    for (model, hw), rs in groups.items():
        for metric, label in METRICS:
            errs = [rel_err(*r.metric(metric)) for r in rs if r.counts(metric)]
            if errs:  # the power-capped rows: prompt_time only (token and e2e are copies)
                rows.append([MODEL_LABEL[model], HW_LABEL[hw], label, *_stats(errs)])
    for metric, label in METRICS:
        errs = [rel_err(*r.metric(metric)) for r in results
                if r.group.hardware != PCAP and r.counts(metric)]
        rows.append(["**all measured (A100 + H100)**", "", label, *_stats(errs)])
    return table(["model", "hardware", "metric", "n", "median abs err", "MAPE", "median signed err"], rows)


def _cell(pred: float, meas: float) -> str:
    return f"{num(meas)} / {num(pred)} ({pct(rel_err(pred, meas))})"


Key = tuple[str, str, int, int, int, int]


def _index(results: list[SplitwiseResult]) -> dict[Key, SplitwiseResult]:
    return {(r.group.model, r.group.hardware, r.group.tp, r.group.prompt, r.group.batch, r.group.tokens): r
            for r in results}


def _measured_configs(results: list[SplitwiseResult]) -> list[tuple[str, str, int]]:
    """(model, hardware, TP) of the measured (not power-capped) rows, Llama first."""
    configs = {(r.group.model, r.group.hardware, r.group.tp) for r in results if r.group.hardware != PCAP}
    return sorted(configs, key=lambda c: (c[0] != "llama2-70b", c[1], c[2]))


def splitwise_representative(results: list[SplitwiseResult]) -> str:
    index = _index(results)
    configs = _measured_configs(results)
    rows = []
    for model, hw, tp in configs:
        cells = [MODEL_LABEL[model], HW_LABEL[hw], str(tp)]
        for prompt, batch in ((512, 1), (8192, 1), (512, 16)):
            r = index[(model, hw, tp, prompt, batch, 128)]
            cells.append(_cell(r.prompt_ms, r.group.prompt_ms))
        for batch in (1, 16, 64):
            r = index[(model, hw, tp, 512, batch, 128)]
            mark = " †" if "kv>capacity" in r.flags else ""
            cells.append(_cell(r.token_ms, r.group.token_ms) + mark)
        rows.append(cells)
    header = ["model", "hw", "TP", "prefill 512x1 ms", "prefill 8192x1 ms", "prefill 512x16 ms",
              "decode b1 ms", "decode b16 ms", "decode b64 ms"]
    return table(header, rows) + ("\n\nCells: measured / predicted (signed error). † batch exceeds the "
                                  "KV capacity (excluded from the aggregates).")


def _linear_flops_per_token(m: ModelSpec) -> float:
    return 2.0 * (m.num_params() - m.embedding_params() - m.lm_head_params())


def splitwise_diagnostics(results: list[SplitwiseResult]) -> str:
    index = _index(results)
    configs = _measured_configs(results)
    rows = []
    for model, hw, tp in configs:
        spec = get_model(SPLITWISE_MODELS[model])
        dev = get_hardware(SPLITWISE_HARDWARE[hw])
        d = index[(model, hw, tp, 512, 1, 128)]
        resid = d.group.token_ms - d.token_ms
        p = index[(model, hw, tp, 8192, 1, 128)]
        flops = 8192 * _linear_flops_per_token(spec) + (
            4.0 * spec.num_heads * spec.head_dim * spec.num_layers * (8192 * 8193 // 2))
        peak = tp * dev.bf16_flops
        meas_s, pred_s = p.group.prompt_ms / 1e3, p.prompt_ms / 1e3
        b32 = index[(model, hw, tp, 512, 32, 128)]
        slope_meas = (b32.group.token_ms - d.group.token_ms) / 31
        slope_pred = (b32.token_ms - d.token_ms) / 31
        rows.append([MODEL_LABEL[model], HW_LABEL[hw], str(tp), num(d.group.token_ms), num(d.token_ms),
                     num(resid), f"{resid * 1e3 / spec.num_layers:.0f}",
                     f"{slope_meas:.3f} / {slope_pred:.3f}",
                     f"{flops / meas_s / peak * 100:.0f} %", f"{flops / pred_s / peak * 100:.0f} %",
                     f"{8192 / meas_s / tp:,.0f}", f"{8192 / pred_s / tp:,.0f}"])
    header = ["model", "hw", "TP", "decode b1 meas ms", "pred ms", "unmodelled ms/step", "µs/layer",
              "ms per extra seq b1->b32 meas / pred", "prefill 8192 MFU meas", "pred",
              "prefill tok/s/GPU meas", "pred"]
    return table(header, rows)


def splitwise_full(results: list[SplitwiseResult]) -> str:
    rows = []
    for r in results:
        g = r.group
        rows.append([MODEL_LABEL[g.model], HW_LABEL[g.hardware], str(g.tp), str(g.prompt), str(g.batch),
                     str(g.tokens), str(g.runs), num(g.prompt_ms), num(r.prompt_ms),
                     pct(rel_err(r.prompt_ms, g.prompt_ms)), num(g.token_ms), num(r.token_ms),
                     pct(rel_err(r.token_ms, g.token_ms)), num(g.e2e_ms), num(r.e2e_ms),
                     pct(rel_err(r.e2e_ms, g.e2e_ms)), " ".join(r.flags)])
    header = ["model", "hw", "TP", "prompt", "batch", "tokens", "runs", "prefill meas", "pred", "err",
              "token meas", "pred", "err", "e2e meas", "pred", "err", "flags"]
    return table(header, rows)


def comparison_table(rows: list[Comparison]) -> str:
    return table(["comparison", "metric", "predicted", "measured", "error", "status", "what differs"],
                 [[c.name, c.metric, num(c.predicted), num(c.measured), pct(c.error), c.status, c.note]
                  for c in rows])


def splitwise_notes(results: list[SplitwiseResult], facts: Path) -> str:
    n, lo, hi, same = check_pcap_rows(facts / "splitwise_perf_model.csv")
    over = sorted({f"{MODEL_LABEL[r.group.model]} {HW_LABEL[r.group.hardware]} TP{r.group.tp} batch "
                   f"{r.group.batch}x({r.group.prompt}+{r.group.tokens}) > {r.kv_capacity:,} tokens"
                   for r in results if "kv>capacity" in r.flags})
    stopped = sum(1 for r in results if r.group.hardware != PCAP
                  and any(f.startswith("stopped@") for f in r.flags))
    caps = sorted({(MODEL_LABEL[r.group.model], HW_LABEL[r.group.hardware], r.group.tp, r.kv_capacity)
                   for r in results if r.group.hardware != PCAP})
    csv_rows = sum(r.group.runs for r in results)
    lines = [
        f"- {len(results)} configurations ({csv_rows} CSV rows averaged over repeats).",
        f"- H100-pcap: {n} rows; prompt_time = uncapped x {lo:.4f}..{hi:.4f}, token_time and e2e_time "
        f"{'identical to' if same else 'different from'} the uncapped rows: derived, not measured. "
        "Predicted as an uncapped H100 and reported separately (not in the 'all measured' aggregates).",
        "- KV capacity (plan_memory, fp16, 0.9): "
        + "; ".join(f"{m} {h} TP{tp} {c:,}" for m, h, tp, c in caps) + " tokens.",
        "- Excluded (batch does not fit the KV cache, the run cannot be one static batch): "
        + ("; ".join(over) if over else "none") + ".",
        f"- {stopped} measured configurations generated fewer tokens than token_size (the implied count "
        "n from e2e = prompt + (n-1) x token is > 5 % below it; EOS, no ignore_eos): their token_time and "
        "e2e are predicted for n, and their e2e is not aggregated (n comes from the measured times).",
        "- Sign: error = (predicted - measured) / measured; negative = the model predicts a faster step "
        "than measured (optimistic).",
    ]
    return "\n".join(lines)


def kv_section() -> str:
    rows = []
    for mbt, seqs in ((8192, 256), (16384, 1024)):
        kv = kv_capacity_llama8b(mbt, seqs)
        rows.append([f"max_num_batched_tokens {mbt}, max_num_seqs {seqs}",
                     f"{kv.tokens:,} ({kv.blocks:,} blocks)", "none in shared/facts", kv.describe])
    return ("Llama-3.1-8B on 1x H100 SXM, bf16 weights and KV, gpu_memory_utilization 0.9, block size 16.\n\n"
            + table(["profile run", "predicted KV tokens", "measured", "plan_memory"], rows))


# --------------------------------------------------------------------------
# Driver


def headline(results: list[SplitwiseResult], serving: list[Comparison], kernel: list[Comparison],
             pending: list[Comparison]) -> str:
    rows = []
    for pool, label, capped in (("A100 + H100", "measured", False), ("H100-pcap", "derived", True)):
        for metric, name in METRICS:
            errs = [rel_err(*r.metric(metric)) for r in results
                    if (r.group.hardware == PCAP) == capped and r.counts(metric)]
            if not errs:
                continue
            optimistic = sum(1 for e in errs if e < 0)
            rows.append([f"Splitwise {name}, {pool} ({label})", str(len(errs)),
                         f"{statistics.median([abs(e) for e in errs]) * 100:.1f} %",
                         f"{pct(min(errs))} .. {pct(max(errs))}",
                         f"optimistic in {optimistic} of {len(errs)}"])
    groups: dict[str, list[Comparison]] = defaultdict(list)
    for c in serving + kernel:
        if c.error is not None:
            key = c.name.split(",")[0] + f" ({c.metric})"
            groups[key].append(c)
    for key, cs in groups.items():
        errs = [c.error for c in cs if c.error is not None]
        direction = ("optimistic" if all(_optimistic(c) for c in cs)
                     else "pessimistic" if not any(_optimistic(c) for c in cs) else "mixed")
        rows.append([key, str(len(errs)), f"{statistics.median([abs(e) for e in errs]) * 100:.1f} %",
                     " / ".join(pct(e) for e in errs), direction])
    skipped = sum(1 for c in serving if c.status == "not comparable")
    dp = sum(1 for c in pending if c.status == "in balance.md")
    rows.append([f"not comparable: {skipped + len(pending) - dp}; DP policy effects: {dp} (docs/balance.md); "
                 "KV capacity: no measurement in the facts", "-", "-", "-", "-"])
    return table(["comparison", "n", "median abs err", "signed errors", "model is"], rows)


def _optimistic(c: Comparison) -> bool:
    """A time predicted too low or a rate predicted too high."""
    err = c.error or 0.0
    return err > 0 if ("tok/s" in c.metric or "TFLOP/s" in c.metric) else err < 0


def build_sections(facts: Path = FACTS) -> dict[str, str]:
    results = splitwise_results(facts)
    serving = serving_comparisons()
    kernel = kernel_comparisons()
    pending = pending_comparisons()
    return {
        "headline": headline(results, serving, kernel, pending),
        "splitwise-notes": splitwise_notes(results, facts),
        "splitwise-summary": splitwise_summary(results),
        "splitwise-representative": splitwise_representative(results),
        "splitwise-diagnostics": splitwise_diagnostics(results),
        "serving": comparison_table(serving),
        "serving-diagnostics": serving_diagnostics(),
        "kernel": comparison_table(kernel),
        "pending": comparison_table(pending),
        "kv-capacity": kv_section(),
        "splitwise-full": splitwise_full(results),
    }


TITLES = {
    "headline": "Headline errors",
    "splitwise-notes": "Splitwise: data checks",
    "splitwise-summary": "Splitwise static batches: errors per model, hardware and metric",
    "splitwise-representative": "Splitwise: representative configurations",
    "splitwise-diagnostics": "Splitwise: where the time goes (decode residual, prefill efficiency)",
    "serving": "Published serving numbers",
    "serving-diagnostics": "DeepSeek decode: where the time goes",
    "kernel": "Published kernel figures",
    "pending": "Data-parallel measurements",
    "kv-capacity": "KV capacity",
    "splitwise-full": "Splitwise: every configuration",
}
_BLOCK = re.compile(r"(<!-- BEGIN validate_perf:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- END validate_perf:"
                    r"(?P=name) -->)", re.S)


def render_doc(text: str, sections: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in sections:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(sections)}")
        return m.group(1) + sections[name] + "\n" + m.group(4)

    return _BLOCK.sub(repl, text)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--facts", type=Path, default=FACTS, help="directory of the facts files")
    parser.add_argument("--update-doc", type=Path, help="rewrite the generated blocks of this markdown file")
    parser.add_argument("--check-doc", type=Path, help="exit 1 if this file's generated blocks are stale")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    sections = build_sections(args.facts)
    for name, body in sections.items():
        out(f"## {TITLES[name]}\n\n{body}\n")
    out(f"({time.perf_counter() - t0:.1f} s)")
    for path in (args.update_doc, args.check_doc):
        if path is None:
            continue
        text = path.read_text(encoding="utf-8")
        new = render_doc(text, sections)
        if path is args.update_doc:
            path.write_text(new, encoding="utf-8")
        elif new != text:
            sys.stderr.write(f"{path}: generated blocks are stale; run --update-doc {path}\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
