"""The designed batches of a profile: which requests to send, and when.

A *point* is a set of requests sent in waves: the first wave at once, each
later wave when every request sent so far has finished its prompt (it is
decoding or done), as vLLM's iteration log shows. That gives, with each
step's batch decided by vLLM's own scheduler:

- **prefill** points: one prompt of P tokens and one output token, sent
  twice in a row (the first is the warm-up of its shape); a prompt longer
  than the step's token budget runs in chunks, each at the context of the
  chunks before it, so prompts of several lengths give chunks of several
  sizes at several contexts;
- **batched prefill** points: B prompts at once, several context requests
  per step;
- **decode** points: B requests at once with long outputs, at a short
  prompt (B up to 64), a middling one (B up to 32) and a long one (B up to
  16: each long prompt costs its prefill): decode batches of B at growing
  context;
- **mixed** points: a decode batch, then single prompts of several sizes
  sent one after another (each twice) while it decodes: steps with both.

Sizes are capped so every request fits ``max_model_len``, every batch
``max_num_seqs`` and the KV cache (no preemption: the ledger could not
follow it).
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_LENS = (8, 32, 64, 128, 256, 384, 512, 768, 1024, 2048, 3072, 4096, 6144, 8192)
BATCHED_PREFILLS = ((2, 128), (4, 64), (8, 32), (4, 256))
# Every batch of 1-4 (each has a cost of its own: profile_fit's small-step
# terms), then doubling.
DECODE_BATCHES = (1, 2, 3, 4, 6, 8, 16, 32, 64)
DECODE_OUTPUT = 32
# (prompt, widest batch): long prompts cost their prefill, so fewer of them.
DECODE_PROMPTS = ((16, 64), (256, 32), (1024, 16))
MIXED_BATCHES = (4, 16)
MIXED_PREFILLS = (16, 64, 256, 512)
MIXED_OUTPUT = 160
# Fraction of the KV cache a point may fill (block rounding, the null block).
KV_HEADROOM = 0.8


@dataclass(frozen=True, slots=True)
class Wave:
    """Requests sent together: (prompt tokens, output tokens) each."""

    requests: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Point:
    name: str
    waves: tuple[Wave, ...]

    @property
    def num_requests(self) -> int:
        return sum(len(w.requests) for w in self.waves)


def _fits(batch: int, prompt: int, output: int, max_model_len: int, max_num_seqs: int,
          kv_cache_tokens: int | None) -> bool:
    if prompt + output > max_model_len or batch > max_num_seqs:
        return False
    return kv_cache_tokens is None or batch * (prompt + output) <= KV_HEADROOM * kv_cache_tokens


def design_points(max_model_len: int, max_num_seqs: int, kv_cache_tokens: int | None) -> list[Point]:
    """Every point of a profile, in the order they run (warm-up first)."""
    def ok(b: int, p: int, o: int) -> bool:
        return _fits(b, p, o, max_model_len, max_num_seqs, kv_cache_tokens)

    points = [Point("warmup", (Wave(((64, 8), (32, 8))), Wave(((256, 1),))))]
    for p in PREFILL_LENS:
        if ok(1, p, 1):
            points.append(Point(f"prefill-{p}", (Wave(((p, 1),)), Wave(((p, 1),)))))
    for b, p in BATCHED_PREFILLS:
        if ok(b, p, 1):
            points.append(Point(f"prefill-{b}x{p}", (Wave(((p, 1),) * b), Wave(((p, 1),) * b))))
    for p, widest in DECODE_PROMPTS:
        for b in DECODE_BATCHES:
            if b <= widest and ok(b, p, DECODE_OUTPUT):
                points.append(Point(f"decode-{b}x{p}", (Wave(((p, DECODE_OUTPUT),) * b),)))
    for b in MIXED_BATCHES:
        if ok(b + 1, max(MIXED_PREFILLS), MIXED_OUTPUT):
            # Each prompt twice: the first step of a shape is a warm-up, not fitted.
            injects = tuple(Wave(((p, 1),)) for p in MIXED_PREFILLS for _ in range(2))
            points.append(Point(f"mixed-{b}", (Wave(((32, MIXED_OUTPUT),) * b), *injects)))
    return points
