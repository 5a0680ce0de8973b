"""The search: which candidates to simulate at which rates, and the ranking.

Two questions:

- **At a target rate** (the workload as given, or rescaled to ``rate``):
  every candidate that fits in memory is simulated once; those whose SLO
  metrics (at the chosen percentile) are within the targets are ranked by the
  objective.
- **The highest rate that meets the SLO** (``find_max_rate``): per candidate,
  a binary search over a geometric grid of rates, on the premise that a
  deployment that misses the SLO at one rate misses it at every higher one;
  all candidates search in lockstep, so each round is one parallel batch.

What makes it cheaper than the grid: candidates that cannot load are pruned
by the memory plan before anything is simulated; the rate search takes
log2(grid) simulations instead of the grid; every simulation is cached by
its command line (kvsched.tune.evaluate), so a repeated or resumed search,
or another objective over the same space, simulates nothing twice. The
objectives are computed from the same results: the ranking, the best config
and the Pareto front (goodput per GPU against the first SLO metric, over
the candidates that meet the SLO) are exact for the space searched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvsched.errors import UserInputError
from kvsched.perf.hardware import get_hardware
from kvsched.perf.model_catalog import get_model
from kvsched.perf.models import ModelSpec
from kvsched.sim.flags import spec_argv
from kvsched.sim.pricing import Pricing, pricing_from_json, pricing_of
from kvsched.sim.run import build_role_deployment, check_roles_match, with_transfer_offloading
from kvsched.sim.serve_line import release_serve_words
from kvsched.sim.spec import RunSpec
from kvsched.tune.evaluate import Job, ResultCache
from kvsched.tune.executors import Executor
from kvsched.tune.space import Candidate

OBJECTIVES = ("goodput-per-gpu", "cost", "fewest-gpus")
PERCENTILES = ("mean", "50", "90", "99")


@dataclass(frozen=True, slots=True)
class Slo:
    """Targets in milliseconds (vllm bench's goodput keys: ttft, tpot, e2el)
    on a statistic: the mean or a percentile."""

    targets: tuple[tuple[str, float], ...]
    percentile: str = "99"

    def key(self, name: str) -> str:
        return f"mean_{name}_ms" if self.percentile == "mean" else f"p{self.percentile}_{name}_ms"

    def slack(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Per target: target - value, in ms (negative: missed)."""
        return {name: target - float(metrics.get(self.key(name), math.inf))
                for name, target in self.targets}

    def met(self, metrics: Mapping[str, Any]) -> bool:
        return all(s >= 0 for s in self.slack(metrics).values())

    def percentiles(self) -> tuple[float, ...]:
        wanted = {50.0, 90.0, 99.0}
        if self.percentile != "mean":
            wanted.add(float(self.percentile))
        return tuple(sorted(wanted))


@dataclass(slots=True)
class Evaluated:
    """A candidate simulated at one rate."""

    candidate: Candidate
    rate: float | None                  # req/s asked for (None: the workload as given)
    argv: list[str]
    metrics: dict[str, Any]
    num_gpus: int
    meets_slo: bool
    slack_ms: dict[str, float]
    goodput_per_gpu: float
    cost_per_mtok: float | None         # $ per million output tokens (None: no price)
    # Why the run was stopped early (kvsched.tune.guard): the SLO was surely
    # missed; the metrics are then empty.
    stopped: str | None = None
    # --find-max-rate: the SLO was met at the grid's highest rate, so the
    # deployment's own limit is at least ``rate``, maybe more.
    rate_is_lower_bound: bool = False
    # Which step-time backend priced it (None: a cached answer from before
    # kvsched recorded it).
    pricing: Pricing | None = None

    def to_json(self, problem: Problem) -> dict[str, Any]:
        return {"label": self.candidate.label(), "shape": self.candidate.shape(),
                "candidate": self.candidate.to_json(),
                "num_gpus": self.num_gpus, "rate": self.rate, "meets_slo": self.meets_slo,
                "slack_ms": self.slack_ms, "goodput_per_gpu": self.goodput_per_gpu,
                "cost_per_mtok": self.cost_per_mtok, "stopped_early": self.stopped,
                "rate_is_lower_bound": self.rate_is_lower_bound,
                "simulate_args": self.argv,
                **(self.pricing.to_json() if self.pricing is not None else {"pricing": None}),
                "vllm_serve": problem.vllm_serve(self.candidate), "metrics": self.metrics}


@dataclass(slots=True)
class TuneResult:
    ranked: list[Evaluated]             # every candidate's answer, best first
    pareto: list[Evaluated]
    pruned: list[tuple[Candidate, str]]  # never simulated, and why
    num_simulations: int                # run now (not from the cache)
    num_cached: int
    best: Evaluated | None = None       # the best that meets the SLO
    closest: Evaluated | None = None    # when none does: the one nearest to it
    # Simulated but could not serve the load (the simulation stopped), and why.
    failed: list[tuple[Candidate, str]] = field(default_factory=list)


@dataclass(slots=True)
class Problem:
    """What the search needs to know besides the candidates."""

    model: str
    # What every candidate shares: the model, the fixed engine settings (e.g.
    # max_model_len) and the workload; a candidate fills in the rest.
    base: RunSpec
    slo: Slo
    objective: str
    prices: Mapping[str, float]         # $ per GPU-hour by hardware id
    is_random: bool                     # random dataset (rate = --request-rate) or a trace
    base_rate: float                    # the workload's own mean rate (req/s)
    input_digest: str = ""              # of the files the jobs read (evaluate.inputs_digest)
    serve_flags: Sequence[str] = ()     # the fixed engine settings vllm serve takes, as its flags
    # Stop simulations once the SLO is surely missed (kvsched.tune.guard).
    early_stop: bool = True

    def spec(self, c: Candidate, rate: float | None) -> RunSpec:
        """The run spec of candidate ``c`` at ``rate`` (None: the workload's own),
        with the SLOs as goodput and the percentiles they need."""
        spec = c.apply(self.base).with_options(
            percentiles=self.slo.percentiles(), goodput=self.slo.targets)
        if rate is not None:
            if self.is_random:
                spec = spec.with_workload(request_rate=rate)
            else:
                spec = spec.with_workload(time_scale=self.base_rate / rate)
        return spec

    def vllm_serve(self, c: Candidate) -> str:
        """The candidate's ``vllm serve`` line, with the shared flags (a
        disaggregated one: a line per instance, placed on the hardware's
        nodes, and the proxy's); the cache settings whose default is the
        release's are written where they differ from it for this candidate
        (a P/D instance's NIXL turns 0.34's extensible KV cache off)."""
        hardware = get_hardware(c.hardware)
        domain = hardware.scaleup_domain if c.disaggregated else 8
        engine = c.apply(self.base).deployment.group.engine
        fixed = [*self.serve_flags, *release_serve_words(engine, hardware, c.disaggregated)]
        return c.vllm_serve(self.model, fixed, domain)

    def reproduce(self, c: Candidate, rate: float | None) -> list[str]:
        """The ``kvsched simulate`` arguments that reproduce an answer, the
        SLOs included as ``--goodput`` (so the request goodput shows)."""
        return [*spec_argv(self.spec(c, rate)), "--goodput", *(f"{n}:{t:g}" for n, t in self.slo.targets)]

    def job(self, c: Candidate, rate: float | None) -> Job:
        # The disaggregated simulator takes no per-step hook: its runs go to the end.
        early = self.early_stop and not c.disaggregated
        return Job(self.spec(c, rate), self.input_digest, self.slo.percentile if early else None)

    def evaluated(self, c: Candidate, rate: float | None, result: Mapping[str, Any]) -> Evaluated:
        priced = pricing_from_json(dict(result))
        if "missed" in result:
            return Evaluated(c, rate, self.reproduce(c, rate), {}, int(result["num_gpus"]), False,
                             {name: -math.inf for name, _ in self.slo.targets}, 0.0, None,
                             str(result["missed"]), pricing=priced)
        metrics = dict(result["metrics"])
        gpus = int(result["num_gpus"])
        goodput = float(metrics.get("request_goodput", 0.0)) / gpus
        price = self.prices.get(c.hardware)
        out_tput = float(metrics.get("output_throughput", 0.0))
        cost = (price * gpus / (out_tput * 3600) * 1e6 if price is not None and out_tput > 0 else None)
        return Evaluated(c, rate, self.reproduce(c, rate), metrics, gpus, self.slo.met(metrics),
                         self.slo.slack(metrics), goodput, cost, pricing=priced)

    def score(self, e: Evaluated) -> tuple[float, ...]:
        """Larger is better; ties fall to fewer GPUs, then the candidate's order."""
        if self.objective == "cost":
            primary = -e.cost_per_mtok if e.cost_per_mtok is not None else -math.inf
        elif self.objective == "fewest-gpus":
            primary = -float(e.num_gpus)
        else:
            primary = e.goodput_per_gpu
        return (primary, e.goodput_per_gpu, -float(e.num_gpus))

    def shortfall(self, e: Evaluated) -> float:
        """How far a candidate misses the SLO: the worst ratio of value to target."""
        return max((-s / t if t > 0 else math.inf) for (_, t), s in
                   zip(self.slo.targets, e.slack_ms.values()))


def prune_by_memory(candidates: Sequence[Candidate], base: RunSpec
                    ) -> tuple[list[Candidate], list[tuple[Candidate, str]]]:
    """Candidates whose deployment can be built (weights and a KV cache fit),
    and the others with vLLM's reason; nothing is simulated here. A TP size
    the model's heads do not split over is no memory question but a bad
    search space: refused with the sizes that do (the deployment builder's
    own check, :meth:`ModelSpec.check_tensor_parallel_size`)."""
    keep, pruned = feasible_with_pricing(candidates, base)
    return [c for c, _ in keep], pruned


def feasible_with_pricing(candidates: Sequence[Candidate], base: RunSpec
                          ) -> tuple[list[tuple[Candidate, Pricing]], list[tuple[Candidate, str]]]:
    """:func:`prune_by_memory`, each candidate kept with the pricing of its
    steps (from the deployment built to check it)."""
    check_tensor_parallel_sizes(candidates, get_model(base.engine.model))
    keep: list[tuple[Candidate, Pricing]] = []
    pruned: list[tuple[Candidate, str]] = []
    for c in candidates:
        # The groups as the runner builds them (a P/D candidate's CPU
        # offloading comes from its MultiConnector JSON).
        deployment = with_transfer_offloading(c.apply(base).deployment)
        try:
            # Every role must fit (a disaggregated candidate: the prefill and
            # the decode instances, as the runner builds them).
            built = [build_role_deployment(deployment, g)[0] for g in deployment.groups]
            if len(built) == 2:
                check_roles_match(built[0], built[1])
        except UserInputError as e:
            pruned.append((c, str(e)))
            continue
        priced = [pricing_of(d) for d in built]
        if len({p.backend for p in priced}) > 1:
            pruned.append((c, f"the prefill instances' steps would be priced by {priced[0].describe()}, "
                              f"the decode instances' by {priced[1].describe()}: one deployment priced "
                              "two ways; give --tp sizes one backend prices"))
            continue
        # The decode instances' pricing stands for the candidate's (as run_job records it).
        keep.append((c, priced[-1]))
    return keep, pruned


def check_tensor_parallel_sizes(candidates: Sequence[Candidate], model: ModelSpec) -> None:
    """Every candidate's TP size splits ``model``'s heads, as vLLM requires."""
    sizes = {c.tensor_parallel_size for c in candidates}
    sizes |= {c.prefill_tensor_parallel_size for c in candidates if c.disaggregated}
    for tp in sorted(sizes):
        try:
            model.check_tensor_parallel_size(tp)
        except UserInputError as e:
            raise UserInputError(f"search space: {e}") from None


class Runner:
    """Jobs through the cache, then the executor for what is missing."""

    def __init__(self, executor: Executor, cache: ResultCache,
                 progress: Callable[[int, int, str], None] | None = None) -> None:
        self.executor, self.cache, self.progress = executor, cache, progress
        self.simulated = self.cached = 0
        self.total = self.finished = 0
        self.best_note = ""  # the best answer so far, for the progress line
        self.on_result: Callable[[Job, dict[str, Any]], None] | None = None

    def run(self, jobs: Sequence[Job]) -> list[dict[str, Any]]:
        results: list[dict[str, Any] | None] = [self.cache.get(j) for j in jobs]
        todo = [i for i, r in enumerate(results) if r is None]
        self.cached += len(jobs) - len(todo)
        self.finished += len(jobs) - len(todo)
        # Each result is cached as it arrives: an interrupted search resumes.
        for i, result in zip(todo, self.executor.run([jobs[i] for i in todo])):
            self.cache.put(jobs[i], result)
            results[i] = result
            if self.on_result is not None:
                self.on_result(jobs[i], result)
            self.simulated += 1
            self.finished += 1
            if self.progress is not None:
                self.progress(self.finished, self.total, self.best_note)
        return [r for r in results if r is not None]


class _BestSoFar:
    """Keeps the runner's progress note on the best answer meeting the SLO."""

    def __init__(self, problem: Problem, runner: Runner) -> None:
        self.problem, self.runner = problem, runner
        self.of: dict[Job, tuple[Candidate, float | None]] = {}
        self.best: tuple[float, ...] | None = None
        runner.on_result = self

    def add(self, c: Candidate, rate: float | None) -> None:
        self.of[self.problem.job(c, rate)] = (c, rate)

    def __call__(self, job: Job, result: dict[str, Any]) -> None:
        if "metrics" not in result or job not in self.of:
            return
        c, rate = self.of[job]
        e = self.problem.evaluated(c, rate, result)
        score = self.problem.score(e)
        if e.meets_slo and (self.best is None or score > self.best):
            self.best = score
            self.runner.best_note = f"{c.label()} ({e.goodput_per_gpu:.3g} good req/s/GPU)"


def rate_grid(base: float, low: float = 0.25, high: float = 16.0, per_doubling: int = 4) -> list[float]:
    """Rates base x 2^(k / per_doubling) from ``low`` x base to ``high`` x base."""
    lo, hi = round(math.log2(low) * per_doubling), round(math.log2(high) * per_doubling)
    return [base * 2 ** (k / per_doubling) for k in range(lo, hi + 1)]


def search(problem: Problem, candidates: Sequence[Candidate], runner: Runner,
           rate: float | None = None, find_max_rate: bool = False,
           grid: Sequence[float] | None = None
           ) -> tuple[list[Evaluated], list[tuple[Candidate, str]]]:
    """Simulate what the question needs; returns one Evaluated per candidate
    (at the target rate, or at its highest rate meeting the SLO; a candidate
    that meets it at no rate of the grid is reported at the lowest), and the
    candidates whose simulation could not run, with why."""
    failed: list[tuple[Candidate, str]] = []
    watch = _BestSoFar(problem, runner)
    for c in candidates:
        watch.add(c, rate)
    if not find_max_rate:
        runner.total += len(candidates)
        results = runner.run([problem.job(c, rate) for c in candidates])
        out: list[Evaluated] = []
        for c, r in zip(candidates, results):
            if "error" in r:
                failed.append((c, str(r["error"])))
            else:
                out.append(problem.evaluated(c, rate, r))
        return out, failed
    rates = list(grid) if grid is not None else rate_grid(problem.base_rate)
    for c in candidates:
        for grid_rate in rates:
            watch.add(c, grid_rate)
    # Per candidate: lo = highest grid index known to meet the SLO (-1: none
    # yet), hi = lowest known to miss it (len: none yet).
    lo = [-1] * len(candidates)
    hi = [len(rates)] * len(candidates)
    seen: dict[tuple[int, int], Evaluated] = {}
    errors: dict[int, str] = {}
    runner.total += len(candidates) * max(1, math.ceil(math.log2(len(rates) + 1)))
    while True:
        todo = [(i, (lo[i] + hi[i]) // 2) for i in range(len(candidates)) if hi[i] - lo[i] > 1]
        if not todo:
            break
        results = runner.run([problem.job(candidates[i], rates[k]) for i, k in todo])
        for (i, k), result in zip(todo, results):
            if "error" in result:
                errors[i] = str(result["error"])
                lo[i], hi[i] = -1, -1  # stop searching it
                continue
            e = problem.evaluated(candidates[i], rates[k], result)
            seen[(i, k)] = e
            if e.meets_slo:
                lo[i] = k
            else:
                hi[i] = k
    answers = []
    for i, c in enumerate(candidates):
        if i in errors:
            failed.append((c, errors[i]))
            continue
        k = lo[i] if lo[i] >= 0 else 0
        known = seen.get((i, k))
        if known is None:  # met nowhere and the lowest rate was not simulated
            result = runner.run([problem.job(c, rates[k])])[0]
            if "error" in result:
                failed.append((c, str(result["error"])))
                continue
            known = problem.evaluated(c, rates[k], result)
        known.rate_is_lower_bound = lo[i] == len(rates) - 1
        answers.append(known)
    return answers, failed


def rank(problem: Problem, answers: Sequence[Evaluated], pruned: list[tuple[Candidate, str]],
         runner: Runner, failed: Sequence[tuple[Candidate, str]] = ()) -> TuneResult:
    """Best first: those meeting the SLO by the objective, then the rest by
    how far they miss it. The Pareto front: among those meeting the SLO, the
    ones no other beats on both goodput per GPU and the first SLO metric."""
    order = sorted(range(len(answers)), key=lambda i: (
        (0, tuple(-x for x in problem.score(answers[i]))) if answers[i].meets_slo
        else (1, (problem.shortfall(answers[i]),)), answers[i].candidate.order_key()))
    ranked = [answers[i] for i in order]
    ok = [e for e in ranked if e.meets_slo]
    first = problem.slo.key(problem.slo.targets[0][0])

    def latency(e: Evaluated) -> float:
        return float(e.metrics.get(first, math.inf))

    pareto = [e for e in ok if not any(
        (o.goodput_per_gpu >= e.goodput_per_gpu and latency(o) <= latency(e))
        and (o.goodput_per_gpu > e.goodput_per_gpu or latency(o) < latency(e)) for o in ok)]
    pareto.sort(key=lambda e: (-e.goodput_per_gpu, latency(e), e.candidate.order_key()))
    result = TuneResult(ranked, pareto, pruned, runner.simulated, runner.cached, failed=list(failed))
    if ok:
        result.best = ok[0]
    elif ranked:
        result.closest = ranked[0]
    return result
