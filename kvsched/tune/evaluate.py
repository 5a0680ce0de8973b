"""One simulation of the tuner: a run spec in, vLLM bench's metrics out; and
where the results are kept.

A job is its run spec (workload, percentiles and SLOs included) and the
guard: the same job gives the same metrics wherever it runs (a worker
process, a Ray node), so results are cached by a digest of the job, the
kvsched version and the bytes of every file it reads (the trace, a
calibration, a step profile: the spec names them by path only), and an
interrupted or repeated search resumes without simulating again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.errors import CannotServe, UserInputError
from kvsched.sim.pricing import pricing_of
from kvsched.sim.results import json_safe, num_gpus
from kvsched.sim.run import prepare, run_prepared
from kvsched.sim.spec import RunSpec, spec_to_json
from kvsched.tune.guard import SloGuard, SloMissed


@dataclass(frozen=True, slots=True)
class Job:
    spec: RunSpec                    # the candidate at one rate, workload, percentiles and SLOs
    input_digest: str = ""           # of the files the spec reads (inputs_digest)
    # Stop the run once its SLO (the spec's goodput on this statistic: mean,
    # 50, 90, 99) is surely missed (kvsched.tune.guard); None: run to the end.
    guard: str | None = None

    def identity(self) -> list[Any]:
        """What the job's result depends on, as JSON values."""
        return [spec_to_json(self.spec), self.input_digest, self.guard]

    def key(self, version: str) -> str:
        text = json.dumps([version, *self.identity()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def run_job(job: Job) -> dict[str, Any]:
    """``{"metrics": ..., "num_gpus": n}``; ``{"missed": why, "num_gpus": n}``
    when the guard stopped the run (both with the pricing's keys,
    :meth:`kvsched.sim.pricing.Pricing.to_json`); or ``{"error": why}`` for a
    deployment that cannot be built (it does not fit, say) or cannot serve
    the load (the simulation cannot progress)."""
    spec = job.spec
    try:
        run = prepare(spec)
    except UserInputError as e:
        return {"error": str(e)}
    # Which backend prices the candidate's steps travels with every answer.
    priced = pricing_of(run.deployment).to_json()
    # Every GPU the deployment holds: a disaggregated one's prefill instances too.
    gpus = num_gpus(run.deployment) + (num_gpus(run.prefill_deployment)
                                       if run.prefill_deployment is not None else 0)
    goodput = spec.options.goodput
    guard = None
    if job.guard is not None and goodput:
        guard = SloGuard(goodput, job.guard, len(run.accepted.requests))
    try:
        done = run_prepared(run, after_step=guard)
    except SloMissed as e:
        return {"missed": str(e), "num_gpus": gpus, **priced}
    except CannotServe as e:
        # The deployment cannot serve the load (e.g. an admission gate that
        # holds every request): an answer about this candidate, not a bug.
        return {"error": f"the simulation stopped: {e}"}
    metrics = done.metrics
    # Wall time is the machine's, not the simulation's: kept apart, so a
    # job's metrics are the same wherever and whenever it runs.
    wall = metrics.pop("simulation_wall_seconds", None)
    return {"metrics": json_safe(metrics), "num_gpus": gpus, "wall_seconds": wall,
            **priced}


def file_digest(path: str | None) -> str:
    if not path:
        return ""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def inputs_digest(paths: Sequence[str | None]) -> str:
    """One digest of the files a search's jobs read, in order (None: no such
    file): a file changed under the same path changes every job's key.
    Empty when there are none (the random dataset with no files)."""
    digests = [file_digest(p) for p in paths]
    if not any(digests):
        return ""
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


class ResultCache:
    """Results on disk, one JSON file per job key (None: no cache)."""

    def __init__(self, directory: str | None, version: str) -> None:
        self.dir = Path(directory) if directory else None
        self.version = version
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

    def get(self, job: Job) -> dict[str, Any] | None:
        if self.dir is None:
            return None
        path = self.dir / f"{job.key(self.version)}.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # absent, or a file cut short by an interruption: simulate again
        return data if isinstance(data, dict) and data.get("job") == json_safe(job.identity()) else None

    def put(self, job: Job, result: dict[str, Any]) -> None:
        if self.dir is None:
            return
        path = self.dir / f"{job.key(self.version)}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**result, "job": json_safe(job.identity())}), encoding="utf-8")
        tmp.replace(path)  # atomic: a reader sees the whole file or none
