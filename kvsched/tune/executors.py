"""Where the tuner's simulations run: a process pool on this machine (the
default) or a Ray cluster. Both return results in job order, and a job's
result does not depend on where it ran."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol

from kvsched.tune.evaluate import Job, run_job

Done = Callable[[int], None]  # called with the number of jobs finished so far


class Executor(Protocol):
    def run(self, jobs: Sequence[Job], done: Done | None = None) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


class LocalExecutor:
    """A process pool over ``workers`` processes (1: in this process)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.pool = ProcessPoolExecutor(self.workers) if self.workers > 1 else None

    def run(self, jobs: Sequence[Job], done: Done | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        results = self.pool.map(run_job, jobs) if self.pool is not None else map(run_job, jobs)
        for result in results:
            out.append(result)
            if done is not None:
                done(len(out))
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class RayExecutor:
    """Jobs as Ray tasks: ``address`` joins a running cluster ("auto", or
    host:port), None starts a local Ray instance. Ray is optional: the
    import happens here only."""

    def __init__(self, address: str | None = None) -> None:
        try:
            import ray  # type: ignore[import-not-found, unused-ignore]
        except ModuleNotFoundError:
            raise ValueError("--executor ray needs Ray: pip install 'kvsched[ray]'") from None
        self.ray = ray
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        self.task = ray.remote(run_job)

    def run(self, jobs: Sequence[Job], done: Done | None = None) -> list[dict[str, Any]]:
        refs = [self.task.remote(job) for job in jobs]
        pending = list(refs)
        while pending:
            _, pending = self.ray.wait(pending, num_returns=1)
            if done is not None:
                done(len(refs) - len(pending))
        return list(self.ray.get(refs))

    def close(self) -> None:
        self.ray.shutdown()


def make_executor(kind: str, workers: int | None = None, address: str | None = None) -> Executor:
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(address)
    raise ValueError(f"--executor={kind!r}: choose local or ray")
