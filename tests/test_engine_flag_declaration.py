"""vLLM's scheduler and KV-cache engine arguments are declared once
(kvsched.engine_flags.SchedulerCacheOptions): the engine's and the
simulator's arguments extend the declaration, and the flags, the ``vllm
serve`` words and the tuner's candidates all come from it."""

from __future__ import annotations

import argparse
import inspect
import shlex
from dataclasses import dataclass, fields

import pytest

from kvsched.cli import build_parser
from kvsched.commands.profile import SERVE_FLAGS as PROFILE_FLAGS
from kvsched.commands.profile import serve_flags_of
from kvsched.engine.args import EngineArgs
from kvsched.engine_flags import (
    SHARED_FLAGS,
    EngineFlagDefaults,
    SchedulerCacheOptions,
    add_declared_flags,
    add_scheduler_cache_flags,
    flag,
    vllm_words,
)
from kvsched.errors import UserInputError
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.flags import add_engine_arguments, add_paste_arguments, parse_spec, simulate_flag_parser
from kvsched.sim.serve_line import SERVE, vllm_flags
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec
from kvsched.sim.workload import BenchDatasetOptions
from kvsched.tune.space import Candidate, SearchSpace
from kvsched.vllm_versions import VLLM_VERSIONS

# vLLM's engine-argument defaults, and 0.34's for its admission knobs,
# written out by hand (None: vLLM fills one for the release, usage context
# and device; for --max-num-inflight-kv-loads: no cap).
VLLM_DEFAULTS = {
    "max_num_seqs": None, "max_num_batched_tokens": None, "max_model_len": None,
    "enable_chunked_prefill": True, "enable_prefix_caching": True, "block_size": None,
    "gpu_memory_utilization": None, "long_prefill_token_threshold": 0, "scheduling_policy": "fcfs",
    "num_gpu_blocks_override": None, "max_num_inflight_kv_loads": None,
    "cache_aware_admission_window": 0, "cache_aware_admission_threshold": 0.5,
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


# simulate's flags of the fields EngineOptions declares itself, and of
# InstanceGroup's and DeploymentSpec's, written out by hand: the flag's
# spellings and its default (vLLM's where vLLM has the flag).
SIMULATE_DECLARED: dict[str, tuple[list[str], object]] = {
    "vllm_version": (["--vllm-version"], "0.34"),  # the newest modelled release
    "model": (["--model"], "meta-llama/Llama-3.1-8B"),
    "hardware": (["--hardware"], "h100-sxm"),
    "efficiency_file": (["--efficiency-file"], None),
    "calibration": (["--calibration"], None),
    "step_time_backend": (["--step-time-backend"], "auto"),
    "step_time_profile": (["--step-time-profile"], None),
    "tensor_parallel_size": (["--tensor-parallel-size", "-tp"], 1),
    "pipeline_parallel_size": (["--pipeline-parallel-size", "-pp"], 1),
    "data_parallel_size": (["--data-parallel-size", "-dp"], 1),
    "enable_expert_parallel": (["--enable-expert-parallel"], False),
    "dp_routing": (["--dp-routing"], "vllm"),
    "dp_stats_interval": (["--dp-stats-interval"], 0.1),
    "dp_sync_interval": (["--dp-sync-interval"], 16),
    "admission_policy": (["--admission-policy"], "none"),
    "balance_threshold": (["--balance-threshold"], "full"),
    "adp_timeout_iters": (["--adp-timeout-iters"], 50),
    "adp_batching_wait_iters": (["--adp-batching-wait-iters"], 0),
    "quantization": (["--quantization", "-q"], None),
    "kv_cache_dtype": (["--kv-cache-dtype"], "auto"),
    "prefill_schedule_interval": (["--prefill-schedule-interval"], 1),
    "enable_extensible_kv_cache": (["--enable-extensible-kv-cache", "--no-enable-extensible-kv-cache"], None),
    "kv_transfer_config": (["--kv-transfer-config"], None),
    "router": (["--router"], "round-robin"),
    "kv_offloading_size": (["--kv-offloading-size"], None),
    "kv_offloading_backend": (["--kv-offloading-backend"], "native"),
    "enable_lora": (["--enable-lora"], False),
    "max_loras": (["--max-loras"], 1),
    "max_lora_rank": (["--max-lora-rank"], 16),
    "max_cpu_loras": (["--max-cpu-loras"], None),
    "fully_sharded_loras": (["--fully-sharded-loras"], False),
    "lora_modules": (["--lora-modules"], ()),
    "lora_target_modules": (["--lora-target-modules"], ()),
    "spec_acceptance": (["--spec-acceptance"], None),
}


def _declared_fields(cls: type) -> set[str]:
    return {f.name for f in fields(cls) if "flag" in f.metadata}


def test_every_field_the_simulator_declares_is_in_the_table() -> None:
    """A field that loses its flag (or gains one) fails here: the table is
    the declared fields, no more, no fewer."""
    declared = ((_declared_fields(EngineOptions) - set(SHARED_FLAGS)) | _declared_fields(InstanceGroup)
                | _declared_fields(DeploymentSpec))
    assert declared == set(SIMULATE_DECLARED)


@pytest.mark.parametrize("dest", sorted(SIMULATE_DECLARED))
def test_a_declared_fields_flag_and_its_default_are_the_fields(dest: str) -> None:
    spellings, default = SIMULATE_DECLARED[dest]
    actions = {a.dest: a for a in simulate_flag_parser()._actions}
    assert dest in actions, f"{dest}: no flag"
    assert actions[dest].option_strings == spellings
    # argparse gives a list flag's words as a list; the field keeps a tuple.
    parsed = actions[dest].default
    assert (tuple(parsed) if isinstance(parsed, list) else parsed) == default
    owner = next(o for o in (EngineOptions(), InstanceGroup(), DeploymentSpec()) if hasattr(o, dest))
    assert getattr(owner, dest) == default


def test_declared_flags_parse_into_the_run_spec() -> None:
    spec = parse_spec(["-tp", "2", "-pp", "2", "-dp", "3", "-q", "fp8", "--dp-stats-interval", "0.5",
                       "--admission-policy", "balance", "--enable-lora", "--lora-modules", "a=/x", "b=/y",
                       "--kv-offloading-size", "8", "--step-time-backend", "roofline"])
    group = spec.deployment.group
    engine = group.engine
    assert (engine.tensor_parallel_size, engine.pipeline_parallel_size,
            engine.data_parallel_size) == (2, 2, 3)
    assert (engine.quantization, engine.enable_lora, engine.lora_modules) == ("fp8", True, ("a=/x", "b=/y"))
    assert (engine.kv_offloading_size, engine.step_time_backend) == (8.0, "roofline")
    assert (group.dp_stats_interval, group.admission_policy) == (0.5, "balance")
    for bad in (["-q", "fp4"], ["--router", "random"], ["-tp", "two"], ["--dp-stats-interval", "soon"]):
        with pytest.raises((UserInputError, argparse.ArgumentError), match="invalid"):
            parse_spec(bad)


def test_simulate_help_states_the_declared_default_where_the_parser_has_none() -> None:
    """simulate leaves --model and --hardware unset (a pasted serve line's
    model is told apart from the default); their help still states the
    field's default."""
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    add_paste_arguments(parser)
    text = " ".join(parser.format_help().split())
    assert parser.parse_args([]).model is None
    assert "config.json (default: meta-llama/Llama-3.1-8B)" in text
    assert "hardware file (default: h100-sxm)" in text
    assert "seconds between the load stats the vllm router sees (default 0.1)" in text


def test_declared_flag_kinds() -> None:
    """What add_declared_flags makes of a field's type and declaration."""

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Declared:
        size: int = flag(1, "n (default: %(default)s)", aliases=("-s",), metavar="N")
        ratio: float | None = flag(None, "r")
        mode: str = flag("a", "m", ("a", "b"))
        words: tuple[str, ...] = flag((), "w", metavar="W")
        sizes: tuple[int, ...] = flag((), "ns")
        on: bool = flag(True, "on")
        off: bool = flag(False, "off")
        plain: str = "not a flag"

    parser = argparse.ArgumentParser(exit_on_error=False)
    add_declared_flags(parser, Declared)
    assert vars(parser.parse_args([])) == {"size": 1, "ratio": None, "mode": "a", "words": [], "sizes": [],
                                           "on": True, "off": False}
    args = parser.parse_args(["-s", "3", "--ratio", "0.5", "--mode", "b", "--words", "x", "y",
                              "--sizes", "1", "2", "--no-on", "--off"])
    assert vars(args) == {"size": 3, "ratio": 0.5, "mode": "b", "words": ["x", "y"], "sizes": [1, 2],
                          "on": False, "off": True}
    with pytest.raises(argparse.ArgumentError):
        parser.parse_args(["--mode", "c"])
    assert "--size N, -s N" in parser.format_help()
    # names: only those, in that order.
    only = argparse.ArgumentParser()
    add_declared_flags(only, Declared, names=("mode", "size"))
    assert [a.dest for a in only._actions if a.dest != "help"] == ["mode", "size"]


# kvsched profile's vllm serve flags, written out by hand, and the words it
# passes on for them.
PROFILE_ARGV = ["--dtype", "half", "-tp", "2", "--max-model-len", "4096", "--max-num-seqs", "8",
                "--max-num-batched-tokens", "512", "--kv-cache-dtype", "fp8", "--block-size", "32",
                "--quantization", "fp8", "--enforce-eager", "--async-scheduling", "--no-async-scheduling",
                "--no-enable-prefix-caching", "--no-enable-chunked-prefill", "--", "--seed", "3"]
PROFILE_SERVE_WORDS = ["--dtype", "half", "--max-model-len", "4096", "--max-num-seqs", "8",
                       "--max-num-batched-tokens", "512", "--tensor-parallel-size", "2", "--kv-cache-dtype",
                       "fp8", "--block-size", "32", "--quantization", "fp8", "--enforce-eager",
                       "--async-scheduling", "--no-async-scheduling", "--no-enable-prefix-caching",
                       "--no-enable-chunked-prefill", "--seed", "3"]


def test_profile_passes_its_serve_flags_on_as_vllm_spells_them() -> None:
    parser = build_parser()
    base = ["profile", "--vllm-python", "py", "--model", "m", "-o", "o.json"]
    assert serve_flags_of(parser.parse_args([*base, *PROFILE_ARGV])) == PROFILE_SERVE_WORDS
    assert serve_flags_of(parser.parse_args(base)) == []
    # -q is simulate's short --quantization, not one profile takes.
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "-q", "fp8"])
    # Every flag profile passes on is one of vllm serve's own, in each release.
    for release in VLLM_VERSIONS:
        spellings = vllm_flags(release).lookup(SERVE)
        assert all(p.flag in spellings and spellings[p.flag][0].dest == p.name for p in PROFILE_FLAGS)
