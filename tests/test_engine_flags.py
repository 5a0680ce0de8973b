"""vLLM's scheduler and KV-cache flags, defined once (kvsched.engine_flags)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import kvsched.engine_flags as engine_flags
from kvsched.engine_flags import SCHEDULER_CACHE_FLAGS, EngineFlagDefaults, add_scheduler_cache_flags


def _parser(defaults: EngineFlagDefaults) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_scheduler_cache_flags(parser.add_argument_group("engine"), defaults)
    return parser


def test_the_flags_take_vllms_names_and_defaults() -> None:
    args = vars(_parser(EngineFlagDefaults()).parse_args([]))
    # vLLM 0.33's engine-argument defaults (and 0.34's admission knobs'),
    # written out by hand.
    assert args == {
        "max_num_seqs": None, "max_num_batched_tokens": None, "max_model_len": None,
        "enable_chunked_prefill": True, "enable_prefix_caching": True, "block_size": 16,
        "gpu_memory_utilization": 0.9, "long_prefill_token_threshold": 0, "scheduling_policy": "fcfs",
        "num_gpu_blocks_override": None, "max_num_inflight_kv_loads": None,
        "cache_aware_admission_window": 0, "cache_aware_admission_threshold": 0.5,
        "async_scheduling": False, "speculative_config": None, "dtype": "auto", "seed": 0}
    assert set(args) == set(SCHEDULER_CACHE_FLAGS)


def test_what_an_entry_point_sets_is_its_own() -> None:
    served = EngineFlagDefaults(dtype="bf16", async_scheduling=True, scope="per engine core", seed=None)
    parser = _parser(served)
    args = parser.parse_args(["--no-async-scheduling", "--max-num-seqs", "64",
                              "--no-enable-prefix-caching", "--scheduling-policy", "priority"])
    assert (args.dtype, args.async_scheduling, args.max_num_seqs) == ("bf16", False, 64)
    assert (args.enable_prefix_caching, args.scheduling_policy) == (False, "priority")
    assert parser.parse_args([]).async_scheduling is True
    assert "seed" not in vars(args)  # simulate's --seed seeds its workload, not the engine
    assert "per engine core" in parser.format_help()
    with pytest.raises(argparse.ArgumentError, match="invalid choice: 'lifo'"):
        parser.parse_args(["--scheduling-policy", "lifo"])


def test_the_034_admission_flags_are_vllms_spellings() -> None:
    args = _parser(EngineFlagDefaults()).parse_args(
        ["--max-num-inflight-kv-loads", "3", "--cache-aware-admission-window", "8",
         "--cache-aware-admission-threshold", "0.25"])
    assert (args.max_num_inflight_kv_loads, args.cache_aware_admission_window,
            args.cache_aware_admission_threshold) == (3, 8, 0.25)


def test_generate_takes_its_engine_flags_from_the_shared_set(capsys: pytest.CaptureFixture[str]) -> None:
    from kvsched.cli import build_parser

    args = build_parser().parse_args(["generate", "--model", "m", "--prompt", "x"])
    assert {name: getattr(args, name) for name in SCHEDULER_CACHE_FLAGS} == vars(
        _parser(EngineFlagDefaults()).parse_args([]))
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    assert "(methods: ngram, ngram_gpu; default: off)" in " ".join(capsys.readouterr().out.split())


def test_the_module_sits_on_the_base_layer() -> None:
    tree = ast.parse(Path(engine_flags.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported == {"__future__", "argparse", "collections.abc", "dataclasses", "typing",
                        "kvsched.config"}
