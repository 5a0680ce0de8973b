"""Which CPUs the server's engine thread runs the model on, read from vLLM's
CPU-backend variables so one environment places both servers alike.

- ``VLLM_CPU_OMP_THREADS_BIND``: ``auto`` (the default) takes every CPU this
  process may run on except the last ``VLLM_CPU_NUM_OF_RESERVED_CPU`` (default
  1, kept for the HTTP front end, as vLLM's CPU worker leaves it), or all of
  them when there are no more than that; ``nobind`` leaves placement to the OS
  and torch's default thread count; otherwise a CPU list such as ``0-3`` or
  ``0,2,4``.
- The engine thread is bound to those CPUs and torch runs that many threads
  (its intra-op pool starts from the engine thread, so it inherits the mask).

vLLM's ``|``-separated lists (one per tensor-parallel rank) have no meaning
for kvsched's single engine and are refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvsched.errors import UserInputError

BIND_VAR = "VLLM_CPU_OMP_THREADS_BIND"
RESERVED_VAR = "VLLM_CPU_NUM_OF_RESERVED_CPU"


def _parse_cpu_list(text: str) -> list[int]:
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(part)
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(part)
        cpus.update(range(first, last + 1))
    return sorted(cpus)


def engine_cpus(env: Mapping[str, str], allowed: set[int]) -> list[int] | None:
    """The CPUs for the engine thread, or None to leave placement alone.
    ``allowed``: the CPUs this process may run on (``os.sched_getaffinity(0)``)."""
    bind = env.get(BIND_VAR, "auto").strip()
    if bind == "nobind":
        return None
    if bind == "auto":
        text = env.get(RESERVED_VAR, "1").strip()
        if not text.isdigit():
            raise UserInputError(f"{RESERVED_VAR}={text!r}: not a count of CPUs; give a whole number "
                                 "such as 1, or leave it unset")
        reserved = int(text)
        cpus = sorted(allowed)
        return cpus[:-reserved] if reserved and len(cpus) > reserved else cpus
    if "|" in bind:
        raise UserInputError(f"{BIND_VAR}={bind!r}: one CPU list per tensor-parallel rank, but kvsched "
                             "serves on one engine; give one list, e.g. 0-3")
    try:
        cpus = _parse_cpu_list(bind)
    except ValueError as err:
        raise UserInputError(f"{BIND_VAR}={bind!r}: {str(err)!r} is not a CPU or a range of CPUs; give "
                             "auto, nobind, or a list such as 0-3 or 0,2") from None
    outside = [c for c in cpus if c not in allowed]
    if outside:
        raise UserInputError(f"{BIND_VAR}={bind!r}: CPU {outside[0]} is not one this process may run on "
                             f"({_parse_back(sorted(allowed))}); pick among those")
    return cpus


def _parse_back(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)
