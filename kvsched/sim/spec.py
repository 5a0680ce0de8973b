"""The run spec: one typed description of a simulation.

A :class:`RunSpec` is everything a simulation depends on:

- ``deployment``: one or more instance groups (:class:`InstanceGroup`), each
  with its role, vLLM's engine arguments (:class:`EngineOptions`: model,
  precision, hardware, parallelism, scheduler and cache settings, the
  step-time backend and its inputs) and how its data-parallel ranks route
  and admit requests;
- ``workload``: ``vllm bench serve``'s dataset arguments
  (:class:`WorkloadSpec`);
- ``options``: how to run and what to keep (:class:`RunOptions`).

Every command builds one (``simulate``, ``compare``'s variants, ``tune``'s
jobs, ``calibrate``, the validation harnesses) and hands it to
:func:`kvsched.sim.run.run`; it is written to and read from JSON
(:func:`spec_to_json`, :func:`spec_from_json`) so a run can be saved,
cached and repeated. Command-line flags map onto it in
:mod:`kvsched.sim.flags`, and nowhere else.

A deployment is one group of role ``"mixed"`` (every instance prefills and
decodes), or, disaggregated, a ``"prefill"`` group and a ``"decode"`` group
(each group's ``data_parallel_size`` is its number of instances) joined by
vLLM's NixlConnector (``kv_transfer_config``; or its MultiConnector of NIXL
and CPU offloading, also made by ``kv_offloading_size``) behind a proxy that
routes within each role by ``router`` (:mod:`kvsched.sim.disagg`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kvsched.config import MAX_STEP_COUNT
from kvsched.core.kv_connector import parse_kv_transfer_config
from kvsched.core.policies import BalanceThreshold
from kvsched.engine_flags import flag, option
from kvsched.errors import UserInputError
from kvsched.fields import is_int, is_number
from kvsched.jsonfile import show
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.dp import DEFAULT_DP_STATS_INTERVAL, DEFAULT_DP_SYNC_INTERVAL, check_dp_intervals
from kvsched.sim.metrics import DEFAULT_PERCENTILE_METRICS, PERCENTILE_METRICS
from kvsched.sim.offload_transfer import transfer_config_offloading_gib
from kvsched.sim.workload import (
    BENCH_DATASETS,
    DATASET_NAMES,
    DEFAULT_INPUT_LEN,
    DEFAULT_NUM_PROMPTS,
    DEFAULT_OUTPUT_LEN,
    FILE_DATASETS,
    MAX_BURSTINESS,
    MAX_NUM_PROMPTS,
    MAX_REQUEST_TOKENS,
    MAX_SEED,
    MIN_BURSTINESS,
    BenchDatasetOptions,
)
from kvsched.sim.workload.limits import check_request_timeout
from kvsched.sim.workload.lora import check_lora_workload

# Instance roles. "mixed": prefill and decode on the same engine (vLLM's
# default); "prefill" and "decode": the two halves of a disaggregated
# deployment.
ROLES = ("mixed", "prefill", "decode")
# The proxy's choice among the instances of a role.
PD_ROUTERS = ("round-robin", "least-loaded", "prefix-aware")
ADMISSION_POLICIES = ("none", "balance", "adp-balance", "prefill-cadence")
BALANCE_THRESHOLDS: tuple[str, ...] = typing.get_args(BalanceThreshold)
DP_ROUTINGS = ("vllm", "round-robin", "least-loaded", "prefix-aware")
DEFAULT_ADP_TIMEOUT_ITERS = 50
STEPS_WHY = "a million steps is over a quarter of an hour of engine time"
# The prefill cadence needs an interval of at least 2 to gate anything.
MIN_CADENCE_INTERVAL = 2


def _int_in(dest: str, value: object, low: int, high: int, why: str) -> None:
    if value is None:
        return
    if not is_int(value) or not low <= value <= high:
        raise UserInputError(f"{option(dest)}={show(value)}: must be an integer in [{low}, {high:,}] "
                             f"({why})")


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """Instances of one role with the same engine arguments: ``engine``
    (its ``data_parallel_size`` engine cores of ``tensor_parallel_size``
    GPUs each) plus how requests reach and enter its ranks."""

    engine: EngineOptions = field(default_factory=EngineOptions)
    role: str = "mixed"
    # How requests reach and enter the ranks, each declared with its flag
    # (kvsched.engine_flags.flag; kvsched.sim.flags adds them). How arrivals
    # pick a DP rank: vLLM's load balancer or a simple rule.
    dp_routing: str = flag(
        "vllm", "how arrivals pick a DP rank (vllm: vLLM's load score on stale stats and its own "
                "in-flight counts; prefix-aware: llm-d's precise prefix-cache scorer with its queue and "
                "KV-usage scorers)", DP_ROUTINGS)
    dp_stats_interval: float = flag(
        DEFAULT_DP_STATS_INTERVAL, "seconds between the load stats the vllm router sees (default "
                                   "%(default)s)")
    dp_sync_interval: int = flag(
        DEFAULT_DP_SYNC_INTERVAL, "lockstep (MoE) DP ranks: steps between the all-reduces that find "
                                  "every rank idle and end a wave (default: %(default)s)")
    # An admission policy on every rank (kvsched.core.policies).
    admission_policy: str = flag(
        "none", "admission policy on every rank (see docs/simulator.md)", ADMISSION_POLICIES)
    balance_threshold: str = flag(
        "full", "balance: hold while any rank runs max_num_seqs (full) or one less", BALANCE_THRESHOLDS)
    adp_timeout_iters: int = flag(
        DEFAULT_ADP_TIMEOUT_ITERS, "adp-balance: steps a rank waits for the others before it admits "
                                   "anyway (default: %(default)s)")
    adp_batching_wait_iters: int = flag(
        0, "adp-balance: extra steps to wait so admissions batch up (default: %(default)s)")

    def check(self) -> None:
        """Every setting of the group on its own (the engine's own are
        checked when the deployment is built)."""
        _choice("role", self.role, ROLES)
        _choice("dp_routing", self.dp_routing, DP_ROUTINGS)
        _choice("admission_policy", self.admission_policy, ADMISSION_POLICIES)
        _choice("balance_threshold", self.balance_threshold, BALANCE_THRESHOLDS)
        check_dp_intervals(self.dp_stats_interval, self.dp_sync_interval)
        _int_in("adp_timeout_iters", self.adp_timeout_iters, 0, MAX_STEP_COUNT, STEPS_WHY)
        _int_in("adp_batching_wait_iters", self.adp_batching_wait_iters, 0, MAX_STEP_COUNT, STEPS_WHY)

    def engine_options(self) -> EngineOptions:
        """The engine arguments as run: the prefill-cadence policy gates
        prefill every ``prefill_schedule_interval`` steps, at least every 2."""
        e = self.engine
        # Only a valid interval is raised: a bad one is left for
        # build_deployment's validation to name.
        if (self.admission_policy == "prefill-cadence" and is_int(e.prefill_schedule_interval)
                and 1 <= e.prefill_schedule_interval < MIN_CADENCE_INTERVAL):
            return dataclasses.replace(e, prefill_schedule_interval=MIN_CADENCE_INTERVAL)
        return e


def _choice(dest: str, value: object, allowed: tuple[str, ...], why: str = "") -> None:
    if value not in allowed:
        extra = f" ({why})" if why else ""
        raise UserInputError(f"{option(dest)}={show(value)}: use one of {', '.join(allowed)}{extra}")


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """What is deployed: its instance groups; with prefill and decode
    groups, vLLM's ``--kv-transfer-config`` (JSON; None: NixlConnector,
    ``kv_both``) and the proxy's ``router`` within each role."""

    groups: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    # Each declared with its flag (kvsched.sim.flags adds them).
    kv_transfer_config: str | None = flag(
        None, "vLLM's --kv-transfer-config with --disaggregation (default: "
              '\'{"kv_connector": "NixlConnector", "kv_role": "kv_both"}\'; a MultiConnector of '
              "NixlConnector and OffloadingConnector adds CPU offloading)", metavar="JSON")
    router: str = flag(
        "round-robin", "with --disaggregation: how the proxy picks an instance of each role "
                       "(default: %(default)s, as vLLM's proxy)", PD_ROUTERS)

    def check(self) -> None:
        roles = tuple(g.role for g in self.groups)
        if roles not in (("mixed",), ("prefill", "decode")):
            raise UserInputError(f"deployment.groups: roles {list(roles)}; a deployment is one group of "
                                 "role 'mixed', or a 'prefill' group then a 'decode' group "
                                 "(--disaggregation xPyD)")
        _choice("router", self.router, PD_ROUTERS)
        if not self.disaggregated and (self.kv_transfer_config is not None or self.router != "round-robin"):
            flag = "--kv-transfer-config" if self.kv_transfer_config is not None else "--router"
            raise UserInputError(f"{flag}: only with prefill/decode disaggregation; add --disaggregation "
                                 f"xPyD (e.g. 1P1D) or drop {flag}")
        for group in self.groups:
            group.check()
        if self.kv_transfer_config is not None:
            config = parse_kv_transfer_config(self.kv_transfer_config)
            if transfer_config_offloading_gib(config) is not None:
                for group in self.groups:
                    if group.engine.kv_offloading_size is not None:
                        raise UserInputError("--kv-offloading-size with a --kv-transfer-config whose "
                                             "MultiConnector has an OffloadingConnector: two CPU cache "
                                             "sizes; give it once (cpu_bytes_to_use, or "
                                             "--kv-offloading-size)")
        if self.disaggregated:
            for group in self.groups:
                if group.engine.enable_lora:
                    raise UserInputError(f"--enable-lora with --disaggregation: LoRA on the {group.role} "
                                         "instances is not simulated yet; drop one of them")
                if group.engine.enable_expert_parallel:
                    raise UserInputError(f"--enable-expert-parallel with --disaggregation: the {group.role} "
                                         "instances' lockstep expert-parallel ranks are not simulated yet; "
                                         "drop one of them")

    @property
    def disaggregated(self) -> bool:
        return len(self.groups) == 2

    @property
    def group(self) -> InstanceGroup:
        """The one group of a deployment without roles (the decode group of a
        disaggregated one)."""
        return self.groups[-1]


def parse_disaggregation(text: str) -> tuple[int, int]:
    """``xPyD`` (e.g. ``1P2D``) as (prefill instances, decode instances)."""
    t = text.strip().upper()
    try:
        p, rest = t.split("P", 1)
        d, tail = rest.split("D", 1)
        x, y = int(p), int(d)
    except ValueError:
        x = y = 0
        tail = "?"
    if tail or x < 1 or y < 1:
        raise UserInputError(f"--disaggregation={text!r}: give xPyD with x prefill and y decode instances, "
                             "each at least 1, e.g. 1P2D")
    return x, y


def deployment_spec(group: InstanceGroup, disaggregation: str | None, prefill_tp: int | None,
                    decode_tp: int | None, kv_transfer_config: str | None, router: str, *,
                    role_scheduler: Mapping[str, Mapping[str, int | None]] | None = None,
                    role_offloading: Mapping[str, float | None] | None = None) -> DeploymentSpec:
    """The deployment of the flags: ``group`` alone, or with
    ``--disaggregation xPyD`` a prefill group of x instances and a decode
    group of y (each instance an engine core: a group's
    ``data_parallel_size``), both with ``group``'s settings but their TP,
    the scheduler settings ``role_scheduler[role]`` gives (None: the
    group's; :data:`ROLE_SCHEDULER_FLAGS`) and the CPU offloading
    ``role_offloading[role]`` gives (``--prefill-kv-offloading-size``;
    None: the group's ``kv_offloading_size``)."""
    given = {(role, name): value for role, names in (role_scheduler or {}).items()
             for name, value in names.items() if value is not None}
    offloading = {role: gib for role, gib in (role_offloading or {}).items() if gib is not None}
    for (role, name), value in given.items():
        least = 0 if name == "long_prefill_token_threshold" else 1
        if not is_int(value) or value < least:
            flag = f"--{role}-{name.replace('_', '-')}"
            raise UserInputError(f"{flag}={value!r}: must be an integer >= {least} (leave it out for the "
                                 "value every instance gets)")
    if disaggregation is None:
        alone: list[tuple[str, float | None]] = [("--prefill-tensor-parallel-size", prefill_tp),
                                                ("--decode-tensor-parallel-size", decode_tp)]
        alone += [(f"--{role}-{name.replace('_', '-')}", v) for (role, name), v in given.items()]
        alone += [(f"--{role}-kv-offloading-size", v) for role, v in offloading.items()]
        for flag, v in alone:
            if v is not None:
                raise UserInputError(f"{flag}={v}: only with --disaggregation xPyD; add it or drop {flag}")
        return DeploymentSpec((group,), kv_transfer_config, router)
    x, y = parse_disaggregation(disaggregation)
    if group.engine.data_parallel_size != 1:
        raise UserInputError(f"--data-parallel-size={group.engine.data_parallel_size} with --disaggregation: "
                             "give the instances of each role as xPyD (each instance one engine core)")
    tp = group.engine.tensor_parallel_size
    roles = []
    for role, n, role_tp in (("prefill", x, prefill_tp), ("decode", y, decode_tp)):
        own: dict[str, Any] = {name: value for (r, name), value in given.items() if r == role}
        if role in offloading:
            own["kv_offloading_size"] = offloading[role]
        engine = dataclasses.replace(group.engine, tensor_parallel_size=tp if role_tp is None else role_tp,
                                     data_parallel_size=n, **own)
        roles.append(dataclasses.replace(group, engine=engine, role=role))
    return DeploymentSpec(tuple(roles), kv_transfer_config, router)


@dataclass(frozen=True, slots=True)
class WorkloadSpec(BenchDatasetOptions):
    """``vllm bench serve``'s dataset arguments: the benchmark datasets' own
    flags (:class:`BenchDatasetOptions`, declared there once, each only for
    its dataset: DATASET_FLAGS) and these. The random dataset's
    fields are None when not given, so that a field set for a trace is
    refused (it would be ignored); :meth:`resolved` fills vLLM bench's
    defaults."""

    dataset_name: str = "random"
    dataset_path: str | None = None
    num_prompts: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    # The output lengths' own ratio (vLLM's --random-range-ratio
    # '{"input": a, "output": b}'); None: random_range_ratio's.
    random_output_range_ratio: float | None = None
    random_prefix_len: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    # Seconds the client waits for a complete response before it gives up
    # and the server aborts the request (kvsched's: vllm bench serve's
    # client waits 6 hours); None: no timeout.
    request_timeout: float | None = None
    seed: int = 0
    # Multiply arrival times (0.5 = twice the rate).
    time_scale: float = 1.0
    # Keep only requests arriving before this many seconds.
    duration: float | None = None
    # Per-token EOS probability (0: every request's output length, as
    # ignore_eos does).
    eos_probability: float = 0.0
    # LoRA (kvsched.sim.workload.lora): the share of requests naming an
    # adapter (None: 1 with --enable-lora), vllm bench's --lora-assignment,
    # a Zipf skew over the adapters, and synthetic adapters when
    # --lora-modules names none.
    lora_share: float | None = None
    lora_assignment: str = "random"
    lora_zipf_alpha: float | None = None
    num_lora_adapters: int | None = None
    # vllm bench serve's --lora-modules: the adapters requests pick from, by
    # name (empty: every adapter the server has).
    lora_names: tuple[str, ...] = ()
    # The tokenizer the benchmark datasets count tokens with (a directory
    # with tokenizer.json, or a Hugging Face id in the local cache; None:
    # the model's, else an approximation with a warning).
    tokenizer: str | None = None

    def check(self) -> None:
        """Every number in its stated range."""
        _choice("dataset_name", self.dataset_name, DATASET_NAMES)
        n = self.num_prompts
        if n is not None and isinstance(n, int) and not isinstance(n, bool) and n < 1:
            raise UserInputError(f"--num-prompts={show(n)}: must be at least 1; leave it out to send "
                                 f"{DEFAULT_NUM_PROMPTS} random prompts or a whole trace")
        _int_in("num_prompts", n, 1, MAX_NUM_PROMPTS,
                "the random dataset draws every request up front; memory grows with the count")
        tokens_why = ("2**40, far beyond any context window; a longer request is refused against "
                      "max_model_len anyway")
        for dest in ("random_input_len", "random_output_len", "random_prefix_len"):
            _int_in(dest, getattr(self, dest), 0, MAX_REQUEST_TOKENS, tokens_why)
        for dest in ("random_range_ratio", "random_output_range_ratio"):
            ratio = getattr(self, dest)
            if ratio is not None and not (_is_number(ratio) and 0 <= ratio < 1):
                raise UserInputError(f"{option(dest)}={show(ratio)}: must be in [0, 1) (lengths are "
                                     "drawn within +-ratio of --random-input-len / --random-output-len)")
        rate = self.request_rate
        if rate is not None and not (_is_number(rate) and rate > 0):
            raise UserInputError(f"--request-rate={show(rate)}: must be > 0 requests/s; inf (the "
                                 "default) sends every request at once")
        b = self.burstiness
        if b is not None and not (_is_number(b) and (MIN_BURSTINESS <= b <= MAX_BURSTINESS or b == math.inf)):
            raise UserInputError(
                f"--burstiness={show(b)}: must be in [{MIN_BURSTINESS}, {MAX_BURSTINESS:g}] or inf "
                "(constant gaps); below, numpy's gamma gaps underflow to 0 and the arrivals are not "
                "the process asked for; 1 is Poisson")
        mc = self.max_concurrency
        if mc is not None and (not is_int(mc) or mc < 1):
            raise UserInputError(f"--max-concurrency={show(mc)}: must be at least 1 (above the number of "
                                 "requests it is no limit); leave it out for no limit")
        check_request_timeout(self.request_timeout)
        _int_in("seed", self.seed, 0, MAX_SEED, "vLLM seeds numpy's RandomState, which takes 32-bit seeds")
        scale = self.time_scale
        if not (_is_number(scale) and 0 < scale < math.inf):
            raise UserInputError(f"--time-scale={show(scale)}: must be a finite number > 0 (0.5 = twice "
                                 "the request rate)")
        if self.duration is not None and not (_is_number(self.duration) and self.duration > 0):
            raise UserInputError(f"--duration={show(self.duration)}: must be > 0 seconds; leave it out to "
                                 "keep every request")
        p = self.eos_probability
        if not (_is_number(p) and 0 <= p < 1):
            raise UserInputError(f"--eos-probability={show(p)}: must be in [0, 1) (the chance each output "
                                 "token is EOS; 0 generates every request's output length)")
        check_lora_workload(self.lora_share, self.lora_assignment, self.lora_zipf_alpha,
                            self.num_lora_adapters)
        names = self.lora_names
        if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
            raise UserInputError(f"--lora-names={self.lora_names!r}: give adapter names")

    def uses_lora(self) -> bool:
        """Whether any LoRA workload setting is given (they need --enable-lora)."""
        return (self.lora_share is not None or self.lora_zipf_alpha is not None
                or self.num_lora_adapters is not None or self.lora_assignment != "random"
                or bool(self.lora_names))

    def resolved(self) -> WorkloadSpec:
        """This spec checked, its fields checked against the dataset, and
        vllm bench serve's defaults filled in for the random dataset and the
        benchmark datasets (num_prompts, request_rate, burstiness); a trace
        keeps None: all its requests at its own times unless
        ``request_rate`` re-paces it."""
        self.check()
        self._check_dataset_flags()
        if self.dataset_name in (*BENCH_DATASETS, "custom_image"):
            return self._resolved_bench()
        if self.dataset_name in ("random", "random-mm"):
            if self.dataset_path is not None:
                raise UserInputError(
                    f"--dataset-path={self.dataset_path}: --dataset-name is {self.dataset_name}, "
                    "which reads no file; add --dataset-name sharegpt, burstgpt, sonnet, custom, azure, "
                    "mooncake or jsonl for the file's format")
            filled = {dest: default for dest, default in RANDOM_DEFAULTS.items()
                      if getattr(self, dest) is None}
            if self.num_prompts is None:
                filled["num_prompts"] = DEFAULT_NUM_PROMPTS
            return dataclasses.replace(self, **filled)
        if not self.dataset_path:
            raise UserInputError(f"--dataset-name {self.dataset_name}: needs --dataset-path, the trace "
                                 "file to replay")
        if self.burstiness is not None and self.request_rate is None:
            raise UserInputError(
                f"--burstiness={self.burstiness:g}: the {self.dataset_name} trace keeps its own arrival "
                "times unless --request-rate re-paces it; add --request-rate or drop --burstiness")
        for dest in RANDOM_ONLY:
            value = getattr(self, dest)
            if value is not None:
                raise UserInputError(
                    f"{option(dest)}={value:g}: only for --dataset-name random; the "
                    f"{self.dataset_name} dataset takes each request's lengths from the trace, drop the flag")
        if self.request_rate is not None:
            # Re-paced: the trace's lengths and order at vllm bench serve's arrivals.
            if self.time_scale != 1.0:
                raise UserInputError(f"--time-scale={self.time_scale:g} with --request-rate: the rate "
                                     "replaces the trace's times; give one of them")
            return dataclasses.replace(self, burstiness=1.0 if self.burstiness is None else self.burstiness)
        return self

    def _check_dataset_flags(self) -> None:
        """Every dataset flag given belongs to the dataset named."""
        for dest, datasets in DATASET_FLAGS.items():
            value = getattr(self, dest)
            if value is not None and value is not False and self.dataset_name not in datasets:
                raise UserInputError(f"{option(dest)}: only for --dataset-name {' or '.join(datasets)}; "
                                     f"--dataset-name is {self.dataset_name}, drop the flag")
        for dest in ("sharegpt_output_len", "sonnet_input_len", "sonnet_output_len", "sonnet_prefix_len",
                     "prefix_repetition_prefix_len", "prefix_repetition_suffix_len",
                     "prefix_repetition_num_prefixes", "prefix_repetition_output_len"):
            least = 0 if dest in ("sonnet_prefix_len", "prefix_repetition_prefix_len",
                                  "prefix_repetition_suffix_len") else 1
            _int_in(dest, getattr(self, dest), least, MAX_REQUEST_TOKENS,
                    "2**40 tokens: far beyond any context")
        out = self.custom_output_len
        if out is not None and out != -1:
            _int_in("custom_output_len", out, 1, MAX_REQUEST_TOKENS,
                    "-1 takes each line's output_tokens; 2**40 is far beyond any context")

    def _resolved_bench(self) -> WorkloadSpec:
        name = self.dataset_name
        reads_file = name in FILE_DATASETS or name == "custom_image"
        if reads_file and not self.dataset_path:
            raise UserInputError(f"--dataset-name {name}: needs --dataset-path, the file vllm bench serve "
                                 "samples it from")
        if not reads_file and self.dataset_path is not None:
            raise UserInputError(f"--dataset-path={self.dataset_path}: --dataset-name {name} is synthetic "
                                 "and reads no file; drop --dataset-path")
        for dest in RANDOM_ONLY:
            value = getattr(self, dest)
            if value is not None:
                raise UserInputError(f"{option(dest)}={value:g}: only for --dataset-name random; drop it")
        timed = self.burstgpt_timestamps and self.request_rate is None
        if timed and self.burstiness is not None:
            raise UserInputError("--burstiness with --burstgpt-timestamps: the rows keep their own times "
                                 "unless --request-rate re-paces them; add --request-rate or drop "
                                 "--burstiness")
        if not timed and self.time_scale != 1.0:
            raise UserInputError(f"--time-scale={self.time_scale:g}: --dataset-name {name} sends at "
                                 "--request-rate; scale that instead")
        filled: dict[str, Any] = {"burstiness": 1.0 if self.burstiness is None else self.burstiness}
        if not timed and self.request_rate is None:
            filled["request_rate"] = math.inf
        if self.num_prompts is None and not timed:
            filled["num_prompts"] = DEFAULT_NUM_PROMPTS
        return dataclasses.replace(self, **filled)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


# Each dataset flag and the datasets it belongs to.
DATASET_FLAGS: Mapping[str, tuple[str, ...]] = types.MappingProxyType({
    "sharegpt_output_len": ("sharegpt",),
    "custom_output_len": ("custom", "custom_image"),
    "skip_chat_template": ("custom",),
    "sonnet_input_len": ("sonnet",),
    "sonnet_output_len": ("sonnet",),
    "sonnet_prefix_len": ("sonnet",),
    "prefix_repetition_prefix_len": ("prefix_repetition",),
    "prefix_repetition_suffix_len": ("prefix_repetition",),
    "prefix_repetition_num_prefixes": ("prefix_repetition",),
    "prefix_repetition_output_len": ("prefix_repetition",),
    "disable_shuffle": ("sharegpt", "custom", "prefix_repetition", "custom_image", "hf"),
    "no_oversample": ("sharegpt", "custom", "custom_image", "hf"),
    "hf_name": ("hf",),
    "hf_split": ("hf",),
    "hf_output_len": ("hf",),
    "burstgpt_timestamps": ("burstgpt",),
    "random_mm_base_items_per_request": ("random-mm",),
    "random_mm_num_mm_items_range_ratio": ("random-mm",),
    "random_mm_limit_mm_per_prompt": ("random-mm",),
    "random_mm_bucket_config": ("random-mm",),
})

# The random dataset's defaults (vllm bench serve's, but the rate: all at once).
RANDOM_DEFAULTS: Mapping[str, Any] = types.MappingProxyType({
    "random_input_len": DEFAULT_INPUT_LEN,
    "random_output_len": DEFAULT_OUTPUT_LEN,
    "random_range_ratio": 0.0,
    "random_prefix_len": 0,
    "request_rate": math.inf,
    "burstiness": 1.0,
})
# The random dataset's own flags (the rate and burstiness pace any dataset).
RANDOM_ONLY = (*(dest for dest in RANDOM_DEFAULTS if dest not in ("request_rate", "burstiness")),
               "random_output_range_ratio")


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to run and what to keep."""

    # Advance pure-decode stretches in one exact jump.
    fast_forward: bool = True
    # Percentiles of the latency metrics.
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    # Which metrics get percentiles (vllm bench serve's --percentile-metrics).
    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    # SLOs in ms (vllm bench's --goodput keys: ttft, tpot, e2el).
    goodput: tuple[tuple[str, float], ...] = ()
    # Keep every request's token times (--save-detailed's lists).
    keep_token_times: bool = False
    # Keep every step for timelines (the HTML report plots them).
    keep_step_log: bool = False
    # Write the scheduler's step trace here (steps every step).
    trace_steps: str | None = None

    def check(self) -> None:
        if not self.percentiles or any(not (_is_number(p) and 0 <= p <= 100) for p in self.percentiles):
            raise UserInputError(f"--metric-percentiles={','.join(map(str, self.percentiles))}: each must "
                                 "be in [0, 100]")
        unknown = [m for m in self.percentile_metrics if m not in PERCENTILE_METRICS]
        if not self.percentile_metrics or unknown:
            given = ",".join(map(str, self.percentile_metrics))
            raise UserInputError(f"--percentile-metrics={given}: choose from {','.join(PERCENTILE_METRICS)}")
        for name, target in self.goodput:
            if name not in ("ttft", "tpot", "e2el") or not (_is_number(target) and target >= 0):
                raise UserInputError(f"--goodput {name}:{show(target)}: use ttft, tpot or e2el with a "
                                     "target in ms >= 0")


@dataclass(frozen=True, slots=True)
class RunSpec:
    deployment: DeploymentSpec = field(default_factory=DeploymentSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    options: RunOptions = field(default_factory=RunOptions)

    def check(self) -> None:
        self.deployment.check()
        self.workload.check()
        self.options.check()

    @property
    def engine(self) -> EngineOptions:
        """The one group's engine arguments (a deployment without roles)."""
        return self.deployment.group.engine

    def with_engine(self, **changes: Any) -> RunSpec:
        """A copy with the one group's engine arguments changed."""
        if self.deployment.disaggregated:
            raise ValueError("with_engine: a disaggregated deployment has two groups")
        group = self.deployment.group
        group = dataclasses.replace(group, engine=dataclasses.replace(group.engine, **changes))
        return dataclasses.replace(self, deployment=DeploymentSpec((group,)))

    def with_group(self, **changes: Any) -> RunSpec:
        """A copy with the one group's routing/admission settings changed."""
        if self.deployment.disaggregated:
            raise ValueError("with_group: a disaggregated deployment has two groups")
        group = dataclasses.replace(self.deployment.group, **changes)
        return dataclasses.replace(self, deployment=DeploymentSpec((group,)))

    def with_workload(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, workload=dataclasses.replace(self.workload, **changes))

    def with_options(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))


# ---------------------------------------------------------------------------
# JSON


def spec_to_json(spec: RunSpec) -> dict[str, Any]:
    """The spec as JSON values (every field, defaults included)."""
    return _to_json(spec)  # type: ignore[no-any-return]


def _to_json(value: object) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "inf": JSON has no infinity
    return value


def spec_from_json(data: object, where: str = "run spec") -> RunSpec:
    """A :class:`RunSpec` from :func:`spec_to_json`'s form; any unknown key
    or wrongly typed value is a :class:`UserInputError` naming its path.
    Missing keys take their defaults."""
    spec = _from_json(RunSpec, data, where)
    assert isinstance(spec, RunSpec)
    return spec


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _from_json(kind: Any, data: object, where: str) -> object:
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        if not isinstance(data, dict):
            raise UserInputError(f"{where}: expected an object of {kind.__name__}'s fields, got "
                                 f"{type(data).__name__}")
        names = {f.name for f in fields(kind)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UserInputError(f"{where}: unknown key {show(unknown[0])}; {kind.__name__} has "
                                 f"{', '.join(sorted(names))}")
        hints = _hints(kind)
        kwargs = {k: _from_json(hints[k], v, f"{where}.{k}") for k, v in data.items()}
        return kind(**kwargs)
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _from_json(inner, data, where)
    if origin is tuple:
        if not isinstance(data, list):
            raise UserInputError(f"{where}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_from_json(args[0], v, f"{where}[{i}]") for i, v in enumerate(data))
        if len(data) != len(args):
            raise UserInputError(f"{where}: expected a list of {len(args)} items, got {len(data)}")
        return tuple(_from_json(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
    if kind is bool:
        if not isinstance(data, bool):
            raise UserInputError(f"{where}={show(data)}: expected true or false")
        return data
    if kind is int:
        if not is_int(data):
            raise UserInputError(f"{where}={show(data)}: expected an integer")
        return data
    if kind is float:
        if data in ("inf", "Infinity"):
            return math.inf
        if not is_number(data):
            raise UserInputError(f"{where}={show(data)}: expected a number")
        return float(data)
    if kind is str:
        if not isinstance(data, str):
            raise UserInputError(f"{where}={show(data)}: expected a string")
        return data
    raise TypeError(f"run spec field {where} has a type the JSON reader does not know: {kind!r}")
