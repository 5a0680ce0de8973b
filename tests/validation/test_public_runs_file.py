"""The published runs are a data file, read and checked once: a few rows
hold the documents' numbers (written here by hand), and a fault in the file
is refused naming the place, the value and the rule."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvsched.validation.public_runs import DATA_FILE, DROPPED, RUNS, SOURCES, read_transcribed


def test_rows_hold_the_documents_numbers() -> None:
    # DeepSeek-V3.2 on H200 (vLLM 0.13.0): the baseline's five random-dataset results are rows
    assert (len(RUNS), len(DROPPED), len(SOURCES)) == (24 + 5, 69 - 5, 9 + 1)
    first = RUNS[0]
    assert first.id == "gpustack/deepseek-r1/h200/random-32k: DeepSeek-R1-0528 -tp 8"
    assert first.url == ("https://github.com/gpustack/gpustack/blob/47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d/"
                         "docs/performance-lab/deepseek-r1/h200.md#L305")
    assert (first.hardware, first.aic_system, first.vllm_version) == ("h200", "h200_sxm", "0.11.0")
    assert (first.input_len, first.output_len, first.num_prompts, first.seed) == (32000, 100, 100, 42)
    assert first.request_rate == math.inf and first.max_concurrency is None
    m = first.measured
    assert (m.completed, m.duration_s) == (100, 206.9)
    assert (m.total_input_tokens, m.total_output_tokens) == (3199900, 10000)
    assert (m.output_throughput, m.total_token_throughput) == (48.33, 15514.57)
    assert (m.ttft.mean, m.ttft.median, m.ttft.p99) == (101351.99, 101163.8, 200267.68)
    assert (m.itl.mean, m.itl.median, m.itl.p99) == (362.2, 459.96, 614.75)
    tuned = [r for r in RUNS if r.line == 536]
    assert [r.serve_command for r in tuned] == [
        "vllm serve openai/gpt-oss-120b --max-model-len 32768 --async-scheduling "
        "--max-num-batched-tokens 4096"]
    assert tuned[0].source.gpus == "2 x NVIDIA A100 SXM 80GB GPUs on a single node"
    last = RUNS[-1].measured
    assert (last.tpot.mean, last.tpot.median, last.tpot.p99) == (1169.72, 1292.78, 1417.05)
    v32 = [r for r in RUNS if r.source.path.endswith("deepseek-v3.2/h200.md")]
    assert [(r.line, r.input_len, r.output_len, r.num_prompts) for r in v32] == [
        (877, 128, 4, 1000), (903, 2000, 100, 500), (929, 4000, 200, 500), (955, 32000, 100, 100),
        (981, 1000, 2000, 100)]
    assert {r.serve_command for r in v32} == {"vllm serve deepseek-ai/DeepSeek-V3.2 -tp 8 "
                                              "--tokenizer-mode deepseek_v32 --reasoning-parser deepseek_v3"}
    assert (v32[0].vllm_version, v32[0].source.gpus) == (
        "0.13.0", "8 x NVIDIA H200 SXM GPUs on a single node")
    heavy = v32[-1].measured   # "1k random input + 2k generation"
    assert (heavy.completed, heavy.duration_s, heavy.total_input_tokens, heavy.total_output_tokens) == (
        100, 96.39, 100000, 200000)
    assert (heavy.output_throughput, heavy.total_token_throughput) == (2075.01, 3112.52)
    assert (heavy.ttft.mean, heavy.ttft.median, heavy.ttft.p99) == (4789.20, 4590.83, 10608.88)
    assert (heavy.tpot.mean, heavy.tpot.median, heavy.tpot.p99) == (45.72, 45.83, 47.44)
    assert (heavy.itl.mean, heavy.itl.median, heavy.itl.p99) == (46.34, 43.13, 44.29)
    assert v32[3].measured.ttft.mean == 164003.81 and v32[0].measured.tpot.mean == 781.80
    assert not [d for d in DROPPED if d.doc == "deepseek-v3.2/h200.md"]
    failed = [d for d in DROPPED if d.reason == "failed"]
    assert [(d.doc, d.line, d.case, d.completed, d.output_share) for d in failed] == [
        ("qwen3-235b-a22b/h100.md", 412, "128", 984, 0.984),
        ("qwen3-235b-a22b/h100.md", 520, "128", 984, 0.984)]


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = DATA_FILE.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "runs.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path


@pytest.mark.parametrize(("old", "new", "needles"), [
    ("      duration_s: 206.9\n", "      duration_s: -206.9\n",
     ("runs[0].measured.duration_s=-206.9", "positive number")),
    ("    case: \"32k\"\n", "    case: 32000\n", ("runs[0].case=32000", "'32k'", "quoted")),
    ("    line: 305\n", "    line: 305\n    lines: 306\n", ("runs[0]", "unknown lines")),
    ("{mean: 101351.99, median: 101163.8, p99: 200267.68}", "{mean: 101351.99, median: 101163.8}",
     ("runs[0].measured.ttft", "missing p99")),
    ("  - doc: deepseek-r1/h200.md\n", "  - doc: deepseek-r1/h300.md\n",
     ("runs[0].doc='deepseek-r1/h300.md'", "documents")),
    ("line: 333, case: \"32k\", reason: glm-copy", "line: 333, case: \"32k\", reason: sparse",
     ("dropped[0].reason='sparse'", "short")),
    ("{doc: glm-4.5-air/a100.md, line: 333,", "{doc: deepseek-r1/h200.md, line: 305,",
     ("dropped[0]: deepseek-r1/h200.md line 305 is already runs[0]",)),
    ("commit: 47277d79f4a5bae12a2d25e9ecbed2a2177a5f2d", "commit: main", ("commit='main'", "[0-9a-f]{40}")),
])
def test_faults_are_refused_naming_the_place(tmp_path: Path, old: str, new: str,
                                             needles: tuple[str, ...]) -> None:
    path = _broken(tmp_path, old, new)
    with pytest.raises(ValueError) as info:
        read_transcribed(path)
    for needle in (str(path), *needles):
        assert needle in str(info.value), str(info.value)


def test_the_file_reads_to_the_module_data(tmp_path: Path) -> None:
    again = read_transcribed(_broken(tmp_path, "repo:", "repo:"))
    assert (again.runs, again.dropped, dict(again.sources)) == (RUNS, DROPPED, dict(SOURCES))
