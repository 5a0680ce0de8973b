"""The arrival process of ``vllm bench serve``: gamma gaps at a request
rate, seeded as vLLM seeds them."""

from __future__ import annotations

import math
from typing import Any


def arrival_times_of_rate(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """The send times of ``n`` requests at ``rate`` req/s with vllm bench
    serve's gamma gaps (``burstiness`` 1 = Poisson), seeded: the one draw
    the random workloads and ``kvsched calibrate``'s replays share."""
    import numpy as np

    return arrival_times_from_state(n, rate, burstiness, np.random.RandomState(seed))


def arrival_times_from_state(n: int, rate: float, burstiness: float, state: Any) -> list[float]:
    """:func:`arrival_times_of_rate` drawing from ``state`` (a numpy
    ``RandomState``): vllm bench serve draws its gaps from numpy's global
    state, seeded with ``--seed`` and then advanced by any dataset that
    draws from it too (prefix_repetition does), so a dataset hands on the
    state it left."""
    import numpy as np

    if math.isinf(rate):
        return [0.0] * n
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        theta = 1.0 / (rate * burstiness)
        gaps = state.gamma(shape=burstiness, scale=theta, size=n)
    # np.cumsum adds left to right, as vLLM's running sum does: same floats.
    times = np.cumsum(gaps)
    if times[-1] != 0:
        # vLLM rescales so the schedule ends exactly at n / rate.
        times = times * ((n / rate) / times[-1])
    result: list[float] = times.tolist()
    return result
