"""File fuzzer for the spec files of ``kvsched simulate`` (issue 11): a Hugging
Face config.json (``--model PATH``), a hardware file (``--hardware FILE``) and
an efficiency file (``--efficiency-file FILE``), each made valid here (never
downloaded) and corrupted at random, as JSON or YAML where the reader takes
both: truncation, bad bytes and invalid UTF-8, huge, negative and non-finite
numbers, wrong types, missing, extra, misspelled and duplicate keys. The
corruptions, the worker and its limits (2 s and 200 MB per case, in a child
process) are tests/test_replay_fuzz.py's. Each file goes through
``kvsched.cli.main(["simulate", ...])`` in-process: it simulates (exit 0) or
gives exit status 2 with one ``kvsched: error:`` line naming the file.

A config.json that reads correctly can still describe a model that does not
fit the GPU or whose heads a flag does not divide; those errors name the
model, whose name is the config's directory (``fuzzmodel``), so for this
format the line must name that directory.

KVSCHED_FILE_FUZZ_CASES sets the cases per format (default 300, ~2 s per
format); KVSCHED_FILE_FUZZ_SEED the seed (default 0).
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_replay_fuzz import (
    Pairs,
    assert_clean,
    check_cli,
    corrupt,
    dumps,
    run_in_subprocess,
    run_worker,
)

from kvsched.perf.hardware import HARDWARE

FORMATS = ("config", "hardware", "efficiency")
COMMON = ["--no-progress", "--step-time-backend", "roofline", "--num-prompts", "2"]
SMALL_RUN = [*COMMON, "--random-input-len", "32", "--random-output-len", "4"]
MODEL_DIR = "fuzzmodel"

# --------------------------------------------------------------------------
# Valid files

_ATTN = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "vocab_size": 32000,
         "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}
CONFIGS: list[dict[str, Any]] = [
    {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **_ATTN, "num_key_value_heads": 4,
     "intermediate_size": 4096, "hidden_act": "silu", "rope_theta": 500000.0, "mlp_bias": False,
     "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 4096}},
    {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **_ATTN, "num_key_value_heads": 8,
     "head_dim": 128, "intermediate_size": 3072, "attention_bias": False, "use_sliding_window": False,
     "sliding_window": None, "max_window_layers": 4, "tie_word_embeddings": True},
    {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **_ATTN, "num_key_value_heads": 2,
     "intermediate_size": 2816, "use_sliding_window": True, "sliding_window": 1024,
     "max_window_layers": 2},
    {"architectures": ["MistralForCausalLM"], "model_type": "mistral", **_ATTN, "num_key_value_heads": 8,
     "intermediate_size": 3584, "sliding_window": 2048,
     "layer_types": ["sliding_attention", "full_attention"] * 2},
    {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", **_ATTN, "num_key_value_heads": 8,
     "intermediate_size": 1792, "num_local_experts": 8, "num_experts_per_tok": 2},
    {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", **_ATTN,
     "num_key_value_heads": 4, "head_dim": 64, "intermediate_size": 3072, "num_experts": 16,
     "num_experts_per_tok": 4, "moe_intermediate_size": 384, "decoder_sparse_step": 1,
     "mlp_only_layers": [0]},
    {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **_ATTN,
     "num_key_value_heads": 16, "intermediate_size": 2816, "q_lora_rank": 384, "kv_lora_rank": 256,
     "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64, "n_routed_experts": 16,
     "n_shared_experts": 1, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
     "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "noaux_tc"},
    {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", **_ATTN, "num_key_value_heads": 4,
     "head_dim": 64, "intermediate_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2,
     "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 2},
    {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 1024, "n_head": 16,
     "n_layer": 4, "vocab_size": 32000, "seq_length": 2048},
]
# A small model for the hardware and efficiency cases: the device decides.
TINY = dict(CONFIGS[0], hidden_size=256, intermediate_size=512, num_attention_heads=4,
            num_key_value_heads=2, num_hidden_layers=2)


def hardware_entry(rng: random.Random) -> dict[str, Any]:
    hw = HARDWARE[rng.choice(sorted(HARDWARE))]
    data = {k: v for k, v in dataclasses.asdict(hw).items() if v is not None or k == "fp8_flops"}
    data["id"] = f"{hw.id}-file"
    if rng.random() < 0.5:
        del data["source"]
        del data["notes"]
    return data


def efficiency_entry(rng: random.Random) -> dict[str, Any]:
    fields = {"gemm_mfu": 0.7, "fp8_gemm_mfu": 0.5, "weight_bw_frac": 0.85, "attn_bw_frac": 0.8,
              "prefill_attn_mfu": 0.5, "comm_bw_frac": 0.6, "comm_latency_s": 8e-6}
    data: dict[str, Any] = {k: v for k, v in fields.items() if rng.random() < 0.4}
    for device in rng.sample([rng.choice(["h100-sxm", "H100"]), "b200", "a100", "mi300x"], rng.randint(0, 2)):
        data[device] = {k: round(v * rng.uniform(0.8, 1.0), 3) for k, v in fields.items()
                        if rng.random() < 0.3}
    return data


def yaml_text(value: Any) -> str:
    """Block-style YAML with JSON scalars (valid YAML); Pairs keep repeated keys."""
    if not isinstance(value, dict | Pairs) or not value:
        return dumps(value) + "\n"
    lines = []
    for key, item in (value if isinstance(value, Pairs) else value.items()):
        if isinstance(item, dict | Pairs) and item:
            lines.append(f"{json.dumps(key)}:")
            lines.extend("  " + line for line in yaml_text(item).splitlines())
        else:
            lines.append(f"{json.dumps(key)}: {dumps(item)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Cases


def _write_tiny(folder: Path) -> Path:
    directory = folder / "tiny"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY))
    return directory


def file_context(data: bytes) -> int:
    """The context a run asks for: 1024 tokens, or the file's own context when
    that is a shorter valid one. A run asking for more than the model holds is
    refused for the flag or the workload, not for the file, so the run fits
    what the file says (out-of-range values are the reader's to refuse)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return 1024
    if not isinstance(obj, dict):
        return 1024
    keys = ("seq_length", "max_position_embeddings") if obj.get("model_type") == "bloom" \
        else ("max_position_embeddings",)
    value = next((obj[k] for k in keys if obj.get(k) is not None), None)
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value < 1024:
        return value
    return 1024


def config_case(rng: random.Random, folder: Path) -> tuple[list[str], str, str]:
    seed = rng.choice(CONFIGS)
    data, note = corrupt(rng, seed)
    while file_context(data) < 2:  # a 1-token context holds no request at all: drawn again
        data, note = corrupt(rng, seed)
    context = file_context(data)
    prompt = min(32, context // 2)
    directory = folder / MODEL_DIR
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_bytes(data)
    target = str(directory / "config.json") if rng.random() < 0.5 else str(directory)
    argv = ["simulate", *COMMON, "--random-input-len", str(prompt), "--random-output-len",
            str(min(4, context - prompt)), "--model", target, "--hardware", "b200",
            "--max-model-len", str(context), "--num-gpu-blocks-override", "4096"]
    return argv, MODEL_DIR, f"{seed['model_type']}: {note}"


def _spec_file(rng: random.Random, folder: Path, obj: dict[str, Any]) -> tuple[Path, str]:
    as_yaml = rng.random() < 0.5
    data, note = corrupt(rng, obj, yaml_text if as_yaml else dumps)
    path = folder / ("spec.yaml" if as_yaml else "spec.json")
    path.write_bytes(data)
    return path, note


def hardware_case(rng: random.Random, folder: Path) -> tuple[list[str], str, str]:
    path, note = _spec_file(rng, folder, hardware_entry(rng))
    # A tiny model and a fixed KV cache: any device within the bounds runs it.
    argv = ["simulate", *SMALL_RUN, "--model", str(folder / "tiny"), "--hardware", str(path),
            "--max-model-len", "1024", "--num-gpu-blocks-override", "1024"]
    return argv, str(path), note


def efficiency_case(rng: random.Random, folder: Path) -> tuple[list[str], str, str]:
    path, note = _spec_file(rng, folder, efficiency_entry(rng))
    hardware = rng.choice(["h100-sxm", "b200", str(folder / "dev.json")])
    argv = ["simulate", *SMALL_RUN, "--model", str(folder / "tiny"), "--hardware", hardware,
            "--efficiency-file", str(path), "--num-gpu-blocks-override", "1024", "--max-model-len", "1024"]
    return argv, str(path), f"on {Path(hardware).name}: {note}"


CASES = {"config": config_case, "hardware": hardware_case, "efficiency": efficiency_case}


def warm_up(folder: Path) -> None:
    tiny = _write_tiny(folder)
    device = dict(hardware_entry(random.Random(0)), id="my-gpu")
    (folder / "dev.json").write_text(json.dumps(device))
    argv = ["simulate", *SMALL_RUN, "--model", str(tiny), "--hardware", str(folder / "dev.json"),
            "--max-model-len", "1024", "--num-gpu-blocks-override", "1024"]
    assert check_cli(argv, "dev.json") == "ok"
    for config in CONFIGS:  # every model type's reader and cost model, before the baseline
        (tiny / "config.json").write_text(json.dumps(config))
        argv = ["simulate", *SMALL_RUN, "--model", str(tiny), "--hardware", "b200",
                "--max-model-len", "1024", "--num-gpu-blocks-override", "4096"]
        assert check_cli(argv, "tiny") == "ok", config["model_type"]
    (tiny / "config.json").write_text(json.dumps(TINY))


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_spec_file_fuzz(fmt: str, tmp_path: Path) -> None:
    summary = run_in_subprocess(Path(__file__), fmt, tmp_path)
    assert_clean(summary)
    # The corruptions reach both outcomes.
    assert summary["outcomes"].get("ok", 0) > 0 and summary["outcomes"].get("refused", 0) > 0


def test_the_yaml_writer_keeps_repeated_keys(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    text = yaml_text({"gemm_mfu": 0.7, "h100": Pairs([("gemm_mfu", 0.5), ("gemm_mfu", 0.6)])})
    assert text.count('"gemm_mfu"') == 3
    assert yaml.safe_load(yaml_text({"a": 1.5, "b": {"c": None}})) == {"a": 1.5, "b": {"c": None}}


def _worker_main(argv: list[str]) -> int:
    fmt, seed, count, folder = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    print(json.dumps(run_worker(CASES[fmt], count, seed, folder, warm_up)))
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker_main(sys.argv[2:]))
