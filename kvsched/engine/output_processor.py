"""Turns engine steps into per-request outputs: text, stop strings, logprobs, timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsched.engine.core import StepResult
from kvsched.engine.detokenizer import IncrementalDetokenizer
from kvsched.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput
from kvsched.request import Request


@dataclass(slots=True)
class RequestState:
    request: Request
    prompt: str | None
    metrics: RequestMetrics
    detokenizer: IncrementalDetokenizer | None  # None without a tokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Any]] | None = None
    cumulative_logprob: float | None = None
    num_cached_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def output(self) -> RequestOutput:
        text = self.detokenizer.output_text if self.detokenizer is not None else ""
        completion = CompletionOutput(0, text, list(self.token_ids), self.cumulative_logprob,
                                      self.logprobs, self.finish_reason, self.stop_reason)
        r = self.request
        return RequestOutput(r.request_id, self.prompt, r.prompt_token_ids, [completion],
                             self.finish_reason is not None, self.metrics, self.num_cached_tokens)


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}

    def add_request(self, request: Request, prompt: str | None, arrival_time: float) -> None:
        detok = None
        if self.tokenizer is not None:
            detok = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                           request.sampling_params)
        state = RequestState(request, prompt, RequestMetrics(arrival_time), detok)
        if request.sampling_params.logprobs is not None:
            state.logprobs = []
            state.cumulative_logprob = 0.0
        self.states[request.request_id] = state

    def abort(self, request_ids: list[str], now: float) -> list[RequestOutput]:
        out = []
        for rid in request_ids:
            state = self.states.pop(rid, None)
            if state is not None:
                state.finish_reason = "abort"
                state.metrics.finished_time = now
                out.append(state.output())
        return out

    def process(self, step: StepResult, now: float) -> tuple[list[RequestOutput], list[str]]:
        """Outputs of requests that got tokens or finished, and the ids of
        requests a stop string ended (the caller finishes them in the core).

        A step may give a request several tokens (accepted drafts and one
        more): a request the scheduler finished keeps the tokens up to its
        stop token or length cap, and one a stop string ended keeps those up
        to the token completing it (vLLM 0.33 drops the rest)."""
        states = self.states
        if step.scheduled is not None:
            for new in step.scheduled.scheduled_new_reqs:
                state = states.get(new.req_id)
                if state is not None and state.metrics.first_scheduled_time is None:
                    state.metrics.first_scheduled_time = now
                    state.num_cached_tokens = new.num_computed_tokens
            for rid in step.scheduled.preempted_req_ids:
                if rid in states:
                    states[rid].metrics.num_preemptions += 1
        mro, core = step.runner_output, step.core_outputs
        if mro is None or core is None:
            return [], []
        finished = {o.request_id: o for o in core.finished}
        dropped = set(core.dropped)
        stopped: list[str] = []
        touched: list[RequestState] = []
        logprobs = mro.logprobs
        for i, (rid, tokens) in enumerate(zip(mro.req_ids, mro.sampled_token_ids)):
            state = states.get(rid)
            if not tokens or state is None or rid in dropped:
                continue
            done = finished.get(rid)
            if done is not None:
                tokens = done.new_token_ids  # up to the stop token or the length cap
                state.finish_reason = done.finish_reason
                state.stop_reason = done.stop_reason
            if state.detokenizer is not None:
                # Like vLLM: the text of the EOS or stop token that ended the
                # request is left out (unless include_stop_str_in_output).
                hit = state.detokenizer.update(tokens, done is not None and done.finish_reason == "stop")
                if hit is not None:
                    # A stop string wins over a length cap reached in the same step.
                    tokens = tokens[:state.detokenizer.num_kept]
                    state.finish_reason = "stop"
                    state.stop_reason = hit
                    if done is None:
                        stopped.append(rid)
            touched.append(state)
            state.token_ids.extend(tokens)
            m = state.metrics
            if m.first_token_time is None:
                m.first_token_time = now
            m.last_token_time = now
            entries = logprobs[i] if logprobs is not None else None
            if state.logprobs is not None and entries is not None:
                for token, entry in zip(tokens, entries):
                    if self.tokenizer is not None:
                        # Each token's own text, decoded alone, as vLLM reports it.
                        for tid, lp in entry.items():
                            lp.decoded_token = self.tokenizer.decode([tid], skip_special_tokens=False)
                    state.logprobs.append(entry)
                    assert state.cumulative_logprob is not None
                    state.cumulative_logprob += entry[token].logprob
        # The core finishes a request only in a step that gave it a token, so
        # every finished request is among the touched ones.
        outputs = []
        for state in touched:
            if state.finish_reason is not None:
                state.metrics.finished_time = now
                del states[state.request.request_id]
            outputs.append(state.output())
        return outputs, stopped
