"""A point against a scripted server log: waves sent as the log shows the
earlier ones past their prompts, steps attributed, first-seen shapes marked
as warm-up. No vLLM: the server is a fake whose log is written up front."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor

from kvsched.perf.serving_fit import StepWindow
from kvsched.profile.design import Point, Wave
from kvsched.profile.runner import PointRun
from kvsched.profile.serving import StreamTiming


def log(i: int, ctx_reqs: int, ctx_tokens: int, gen: int, ms: float) -> str:
    return (f"(APIServer pid=1) INFO 11-26 11:41:37 [loggers.py:199] Engine 000: Iteration({i}): {ctx_reqs} "
            f"context requests, {ctx_tokens} context tokens, {gen} generation requests, {gen} generation "
            f"tokens, iteration elapsed time: {ms:.2f} ms, CPU KV cache usage: 0.1%\n")


class FakeServer:
    """Releases its scripted log lines as the requests that cause them are sent."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        # (requests sent before this line can appear, the line)
        self.script = script
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.sent: list[tuple[int, int]] = []
        self.alone: list[bool] = []
        self.open = 0
        self.lock = threading.Lock()
        self._release()

    def _release(self) -> None:
        while self.script and self.script[0][0] <= len(self.sent):
            self.lines.put(self.script.pop(0)[1])

    def complete(self, prompt: list[int], max_tokens: int) -> StreamTiming:
        with self.lock:
            self.sent.append((len(prompt), max_tokens))
            # Whether every earlier request had ended when this one was sent.
            self.alone.append(self.open == 0)
            self.open += 1
            self._release()
        # Its tokens, one a chunk, 10 ms apart (the clock is the test's).
        with self.lock:
            self.open -= 1
        return StreamTiming(0.0, tuple((0.01 * (k + 1), k + 1) for k in range(max_tokens)), 0.01 * max_tokens)

    def died(self) -> str | None:
        return None


def test_mixed_point_injects_after_the_batch_decodes() -> None:
    point = Point("mixed-2", (Wave(((32, 4), (32, 4))), Wave(((16, 1),))))
    server = FakeServer([
        (2, log(0, 2, 64, 0, 30.0)),    # both prompts
        (2, log(1, 0, 0, 2, 10.0)),     # both decode: the inject may go now
        (3, log(2, 1, 16, 2, 20.0)),    # the injected prompt beside two decodes
        (3, log(3, 0, 0, 2, 10.5)),     # the last tokens
    ])
    seen: set[tuple[int, int, int]] = {(0, 0, 2)}  # a decode of 2 seen in an earlier point
    with ThreadPoolExecutor(max_workers=4) as pool:
        run = PointRun(server, point, 1000, 7, seen, pool)
        run.run()
    assert server.sent == [(32, 4), (32, 4), (16, 1)]
    assert run.next_id == 10  # three fresh prompts
    recs = run.records
    assert [(r.num_tokens, r.num_reqs, r.num_sampled) for r in recs] == [(64, 2, 2), (2, 2, 2), (18, 3, 3),
                                                                         (2, 2, 2)]
    assert [r.decode_kv_tokens for r in recs] == [0, 2 * 33, 2 * 34, 2 * 35]
    assert recs[2].prefill_attn_pairs == 16 * 17 // 2
    # First-seen shapes are warm-ups; the decode of 2 was seen before.
    assert [r.warmup for r in recs] == [True, False, True, False]
    assert not run.ledger.problem


def test_an_unexplained_step_ends_attribution_but_the_point_finishes() -> None:
    point = Point("decode-1x8", (Wave(((8, 3),)),))
    server = FakeServer([
        (1, log(0, 1, 8, 0, 30.0)),
        (1, log(1, 0, 0, 2, 10.0)),    # a generation request the point never sent
        (1, log(2, 0, 0, 1, 10.0)),
    ])
    with ThreadPoolExecutor(max_workers=2) as pool:
        run = PointRun(server, point, 1000, 0, set(), pool)
        run.run()
    assert len(run.records) == 1
    assert "iteration 1: 2 generation requests" in run.ledger.problem


def test_a_lone_prompt_waits_for_the_previous_response_and_is_sampled() -> None:
    """A prefill point's second prompt goes once the first's response ended:
    it meets an idle server, and both become idle samples of their TTFT."""
    point = Point("prefill-64", (Wave(((64, 1),)), Wave(((64, 1),))))
    server = FakeServer([
        (1, log(0, 1, 64, 0, 30.0)),
        (2, log(1, 1, 64, 0, 29.0)),
    ])
    with ThreadPoolExecutor(max_workers=2) as pool:
        run = PointRun(server, point, 1000, 0, set(), pool)
        run.run()
    assert server.alone == [True, True]
    samples = run.samples()
    assert [(s.prompt_tokens, s.idle, s.prefill.steps) for s in samples] == [(64, True, 1), (64, True, 1)]
    assert [s.prefill.elapsed_s for s in samples] == [0.030, 0.029]


def test_a_decode_batch_gives_each_request_a_span() -> None:
    point = Point("decode-2x8", (Wave(((8, 4), (8, 4))),))
    server = FakeServer([(2, log(0, 2, 16, 0, 30.0))] + [(2, log(i, 0, 0, 2, 10.0)) for i in (1, 2, 3)])
    with ThreadPoolExecutor(max_workers=2) as pool:
        run = PointRun(server, point, 1000, 0, set(), pool)
        run.run()
    samples = run.samples()
    assert len(samples) == 2 and not any(s.idle for s in samples)
    # Tokens 2-4 came from the three decode steps, 10 ms apart at the client.
    assert all(s.span == StepWindow(steps=3, elapsed_s=0.030, sampled=6, reqs=6) for s in samples)
    assert all(abs(s.span_s - 0.030) < 1e-12 for s in samples)
