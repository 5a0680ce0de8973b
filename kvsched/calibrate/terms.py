"""The host terms as calibrate handles them: how each is printed, its unit
in the optimiser, what it means, which ones a fit takes, and a terms file
with some replaced."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from kvsched.calibrate.run_files import ObservedRun
from kvsched.errors import UserInputError
from kvsched.perf.host import TERMS, HostTerms

# How each term is printed (unit, factor from seconds) and its typical size
# on a data-centre GPU (the start for a backend with no terms of its own; the
# optimiser's units come from the runs instead: latency_units).
TERM_SCALES: Mapping[str, float] = {
    "prefill_step_per_layer_s": 1e-4, "step_s": 1e-4, "per_sampled_request_s": 2e-6,
    "dp_sync_s": 1e-4, "arrival_s": 1e-3, "per_prompt_token_s": 1e-6,
    "per_prefill_request_s": 3e-4, "per_prefill_token_s": 1e-6, "prefill_launch_per_layer_s": 5e-5}
# What a term means, one line each, for the summary.
TERM_MEANING: Mapping[str, str] = {
    "prefill_step_per_layer_s": "per model layer, per step with prefill tokens",
    "step_s": "per engine step",
    "per_sampled_request_s": "per request sampling in a step",
    "dp_sync_s": "per step, data parallel ranks' sync",
    "arrival_s": "per request, send to scheduler",
    "per_prompt_token_s": "per prompt token, at arrival (tokenisation)",
    "per_prefill_request_s": "per request with prefill tokens in a step",
    "per_prefill_token_s": "per prefill token computed in a step",
    "prefill_launch_per_layer_s": "per model layer, a floor under a step with prefill tokens"}


# The terms a fit takes when --fit does not name them: those the default
# file's selection kept (benchmarks/fit_host_terms.py chose them by
# cross-validation across GPUs and vLLM versions, docs/validation.md; its
# launch floor fitted 0 and binds on no step of those runs, so a fit could
# not place it), and dp_sync_s with data parallelism. The others stay as the
# start has them:
# on runs without prefix-cache hits several prefill terms are nearly
# collinear (one prefill per step charges a request, its tokens and a
# per-layer term alike), so fitting them all at once is ill-posed.
DEFAULT_FIT = ("step_s", "per_sampled_request_s", "dp_sync_s", "arrival_s", "per_prompt_token_s",
               "per_prefill_request_s", "per_prefill_token_s")


def typical_start(data_parallel_size: int) -> HostTerms:
    """The fit's start for a backend with no host terms of its own (the
    roofline, the profiled backend): each term at its typical size
    (TERM_SCALES), ``dp_sync_s`` 0 with one DP rank (no step pays it). Not
    zero: with no arrival delay at all the requests skip the transit the
    arrival terms open (a jump in every latency at 0), and the optimiser
    would start on its bound, where that jump misleads it."""
    values = {n: TERM_SCALES[n] if n in DEFAULT_FIT else 0.0 for n in TERMS}
    if data_parallel_size == 1:
        values["dp_sync_s"] = 0.0
    return HostTerms(vllm_version="any", hardware_class="any",
                     provenance="typical sizes (kvsched.calibrate.terms.TERM_SCALES)", **values)


def latency_units(runs: Sequence[ObservedRun], num_layers: int) -> dict[str, float]:
    """Each term's unit in the optimiser, read off the runs themselves: the
    value at which the term alone would make up the latency it is part of
    (a step's terms the runs' mean TPOT: ``step_s`` all of it,
    ``prefill_step_per_layer_s`` over the model's layers,
    ``per_sampled_request_s`` over the requests decoding at once; the
    arrival terms their mean TTFT, ``per_prompt_token_s`` over the mean
    prompt). In these units a term's effect is comparable whichever the
    term and whatever the hardware (a GPU's 20 ms step and a CPU's 50 ms
    alike), so a finite difference of a fixed fraction of a unit moves the
    latencies by a few per cent: far above the jumps of a replay (a request
    landing one step later), which a difference sized to a GPU's typical
    term (0.1 ms in a 50 ms CPU step) drowns in. A run without the metric
    falls back to the typical size (TERM_SCALES)."""
    tpots = [t for t in (run.mean_tpot() for run in runs) if t is not None and t > 0]
    ttfts = [t for t in (run.mean_ttft() for run in runs) if t > 0]
    prompts = [sum(run.input_lens) / len(run.input_lens) for run in runs if run.input_lens]
    units = dict(TERM_SCALES)
    if tpots:
        tpot = statistics.median(tpots)
        concurrency = statistics.median(run.decode_concurrency() for run in runs)
        units.update(step_s=tpot, dp_sync_s=tpot, prefill_step_per_layer_s=tpot / max(num_layers, 1),
                     prefill_launch_per_layer_s=tpot / max(num_layers, 1), per_prefill_request_s=tpot,
                     per_sampled_request_s=tpot / concurrency)
    if ttfts:
        ttft = statistics.median(ttfts)
        prompt = max(statistics.median(prompts), 1.0) if prompts else 1.0
        units.update(arrival_s=ttft, per_prompt_token_s=ttft / prompt, per_prefill_token_s=ttft / prompt)
    return units


def parse_fit_names(text: str | None, data_parallel_size: int) -> tuple[str, ...]:
    """The terms to fit: ``--fit a,b`` or :data:`DEFAULT_FIT` (``dp_sync_s``
    only with data parallelism, where a step pays it)."""
    if text is None:
        return tuple(t for t in DEFAULT_FIT if t != "dp_sync_s" or data_parallel_size > 1)
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise UserInputError(f"--fit={text!r}: name at least one term ({', '.join(TERMS)})")
    unknown = [n for n in names if n not in TERMS]
    if unknown:
        raise UserInputError(f"--fit: unknown term {', '.join(map(repr, unknown))}; the terms are "
                         f"{', '.join(TERMS)}")
    if "dp_sync_s" in names and data_parallel_size == 1:
        raise UserInputError("--fit dp_sync_s: the deployment has one DP rank (--data-parallel-size 1), "
                         "where no step pays it; fit it on runs with --data-parallel-size > 1")
    return tuple(dict.fromkeys(names))


def with_terms(base: HostTerms, values: Mapping[str, float]) -> HostTerms:
    """``base`` with the named terms replaced (metadata kept)."""
    fields: dict[str, Any] = {**base.to_json(), **{k: float(v) for k, v in values.items()}}
    return HostTerms(**fields)
