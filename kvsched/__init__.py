"""kvsched: vLLM's v1 scheduler rebuilt as a fast, exact, readable library."""

from __future__ import annotations

from kvsched.config import CacheConfig, SchedulerConfig
from kvsched.core.output import ModelRunnerOutput, RequestOutput, SchedulerOutput
from kvsched.core.scheduler import Scheduler
from kvsched.request import Request, RequestStatus, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "CacheConfig", "ModelRunnerOutput", "Request", "RequestOutput", "RequestStatus",
    "SamplingParams", "Scheduler", "SchedulerConfig", "SchedulerOutput", "__version__",
]
