"""``--vllm-version``: a deployment simulated as a vLLM release (its scheduler,
block size, gpu_memory_utilization and KV-cache sizing), named in what kvsched
prints and saves, and its serve lines written for that release.

Expected block counts are worked out here from Llama-3.1-8B's config and the
H100's visible memory (tests/perf/test_memory.py derives the same terms)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from kvsched import cli
from kvsched.errors import UserInputError
from kvsched.perf import get_hardware
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.results import deployment_dict
from kvsched.sim.serve_line import release_serve_words
from kvsched.sim.spec import InstanceGroup, RunSpec, spec_from_json, spec_to_json
from kvsched.tune.search import Problem, Slo
from kvsched.tune.space import Candidate

GIB = 2**30
H100 = 85_520_809_984  # 81,559 MiB visible
WEIGHTS = 16_060_522_496  # Llama-3.1-8B in bf16
# vllm serve's defaults on an H100: 8192 batched tokens, 1024 sequences:
# 8192 x (2 x 4096 + 2 x 14336) x 2 bytes + 1024 x 128,256 x 4 bytes of logits.
ACTIVATIONS = 8192 * (2 * 4096 + 2 * 14336) * 2 + 1024 * 128_256 * 4


def test_0_33_defaults_to_16_token_blocks_at_0_92() -> None:
    d = build_deployment(EngineOptions(vllm_version="0.33", max_model_len=4096))
    free = 0.92 * H100 - WEIGHTS - GIB - ACTIVATIONS
    assert (d.vllm_version, d.cache_config.block_size, d.gpu_memory_utilization) == ("0.33", 16, 0.92)
    assert d.scheduler_config.vllm_version == "0.33" and not d.memory.extensible
    assert d.cache_config.num_gpu_blocks == int(free // (2 * GIB // 1024)) == 28_808
    assert ", vLLM 0.33, " in d.describe()


def test_0_34_defaults_to_64_token_blocks_sized_after_warmup() -> None:
    d = build_deployment(EngineOptions(vllm_version="0.34", max_model_len=4096))
    # Kept free: activations + the 0.5 GiB graph estimate; margin 0.75 x that (> 1 GiB).
    kept = ACTIVATIONS + GIB // 2
    margin = 0.75 * kept
    assert margin > GIB
    free = (H100 - margin) - (WEIGHTS + GIB) - kept
    assert (d.vllm_version, d.cache_config.block_size, d.gpu_memory_utilization) == ("0.34", 64, 1.0)
    assert d.scheduler_config.vllm_version == "0.34" and d.memory.extensible
    assert d.cache_config.num_gpu_blocks == int(free // (8 * 2**20)) == 7804
    assert ", vLLM 0.34, " in d.describe()


def test_the_default_release_is_0_34() -> None:
    # The newest release kvsched models: no --vllm-version gives the 0.34
    # deployment worked out above, 64-token blocks at 1.0, 7804 of them.
    d = build_deployment(EngineOptions(max_model_len=4096))
    assert (d.vllm_version, d.cache_config.block_size, d.gpu_memory_utilization) == ("0.34", 64, 1.0)
    assert d.scheduler_config.vllm_version == "0.34" and d.memory.extensible
    assert d.cache_config.num_gpu_blocks == 7804


def test_0_34_sizes_from_the_estimate_where_its_extensible_cache_is_off() -> None:
    off = build_deployment(EngineOptions(vllm_version="0.34", max_model_len=4096,
                                         enable_extensible_kv_cache=False))
    assert (off.gpu_memory_utilization, off.memory.extensible) == (0.92, False)
    assert off.cache_config.num_gpu_blocks == int((0.92 * H100 - WEIGHTS - GIB - ACTIVATIONS) // (8 * 2**20))
    nixl = build_deployment(EngineOptions(vllm_version="0.34", max_model_len=4096), registers_kv_cache=True)
    assert (nixl.gpu_memory_utilization, nixl.memory.extensible) == (0.92, False)
    override = build_deployment(EngineOptions(vllm_version="0.34", max_model_len=4096,
                                              num_gpu_blocks_override=500))
    assert (override.cache_config.num_gpu_blocks, override.memory.extensible) == (500, False)


def test_the_results_name_the_release_and_the_memory_share_it_ran_with() -> None:
    d33 = build_deployment(EngineOptions(vllm_version="0.33", max_model_len=4096))
    d34 = build_deployment(EngineOptions(vllm_version="0.34", max_model_len=4096))
    out33, out34 = deployment_dict(d33, InstanceGroup()), deployment_dict(d34, InstanceGroup())
    assert (out33["vllm"], out33["cache"]["gpu_memory_utilization"]) == ({"version": "0.33"}, 0.92)
    assert "enable_extensible_kv_cache" not in out33["cache"]  # 0.33 has no such cache
    assert (out34["vllm"], out34["cache"]["block_size"]) == ({"version": "0.34"}, 64)
    cache = out34["cache"]
    assert (cache["gpu_memory_utilization"], cache["enable_extensible_kv_cache"]) == (1.0, True)


def test_the_flag_round_trips_through_the_spec() -> None:
    argv = ["--vllm-version", "0.33", "--block-size", "64"]
    spec = parse_spec(argv)
    engine = spec.engine
    assert (engine.vllm_version, engine.block_size) == ("0.33", 64)
    assert spec_from_json(json.loads(json.dumps(spec_to_json(spec)))) == spec
    assert spec_argv(spec) == argv
    # The default release (0.34) writes no flag, given or not; its own flags round-trip.
    argv = ["--block-size", "16", "--no-enable-extensible-kv-cache"]
    spec = parse_spec(["--vllm-version", "0.34", *argv])
    engine = spec.engine
    assert (engine.vllm_version, engine.enable_extensible_kv_cache, engine.block_size) == ("0.34", False, 16)
    assert spec_from_json(json.loads(json.dumps(spec_to_json(spec)))) == spec
    assert spec_argv(spec) == argv
    assert parse_spec(argv) == spec
    assert spec_argv(parse_spec([])) == []
    with pytest.raises(UserInputError, match=r"^vllm_version='0\.35' \(--vllm-version\): not a vLLM release "
                                             r"kvsched models; use one of 0\.33, 0\.34$"):
        build_deployment(spec_from_json({"deployment": {"groups": [{"engine": {"vllm_version": "0.35"}}]}},
                                        ).engine)


@pytest.mark.parametrize(("version", "given", "colocated", "pd"), [
    ("0.33", {}, [], []),
    ("0.33", {"block_size": 16, "gpu_memory_utilization": 0.92}, [], []),   # 0.33's own defaults
    ("0.33", {"block_size": 64}, ["--block-size", "64"], ["--block-size", "64"]),
    ("0.33", {"gpu_memory_utilization": 0.9}, ["--gpu-memory-utilization", "0.9"],
     ["--gpu-memory-utilization", "0.9"]),
    ("0.34", {}, [], []),
    ("0.34", {"block_size": 64}, [], []),
    ("0.34", {"block_size": 16}, ["--block-size", "16"], ["--block-size", "16"]),
    # 0.92 is 0.34's default only where the extensible cache is off (NIXL: a P/D line).
    ("0.34", {"gpu_memory_utilization": 0.92}, ["--gpu-memory-utilization", "0.92"], []),
    ("0.34", {"gpu_memory_utilization": 1.0}, [], ["--gpu-memory-utilization", "1"]),
    ("0.34", {"enable_extensible_kv_cache": False, "gpu_memory_utilization": 0.92},
     ["--no-enable-extensible-kv-cache"], []),
    ("0.34", {"enable_extensible_kv_cache": True}, [], ["--enable-extensible-kv-cache"]),
])
def test_serve_lines_leave_out_the_releases_own_defaults(version: str, given: dict[str, object],
                                                          colocated: list[str], pd: list[str]) -> None:
    opts = EngineOptions(vllm_version=version, **given)  # type: ignore[arg-type]
    h100 = get_hardware("h100-sxm")
    assert release_serve_words(opts, h100) == colocated
    assert release_serve_words(opts, h100, registers_kv_cache=True) == pd


def test_the_tuners_serve_line_follows_the_release() -> None:
    base = parse_spec(["--vllm-version", "0.34", "--block-size", "16", "--gpu-memory-utilization", "0.92"])
    problem = Problem("meta-llama/Llama-3.1-8B", base, Slo((("ttft", 500.0),), "mean"), "goodput-per-gpu",
                      {}, is_random=True, base_rate=1.0)
    assert shlex.split(problem.vllm_serve(Candidate("h100-sxm", 2))) == [
        "vllm", "serve", "meta-llama/Llama-3.1-8B", "--tensor-parallel-size", "2", "--block-size", "16",
        "--gpu-memory-utilization", "0.92"]
    # 0.33's own defaults: no flag on 0.33's line.
    same = RunSpec().with_engine(vllm_version="0.33", block_size=16, gpu_memory_utilization=0.92)
    problem = Problem("meta-llama/Llama-3.1-8B", same, Slo((("ttft", 500.0),), "mean"), "goodput-per-gpu",
                      {}, is_random=True, base_rate=1.0)
    assert problem.vllm_serve(Candidate("h100-sxm", 2)) == \
        "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2"


def test_a_flag_0_33_lacks_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--num-prompts", "2", "--vllm-version", "0.33",
                     "--enable-extensible-kv-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err == (
        "kvsched: error: enable_extensible_kv_cache=True (--enable-extensible-kv-cache): vLLM 0.33 has no "
        "--enable-extensible-kv-cache (vLLM 0.34 added it); drop it, or simulate vLLM 0.34 with "
        "--vllm-version 0.34")


def _scenario(tmp_path: Path) -> Path:
    # Two 100-token prompts, threshold 32, chunked prefill off: 0.33 caps each
    # at the threshold, 0.34 ignores it (docs/vllm_versions.md §5).
    requests = [{"request_id": f"r{i}", "prompt_token_ids": list(range(1 + 1000 * i, 101 + 1000 * i)),
                 "max_tokens": 2} for i in range(2)]
    path = tmp_path / "s.json"
    path.write_text(json.dumps({
        "scheduler": {"max_num_batched_tokens": 512, "max_num_seqs": 8, "max_model_len": 512,
                      "enable_chunked_prefill": False, "long_prefill_token_threshold": 32},
        "cache": {"block_size": 16, "num_gpu_blocks": 64}, "requests": requests}))
    return path


# No flag: the default release, 0.34.
@pytest.mark.parametrize(("argv", "first"), [([], 100), (["--vllm-version", "0.33"], 32),
                                              (["--vllm-version", "0.34"], 100)])
def test_replay_takes_the_release(tmp_path: Path, argv: list[str], first: int,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    assert cli.main(["replay", str(_scenario(tmp_path)), "--trace", str(trace), *argv]) == 0
    step = json.loads(trace.read_text().splitlines()[0])
    assert step["scheduled"] == [["r0", first], ["r1", first]]
