"""Async scheduling, speculative decoding and the LoRA cap, under random use.

Two kinds of test:

- A random walk (hypothesis) over configs with K drafts, async scheduling
  (vLLM's engine loop with a batch queue of 2) and a LoRA cap: adds,
  steps, aborts (also of requests whose step is in flight), scripted
  acceptance, and bad calls that must be refused without changing one bit
  of state. ``check_invariants`` runs after every call; at the end every
  request finishes and every block comes back.
- A differential test: with none of the features on, the scheduler's
  general running phase and output update (the paths drafts and
  placeholders take) give the same decisions as its fast paths.

Exactness against vLLM itself is tests/conformance (the oracle's feature
examples and the random_features corpus).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import deque
from typing import Any

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from sched_helpers import state_snapshot
from test_properties import Model, _abort, _add, scheduler_configs

from kvsched import CacheConfig, ModelRunnerOutput, Request, SamplingParams, Scheduler, SchedulerConfig
from kvsched.config import BATCH_QUEUE_SIZE, LoRAConfig, SpeculativeConfig
from kvsched.core.output import DraftTokenIds, EngineCoreOutputs, SchedulerOutput
from kvsched.core.trace import step_record

# CI runs a fixed, derandomized set; KVSCHED_FEATURE_FUZZ_EXAMPLES=N runs N
# random walks on a fresh seed (KVSCHED_FEATURE_FUZZ_SEED).
EXAMPLES = int(os.environ.get("KVSCHED_FEATURE_FUZZ_EXAMPLES", "0"))
SETTINGS = settings(max_examples=EXAMPLES or 150, deadline=None, derandomize=not EXAMPLES,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TOKENS = [100, 100, 100, 7, 8, 5, 6]


@st.composite
def feature_configs(draw: st.DrawFn) -> tuple[SchedulerConfig, CacheConfig, SpeculativeConfig | None,
                                             LoRAConfig | None]:
    sched, cache = draw(scheduler_configs())
    use_async = draw(st.booleans())
    k = draw(st.sampled_from([0, 1, 2, 3]))
    spec = None
    if k and sched.max_num_batched_tokens >= 1 + k and not 0 < sched.long_prefill_token_threshold < 1 + k:
        spec = SpeculativeConfig("ngram_gpu" if use_async else "ngram", k)
    lora = LoRAConfig(draw(st.integers(1, 2))) if draw(st.booleans()) else None
    return dataclasses.replace(sched, async_scheduling=use_async), cache, spec, lora


# A batch as the runner saw it when scheduled: id, request, samples, drafts, admitted.
Batch = list[tuple[str, Request, bool, int, bool]]


class Walk:
    def __init__(self, configs: tuple[SchedulerConfig, CacheConfig, SpeculativeConfig | None,
                                      LoRAConfig | None]) -> None:
        sched_config, cache_config, spec, lora = configs
        self.m = Model(Scheduler(sched_config, cache_config, speculative_config=spec, lora_config=lora))
        self.queue: deque[tuple[SchedulerOutput, Batch]] = deque()
        self.use_async = sched_config.async_scheduling
        self.k = spec.num_speculative_tokens if spec else 0

    @property
    def sched(self) -> Scheduler:
        return self.m.sched

    def check(self) -> None:
        self.m.check()

    def refused(self, call: Any) -> None:
        before = state_snapshot(self.sched)
        with pytest.raises((ValueError, TypeError)):
            call()
        assert state_snapshot(self.sched) == before, "a refused call changed the state"
        self.check()

    def capture(self, output: SchedulerOutput) -> Batch:
        admitted = {n.req_id for n in output.scheduled_new_reqs}
        admitted |= output.scheduled_cached_reqs.resumed_req_ids
        spec = output.scheduled_spec_decode_tokens
        batch: Batch = []
        for rid, n in output.num_scheduled_tokens.items():
            request = self.sched.requests[rid]
            samples = rid not in output.prefill_chunk_req_ids
            assert samples == (not request.is_prefill_chunk)
            drafts = len(spec.get(rid, ()))
            assert (drafts <= self.k and n >= 1 + drafts) or not samples
            batch.append((rid, request, samples, drafts, rid in admitted))
        return batch

    def output(self, data: st.DataObject | None, batch: Batch) -> ModelRunnerOutput:
        sampled: list[list[int]] = []
        for _, _, samples, drafts, admitted in batch:
            if not samples:
                sampled.append([])
                continue
            accepted = 0 if admitted or data is None else data.draw(st.integers(0, drafts))
            sampled.append([100 if data is None else data.draw(st.sampled_from(TOKENS))
                            for _ in range(1 + accepted)])
        return ModelRunnerOutput([b[0] for b in batch], sampled)

    def apply(self, output: SchedulerOutput, result: ModelRunnerOutput) -> EngineCoreOutputs:
        outputs = self.sched.update_from_output(output, result)
        for o in outputs.finished:
            assert o.finish_reason in ("stop", "length")
            self.m.finished[o.request_id] += 1
        if outputs.spec_decoding_stats is not None:
            stats = outputs.spec_decoding_stats
            assert stats.num_accepted_tokens <= stats.num_draft_tokens
        self.check()
        return outputs

    def bad_outputs(self, data: st.DataObject, output: SchedulerOutput, batch: Batch,
                    good: ModelRunnerOutput) -> None:
        ids, sampled = good.req_ids, good.sampled_token_ids
        i = data.draw(st.integers(0, len(ids) - 1))
        rid, _, samples, drafts, _ = batch[i]
        if samples:
            entries: list[Any] = [[], [100] * (2 + drafts), ["x"], [-1]]
        else:
            entries = [[100], [100, 100]]
        entry = data.draw(st.sampled_from(entries))
        broken = [*sampled[:i], entry, *sampled[i + 1:]]
        if self.sched._receives_output(self.sched.requests.get(rid)) or entry in (["x"], [-1]):
            self.refused(lambda: self.sched.update_from_output(output, ModelRunnerOutput(ids, broken)))
        self.refused(lambda: self.sched.update_from_output(dataclasses.replace(output), good))

    def step(self, data: st.DataObject | None, bad: bool = False) -> None:
        """One iteration of vLLM's engine loop (synchronous, or async with
        a batch queue of 2)."""
        sched = self.sched
        if not self.use_async:
            output = sched.schedule()
            self.check()
            batch = self.capture(output)
            good = self.output(data, batch)
            if bad and data is not None and output.num_scheduled_tokens:
                self.bad_outputs(data, output, batch, good)
                self.refused(sched.schedule)
            self.apply(output, good)
            if self.k and output.total_num_scheduled_tokens:
                drafts = [[] if not samples else [100] * (self.k if data is None
                                                          else data.draw(st.integers(0, self.k)))
                          for _, _, samples, _, _ in batch]
                if bad and data is not None:
                    self.refused(lambda: sched.update_draft_token_ids(DraftTokenIds(
                        [b[0] for b in batch], [[100] * (self.k + 1) for _ in batch])))
                    self.refused(lambda: sched.update_draft_token_ids(
                        ([b[0] for b in batch], drafts)))  # type: ignore[arg-type]
                sched.update_draft_token_ids(DraftTokenIds([b[0] for b in batch], drafts))
                self.check()
            return
        pop = bool(self.queue)
        if sched.has_requests():
            output = sched.schedule()
            self.check()
            self.queue.appendleft((output, self.capture(output)))
            pop = not (len(self.queue) < 2 and (output.total_num_scheduled_tokens > 0
                                                or sched.has_requests()))
        if bad and data is not None and sched.num_steps_in_flight == 2:
            self.refused(sched.schedule)
            newest, newest_batch = self.queue[0]
            self.refused(lambda: sched.update_from_output(newest, self.output(None, newest_batch)))
        if bad and data is not None and self.k:
            self.refused(lambda: sched.update_draft_token_ids(DraftTokenIds([], [])))
        if pop:
            output, batch = self.queue.pop()
            good = self.output(data, batch)
            if bad and data is not None and output.num_scheduled_tokens:
                self.bad_outputs(data, output, batch, good)
            self.apply(output, good)

    def add(self, data: st.DataObject) -> None:
        before = set(self.m.added)
        _add(data, self.m)
        (new,) = self.m.added - before or {None}
        if new is not None and self.sched.max_loras:
            # Requests are built by test_properties; give some an adapter.
            request = self.sched.requests[new]
            request.lora_id = data.draw(st.sampled_from([0, 1, 2, 3]))
        if new is not None and self.k:
            # vLLM accepts a request that fits the cache only without its
            # drafts, and may then spin on it forever (so does kvsched):
            # those are aborted at once here. The worst case: the last
            # decode step with K drafts, behind a step in flight with K more.
            request = self.sched.requests[new]
            worst = min(request.stop_len - 1 + 2 * self.k + 1, self.sched.max_model_len)
            cache = self.sched.cache_config
            if -(-worst // cache.block_size) > cache.num_gpu_blocks - 1:
                for r in self.sched.finish_requests([new]):
                    self.m.finished[r.request_id] += 1
        self.check()


def run_walk(configs: Any, data: st.DataObject) -> None:
    w = Walk(configs)
    w.check()
    for _ in range(data.draw(st.integers(1, 50))):
        op = data.draw(st.sampled_from(["add", "add", "add", "step", "step", "step", "step",
                                        "abort", "bad_step"]))
        if op == "add":
            w.add(data)
        elif op == "abort":
            _abort(data, w.m)
            w.check()
        else:
            w.step(data, bad=op == "bad_step")
    bound = 40 + 6 * sum(r.num_prompt_tokens + r.max_tokens for r in w.sched.requests.values())
    for _ in range(bound):
        if not w.sched.has_unfinished_requests() and not w.queue:
            break
        w.step(None)
    assert not w.sched.has_unfinished_requests() and not w.queue, "requests never finished (stuck)"
    assert set(w.m.finished) == w.m.added
    assert not w.sched.step_in_flight
    pool = w.sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == w.sched.cache_config.num_gpu_blocks - 1, "blocks leaked"


@seed(int(os.environ.get("KVSCHED_FEATURE_FUZZ_SEED", "0")))
@SETTINGS
@given(feature_configs(), st.data())
def test_random_walks_with_drafts_async_and_lora(configs: Any, data: st.DataObject) -> None:
    run_walk(configs, data)


# -- the general paths against the fast ones ------------------------------------------------

class GeneralPathScheduler(Scheduler):
    """A scheduler that takes the general running phase and output update
    (those of drafts and placeholders) with none of the features on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plain = False
        self._fast_running = False
        self._async_plain = False


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scheduler_configs(), st.booleans(), st.data())
def test_general_paths_decide_as_the_fast_paths(configs: tuple[SchedulerConfig, CacheConfig],
                                                use_async: bool, data: st.DataObject) -> None:
    """Synchronous, or async with a batch queue of 2 (the async fast paths:
    placeholders, no drafts)."""
    sched_config, cache_config = configs
    sched_config = dataclasses.replace(sched_config, async_scheduling=use_async)
    fast = Scheduler(sched_config, cache_config)
    general = GeneralPathScheduler(sched_config, cache_config)
    queues: dict[int, deque[SchedulerOutput]] = {id(fast): deque(), id(general): deque()}
    usable = (cache_config.num_gpu_blocks - 1) * cache_config.block_size
    max_prompt = min(sched_config.max_model_len - 1, usable)
    arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]] = {}
    for i in range(data.draw(st.integers(1, 8))):
        n = data.draw(st.integers(1, max_prompt)) if max_prompt >= 1 else 1
        tokens = data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
        params = SamplingParams(max_tokens=data.draw(st.integers(1, max(1, min(10, usable + 1 - n)))),
                                eos_token_id=data.draw(st.sampled_from([None, 5])))
        arrivals.setdefault(data.draw(st.integers(0, 6)), []).append((f"r{i}", tokens, params))
    script = data.draw(st.lists(st.sampled_from(TOKENS), min_size=64, max_size=64))
    for step in range(400):
        records = []
        for sched in (fast, general):
            for rid, tokens, params in arrivals.get(step, ()):
                with contextlib.suppress(ValueError):
                    sched.add_request(Request(rid, list(tokens), params, arrival_time=float(step)))
            queue = queues[id(sched)]
            output = sched.schedule()
            if output.num_scheduled_tokens:
                queue.appendleft(output)
            finished = []
            if queue and (len(queue) == BATCH_QUEUE_SIZE or not use_async
                          or not output.num_scheduled_tokens):
                applied = queue.pop()
                sampled = [[] if rid in applied.prefill_chunk_req_ids
                           else [script[(step + len(rid)) % len(script)]]
                           for rid in applied.num_scheduled_tokens]
                done = sched.update_from_output(applied, ModelRunnerOutput(
                    list(applied.num_scheduled_tokens), sampled))
                finished = [[o.request_id, o.finish_reason or ""] for o in done.finished]
            sched.check_invariants()
            records.append(step_record(step, output, finished, sched))
        assert records[0] == records[1], f"step {step}"
        if step > 6 and not fast.has_unfinished_requests() and not queues[id(fast)]:
            break
    assert not general.has_unfinished_requests()
    assert [(r.request_id, r.num_computed_tokens) for r in fast.running] == \
        [(r.request_id, r.num_computed_tokens) for r in general.running]


# -- API boundaries of the new calls --------------------------------------------------------

def _scheduler(k: int = 2, use_async: bool = False, **kw: Any) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64,
                                     async_scheduling=use_async),
                     CacheConfig(num_gpu_blocks=40, block_size=4, enable_prefix_caching=True),
                     speculative_config=SpeculativeConfig("ngram_gpu" if use_async else "ngram", k)
                     if k else None, **kw)


def test_drafts_are_scheduled_verified_and_rolled_back() -> None:
    sched = _scheduler(k=3)
    sched.add_request(Request("a", list(range(1, 9)), SamplingParams(max_tokens=20)))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 8} and not out.scheduled_spec_decode_tokens
    sched.update_from_output(out, ModelRunnerOutput(["a"], [[50]]))
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[51, 52, 53]]))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [51, 52, 53]}
    assert sched.requests["a"].num_computed_tokens == 12
    # One draft accepted, two rejected: the sample and the accepted draft
    # are appended, the two rejected positions rolled back.
    result = sched.update_from_output(out, ModelRunnerOutput(["a"], [[51, 60]]))
    request = sched.requests["a"]
    assert request.output_token_ids == [50, 51, 60]
    assert request.num_computed_tokens == 10 == request.num_tokens - 1
    stats = result.spec_decoding_stats
    assert stats is not None and (stats.num_drafts, stats.num_draft_tokens,
                                  stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0]
    sched.check_invariants()


def test_async_keeps_two_steps_in_flight_and_discards_output_after_a_stop() -> None:
    sched = _scheduler(k=0, use_async=True)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=5, eos_token_id=9)))
    first = sched.schedule()
    second = sched.schedule()  # scheduled before the first step's token is known
    assert first.num_scheduled_tokens == {"a": 3} and second.num_scheduled_tokens == {"a": 1}
    assert sched.requests["a"].num_output_placeholders == 2
    with pytest.raises(ValueError, match="2 steps are in flight"):
        sched.schedule()
    with pytest.raises(ValueError, match="not the step awaiting"):
        sched.update_from_output(second, ModelRunnerOutput(["a"], [[4]]))
    done = sched.update_from_output(first, ModelRunnerOutput(["a"], [[9]]))  # EOS
    assert [o.finish_reason for o in done.finished] == ["stop"]
    # The second step's token for "a" is discarded: the request is gone.
    done = sched.update_from_output(second, ModelRunnerOutput(["a"], [[4]]))
    assert done.dropped == ["a"] and not done.finished
    assert not sched.step_in_flight and sched.has_requests()  # the finish is still to be reported
    sched.schedule()
    assert not sched.has_requests()
    sched.check_invariants()


def test_draft_calls_are_refused_clearly() -> None:
    sched = _scheduler(k=2)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=8)))
    out = sched.schedule()
    with pytest.raises(ValueError, match="in flight"):
        sched.update_draft_token_ids(DraftTokenIds(["a"], [[1]]))
    sched.update_from_output(out, ModelRunnerOutput(["a"], [[7]]))
    for bad, pattern in [
            (DraftTokenIds(["a"], [[1, 2, 3]]), "at most 2"),
            (DraftTokenIds(["a"], [[-1]]), "out of range"),
            (DraftTokenIds(["a"], [(1,)]), "must be a list"),  # type: ignore[list-item]
            (DraftTokenIds(["a", "b"], [[1]]), "same length"),
            (("a", [1]), "DraftTokenIds")]:
        before = state_snapshot(sched)
        with pytest.raises((ValueError, TypeError), match=pattern):
            sched.update_draft_token_ids(bad)  # type: ignore[arg-type]
        assert state_snapshot(sched) == before
    with pytest.raises(ValueError, match="no speculative decoding"):
        _scheduler(k=0).update_draft_token_ids(DraftTokenIds([], []))
    with pytest.raises(ValueError, match="placeholders"):
        _scheduler(k=2, use_async=True).update_draft_token_ids(DraftTokenIds([], []))


def test_settings_vllm_cannot_run_are_refused() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens=4"):
        Scheduler(SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=4, max_model_len=64),
                  CacheConfig(num_gpu_blocks=8), speculative_config=SpeculativeConfig("ngram", 4))
    with pytest.raises(ValueError, match="long_prefill_token_threshold=2"):
        Scheduler(SchedulerConfig(long_prefill_token_threshold=2), CacheConfig(num_gpu_blocks=8),
                  speculative_config=SpeculativeConfig("ngram", 3))
    # vLLM 0.33 refused "ngram" with async scheduling (0.34 runs it as ngram_gpu).
    with pytest.raises(ValueError, match="ngram_gpu"):
        Scheduler(SchedulerConfig(async_scheduling=True, vllm_version="0.33"), CacheConfig(num_gpu_blocks=8),
                  speculative_config=SpeculativeConfig("ngram", 3))
    with pytest.raises(ValueError, match=r"speculative_config\.method='medusa'"):
        SpeculativeConfig("medusa", 3)
    with pytest.raises(ValueError, match="num_speculative_tokens=0"):
        SpeculativeConfig("mtp", 0)
    with pytest.raises(ValueError, match="max_loras=0"):
        LoRAConfig(0)
    with pytest.raises(ValueError, match="lora_id=-1"):
        Request("a", [1], lora_id=-1).validate(64)


def test_lora_cap_passes_over_requests_and_keeps_their_order() -> None:
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=64),
                      CacheConfig(num_gpu_blocks=40, block_size=4),
                      lora_config=LoRAConfig(max_loras=1), explain_admission=True)
    for rid, lora in [("a", 1), ("b", 2), ("c", 1), ("d", 0), ("e", 2)]:
        sched.add_request(Request(rid, [1, 2, 3], SamplingParams(max_tokens=4), lora_id=lora))
    out = sched.schedule()
    # b and e would be a second adapter: passed over, in their order.
    assert list(out.num_scheduled_tokens) == ["a", "c", "d"]
    assert [r.request_id for r in sched.waiting] == ["b", "e"]
    assert out.not_admitted is not None
    assert [(n.request_id, n.reason) for n in out.not_admitted] == [("b", "max_loras"),
                                                                     ("e", "max_loras")]
    sched.check_invariants()
