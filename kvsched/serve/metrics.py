"""The server's Prometheus metrics, with vLLM's names (vllm/v1/metrics/loggers.py).

One registry per server (no process-wide state). The engine thread feeds
it: :meth:`ServerMetrics.observe_step` after every step with the
scheduler's counts, :meth:`ServerMetrics.observe_output` with every output.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvsched.core.scheduler import SchedulerStats
from kvsched.engine.outputs import RequestOutput

# vLLM's buckets for the latency histograms (seconds).
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")


def token_buckets(max_model_len: int) -> list[float]:
    """vLLM's 1-2-5 series up to max_model_len, for token-count histograms."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_model_len:
                return out
            out.append(float(m * scale))
        scale *= 10


@dataclass(slots=True)
class _Seen:
    """What one request has reported so far."""

    num_tokens: int = 0
    last_time: float | None = None


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model_name", "engine")
        values = (model_name, "0")
        r = self.registry
        self.running = Gauge("vllm:num_requests_running", "Number of requests in model execution "
                             "batches.", labels, registry=r).labels(*values)
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be "
                             "processed.", labels, registry=r).labels(*values)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent "
                              "usage.", labels, registry=r).labels(*values)
        self.preemptions = Counter("vllm:num_preemptions", "Cumulative number of preemption from "
                                   "the engine.", labels, registry=r).labels(*values)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in "
                                      "tokens.", labels, registry=r).labels(*values)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.",
                                   labels, registry=r).labels(*values)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                     labels, registry=r).labels(*values)
        self.generation_tokens = Counter("vllm:generation_tokens", "Number of generation tokens "
                                         "processed.", labels, registry=r).labels(*values)
        success = Counter("vllm:request_success", "Count of successfully processed requests.",
                          (*labels, "finished_reason"), registry=r)
        self.success = {reason: success.labels(*values, reason) for reason in FINISH_REASONS}
        tokens = token_buckets(max_model_len)
        self.request_prompt_tokens = Histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", labels,
            buckets=tokens, registry=r).labels(*values)
        self.request_generation_tokens = Histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", labels,
            buckets=tokens, registry=r).labels(*values)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first "
                              "token in seconds.", labels, buckets=_TTFT_BUCKETS,
                              registry=r).labels(*values)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency "
                             "in seconds.", labels, buckets=_ITL_BUCKETS, registry=r).labels(*values)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency "
                             "in seconds.", labels, buckets=_REQUEST_BUCKETS,
                             registry=r).labels(*values)
        self.queue_time = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in "
                                    "WAITING phase for request.", labels, buckets=_REQUEST_BUCKETS,
                                    registry=r).labels(*values)
        self._seen: dict[str, _Seen] = {}
        self._last_stats = SchedulerStats(num_running_reqs=0, num_waiting_reqs=0, kv_cache_usage=0.0,
                                           prefix_cache_queries=0, prefix_cache_hits=0,
                                           num_preemptions=0)

    def observe_step(self, stats: SchedulerStats) -> None:
        """The scheduler's state after a step; its cumulative counts become
        counter increments."""
        last = self._last_stats
        self.running.set(stats.num_running_reqs)
        self.waiting.set(stats.num_waiting_reqs)
        self.kv_usage.set(stats.kv_cache_usage)
        self.preemptions.inc(max(stats.num_preemptions - last.num_preemptions, 0))
        self.prefix_queries.inc(max(stats.prefix_cache_queries - last.prefix_cache_queries, 0))
        self.prefix_hits.inc(max(stats.prefix_cache_hits - last.prefix_cache_hits, 0))
        self._last_stats = stats

    def observe_output(self, out: RequestOutput, now: float) -> None:
        seen = self._seen.setdefault(out.request_id, _Seen())
        completion = out.outputs[0]
        new = len(completion.token_ids) - seen.num_tokens
        m = out.metrics
        if new > 0:
            if seen.num_tokens == 0:
                self.prompt_tokens.inc(len(out.prompt_token_ids))
                self.ttft.observe(max(now - m.arrival_time, 0.0))
                if m.first_scheduled_time is not None:
                    self.queue_time.observe(max(m.first_scheduled_time - m.arrival_time, 0.0))
            elif seen.last_time is not None:
                self.itl.observe(max(now - seen.last_time, 0.0))
            self.generation_tokens.inc(new)
            seen.num_tokens += new
            seen.last_time = now
        if out.finished:
            del self._seen[out.request_id]
            reason = completion.finish_reason or "abort"
            self.success[reason if reason in self.success else "error"].inc()
            self.e2e.observe(max(now - m.arrival_time, 0.0))
            self.request_prompt_tokens.observe(len(out.prompt_token_ids))
            self.request_generation_tokens.observe(len(completion.token_ids))

    def forget(self, request_id: str) -> None:
        """A request that ended without a final output (refused by the engine)."""
        self._seen.pop(request_id, None)

    def render(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
