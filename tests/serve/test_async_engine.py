"""The engine thread: a failing engine fails its requests with a 500 and says so."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kvsched.serve.async_engine import AsyncEngine
from kvsched.serve.errors import ApiError
from kvsched.serve.metrics import ServerMetrics


class BrokenLLM:
    """Takes requests; its first step raises."""

    def __init__(self) -> None:
        self.added: list[str] = []

    def add_request(self, prompt: Any, params: Any, request_id: str, priority: int,
                    arrival_time: float) -> str:
        self.added.append(request_id)
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.added)

    def abort(self, ids: list[str]) -> list[Any]:
        return []

    def step(self) -> list[Any]:
        raise RuntimeError("boom")


def test_a_failing_step_fails_the_request_and_the_engine() -> None:
    llm = BrokenLLM()
    engine = AsyncEngine(llm, ServerMetrics("m", 16), max_pending_requests=4)  # type: ignore[arg-type]
    engine.start()

    async def run() -> ApiError:
        stream = engine.submit("r1", {"prompt_token_ids": [1]}, None)  # type: ignore[arg-type]
        with pytest.raises(ApiError) as err:
            await stream.next()
        return err.value

    try:
        err = asyncio.run(run())
        assert err.status == 500 and "boom" in err.message
        assert engine.wait_idle(timeout=60)
        assert isinstance(engine.error, RuntimeError)
        assert llm.added == ["r1"]

        async def again() -> None:
            engine.submit("r2", {"prompt_token_ids": [1]}, None)  # type: ignore[arg-type]

        with pytest.raises(ApiError) as refused:
            asyncio.run(again())
        assert refused.value.status == 500
    finally:
        engine.shutdown()
