"""Which requests of a workload name a LoRA adapter, and which one.

``vllm bench serve --lora-modules A B ...`` gives every request an adapter:
``random`` (its default) draws one uniformly per request with Python's
``random.choice``, ``round-robin`` cycles through them (``--lora-assignment``).
kvsched adds two knobs vLLM's bench lacks: ``--lora-share`` (the share of
requests that name an adapter; the rest run the base model) and
``--lora-zipf-alpha`` (a skewed mix: adapter k of N drawn with weight
1/k^alpha, as a few popular adapters and a long tail). Adapter ids are
vLLM's ``lora_int_id``: 1..N in ``--lora-modules`` order; 0 is the base model.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Sequence

from kvsched.config import MAX_LORAS
from kvsched.errors import UserInputError
from kvsched.jsonfile import show
from kvsched.sim.workload.limits import is_int, is_real
from kvsched.sim.workload.model import Workload, WorkloadRequest

# vllm bench serve's --lora-assignment choices.
LORA_ASSIGNMENTS = ("random", "round-robin")
DEFAULT_LORA_SHARE = 1.0


def check_lora_workload(share: float | None, assignment: str, zipf_alpha: float | None,
                        num_adapters: int | None) -> None:
    """The LoRA workload settings on their own, each failure naming the flag."""
    if share is not None and not (is_real(share) and not math.isnan(share) and 0 <= share <= 1):
        raise UserInputError(f"--lora-share={show(share)}: must be in [0, 1] (the share of requests that "
                             "name an adapter; 1, the default, as vllm bench serve --lora-modules)")
    if assignment not in LORA_ASSIGNMENTS:
        raise UserInputError(f"--lora-assignment={show(assignment)}: use one of "
                             f"{', '.join(LORA_ASSIGNMENTS)}")
    if zipf_alpha is not None:
        if not (is_real(zipf_alpha) and math.isfinite(zipf_alpha) and 0 < zipf_alpha <= 100):
            raise UserInputError(f"--lora-zipf-alpha={show(zipf_alpha)}: must be a number in (0, 100] "
                                 "(1 is classic Zipf; leave it out for a uniform draw)")
        if assignment != "random":
            raise UserInputError(f"--lora-zipf-alpha with --lora-assignment {assignment}: a Zipf mix is a "
                                 "random draw; use --lora-assignment random or drop --lora-zipf-alpha")
    if num_adapters is not None and not (is_int(num_adapters) and 1 <= num_adapters <= MAX_LORAS):
        raise UserInputError(f"--num-lora-adapters={show(num_adapters)}: must be an integer in [1, "
                             f"{MAX_LORAS}]")


def assign_loras(workload: Workload, adapter_ids: Sequence[int], share: float, assignment: str,
                 zipf_alpha: float | None, seed: int) -> Workload:
    """``workload`` with the adapters ``adapter_ids`` (vLLM's ids, in the
    order the draw ranks them) named by a ``share`` of its requests.
    ``random``: each request (in arrival order) draws whether it names one
    (skipped at share 1, so a full share draws as vLLM's bench,
    ``random.choice`` per request from a generator seeded with ``seed``)
    and which: uniform, or Zipf with ``zipf_alpha``. ``round-robin``: the
    requests that name one are spread evenly (request i does when
    ``floor((i + 1) * share) > floor(i * share)``) and cycle through the
    adapters."""
    num_adapters = len(adapter_ids)
    check_lora_workload(share, assignment, zipf_alpha, num_adapters)
    ids = tuple(adapter_ids)
    rng = random.Random(seed)
    cum = (list(itertools.accumulate(1.0 / math.pow(k, zipf_alpha) for k in range(1, num_adapters + 1)))
           if zipf_alpha else None)
    out: list[WorkloadRequest] = []
    next_rr = 0
    for i, r in enumerate(workload.requests):
        lid = 0
        if assignment == "round-robin":
            if math.floor((i + 1) * share) > math.floor(i * share):
                lid = ids[next_rr % num_adapters]
                next_rr += 1
        elif share >= 1.0 or rng.random() < share:
            lid = rng.choices(ids, cum_weights=cum)[0] if cum is not None else rng.choice(ids)
        out.append(dataclasses.replace(r, lora_id=lid))
    return workload.with_requests(tuple(out))


def adapter_ids_by_name(names: Sequence[str], adapters: Sequence[str]) -> tuple[int, ...]:
    """vllm bench serve's ``--lora-modules NAME ...`` (kvsched's
    ``--lora-names``): the ids of the named adapters among the server's
    (``adapters``, ids 1..N in order); every adapter when none is named."""
    if not names:
        return tuple(range(1, len(adapters) + 1))
    ids = []
    for name in names:
        if name not in adapters:
            raise UserInputError(f"--lora-names {name}: the server has no adapter of that name (it has "
                                 f"{', '.join(adapters) or 'none'}); name one of them, as vllm bench serve's "
                                 "--lora-modules must")
        ids.append(adapters.index(name) + 1)
    return tuple(ids)


def adapter_counts(workload: Workload) -> dict[int, int]:
    """Requests per adapter id (0: the base model), for reports and tests."""
    counts: dict[int, int] = {}
    for r in workload.requests:
        counts[r.lora_id] = counts.get(r.lora_id, 0) + 1
    return dict(sorted(counts.items()))
