"""The run spec: JSON and flags round trips, and bad specs refused by name."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsched.errors import UserInputError
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.flags import parse_spec, spec_argv
from kvsched.sim.run import prepare
from kvsched.sim.spec import (
    DeploymentSpec,
    InstanceGroup,
    RunOptions,
    RunSpec,
    WorkloadSpec,
    spec_from_json,
    spec_to_json,
)

engines = st.builds(
    EngineOptions,
    vllm_version=st.sampled_from(["0.33", "0.34"]),
    model=st.sampled_from(["meta-llama/Llama-3.1-8B", "Qwen3-32B", "deepseek-ai/DeepSeek-V3"]),
    hardware=st.sampled_from(["h100-sxm", "h200", "b200"]),
    tensor_parallel_size=st.sampled_from([1, 2, 8]),
    data_parallel_size=st.sampled_from([1, 4]),
    enable_expert_parallel=st.booleans(),
    max_num_seqs=st.none() | st.integers(1, 1024),
    max_num_batched_tokens=st.none() | st.integers(1, 65536),
    max_model_len=st.none() | st.integers(1, 131072),
    enable_chunked_prefill=st.booleans(),
    enable_prefix_caching=st.booleans(),
    block_size=st.none() | st.sampled_from([16, 32, 64]),
    gpu_memory_utilization=st.none() | st.sampled_from([0.9, 0.85, 0.5]),
    enable_extensible_kv_cache=st.none() | st.booleans(),
    long_prefill_token_threshold=st.integers(0, 4096),
    scheduling_policy=st.sampled_from(["fcfs", "priority"]),
    quantization=st.none() | st.sampled_from(["fp8", "modelopt_fp4"]),
    kv_cache_dtype=st.sampled_from(["auto", "fp8"]),
    num_gpu_blocks_override=st.none() | st.integers(1, 10**6),
    async_scheduling=st.booleans(),
    prefill_schedule_interval=st.integers(1, 8),
    step_time_backend=st.sampled_from(["auto", "measured", "roofline"]),
    speculative_config=st.none() | st.just('{"method": "mtp", "num_speculative_tokens": 1}'),
)
groups = st.builds(
    InstanceGroup, engine=engines,
    dp_routing=st.sampled_from(["vllm", "round-robin", "least-loaded"]),
    dp_stats_interval=st.sampled_from([0.1, 0.05, 2.5]),
    dp_sync_interval=st.integers(1, 64),
    admission_policy=st.sampled_from(["none", "balance", "adp-balance", "prefill-cadence"]),
    balance_threshold=st.sampled_from(["full", "full-minus-one"]),
    adp_timeout_iters=st.integers(0, 100), adp_batching_wait_iters=st.integers(0, 20))
random_workloads = st.builds(
    WorkloadSpec, dataset_name=st.just("random"), num_prompts=st.none() | st.integers(1, 10**5),
    random_input_len=st.none() | st.integers(0, 10**5), random_output_len=st.none() | st.integers(0, 10**4),
    random_range_ratio=st.none() | st.sampled_from([0.0, 0.25, 0.9]),
    random_prefix_len=st.none() | st.integers(0, 4096),
    request_rate=st.none() | st.sampled_from([0.5, 8.0, math.inf]),
    burstiness=st.none() | st.sampled_from([0.5, 1.0, 4.0]),
    max_concurrency=st.none() | st.integers(1, 512), seed=st.integers(0, 2**32 - 1),
    time_scale=st.sampled_from([1.0, 0.5, 3.0]), duration=st.none() | st.sampled_from([10.0, 600.0]),
    eos_probability=st.sampled_from([0.0, 0.01]))
trace_workloads = st.builds(
    WorkloadSpec, dataset_name=st.sampled_from(["azure", "mooncake", "jsonl"]),
    dataset_path=st.sampled_from(["t.csv", "dir/trace.jsonl"]), num_prompts=st.none() | st.integers(1, 99),
    max_concurrency=st.none() | st.integers(1, 64), time_scale=st.sampled_from([1.0, 0.25]))
options = st.builds(
    RunOptions, fast_forward=st.booleans(),
    percentiles=st.lists(st.sampled_from([50.0, 90.0, 99.0, 99.9]), min_size=1, max_size=3).map(tuple),
    goodput=st.sampled_from([(), (("ttft", 500.0),), (("ttft", 200.0), ("tpot", 40.0))]),
    keep_token_times=st.booleans(), keep_step_log=st.booleans(),
    trace_steps=st.none() | st.just("steps.jsonl"))
specs = st.builds(RunSpec, deployment=groups.map(lambda g: DeploymentSpec((g,))),
                  workload=random_workloads | trace_workloads, options=options)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(spec=specs)
def test_json_round_trip(spec: RunSpec) -> None:
    text = json.dumps(spec_to_json(spec), allow_nan=False)  # standard JSON: inf as "inf"
    assert spec_from_json(json.loads(text)) == spec


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(spec=specs)
def test_flags_round_trip(spec: RunSpec) -> None:
    # The output options are the command's own: flags carry deployment and workload.
    plain = RunSpec(spec.deployment, spec.workload)
    assert parse_spec(spec_argv(plain)) == plain


def test_flags_name_vllm_engine_arguments() -> None:
    spec = RunSpec().with_engine(max_num_seqs=64, enable_prefix_caching=False, enable_expert_parallel=True)
    assert spec_argv(spec) == ["--enable-expert-parallel", "--max-num-seqs", "64",
                               "--no-enable-prefix-caching"]


def test_missing_keys_take_defaults() -> None:
    spec = spec_from_json({"workload": {"num_prompts": 5}})
    assert spec == RunSpec(workload=WorkloadSpec(num_prompts=5))


@pytest.mark.parametrize("data, words", [
    ({"workload": {"num_prompt": 5}}, ["run spec.workload", "unknown key 'num_prompt'", "num_prompts"]),
    ({"workload": {"num_prompts": "5"}}, ["run spec.workload.num_prompts='5'", "expected an integer"]),
    ({"workload": {"num_prompts": True}}, ["run spec.workload.num_prompts=True", "expected an integer"]),
    ({"deployment": {"groups": {}}}, ["run spec.deployment.groups", "expected a list"]),
    ({"deployment": {"groups": [{"engine": {"block_size": 1.5}}]}},
     ["run spec.deployment.groups[0].engine.block_size=1.5", "integer"]),
    ({"options": {"fast_forward": 1}}, ["run spec.options.fast_forward=1", "true or false"]),
    ([], ["run spec", "expected an object"]),
])
def test_a_bad_json_spec_names_the_field(data: object, words: list[str]) -> None:
    with pytest.raises(UserInputError) as info:
        spec_from_json(data)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("spec, words", [
    (RunSpec(DeploymentSpec((InstanceGroup(), InstanceGroup()))),
     ["deployment.groups", "['mixed', 'mixed']"]),
    (RunSpec(DeploymentSpec((InstanceGroup(role="prefill"),))), ["deployment.groups", "['prefill']"]),
    (RunSpec(DeploymentSpec((InstanceGroup(role="drafter"),))), ["deployment.groups", "['drafter']"]),
    (RunSpec(DeploymentSpec(kv_transfer_config='{"kv_connector": "NixlConnector"}')),
     ["--kv-transfer-config", "--disaggregation"]),
    (RunSpec(DeploymentSpec((InstanceGroup(role="prefill"), InstanceGroup(role="decode")),
                            kv_transfer_config='{"kv_connector": "LMCacheConnectorV1", '
                                               '"kv_role": "kv_both"}')),
     ["kv_connector='LMCacheConnectorV1'", "NixlConnector"]),
    (RunSpec(DeploymentSpec((InstanceGroup(role="prefill"), InstanceGroup(role="decode")), router="random")),
     ["--router='random'", "least-loaded"]),
    (RunSpec().with_group(dp_routing="random"), ["--dp-routing='random'", "least-loaded"]),
    (RunSpec().with_group(dp_sync_interval=0), ["--dp-sync-interval=0", "vLLM's is 16"]),
    (RunSpec().with_group(dp_stats_interval=0.0), ["--dp-stats-interval=0.0", "vLLM's is 0.1"]),
    (RunSpec().with_workload(num_prompts=0), ["--num-prompts=0", "at least 1"]),
    (RunSpec().with_workload(dataset_name="vision-arena"), ["--dataset-name='vision-arena'", "sharegpt"]),
    (RunSpec().with_workload(dataset_name="sharegpt"), ["--dataset-name sharegpt", "--dataset-path"]),
    (RunSpec().with_workload(request_rate=5.0, time_scale=0.5, dataset_name="azure", dataset_path="x.csv"),
     ["--time-scale=0.5", "--request-rate"]),
    (RunSpec().with_workload(burstiness=2.0, dataset_name="azure", dataset_path="x.csv"),
     ["--burstiness=2", "--request-rate"]),
    (RunSpec().with_workload(sonnet_input_len=300, dataset_name="sharegpt", dataset_path="x.json"),
     ["--sonnet-input-len", "only for --dataset-name sonnet"]),
    (RunSpec().with_workload(dataset_name="prefix_repetition", dataset_path="x.json"),
     ["--dataset-path=x.json", "synthetic"]),
    (RunSpec().with_workload(dataset_name="sharegpt", dataset_path="x.json", random_input_len=5),
     ["--random-input-len=5", "only for --dataset-name random"]),
    (RunSpec().with_options(goodput=(("ttfx", 1.0),)), ["--goodput ttfx:1.0"]),
])
def test_a_bad_spec_is_refused_before_anything_is_built(spec: RunSpec, words: list[str]) -> None:
    with pytest.raises(UserInputError) as info:
        prepare(spec)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_the_cadence_policy_gates_at_least_every_second_step() -> None:
    group = InstanceGroup(admission_policy="prefill-cadence")
    assert group.engine.prefill_schedule_interval == 1
    assert group.engine_options().prefill_schedule_interval == 2
    steady = InstanceGroup(EngineOptions(prefill_schedule_interval=5), admission_policy="prefill-cadence")
    assert steady.engine_options().prefill_schedule_interval == 5


def test_prepare_resolves_the_random_dataset_defaults() -> None:
    run = prepare(RunSpec(workload=WorkloadSpec(num_prompts=3)))
    w = run.spec.workload
    # vllm bench serve's random dataset: 1024 in, 128 out, all at once.
    resolved = (w.random_input_len, w.random_output_len, w.request_rate, w.burstiness)
    assert resolved == (1024, 128, math.inf, 1.0)
    assert len(run.workload.requests) == 3
