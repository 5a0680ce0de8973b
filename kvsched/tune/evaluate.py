"""One simulation of the tuner: a ``kvsched simulate`` command line in,
vLLM bench's metrics out; and where the results are kept.

A job is only its command line (workload included), the percentiles and the
SLOs: the same job gives the same metrics wherever it runs (a worker
process, a Ray node), so results are cached by a digest of the job, the
kvsched version and the workload file's bytes, and an interrupted or repeated
search resumes without simulating again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from kvsched.sim.command import (
    add_engine_arguments,
    add_output_arguments,
    add_workload_arguments,
    measure,
    prepare_run,
)
from kvsched.sim.results import json_safe, num_gpus
from kvsched.tune.guard import SloGuard, SloMissed


@dataclass(frozen=True, slots=True)
class Job:
    argv: tuple[str, ...]            # kvsched simulate's flags, workload included
    percentiles: tuple[float, ...]
    slos: tuple[tuple[str, float], ...]
    workload_digest: str = ""        # of the trace file's bytes ("" for random)
    # Stop the run once its SLO (``slos`` on this statistic: mean, 50, 90,
    # 99) is surely missed (kvsched.tune.guard); None: run to the end.
    guard: str | None = None

    def key(self, version: str) -> str:
        text = json.dumps([version, list(self.argv), list(self.percentiles), list(self.slos),
                           self.workload_digest, self.guard])
        return hashlib.sha256(text.encode()).hexdigest()[:32]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ValueError(f"bad simulate flags: {message}")


def simulate_parser() -> argparse.ArgumentParser:
    """``kvsched simulate``'s flags, raising ValueError instead of exiting."""
    p = _Parser(prog="kvsched simulate", add_help=False)
    add_engine_arguments(p)
    add_workload_arguments(p)
    add_output_arguments(p)
    return p


def run_job(job: Job) -> dict[str, Any]:
    """``{"metrics": ..., "num_gpus": n}``; ``{"missed": why, "num_gpus": n}``
    when the guard stopped the run; or ``{"error": why}`` for a
    deployment that cannot be built (it does not fit, say) or cannot serve
    the load (the simulation cannot progress)."""
    args = simulate_parser().parse_args([*job.argv, "--no-progress"])
    try:
        run = prepare_run(args)
    except ValueError as e:
        return {"error": str(e)}
    guard = None
    if job.guard is not None and job.slos:
        guard = SloGuard(job.slos, job.guard, len(run.accepted.requests))
    try:
        _, metrics = measure(run, job.percentiles, dict(job.slos) or None, after_step=guard)
    except SloMissed as e:
        return {"missed": str(e), "num_gpus": num_gpus(run.deployment)}
    except RuntimeError as e:
        # The deployment cannot serve the load (e.g. an admission gate that
        # holds every request): an answer about this candidate, not a bug.
        return {"error": f"the simulation stopped: {e}"}
    # Wall time is the machine's, not the simulation's: kept apart, so a
    # job's metrics are the same wherever and whenever it runs.
    wall = metrics.pop("simulation_wall_seconds", None)
    return {"metrics": json_safe(metrics), "num_gpus": num_gpus(run.deployment), "wall_seconds": wall}


def file_digest(path: str | None) -> str:
    if not path:
        return ""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
        return data if isinstance(data, dict) and data.get("argv") == list(job.argv) else None

    def put(self, job: Job, result: dict[str, Any]) -> None:
        if self.dir is None:
            return
        path = self.dir / f"{job.key(self.version)}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**result, "argv": list(job.argv)}), encoding="utf-8")
        tmp.replace(path)  # atomic: a reader sees the whole file or none
