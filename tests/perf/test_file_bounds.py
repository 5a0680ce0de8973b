"""Stated bounds on the spec files of ``kvsched simulate`` / ``compare`` (issue
11): a Hugging Face config.json (``--model PATH``), a hardware file
(``--hardware FILE``) and an efficiency file (``--efficiency-file FILE``).

Each case below was a reproducer: an internal error (OverflowError,
ZeroDivisionError, RecursionError), a run that took seconds in a loop over a
billion layers, a message without the file's name, or garbage accepted
silently. Each is now one ValueError naming the file, the field and the
bound, before anything is computed from the value.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_replay_fuzz import check_cli

from kvsched.perf.hardware import (
    HARDWARE,
    Hardware,
    get_hardware,
    load_efficiency_overrides,
    load_hardware_file,
    with_overrides,
)
from kvsched.perf.model_catalog import MODELS, get_model
from kvsched.perf.models import ModelSpec

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
         "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
         "max_position_embeddings": 40960, "tie_word_embeddings": True, "rope_theta": 1000000}
QWEN3_MOE = dict(QWEN3, model_type="qwen3_moe", num_hidden_layers=4, num_experts=16, num_experts_per_tok=4,
                 moe_intermediate_size=384, decoder_sparse_step=1, mlp_only_layers=[0])
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 1024, "num_hidden_layers": 4,
            "num_attention_heads": 16, "vocab_size": 32000, "max_position_embeddings": 4096,
            "q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
            "v_head_dim": 64, "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 256,
            "first_k_dense_replace": 1, "intermediate_size": 2816}
GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
           "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 4096,
           "intermediate_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128}
BLOOM = {"model_type": "bloom", "n_embed": 1024, "n_head": 16, "n_layer": 4, "vocab_size": 32000}
DEVICE = {"id": "my-gpu", "name": "My GPU", "memory_bytes": 80_000_000_000, "mem_bw": 2.0e12,
          "bf16_flops": 5.0e14, "fp8_flops": None, "scaleup_bw": 3.0e11, "scaleup_kind": "nvlink3"}
RUN = ["simulate", "--no-progress", "--step-time-backend", "roofline", "--num-prompts", "2",
       "--random-input-len", "32", "--random-output-len", "4", "--max-model-len", "1024"]


def _write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def _refused(load: Callable[[], object], path: Path, *needles: str) -> str:
    with pytest.raises(ValueError) as info:
        load()
    message = str(info.value)
    assert str(path) in message, message
    for needle in needles:
        assert needle in message, message
    return message


def _config(tmp_path: Path, content: dict[str, Any] | str | bytes) -> Path:
    text = json.dumps(content) if isinstance(content, dict) else content
    return _write(tmp_path / "model" / "config.json", text)


# -- config.json -------------------------------------------------------------------

CONFIG_CASES: list[tuple[str, dict[str, Any] | str | bytes, tuple[str, ...]]] = [
    # OverflowError in the memory plan (an internal error)
    ("400-digit hidden_size", dict(QWEN3, hidden_size=10**400),
     ("hidden_size=<a 401-digit integer>", "at most 131,072")),
    # read, then refused as "does not fit" without the file
    ("hidden_size 1e12", dict(QWEN3, hidden_size=10**12), ("hidden_size=1000000000000", "131,072")),
    ("vocab_size 1e15", dict(QWEN3, vocab_size=10**15), ("vocab_size=", "16,777,216")),
    ("num_experts 1e6", dict(QWEN3_MOE, num_experts=10**6), ("num_experts=1000000", "16,384")),
    ("head_dim 1e9", dict(QWEN3, head_dim=10**9), ("head_dim=1000000000", "4,096")),
    # a loop over every layer: seconds for 1e7 layers, minutes for 1e9
    ("deepseek 1e7 layers", dict(DEEPSEEK, num_hidden_layers=10**7),
     ("num_hidden_layers=10000000", "at most 1,024")),
    ("qwen3_moe 1e7 layers", dict(QWEN3_MOE, num_hidden_layers=10**7), ("num_hidden_layers=10000000",)),
    # ZeroDivisionError
    ("bloom n_head 0", dict(BLOOM, n_head=0), ("n_head=0", "positive integer")),
    # accepted silently
    ("rms_norm_eps inf", dict(QWEN3, rms_norm_eps=float("inf")), ("rms_norm_eps=inf", "finite")),
    ("rms_norm_eps nan", dict(QWEN3, rms_norm_eps=float("nan")), ("rms_norm_eps=nan",)),
    ("rms_norm_eps negative", dict(QWEN3, rms_norm_eps=-1e-6), ("rms_norm_eps=-1e-06",)),
    ("context 1e15", dict(QWEN3, max_position_embeddings=10**15),
     ("max_position_embeddings=1000000000000000", "67,108,864")),
    ("duplicate key", json.dumps(QWEN3)[:-1] + ', "hidden_size": 2048}', ("duplicate key 'hidden_size'",)),
    ("unknown layer types", dict(QWEN3, model_type="mistral", sliding_window=4096, layer_types=["x"] * 28),
     ("layer_types=", "'full_attention' or 'sliding_attention'")),
    ("mlp_only_layers out of range", dict(QWEN3_MOE, mlp_only_layers=[0, 99]),
     ("mlp_only_layers=[0, 99]", "from 0 to 3")),
    ("decoder_sparse_step 0", dict(QWEN3_MOE, decoder_sparse_step=0), ("decoder_sparse_step=0",)),
    ("moe_layer_freq 0", dict(DEEPSEEK, moe_layer_freq=0), ("moe_layer_freq=0",)),
    ("gpt-oss heads do not split the width", {k: v for k, v in GPT_OSS.items() if k != "head_dim"}
     | {"num_attention_heads": 24}, ("hidden_size=1024: not divisible by num_attention_heads=24",)),
    # messages without the file's name
    ("invalid UTF-8", json.dumps(QWEN3).encode()[:-1] + b', "note": "\xff"}', ("not UTF-8", "offset")),
    ("5000-digit number", json.dumps(QWEN3)[:-1] + ', "x": ' + "9" * 5000 + "}", ("4,300 digits",)),
    # RecursionError (an internal error)
    ("deep nesting", '{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", ("nested too deeply",)),
]


@pytest.mark.parametrize(("content", "needles"), [c[1:] for c in CONFIG_CASES],
                         ids=[c[0] for c in CONFIG_CASES])
def test_config_json_bounds(tmp_path: Path, content: dict[str, Any] | str | bytes,
                            needles: tuple[str, ...]) -> None:
    path = _config(tmp_path, content)
    _refused(lambda: get_model(str(path)), path, *needles)


@pytest.mark.parametrize("name", ["400-digit hidden_size", "bloom n_head 0", "deep nesting", "invalid UTF-8"])
def test_config_json_errors_are_one_line_through_the_cli(tmp_path: Path, name: str) -> None:
    content = next(c[1] for c in CONFIG_CASES if c[0] == name)
    path = _config(tmp_path, content)
    assert check_cli([*RUN, "--model", str(path)], str(path)) == "refused"


def test_config_json_larger_than_the_bound_is_not_read(tmp_path: Path) -> None:
    path = _config(tmp_path, json.dumps(QWEN3) + " " * (16 * 2**20))
    _refused(lambda: get_model(str(path)), path, "larger than 16,777,216 bytes")


def test_every_catalog_model_reads_within_the_bounds(tmp_path: Path) -> None:
    # The bounds hold for real models: the catalog (DeepSeek-V3, Llama 3.1 405B,
    # BLOOM, Kimi K2.5, gpt-oss-120b ...) is built through the same checks.
    assert len(MODELS) >= 20
    path = _config(tmp_path, dict(QWEN3, max_position_embeddings=10_485_760))  # Llama 4 Scout's context
    assert get_model(str(path)).max_position_embeddings == 10_485_760


def test_model_spec_in_code_has_the_same_bounds() -> None:
    base = MODELS["Qwen/Qwen3-0.6B"]
    for field, value in (("hidden_size", 10**12), ("num_layers", 10**9), ("vocab_size", 2**30)):
        with pytest.raises(ValueError, match=f"{field}=.*must be at most"):
            changes: dict[str, Any] = {field: value}
            dataclasses.replace(base, **changes)
    assert isinstance(base, ModelSpec)


# -- hardware files -------------------------------------------------------------------

HARDWARE_CASES: list[tuple[str, str, str, tuple[str, ...]]] = [
    # OverflowError (an internal error)
    ("400-digit memory_bytes", ".json", json.dumps(DEVICE | {"memory_bytes": 10**400}),
     ("memory_bytes=<a 401-digit integer>", "2**44")),
    ("400-digit bf16_flops", ".json", json.dumps(DEVICE | {"bf16_flops": 10**400}),
     ("bf16_flops=<a 401-digit integer>", "1e+18")),
    # accepted silently, or refused later without the file
    ("memory_bytes 1", ".json", json.dumps(DEVICE | {"memory_bytes": 1}), ("memory_bytes=1", "2**31")),
    ("memory_bytes 1e30", ".json", json.dumps(DEVICE | {"memory_bytes": 10**30}), ("memory_bytes=",)),
    ("mem_bw 1e300", ".json", json.dumps(DEVICE | {"mem_bw": 1e300}), ("mem_bw=1e+300", "1e+15")),
    ("mem_bw 1e-300", ".json", json.dumps(DEVICE | {"mem_bw": 1e-300}), ("mem_bw=1e-300", "1e+09")),
    ("bf16_flops 1", ".json", json.dumps(DEVICE | {"bf16_flops": 1}), ("bf16_flops=1", "1e+11")),
    ("comm_latency_s 1e300", ".json", json.dumps(DEVICE | {"comm_latency_s": 1e300}),
     ("comm_latency_s=1e+300", "0.1")),
    ("duplicate JSON key", ".json", json.dumps(DEVICE)[:-1] + ', "mem_bw": 1e12}',
     ("duplicate key 'mem_bw'",)),
    ("duplicate YAML key", ".yaml", "id: my-gpu\nid: other\n", ("duplicate key 'id'",)),
    ("a string for a number in JSON", ".json", json.dumps(DEVICE | {"mem_bw": "3.35e12"}),
     ("mem_bw='3.35e12'", "not a string")),
    ("a padded string in YAML", ".yaml",
     "".join(f"{k}: {'null' if v is None else v}\n" for k, v in (DEVICE | {"mem_bw": "' 3e12 '"}).items()),
     ("mem_bw=' 3e12 '", "must be a number")),
    ("a 300-character name", ".json", json.dumps(DEVICE | {"name": "x" * 300}), ("name=", "at most 128")),
    ("a two-line name", ".json", json.dumps(DEVICE | {"name": "GPU\nkvsched: ok"}), ("name=", "one-line")),
    # no suggestion for a typo
    ("misspelled field", ".json", json.dumps(DEVICE | {"mem_bandwith": 1e12}),
     ("unknown field 'mem_bandwith' (did you mean 'mem_bw'?)",)),
    # messages without the file's name
    ("invalid UTF-8", ".json", json.dumps(DEVICE)[:-1] + ', "notes": "\udcff"}', ("not UTF-8",)),
    # PyYAML takes ~1 s to give up on a few thousand unclosed brackets
    ("deep YAML nesting", ".yaml", "id: " + "[" * 5000, ("nested more than 64 deep",)),
    ("deep JSON nesting", ".json", "[" * 100_000, ("nested too deeply",)),
    ("5000-digit YAML integer", ".yaml", "memory_bytes: " + "9" * 5000 + "\n", ("4,300 digits",)),
    ("larger than the bound", ".json", json.dumps(DEVICE) + " " * 2**18, ("larger than 262,144 bytes",)),
]


def _text(content: str) -> bytes:
    return content.encode("utf-8", "surrogateescape")


@pytest.mark.parametrize(("suffix", "content", "needles"), [c[1:] for c in HARDWARE_CASES],
                         ids=[c[0] for c in HARDWARE_CASES])
def test_hardware_file_bounds(tmp_path: Path, suffix: str, content: str, needles: tuple[str, ...]) -> None:
    path = _write(tmp_path / f"dev{suffix}", _text(content))
    _refused(lambda: get_hardware(str(path)), path, *needles)


@pytest.mark.parametrize("name", ["400-digit memory_bytes", "mem_bw 1e-300", "invalid UTF-8"])
def test_hardware_errors_are_one_line_through_the_cli(tmp_path: Path, name: str) -> None:
    suffix, content = next(c[1:3] for c in HARDWARE_CASES if c[0] == name)
    path = _write(tmp_path / f"dev{suffix}", _text(content))
    assert check_cli([*RUN, "--model", "Qwen/Qwen3-0.6B", "--hardware", str(path)], str(path)) == "refused"


def test_hardware_bounds_hold_for_the_catalog_and_in_code() -> None:
    for hw in HARDWARE.values():  # every catalog device is within the bounds
        assert Hardware(**{f.name: getattr(hw, f.name) for f in dataclasses.fields(hw)}) == hw
    with pytest.raises(ValueError, match=r"mem_bw=1e\+300"):
        Hardware(**DEVICE | {"mem_bw": 1e300})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"comm_latency_s=1e\+300"):
        with_overrides(HARDWARE["h100-sxm"], comm_latency_s=1e300)


def test_yaml_numbers_without_a_dot_still_read(tmp_path: Path) -> None:
    path = _write(tmp_path / "dev.yaml", "".join(f"{k}: {'null' if v is None else v}\n"
                                                 for k, v in (DEVICE | {"mem_bw": "3.35e12"}).items()))
    assert load_hardware_file(path).mem_bw == 3.35e12


# -- efficiency files -----------------------------------------------------------------

EFFICIENCY_CASES: list[tuple[str, str, tuple[str, ...]]] = [
    # accepted silently
    ("another device's section out of range", json.dumps({"a100": {"gemm_mfu": 5}}),
     ("a100.gemm_mfu", "gemm_mfu=5", "(0, 1]")),
    ("a string for a number", json.dumps({"gemm_mfu": "0.5"}), ("gemm_mfu='0.5'", "not a string")),
    ("duplicate key", '{"gemm_mfu": 0.5, "gemm_mfu": 0.6}', ("duplicate key 'gemm_mfu'",)),
    ("two sections for one device", json.dumps({"h100": {"gemm_mfu": 0.7}, "h100-sxm": {"gemm_mfu": 0.6}}),
     ("'h100-sxm' and 'h100' both name hardware 'h100-sxm'",)),
    ("comm_latency_s 1e300", json.dumps({"comm_latency_s": 1e300}), ("comm_latency_s=1e+300",)),
    # no suggestion, or a misleading message
    ("misspelled field", json.dumps({"gem_mfu": 0.5}), ("unknown key 'gem_mfu' (did you mean 'gemm_mfu'?)",)),
    ("misspelled field in a section", json.dumps({"h100-sxm": {"gem_mfu": 0.5}}),
     ("h100-sxm.gem_mfu: not an efficiency field (did you mean 'gemm_mfu'?)",)),
    ("a device key without a section", json.dumps({"h100": 0.5}),
     ("'h100'=0.5: a hardware section must be a mapping",)),
    # messages without the file's name
    ("invalid UTF-8", '{"gemm_mfu": 0.5, "\udcff": 1}', ("not UTF-8",)),
]


@pytest.mark.parametrize(("content", "needles"), [c[1:] for c in EFFICIENCY_CASES],
                         ids=[c[0] for c in EFFICIENCY_CASES])
def test_efficiency_file_bounds(tmp_path: Path, content: str, needles: tuple[str, ...]) -> None:
    path = _write(tmp_path / "eff.json", _text(content))
    before = get_hardware("h100-sxm")
    _refused(lambda: load_efficiency_overrides(path, before), path, *needles)
    assert get_hardware("h100-sxm") == before == HARDWARE["h100-sxm"]  # nothing changed


def test_efficiency_errors_are_one_line_through_the_cli(tmp_path: Path) -> None:
    path = _write(tmp_path / "eff.json", json.dumps({"a100": {"gemm_mfu": 5}}))
    argv = [*RUN, "--model", "Qwen/Qwen3-0.6B", "--hardware", "h100", "--efficiency-file", str(path)]
    assert check_cli(argv, str(path)) == "refused"
