"""The batch queue depth has one owner: kvsched.config.batch_queue_size
(BATCH_QUEUE_SIZE without pipeline parallelism).

vLLM's engine keeps two batches in flight under async scheduling (one on
the GPU, the next scheduled), and with pipeline parallelism one per stage
(plus one under async scheduling); the scheduler, the engine, the replayer
and the simulator must all take that depth from the config, not from a
literal of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvsched.config import BATCH_QUEUE_SIZE, CacheConfig, SchedulerConfig, batch_queue_size, keeps_scheduling
from kvsched.core.scheduler import Scheduler
from kvsched.request import Request, SamplingParams

KVSCHED = Path(__file__).resolve().parents[1] / "kvsched"
USERS = ["scenario/run.py", "engine/core.py", "sim/instance.py", "core/scheduler.py"]


def test_the_depth_is_vllms() -> None:
    assert BATCH_QUEUE_SIZE == 2
    assert batch_queue_size(True) == 2 and batch_queue_size(False) == 1


@pytest.mark.parametrize("async_scheduling, pp, depth", [(False, 2, 2), (False, 4, 4), (True, 2, 3),
                                                         (True, 4, 5), (True, 1, 2), (False, 1, 1)])
def test_the_pipeline_depth_is_vllms(async_scheduling: bool, pp: int, depth: int) -> None:
    # VllmConfig.max_concurrent_batches: PP stages, plus one under async
    # scheduling (the V2 model runner, the only one running PP with async).
    assert batch_queue_size(async_scheduling, pp) == depth


@pytest.mark.parametrize("path", USERS)
def test_every_loop_takes_the_depth_from_the_config(path: str) -> None:
    tree = ast.parse((KVSCHED / path).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "kvsched.config" for alias in node.names}
    assert imported & {"BATCH_QUEUE_SIZE", "batch_queue_size"}, f"{path} does not use the config's depth"
    own = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign | ast.AnnAssign)
           and any(isinstance(t, ast.Name) and t.id == "BATCH_QUEUE_SIZE"
                   for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    assert not own, f"{path} defines its own BATCH_QUEUE_SIZE (line {own})"


@pytest.mark.parametrize("async_scheduling, pp, depth", [(True, 1, 2), (False, 1, 1), (False, 3, 3),
                                                         (True, 3, 4)])
def test_the_scheduler_keeps_at_most_the_depth_in_flight(async_scheduling: bool, pp: int,
                                                         depth: int) -> None:
    # A prompt of 5 chunks: every step has tokens to schedule (a request that
    # waits for its output would leave a PP step empty).
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=4, max_model_len=64,
                                  async_scheduling=async_scheduling, pipeline_parallel_size=pp),
                  CacheConfig(num_gpu_blocks=32, block_size=4, enable_prefix_caching=False))
    s.add_request(Request("a", list(range(1, 21)), SamplingParams(max_tokens=10, ignore_eos=True)))
    for _ in range(depth):
        s.schedule()
    assert s.num_steps_in_flight == depth
    with pytest.raises(ValueError, match=r"in flight|has not been applied"):
        s.schedule()


class _Sched:
    def __init__(self, has_requests: bool) -> None:
        self._has = has_requests
        self.asked = 0

    def has_requests(self) -> bool:
        self.asked += 1
        return self._has


def test_keeps_scheduling_waits_only_when_full_or_nothing_more_to_run() -> None:
    # Room left and the batch ran tokens: schedule the next one at once,
    # without asking the scheduler.
    s = _Sched(False)
    assert keeps_scheduling(1, 2, 5, s) is True
    assert s.asked == 0
    # Full queue: block on the oldest output, whatever else holds.
    assert keeps_scheduling(2, 2, 5, _Sched(True)) is False
    # An empty batch: keep going only if more can be scheduled.
    assert keeps_scheduling(1, 2, 0, _Sched(True)) is True
    assert keeps_scheduling(1, 2, 0, _Sched(False)) is False
    # Synchronous (queue of one): every batch's output is applied at once.
    assert keeps_scheduling(1, 1, 5, _Sched(True)) is False
