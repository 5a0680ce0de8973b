"""Replaying an observed run on one deployment with any host terms: the run
as a workload, the simulator's latencies of each request, and the checks that
a run can be of this deployment."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvsched.calibrate.run_files import ObservedRun
from kvsched.errors import CannotServe, UserInputError
from kvsched.perf.host import HostTerms
from kvsched.perf.model_catalog import catalog_match
from kvsched.sim.deployment import Deployment
from kvsched.sim.metrics import request_latencies
from kvsched.sim.run import serve
from kvsched.sim.simulator import SimConfig, SimResult
from kvsched.sim.spec import InstanceGroup
from kvsched.sim.workload import UNIQUE_TOKEN_BASE, Workload, WorkloadRequest

FloatArray = npt.NDArray[np.float64]


def workload_of(run: ObservedRun) -> Workload:
    """The run's requests as the simulator sends them: ``cal-i`` is the i-th
    completed request, its prompt private (random prompts share nothing)."""
    requests = tuple(
        WorkloadRequest(f"cal-{i}", t, ((UNIQUE_TOKEN_BASE + i, inp),), out)
        for i, (t, inp, out) in enumerate(zip(run.arrivals, run.input_lens, run.output_lens)))
    return Workload("calibrate", requests, run.max_concurrency)


@dataclass(slots=True)
class SimulatedLatencies:
    """The simulator's TTFT and TPOT of every request of a run (seconds, in
    the run's order; TPOT NaN for a one-token output)."""

    ttfts: FloatArray
    tpots: FloatArray


def latencies_of(result: SimResult, n: int) -> SimulatedLatencies:
    records = result.records
    ttfts = np.full(n, np.nan)
    tpots = np.full(n, np.nan)
    for rid, sent, first, finish, outs in zip(records.request_id, records.send_time,
                                              records.first_token_time, records.finish_time,
                                              records.num_output_tokens):
        i = int(rid[4:])
        first_s, _, per_token = request_latencies(sent, first, finish, outs)
        ttfts[i] = first_s
        if per_token is not None:
            tpots[i] = per_token
    if result.failed or np.isnan(ttfts).any():
        rid, why = result.failed[0] if result.failed else ("?", "not finished")
        raise CannotServe(f"the replay did not complete every request ({rid}: {why})")
    return SimulatedLatencies(ttfts, tpots)


class Replayer:
    """Replays runs on one deployment, priced by any backend, with any
    host terms."""

    def __init__(self, deployment: Deployment, group: InstanceGroup | None = None) -> None:
        self.deployment = deployment
        # The DP routing and admission settings the runs were served with.
        self.group = group if group is not None else InstanceGroup()
        self.simulations = 0
        self._workloads: dict[int, tuple[ObservedRun, Workload]] = {}

    def deployment_with(self, terms: HostTerms) -> Deployment:
        # Whichever backend prices the deployment's steps, with these terms
        # (StepTimeModel.with_host: every backend carries host terms).
        d = self.deployment
        return dataclasses.replace(d, step_model=d.step_model.with_host(terms))

    def simulate(self, run: ObservedRun, terms: HostTerms) -> SimulatedLatencies:
        # Built once per run; the run is kept with it so that its id is not
        # reused by another run while the entry lives.
        cached = self._workloads.get(id(run))
        if cached is None or cached[0] is not run:
            cached = self._workloads[id(run)] = (run, workload_of(run))
        workload = cached[1]
        d = self.deployment_with(terms)
        config = SimConfig(d.scheduler_config, d.cache_config, d.step_model, fast_forward=True,
                           prefill_schedule_interval=d.options.prefill_schedule_interval,
                           keep_step_log=False)
        self.simulations += 1
        return latencies_of(serve(d, self.group, workload, config), len(run.input_lens))


def check_run(run: ObservedRun, deployment: Deployment, served_model_name: str | None = None) -> None:
    """A clear error when ``run`` is not of this deployment: another model
    (or checkpoint format), another GPU, or requests longer than its
    max_model_len."""
    model = deployment.model
    if run.model_id is not None and run.model_id != served_model_name:
        match = catalog_match(run.model_id)
        same = False
        if match is not None:
            same = match[0] == model.name
            fmt = match[1]
            if same and fmt is not None and fmt.weights != deployment.runtime.dtype:
                raise UserInputError(
                    f"{run.source}: model_id {run.model_id!r} is a checkpoint in {fmt.weights} but "
                    f"the deployment prices {model.name} in {deployment.runtime.dtype}; pass --model "
                    f"{run.model_id} (or the matching --quantization)")
        else:
            # A local path or a served name: the last path part, as written.
            tail = run.model_id.rstrip("/").rsplit("/", 1)[-1].lower()
            same = tail in (model.name.rsplit("/", 1)[-1].lower(),
                            deployment.options.model.rstrip("/").rsplit("/", 1)[-1].lower())
        if not same:
            raise UserInputError(
                f"{run.source}: the run is of model {run.model_id!r}, the deployment of {model.name} "
                f"(--model {deployment.options.model}); calibrate with that run's --model, or pass "
                f"--served-model-name {run.model_id} if the server called {model.name} so")
    if run.hardware is not None and run.hardware != deployment.hardware.id:
        raise UserInputError(f"{run.source}: the run is on hardware {run.hardware!r}, the deployment on "
                         f"{deployment.hardware.id} (--hardware); calibrate with --hardware {run.hardware}")
    limit = deployment.scheduler_config.max_model_len
    for i, (inp, out) in enumerate(zip(run.input_lens, run.output_lens)):
        if inp + out > limit:
            raise UserInputError(
                f"{run.source}: completed request {i} has {inp} prompt + {out} output tokens, more "
                f"than the deployment's max_model_len={limit}, so the server that ran it had a larger "
                "one; pass its --max-model-len")
