"""What every benchmark dataset of ``vllm bench serve`` produces, and how
it becomes a :class:`~kvsched.sim.workload.model.Workload`.

A :class:`BenchSample` is one request as vLLM's dataset code makes it: its
``prompt_len`` and ``expected_output_len`` exactly as vLLM reports them (the
goldens compare these), plus what the simulator needs: how many tokens the
server sees for its prompt (``server_prompt_len``: vLLM's completions
endpoint encodes the prompt text with the special tokens) and which of
those tokens other requests share (``shared``: a text id and a token count,
a prefix). :func:`oversample` is vLLM's ``maybe_oversample_requests``;
:func:`samples_workload` turns samples and send times into requests.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from kvsched.errors import UserInputError
from kvsched.sim.workload.model import Workload, WorkloadRequest
from kvsched.sim.workload.tokens import (
    MAX_SHARED_TEXTS,
    SHARED_TEXT_TOKEN_BASE,
    UNIQUE_TOKEN_BASE,
    PromptRuns,
)


@dataclass(slots=True, frozen=True)
class BenchSample:
    """One request of a benchmark dataset (see the module docstring).
    ``source``: the index of the sample it copies (oversampling), else its own."""

    request_id: str
    prompt_len: int
    expected_output_len: int
    server_prompt_len: int
    shared: tuple[int, int] | None = None
    source: int = -1


def oversample(samples: list[BenchSample], num_requests: int, seed: int, prefix: str = "",
               no_oversample: bool = False) -> list[BenchSample]:
    """vLLM's ``maybe_oversample_requests``: fewer samples than asked are
    topped up with copies drawn by ``random.choice`` after
    ``random.seed(seed)``, numbered on from the last."""
    if no_oversample or len(samples) >= num_requests:
        return samples
    if not samples:
        raise UserInputError("the dataset has no request that passes vllm bench serve's filters, so "
                             "there is nothing to sample")
    rng = random.Random(seed)
    base = len(samples)
    indexed = [replace(s, source=i) for i, s in enumerate(samples)]
    extra = [replace(rng.choice(indexed), request_id=f"{prefix}{base + k}")
             for k in range(num_requests - base)]
    return indexed + extra


def samples_workload(name: str, samples: Sequence[BenchSample], arrivals: Sequence[float],
                     max_concurrency: int | None) -> Workload:
    """The workload of ``samples`` sent at ``arrivals`` (seconds, one per
    sample, in sample order). Request ``i`` is ``{name}-{i}``; a prompt is
    its shared prefix (one run per shared text), then its own tokens, except
    that a prompt oversampling repeated is shared whole by its copies."""
    if len(arrivals) != len(samples):
        raise ValueError(f"{len(samples)} samples but {len(arrivals)} arrival times")
    copies = Counter(s.source for s in samples if s.source >= 0)
    texts: dict[tuple[str, int], int] = {}

    def text_token(kind: str, key: int) -> int:
        k = texts.setdefault((kind, key), len(texts))
        if k >= MAX_SHARED_TEXTS:
            raise UserInputError(f"{name}: more than {MAX_SHARED_TEXTS:,} distinct shared texts; use fewer "
                                 "prefixes or prompts")
        return SHARED_TEXT_TOKEN_BASE + k

    requests = []
    for i, s in enumerate(samples):
        total = s.server_prompt_len
        runs: list[tuple[int, int]] = []
        if s.source >= 0 and copies[s.source] > 1:
            runs.append((text_token("prompt", s.source), total))
        else:
            shared = 0
            if s.shared is not None and s.shared[1] > 0:
                shared = min(s.shared[1], total)
                runs.append((text_token("prefix", s.shared[0]), shared))
            if total > shared:
                runs.append((UNIQUE_TOKEN_BASE + i, total - shared))
        requests.append(WorkloadRequest(f"{name}-{i}", arrivals[i], _runs(runs), s.expected_output_len))
    return Workload(name, tuple(requests), max_concurrency)


def _runs(runs: list[tuple[int, int]]) -> PromptRuns:
    return tuple(runs)
