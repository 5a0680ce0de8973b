"""The performance model against published numbers: the data and the comparisons.

Reads the facts directory (``splitwise_perf_model.csv`` and the serving and
kernel figures of ``measurements.md`` / ``hardware.md``, transcribed below) and
returns, for every comparison, the model's prediction, the measurement and what
differs between the two set-ups. The efficiency factors are the catalog's;
nothing here is tuned to the data. ``kvsched.validation.published_report`` turns the
results into the tables of docs/validation.md (``benchmarks/validate_perf.py``
runs it).

The facts directory is ``$KVSCHED_FACTS_DIR``, else ``shared/facts`` next to
the repository, else ``/work/shared/facts``.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.perf.hardware import get_hardware
from kvsched.perf.memory import plan_memory
from kvsched.perf.model_catalog import get_model
from kvsched.perf.step_time import BatchShape, ParallelConfig, RuntimeConfig, StepTimeModel
from kvsched.sim.simulator import SimConfig, Simulator
from kvsched.sim.workload import random_workload
from kvsched.validation.errors import rel_err

REPO = Path(__file__).resolve().parents[2]
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
def step_model(model: str, hardware: str, parallel: ParallelConfig, runtime: RuntimeConfig) -> StepTimeModel:
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
    sm = step_model(model, hardware, ParallelConfig(tp), SPLITWISE_RUNTIME)
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
        step_model(model, hardware, parallel, runtime))
    workload = random_workload(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                               max_concurrency=concurrency)
    metrics = Simulator(config, workload).run().metrics()
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def ep_step_time(model: str, hardware: str, dtype: str, dp: int, shape: BatchShape) -> float:
    """One DP rank's step with experts sharded over all ``dp`` ranks (EP = DP, TP 1),
    every rank running the same batch (perfect balance)."""
    sm = step_model(model, hardware, ParallelConfig(1, dp, True), RuntimeConfig(dtype=dtype))
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
        decode = step_model(DSV3, "h200", tp8, FP8).step_time(BatchShape.decode(batch, batch * 256))
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
        parts = {
            "dense weights": sm._linear_time(T),
            "routed experts": sm.moe_layers * sm._routed_expert_time(T, T) if sm.moe_layers else 0.0,
            "attention": sm._attention_time(shape),
            "LM head": max(2.0 * shape.num_sampled * sm.lm_head_params / sm.head_flops,
                           2.0 * sm.lm_head_params / sm.weight_bw),
            "all-reduce": (2 * sm.num_layers * (sm.ar_latency + 2.0 * (sm.tp - 1) / sm.tp
                                                * T * sm.hidden * 2.0 / sm.ar_bw)) if sm.tp > 1 else 0.0,
            "fixed kernel latency": sm.fixed_gpu_s,
        }
    except AttributeError:
        return None
    if not math.isclose(sum(parts.values()), sm.gpu_time(shape), rel_tol=1e-9):
        return None
    return parts


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
