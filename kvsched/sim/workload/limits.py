"""Bounds on every number a workload file or flag gives, and the value
checks the workload's parts share.

Each bound is checked before anything is allocated from the number;
kvsched.commands.simulate and kvsched.sim.deployment bound the flags.
"""

from __future__ import annotations

import math

from kvsched.errors import UserInputError
from kvsched.jsonfile import show

# Token counts of one request (prompt, output, random lengths): 2**40 (about
# 1.1e12). Far above any context window (the longest are ~1e7 tokens), so a
# long row is still a *request* the server refuses against max_model_len, as
# vLLM's does; and small enough that a count, prompt + output and numpy's
# int64 columns hold it exactly. A prompt is kept as runs, never as a token
# list, so a long row costs no memory before it is refused.
MAX_REQUEST_TOKENS = 2**40
# Arrival times, in seconds from the start of the workload: 1e8 s (3.2
# years). Longer than any serving trace (Azure 2023: 1 hour, Azure 2024: 1
# week, Mooncake: 1 hour), and float64 times up there still resolve 15 ns,
# well below a step time; further out step times lose digits (at 1e12 s the
# resolution is 0.1 ms, at 1e300 s a step adds nothing: a TPOT of 0).
MAX_ARRIVAL_TIME = 1e8
# Raw Mooncake timestamps (milliseconds): 2**53, the largest integer a float
# holds exactly (Unix-epoch milliseconds are ~1.7e12).
MAX_TIMESTAMP_MS = 2**53
# Requests of one workload: ten million. The random dataset draws its
# columns up front (numpy, then 20 bytes a request), so the count is what
# memory grows with; ten million is 100x the largest runs vllm bench serve
# is used for, and peaks at ~0.7 GB during the draw (measured).
MAX_NUM_PROMPTS = 10_000_000
# vllm bench serve seeds numpy's global RandomState (np.random.seed), whose
# seeds are 32-bit.
MAX_SEED = 2**32 - 1
# Gamma shape of the arrival gaps. vLLM takes any value > 0, but below 0.01
# numpy's gamma draws underflow to exactly 0 for a growing share of gaps (half
# of them at 0.001), so the arrivals are no longer the process asked for;
# above 1e6 the gaps are constant to 0.1 % (give inf for exactly constant).
MIN_BURSTINESS = 0.01
MAX_BURSTINESS = 1e6

# Why a token count stops at MAX_REQUEST_TOKENS, for messages.
TOKENS_WHY = ("2**40 tokens is far beyond any context window; longer requests are refused "
              "against max_model_len")


def is_int(value: object) -> bool:
    # bool is an int subclass, but True is no token count.
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_request_timeout(value: object) -> None:
    """The client's per-request timeout (``--request-timeout``): None (no
    timeout) or a finite number of seconds > 0. The one check of it, for the
    flag, the run spec and :class:`~kvsched.sim.workload.Workload`."""
    if value is None:
        return
    if isinstance(value, bool) or not (isinstance(value, int | float) and 0 < value < math.inf):
        raise UserInputError(f"--request-timeout={show(value)}: must be a finite number of seconds > 0 "
                             "(how long the client waits for a complete response before it gives up "
                             "and the server aborts the request); leave it out for no timeout")
