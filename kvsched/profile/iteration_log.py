"""vLLM's per-step log line (``--enable-logging-iteration-details``), parsed.

vLLM 0.32 logs, for every engine step that ran tokens::

    Engine 000: Iteration(3): 2 context requests, 511 context tokens, 1 generation
    requests, 1 generation tokens, iteration elapsed time: 102.96 ms, CPU KV cache usage: 1.5%

(``vllm/v1/metrics/loggers.py``, on one line, behind the logger's own
prefix). A *context* request is one that has produced no output token yet
(a prompt chunk, the last one included); every other is a *generation*
request. The elapsed time is the engine core's own: from just after the step
is scheduled and handed to the model to the model's output (scheduling and
output processing are outside it). A DP "dummy" iteration is marked
``(dummy)`` and skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kvsched.perf.step_profile import LoggedIteration

_ITERATION = re.compile(
    r"Engine (?P<engine>\d+): Iteration\((?P<iteration>\d+)\): "
    r"(?P<ctx_reqs>\d+) context requests, (?P<ctx_tokens>\d+) context tokens, "
    r"(?P<gen_reqs>\d+) generation requests, (?P<gen_tokens>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>\d+(?:\.\d+)?) ms(?P<dummy> \(dummy\))?")
_KV_CACHE_TOKENS = re.compile(r"(?:GPU|CPU|XPU|TPU)? ?KV cache size: (?P<tokens>[\d,]+) tokens")


@dataclass(frozen=True, slots=True)
class IterationLine(LoggedIteration):
    """One engine step as vLLM logged it: the step's figures
    (:class:`~kvsched.perf.step_profile.LoggedIteration`, which a profile's
    step record keeps too) and the index of the engine that logged it
    (keyword-only: it is logged first, but declared after the fields it
    extends)."""

    engine: int = field(kw_only=True)


def parse_iteration_line(line: str) -> IterationLine | None:
    """The step a server log line reports, or None for any other line (and
    for a DP dummy iteration, which ran no request's tokens)."""
    m = _ITERATION.search(line)
    if m is None or m.group("dummy"):
        return None
    return IterationLine(int(m.group("iteration")), int(m.group("ctx_reqs")), int(m.group("ctx_tokens")),
                         int(m.group("gen_reqs")), int(m.group("gen_tokens")), float(m.group("ms")),
                         engine=int(m.group("engine")))


def parse_kv_cache_tokens(line: str) -> int | None:
    """The KV cache size vLLM reports at start-up (``CPU KV cache size:
    131,072 tokens``), or None for any other line."""
    m = _KV_CACHE_TOKENS.search(line)
    return int(m.group("tokens").replace(",", "")) if m else None
