"""kvsched: vLLM's v1 scheduler rebuilt as a fast, exact, readable library."""

from __future__ import annotations

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.core.output import ModelRunnerOutput, SchedulerOutput
from kvsched.core.scheduler import Scheduler

# What LLM.generate returns, as vLLM's top-level RequestOutput (the scheduler's
# per-request output of a step is kvsched.core.output.EngineCoreOutput, as in vLLM).
from kvsched.engine.outputs import CompletionOutput, RequestOutput
from kvsched.request import Request, RequestStatus, SamplingParams
from kvsched.version import __version__


def __getattr__(name: str) -> object:
    # The engine needs torch; load it only when asked, so the core stays light.
    if name == "LLM":
        from kvsched.engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'kvsched' has no attribute {name!r}")

__all__ = [
    "LLM", "CacheConfig", "CompletionOutput", "ModelRunnerOutput", "Request", "RequestOutput",
    "RequestStatus", "SamplingParams", "Scheduler", "SchedulerConfig", "SchedulerOutput", "__version__",
]
