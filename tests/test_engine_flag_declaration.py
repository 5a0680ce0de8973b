"""vLLM's scheduler and KV-cache engine arguments are declared once
(kvsched.engine_flags.SchedulerCacheOptions): the engine's and the
simulator's arguments extend the declaration, and the flags, the ``vllm
serve`` words and the tuner's candidates all come from it."""

from __future__ import annotations

import argparse
import inspect
import shlex
from dataclasses import fields

import pytest

from kvsched.engine.args import EngineArgs
from kvsched.engine_flags import (
    SHARED_FLAGS,
    EngineFlagDefaults,
    SchedulerCacheOptions,
    add_declared_flags,
    add_scheduler_cache_flags,
    vllm_words,
)
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.spec import RunSpec
from kvsched.sim.workload import BenchDatasetOptions
from kvsched.tune.space import Candidate, SearchSpace

# vLLM 0.33's engine-argument defaults, written out by hand (None: vLLM
# fills one for the usage context and device).
VLLM_DEFAULTS = {
    "max_num_seqs": None, "max_num_batched_tokens": None, "max_model_len": None,
    "enable_chunked_prefill": True, "enable_prefix_caching": True, "block_size": 16,
    "gpu_memory_utilization": 0.9, "long_prefill_token_threshold": 0, "scheduling_policy": "fcfs",
    "num_gpu_blocks_override": None,
}


def test_the_declaration_holds_vllms_names_and_defaults() -> None:
    declared = SchedulerCacheOptions()
    assert {f.name: getattr(declared, f.name) for f in fields(SchedulerCacheOptions)} == VLLM_DEFAULTS


@pytest.mark.parametrize("cls", [EngineArgs, EngineOptions])
def test_the_engine_and_the_simulator_extend_it_without_redeclaring(cls: type) -> None:
    assert issubclass(cls, SchedulerCacheOptions)
    # A field declared again in the subclass would be a second owner of its default.
    assert not set(SHARED_FLAGS) & set(inspect.get_annotations(cls))


def test_the_engine_and_the_simulator_default_to_the_same_settings() -> None:
    engine = EngineArgs(model="m")
    served = EngineOptions()
    for name, default in VLLM_DEFAULTS.items():
        assert getattr(engine, name) == getattr(served, name) == default, name


def test_flags_parsed_into_the_declaration_give_the_same_words_back() -> None:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_scheduler_cache_flags(parser, EngineFlagDefaults())
    argv = ["--max-num-seqs", "64", "--no-enable-chunked-prefill", "--block-size", "32",
            "--gpu-memory-utilization", "0.85", "--scheduling-policy", "priority"]
    args = parser.parse_args(argv)
    options = SchedulerCacheOptions(**{name: getattr(args, name) for name in SHARED_FLAGS})
    assert (options.max_num_seqs, options.enable_chunked_prefill, options.block_size) == (64, False, 32)
    default = SchedulerCacheOptions()
    words = [w for name in SHARED_FLAGS
             for w in vllm_words(name, getattr(options, name), getattr(default, name))]
    assert words == argv


@pytest.mark.parametrize("name, value, default, words", [
    ("max_num_seqs", None, None, []),  # vLLM's per-context default: not written
    ("max_num_seqs", 256, None, ["--max-num-seqs", "256"]),
    ("enable_prefix_caching", True, True, []),
    ("enable_prefix_caching", False, True, ["--no-enable-prefix-caching"]),
    ("async_scheduling", True, False, ["--async-scheduling"]),
    ("kv_offloading_size", 4.0, None, ["--kv-offloading-size", "4"]),
    ("gpu_memory_utilization", 0.95, 0.9, ["--gpu-memory-utilization", "0.95"]),
    # Written exactly when the short form would read back as another number.
    ("gpu_memory_utilization", 0.123456789, 0.9, ["--gpu-memory-utilization", "0.123456789"]),
    ("scheduling_policy", "priority", "fcfs", ["--scheduling-policy", "priority"]),
])
def test_vllm_words(name: str, value: object, default: object, words: list[str]) -> None:
    assert vllm_words(name, value, default) == words


def test_a_tuner_candidate_takes_its_defaults_from_the_declaration() -> None:
    candidate = Candidate(hardware="h100-sxm", tensor_parallel_size=1)
    for name in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                 "enable_prefix_caching", "scheduling_policy"):
        assert getattr(candidate, name) == VLLM_DEFAULTS[name], name
    # Deployed, a default candidate changes none of the engine's settings.
    assert candidate.apply(RunSpec()) == RunSpec().with_engine(hardware="h100-sxm")
    # And its serve line spells out none of them.
    assert candidate.vllm_serve("m") == "vllm serve m --tensor-parallel-size 1"
    space = SearchSpace(hardware=("h100-sxm",), tensor_parallel_size=(1,), data_parallel_size=(1,))
    assert list(space.candidates(8, is_moe=False)) == [candidate]


def test_a_candidates_serve_line_is_written_in_vllms_spelling() -> None:
    candidate = Candidate(hardware="h100-sxm", tensor_parallel_size=2, max_num_seqs=128,
                          enable_prefix_caching=False, scheduling_policy="priority", kv_offloading_size=4.0)
    assert shlex.split(candidate.vllm_serve("m")) == [
        "vllm", "serve", "m", "--tensor-parallel-size", "2", "--max-num-seqs", "128",
        "--no-enable-prefix-caching", "--scheduling-policy", "priority", "--kv-offloading-size", "4"]


def test_any_declared_options_give_their_flags() -> None:
    """vllm bench serve's dataset options are declared the same way: their
    flags, defaults and help come from the fields."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_declared_flags(parser, BenchDatasetOptions)
    assert BenchDatasetOptions(**vars(parser.parse_args([]))) == BenchDatasetOptions()
    args = parser.parse_args(["--sonnet-input-len", "100", "--disable-shuffle"])
    assert (args.sonnet_input_len, args.disable_shuffle, args.no_oversample) == (100, True, False)
    with pytest.raises(argparse.ArgumentError, match="invalid int value"):
        parser.parse_args(["--sonnet-input-len", "many"])
    # vLLM bench's sonnet default, written out by hand.
    assert "sonnet: prompt tokens at most (default 550)" in " ".join(parser.format_help().split())
