"""Random scenarios that use the oracle's optional scheduler features.

`random_feature_scenario(seed)` builds one scenario deterministically from its seed:
the knobs of a plain random scenario (random_scenarios.py's building blocks: token
budgets, chunked prefill, long-prefill thresholds, fcfs/priority, block sizes, tight
to roomy KV caches, shared prefixes, stop conditions, arrivals, aborts) plus a mix of
the optional features of SCENARIO_FORMAT.md, chosen by `seed % len(MIXES)`:

    async            "async_scheduling": true
    spec             speculative decoding, synchronous, method "ngram"
    spec_async       speculative decoding with async scheduling, method "ngram_gpu"
    lora             the LoRA cap ("max_loras" 1..3, requests with "lora_id" 0..4)
    lora_async, lora_spec, lora_spec_async   the cap combined with the others

Speculative requests get scripted `accepted_drafts` (0, K, in between, above K; absent,
short or long) and `proposed_drafts` (fewer than K, 0, absent; under async scheduling
the oracle ignores them, so they are only sometimes written). Prompts are reshaped so
that prefix-cache admissions of all but the last token (padded with K draft
placeholders) and one-token prompts are common; async scenarios get extra aborts
shortly after a request arrives, i.e. usually while one of its batches is in flight.

`validate_feature_scenario()` holds the rules vLLM 0.33 needs to accept and finish a
feature scenario, on top of random_scenarios.validate_scenario's.

Usage:
    python tests/conformance/random_features.py OUTDIR --seeds 0-399

The checked-in corpus (tests/conformance/random_features/) is seeds
FEATURE_CORPUS_SEEDS; regenerate.py rewrites it. Changing this generator (or the
building blocks it borrows from random_scenarios.py) changes those scenarios, so
regenerate the goldens with it.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_scenarios import (  # noqa: E402
    BLOCK_SIZES,
    Request,
    Scenario,
    _all_fit_at_once,
    _break_priority_ties,
    _random_aborts,
    _random_num_blocks,
    _random_requests,
    _random_scheduler,
    arrival_time_of,
    format_scenario,
    parse_seeds,
    request_blocks_needed,
    validate_scenario,
)

# The seeds whose scenarios and goldens are checked in under random_features/.
FEATURE_CORPUS_SEEDS = "0-399"
# Every scenario finishes in a few hundred steps; a livelock shows up well before this.
FEATURE_MAX_STEPS = 5000
FILE_PREFIX = "random_features_"

# The feature mixes, in the order seed % len(MIXES) picks them: every feature is in
# four of the seven.
MIXES = ("async", "spec", "spec_async", "lora", "lora_async", "lora_spec", "lora_spec_async")
# Draft lengths K: mostly small.
SPEC_TOKENS = [1, 2, 3, 4, 5]
SPEC_TOKENS_WEIGHTS = [4, 4, 3, 2, 1]
MAX_LORA_ID = 4
SPEC_METHODS = ("ngram", "ngram_gpu")


# ---------------------------------------------------------------------------
# Validity rules for the optional features.
# ---------------------------------------------------------------------------


def draft_lookahead(scenario: Scenario) -> int:
    """How many KV slots past prompt + max_tokens a request may hold at its longest.

    A synchronous step schedules all K drafts even when fewer outputs remain, so a
    request may allocate K - 1 slots beyond the last output it keeps (plus the one
    slot validate_scenario's rule already leaves). Under async scheduling one more
    batch of 1 + K tokens may be in flight when the next is scheduled: 2K.
    """
    spec = scenario.get("speculative")
    if spec is None:
        return 0
    k = int(spec.get("num_speculative_tokens", 0))
    return 2 * k if scenario.get("async_scheduling", False) else k


def fit_lookahead(scenario: Scenario) -> int:
    """The draft look-ahead a request must fit alone with (draft_lookahead), or 0
    when it need not.

    A running request whose drafts do not fit preempts itself, even alone, and is
    re-admitted later: that is fine without prefix caching (its recompute always
    fits and samples a token, and a resumed request has more than one token to
    compute, so it is never padded). With prefix caching the re-admission hits all
    but its last token whenever its length is 1 modulo the block size (always with
    block_size 1), is padded to 1 + K tokens, which do not fit either, and the
    waiting scan stops with nothing running: vLLM livelocks (seen with a lone
    request, block_size 1, K = 2, prompt 4 + max_tokens 8 and 13 blocks).
    """
    enable_prefix_caching = bool(scenario.get("cache", {}).get("enable_prefix_caching", False))
    return draft_lookahead(scenario) if enable_prefix_caching else 0


def validate_feature_scenario(scenario: Scenario) -> list[str]:
    """Every rule the scenario breaks (empty when vLLM 0.33 accepts and finishes it).

    On top of validate_scenario's rules:
    - `speculative` needs 1 <= K, a method that needs no drafter model (`ngram`,
      `ngram_gpu`), and not `ngram` with async scheduling (vLLM refuses it);
    - `max_num_batched_tokens >= 1 + K`: a request admitted with one token to compute
      is padded to 1 + K tokens or not admitted at all, so below that it (and all
      behind it) waits forever;
    - `long_prefill_token_threshold` not in (0, 1 + K): the threshold would cut a
      padded admission below 1 + K tokens and vLLM fails
      `assert num_new_tokens == 1 + self.num_spec_tokens` in schedule();
    - with prefix caching, every request fits alone in the KV cache with its draft
      look-ahead (fit_lookahead: else a self-preempted request may never be
      re-admitted);
    - draft scripts are lists of non-negative ints; `lora_id` >= 0, and > 0 only with
      `max_loras` >= 1;
    - under the priority policy, when the requests do not all fit in the KV cache at
      once with their draft look-ahead (draft_lookahead), the (priority,
      arrival_time) keys are unique (random_scenarios' _break_priority_ties: tied
      keys can preempt each other forever).
    """
    problems = validate_scenario(scenario)
    sc = scenario.get("scheduler", {})
    cc = scenario.get("cache", {})
    use_async = scenario.get("async_scheduling", False)
    if not isinstance(use_async, bool):
        problems.append("async_scheduling must be true or false")
    budget = int(sc.get("max_num_batched_tokens", 8192))
    threshold = int(sc.get("long_prefill_token_threshold", 0))
    max_model_len = int(sc.get("max_model_len", 8192))
    block_size = int(cc.get("block_size", 16))
    num_blocks = int(cc["num_gpu_blocks"])

    spec = scenario.get("speculative")
    if spec is not None:
        k = int(spec.get("num_speculative_tokens", 0))
        method = spec.get("method", "ngram_gpu" if use_async else "ngram")
        if k < 1:
            problems.append("speculative.num_speculative_tokens must be >= 1")
        if method not in SPEC_METHODS:
            problems.append(f"speculative.method must be one of {SPEC_METHODS}")
        if use_async and method == "ngram":
            problems.append("vLLM refuses ngram speculative decoding with async scheduling")
        if budget < 1 + k:
            problems.append("max_num_batched_tokens < 1 + K: a padded admission never fits (livelock)")
        if 0 < threshold < 1 + k:
            problems.append("long_prefill_token_threshold in (0, 1 + K) cuts a padded admission "
                            "(vLLM fails an assertion)")
    lookahead = fit_lookahead(scenario)
    has_loras = "max_loras" in scenario
    if has_loras and int(scenario["max_loras"]) < 1:
        problems.append("max_loras must be >= 1")
    for req in scenario["requests"]:
        rid = req["request_id"]
        for key in ("accepted_drafts", "proposed_drafts"):
            values = req.get(key)
            if values is None:
                continue
            if spec is None:
                problems.append(f"{rid}: {key} without speculative decoding")
            if not all(isinstance(v, int) and v >= 0 for v in values):
                problems.append(f"{rid}: {key} must hold non-negative ints")
        lora_id = req.get("lora_id")
        if lora_id is not None:
            if not isinstance(lora_id, int) or lora_id < 0:
                problems.append(f"{rid}: lora_id must be an int >= 0")
            elif lora_id and not has_loras:
                problems.append(f"{rid}: lora_id needs max_loras")
        longest = min(len(req["prompt_token_ids"]) + int(req["max_tokens"]) + lookahead, max_model_len)
        if lookahead and math.ceil(longest / block_size) > num_blocks - 1:
            problems.append(f"{rid}: cannot fit alone in the KV cache with its draft look-ahead")

    if sc.get("policy", "fcfs") == "priority" and not _all_fit_at_once(
        _with_lookahead(scenario["requests"], draft_lookahead(scenario)), sc, block_size, num_blocks
    ):
        keys = [(int(r.get("priority", 0)), arrival_time_of(r)) for r in scenario["requests"]]
        if len(set(keys)) != len(keys):
            problems.append("priority policy with a tight KV cache needs unique (priority, arrival_time)")
    return problems


def _with_lookahead(requests: list[Request], lookahead: int) -> list[Request]:
    """Copies whose max_tokens include the draft look-ahead, for the KV sizing rules."""
    if not lookahead:
        return requests
    return [dict(r, max_tokens=int(r["max_tokens"]) + lookahead) for r in requests]


# ---------------------------------------------------------------------------
# The generator.
# ---------------------------------------------------------------------------


def feature_mix(seed: int) -> str:
    return MIXES[seed % len(MIXES)]


def random_feature_scenario(seed: int) -> Scenario:
    """Build a random valid feature scenario; the same seed always gives the same one."""
    # A string seed: a stream of its own, unrelated to random_scenario(seed)'s.
    rng = random.Random(f"random_features:{seed}")
    mix = feature_mix(seed)
    use_async = "async" in mix
    use_spec = "spec" in mix
    use_lora = "lora" in mix
    k = rng.choices(SPEC_TOKENS, SPEC_TOKENS_WEIGHTS)[0] if use_spec else 0

    scheduler = _random_scheduler(rng)
    if use_spec:
        _fit_budget_and_threshold(rng, scheduler, k)
    block_size = rng.choice(BLOCK_SIZES)
    prefix_caching = rng.random() < 0.7
    requests = _random_requests(rng, scheduler, block_size)
    sources = _reshape_prompts(rng, requests, block_size)

    features: Scenario = {}
    if use_async:
        features["async_scheduling"] = True
    if use_spec:
        features["speculative"] = {
            "num_speculative_tokens": k,
            "method": "ngram_gpu" if use_async else "ngram",
        }
        for req in requests:
            _script_drafts(rng, req, k, use_async)
    if use_lora:
        features["max_loras"] = max_loras = rng.choices([1, 2, 3], [4, 3, 2])[0]
        if scheduler["max_num_seqs"] <= max_loras and rng.random() < 0.8:
            # Room for more running requests than adapters: the cap then binds.
            _raise_max_num_seqs(scheduler, max_loras + rng.randint(1, 3))
        _assign_loras(rng, requests, sources, max_loras)

    cache_flags = {"cache": {"enable_prefix_caching": prefix_caching}}
    # Without prefix caching the cache may be too small for a request's drafts: it
    # then preempts itself (see fit_lookahead).
    sized = _with_lookahead(requests, fit_lookahead({**features, **cache_flags}))
    num_blocks = _random_num_blocks(rng, sized, scheduler, block_size)
    if use_spec and not prefix_caching and rng.random() < 0.35:
        # As small as vLLM allows: the largest request's drafts overflow it.
        max_model_len = scheduler["max_model_len"]
        num_blocks = 1 + max(request_blocks_needed(r, max_model_len, block_size) for r in requests)
    if scheduler["policy"] == "priority" and not _all_fit_at_once(
        _with_lookahead(requests, draft_lookahead(features)), scheduler, block_size, num_blocks
    ):
        _break_priority_ties(requests)
    scenario: Scenario = {
        "description": f"Random feature scenario from seed {seed}: {_describe(features)} "
        "(tests/conformance/random_features.py).",
        **features,
        "scheduler": scheduler,
        "cache": {
            "block_size": block_size,
            "num_gpu_blocks": num_blocks,
            "enable_prefix_caching": prefix_caching,
        },
        "requests": requests,
    }
    aborts = _random_aborts(rng, requests)
    if use_async and rng.random() < 0.45:
        aborts = _merge_aborts(aborts, _early_aborts(rng, requests))
    if aborts:
        scenario["aborts"] = aborts
    scenario["max_steps"] = FEATURE_MAX_STEPS
    problems = validate_feature_scenario(scenario)
    if problems:  # a generator bug, never a property of the seed
        raise AssertionError(f"seed {seed} produced an invalid feature scenario: {problems}")
    return scenario


def _describe(features: Scenario) -> str:
    parts = []
    if features.get("async_scheduling"):
        parts.append("async scheduling")
    spec = features.get("speculative")
    if spec is not None:
        parts.append(f"speculative {spec['method']} K={spec['num_speculative_tokens']}")
    if "max_loras" in features:
        parts.append(f"max_loras={features['max_loras']}")
    return ", ".join(parts)


def _fit_budget_and_threshold(rng: random.Random, scheduler: dict[str, Any], k: int) -> None:
    """Keep the token budget and the long-prefill threshold clear of 1 + K (see
    validate_feature_scenario), often landing right on the boundary."""
    if scheduler["max_num_batched_tokens"] < 1 + k:
        scheduler["max_num_batched_tokens"] = 1 + k + rng.choice([0, 0, 1, 2])
    threshold = scheduler["long_prefill_token_threshold"]
    if 0 < threshold < 1 + k:
        scheduler["long_prefill_token_threshold"] = rng.choice([0, 1 + k, 1 + k + threshold])


def _raise_max_num_seqs(scheduler: dict[str, Any], max_num_seqs: int) -> None:
    scheduler["max_num_seqs"] = max_num_seqs
    # vLLM needs max_num_batched_tokens >= max_num_seqs.
    scheduler["max_num_batched_tokens"] = max(scheduler["max_num_batched_tokens"], max_num_seqs)


def _reshape_prompts(rng: random.Random, requests: list[Request], block_size: int) -> list[int | None]:
    """Make prefix-cache admissions of all but the last token, and one-token prompts,
    common: both admit a request with a single token to compute, which speculative
    decoding pads with K drafts. Returns, for each request, the index of the earlier
    request whose prompt it copies (None if none): LoRA adapters follow it so the
    cached blocks can be shared.

    A hit covers whole blocks and never the last prompt token, so it covers all but
    the last token when the prompt's length is m * block_size + 1 and its first m
    blocks are cached: the copy takes such a prefix of an earlier prompt (sometimes
    the whole prompt, cut to that length first).
    """
    sources: list[int | None] = [None] * len(requests)
    repeat_rate = rng.choice([0.0, 0.15, 0.3, 0.45])
    one_token_rate = rng.choice([0.0, 0.05, 0.12])
    for i, req in enumerate(requests):
        roll = rng.random()
        if i and roll < repeat_rate:
            j = rng.randrange(i)
            src = requests[j]
            prompt = src["prompt_token_ids"]
            whole_blocks = (len(prompt) - 1) // block_size
            if whole_blocks and rng.random() < 0.5:
                m = rng.randint(1, whole_blocks)
                req["prompt_token_ids"] = prompt[: m * block_size + 1]
            else:
                if whole_blocks and (len(prompt) - 1) % block_size and rng.random() < 0.5:
                    # Cut the earlier prompt too: the copy then repeats it exactly
                    # and still hits all but its last token.
                    prompt = src["prompt_token_ids"] = prompt[: whole_blocks * block_size + 1]
                req["prompt_token_ids"] = list(prompt)
            sources[i] = j
            if rng.random() < 0.6:
                # Arrive after the earlier request, so its blocks are likely cached.
                req["arrival_step"] = max(
                    int(req["arrival_step"]), int(src["arrival_step"]) + rng.randint(1, 12)
                )
        elif roll > 1 - one_token_rate:
            req["prompt_token_ids"] = [rng.randint(3, 12)]
    return sources


def _script_drafts(rng: random.Random, req: Request, k: int, use_async: bool) -> None:
    """accepted_drafts (one entry per verification) and proposed_drafts (one per
    sampling step, synchronous only: the async oracle ignores them)."""
    max_tokens = int(req["max_tokens"])
    style = rng.choices(["absent", "none", "all", "mixed", "short"], [2, 2, 1, 5, 2])[0]
    accepted: list[int] | None = None
    if style == "none":
        accepted = [0] * rng.randint(1, max_tokens + 1)
    elif style == "all":
        accepted = [rng.choice([k, k, k + 1, k + 3]) for _ in range(rng.randint(1, max_tokens))]
    elif style == "mixed":
        accepted = [_draft_count(rng, k) for _ in range(rng.randint(1, max_tokens + 2))]
    elif style == "short":
        accepted = [_draft_count(rng, k) for _ in range(rng.randint(1, 3))]
    if accepted is not None:
        req["accepted_drafts"] = accepted
    if rng.random() < (0.2 if use_async else 0.65):
        n = rng.randint(1, max_tokens + 1)
        proposed_weights = [4, 3, 2, 1]
        req["proposed_drafts"] = [
            rng.choices([k, rng.randint(0, k - 1), 0, k + 1], proposed_weights)[0] for _ in range(n)
        ]


def _draft_count(rng: random.Random, k: int) -> int:
    """0, K, something in between, or more than K (clamped to K by the oracle)."""
    kind = rng.choices(["zero", "all", "some", "over"], [3, 3, 3, 1])[0]
    if kind == "zero":
        return 0
    if kind == "all":
        return k
    if kind == "some":
        return rng.randint(1, k - 1) if k > 1 else rng.randint(0, 1)
    return k + rng.randint(1, 3)


def _assign_loras(
    rng: random.Random, requests: list[Request], sources: list[int | None], max_loras: int
) -> None:
    """Adapters 1..MAX_LORA_ID and the base model (0, written out or left out); a
    prompt copy usually keeps its source's adapter so the prefix cache can hit.
    Usually more adapters than the cap, so that the cap has work to do."""
    num_adapters = min(MAX_LORA_ID, max_loras + rng.choice([-1, 0, 1, 2, 2, 3, 3]))
    adapters = sorted(rng.sample(range(1, MAX_LORA_ID + 1), max(1, num_adapters)))
    base_share = rng.choice([0.0, 0.2, 0.4])
    ids: list[int] = []
    for req, src in zip(requests, sources):
        if src is not None and rng.random() < 0.7:
            lora_id = ids[src]
        elif rng.random() < base_share:
            lora_id = 0
        else:
            lora_id = rng.choice(adapters)
        ids.append(lora_id)
        if lora_id or rng.random() < 0.3:
            req["lora_id"] = lora_id


def _early_aborts(rng: random.Random, requests: list[Request]) -> list[dict[str, Any]]:
    """Aborts a few steps after arrival: under async scheduling the request is then
    usually running with a batch in flight, whose output vLLM drops."""
    by_step: dict[int, list[str]] = {}
    for _ in range(rng.randint(1, 3)):
        req = rng.choice(requests)
        step = int(req["arrival_step"]) + rng.randint(1, 10)
        ids = by_step.setdefault(step, [])
        if req["request_id"] not in ids:
            ids.append(req["request_id"])
    return [{"step": step, "request_ids": ids} for step, ids in sorted(by_step.items())]


def _merge_aborts(*lists: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_step: dict[int, list[str]] = {}
    for aborts in lists:
        for abort in aborts:
            ids = by_step.setdefault(int(abort["step"]), [])
            ids.extend(rid for rid in abort["request_ids"] if rid not in ids)
    return [{"step": step, "request_ids": ids} for step, ids in sorted(by_step.items())]


# ---------------------------------------------------------------------------
# Files and command line.
# ---------------------------------------------------------------------------


def feature_scenario_path(outdir: Path, seed: int) -> Path:
    return outdir / f"{FILE_PREFIX}{seed}.json"


def write_feature_scenarios(outdir: Path, seeds: list[int]) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = feature_scenario_path(outdir, seed)
        path.write_text(format_scenario(random_feature_scenario(seed)))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write random_features_SEED.json scenarios.")
    parser.add_argument("outdir", type=Path, help=f"folder to write {FILE_PREFIX}SEED.json into")
    parser.add_argument(
        "--seeds",
        default=FEATURE_CORPUS_SEEDS,
        help=f"e.g. 0-399 or 0-9,42 (default {FEATURE_CORPUS_SEEDS})",
    )
    args = parser.parse_args(argv)
    paths = write_feature_scenarios(args.outdir, parse_seeds(args.seeds))
    print(f"wrote {len(paths)} scenarios to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
