"""Real vLLM serving runs published with their configuration: a held-out judge.

Every row here is a ``vllm bench serve`` result that someone published with
the server command, the GPU, the vLLM version and the benchmark's dataset
flags, so that kvsched can run the same thing (:func:`simulate_run`) and
AIConfigurator can be asked about it (:func:`aic_row`). The numbers are
transcribed with their source (repository, path, commit, line) in the data
file ``data/gpustack_runs.yaml`` (:data:`DATA_FILE`), read and checked once
at import; nothing in kvsched is fitted or tuned on them. ``benchmarks/validate_public.py``
simulates every row and writes docs/public_runs.md.

Source so far: GPUStack's "performance lab" (github.com/gpustack/gpustack,
``docs/performance-lab/<model>/<gpu>.md``, Apache-2.0): for each model and
GPU a baseline ``vllm serve`` run (and sometimes a tuned one) measured with
``vllm bench serve --backend openai-chat --endpoint /v1/chat/completions
--dataset-name random --random-input-len I --random-output-len O
--num-prompts N --seed 42`` at ``--request-rate inf`` (every request sent at
once, no ``--max-concurrency``): I/O = 32000/100 (N=100), 4000/200 (N=500),
2000/100 (N=500) and 128/4 (N=1000), and in the DeepSeek-V3.2 document a
"generation-heavy" 1000/2000 (N=100) as well. The documents print that
command for the 4000/200 case; the other cases are taken to differ only in
the lengths and N (their printed request counts and token totals agree).

Only rows whose configuration is stated well enough to simulate are kept
(:data:`REJECTED` says why the others are not):

* the engine is vLLM on NVIDIA GPUs, the model is in kvsched's catalog (or
  is a re-release of a catalog model with the same architecture, named in
  :data:`SAME_ARCHITECTURE`);
* every request was answered (``Successful requests`` = N);
* the outputs ran to their length: the run has no ``--ignore-eos``, so a
  request may stop early; a row is kept only when the generated tokens are
  at least :data:`MIN_OUTPUT_SHARE` of N x O (each request is then simulated
  at exactly O tokens).

What kvsched is told about the prompts: the source's own count, ``Total
input tokens`` / N (the random dataset's prompts are decoded and re-encoded,
so they drift a few tokens below I), all alike. Not modelled: the chat
template the server wraps each prompt in (not counted by the client; a few
tokens for Qwen, more for gpt-oss's harmony format) and prefix-cache hits on
its shared start. Server flags that only change how chat messages are
encoded or how the answer is parsed (:data:`_CHAT_ONLY_FLAGS`:
``--tokenizer-mode``, ``--reasoning-parser``) are read and noted, not
modelled.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.files import read_text
from kvsched.jsonfile import field_mismatch, show
from kvsched.perf.hardware import get_hardware
from kvsched.perf.kv_cache_planning import model_kernel_block
from kvsched.perf.model_catalog import get_model
from kvsched.sim.deployment import Deployment, EngineOptions, serve_defaults
from kvsched.sim.pricing import pricing_of
from kvsched.sim.rank import SimResult
from kvsched.sim.run import accept, serve, sim_config
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec
from kvsched.sim.workload import Workload, random_workload
from kvsched.validation.silicon import deployment_within_context
from kvsched.validation.silicon_rows import (
    MEASURED_BLOCK_SIZE,
    MEASURED_GPU_MEMORY_UTILIZATION,
    MEASURED_VLLM_VERSION,
    Refusal,
    SiliconRow,
)
from kvsched.yamlfile import parse_yaml

# --------------------------------------------------------------------------
# Where the numbers come from


@dataclass(frozen=True, slots=True)
class Source:
    """One published document: the rows cite it with a line number."""

    name: str
    repo: str           # owner/name on GitHub
    path: str
    commit: str         # the commit the numbers were read at (40 hex digits)
    license: str
    vllm_version: str   # as the document states it
    gpus: str           # the document's own words for the hardware

    def url(self, line: int | None = None) -> str:
        anchor = f"#L{line}" if line else ""
        return f"https://github.com/{self.repo}/blob/{self.commit}/{self.path}{anchor}"


# The GPU each document ran on, as kvsched's hardware id and AIConfigurator's system.
GPUSTACK_HARDWARE: Mapping[str, tuple[str, str]] = {
    "a100": ("a100-80gb", "a100_sxm"), "h100": ("h100-sxm", "h100_sxm"), "h200": ("h200", "h200_sxm")}

# The documents' random-dataset cases: (input, output tokens, prompts); "1k"
# is the DeepSeek-V3.2 document's "1k random input + 2k generation".
GPUSTACK_CASES: Mapping[str, tuple[int, int, int]] = {
    "32k": (32000, 100, 100), "4k": (4000, 200, 500), "2k": (2000, 100, 500), "128": (128, 4, 1000),
    "1k": (1000, 2000, 100)}
GPUSTACK_SEED = 42   # --seed 42 in the documents' benchmark command
MIN_OUTPUT_SHARE = 0.99

# Re-releases served under their own name whose architecture (layers,
# widths, heads, experts, weight format) is the catalog model's; only the
# context length and the training differ.
SAME_ARCHITECTURE: Mapping[str, str] = {
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-ai/DeepSeek-R1",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "Qwen/Qwen3-235B-A22B",
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "Qwen/Qwen3-235B-A22B-FP8",
}


# --------------------------------------------------------------------------
# The rows


@dataclass(frozen=True, slots=True)
class Latency:
    """One latency metric as ``vllm bench serve`` prints it (ms)."""

    mean: float
    median: float
    p99: float


@dataclass(frozen=True, slots=True)
class Measured:
    """What ``vllm bench serve`` printed for the run."""

    completed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    output_throughput: float       # tok/s
    total_token_throughput: float  # tok/s
    ttft: Latency
    tpot: Latency
    itl: Latency

    @property
    def derived_mean_e2e_ms(self) -> float:
        """Mean E2E latency: not printed by the source; with every output of
        the same length O it is mean TTFT + mean TPOT x (O - 1), exactly."""
        per_request = self.total_output_tokens / self.completed
        return self.ttft.mean + self.tpot.mean * (per_request - 1)


@dataclass(frozen=True, slots=True)
class PublicRun:
    """One published vLLM serving run, as stated by its source."""

    id: str
    source: Source
    line: int                     # the source line of the result block ("Successful requests")
    serve_command: str            # the source's ``vllm serve`` line, verbatim
    hardware: str                 # kvsched's hardware id
    aic_system: str               # AIConfigurator's system name
    dataset: str                  # vllm bench serve's --dataset-name
    input_len: int                # --random-input-len
    output_len: int               # --random-output-len
    num_prompts: int
    request_rate: float           # req/s; inf: all at once
    max_concurrency: int | None
    seed: int
    measured: Measured

    @property
    def url(self) -> str:
        return self.source.url(self.line)

    @property
    def vllm_version(self) -> str:
        return self.source.vllm_version

    @property
    def prompt_tokens(self) -> int:
        """Each prompt's length as the source counted it (mean over the run)."""
        return round(self.measured.total_input_tokens / self.measured.completed)

    @property
    def output_share(self) -> float:
        """Generated tokens / (prompts x --random-output-len)."""
        return self.measured.total_output_tokens / (self.num_prompts * self.output_len)


# --------------------------------------------------------------------------
# What was left out, and why


@dataclass(frozen=True, slots=True)
class Dropped:
    """A vLLM random-dataset result of a GPUStack document that is not a row."""

    doc: str
    line: int
    case: str
    reason: str          # a key of DROP_REASONS
    completed: int
    output_share: float  # generated tokens / (prompts x output length)


DROP_REASONS: Mapping[str, str] = {
    "short": f"outputs stopped early (no --ignore-eos): under {MIN_OUTPUT_SHARE:.0%} of the requested tokens "
             "were generated, and the source gives no per-request lengths",
    "failed": "some requests failed (Successful requests < --num-prompts); which ones is not stated",
    "catalog": "model not in kvsched's catalog (GLM-4.6, Qwen3-14B)",
    "ascend": "Ascend 910B with vLLM-Ascend, not vLLM on NVIDIA GPUs",
    "glm-copy": "GLM-4.5-Air: the A100 and H100 documents print identical numbers for every case (a copy), "
                "and the model is not in kvsched's catalog",
}


# --------------------------------------------------------------------------
# The data file: the runs and the left-out results, transcribed

DATA_FILE = Path(__file__).resolve().parent / "data" / "gpustack_runs.yaml"
# The file is some 24 KB; the bound only stops a wrong file from being read whole.
_MAX_DATA_BYTES = 2**20
_GPUSTACK_DOCS = "docs/performance-lab/"
_RUN_FIELDS = ("doc", "line", "serve_command", "case", "measured")
_DROPPED_FIELDS = tuple(f.name for f in dataclasses.fields(Dropped))


@dataclass(frozen=True, slots=True)
class Transcribed:
    """What :data:`DATA_FILE` holds, read and checked."""

    repo: str
    commit: str
    sources: Mapping[str, Source]   # by document path under docs/performance-lab/
    runs: tuple[PublicRun, ...]
    dropped: tuple[Dropped, ...]


def _fail(where: str, value: object, rule: str) -> UserInputError:
    return UserInputError(f"{where}={show(value)}: {rule}; correct it in the file")


def _fields(where: str, value: object, names: tuple[str, ...]) -> dict[str, Any]:
    """``value`` as a mapping of exactly the keys ``names``."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise _fail(where, value, f"must be a mapping of {', '.join(names)}")
    problem = field_mismatch(value, frozenset(names))
    if problem:
        raise UserInputError(f"{where}: {problem}; give exactly {', '.join(names)} "
                             "(correct the entry in the file)")
    return value


def _items(where: str, value: object) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise _fail(where, value, "must be a non-empty list")
    return value


def _text(where: str, value: object, pattern: str = r".+") -> str:
    if not isinstance(value, str) or re.fullmatch(pattern, value) is None:
        raise _fail(where, value, f"must be a string matching {pattern}")
    return value


def _count(where: str, value: object, least: int) -> int:
    if not is_int(value) or value < least:
        raise _fail(where, value, f"must be an integer of at least {least}")
    return value


def _amount(where: str, value: object, positive: bool = True) -> float:
    """A finite number, positive (or, with ``positive`` False, non-negative)."""
    if not is_number(value) or not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise _fail(where, value, f"must be a finite {'positive' if positive else 'non-negative'} number")
    return float(value)


def _case(where: str, value: object) -> str:
    if not isinstance(value, str) or value not in GPUSTACK_CASES:
        raise _fail(where, value, f"must be one of {', '.join(map(repr, GPUSTACK_CASES))} (a quoted string)")
    return value


def _measured(where: str, value: object) -> Measured:
    names = tuple(f.name for f in dataclasses.fields(Measured))
    data = _fields(where, value, names)
    latencies = {name: _latency_of(f"{where}.{name}", data[name]) for name in ("ttft", "tpot", "itl")}
    return Measured(
        completed=_count(f"{where}.completed", data["completed"], 1),
        duration_s=_amount(f"{where}.duration_s", data["duration_s"]),
        total_input_tokens=_count(f"{where}.total_input_tokens", data["total_input_tokens"], 1),
        total_output_tokens=_count(f"{where}.total_output_tokens", data["total_output_tokens"], 1),
        output_throughput=_amount(f"{where}.output_throughput", data["output_throughput"]),
        total_token_throughput=_amount(f"{where}.total_token_throughput", data["total_token_throughput"]),
        **latencies)


def _latency_of(where: str, value: object) -> Latency:
    stats = tuple(f.name for f in dataclasses.fields(Latency))
    data = _fields(where, value, stats)
    return Latency(*(_amount(f"{where}.{stat}", data[stat]) for stat in stats))


def _public_run(where: str, value: object, sources: Mapping[str, Source]) -> PublicRun:
    """One kept run: a GPUStack document's result block as kvsched runs it."""
    data = _fields(where, value, _RUN_FIELDS)
    doc = data["doc"]
    if doc not in sources:
        raise _fail(f"{where}.doc", doc, "must be one of the documents listed under documents")
    line = _count(f"{where}.line", data["line"], 1)
    command = _text(f"{where}.serve_command", data["serve_command"], r"vllm serve \S+.*")
    isl, osl, prompts = GPUSTACK_CASES[_case(f"{where}.case", data["case"])]
    measured = _measured(f"{where}.measured", data["measured"])
    hardware, system = GPUSTACK_HARDWARE[doc.split("/")[1].removesuffix(".md")]
    words = shlex.split(command)
    served = " ".join([words[2].split("/")[-1], *words[3:]])
    return PublicRun(f"gpustack/{doc.removesuffix('.md')}/random-{data['case']}: {served}", sources[doc],
                     line, command, hardware, system, "random", isl, osl, prompts, math.inf, None,
                     GPUSTACK_SEED, measured)


def _dropped(where: str, value: object) -> Dropped:
    data = _fields(where, value, _DROPPED_FIELDS)
    reason = data["reason"]
    if not isinstance(reason, str) or reason not in DROP_REASONS:
        raise _fail(f"{where}.reason", reason, f"must be one of {', '.join(DROP_REASONS)}")
    return Dropped(_text(f"{where}.doc", data["doc"], r"[a-z0-9.-]+/[a-z0-9]+\.md"),
                   _count(f"{where}.line", data["line"], 1), _case(f"{where}.case", data["case"]), reason,
                   _count(f"{where}.completed", data["completed"], 0),
                   _amount(f"{where}.output_share", data["output_share"], positive=False))


def read_transcribed(path: Path) -> Transcribed:
    """:data:`DATA_FILE`, every field checked; a fault names the place, the
    value and the rule."""
    where = str(path)
    data = _fields(where, parse_yaml(where, read_text(path, _MAX_DATA_BYTES, "the published runs (YAML)")),
                   ("repo", "commit", "license", "documents", "runs", "dropped"))
    repo = _text(f"{where}: repo", data["repo"], r"[\w.-]+/[\w.-]+")
    commit = _text(f"{where}: commit", data["commit"], r"[0-9a-f]{40}")
    license_name = _text(f"{where}: license", data["license"])
    documents = data["documents"]
    if not isinstance(documents, dict) or not documents:
        raise _fail(f"{where}: documents", documents, "must be a mapping of document paths to their facts")
    sources: dict[str, Source] = {}
    gpus_pattern = "|".join(GPUSTACK_HARDWARE)
    for doc, facts in documents.items():
        at = f"{where}: documents.{doc}"
        _text(at, doc, rf"[a-z0-9.-]+/({gpus_pattern})\.md")
        facts = _fields(at, facts, ("vllm_version", "gpus"))
        version = _text(f"{at}.vllm_version", facts["vllm_version"], r"\d+\.\d+\.\d+")
        sources[doc] = Source(f"GPUStack performance lab, {doc}", repo, _GPUSTACK_DOCS + doc, commit,
                              license_name, version, _text(f"{at}.gpus", facts["gpus"]))
    runs = tuple(_public_run(f"{where}: runs[{i}]", item, sources)
                 for i, item in enumerate(_items(f"{where}: runs", data["runs"])))
    dropped = tuple(_dropped(f"{where}: dropped[{i}]", item)
                    for i, item in enumerate(_items(f"{where}: dropped", data["dropped"])))
    seen: dict[tuple[str, int], str] = {}
    for place, doc, line in [(f"runs[{i}]", r.source.path.removeprefix(_GPUSTACK_DOCS), r.line)
                             for i, r in enumerate(runs)] + \
                            [(f"dropped[{i}]", d.doc, d.line) for i, d in enumerate(dropped)]:
        if (doc, line) in seen:
            raise UserInputError(f"{where}: {place}: {doc} line {line} is already {seen[doc, line]}; "
                                 "a result block is one run or one left-out result")
        seen[doc, line] = place
    return Transcribed(repo, commit, MappingProxyType(sources), runs, dropped)


# Read once, at import: the rows are this module's data.
_TRANSCRIBED = read_transcribed(DATA_FILE)
GPUSTACK_REPO = _TRANSCRIBED.repo
GPUSTACK_COMMIT = _TRANSCRIBED.commit
SOURCES: Mapping[str, Source] = _TRANSCRIBED.sources
RUNS: tuple[PublicRun, ...] = _TRANSCRIBED.runs
DROPPED: tuple[Dropped, ...] = _TRANSCRIBED.dropped


def dropped_url(d: Dropped) -> str:
    return f"https://github.com/{GPUSTACK_REPO}/blob/{GPUSTACK_COMMIT}/docs/performance-lab/{d.doc}#L{d.line}"


@dataclass(frozen=True, slots=True)
class RejectedSource:
    """A public source of vLLM serving numbers that gave no row, and why."""

    name: str
    where: str
    reason: str


REJECTED_SOURCES: tuple[RejectedSource, ...] = (
    RejectedSource(
        "GPUStack performance lab: ShareGPT runs and every SGLang / TensorRT-LLM run",
        f"github.com/{GPUSTACK_REPO} docs/performance-lab/",
        "ShareGPT is not available offline and the documents give only its totals, not a length "
        "distribution; the other engines are not vLLM"),
    RejectedSource(
        "GPUStack, 'Evaluating LMCache prefill acceleration in vLLM' (the runs without LMCache)",
        f"github.com/{GPUSTACK_REPO} docs/performance-lab/references/"
        "evaluating-lmcache-prefill-acceleration-in-vllm.md",
        "the 1K cache-miss run is stated in full (Qwen3-8B, RTX 4090 24GB, vLLM 0.10.1.1, random 1024/128 "
        "x 100, seed 40) but prints only mean TTFT / TPOT and throughputs, not vllm bench's full block: "
        "not added in this pass; the 8K and 20K runs do not state their number of prompts, and the "
        "cache-hit runs do not state how the prompts repeat"),
    RejectedSource(
        "Lambda, 'LLMs inference benchmarks, using vLLM, on Lambda Cloud'",
        "github.com/LambdaLabsML/vllm-benchmark (benchmark_v0.md, results/)",
        "vLLM 0.5.4 / 0.6.0 (the V0 engine, multi-step scheduling, chunked prefill off), which kvsched's "
        "v1 scheduler does not model; ShareGPT prompts (each result file does record every request's "
        "lengths, so the runs could be replayed with a V0 model)"),
    RejectedSource(
        "John Musgrave, 'vLLM throughput-latency sweep on NVIDIA A100'",
        "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
        "a complete configuration (A100 40GB, Llama-3.1-8B-Instruct, vLLM 0.23.0, random 1024/128 "
        "--ignore-eos, concurrency 1-64, 20 x C prompts) but the stored copy of the page ends before its "
        "results table, so no number could be read"),
    RejectedSource(
        "ai.wmx.dev benchmarks (vLLM 0.23.0 on one L4)",
        "https://ai.wmx.dev/benchmarks",
        "Qwen2.5-0.5B-Instruct is not in kvsched's catalog; the number of prompts is not stated in the "
        "part seen"),
    RejectedSource(
        "mushfiqrahman.dev, Mistral-7B-Instruct-v0.3 on an RTX 4090",
        "https://mushfiqrahman.dev/?p=1668",
        "Mistral-7B is not in kvsched's catalog and the vLLM version is not stated"),
    RejectedSource(
        "vLLM blog (v0.6.0 performance update) and vLLM's nightly / performance benchmarks",
        "blog.vllm.ai; vllm-project/vllm .buildkite/nightly-benchmarks",
        "not read beyond search excerpts in this pass; the nightly serving tables seen (a published copy: "
        "gist.github.com/surajssd/c8bbcb244b210a3607ad952a7bdda759, Azure ND A100 v4) use ShareGPT"),
    RejectedSource(
        "inference-sim ground truth (BLIS training data; sim-to-real-accuracy-validation)",
        "github.com/inference-sim/training default_args/; inference-sim/sim-to-real-accuracy-validation",
        "vLLM on H100 (vLLM 0.15.1 per the study) with full configurations, but the workloads are "
        "inference-perf's shared-prefix "
        "multi-turn chats at constant-rate stages, which kvsched's random builder cannot express as "
        "stated, and the models (Llama-2-7b/70b, CodeLlama-34b, Mixtral-8x7B) are not in kvsched's "
        "catalog; not mapped in this pass"),
)


# --------------------------------------------------------------------------
# Row -> kvsched run


@dataclass(frozen=True, slots=True)
class MappedRun:
    """A row as kvsched runs it: the engine arguments (its step-time backend
    left at "auto": kvsched's default pricing) and the notes on what had to
    be assumed."""

    run: PublicRun
    options: EngineOptions
    notes: tuple[str, ...]


_INT_FLAGS: Mapping[str, str] = {
    "-tp": "tensor_parallel_size", "--tensor-parallel-size": "tensor_parallel_size",
    "--max-model-len": "max_model_len", "--max-num-batched-tokens": "max_num_batched_tokens",
    "--max-num-seqs": "max_num_seqs"}
_BOOL_FLAGS: Mapping[str, str] = {
    "--async-scheduling": "async_scheduling", "--enable-expert-parallel": "enable_expert_parallel"}
# Flags with a value that change only the chat encoding of a request or the
# parsing of its answer, not the engine's scheduling or step times: read,
# noted, not modelled (the chat template's few tokens are not modelled either).
_CHAT_ONLY_FLAGS: Mapping[str, str] = {
    "--tokenizer-mode": "it picks how the chat messages are encoded into the prompt",
    "--reasoning-parser": "it splits the reasoning from the answer after generation"}


def _served(command: str) -> tuple[str, dict[str, int | bool], list[str]] | Refusal:
    """(model, engine fields, notes on the flags read but not modelled) of a
    ``vllm serve MODEL [flags]`` line."""
    words = shlex.split(command)
    if words[:2] != ["vllm", "serve"] or len(words) < 3:
        return Refusal("not a vllm serve command", command)
    fields: dict[str, int | bool] = {}
    notes: list[str] = []
    rest = iter(words[3:])
    for flag in rest:
        if flag in _BOOL_FLAGS:
            fields[_BOOL_FLAGS[flag]] = True
        elif flag in _INT_FLAGS:
            value = next(rest, "")
            if not re.fullmatch(r"\d+", value):
                return Refusal("server flag without a value", f"{flag} {value!r}")
            fields[_INT_FLAGS[flag]] = int(value)
        elif flag in _CHAT_ONLY_FLAGS:
            value = next(rest, "")
            if not value or value.startswith("-"):
                return Refusal("server flag without a value", f"{flag} {value!r}")
            notes.append(f"{flag} {value} not modelled: {_CHAT_ONLY_FLAGS[flag]}")
        else:
            return Refusal("server flag not mapped", flag)
    return words[2], fields, notes


def map_run(run: PublicRun) -> MappedRun | Refusal:
    """The kvsched engine arguments of ``run`` (vllm serve's defaults for what
    the command does not set), or why there are none."""
    served = _served(run.serve_command)
    if isinstance(served, Refusal):
        return served
    model, fields, notes = served
    catalog_model = SAME_ARCHITECTURE.get(model, model)
    if catalog_model != model:
        notes.append(f"{model} run as {catalog_model} (same architecture)")
    if not fields.get("async_scheduling"):
        notes.append(f"--async-scheduling not given: off (vLLM {run.vllm_version}'s default)")
    try:
        spec = get_model(catalog_model)
    except ValueError as err:
        return Refusal("model not found", str(err))
    block_size = MEASURED_BLOCK_SIZE
    kernel = model_kernel_block(spec, get_hardware(run.hardware).platform)
    if kernel is not None and block_size % kernel:
        # No --block-size: vLLM takes the smallest block its backends all read.
        block_size = math.lcm(block_size, kernel)
        notes.append(f"{block_size}-token KV blocks: the model's attention kernels read {kernel}-token "
                     "blocks (DeepSeek Sparse Attention's indexer on CUDA)")
    options = EngineOptions(
        # vLLM 0.10-0.13's cache defaults, pinned (silicon_rows.MEASURED_*).
        vllm_version=MEASURED_VLLM_VERSION, block_size=block_size,
        gpu_memory_utilization=MEASURED_GPU_MEMORY_UTILIZATION,
        model=catalog_model, hardware=run.hardware,
        tensor_parallel_size=int(fields.get("tensor_parallel_size", 1)),
        enable_expert_parallel=bool(fields.get("enable_expert_parallel", False)),
        max_num_seqs=_optional_int(fields.get("max_num_seqs")),
        max_num_batched_tokens=_optional_int(fields.get("max_num_batched_tokens")),
        max_model_len=_optional_int(fields.get("max_model_len")),
        async_scheduling=bool(fields.get("async_scheduling", False)),
        enable_prefix_caching=True)  # vLLM V1's default; the random prompts share no block
    return MappedRun(run, options, tuple(notes))


def _optional_int(value: int | bool | None) -> int | None:
    return None if value is None else int(value)


def build_run_deployment(mapped: MappedRun,
                         backend: str = "auto") -> tuple[Deployment, tuple[str, ...]] | Refusal:
    """The deployment of a mapped row priced by ``backend`` ("auto": the
    measured tables where they cover the model and GPU, else the roofline).

    When kvsched's KV cache cannot hold the model's full context, vllm serve
    would refuse to start without ``--max-model-len``; the source's server did
    start, so the run's longest request is used as ``max_model_len`` then,
    with a note (the KV capacity stays kvsched's)."""
    longest = mapped.run.prompt_tokens + mapped.run.output_len
    return deployment_within_context(mapped.options, backend, longest, "the longest request")


def build_workload(run: PublicRun) -> Workload:
    """``vllm bench serve --dataset-name random`` as the source ran it:
    every prompt the source's mean prompt length, every output
    ``--random-output-len`` (range ratio 0, vLLM's default), all sent at once
    (``--request-rate inf``) unless the source set a rate or a concurrency."""
    return random_workload(num_prompts=run.num_prompts, input_len=run.prompt_tokens,
                           output_len=run.output_len, range_ratio=0.0, request_rate=run.request_rate,
                           max_concurrency=run.max_concurrency, seed=run.seed)


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    """kvsched's prediction of a row."""

    pricing: str           # measured / roofline / roofline-fallback (kvsched.sim.pricing)
    step_times: str        # the pricing's own account
    deployment: str
    ttft: Latency
    tpot: Latency
    itl: Latency
    mean_e2e_ms: float
    output_throughput: float
    duration_s: float
    completed: int
    failed: int
    num_preemptions: int
    num_gpu_blocks: int
    notes: tuple[str, ...]
    wall_seconds: float


def _latency(metrics: Mapping[str, object], name: str) -> Latency:
    values = [metrics[f"{stat}_{name}_ms"] for stat in ("mean", "median", "p99")]
    return Latency(*(float(v) for v in values if isinstance(v, int | float)))


def simulate_run(run: PublicRun, backend: str = "auto") -> SimulatedRun | Refusal:
    """Simulate ``run`` through kvsched's runner (vLLM's router, no admission
    policy: one ``vllm serve``)."""
    t0 = time.perf_counter()
    mapped = map_run(run)
    if isinstance(mapped, Refusal):
        return mapped
    built = build_run_deployment(mapped, backend)
    if isinstance(built, Refusal):
        return built
    deployment, notes = built
    workload = build_workload(run)
    group = InstanceGroup(deployment.options)
    spec = RunSpec(DeploymentSpec((group,)))
    accepted, refused = accept(deployment, workload, workload.name)
    result: SimResult = serve(deployment, group, accepted, sim_config(deployment, spec), spec.options)
    result.failed.extend(refused)
    if not result.records:
        return Refusal("no request completed", f"{len(result.failed)} failed")
    m = result.metrics()
    priced = pricing_of(deployment)
    return SimulatedRun(
        pricing=priced.label, step_times=priced.detail, deployment=deployment.describe(),
        ttft=_latency(m, "ttft"), tpot=_latency(m, "tpot"), itl=_latency(m, "itl"),
        mean_e2e_ms=float(m["mean_e2el_ms"]), output_throughput=float(m["output_throughput"]),
        duration_s=float(m["duration"]), completed=int(m["completed"]), failed=len(result.failed),
        num_preemptions=result.num_preemptions, num_gpu_blocks=deployment.cache_config.num_gpu_blocks,
        notes=mapped.notes + notes, wall_seconds=time.perf_counter() - t0)


# --------------------------------------------------------------------------
# AIConfigurator's question

# AIConfigurator model ids for the served checkpoints (its bundled configs).
AIC_MODEL_PATHS: Mapping[str, str] = {
    "deepseek-ai/DeepSeek-R1": "deepseek-ai/DeepSeek-R1",
}
# (gemm, moe) quant labels; None: the checkpoint's own quantization config.
AIC_QUANT: Mapping[str, tuple[str | None, str | None]] = {
    "Qwen/Qwen3-235B-A22B-FP8": ("fp8", "fp8"),
}


def aic_batch_size(run: PublicRun, mapped: MappedRun) -> int:
    """The batch AIConfigurator is asked about: the requests in flight, i.e.
    the prompts (all sent at once, or the client's concurrency), capped by
    the engine's ``max_num_seqs`` (the command's, else vllm serve's default
    on the GPU). AIConfigurator's static batch has no queue, so on burst rows
    its TTFT leaves out the wait behind earlier prefills."""
    in_flight = run.num_prompts if run.max_concurrency is None else min(run.num_prompts, run.max_concurrency)
    seqs = mapped.options.max_num_seqs or serve_defaults(get_hardware(run.hardware))[1]
    return min(in_flight, seqs)


def aic_row(run: PublicRun) -> SiliconRow | Refusal:
    """The row as AIConfigurator's vLLM aggregated model reads it
    (:class:`~kvsched.validation.aic_estimate.AicEstimator` takes a
    silicon row): TP as served, no attention-DP, MoE experts split by TP
    (EP when the command enables it), ISL = the source's mean prompt length,
    OSL = --random-output-len, batch = :func:`aic_batch_size`."""
    mapped = map_run(run)
    if isinstance(mapped, Refusal):
        return mapped
    o = mapped.options
    gemm, moe = AIC_QUANT.get(o.model, (None, None))
    batch = aic_batch_size(run, mapped)
    tp = o.tensor_parallel_size
    moe_tp, moe_ep = (1, tp) if o.enable_expert_parallel else (tp, 1)
    return SiliconRow(
        id=run.id, source=run.url, backend_version=run.vllm_version,
        model_path=AIC_MODEL_PATHS.get(o.model, o.model), system=run.aic_system,
        precision=None if gemm is None else gemm, gemm_quant_mode=gemm, moe_quant_mode=moe,
        isl=run.prompt_tokens, osl=run.output_len, batch_size=batch, concurrency=batch,
        concurrency_stated=False, tp_size=tp, pp_size=1, attention_dp_size=1,
        moe_tp_size=moe_tp, moe_ep_size=moe_ep, ttft_ms=run.measured.ttft.mean,
        tpot_ms=run.measured.tpot.mean)
