"""Real vLLM serving runs against kvsched's simulator and AIConfigurator's estimate.

For each vLLM aggregated row of aiconfigurator-core's ``silicon_sample.csv``
(read and mapped by :mod:`kvsched.validation.silicon_rows`), this module
simulates it as InferenceX's client ran it (:func:`simulate_row`; the means
are ``vllm bench serve``'s), asks AIConfigurator for its own estimate
(:mod:`kvsched.validation.aic_estimate`) and keeps both next to the
measurement (:func:`evaluate_row`). ``benchmarks/validate_silicon.py`` runs
every row and writes the tables of docs/validation.md.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvsched.errors import UserInputError
from kvsched.sim.deployment import Deployment, EngineOptions, build_deployment
from kvsched.sim.pricing import pricing_of
from kvsched.sim.rank import SimResult
from kvsched.sim.run import accept, serve, sim_config
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec
from kvsched.sim.workload import Workload
from kvsched.validation.aic_estimate import AicEstimate, AicEstimator
from kvsched.validation.silicon_rows import Refusal, ServingRun, SiliconRow, build_workloads, map_row

# --------------------------------------------------------------------------
# kvsched's prediction


@dataclass(frozen=True, slots=True)
class SimulatedRow:
    """kvsched's prediction of a row with one step-time backend."""

    backend: str
    step_times: str          # what priced the steps (the deployment's own account)
    deployment: str
    mean_ttft_ms: float      # over the counted requests, as vllm bench serve's mean
    mean_tpot_ms: float      # over counted requests with more than one output token
    completed: int           # counted requests that finished (10 x CONC when none failed)
    failed: int
    warmups: int             # warm-up requests simulated first, not counted
    warmup_duration_s: float
    duration_s: float        # the counted phase, first send to last finish
    num_preemptions: int
    num_gpu_blocks: int
    notes: tuple[str, ...]
    wall_seconds: float
    # The pricing's short label (kvsched.sim.pricing: measured, roofline,
    # roofline-fallback); "" in runs saved before it was recorded.
    pricing: str = ""


def build_run_deployment(run: ServingRun, backend: str) -> tuple[Deployment, tuple[str, ...]] | Refusal:
    """The deployment of ``run`` priced by ``backend``, or kvsched's refusal.

    vllm serve's default ``max_model_len`` is the model's context; when the
    KV cache cannot hold that, vLLM refuses to start unless ``--max-model-len``
    is given, and the scripts' value is not recorded: the longest request the
    run sends (ISL + OSL) is used then, with a note."""
    return deployment_within_context(run.options, backend, run.row.isl + run.row.osl, "ISL + OSL")


def deployment_within_context(options: EngineOptions, backend: str, longest: int, longest_is: str
                              ) -> tuple[Deployment, tuple[str, ...]] | Refusal:
    """``options`` priced by ``backend``, with the notes on what was assumed.

    Where kvsched's KV cache cannot hold the model's full context, vllm
    serve refuses to start without ``--max-model-len``, whose value a
    recorded run may not state, yet the real server did start: the run's
    longest request (``longest`` tokens, ``longest_is`` says how it was
    found) is ``max_model_len`` then, with a note quoting the first refusal.
    kvsched's refusal otherwise. The one owner of that rule, and of its note,
    for every judged set of real runs."""
    options = dataclasses.replace(options, step_time_backend=backend)
    try:
        return build_deployment(options), ()
    except ValueError as err:
        if not str(err).startswith("max_model_len="):
            return Refusal(f"deployment refused ({backend})", str(err))
        first = str(err)
    try:
        deployment = build_deployment(dataclasses.replace(options, max_model_len=longest))
    except ValueError as err:
        return Refusal(f"deployment refused ({backend})", str(err))
    return deployment, (f"max_model_len {longest} ({longest_is}): kvsched's KV cache cannot hold the "
                        f"model's context ({first.split(';')[0]}), though the real server started",)


def _serve(deployment: Deployment, workload: Workload) -> SimResult:
    """The row's workload on its deployment, through kvsched's one runner
    (vLLM's router and no admission policy, as vllm serve runs)."""
    group = InstanceGroup(deployment.options)
    spec = RunSpec(DeploymentSpec((group,)))
    accepted, refused = accept(deployment, workload, workload.name)
    result = serve(deployment, group, accepted, sim_config(deployment, spec), spec.options)
    result.failed.extend(refused)
    return result


def simulate_row(run: ServingRun, backend: str = "roofline") -> SimulatedRow | Refusal:
    """Simulate ``run`` as InferenceX's client ran it; the means are over the
    counted requests only.

    The warm-ups are a phase of their own, simulated first on a fresh engine,
    then the counted requests on another fresh engine. That is the benchmark's
    order: it awaits every warm-up before sending the first counted request,
    so the engine is idle with an empty KV cache when they start. With prefix
    caching off, nothing a warm-up leaves behind (the order of free KV blocks)
    changes a later step's time, so a fresh engine serves the counted phase
    as the warmed one would (data-parallel ranks would also carry the
    router's rotating start index, which 2 × CONC routings bring back to 0
    whenever CONC is a multiple of DP, as in every such row). Running them
    as the first 2 × CONC requests of one workload instead would overlap
    warm-ups with counted requests, which the benchmark never does.
    """
    t0 = time.perf_counter()
    built = build_run_deployment(run, backend)
    if isinstance(built, Refusal):
        return built
    deployment, notes = built
    warmup_workload, workload = build_workloads(run)
    warmup = _serve(deployment, warmup_workload)
    if warmup.failed:
        return Refusal("warm-up requests failed", f"{len(warmup.failed)}: {warmup.failed[0][1]}")
    result = _serve(deployment, workload)
    if not result.records:
        return Refusal("no counted request completed", f"{len(result.failed)} failed: {result.failed[0][1]}")
    m = result.metrics()
    priced = pricing_of(deployment)
    return SimulatedRow(
        backend=backend, step_times=priced.detail, pricing=priced.label,
        deployment=deployment.describe(), mean_ttft_ms=float(m["mean_ttft_ms"]),
        mean_tpot_ms=float(m["mean_tpot_ms"]), completed=int(m["completed"]), failed=len(result.failed),
        warmups=len(warmup.records), warmup_duration_s=warmup.duration, duration_s=result.duration,
        num_preemptions=result.num_preemptions + warmup.num_preemptions,
        num_gpu_blocks=deployment.cache_config.num_gpu_blocks, notes=run.notes + notes,
        wall_seconds=time.perf_counter() - t0)


CONCURRENCY_BANDS: tuple[tuple[str, int, int | None], ...] = (
    ("1-8", 1, 8), ("9-64", 9, 64), ("65+", 65, None))


def concurrency_band(concurrency: int) -> str:
    for label, low, high in CONCURRENCY_BANDS:
        if concurrency >= low and (high is None or concurrency <= high):
            return label
    raise UserInputError(f"concurrency={concurrency!r}: must be >= 1")


@dataclass(slots=True)
class RowResult:
    """Everything the validation knows about one row."""

    row: SiliconRow
    run: ServingRun | Refusal
    kvsched: dict[str, SimulatedRow | Refusal] = field(default_factory=dict)
    aic: AicEstimate | Refusal | None = None   # None: not asked for


def evaluate_row(row: SiliconRow, backends: Sequence[str], aic: AicEstimator | None,
                 on_backend: Callable[[str, float], None] | None = None) -> RowResult:
    """Map, simulate with each backend and ask AIConfigurator, for one row.
    ``on_backend(name, seconds)`` is told how long each part took."""
    run = map_row(row)
    out = RowResult(row, run)
    for backend in backends:
        t0 = time.perf_counter()
        out.kvsched[backend] = run if isinstance(run, Refusal) else simulate_row(run, backend)
        if on_backend:
            on_backend(backend, time.perf_counter() - t0)
    if aic is not None:
        t0 = time.perf_counter()
        out.aic = aic.estimate(row)
        if on_backend:
            on_backend("aic", time.perf_counter() - t0)
    return out
