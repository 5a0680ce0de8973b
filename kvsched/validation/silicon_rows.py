"""aiconfigurator-core's real vLLM serving rows, read and mapped to what kvsched runs.

aiconfigurator-core ships ``systems/silicon_sample.csv``: measured serving
points (mean TTFT and mean TPOT in ms) for vLLM, SGLang and TRT-LLM. This
module reads its vLLM aggregated rows (one engine serves prefill and decode)
and maps each to a kvsched deployment
(:class:`~kvsched.sim.deployment.EngineOptions`) and to the benchmark that
measured it (:class:`ServingRun`: InferenceX's client, a closed loop of CONC
clients, ``10 × CONC`` counted requests after ``2 × CONC`` warm-ups, lengths
uniform in [0.8, 1.0] × ISL / OSL, every request run to its length, prefix
caching off; :func:`build_workloads`), or says why it cannot
(:class:`Refusal`, never a silent drop). :mod:`kvsched.validation.silicon`
simulates the runs; :mod:`kvsched.validation.aic_estimate` asks
AIConfigurator for its estimate of the same rows.

How the runs were made is in ``shared/facts/inferencex.md``; what is assumed
where a row does not say is written next to each choice below.

aiconfigurator-core is an optional dependency (``pip install -e ".[measured]"``);
it is imported only when the data is asked for.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import re
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware, resolve_hardware_id
from kvsched.perf.model_catalog import catalog_match, get_model
from kvsched.sim.deployment import EngineOptions, serve_defaults
from kvsched.sim.workload import RandomRequests, Workload

AIC_PACKAGE = "aiconfigurator_core"
INSTALL_HINT = 'pip install -e ".[measured]"'

# InferenceX's client (shared/facts/inferencex.md): --num-prompts 10*CONC,
# --num-warmups 2*CONC, --random-range-ratio 0.8, --ignore-eos, closed loop.
PROMPTS_PER_CLIENT = 10
WARMUPS_PER_CLIENT = 2
RANGE_RATIO = 0.8
# benchmark_serving.py's --seed default; its random dataset is drawn from
# numpy's global RandomState after np.random.seed(seed).
CLIENT_SEED = 0

# The row's precision column -> the weight formats it can mean. A row whose
# checkpoint (kvsched.perf.model_catalog.catalog_match) is stored in one of them is
# run on that checkpoint as it is: gpt-oss's "fp4" is its native MXFP4,
# Kimi-K2.5's "int4" its native int4 experts, MiniMax-M2.5's "fp8" its block
# FP8, Qwen's -FP8 block FP8. No precision means the checkpoint's own (16 bits
# for the one model that has such rows, Qwen3-32B).
PRECISION_FORMATS: Mapping[str, frozenset[str]] = {
    "bf16": frozenset({"bf16"}), "fp8": frozenset({"fp8", "fp8_block"}),
    "fp4": frozenset({"nvfp4", "mxfp4"}), "int4": frozenset({"int4"})}
# "fp4" rows of a model whose own checkpoint is not 4-bit ran NVIDIA's NVFP4
# repack (InferenceX's *_fp4_* scripts; aiconfigurator-core ships their
# configs), passed by that name: its exclude list decides the layers.
NVFP4_CHECKPOINTS: Mapping[str, str] = {
    "MiniMaxAI/MiniMax-M2.5": "nvidia/MiniMax-M2.5-NVFP4",
    "moonshotai/Kimi-K2.5": "nvidia/Kimi-K2.5-NVFP4",
}


# The rows whose `source_file=` is NVIDIA's own collection (inferencex.md):
# they state no server flags, so vLLM serve's defaults, with max_num_seqs at
# least the concurrency. Every other row is an InferenceX run.
NVIDIA_COLLECTION_MODELS = frozenset({
    "Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B-FP8", "nvidia/Llama-3.1-8B-Instruct-FP8",
    "meta-llama/Llama-3.1-70B"})


# The measured runs' engine settings where their sources leave them to vLLM:
# the silicon rows' and the public runs' vLLM (0.10 to 0.12) sized the KV
# cache from the profiling estimate, at 0.9 of the device (their default;
# InferenceX's scripts pass it, ../shared/facts/inferencex.md) in 16-token
# blocks, which kvsched's vLLM 0.33 plan models. Pinned here rather than
# following kvsched.vllm_versions.DEFAULT_VLLM_VERSION, so the validated
# figures stay what the runs did whatever release kvsched defaults to.
MEASURED_VLLM_VERSION = "0.33"
MEASURED_GPU_MEMORY_UTILIZATION = 0.9
MEASURED_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class ServerFlags:
    """InferenceX's per-model ``vllm serve`` flags (inferencex.md's table, a
    2026-08 snapshot of the scripts: a measured row may predate it). Limits
    are ints, ``"CONC"`` (the row's concurrency) or ``"2*ISL"``; None keeps
    vLLM's default."""

    script: str
    kv_cache_dtype: str = "auto"
    max_num_batched_tokens: int | str | None = None
    max_num_seqs: int | str | None = None
    gpu_memory_utilization: float = MEASURED_GPU_MEMORY_UTILIZATION
    block_size: int = MEASURED_BLOCK_SIZE
    note: str = ""


_CAPTURE = ("cudagraph capture to 2048 not modelled (kvsched captures decode batches up to "
            "min(2 x max_num_seqs, 512))")
_PER_RUN = "max-num-batched-tokens and max-num-seqs are set per run and not recorded: vLLM's defaults"
# (model_path, precision, system) -> flags, one line per script.
SERVER_FLAGS: Mapping[tuple[str, str, str], ServerFlags] = {
    ("openai/gpt-oss-120b", "fp4", "h100_sxm"): ServerFlags(
        "gptoss_fp4_h100", max_num_batched_tokens=8192, max_num_seqs="CONC", note=_CAPTURE),
    ("openai/gpt-oss-120b", "fp4", "h200_sxm"): ServerFlags(
        "gptoss_fp4_h200", max_num_batched_tokens=8192, max_num_seqs="CONC", note=_CAPTURE),
    ("openai/gpt-oss-120b", "fp4", "b200_sxm"): ServerFlags(
        "gptoss_fp4_b200", kv_cache_dtype="fp8", max_num_batched_tokens=8192, max_num_seqs=512,
        note=_CAPTURE),
    ("moonshotai/Kimi-K2.5", "int4", "h200_sxm"): ServerFlags(
        "kimik2.5_int4_h200", max_num_seqs="CONC", gpu_memory_utilization=0.95),
    ("moonshotai/Kimi-K2.5", "int4", "b200_sxm"): ServerFlags(
        "kimik2.5_int4_b200", max_num_seqs="CONC", gpu_memory_utilization=0.95),
    ("moonshotai/Kimi-K2.5", "int4", "b300_sxm"): ServerFlags(
        "kimik2.5_int4_b300", max_num_seqs="CONC", gpu_memory_utilization=0.95),
    ("moonshotai/Kimi-K2.5", "fp4", "b200_sxm"): ServerFlags(
        "kimik2.5_fp4_b200", kv_cache_dtype="fp8", max_num_seqs="CONC"),
    ("moonshotai/Kimi-K2.5", "fp4", "b300_sxm"): ServerFlags(
        "kimik2.5_fp4_b300", kv_cache_dtype="fp8", max_num_seqs="CONC"),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "h100_sxm"): ServerFlags("minimaxm2.5_fp8_h100"),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "h200_sxm"): ServerFlags(
        "minimaxm2.5_fp8_h200", kv_cache_dtype="fp8", gpu_memory_utilization=0.95, note=_PER_RUN),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "b200_sxm"): ServerFlags(
        "minimaxm2.5_fp8_b200", kv_cache_dtype="fp8", max_num_batched_tokens="2*ISL", block_size=32),
    ("MiniMaxAI/MiniMax-M2.5", "fp8", "b300_sxm"): ServerFlags(
        "minimaxm2.5_fp8_b300", kv_cache_dtype="fp8", max_num_batched_tokens="2*ISL", block_size=32),
    ("MiniMaxAI/MiniMax-M2.5", "fp4", "b200_sxm"): ServerFlags(
        "minimaxm2.5_fp4_b200", kv_cache_dtype="fp8", max_num_batched_tokens="2*ISL"),
    ("MiniMaxAI/MiniMax-M2.5", "fp4", "b300_sxm"): ServerFlags(
        "minimaxm2.5_fp4_b300", kv_cache_dtype="fp8", max_num_batched_tokens="2*ISL"),
}
VLLM_DEFAULTS = ServerFlags("vllm serve defaults")


# --------------------------------------------------------------------------
# The rows


@dataclass(frozen=True, slots=True)
class SiliconRow:
    """One vLLM aggregated row of silicon_sample.csv (times in ms)."""

    id: str
    source: str                  # silicon_data_source
    backend_version: str | None  # vLLM version of the run; None when the CSV leaves it empty
    model_path: str
    system: str                  # aiconfigurator's system name, e.g. h100_sxm
    precision: str | None        # fp8 / fp4 / int4 / bf16; None: the checkpoint's own
    gemm_quant_mode: str | None
    moe_quant_mode: str | None
    isl: int
    osl: int
    batch_size: int              # the CSV's batch_size: concurrency per attention-DP rank
    concurrency: int             # the client's CONC
    concurrency_stated: bool     # CONC read from `silicon_concurrency=` (else batch_size x attention-DP)
    tp_size: int
    pp_size: int
    attention_dp_size: int       # empty or 0 in the CSV -> 1
    moe_tp_size: int | None
    moe_ep_size: int | None
    ttft_ms: float
    tpot_ms: float


def silicon_csv_path() -> Path:
    """aiconfigurator-core's ``systems/silicon_sample.csv``, found through the
    installed package."""
    if importlib.util.find_spec(AIC_PACKAGE) is None:
        raise ModuleNotFoundError(
            "aiconfigurator-core is not installed: the real vLLM serving runs (silicon_sample.csv) "
            f"and AIConfigurator's estimates come from it; install it with {INSTALL_HINT}")
    path = Path(str(resources.files(AIC_PACKAGE).joinpath("systems", "silicon_sample.csv")))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in the installed aiconfigurator-core; reinstall it with "
                                f"{INSTALL_HINT}")
    return path


_CONCURRENCY = re.compile(r"silicon_concurrency=(\d+)")


def _text(value: str) -> str | None:
    value = value.strip()
    return None if value == "" or value.lower() == "nan" else value


def _int(row: Mapping[str, str], column: str, *, zero_is_none: bool = False) -> int | None:
    text = _text(row[column])
    if text is None:
        return None
    number = float(text)
    if not number.is_integer():
        raise UserInputError(f"silicon_sample.csv row {row['id']}: {column}={text!r} is not a whole number")
    return None if zero_is_none and number == 0 else int(number)


def _required_int(row: Mapping[str, str], column: str) -> int:
    value = _int(row, column)
    if value is None:
        raise UserInputError(f"silicon_sample.csv row {row['id']}: {column} is empty")
    return value


def parse_row(row: Mapping[str, str]) -> SiliconRow:
    """One CSV record (``csv.DictReader``'s dict) as a :class:`SiliconRow`."""
    dp = _int(row, "attention_dp_size", zero_is_none=True) or 1
    batch = _required_int(row, "batch_size")
    source = row["silicon_data_source"]
    stated = _CONCURRENCY.search(source)
    return SiliconRow(
        id=row["id"], source=source, backend_version=_text(row["backend_version"]),
        model_path=row["model_path"], system=row["system"], precision=_text(row["precision"]),
        gemm_quant_mode=_text(row["gemm_quant_mode"]), moe_quant_mode=_text(row["moe_quant_mode"]),
        isl=_required_int(row, "isl"), osl=_required_int(row, "osl"), batch_size=batch,
        # The CSV's batch_size is per attention-DP rank (concurrency / DP);
        # the source string carries the client's concurrency where stated.
        concurrency=int(stated.group(1)) if stated else batch * dp, concurrency_stated=bool(stated),
        tp_size=_required_int(row, "tp_size"), pp_size=_int(row, "pp_size") or 1,
        attention_dp_size=dp, moe_tp_size=_int(row, "moe_tp_size", zero_is_none=True),
        moe_ep_size=_int(row, "moe_ep_size", zero_is_none=True),
        ttft_ms=float(row["silicon_ttft_ms"]), tpot_ms=float(row["silicon_tpot_ms"]))


def load_rows(path: Path | None = None) -> list[SiliconRow]:
    """Every vLLM aggregated row (``backend == vllm``, ``mode == agg``), in file order."""
    path = silicon_csv_path() if path is None else path
    with path.open(newline="", encoding="utf-8") as f:
        return [parse_row(r) for r in csv.DictReader(f) if r["backend"] == "vllm" and r["mode"] == "agg"]


# --------------------------------------------------------------------------
# Row -> kvsched deployment and workload


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a row cannot be priced: ``reason`` is short and the same for
    every row refused the same way (reports tally it), ``detail`` is this
    row's specifics."""

    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


@dataclass(frozen=True, slots=True)
class Parallelism:
    """How a row's parallelism columns are read as a vLLM launch."""

    gpus: int
    tensor_parallel_size: int
    data_parallel_size: int
    enable_expert_parallel: bool


def read_parallelism(row: SiliconRow, is_moe: bool) -> Parallelism | Refusal:
    """The GPUs and the vLLM launch behind a row's columns.

    ``tp_size`` is the GPU count. Rows with attention-DP (MiniMax-M2.5 and
    Kimi-K2.5) have ``attention_dp_size == tp_size`` and ``moe_ep_size =
    tp × attention_dp`` (e.g. 4, 4, 16): aiconfigurator's own convention
    (``tp × attention_dp == moe_tp × moe_ep`` GPUs) would make those 16 GPUs,
    more than the single 8-GPU node every run used. So the row is read as
    InferenceX records it (TP = the GPU count, DP-attention a flag): ``tp_size``
    GPUs, vLLM ``--data-parallel-size attention_dp --tensor-parallel-size
    tp/attention_dp``, experts over all of them. An MoE row whose columns
    disagree in another way (``moe_tp × moe_ep != tp × attention_dp``, e.g.
    Qwen3-235B at tp 1 with moe_tp 2) has no single GPU count and is refused:
    vLLM has one TP size, so the MoE columns cannot describe a different one.
    """
    tp, dp = row.tp_size, row.attention_dp_size
    if row.pp_size != 1:
        return Refusal("pipeline parallelism not simulated", f"pp_size {row.pp_size}")
    if dp > 1:
        if tp % dp:
            return Refusal("parallelism columns give no GPU count",
                           f"tp {tp} is not a multiple of attention-DP {dp}")
        return Parallelism(tp, tp // dp, dp, is_moe)
    moe_tp, moe_ep = row.moe_tp_size, row.moe_ep_size
    if is_moe and moe_tp is not None and moe_ep is not None and moe_tp * moe_ep != tp:
        return Refusal("parallelism columns disagree",
                       f"tp {tp} x attention-DP 1 = {tp} GPU{'s' if tp > 1 else ''} but moe_tp {moe_tp} "
                       f"x moe_ep {moe_ep} = {moe_tp * moe_ep}")
    return Parallelism(tp, tp, 1, is_moe and (moe_ep or 1) > 1)


def server_flags(row: SiliconRow) -> ServerFlags:
    """The row's ``vllm serve`` flags beyond the common ones."""
    if row.model_path in NVIDIA_COLLECTION_MODELS:
        return VLLM_DEFAULTS
    return SERVER_FLAGS.get((row.model_path, row.precision or "", row.system), VLLM_DEFAULTS)


def _limit(value: int | str | None, row: SiliconRow) -> int | None:
    if value is None or isinstance(value, int):
        return value
    if value == "CONC":
        return row.concurrency
    if value == "2*ISL":
        return 2 * row.isl
    raise UserInputError(f"server flag {value!r}: use an int, 'CONC' or '2*ISL'")


@dataclass(frozen=True, slots=True)
class ServingRun:
    """A row as kvsched runs it: the deployment (minus the step-time backend)
    and InferenceX's benchmark client."""

    row: SiliconRow
    options: EngineOptions
    parallelism: Parallelism
    flags: ServerFlags
    num_prompts: int     # counted requests: 10 x CONC
    num_warmups: int     # 2 x CONC, before the counted ones
    notes: tuple[str, ...] = ()

    @property
    def concurrency(self) -> int:
        return self.row.concurrency


def map_row(row: SiliconRow) -> ServingRun | Refusal:
    """The kvsched deployment and workload of ``row``, or why there is none.
    What the deployment itself refuses (a dtype, memory) is found when it is
    built, per step-time backend (:func:`simulate_row`)."""
    # Fine-tune and quantized checkpoints resolve to their catalog base
    # (kvsched.perf.model_catalog.catalog_match); the weights are what the row's
    # precision column means for that checkpoint (_weights).
    try:
        model = get_model(row.model_path)
    except ValueError:
        return Refusal("model not in kvsched's catalog", row.model_path)
    hardware = resolve_hardware_id(row.system)
    if hardware is None:
        return Refusal("hardware not in kvsched's catalog", row.system)
    layout = read_parallelism(row, model.is_moe)
    if isinstance(layout, Refusal):
        return layout
    flags = server_flags(row)
    notes: list[str] = []
    if flags.note:
        notes.append(flags.note)
    if not row.concurrency_stated:
        notes.append(f"concurrency not stated in the source: batch_size x attention-DP = {row.concurrency}")
    if layout.data_parallel_size > 1:
        notes.append(f"read as {layout.gpus} GPUs: DP{layout.data_parallel_size} x "
                     f"TP{layout.tensor_parallel_size} (CSV: tp {row.tp_size}, attention-DP "
                     f"{row.attention_dp_size}, moe_ep {row.moe_ep_size})")
    max_num_seqs = _limit(flags.max_num_seqs, row)
    if max_num_seqs is None:
        # NVIDIA's rows: vLLM's default, but at least the concurrency each
        # engine core sees (inferencex.md).
        per_rank = -(-row.concurrency // layout.data_parallel_size)
        default_seqs = serve_defaults(get_hardware(hardware))[1]
        if default_seqs < per_rank:
            max_num_seqs = per_rank
            notes.append(f"max_num_seqs raised from vLLM's default {default_seqs} to the concurrency "
                         f"per engine core, {per_rank}")
    weights = _weights(row)
    if isinstance(weights, Refusal):
        return weights
    model_name, dtype, quantization, note = weights
    if note:
        notes.append(note)
    options = EngineOptions(
        vllm_version=MEASURED_VLLM_VERSION, model=model_name, hardware=hardware,
        tensor_parallel_size=layout.tensor_parallel_size, data_parallel_size=layout.data_parallel_size,
        enable_expert_parallel=layout.enable_expert_parallel,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=_limit(flags.max_num_batched_tokens, row),
        enable_prefix_caching=False,  # --no-enable-prefix-caching
        block_size=flags.block_size, gpu_memory_utilization=flags.gpu_memory_utilization,
        dtype=dtype, quantization=quantization, kv_cache_dtype=flags.kv_cache_dtype)
    return ServingRun(row, options, layout, flags, PROMPTS_PER_CLIENT * row.concurrency,
                      WARMUPS_PER_CLIENT * row.concurrency, tuple(notes))


def _weights(row: SiliconRow) -> tuple[str, str, str | None, str] | Refusal:
    """(model name, --dtype, --quantization, note or "") for the row's precision:
    the checkpoint as the CSV names it when it is stored in that precision,
    else NVIDIA's NVFP4 repack of it or an on-the-fly format."""
    match = catalog_match(row.model_path)
    own = match[1] if match is not None else None
    if row.precision is None:
        return row.model_path, "bf16", None, ""
    formats = PRECISION_FORMATS.get(row.precision)
    if formats is None:
        return Refusal("precision not expressible", f"{row.precision!r}")
    if own is not None and own.weights in formats:
        kv = f", KV cache {own.kv_cache}" if own.kv_cache else ""
        return (row.model_path, "bf16", None,
                f"weights as the checkpoint stores them: {own.weights} ({own.layers} layers){kv}")
    if row.precision == "fp4":
        repack = NVFP4_CHECKPOINTS.get(row.model_path)
        if repack is not None:
            return repack, "bf16", None, f"fp4: NVIDIA's NVFP4 checkpoint {repack}"
        return (row.model_path, "bf16", "modelopt_fp4",
                "fp4: an NVFP4 (ModelOpt) checkpoint over every linear layer; the run's checkpoint "
                "and its KV format are not recorded")
    if row.precision in ("fp8", "bf16"):  # fp8: quantized on the fly (--dtype takes no weight format)
        return row.model_path, "bf16", "fp8" if row.precision == "fp8" else None, ""
    return Refusal("precision not expressible",
                   f"{row.precision!r} for {row.model_path}: not the checkpoint's format"
                   + (f" ({own.weights})" if own is not None else ""))


def inferencex_lengths(isl: int, osl: int, num_prompts: int, range_ratio: float = RANGE_RATIO,
                       seed: int = CLIENT_SEED) -> tuple[list[int], list[int]]:
    """(input lengths, output lengths) of InferenceX's random dataset.

    Their client is a copy of vLLM's older ``benchmark_serving.py``, whose
    ``--random-range-ratio`` is the *lower* bound: lengths uniform on the
    integers ``[int(len × ratio), len]`` (vLLM's current ``vllm bench serve``,
    and kvsched's ``random_workload``, spread ±ratio around ``len`` instead).
    Drawn as that copy draws them after ``np.random.seed(seed)``: all inputs,
    then all outputs (the empty shared-prefix draw before them takes nothing).
    The real prompts are random token ids decoded and re-tokenised, so their
    length can drift by a few tokens; kvsched has no tokenizer.
    """
    if not 0.0 <= range_ratio <= 1.0:
        raise UserInputError(f"range_ratio={range_ratio!r}: the old client's ratio is a lower bound "
                             f"in [0, 1]")
    rng = np.random.RandomState(seed)
    inputs = rng.randint(int(isl * range_ratio), isl + 1, size=num_prompts)
    outputs = rng.randint(int(osl * range_ratio), osl + 1, size=num_prompts)
    return [int(x) for x in inputs], [int(x) for x in outputs]


def _closed_loop(name: str, inputs: Sequence[int], outputs: Sequence[int], concurrency: int) -> Workload:
    n = len(inputs)
    requests = RandomRequests(array("d", [0.0] * n), array("q", inputs), array("q", outputs), 0)
    # --request-rate inf --max-concurrency CONC: all due at 0, CONC in flight.
    return Workload(name, requests, max_concurrency=concurrency)


def build_workloads(run: ServingRun) -> tuple[Workload, Workload]:
    """(warm-ups, counted requests). The warm-ups are ``2 × CONC`` copies of
    the first request's lengths (vllm's benchmark warms up with its first
    request), at the same concurrency."""
    row = run.row
    inputs, outputs = inferencex_lengths(row.isl, row.osl, run.num_prompts)
    warmup = _closed_loop("inferencex-warmup", [inputs[0]] * run.num_warmups,
                          [outputs[0]] * run.num_warmups, run.concurrency)
    return warmup, _closed_loop("inferencex-random", inputs, outputs, run.concurrency)
