"""Each logged engine step's work, from the requests kvsched sent.

vLLM's iteration log gives a step's aggregates only (context and generation
requests and tokens). The attention work also needs each request's context,
which kvsched knows because it chose every prompt: :class:`PointLedger`
replays the requests of one designed point through the logged steps, in the
order vLLM's scheduler serves them (running requests first, then waiting
ones, first come first served; a chunk takes what is left of the step's
token budget), and gives each step its :class:`~kvsched.perf.step_profile.StepRecord`
work. The profile's prompts are random tokens never sent twice, so prefix
caching finds nothing there; a serving run's may repeat a prefix (``vllm
bench serve``'s random prompts now and then start alike). Given the step's
token budget (``--max-num-batched-tokens``), the ledger recognises a hit: a
new request's chunk shorter than its prompt in a step that left budget
unused was not cut by the budget (vLLM chunks a new prompt only where the
budget runs out), so the tokens it skipped were found in the cache. The
hit is its prompt less the chunk; its attention ran over that context.

A logged step that the ledger cannot explain (a generation count that is
not the number of requests it holds in decode, a context chunk larger than
a prompt's remainder: a preemption, a threshold on long prefills; several
new prompts short of their lengths in one step) makes the point
*inconsistent*: its later steps are not attributed, and the caller says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsched.perf.step_profile import StepRecord
from kvsched.profile.iteration_log import IterationLine


@dataclass(slots=True)
class SentRequest:
    """A request of a point: its prompt and output lengths, and how far the
    engine has taken it."""

    prompt_len: int
    max_tokens: int
    computed: int = 0
    generated: int = 0
    sent: bool = False
    # Prompt tokens found in the prefix cache when it was admitted (0: none).
    cached: int = 0
    # The logged iterations that ran its prompt chunks, and the one that
    # sampled each of its output tokens (the first: its last chunk's): what
    # the client's times of its streamed tokens are set against.
    chunk_steps: list[int] = field(default_factory=list)
    token_steps: list[int] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.generated >= self.max_tokens

    @property
    def in_prefill(self) -> bool:
        return self.sent and self.computed < self.prompt_len

    @property
    def in_decode(self) -> bool:
        return self.computed >= self.prompt_len and not self.finished


class PointLedger:
    """The requests of one point, stepped through vLLM's logged steps."""

    def __init__(self, point: str, requests: list[SentRequest], token_budget: int | None = None) -> None:
        self.point = point
        self.requests = requests
        # The step's token budget (--max-num-batched-tokens); None: prompts
        # never hit the prefix cache (a new prompt's short chunk is the budget's).
        self.token_budget = token_budget
        self.problem = ""  # why the ledger stopped explaining the log ("": it has not)

    @property
    def done(self) -> bool:
        return all(r.finished for r in self.requests) or bool(self.problem)

    def past_prefill(self) -> bool:
        """Every request sent so far is decoding or finished (the next wave may go)."""
        return all(not r.in_prefill and r.computed > 0 for r in self.requests if r.sent)

    def step(self, line: IterationLine) -> StepRecord | None:
        """The work of a logged step, or None once the ledger cannot explain
        the log (``problem`` says why)."""
        if self.problem:
            return None
        decodes = [r for r in self.requests if r.in_decode]
        if line.generation_requests != len(decodes) or line.generation_tokens != line.generation_requests:
            self.problem = (f"iteration {line.iteration}: {line.generation_requests} generation requests "
                            f"({line.generation_tokens} tokens) logged, {len(decodes)} decoding by the "
                            "requests sent")
            return None
        # Running (partly prefilled) requests first, then waiting ones in send order.
        prefills = sorted((r for r in self.requests if r.in_prefill), key=lambda r: r.computed == 0)
        if line.context_requests > len(prefills):
            self.problem = (f"iteration {line.iteration}: {line.context_requests} context requests logged, "
                            f"{len(prefills)} prompts unfinished")
            return None
        chosen = prefills[:line.context_requests]
        hits = self._prefix_hits(line, chosen)
        if hits is None:
            return None
        left = line.context_tokens
        pairs = sampled = 0
        for i, r in enumerate(chosen):
            if hits[i]:
                r.cached = r.computed = hits[i]
            n = min(r.prompt_len - r.computed, left)
            last = i == line.context_requests - 1
            if n <= 0 or (last and n != left):
                self.problem = (f"iteration {line.iteration}: {line.context_tokens} context tokens over "
                                f"{line.context_requests} requests do not fit the prompts' remainders")
                return None
            c = r.computed
            pairs += n * c + n * (n + 1) // 2
            r.computed += n
            left -= n
            r.chunk_steps.append(line.iteration)
            if r.computed == r.prompt_len:
                r.generated = 1
                r.token_steps.append(line.iteration)
                sampled += 1
        kv = 0
        for r in decodes:
            kv += r.computed + 1
            r.computed += 1
            r.generated += 1
            r.token_steps.append(line.iteration)
        sampled += len(decodes)
        return StepRecord(
            point=self.point, iteration=line.iteration, context_requests=line.context_requests,
            context_tokens=line.context_tokens, generation_requests=line.generation_requests,
            generation_tokens=line.generation_tokens, elapsed_ms=line.elapsed_ms,
            num_tokens=line.context_tokens + line.generation_tokens,
            num_reqs=line.context_requests + line.generation_requests, num_sampled=sampled,
            prefill_tokens=line.context_tokens, prefill_attn_pairs=pairs, decode_kv_tokens=kv)

    def _prefix_hits(self, line: IterationLine, chosen: list[SentRequest]) -> list[int] | None:
        """The prefix-cache hit of each of ``chosen`` (the step's context
        requests), in tokens: none unless the step left budget
        unused and its context tokens fall short of the prompts'
        remainders; then the one new prompt skipped the shortfall. None
        (``problem`` set) where that cannot be told apart."""
        hits = [0] * len(chosen)
        budget = self.token_budget
        if budget is None or line.context_tokens + line.generation_tokens >= budget:
            return hits
        short = sum(r.prompt_len - r.computed for r in chosen) - line.context_tokens
        if short <= 0:
            return hits
        new = [i for i, r in enumerate(chosen) if r.computed == 0]
        # A hit leaves at least the prompt's last token to compute.
        if len(new) != 1 or short >= chosen[new[0]].prompt_len:
            self.problem = (f"iteration {line.iteration}: {line.context_tokens} context tokens, {short} "
                            f"short of {line.context_requests} prompts' remainders in a step under the "
                            f"{budget}-token budget, over {len(new)} new prompts: not one prefix-cache "
                            "hit the ledger can place")
            return None
        hits[new[0]] = short
        return hits
