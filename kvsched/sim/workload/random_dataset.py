"""The random dataset of ``vllm bench serve --dataset-name random``: its
defaults, its argument checks and :func:`random_workload`."""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping

from kvsched.errors import UserInputError
from kvsched.fields import is_int
from kvsched.jsonfile import show
from kvsched.sim.workload.arrivals import arrival_times_of_rate
from kvsched.sim.workload.bench.random_text import random_lengths
from kvsched.sim.workload.limits import (
    MAX_ARRIVAL_TIME,
    MAX_BURSTINESS,
    MAX_NUM_PROMPTS,
    MAX_REQUEST_TOKENS,
    MAX_SEED,
    MIN_BURSTINESS,
    TOKENS_WHY,
    is_real,
)
from kvsched.sim.workload.model import RandomRequests, Workload
from kvsched.sim.workload.tokenizer import TextTokenizer

# vllm bench serve's defaults for --dataset-name random.
DEFAULT_NUM_PROMPTS = 1000
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128


def _split_range_ratio(range_ratio: float | Mapping[str, float]) -> tuple[float, float]:
    # vLLM takes one float for both lengths, or {"input": r, "output": r}.
    if isinstance(range_ratio, Mapping):
        extra = set(range_ratio) - {"input", "output"}
        if extra or len(range_ratio) != 2:
            raise UserInputError(f"range_ratio={dict(range_ratio)!r}: a mapping needs exactly the keys "
                             "'input' and 'output'")
        ratios = (range_ratio["input"], range_ratio["output"])
    else:
        ratios = (range_ratio, range_ratio)
    for which, r in zip(("input", "output"), ratios):
        if not is_real(r) or not 0.0 <= r < 1.0:
            raise UserInputError(f"range_ratio ({which})={r!r} must be a number in [0, 1)")
    return float(ratios[0]), float(ratios[1])


def _check_count(name: str, value: object, minimum: int, maximum: int, why: str) -> None:
    if not is_int(value) or value < minimum:
        raise UserInputError(f"random workload: {name}={show(value)} must be an integer >= {minimum}")
    if value > maximum:
        raise UserInputError(f"random workload: {name}={show(value)} must be at most {maximum:,} ({why})")


def random_workload(
    num_prompts: int = DEFAULT_NUM_PROMPTS,
    input_len: int = DEFAULT_INPUT_LEN,
    output_len: int = DEFAULT_OUTPUT_LEN,
    range_ratio: float | Mapping[str, float] = 0.0,
    prefix_len: int = 0,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    seed: int = 0,
    tokenizer: TextTokenizer | None = None,
) -> Workload:
    """``vllm bench serve --dataset-name random``, same semantics and defaults.

    Each prompt is ``prefix_len`` shared tokens followed by a length drawn
    uniformly from the integers ``[floor(input_len*(1-r)), ceil(input_len*(1+r))]``;
    the output length from ``[max(1, floor(output_len*(1-r))), max(1, ceil(output_len*(1+r)))]``.
    The lengths come from ``numpy.random.default_rng(seed)`` drawn in vLLM's
    order (all input lengths, then all output lengths), so they equal vLLM's
    for the same seed when the tokenizer adds no special tokens. With the
    model's ``tokenizer`` (an exact one) they are vLLM's for any tokenizer
    (:func:`~kvsched.sim.workload.bench.random_text.random_lengths`: the
    special tokens come off ``input_len``, prompts are decoded and
    re-encoded); each prompt is then the special tokens and the prefix
    (shared), and its own tokens, as the server sees it.

    Arrivals follow vLLM's ``get_request``: with ``request_rate`` infinite all
    arrive at 0; otherwise the gaps are gamma(shape=burstiness,
    scale=1/(rate*burstiness)) (exponential, i.e. Poisson arrivals, at
    burstiness 1; constant 1/rate at burstiness inf), summed, then rescaled so
    the last arrival is at ``num_prompts / request_rate``. The gaps come from
    ``numpy.random.RandomState(seed)``, the stream vLLM draws after
    ``np.random.seed(seed)``, so arrival times match vLLM's too.
    """
    _check_count("num_prompts", num_prompts, 1, MAX_NUM_PROMPTS,
                 "ten million requests: the random dataset draws every request's lengths up front")
    _check_count("input_len", input_len, 0, MAX_REQUEST_TOKENS, TOKENS_WHY)
    _check_count("output_len", output_len, 0, MAX_REQUEST_TOKENS, TOKENS_WHY)
    _check_count("prefix_len", prefix_len, 0, MAX_REQUEST_TOKENS, TOKENS_WHY)
    _check_count("seed", seed, 0, MAX_SEED, "numpy's RandomState, which vLLM seeds, takes 32-bit seeds")
    if not is_real(request_rate) or not request_rate > 0:
        raise UserInputError(f"random workload: request_rate={request_rate!r} must be a number > 0 "
                         "(inf: all at once)")
    # vLLM rescales the arrivals to end at num_prompts / request_rate: bound that span.
    if num_prompts / request_rate > MAX_ARRIVAL_TIME:
        raise UserInputError(f"random workload: request_rate={request_rate!r} spreads {num_prompts} requests "
                         f"over {num_prompts / request_rate:.4g} s, beyond the simulator's time span of "
                         f"{MAX_ARRIVAL_TIME:.0e} s (float64 times lose step-time precision further "
                         f"out); use a rate >= {num_prompts / MAX_ARRIVAL_TIME:.4g} req/s")
    if not is_real(burstiness) or not (MIN_BURSTINESS <= burstiness <= MAX_BURSTINESS
                                        or burstiness == math.inf):
        raise UserInputError(f"random workload: burstiness={burstiness!r} must be a number in "
                         f"[{MIN_BURSTINESS}, {MAX_BURSTINESS:.0e}] or inf (constant gaps): below, "
                         "numpy's gamma gaps underflow to 0; above, they are constant to 0.1 %")
    input_ratio, output_ratio = _split_range_ratio(range_ratio)
    input_low = math.floor(input_len * (1 - input_ratio))
    input_high = math.ceil(input_len * (1 + input_ratio))
    output_low = max(1, math.floor(output_len * (1 - output_ratio)))
    output_high = max(1, math.ceil(output_len * (1 + output_ratio)))
    if prefix_len + input_low < 1:
        raise UserInputError(f"random workload: prefix_len ({prefix_len}) + the shortest sampled input "
                         f"({input_low}) must be >= 1; raise input_len or prefix_len, or lower range_ratio")
    if prefix_len + input_high > MAX_REQUEST_TOKENS or output_high > MAX_REQUEST_TOKENS:
        raise UserInputError(f"random workload: prompts up to {prefix_len + input_high} tokens (prefix_len + "
                         f"input_len x (1 + range_ratio)) and outputs up to {output_high}: each must be "
                         f"<= 2**40 ({TOKENS_WHY})")

    import numpy as np  # only the random dataset needs numpy here; trace loading does not

    if tokenizer is not None and tokenizer.exact:
        lengths = random_lengths(tokenizer, num_prompts, input_len, output_len, (input_ratio, output_ratio),
                                 prefix_len, seed)
        prefix = lengths.prefix_tokens - lengths.special_tokens  # the prefix as re-encoded
        arrivals = array("d", arrival_times_of_rate(num_prompts, float(request_rate), float(burstiness),
                                                    seed))
        return Workload("random", RandomRequests(
            arrivals, array("q", [max(0, n - prefix) for n in lengths.prompt_lens]),
            array("q", lengths.output_lens), lengths.prefix_tokens), max_concurrency)
    rng = np.random.default_rng(seed)
    input_lens = array("q", rng.integers(input_low, input_high + 1, size=num_prompts).tolist())
    output_lens = array("q", rng.integers(output_low, output_high + 1, size=num_prompts).tolist())
    arrivals = array("d", arrival_times_of_rate(num_prompts, float(request_rate), float(burstiness), seed))
    return Workload("random", RandomRequests(arrivals, input_lens, output_lens, prefix_len),
                    max_concurrency)
