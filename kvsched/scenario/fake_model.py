"""The scripted model runner and drafter of SCENARIO_FORMAT.md: each
request samples its scripted tokens, drafts are the next scripted tokens
and their acceptance is scripted too.
"""

from __future__ import annotations

from typing import Any

from kvsched.core.output import (
    DraftTokenIds,
    ModelRunnerOutput,
    SchedulerOutput,
)
from kvsched.core.scheduler import Scheduler
from kvsched.request import Request
from kvsched.scenario.schema import DEFAULT_TOKEN


def next_token(spec: dict[str, Any], num_output_tokens: int) -> int:
    """The scripted token for output position ``num_output_tokens``; below
    min_tokens a scripted stop token is replaced, as a real sampler masks it."""
    script = spec.get("sampled_token_ids") or ()
    token = script[num_output_tokens] if num_output_tokens < len(script) else DEFAULT_TOKEN
    if num_output_tokens < spec.get("min_tokens", 0):
        stops = set(spec.get("stop_token_ids", ()))
        if not spec.get("ignore_eos", False) and spec.get("eos_token_id") is not None:
            stops.add(spec["eos_token_id"])
        if token in stops:
            token = DEFAULT_TOKEN
    return token


# One scheduled request as the fake model saw it: id, the request, whether it
# samples in this batch, drafts scheduled, admitted in this batch.
Entry = tuple[str, Request, bool, int, bool]


class FakeModel:
    """The scripted model runner and drafter of SCENARIO_FORMAT.md. A batch
    is captured when scheduled and its output produced when the engine
    collects it: at once (synchronous), or when it leaves the batch queue
    (async scheduling)."""

    __slots__ = ("specs", "num_verifications", "num_proposals")

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        self.specs = specs
        self.num_verifications: dict[str, int] = {}
        self.num_proposals: dict[str, int] = {}

    @staticmethod
    def capture(sched: Scheduler, output: SchedulerOutput) -> list[Entry]:
        admitted = {n.req_id for n in output.scheduled_new_reqs}
        admitted |= output.scheduled_cached_reqs.resumed_req_ids
        spec = output.scheduled_spec_decode_tokens
        requests = sched.requests
        return [(rid, requests[rid], not requests[rid].is_prefill_chunk, len(spec.get(rid, ())),
                 rid in admitted) for rid in output.num_scheduled_tokens]

    def _accepted(self, rid: str, num_drafts: int) -> int:
        i = self.num_verifications.get(rid, 0)
        self.num_verifications[rid] = i + 1
        script = self.specs[rid].get("accepted_drafts") or ()
        n = script[i] if i < len(script) else num_drafts
        return max(0, min(n, num_drafts))

    def output(self, batch: list[Entry]) -> ModelRunnerOutput:
        sampled: list[list[int]] = []
        for rid, req, samples, num_drafts, admitted in batch:
            if not samples:
                sampled.append([])
                continue
            # Drafts of the step that admits a request are padding: never accepted.
            accepted = self._accepted(rid, num_drafts) if num_drafts and not admitted else 0
            n = len(req.output_token_ids)
            spec = self.specs[rid]
            sampled.append([next_token(spec, n + j) for j in range(1 + accepted)])
        return ModelRunnerOutput([entry[0] for entry in batch], sampled)

    def propose(self, batch: list[Entry], k: int) -> DraftTokenIds:
        """Drafts after a synchronous step: none for a request that sampled
        nothing, else its next ``proposed_drafts`` entry (default and cap K)."""
        drafts: list[list[int]] = []
        for rid, req, samples, _, _ in batch:
            if not samples:
                drafts.append([])
                continue
            i = self.num_proposals.get(rid, 0)
            self.num_proposals[rid] = i + 1
            script = self.specs[rid].get("proposed_drafts") or ()
            d = max(0, min(script[i] if i < len(script) else k, k))
            n = len(req.output_token_ids)
            drafts.append([next_token(self.specs[rid], n + j) for j in range(d)])
        return DraftTokenIds([entry[0] for entry in batch], drafts)


