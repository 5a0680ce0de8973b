"""Real vLLM serving runs published with their configuration: a held-out judge.

Every row here is a ``vllm bench serve`` result that someone published with
the server command, the GPU, the vLLM version and the benchmark's dataset
flags, so that kvsched can run the same thing (:func:`simulate_run`) and
AIConfigurator can be asked about it (:func:`aic_row`). The numbers are
transcribed with their source (repository, path, commit, line); nothing in
kvsched is fitted or tuned on them. ``benchmarks/validate_public.py``
simulates every row and writes docs/public_runs.md.

Source so far: GPUStack's "performance lab" (github.com/gpustack/gpustack,
``docs/performance-lab/<model>/<gpu>.md``, Apache-2.0): for each model and
GPU a baseline ``vllm serve`` run (and sometimes a tuned one) measured with
``vllm bench serve --backend openai-chat --endpoint /v1/chat/completions
--dataset-name random --random-input-len I --random-output-len O
--num-prompts N --seed 42`` at ``--request-rate inf`` (every request sent at
once, no ``--max-concurrency``): I/O = 32000/100 (N=100), 4000/200 (N=500),
2000/100 (N=500) and 128/4 (N=1000). The documents print that command for
the 4000/200 case; the other cases are taken to differ only in the lengths
and N (their printed request counts and token totals agree).

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
its shared start.
"""

from __future__ import annotations

import math
import re
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass

from kvsched.perf.hardware import get_hardware
from kvsched.sim.deployment import Deployment, EngineOptions, serve_defaults
from kvsched.sim.pricing import pricing_of
from kvsched.sim.rank import SimResult
from kvsched.sim.run import accept, serve, sim_config
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec
from kvsched.sim.workload import Workload, random_workload
from kvsched.validation.silicon import deployment_within_context
from kvsched.validation.silicon_rows import Refusal, SiliconRow

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


GPUSTACK_REPO = "gpustack/gpustack"
GPUSTACK_COMMIT = "47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d"  # 2026-08-21


def _gpustack_source(doc: str, vllm_version: str, gpus: str) -> Source:
    return Source(f"GPUStack performance lab, {doc}", GPUSTACK_REPO, f"docs/performance-lab/{doc}",
                  GPUSTACK_COMMIT, "Apache-2.0", vllm_version, gpus)


SOURCES: Mapping[str, Source] = {s.path.removeprefix("docs/performance-lab/"): s for s in (
    _gpustack_source("deepseek-r1/h200.md", "0.11.0", "8 x NVIDIA H200 SXM GPUs on a single node"),
    _gpustack_source("gpt-oss-120b/a100.md", "0.11.0", "2 x NVIDIA A100 SXM 80GB GPUs on a single node"),
    _gpustack_source("gpt-oss-120b/h100.md", "0.10.2", "2 x NVIDIA H100 SXM GPUs on a single node"),
    _gpustack_source("gpt-oss-20b/a100.md", "0.11.0", "A single NVIDIA A100 SXM 80GB GPU"),
    _gpustack_source("gpt-oss-20b/h100.md", "0.11.0", "A single NVIDIA H100 SXM GPU"),
    _gpustack_source("qwen3-235b-a22b/a100.md", "0.11.0", "8 x NVIDIA A100 SXM 80GB GPUs on a single node"),
    _gpustack_source("qwen3-235b-a22b/h100.md", "0.11.0", "8 x NVIDIA H100 SXM GPUs on a single node"),
    _gpustack_source("qwen3-32b/a100.md", "0.11.0", "A single NVIDIA A100 SXM 80GB GPU"),
    _gpustack_source("qwen3-32b/h100.md", "0.11.0", "A single NVIDIA H100 SXM GPU"),
)}
# The GPU each document ran on, as kvsched's hardware id and AIConfigurator's system.
GPUSTACK_HARDWARE: Mapping[str, tuple[str, str]] = {
    "a100": ("a100-80gb", "a100_sxm"), "h100": ("h100-sxm", "h100_sxm"), "h200": ("h200", "h200_sxm")}

# The documents' random-dataset cases: (input, output tokens, prompts).
GPUSTACK_CASES: Mapping[str, tuple[int, int, int]] = {
    "32k": (32000, 100, 100), "4k": (4000, 200, 500), "2k": (2000, 100, 500), "128": (128, 4, 1000)}
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


def _m(completed: int, duration: float, total_in: int, total_out: int, out_tput: float, total_tput: float,
       ttft: tuple[float, float, float], tpot: tuple[float, float, float],
       itl: tuple[float, float, float]) -> Measured:
    return Measured(completed, duration, total_in, total_out, out_tput, total_tput,
                    Latency(*ttft), Latency(*tpot), Latency(*itl))


def _gpustack(doc: str, line: int, serve_command: str, case: str, measured: Measured) -> PublicRun:
    source = SOURCES[doc]
    gpu = doc.split("/")[1].removesuffix(".md")
    hardware, system = GPUSTACK_HARDWARE[gpu]
    isl, osl, prompts = GPUSTACK_CASES[case]
    words = shlex.split(serve_command)
    served = " ".join([words[2].split("/")[-1], *words[3:]])
    return PublicRun(f"gpustack/{doc.removesuffix('.md')}/random-{case}: {served}", source, line,
                     serve_command, hardware, system, "random", isl, osl, prompts, math.inf, None,
                     GPUSTACK_SEED, measured)


# Transcribed from the documents at GPUSTACK_COMMIT (the "Other Benchmark
# Cases" blocks: each is the run of the "Baseline" or "Optimized" serving
# script above it). Latencies are (mean, median, p99) in ms.
RUNS: tuple[PublicRun, ...] = (
    _gpustack('deepseek-r1/h200.md', 305, 'vllm serve deepseek-ai/DeepSeek-R1-0528 -tp 8', '32k',
              _m(100, 206.9, 3199900, 10000, 48.33, 15514.57,
                 (101351.99, 101163.8, 200267.68),
                 (365.79, 400.72, 404.78), (362.2, 459.96, 614.75))),
    _gpustack('deepseek-r1/h200.md', 330, 'vllm serve deepseek-ai/DeepSeek-R1-0528 -tp 8', '4k',
              _m(500, 132.68, 1997530, 100000, 753.67, 15808.55,
                 (63058.71, 61952.74, 124112.96),
                 (164.23, 177.37, 195.8), (163.74, 57.87, 383.79))),
    _gpustack('deepseek-r1/h200.md', 355, 'vllm serve deepseek-ai/DeepSeek-R1-0528 -tp 8', '2k',
              _m(500, 59.26, 998393, 50000, 843.71, 17690.89,
                 (28911.9, 27559.21, 53497.07),
                 (237.02, 276.56, 322.76), (235.1, 357.74, 379.46))),
    _gpustack('deepseek-r1/h200.md', 380, 'vllm serve deepseek-ai/DeepSeek-R1-0528 -tp 8', '128',
              _m(1000, 22.07, 126882, 4000, 181.27, 5931.25,
                 (19392.11, 18992.42, 21440.63),
                 (351.83, 389.74, 432.12), (263.87, 368.43, 470.22))),
    _gpustack('gpt-oss-120b/a100.md', 327, 'vllm serve openai/gpt-oss-120b --max-model-len 32768', '32k',
              _m(100, 740.1, 3200000, 9988, 13.5, 4337.21,
                 (368856.64, 368713.3, 730947.33),
                 (224.58, 228.19, 231.28), (233.21, 24.23, 676.79))),
    _gpustack('gpt-oss-120b/a100.md', 402, 'vllm serve openai/gpt-oss-120b --max-model-len 32768', '128',
              _m(1000, 14.09, 127755, 4000, 283.95, 9353.12,
                 (7813.18, 7750.58, 13935.99),
                 (182.75, 189.53, 193.12), (274.25, 196.02, 386.54))),
    _gpustack('gpt-oss-120b/a100.md', 536,
              'vllm serve openai/gpt-oss-120b --max-model-len 32768 --async-scheduling '
              '--max-num-batched-tokens 4096',
              '128',
              _m(1000, 12.22, 127755, 4000, 327.44, 10785.6,
                 (6900.44, 6888.59, 11990.0),
                 (301.66, 320.19, 323.93), (452.71, 327.62, 652.15))),
    _gpustack('gpt-oss-120b/h100.md', 453, 'vllm serve openai/gpt-oss-120b --max-model-len 32768', '128',
              _m(1000, 7.72, 127755, 4000, 517.91, 17059.15,
                 (4850.46, 4987.41, 7372.98),
                 (304.8, 341.94, 360.4), (467.0, 352.58, 728.75))),
    _gpustack('gpt-oss-120b/h100.md', 508, 'vllm serve openai/gpt-oss-120b --async-scheduling -tp 2', '32k',
              _m(100, 98.86, 3200000, 9955, 100.7, 32471.01,
                 (48826.05, 48671.0, 96651.74),
                 (220.32, 252.27, 252.79), (228.81, 246.94, 481.43))),
    _gpustack('gpt-oss-120b/h100.md', 577, 'vllm serve openai/gpt-oss-120b --async-scheduling -tp 2', '128',
              _m(1000, 4.18, 127755, 4000, 956.85, 31517.47,
                 (2800.15, 2412.28, 3856.95),
                 (183.05, 208.66, 232.15), (274.85, 267.83, 506.27))),
    _gpustack('gpt-oss-20b/a100.md', 348, 'vllm serve openai/gpt-oss-20b', '128',
              _m(1000, 5.44, 127755, 4000, 735.4, 24223.22,
                 (2774.46, 1971.28, 5298.6),
                 (62.1, 65.44, 106.62), (100.2, 105.43, 213.73))),
    _gpustack('gpt-oss-20b/a100.md', 456, 'vllm serve openai/gpt-oss-20b --async-scheduling', '128',
              _m(1000, 5.23, 127755, 4000, 764.23, 25172.82,
                 (2682.01, 1944.72, 5078.68),
                 (55.31, 46.59, 102.22), (85.84, 100.82, 205.12))),
    _gpustack('gpt-oss-20b/h100.md', 337, 'vllm serve openai/gpt-oss-20b', '128',
              _m(1000, 4.7, 127755, 4000, 851.04, 28032.23,
                 (3174.14, 2892.24, 4415.25),
                 (178.91, 208.03, 246.08), (274.82, 228.45, 509.42))),
    _gpustack('gpt-oss-20b/h100.md', 443, 'vllm serve openai/gpt-oss-20b --async-scheduling', '128',
              _m(1000, 4.04, 127755, 4000, 990.08, 32611.91,
                 (2884.78, 2641.45, 3879.45),
                 (75.14, 16.98, 221.6), (156.1, 151.36, 452.14))),
    _gpustack('qwen3-235b-a22b/a100.md', 388, 'vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507 -tp 8', '2k',
              _m(500, 112.15, 998175, 49632, 442.54, 9342.67,
                 (54722.5, 54532.6, 106756.03),
                 (190.79, 208.61, 209.09), (189.23, 208.52, 211.58))),
    _gpustack('qwen3-235b-a22b/a100.md', 413, 'vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507 -tp 8', '128',
              _m(1000, 17.68, 127698, 4000, 226.26, 7449.43,
                 (12767.63, 12409.68, 17339.37),
                 (155.16, 158.22, 168.04), (116.37, 157.64, 179.04))),
    _gpustack('qwen3-235b-a22b/a100.md', 521,
              'vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 -tp 4', '128',
              _m(1000, 26.54, 127698, 4000, 150.7, 4961.66,
                 (17260.17, 17240.71, 26154.32),
                 (265.87, 272.95, 278.77), (199.4, 272.5, 288.23))),
    _gpustack('qwen3-235b-a22b/h100.md', 387, 'vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507 -tp 8', '2k',
              _m(500, 43.91, 998175, 49500, 1127.26, 23858.69,
                 (21313.79, 20242.32, 40939.0),
                 (101.08, 108.64, 125.24), (100.16, 35.94, 244.64))),
    _gpustack('qwen3-32b/a100.md', 378, 'vllm serve Qwen/Qwen3-32B', '4k',
              _m(500, 1141.94, 1997942, 99893, 87.48, 1837.08,
                 (566579.7, 564705.97, 1116945.95),
                 (96.19, 96.4, 99.35), (95.82, 51.55, 628.61))),
    _gpustack('qwen3-32b/a100.md', 403, 'vllm serve Qwen/Qwen3-32B', '2k',
              _m(500, 415.71, 998175, 50000, 120.27, 2521.38,
                 (208397.03, 209108.79, 408103.76),
                 (143.23, 143.96, 166.03), (142.07, 51.49, 590.04))),
    _gpustack('qwen3-32b/a100.md', 428, 'vllm serve Qwen/Qwen3-32B', '128',
              _m(1000, 49.57, 127698, 4000, 80.69, 2656.71,
                 (31177.64, 31073.76, 48960.57),
                 (528.57, 544.55, 547.31), (396.42, 543.22, 554.84))),
    _gpustack('qwen3-32b/h100.md', 296, 'vllm serve Qwen/Qwen3-32B', '4k',
              _m(500, 976.29, 1997942, 99790, 102.21, 2148.69,
                 (482284.21, 483375.28, 956141.26),
                 (66.61, 62.08, 100.86), (66.29, 43.38, 1395.23))),
    _gpustack('qwen3-32b/h100.md', 321, 'vllm serve Qwen/Qwen3-32B', '2k',
              _m(500, 328.04, 998175, 50000, 152.42, 3195.3,
                 (163909.4, 164148.38, 322980.86),
                 (86.62, 84.24, 131.41), (85.97, 44.8, 1462.05))),
    _gpustack('qwen3-32b/h100.md', 346, 'vllm serve Qwen/Qwen3-32B', '128',
              _m(1000, 32.88, 127698, 4000, 121.66, 4005.62,
                 (21648.67, 21342.36, 32678.31),
                 (1169.72, 1292.78, 1417.05), (877.29, 1141.11, 1435.8))),
)


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
    "dsa": "DeepSeek-V3.2: sparse attention, which kvsched refuses",
    "ascend": "Ascend 910B with vLLM-Ascend, not vLLM on NVIDIA GPUs",
    "glm-copy": "GLM-4.5-Air: the A100 and H100 documents print identical numbers for every case (a copy), "
                "and the model is not in kvsched's catalog",
}

DROPPED: tuple[Dropped, ...] = (
    Dropped('deepseek-v3.2/h200.md', 877, '128', 'dsa', 1000, 1.0),
    Dropped('deepseek-v3.2/h200.md', 903, '2k', 'dsa', 500, 1.0),
    Dropped('deepseek-v3.2/h200.md', 929, '4k', 'dsa', 500, 1.0),
    Dropped('deepseek-v3.2/h200.md', 955, '32k', 'dsa', 100, 1.0),
    Dropped('deepseek-v3.2/h200.md', 981, '32k', 'dsa', 100, 20.0),
    Dropped('glm-4.5-air/a100.md', 333, '32k', 'glm-copy', 100, 0.9987),
    Dropped('glm-4.5-air/a100.md', 358, '4k', 'glm-copy', 500, 0.9955),
    Dropped('glm-4.5-air/a100.md', 383, '2k', 'glm-copy', 500, 1.0),
    Dropped('glm-4.5-air/a100.md', 408, '128', 'glm-copy', 1000, 1.0),
    Dropped('glm-4.5-air/h100.md', 337, '32k', 'glm-copy', 100, 0.9987),
    Dropped('glm-4.5-air/h100.md', 362, '4k', 'glm-copy', 500, 0.9955),
    Dropped('glm-4.5-air/h100.md', 387, '2k', 'glm-copy', 500, 1.0),
    Dropped('glm-4.5-air/h100.md', 412, '128', 'glm-copy', 1000, 1.0),
    Dropped('glm-4.x/h200.md', 305, '32k', 'catalog', 100, 0.9406),
    Dropped('glm-4.x/h200.md', 330, '4k', 'catalog', 500, 0.998),
    Dropped('glm-4.x/h200.md', 355, '2k', 'catalog', 500, 1.0),
    Dropped('glm-4.x/h200.md', 380, '128', 'catalog', 1000, 1.0),
    Dropped('gpt-oss-120b/a100.md', 352, '4k', 'short', 500, 0.6726),
    Dropped('gpt-oss-120b/a100.md', 377, '2k', 'short', 500, 0.9796),
    Dropped('gpt-oss-120b/a100.md', 461, '32k', 'short', 100, 0.9828),
    Dropped('gpt-oss-120b/a100.md', 486, '4k', 'short', 500, 0.6806),
    Dropped('gpt-oss-120b/a100.md', 511, '2k', 'short', 500, 0.9821),
    Dropped('gpt-oss-120b/h100.md', 384, '32k', 'short', 100, 0.9877),
    Dropped('gpt-oss-120b/h100.md', 407, '4k', 'short', 500, 0.6721),
    Dropped('gpt-oss-120b/h100.md', 430, '2k', 'short', 500, 0.9839),
    Dropped('gpt-oss-120b/h100.md', 531, '4k', 'short', 500, 0.6805),
    Dropped('gpt-oss-120b/h100.md', 554, '2k', 'short', 500, 0.9812),
    Dropped('gpt-oss-20b/a100.md', 273, '32k', 'short', 100, 0.9533),
    Dropped('gpt-oss-20b/a100.md', 298, '4k', 'short', 500, 0.5353),
    Dropped('gpt-oss-20b/a100.md', 323, '2k', 'short', 500, 0.9445),
    Dropped('gpt-oss-20b/a100.md', 381, '32k', 'short', 100, 0.9394),
    Dropped('gpt-oss-20b/a100.md', 406, '4k', 'short', 500, 0.5286),
    Dropped('gpt-oss-20b/a100.md', 431, '2k', 'short', 500, 0.9392),
    Dropped('gpt-oss-20b/h100.md', 268, '32k', 'short', 100, 0.935),
    Dropped('gpt-oss-20b/h100.md', 291, '4k', 'short', 500, 0.5231),
    Dropped('gpt-oss-20b/h100.md', 314, '2k', 'short', 500, 0.9404),
    Dropped('gpt-oss-20b/h100.md', 368, '32k', 'short', 100, 0.9404),
    Dropped('gpt-oss-20b/h100.md', 393, '4k', 'short', 500, 0.5297),
    Dropped('gpt-oss-20b/h100.md', 418, '2k', 'short', 500, 0.9363),
    Dropped('qwen3-14b/a100.md', 353, '32k', 'catalog', 100, 0.9891),
    Dropped('qwen3-14b/a100.md', 378, '4k', 'catalog', 500, 0.9978),
    Dropped('qwen3-14b/a100.md', 403, '2k', 'catalog', 500, 1.0),
    Dropped('qwen3-14b/a100.md', 428, '128', 'catalog', 1000, 1.0),
    Dropped('qwen3-14b/h100.md', 322, '32k', 'catalog', 100, 0.9855),
    Dropped('qwen3-14b/h100.md', 347, '4k', 'catalog', 500, 0.998),
    Dropped('qwen3-14b/h100.md', 372, '2k', 'catalog', 500, 1.0),
    Dropped('qwen3-14b/h100.md', 397, '128', 'catalog', 1000, 1.0),
    Dropped('qwen3-235b-a22b/a100.md', 338, '32k', 'short', 100, 0.8191),
    Dropped('qwen3-235b-a22b/a100.md', 363, '4k', 'short', 500, 0.9135),
    Dropped('qwen3-235b-a22b/a100.md', 446, '32k', 'short', 100, 0.83),
    Dropped('qwen3-235b-a22b/a100.md', 471, '4k', 'short', 500, 0.9039),
    Dropped('qwen3-235b-a22b/a100.md', 496, '2k', 'short', 500, 0.9899),
    Dropped('qwen3-235b-a22b/h100.md', 337, '32k', 'short', 100, 0.8191),
    Dropped('qwen3-235b-a22b/h100.md', 362, '4k', 'short', 500, 0.9218),
    Dropped('qwen3-235b-a22b/h100.md', 412, '128', 'failed', 984, 0.984),
    Dropped('qwen3-235b-a22b/h100.md', 445, '32k', 'short', 100, 0.8281),
    Dropped('qwen3-235b-a22b/h100.md', 470, '4k', 'short', 500, 0.9097),
    Dropped('qwen3-235b-a22b/h100.md', 495, '2k', 'short', 500, 0.9894),
    Dropped('qwen3-235b-a22b/h100.md', 520, '128', 'failed', 984, 0.984),
    Dropped('qwen3-30b-a3b/910b.md', 221, '32k', 'ascend', 100, 1.0),
    Dropped('qwen3-30b-a3b/910b.md', 246, '4k', 'ascend', 500, 0.9984),
    Dropped('qwen3-30b-a3b/910b.md', 271, '2k', 'ascend', 500, 1.0),
    Dropped('qwen3-30b-a3b/910b.md', 296, '128', 'ascend', 1000, 1.0),
    Dropped('qwen3-32b/a100.md', 353, '32k', 'short', 100, 0.7699),
    Dropped('qwen3-32b/h100.md', 271, '32k', 'short', 100, 0.7681),
    Dropped('qwen3-8b/910b.md', 279, '32k', 'ascend', 100, 1.0),
    Dropped('qwen3-8b/910b.md', 304, '4k', 'ascend', 500, 0.9981),
    Dropped('qwen3-8b/910b.md', 329, '2k', 'ascend', 500, 1.0),
    Dropped('qwen3-8b/910b.md', 354, '128', 'ascend', 1000, 1.0),
)


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


def _served(command: str) -> tuple[str, dict[str, int | bool]] | Refusal:
    """(model, engine fields) of a ``vllm serve MODEL [flags]`` line."""
    words = shlex.split(command)
    if words[:2] != ["vllm", "serve"] or len(words) < 3:
        return Refusal("not a vllm serve command", command)
    fields: dict[str, int | bool] = {}
    rest = iter(words[3:])
    for flag in rest:
        if flag in _BOOL_FLAGS:
            fields[_BOOL_FLAGS[flag]] = True
        elif flag in _INT_FLAGS:
            value = next(rest, "")
            if not re.fullmatch(r"\d+", value):
                return Refusal("server flag without a value", f"{flag} {value!r}")
            fields[_INT_FLAGS[flag]] = int(value)
        else:
            return Refusal("server flag not mapped", flag)
    return words[2], fields


def map_run(run: PublicRun) -> MappedRun | Refusal:
    """The kvsched engine arguments of ``run`` (vllm serve's defaults for what
    the command does not set), or why there are none."""
    served = _served(run.serve_command)
    if isinstance(served, Refusal):
        return served
    model, fields = served
    notes: list[str] = []
    catalog_model = SAME_ARCHITECTURE.get(model, model)
    if catalog_model != model:
        notes.append(f"{model} run as {catalog_model} (same architecture)")
    if not fields.get("async_scheduling"):
        notes.append(f"--async-scheduling not given: off (vLLM {run.vllm_version}'s default)")
    options = EngineOptions(
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
    built = deployment_within_context(mapped.options, backend, longest)
    if isinstance(built, Refusal):
        return built
    deployment, first = built
    if first is None:
        return deployment, ()
    return deployment, (f"max_model_len {longest} (the longest request): kvsched's KV cache cannot hold the "
                        f"model's context ({first.split(';')[0]}), though the real server started",)


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
