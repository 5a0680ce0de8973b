"""Where the tuner's simulations run: a process pool on this machine (the
default) or a Ray cluster. Both return results in job order, and a job's
result does not depend on where it ran."""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol

from kvsched.errors import UserInputError
from kvsched.tune.evaluate import Job, run_job


class Executor(Protocol):
    def run(self, jobs: Sequence[Job]) -> Iterator[dict[str, Any]]:
        """Each job's result, in job order, as soon as it and those before it are done."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """A process pool over ``workers`` processes (1: in this process)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        # Workers come from a fork server, not a fork of this process: a fork
        # copies this process's threads' locks mid-use (a Ray client, a
        # progress thread) and the child can hang on one.
        self.pool = (ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("forkserver"))
                     if self.workers > 1 else None)

    def run(self, jobs: Sequence[Job]) -> Iterator[dict[str, Any]]:
        if self.pool is None:
            yield from map(run_job, jobs)
        else:
            yield from self.pool.map(run_job, jobs)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class RayExecutor:
    """Jobs as Ray tasks, one CPU each. ``address`` joins a running cluster
    ("auto": the one in RAY_ADDRESS or started on this machine by ``ray
    start``; or host:port); None starts a local Ray instance of ``num_cpus``
    CPUs (default: all cores), without the dashboard or usage statistics,
    in a directory of its own under the system temp, removed by ``close``.
    Ray already initialized in this process (by the caller) is used as it
    is. Ray is optional: the import happens here only."""

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        try:
            import ray  # type: ignore[import-not-found, unused-ignore]
        except ModuleNotFoundError:
            raise UserInputError("--executor ray needs Ray: pip install 'kvsched[ray]'") from None
        self.ray: Any = ray
        self.started = False  # close() shuts down only an instance started here
        self.temp_dir: str | None = None
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                       # Ray's notices (token auth, ...) would mix with the table.
                                       "logging_level": logging.ERROR}
            if address is None:
                # Ray does not collect them from ray.init's local instances;
                # said here too, for the versions and wheels that would.
                os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
                self.temp_dir = tempfile.mkdtemp(prefix="kvsched-ray-", dir=_short_temp_root())
                options.update(address="local", num_cpus=num_cpus or os.cpu_count() or 1,
                               _temp_dir=self.temp_dir)
            else:
                _check_reachable(address)
                options["address"] = address
            try:
                ray.init(**options)
            except BaseException:
                self._remove_temp_dir()
                raise
            self.started = True
        self.task = ray.remote(run_job)

    def run(self, jobs: Sequence[Job]) -> Iterator[dict[str, Any]]:
        refs = [self.task.remote(job) for job in jobs]  # all queued at once
        given = 0
        try:
            for ref in refs:
                result = self.ray.get(ref)
                # Counted before the yield: a caller that stops reading right
                # after the last result (zip does) must not cancel a task
                # that has finished (Ray 2.60 aborts the process on that race).
                given += 1
                yield result
        finally:
            # Interrupted (Ctrl-C), a job failed or the caller stopped reading:
            # do not leave the rest running.
            for ref in refs[given:]:
                self.ray.cancel(ref)

    def close(self) -> None:
        if not self.started:
            return
        self.started = False
        try:
            self.ray.shutdown(wait_for_processes=True)
        except TypeError:  # a Ray without wait_for_processes
            self.ray.shutdown()
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None


def _check_reachable(address: str) -> None:
    """A host:port address (``ray://`` too) must answer: Ray itself retries
    an unreachable one for minutes, printing a warning every few seconds."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return  # "auto", "local": Ray finds the cluster (or says it found none)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise UserInputError(f"--ray-address {address}: no Ray cluster answers there ({e})") from None


def _short_temp_root() -> str:
    """The system temp, unless its path is too long for the Unix sockets Ray
    puts under it (103 bytes at most on macOS, 107 on Linux; Ray's session
    and socket names and our directory take about 85), as macOS's per-user
    temp is: then /tmp, as Ray itself does there."""
    root = tempfile.gettempdir()
    return "/tmp" if len(root) > 16 and os.path.isdir("/tmp") else root


def make_executor(kind: str, workers: int | None = None, address: str | None = None) -> Executor:
    if kind == "local":
        return LocalExecutor(workers)
    if kind == "ray":
        return RayExecutor(address, workers)
    raise UserInputError(f"--executor={kind!r}: choose local or ray")
