"""LoRA through the simulator: the max_loras cap queues requests, loads are
priced once each, the flags round-trip, bad settings are refused."""

from __future__ import annotations

import pytest

from kvsched.cli import build_parser
from kvsched.commands.simulate import spec_of
from kvsched.errors import UserInputError
from kvsched.sim.deployment import EngineOptions, build_deployment
from kvsched.sim.flags import parse_spec, spec_argv, with_pasted
from kvsched.sim.results import describe_run
from kvsched.sim.run import prepare, run
from kvsched.sim.spec import spec_from_json, spec_to_json

# 4 adapters round-robin, all requests at once: max_loras decides how many
# adapters' requests run together.
BASE = ["--enable-lora", "--num-lora-adapters", "4", "--lora-assignment", "round-robin",
        "--num-prompts", "32", "--random-input-len", "256", "--random-output-len", "128",
        "--step-time-backend", "roofline", "--max-cpu-loras", "4"]


def simulate(*extra: str) -> dict:  # type: ignore[type-arg]
    return run(parse_spec([*BASE, *extra])).metrics


def test_the_cap_queues_requests_of_other_adapters() -> None:
    one, four = simulate("--max-loras", "1"), simulate("--max-loras", "4")
    assert one["completed"] == four["completed"] == 32
    # With one slot the adapters' requests run one adapter at a time.
    # With one slot the 8 requests of one adapter run together, the others wait.
    assert one["mean_batch_size"] == 8.0 and four["mean_batch_size"] == 32.0
    assert one["mean_ttft_ms"] > 2 * four["mean_ttft_ms"]
    # Four adapters, a CPU cache of four: each read from disk once, either way
    # (one slot: served one adapter after the other, none comes back).
    for m in (one, four):
        assert m["lora"]["loads_from_disk"] == 4 and m["lora"]["loads_from_cpu"] == 0
    # Four times the LoRA steps with one slot: each batch holds one adapter's 8 requests.
    assert one["lora"]["steps_with_lora"] == 4 * four["lora"]["steps_with_lora"] == 512


def test_lora_costs_time_over_the_base_model() -> None:
    lora = simulate("--max-loras", "4")
    base = run(parse_spec([*BASE[5:], "--lora-share", "0", "--enable-lora", "--max-loras", "4"])).metrics
    assert base["lora"]["steps_with_lora"] == 0 and lora["lora"]["steps_with_lora"] > 0
    assert lora["lora"]["kernel_seconds"] > 0.0
    assert lora["mean_e2el_ms"] > base["mean_e2el_ms"]


def test_flags_round_trip_through_spec_argv_and_json() -> None:
    spec = parse_spec(["--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--max-cpu-loras", "8",
                       "--fully-sharded-loras", "--lora-modules", "a=/x/a", "b=/x/b", "--lora-share", "0.5",
                       "--lora-target-modules", "qkv_proj", "o_proj",
                       "--lora-zipf-alpha", "1.2", "--num-prompts", "10", "-tp", "2", "--lora-names", "b"])
    e, w = spec.engine, spec.workload
    assert (e.enable_lora, e.max_loras, e.max_lora_rank, e.max_cpu_loras, e.fully_sharded_loras,
            e.lora_modules) == (True, 4, 64, 8, True, ("a=/x/a", "b=/x/b"))
    assert e.lora_target_modules == ("qkv_proj", "o_proj")
    assert (w.lora_share, w.lora_zipf_alpha, w.lora_assignment, w.lora_names) == (0.5, 1.2, "random", ("b",))
    assert parse_spec(spec_argv(spec)) == spec
    assert spec_from_json(spec_to_json(spec)) == spec
    # vLLM's defaults: off, 1 slot, rank 16, CPU cache = max_loras.
    d = parse_spec([]).engine
    assert (d.enable_lora, d.max_loras, d.max_lora_rank, d.max_cpu_loras) == (False, 1, 16, None)


@pytest.mark.parametrize(("argv", "match"), [
    (["--max-loras", "2"], "--max-loras: a LoRA setting without --enable-lora"),
    (["--lora-share", "0.5"], "add --enable-lora"),
    (["--enable-lora", "--max-lora-rank", "12", "--num-lora-adapters", "2"],
     r"max_lora_rank=12 \(--max-lora-rank\)"),
    (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], r"max_cpu_loras=2 \(--max-cpu-loras\)"),
    (["--enable-lora"], "no adapters for the requests to use"),
    (["--enable-lora", "--lora-modules", "a=/x", "--num-lora-adapters", "2"], "named twice"),
    (["--enable-lora", "--num-lora-adapters", "2", "--lora-share", "-1"], "--lora-share=-1"),
    (["--enable-lora", "--num-lora-adapters", "2", "--disaggregation", "1P1D"], "--disaggregation"),
])
def test_bad_settings_refused_by_name(argv: list[str], match: str) -> None:
    with pytest.raises(UserInputError, match=match):
        prepare(parse_spec([*argv, "--num-prompts", "4"]))


def test_slots_take_kv_cache_memory() -> None:
    base = build_deployment(EngineOptions(step_time_backend="roofline"))
    lora = build_deployment(EngineOptions(step_time_backend="roofline", enable_lora=True, max_loras=8))
    # 8 slots of rank 16 on Llama-3.1-8B: 8 x 83.9 MB = 671 MB less KV.
    assert lora.memory.lora_bytes == 8 * 16 * 81920 * 32 * 2
    assert base.memory.kv_cache_bytes - lora.memory.kv_cache_bytes == lora.memory.lora_bytes
    assert lora.cache_config.num_gpu_blocks < base.cache_config.num_gpu_blocks


def test_saved_description_names_the_adapters_and_the_mix() -> None:
    done = run(parse_spec([*BASE, "--max-loras", "2"]))
    saved = describe_run(done.prepared.deployment, done.prepared.spec, done.prepared.workload)
    lora = saved["deployment"]["lora"]
    assert (lora["max_loras"], lora["max_cpu_loras"], len(lora["adapters"])) == (2, 4, 4)
    assert saved["workload"]["lora"]["requests_per_adapter"] == {"1": 8, "2": 8, "3": 8, "4": 8}
    # LoRA runs are stepped, not fast-forwarded.
    assert done.metrics["fast_forwarded_steps"] == 0


def test_a_pasted_lora_serve_and_bench_pair_runs() -> None:
    # vLLM's docs' form: adapters declared on the serve line, picked by name on the bench line.
    argv = ["--hardware", "h100-sxm",
            "--serve", "vllm serve meta-llama/Llama-3.1-8B --enable-lora --max-loras 2 --max-lora-rank 16 "
            "--lora-modules sql=/adapters/sql chat=/adapters/chat code=/adapters/code",
            "--bench", "vllm bench serve --model meta-llama/Llama-3.1-8B --lora-modules sql code "
            "--lora-assignment round-robin --num-prompts 8 --random-input-len 64 --random-output-len 8"]
    args, _ = with_pasted(build_parser().parse_args(["simulate", *argv]))
    spec = spec_of(args)
    assert (spec.engine.enable_lora, spec.engine.max_loras) == (True, 2)
    assert spec.engine.lora_modules == ("sql=/adapters/sql", "chat=/adapters/chat", "code=/adapters/code")
    assert spec.workload.lora_names == ("sql", "code")
    done = run(spec)
    # sql is adapter 1, code adapter 3; round-robin over them.
    assert [r.lora_id for r in done.prepared.workload.requests] == [1, 3] * 4
    assert done.metrics["completed"] == 8
