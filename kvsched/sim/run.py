"""The one runner: a :class:`~kvsched.sim.spec.RunSpec` in, a result out.

:func:`prepare` does everything a run can get wrong before it starts (the
deployment is built, so a model that does not fit is refused here; the
workload is built; requests longer than ``max_model_len`` are set aside as
the server refuses them). :func:`serve` simulates a built deployment on a
workload: one engine, independent DP replicas, or lockstep DP ranks with an
admission policy. :func:`run` is both, plus vllm bench's metrics.

Every command (simulate, compare, tune, calibrate) and every validation
harness goes through :func:`serve`; those with a workload of their own (a
calibration replay, a silicon row's closed loop) call it directly.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from kvsched.core.kv_connector import parse_kv_transfer_config
from kvsched.core.policies import AdmissionPolicy, AdpBalance, BalanceGate, BalanceThreshold, DPRankStates
from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.perf.lora import synthetic_adapters
from kvsched.perf.model_catalog import get_vision
from kvsched.sim.cluster import Cluster, Progress
from kvsched.sim.deployment import Deployment, build_deployment
from kvsched.sim.disagg import DisaggregatedSimulator, DisaggResult, RoleConfig, pd_connectors
from kvsched.sim.dp import DPOptions, DPSimulator
from kvsched.sim.encoder import encoder_pricer
from kvsched.sim.refusals import split_refused
from kvsched.sim.results import num_gpus, per_gpu_metrics, role_utilisation
from kvsched.sim.simulator import SimConfig, SimResult, Simulator
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunOptions, RunSpec, WorkloadSpec
from kvsched.sim.ttft_parts import colocated_parts, summary
from kvsched.sim.workload import (
    BENCH_DATASETS,
    MAX_ARRIVAL_TIME,
    MAX_REQUEST_TOKENS,
    Workload,
    load_tokenizer,
    load_workload,
    repaced,
)
from kvsched.sim.workload.load import MM_DATASETS
from kvsched.sim.workload.lora import DEFAULT_LORA_SHARE, adapter_ids_by_name, assign_loras

AfterStep = Callable[[Cluster], None]


@dataclass(slots=True)
class PreparedRun:
    """A spec checked and built, ready to run."""

    spec: RunSpec                      # its workload resolved (defaults filled in)
    deployment: Deployment
    workload: Workload                 # every request
    accepted: Workload                 # those the server accepts
    refused: list[tuple[str, str]]     # (request id, why) of the others
    # What the user should know (e.g. a setting with no effect).
    notes: list[str] = dataclasses.field(default_factory=list)
    # Disaggregated: the prefill instances' deployment (``deployment`` is
    # then the decode instances').
    prefill_deployment: Deployment | None = None


@dataclass(slots=True)
class RunResult:
    prepared: PreparedRun
    result: SimResult
    metrics: dict[str, Any]


def build_group_deployment(group: InstanceGroup,
                           registers_kv_cache: bool = False) -> tuple[Deployment, list[str]]:
    """The deployment of one instance group, and notes for the user.
    Expert parallelism on a dense model is dropped with a note, as vLLM
    has no experts to shard there. ``registers_kv_cache``: its instances'
    KV connector registers the cache (NIXL, between P/D instances)."""
    group.check()
    options = group.engine_options()
    deployment = build_deployment(options, registers_kv_cache)
    notes: list[str] = []
    if options.enable_expert_parallel and not deployment.options.enable_expert_parallel:
        notes.append(f"--enable-expert-parallel has no effect: {deployment.model.name} is a dense "
                     "model (no experts), and vLLM ignores expert parallelism for it")
    if (group.balance_threshold == "full-minus-one" and group.admission_policy == "balance"
            and deployment.scheduler_config.max_num_seqs < 2):
        raise UserInputError("--balance-threshold full-minus-one needs --max-num-seqs >= 2 (with 1 it "
                             "would hold every admission forever); use --balance-threshold full")
    return deployment, notes


def build_workload(spec: WorkloadSpec, model: str | None = None,
                   notes: list[str] | None = None) -> Workload:
    """The requests of a resolved workload spec (:meth:`WorkloadSpec.resolved`).
    vllm bench serve's datasets count tokens with ``spec.tokenizer``, else
    ``model``'s tokenizer where one is on disk, else an approximation (a
    warning then goes to ``notes``)."""
    tokenizer = None
    counted = (*BENCH_DATASETS, *MM_DATASETS)
    if spec.dataset_name in counted or spec.tokenizer is not None or (
            spec.dataset_name == "random" and model is not None):
        tokenizer, warning = load_tokenizer(model or "", spec.tokenizer)
        if warning is not None and spec.dataset_name in counted and notes is not None:
            notes.append(warning)
    if spec.dataset_name == "random-mm":
        assert spec.num_prompts is not None and spec.request_rate is not None and tokenizer is not None
        assert spec.random_input_len is not None and spec.random_output_len is not None
        assert spec.random_range_ratio is not None and spec.random_prefix_len is not None
        assert spec.burstiness is not None
        workload = load_workload(
            "random-mm", None, vision=get_vision(model) if model is not None else None, tokenizer=tokenizer,
            num_prompts=spec.num_prompts, input_len=spec.random_input_len, output_len=spec.random_output_len,
            range_ratio=(spec.random_range_ratio, spec.random_range_ratio if spec.random_output_range_ratio
                         is None else spec.random_output_range_ratio),
            prefix_len=spec.random_prefix_len, request_rate=spec.request_rate, burstiness=spec.burstiness,
            max_concurrency=spec.max_concurrency, seed=spec.seed, options=spec)
    elif spec.dataset_name in ("custom_image", "hf"):
        assert spec.request_rate is not None and spec.burstiness is not None and tokenizer is not None
        workload = load_workload(
            spec.dataset_name, spec.dataset_path, vision=get_vision(model) if model is not None else None,
            tokenizer=tokenizer, num_prompts=-1 if spec.num_prompts is None else spec.num_prompts,
            seed=spec.seed, request_rate=spec.request_rate, burstiness=spec.burstiness,
            max_concurrency=spec.max_concurrency, options=spec)
    elif spec.dataset_name in BENCH_DATASETS:
        assert spec.num_prompts is not None or spec.burstgpt_timestamps
        assert spec.burstiness is not None and tokenizer is not None
        workload = load_workload(
            spec.dataset_name, spec.dataset_path, tokenizer=tokenizer,
            num_prompts=-1 if spec.num_prompts is None else spec.num_prompts, seed=spec.seed,
            request_rate=spec.request_rate, burstiness=spec.burstiness,
            max_concurrency=spec.max_concurrency, options=spec)
    elif spec.dataset_name == "random":
        assert spec.num_prompts is not None and spec.request_rate is not None
        assert spec.random_input_len is not None and spec.random_range_ratio is not None
        assert spec.random_prefix_len is not None
        span = spec.num_prompts / spec.request_rate
        if span > MAX_ARRIVAL_TIME:
            raise UserInputError(
                f"--request-rate={show(spec.request_rate)}: {spec.num_prompts} prompts at that rate "
                f"arrive over {span:.4g} s, beyond the simulator's time span of {MAX_ARRIVAL_TIME:g} s "
                "(float64 times lose step-time precision further out); use --request-rate >= "
                f"{spec.num_prompts / MAX_ARRIVAL_TIME:.4g} or fewer --num-prompts")
        high = spec.random_prefix_len + math.ceil(spec.random_input_len * (1 + spec.random_range_ratio))
        if high > MAX_REQUEST_TOKENS:
            raise UserInputError(
                f"--random-prefix-len + --random-input-len x (1 + --random-range-ratio) = {high} "
                "tokens: must be at most 2**40 (far beyond any context window)")
        workload = load_workload(
            "random", None, num_prompts=spec.num_prompts, input_len=spec.random_input_len,
            output_len=spec.random_output_len, range_ratio=(
                spec.random_range_ratio if spec.random_output_range_ratio is None else
                {"input": spec.random_range_ratio, "output": spec.random_output_range_ratio}),
            prefix_len=spec.random_prefix_len, request_rate=spec.request_rate,
            burstiness=spec.burstiness, max_concurrency=spec.max_concurrency, seed=spec.seed,
            tokenizer=tokenizer)
    else:
        workload = load_workload(spec.dataset_name, spec.dataset_path,
                                 max_concurrency=spec.max_concurrency)
        if spec.num_prompts is not None:
            workload = workload.truncated(num_requests=spec.num_prompts)
        if spec.request_rate is not None:
            assert spec.burstiness is not None
            workload = repaced(workload, spec.request_rate, spec.burstiness, spec.seed)
    if spec.dataset_name in MM_DATASETS and notes is not None:
        notes.append("images: the scheduler runs vLLM's encoder path (encoder budget and cache "
                     "sized from the largest image; images only, video not counted) and each "
                     "scheduled image's encoder is priced on the roofline (kvsched.perf.vision); "
                     "not modelled yet: the vision tower's weights in GPU memory")
    if spec.time_scale != 1.0:
        last = workload.last_arrival_time * spec.time_scale
        if last > MAX_ARRIVAL_TIME:
            raise UserInputError(
                f"--time-scale={show(spec.time_scale)}: puts the last arrival at {last:.4g} s, beyond "
                f"the simulator's time span of {MAX_ARRIVAL_TIME:g} s; use --time-scale <= "
                f"{MAX_ARRIVAL_TIME / workload.last_arrival_time:.4g}")
        workload = workload.scaled(spec.time_scale)
    if spec.duration is not None:
        workload = workload.truncated(duration=spec.duration)
    if spec.request_timeout is not None:
        # The client's, as --max-concurrency: every copy of the workload keeps it.
        workload = dataclasses.replace(workload, request_timeout=spec.request_timeout)
    return workload


def with_loras(deployment: Deployment, spec: WorkloadSpec, workload: Workload) -> tuple[Deployment, Workload]:
    """The deployment's adapters (--lora-modules, or --num-lora-adapters
    synthetic ones) and the workload with them assigned (--lora-share,
    --lora-assignment, --lora-zipf-alpha); the LoRA workload flags need
    --enable-lora."""
    lora = deployment.lora
    if lora is None:
        if spec.uses_lora():
            raise UserInputError("--lora-share, --lora-assignment, --lora-zipf-alpha, --lora-names and "
                                 "--num-lora-adapters assign LoRA adapters to requests; add --enable-lora "
                                 "(and --lora-modules or --num-lora-adapters) or drop them")
        return deployment, workload
    if spec.num_lora_adapters is not None:
        if lora.adapters:
            raise UserInputError(f"--num-lora-adapters={spec.num_lora_adapters} with --lora-modules: the "
                                 "adapters are named twice; give one of them")
        lora = dataclasses.replace(lora, adapters=synthetic_adapters(spec.num_lora_adapters,
                                                                     lora.max_lora_rank))
        deployment = dataclasses.replace(deployment, lora=lora)
    share = DEFAULT_LORA_SHARE if spec.lora_share is None else spec.lora_share
    if share == 0:
        return deployment, workload
    if not lora.adapters:
        raise UserInputError("--enable-lora: no adapters for the requests to use; name them with "
                             "--lora-modules NAME=PATH ... or --num-lora-adapters N (or --lora-share 0 "
                             "for the base model only)")
    ids = adapter_ids_by_name(spec.lora_names, [a.name for a in lora.adapters])
    return deployment, assign_loras(workload, ids, share, spec.lora_assignment, spec.lora_zipf_alpha,
                                    spec.seed)


def workload_source(spec: WorkloadSpec) -> str:
    """Where the requests come from, for a message: the trace file, or the flags."""
    if spec.dataset_path:
        return f"--dataset-path={spec.dataset_path}"
    return f"--dataset-name {spec.dataset_name}"


def accept(deployment: Deployment, workload: Workload,
           source: str = "") -> tuple[Workload, list[tuple[str, str]]]:
    """(requests the server accepts, refused ones); an error if it accepts none
    (``source``: where the requests came from, for the message)."""
    max_model_len = deployment.scheduler_config.max_model_len
    accepted, refused = split_refused(workload, max_model_len)
    if accepted is None:
        where = f"{source}: " if source else ""
        raise UserInputError(
            f"{where}all {len(refused)} requests have prompt + output > max_model_len={max_model_len}, "
            "so the server would refuse every one; raise --max-model-len (up to the model's "
            f"{deployment.model.max_position_embeddings}) or shorten the requests")
    return accepted, refused


def prepare(spec: RunSpec) -> PreparedRun:
    """Everything a run can get wrong before it starts: the spec's values,
    the deployment (a model that does not fit is refused here), the
    workload, the refusals."""
    # Each part checked once: resolved() checks the workload it resolves.
    spec.deployment.check()
    spec.options.check()
    spec = dataclasses.replace(spec, workload=spec.workload.resolved())
    # The spec stays as given (it is saved and read back); only the groups built differ.
    built = with_transfer_offloading(spec.deployment)
    deployment, notes = build_role_deployment(built, built.group)
    prefill = None
    if built.disaggregated:
        prefill, more = build_role_deployment(built, built.groups[0])
        notes += [n for n in more if n not in notes]
        check_roles_match(prefill, deployment)
    workload = build_workload(spec.workload, spec.engine.model, notes)
    deployment, workload = with_loras(deployment, spec.workload, workload)
    accepted, refused = accept(deployment, workload, workload_source(spec.workload))
    return PreparedRun(spec, deployment, workload, accepted, refused, notes, prefill)


def with_transfer_offloading(deployment: DeploymentSpec) -> DeploymentSpec:
    """A disaggregated deployment whose ``--kv-transfer-config`` is a
    MultiConnector with an OffloadingConnector: its ``cpu_bytes_to_use`` as
    every group's ``kv_offloading_size`` (the connectors' layout checked)."""
    if not deployment.disaggregated:
        return deployment
    config = (parse_kv_transfer_config(deployment.kv_transfer_config)
              if deployment.kv_transfer_config is not None else None)
    gib = pd_connectors(config).offload_gib
    if gib is None:
        return deployment
    groups = tuple(dataclasses.replace(g, engine=dataclasses.replace(g.engine, kv_offloading_size=gib))
                   for g in deployment.groups)
    return dataclasses.replace(deployment, groups=groups)


def build_role_deployment(deployment: DeploymentSpec, group: InstanceGroup) -> tuple[Deployment, list[str]]:
    """``build_group_deployment``, its errors naming the role of a
    disaggregated deployment's group (the two roles differ in TP size)."""
    if not deployment.disaggregated:
        return build_group_deployment(group)
    try:
        # Every P/D instance runs NixlConnector (alone or in a MultiConnector).
        return build_group_deployment(group, registers_kv_cache=True)
    except UserInputError as e:
        flag = f"--{group.role}-tensor-parallel-size"
        raise UserInputError(f"the {group.role} instances ({flag}="
                             f"{group.engine.tensor_parallel_size}): {e}") from None


def check_roles_match(prefill: Deployment, decode: Deployment) -> None:
    """What both roles of a disaggregated deployment must share: the model,
    the hardware, the KV layout (block size, KV dtype) and max_model_len, and
    the vLLM release (one simulated deployment is one release)."""
    if prefill.vllm_version != decode.vllm_version:
        raise UserInputError(f"deployment.groups: the prefill instances simulate vLLM "
                             f"{prefill.vllm_version}, the decode instances vLLM {decode.vllm_version}; "
                             "give both roles the same vllm_version")
    pairs = (("model", prefill.model.name, decode.model.name),
             ("hardware", prefill.hardware.name, decode.hardware.name),
             ("block_size", prefill.cache_config.block_size, decode.cache_config.block_size),
             ("kv_cache_dtype", prefill.runtime.kv_cache_dtype, decode.runtime.kv_cache_dtype),
             ("max_model_len", prefill.scheduler_config.max_model_len, decode.scheduler_config.max_model_len))
    for name, p, d in pairs:
        if p != d:
            raise UserInputError(f"deployment.groups: the prefill instances' {name} is {show(p)}, the decode "
                                 f"instances' {show(d)}; NIXL moves KV between identical layouts: give both "
                                 "roles the same")


def serve_disaggregated(prefill: Deployment, decode: Deployment, spec: RunSpec, workload: Workload,
                        progress: Progress | None = None) -> DisaggResult:
    """Simulate ``workload`` on a disaggregated deployment (:mod:`kvsched.sim.disagg`)."""
    groups = spec.deployment.groups
    config = (parse_kv_transfer_config(spec.deployment.kv_transfer_config)
              if spec.deployment.kv_transfer_config is not None else None)
    roles = [RoleConfig(sim_config(d, spec), d.parallel.tensor_parallel_size, g.engine.data_parallel_size)
             for d, g in ((prefill, groups[0]), (decode, groups[1]))]
    sim = DisaggregatedSimulator(roles[0], roles[1], workload, model=decode.model, hardware=decode.hardware,
                                 kv_dtype_bytes=decode.runtime.kv_bytes, kv_transfer_config=config,
                                 router=spec.deployment.router, progress=progress)
    return sim.run()


def sim_config(deployment: Deployment, spec: RunSpec) -> SimConfig:
    """The simulator's settings for a built deployment under ``spec``."""
    o = spec.options
    return SimConfig(deployment.scheduler_config, deployment.cache_config, deployment.step_model,
                     eos_probability=spec.workload.eos_probability, seed=spec.workload.seed,
                     fast_forward=o.fast_forward,
                     prefill_schedule_interval=deployment.options.prefill_schedule_interval,
                     keep_token_times=o.keep_token_times, keep_step_log=o.keep_step_log,
                     speculative=deployment.speculative, offload=deployment.offload, lora=deployment.lora,
                     encoder=encoder_pricer(get_vision(spec.engine.model), deployment.hardware,
                                            deployment.parallel.tensor_parallel_size)
                     if spec.workload.dataset_name in MM_DATASETS else None)


def serve(deployment: Deployment, group: InstanceGroup, workload: Workload, config: SimConfig,
          options: RunOptions | None = None, progress: Progress | None = None,
          after_step: AfterStep | None = None) -> SimResult:
    """Simulate ``workload`` on a built deployment: one engine, or
    data-parallel ranks with the group's router and admission policy.
    ``after_step`` runs after every step (it may stop the run by raising)."""
    options = options if options is not None else RunOptions()
    dp = deployment.parallel.data_parallel_size
    if dp == 1 and group.admission_policy in ("none", "prefill-cadence"):
        if options.trace_steps:
            with open(options.trace_steps, "w") as trace:
                return Simulator(config, workload, trace_steps=trace, progress=progress).run()
        single = Simulator(config, workload, progress=progress)
        if after_step is not None:
            single.cluster.after_step.append(after_step)
        return single.run()
    if options.trace_steps:
        raise UserInputError("--trace-steps: not supported with data parallelism or DP admission "
                             "policies yet; drop it or run one engine")
    sim = build_dp_simulator(deployment, group, config, workload, progress)
    if after_step is not None:
        sim.cluster.after_step.append(after_step)
    return sim.run().combined()


def build_dp_simulator(deployment: Deployment, group: InstanceGroup, config: SimConfig,
                       workload: Workload, progress: Progress | None = None) -> DPSimulator:
    """Data-parallel ranks with the group's admission policy, publishing
    their load to each other after every step (the policies' all-gather)."""
    dp = deployment.parallel.data_parallel_size
    shared = DPRankStates(dp, group.dp_sync_interval)
    policies: list[AdmissionPolicy | None] = [None] * dp
    if group.admission_policy == "balance":
        # InstanceGroup.check keeps the threshold to BalanceThreshold's names.
        threshold = cast(BalanceThreshold, group.balance_threshold)
        policies = [BalanceGate(shared, r, threshold) for r in range(dp)]
    elif group.admission_policy == "adp-balance":
        policies = [AdpBalance(shared, r, group.adp_timeout_iters, group.adp_batching_wait_iters)
                    for r in range(dp)]
    options = DPOptions(dp, lockstep=deployment.lockstep, router=group.dp_routing,
                        stats_interval=group.dp_stats_interval, sync_interval=group.dp_sync_interval)
    sim = DPSimulator(config, workload, options, policies, shared, progress=progress)
    sim.after_step.append(lambda d: shared.publish_all([r.sched for r in d.ranks]))
    return sim


def run_prepared(prepared: PreparedRun, progress: Progress | None = None,
                 after_step: AfterStep | None = None) -> RunResult:
    """Simulate a prepared run: the result (refused requests among its
    failures, as vllm bench serve records them) and vllm bench serve's
    metrics plus per-GPU throughputs."""
    spec, deployment = prepared.spec, prepared.deployment
    disagg = None
    if prepared.prefill_deployment is not None:
        if after_step is not None or spec.options.trace_steps:
            raise UserInputError("--trace-steps: not supported with --disaggregation yet; drop it")
        disagg = serve_disaggregated(prepared.prefill_deployment, deployment, spec, prepared.accepted,
                                     progress)
        result = disagg.combined
    else:
        result = serve(deployment, spec.deployment.group, prepared.accepted, sim_config(deployment, spec),
                       spec.options, progress, after_step)
    result.failed.extend(prepared.refused)
    goodput = dict(spec.options.goodput) or None
    metrics = result.metrics(spec.options.percentiles, goodput, spec.options.percentile_metrics)
    if disagg is not None and prepared.prefill_deployment is not None:
        gpus = num_gpus(prepared.prefill_deployment) + num_gpus(deployment)
        metrics.update({f"{key}_per_gpu": metrics[key] / gpus
                        for key in ("output_throughput", "total_token_throughput") if key in metrics})
        metrics["kv_transfer"] = disagg.kv_transfer
        metrics["ttft_split_ms"] = disagg.ttft_split
        metrics["role_utilisation"] = role_utilisation({"prefill": disagg.prefill, "decode": disagg.decode})
        if disagg.kv_offload_by_role:
            metrics["kv_offload_by_role"] = disagg.kv_offload_by_role
    else:
        metrics.update(per_gpu_metrics(metrics, deployment))
    parts = (disagg.ttft_parts if disagg is not None
             else colocated_parts(result.records, result.phases, result.kv_offload is not None))
    split = summary(parts)
    if split:
        metrics["ttft_parts_ms"] = split
    return RunResult(prepared, result, metrics)


def run(spec: RunSpec, progress: Progress | None = None, after_step: AfterStep | None = None) -> RunResult:
    """Prepare and simulate ``spec``."""
    return run_prepared(prepare(spec), progress, after_step)
