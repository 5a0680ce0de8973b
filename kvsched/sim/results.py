"""What ``simulate`` and ``compare`` save: the whole deployment and workload
described once (:func:`describe_run`, used by the JSON and the HTML report),
per-GPU throughput, ``vllm bench serve --save-detailed``'s per-request
lists, and where the file goes (:class:`ResultFile`: ``--save-result``,
``--result-dir``, ``--result-filename``, ``--append-result``, ``--label``,
``--metadata``, named and written as vllm bench serve does)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvsched.errors import UserInputError
from kvsched.sim.deployment import Deployment
from kvsched.sim.rank import SimResult
from kvsched.sim.spec import DATASET_FLAGS, InstanceGroup, RunSpec, WorkloadSpec
from kvsched.sim.workload import RandomRequests, Workload, WorkloadRequest
from kvsched.sim.workload.lora import adapter_counts
from kvsched.vllm_versions import rules_for

GIB = 2**30

# Which figures cover one data-parallel rank: each rank (engine core) has its
# own scheduler and KV cache, and the combined result keeps rank 0's step log.
PER_RANK_NOTES = {
    "scheduler": "every scheduler setting applies to each DP rank (engine core) on its own: "
                 "max_num_seqs and max_num_batched_tokens are per rank",
    "num_gpu_blocks": "per DP rank: each engine core has its own KV cache, sharded over its "
                      "tensor_parallel_size GPUs",
    "rank_0_metrics": "num_steps, busy_seconds, mean_batch_size, mean_tokens_per_step, "
                      "prefill_token_share, decode_token_share, mean_kv_cache_usage and "
                      "max_kv_cache_usage are rank 0's; request counts, throughputs, latencies, "
                      "num_preemptions and prefix_cache_hit_rate cover all ranks; the list under "
                      "'ranks' gives every rank's own engine figures",
    "per_gpu": "output_throughput_per_gpu and total_token_throughput_per_gpu divide by num_gpus "
               "(tensor_parallel_size x pipeline_parallel_size x data_parallel_size)",
}


def num_gpus(deployment: Deployment) -> int:
    p = deployment.parallel
    return p.tensor_parallel_size * p.pipeline_parallel_size * p.data_parallel_size


def deployment_dict(deployment: Deployment, group: InstanceGroup) -> dict[str, Any]:
    """Model, hardware, parallelism, scheduler and KV cache settings, as
    vLLM's engine arguments name them (values as simulated, defaults resolved)."""
    d = deployment
    sc, cc, p = d.scheduler_config, d.cache_config, d.parallel
    scheduler: dict[str, Any] = {
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_model_len": sc.max_model_len,
        "enable_chunked_prefill": sc.enable_chunked_prefill,
        "scheduling_policy": sc.policy,
        "long_prefill_token_threshold": sc.long_prefill_token_threshold,
        "async_scheduling": d.runtime.async_scheduling,
        "prefill_schedule_interval": d.options.prefill_schedule_interval,
        "admission_policy": group.admission_policy,
    }
    if group.admission_policy == "balance":
        scheduler["balance_threshold"] = group.balance_threshold
    elif group.admission_policy == "adp-balance":
        scheduler["adp_timeout_iters"] = group.adp_timeout_iters
        scheduler["adp_batching_wait_iters"] = group.adp_batching_wait_iters
    parallel: dict[str, Any] = {
        "tensor_parallel_size": p.tensor_parallel_size,
        "pipeline_parallel_size": p.pipeline_parallel_size,
        "data_parallel_size": p.data_parallel_size,
        "enable_expert_parallel": p.enable_expert_parallel,
        # vLLM shards experts only where there are experts.
        "expert_parallel_size": p.expert_parallel_size if d.model.is_moe else 1,
        "num_gpus": num_gpus(d),
    }
    if p.data_parallel_size > 1:
        parallel["dp_routing"] = group.dp_routing
        parallel["dp_stats_interval"] = group.dp_stats_interval
        if d.lockstep:
            parallel["dp_sync_interval"] = group.dp_sync_interval
    cache: dict[str, Any] = {
        "block_size": cc.block_size, "enable_prefix_caching": cc.enable_prefix_caching,
        "num_gpu_blocks": cc.num_gpu_blocks, "num_gpu_blocks_override": d.options.num_gpu_blocks_override,
        "gpu_memory_utilization": d.gpu_memory_utilization}
    if rules_for(d.vllm_version).extensible_kv_cache:
        # Only a release that has it says whether the cache was sized so.
        cache["enable_extensible_kv_cache"] = d.memory.extensible
    out: dict[str, Any] = {
        # A section of its own, as every part here (the report draws each as one).
        "vllm": {"version": d.vllm_version},
        "model": {"name": d.model.name, "checkpoint": d.options.model, "dtype": d.runtime.dtype,
                  "quantization": d.options.quantization,
                  "kv_cache_dtype": d.runtime.kv_cache_dtype, "moe": d.model.is_moe},
        "hardware": {"id": d.hardware.id, "name": d.hardware.name,
                     "memory_gib": round(d.hardware.memory_bytes / GIB, 2),
                     "efficiency_file": d.options.efficiency_file},
        "parallel": parallel,
        "step_times": step_times_dict(d),
        "scheduler": scheduler,
        "cache": cache,
        "per_rank": dict(PER_RANK_NOTES),
    }
    if d.speculative is not None:
        spec = d.speculative.to_json()
        drafter = d.step_model.drafter
        if drafter is not None:
            spec["drafter"] = drafter.describe()
        spec["drafter_weight_gib"] = round(d.memory.drafter_bytes / GIB, 3)
        out["speculative_config"] = spec
    if d.lora is not None:
        out["lora"] = d.lora.to_json()
    return out


def step_times_dict(d: Deployment) -> dict[str, Any]:
    """Which backend priced the steps, and every query past its tables."""
    sm = d.step_model
    host = sm.host
    return {"backend": sm.backend, "requested": d.options.step_time_backend,
            "pricing": sm.pricing(),
            "description": sm.describe_backend(),
            "host_terms": host.to_json() if host is not None else None,
            "extrapolated": sorted(sm.extrapolated)}


def workload_dict(spec: WorkloadSpec, workload: Workload) -> dict[str, Any]:
    """``vllm bench serve``'s workload arguments, as simulated (``spec``
    resolved: :meth:`WorkloadSpec.resolved`)."""
    out: dict[str, Any] = {
        "dataset_name": spec.dataset_name,
        "dataset_path": spec.dataset_path,
        "num_prompts": len(workload.requests),
    }
    if spec.dataset_name == "random":
        out.update({"random_input_len": spec.random_input_len,
                    "random_output_len": spec.random_output_len,
                    "random_range_ratio": spec.random_range_ratio,
                    "random_prefix_len": spec.random_prefix_len,
                    "request_rate": spec.request_rate, "burstiness": spec.burstiness})
        if spec.random_output_range_ratio is not None:
            out["random_output_range_ratio"] = spec.random_output_range_ratio
    else:
        # vllm bench serve's dataset flags given for this dataset, and the
        # pacing where it has one (a trace at its own times has none).
        out.update({dest: getattr(spec, dest) for dest, names in DATASET_FLAGS.items()
                    if spec.dataset_name in names and getattr(spec, dest) not in (None, False)})
        if spec.request_rate is not None:
            out.update({"request_rate": spec.request_rate, "burstiness": spec.burstiness})
    if spec.tokenizer is not None:
        out["tokenizer"] = spec.tokenizer
    out.update({"max_concurrency": spec.max_concurrency, "time_scale": spec.time_scale,
                "duration": spec.duration, "seed": spec.seed,
                "eos_probability": spec.eos_probability})
    if spec.request_timeout is not None:
        out["request_timeout"] = spec.request_timeout
    # The random dataset's requests stay columns unless adapters were assigned.
    counts = ({0: len(workload)} if isinstance(workload.requests, RandomRequests)
              else adapter_counts(workload))
    if spec.uses_lora() or set(counts) != {0}:
        out["lora"] = {"lora_share": spec.lora_share, "lora_assignment": spec.lora_assignment,
                       "lora_zipf_alpha": spec.lora_zipf_alpha, "num_lora_adapters": spec.num_lora_adapters,
                       "requests_per_adapter": {str(k): v for k, v in counts.items()}}
    return out


def describe_run(deployment: Deployment, spec: RunSpec,
                 workload: Workload) -> dict[str, dict[str, Any]]:
    """The saved JSON's ``deployment`` and ``workload`` (``spec``'s workload
    resolved); the report shows the same."""
    return {"deployment": deployment_dict(deployment, spec.deployment.group),
            "workload": workload_dict(spec.workload, workload)}


def per_gpu_metrics(metrics: Mapping[str, Any], deployment: Deployment) -> dict[str, float]:
    """Throughputs per GPU (GPUs = TP x DP)."""
    gpus = num_gpus(deployment)
    return {f"{key}_per_gpu": metrics[key] / gpus
            for key in ("output_throughput", "total_token_throughput") if key in metrics}


def json_safe(value: Any) -> Any:
    """``value`` with infinities written as vLLM writes an unlimited request
    rate ("inf") and NaN as null, so the file is standard JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class CompletedRequest(Protocol):
    """What the per-request lists read from a completed request's record."""

    @property
    def request_id(self) -> str: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def ttft(self) -> float: ...
    @property
    def e2el(self) -> float: ...
    @property
    def send_time(self) -> float: ...
    @property
    def client_queue_time(self) -> float: ...


# The attribute the per-request ITL lists need on a completed request's record
# (its gaps between consecutive output tokens, seconds); the simulator does not
# keep it yet.
ITLS_FIELD = "itls"
ITLS_MISSING = ("itls not written: the simulator keeps no per-request token times yet "
                "(RequestRecord.itls); the pooled ITL percentiles are in the summary keys")


def detailed_lists(requests: Sequence[WorkloadRequest], records: Sequence[CompletedRequest],
                   failed: Sequence[tuple[str, str]]) -> tuple[dict[str, list[Any]], str | None]:
    """``vllm bench serve --save-detailed``'s per-request lists, one entry per
    request in workload order: ``input_lens``, ``output_lens`` (0 for a failed
    request), ``ttfts`` (seconds; 0 when failed), ``itls`` (a list of seconds
    per request; [] when failed), ``latencies`` (send to last token; 0 when
    failed), ``start_times`` (the send, seconds of simulated time; null when
    failed: a refused request's send is not recorded), ``queue_times``
    (due to sent, the client's concurrency wait; null when failed),
    ``generated_texts`` ("" : the simulator makes no text), ``errors`` (""
    for success).

    Returns (lists, note): ``itls`` is left out, and the note says why, when
    a completed record has no per-request ITLs."""
    done = {r.request_id: r for r in records}
    errors = dict(failed)
    known = {spec.request_id for spec in requests}
    stray = [rid for rid in [*done, *errors] if rid not in known]
    if stray:
        raise RuntimeError(f"requests {stray[:3]} are in the result but not in the workload")
    have_itls = all(getattr(r, ITLS_FIELD, None) is not None for r in records)
    out: dict[str, list[Any]] = {"input_lens": [], "output_lens": [], "ttfts": [], "itls": [],
                                 "latencies": [], "start_times": [], "queue_times": [],
                                 "generated_texts": [], "errors": []}
    for spec in requests:
        rid = spec.request_id
        record = done.get(rid)
        if record is not None:
            out["input_lens"].append(record.num_prompt_tokens)
            out["output_lens"].append(record.num_output_tokens)
            out["ttfts"].append(record.ttft)
            out["itls"].append(list(getattr(record, ITLS_FIELD)) if have_itls else None)
            out["latencies"].append(record.e2el)
            out["start_times"].append(record.send_time)
            out["queue_times"].append(record.client_queue_time)
            out["errors"].append("")
        elif rid in errors:
            out["input_lens"].append(spec.num_prompt_tokens)
            out["output_lens"].append(0)
            out["ttfts"].append(0.0)
            out["itls"].append([])
            out["latencies"].append(0.0)
            out["start_times"].append(None)
            out["queue_times"].append(None)
            out["errors"].append(errors[rid])
        else:
            raise RuntimeError(f"request {rid}: neither completed nor failed in the result")
        out["generated_texts"].append("")
    if not have_itls:
        del out["itls"]
        return out, ITLS_MISSING
    return out, None


def role_utilisation(roles: Mapping[str, Sequence[SimResult]]) -> dict[str, dict[str, Any]]:
    """Each role's engines (``roles``: role -> its instances' results, data-
    parallel ranks inside each) over the whole run, from 0 to the last step
    of any role: ``busy_fraction`` (the share of that span its engine cores
    were stepping, averaged over them), ``mean_batch_size`` and
    ``mean_tokens_per_step`` (requests and tokens per step, over all its
    steps), ``mean_kv_cache_usage`` (time-weighted over busy time) and
    ``max_kv_cache_usage`` (the highest of any core), and the counts."""
    cores = {role: [rank for res in results for rank in (res.ranks or [res])]
             for role, results in roles.items()}
    span = max((rank.totals.end for ranks in cores.values() for rank in ranks), default=0.0)
    out: dict[str, dict[str, Any]] = {}
    for role, ranks in cores.items():
        totals = [rank.totals for rank in ranks]
        steps = sum(t.num_steps for t in totals)
        busy = sum(t.busy for t in totals)
        out[role] = {
            "engine_cores": len(ranks),
            "num_steps": steps,
            "busy_fraction": busy / (span * len(ranks)) if span and ranks else 0.0,
            "mean_batch_size": sum(t.num_reqs for t in totals) / steps if steps else 0.0,
            "mean_tokens_per_step": sum(t.num_tokens for t in totals) / steps if steps else 0.0,
            "mean_kv_cache_usage": sum(t.kv_usage_time for t in totals) / busy if busy else 0.0,
            "max_kv_cache_usage": max((t.engine_stats()["max_kv_cache_usage"] for t in totals), default=0.0),
        }
    return out


@dataclass(frozen=True, slots=True)
class ResultFile:
    """Where and how ``--save-result`` writes, as vllm bench serve names
    and writes its file: ``save_result`` None (not saved), "" (saved under
    vLLM's name: ``{label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json``)
    or a file name; ``result_filename`` replaces the name, ``result_dir``
    is the folder (made if missing); ``append_result`` adds a line to the
    file instead of replacing it; ``label`` (default: the backend,
    ``kvsched-simulate``) and ``metadata`` (KEY=VALUE pairs) go into the
    JSON as vLLM puts them."""

    save_result: str | None = None
    append_result: bool = False
    result_dir: str | None = None
    result_filename: str | None = None
    label: str | None = None
    metadata: tuple[tuple[str, str], ...] = ()

    @property
    def saves(self) -> bool:
        return self.save_result is not None or self.append_result

    def path(self, model: str, request_rate: float | None, max_concurrency: int | None, date: str) -> str:
        """The file to write (vLLM's ``compute_result_filename``); ``date``
        is vLLM's ``%Y%m%d-%H%M%S`` of now. A trace replayed at its own
        times has no rate: ``trace`` stands in the name."""
        label = self.label or RESULT_BACKEND
        rate = "trace" if request_rate is None else str(float(request_rate))
        concurrency = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
        name = f"{label}-{rate}qps{concurrency}-{model.split('/')[-1]}-{date}.json"
        if self.save_result:
            name = self.save_result
        if self.result_filename:
            name = self.result_filename
        if self.result_dir:
            os.makedirs(self.result_dir, exist_ok=True)
            name = os.path.join(self.result_dir, name)
        return name

    def header(self, date: str, tokenizer_id: str) -> dict[str, Any]:
        """The keys vllm bench serve writes first: date, endpoint type,
        label, tokenizer and the metadata."""
        return {"date": date, "endpoint_type": RESULT_BACKEND, "label": self.label or RESULT_BACKEND,
                "tokenizer_id": tokenizer_id, **dict(self.metadata)}


# The "backend" of kvsched simulate's results (vLLM's default label is its backend).
RESULT_BACKEND = "kvsched-simulate"


def parse_metadata(items: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--metadata KEY=VALUE ...`` as vLLM reads it (split at the first =, stripped)."""
    out = []
    for item in items or ():
        if "=" not in item:
            raise UserInputError(f"--metadata {item!r}: use KEY=VALUE (e.g. --metadata version=0.3.3 tp=1)")
        key, value = item.split("=", 1)
        out.append((key.strip(), value.strip()))
    return tuple(out)


def write_result(path: str, result: Mapping[str, Any], append: bool) -> None:
    """The result JSON to ``path`` (standard JSON: infinities as "inf");
    ``append``: one more JSON document on a new line, as ``--append-result``."""
    with open(path, "a+" if append else "w", encoding="utf-8") as f:
        if append and f.tell() != 0:
            f.write("\n")
        json.dump(json_safe(result), f, indent=None if append else 2, allow_nan=False)
        if not append:
            f.write("\n")
