"""Random, valid scheduler scenarios for conformance testing against vLLM 0.33.0.

`random_scenario(seed)` builds one scenario (format: SCENARIO_FORMAT.md in the shared
reference folder) deterministically from its seed. The scenarios are kept small so
their golden traces stay cheap to store and replay, but they mix every knob the
scheduler has: chunked prefill on/off, tiny to huge token budgets, long-prefill
thresholds, fcfs/priority, full-ISL reservation, block sizes 1..32, tight to roomy KV
caches, prefix sharing, stop conditions, staggered arrivals and aborts.

Usage:
    python -m tests.conformance.random_scenarios OUTDIR --seeds 0-199
    python tests/conformance/random_scenarios.py OUTDIR --seeds 0-9,42

The checked-in corpus (tests/conformance/random/) is seeds CORPUS_SEEDS; regenerate.py
rewrites it. Changing this generator changes those scenarios, so regenerate the goldens
with it.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

Scenario = dict[str, Any]
Request = dict[str, Any]

# The reference's config-only model has max_position_embeddings = 8192; vLLM rejects
# a larger max_model_len for it.
REFERENCE_MAX_MODEL_LEN = 8192
# The fake model samples this token past the end of a script (see vllm_replay.py);
# never use it as a stop token, or every unscripted request would stop at once.
DEFAULT_TOKEN = 100
EOS_TOKEN = 2
RANDOM_MAX_STEPS = 20000
# The seeds whose scenarios and goldens are checked in under tests/conformance/random/.
CORPUS_SEEDS = "0-299"
# Rough ceiling on the number of steps a random scenario should take; it keeps each
# golden trace around tens of kilobytes.
TARGET_STEPS = 260
# The vLLM releases whose scenarios also draw vLLM 0.34's admission knobs
# (cache-aware admission here; random_kv_connector.py adds the in-flight KV load
# cap). Any other release gets the scenario it always got (the committed corpora).
ADMISSION_KNOB_RELEASES = ("0.34",)
BASE_RELEASE = "0.33"
# Cache-aware admission's window: 0 (off) or up to this many waiting requests.
MAX_CACHE_AWARE_WINDOW = 8

BLOCK_SIZES = [1, 2, 4, 8, 16, 32]
MAX_MODEL_LENS = [24, 48, 64, 96, 128, 256, 512, 1024, 2048, 8192]
MAX_MODEL_LEN_WEIGHTS = [3, 5, 6, 6, 8, 8, 6, 3, 2, 1]
MAX_NUM_SEQS = [1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256]
MAX_NUM_SEQS_WEIGHTS = [12, 12, 9, 8, 6, 6, 4, 4, 3, 2, 1, 1]
STOP_CANDIDATES = [5, 6, 7, 8, 9]


# ---------------------------------------------------------------------------
# Validity rules shared with the hand-written scenarios.
# ---------------------------------------------------------------------------


def request_blocks_needed(req: Request, max_model_len: int, block_size: int) -> int:
    """KV blocks a request needs when running alone, at its longest."""
    longest = min(len(req["prompt_token_ids"]) + int(req["max_tokens"]), max_model_len)
    return math.ceil(longest / block_size)


def validate_scenario(scenario: Scenario) -> list[str]:
    """Return every rule the scenario breaks (empty when vLLM accepts and finishes it)."""
    problems: list[str] = []
    sc = scenario.get("scheduler", {})
    cc = scenario.get("cache", {})
    max_num_seqs = int(sc.get("max_num_seqs", 128))
    budget = int(sc.get("max_num_batched_tokens", 8192))
    max_model_len = int(sc.get("max_model_len", 8192))
    chunked = bool(sc.get("enable_chunked_prefill", True))
    threshold = int(sc.get("long_prefill_token_threshold", 0))
    block_size = int(cc.get("block_size", 16))
    num_blocks = int(cc["num_gpu_blocks"])

    if budget < max_num_seqs:
        problems.append("max_num_batched_tokens < max_num_seqs")
    if not chunked and budget < max_model_len:
        problems.append("chunked prefill off needs max_num_batched_tokens >= max_model_len")
    if not 0 <= threshold <= max_model_len:
        problems.append("long_prefill_token_threshold must be in [0, max_model_len]")
    if max_model_len > REFERENCE_MAX_MODEL_LEN:
        problems.append(f"max_model_len > {REFERENCE_MAX_MODEL_LEN} (reference model limit)")
    if sc.get("policy", "fcfs") not in ("fcfs", "priority"):
        problems.append("policy must be fcfs or priority")
    if num_blocks < 2:
        problems.append("num_gpu_blocks must leave at least one usable block")
    if "max_steps" not in scenario:
        problems.append("max_steps missing")

    ids = [r["request_id"] for r in scenario["requests"]]
    if len(set(ids)) != len(ids):
        problems.append("duplicate request ids")
    for req in scenario["requests"]:
        problems.extend(_request_problems(req, max_model_len, block_size, num_blocks))

    known = set(ids)
    arrival = {r["request_id"]: int(r.get("arrival_step", 0)) for r in scenario["requests"]}
    for abort in scenario.get("aborts", []):
        rids = abort["request_ids"]
        if len(set(rids)) != len(rids):
            problems.append(f"abort at step {abort['step']} repeats an id")
        for rid in rids:
            if rid not in known:
                problems.append(f"abort of unknown id {rid}")
            elif int(abort["step"]) < arrival[rid]:
                problems.append(f"abort of {rid} before it arrives")
    return problems


def arrival_time_of(req: Request) -> float:
    """The priority tie-break time: arrival_time, defaulting to arrival_step."""
    value = req.get("arrival_time")
    return float(req.get("arrival_step", 0) if value is None else value)


def _request_problems(req: Request, max_model_len: int, block_size: int, num_blocks: int) -> list[str]:
    rid = req["request_id"]
    prompt = req["prompt_token_ids"]
    max_tokens = int(req["max_tokens"])
    min_tokens = int(req.get("min_tokens", 0))
    problems: list[str] = []
    if not prompt:
        problems.append(f"{rid}: empty prompt")
    if len(prompt) >= max_model_len:
        problems.append(f"{rid}: prompt not shorter than max_model_len")
    if max_tokens < 1:
        problems.append(f"{rid}: max_tokens < 1")
    if not 0 <= min_tokens <= max_tokens:
        problems.append(f"{rid}: min_tokens not in [0, max_tokens]")
    if DEFAULT_TOKEN in req.get("stop_token_ids", []):
        problems.append(f"{rid}: stop token {DEFAULT_TOKEN} is the fake model's default")
    # The null block is never usable, so a lone request must fit in the rest.
    if request_blocks_needed(req, max_model_len, block_size) > num_blocks - 1:
        problems.append(f"{rid}: cannot fit alone in the KV cache")
    if arrival_time_of(req) < 0:
        problems.append(f"{rid}: negative arrival_time")
    return problems


# ---------------------------------------------------------------------------
# Stable, diff-friendly JSON: one request per line.
# ---------------------------------------------------------------------------


def format_scenario(scenario: Scenario) -> str:
    """Serialise a scenario with one line per request, so diffs stay readable."""
    lines = ["{"]
    items = list(scenario.items())
    for index, (key, value) in enumerate(items):
        comma = "," if index < len(items) - 1 else ""
        if key in ("requests", "aborts") and isinstance(value, list):
            lines.append(f"  {json.dumps(key)}: [")
            for j, item in enumerate(value):
                item_comma = "," if j < len(value) - 1 else ""
                lines.append(f"    {_compact_json(item)}{item_comma}")
            lines.append(f"  ]{comma}")
        else:
            lines.append(f"  {json.dumps(key)}: {_compact_json(value)}{comma}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "))


# ---------------------------------------------------------------------------
# The random generator.
# ---------------------------------------------------------------------------


def random_scenario(seed: int, vllm_version: str = BASE_RELEASE) -> Scenario:
    """Build a random valid scenario; the same seed (and release) always gives the
    same scenario. For a release in ADMISSION_KNOB_RELEASES the scenario also sets
    cache-aware admission (add_cache_aware_admission, from a generator of its own,
    so the rest is the base release's scenario)."""
    rng = random.Random(seed)
    scheduler = _random_scheduler(rng)
    block_size = rng.choice(BLOCK_SIZES)
    prefix_caching = rng.random() < 0.55
    requests = _random_requests(rng, scheduler, block_size)
    num_blocks = _random_num_blocks(rng, requests, scheduler, block_size)
    if scheduler["policy"] == "priority" and not _all_fit_at_once(
        requests, scheduler, block_size, num_blocks
    ):
        _break_priority_ties(requests)
    cache = {
        "block_size": block_size,
        "num_gpu_blocks": num_blocks,
        "enable_prefix_caching": prefix_caching,
    }
    scenario: Scenario = {
        "description": f"Random scenario from seed {seed} (tests/conformance/random_scenarios.py).",
        "scheduler": scheduler,
        "cache": cache,
        "requests": requests,
    }
    aborts = _random_aborts(rng, requests)
    if aborts:
        scenario["aborts"] = aborts
    scenario["max_steps"] = RANDOM_MAX_STEPS
    if vllm_version in ADMISSION_KNOB_RELEASES:
        add_cache_aware_admission(scenario, random.Random(f"random_scenarios:admission:{seed}"))
        scenario["description"] = (f"Random scenario from seed {seed} with vLLM {vllm_version}'s "
                                   "cache-aware admission (tests/conformance/random_scenarios.py).")
    problems = validate_scenario(scenario)
    if problems:  # a generator bug, never a property of the seed
        raise AssertionError(f"seed {seed} produced an invalid scenario: {problems}")
    return scenario


def add_cache_aware_admission(scenario: Scenario, rng: random.Random) -> None:
    """vLLM 0.34's cache-aware admission: a window of 0 (off) to
    MAX_CACHE_AWARE_WINDOW waiting requests, a usage threshold of 0 (every step),
    a fraction, or vLLM's default 0.5 (key left out). It applies only with FCFS and
    prefix caching, so half the scenarios are switched to both (always valid: a
    priority is ignored under FCFS, and prefix caching only adds hits)."""
    scheduler = scenario["scheduler"]
    if rng.random() < 0.5:
        scheduler["policy"] = "fcfs"
        scenario["cache"]["enable_prefix_caching"] = True
    scheduler["cache_aware_admission_window"] = (
        0 if rng.random() < 0.2 else rng.randint(1, MAX_CACHE_AWARE_WINDOW))
    draw = rng.random()
    if draw < 0.35:
        scheduler["cache_aware_admission_threshold"] = 0.0
    elif draw < 0.85:
        scheduler["cache_aware_admission_threshold"] = round(rng.random(), 2)


def _random_scheduler(rng: random.Random) -> dict[str, Any]:
    max_model_len = rng.choices(MAX_MODEL_LENS, MAX_MODEL_LEN_WEIGHTS)[0]
    max_num_seqs = rng.choices(MAX_NUM_SEQS, MAX_NUM_SEQS_WEIGHTS)[0]
    chunked = rng.random() < 0.7
    budget = max(_random_budget(rng, max_num_seqs), max_num_seqs)
    if not chunked:
        # vLLM refuses chunked prefill off unless a whole max_model_len prompt fits.
        budget = max(budget, max_model_len)
        if rng.random() < 0.4:
            budget = max(max_model_len, max_num_seqs)
    scheduler: dict[str, Any] = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": _random_threshold(rng, max_model_len),
        "policy": rng.choice(["fcfs", "priority"]),
    }
    reserve = rng.random()
    if reserve < 0.3:
        scheduler["scheduler_reserve_full_isl"] = False
    elif reserve < 0.55:
        scheduler["scheduler_reserve_full_isl"] = True
    # Otherwise leave it out: vLLM's default (true) applies.
    return scheduler


def _random_budget(rng: random.Random, max_num_seqs: int) -> int:
    kind = rng.choices(["tiny", "small", "medium", "large", "huge"], [3, 4, 4, 2, 1])[0]
    if kind == "tiny":
        return max_num_seqs + rng.randint(0, 3)
    if kind == "small":
        return rng.randint(4, 48)
    if kind == "medium":
        return rng.randint(48, 512)
    if kind == "large":
        return rng.choice([1024, 2048, 4096, 8192])
    return rng.choice([16384, 65536])


def _random_threshold(rng: random.Random, max_model_len: int) -> int:
    if rng.random() < 0.6:
        return 0
    return rng.randint(1, min(max_model_len, 64))


def _random_requests(rng: random.Random, scheduler: dict[str, Any], block_size: int) -> list[Request]:
    max_model_len = scheduler["max_model_len"]
    # Prompts longer than this would only add steps, not new behaviour.
    max_prompt = min(max_model_len - 1, rng.choice([16, 48, 96, 160]))
    vocab = list(range(3, 3 + rng.choice([2, 3, 6, 40])))
    bases = [
        [rng.choice(vocab) for _ in range(rng.randint(1, max(1, max_prompt)))]
        for _ in range(rng.randint(1, 4))
    ]
    arrivals = _arrival_plan(rng)
    priorities = rng.random() < 0.7
    num_requests = rng.randint(1, 40)
    requests: list[Request] = []
    prompts: list[list[int]] = []
    steps = 0.0
    for index in range(num_requests):
        prompt = _random_prompt(rng, bases, prompts, vocab, max_prompt, block_size)
        req = _random_request(rng, index, prompt, arrivals, priorities)
        steps += _estimated_steps(req, scheduler)
        # Stop adding requests once the scenario would run too long (always keep one).
        if requests and steps > TARGET_STEPS:
            break
        requests.append(req)
        prompts.append(prompt)
    return requests


def _arrival_plan(rng: random.Random) -> dict[str, Any]:
    mode = rng.choices(["together", "spread", "bursts"], [4, 4, 2])[0]
    return {
        "mode": mode,
        "spread": rng.randint(1, 80),
        "bursts": sorted(rng.sample(range(0, 60), 3)),
        "time": rng.choices(["default", "offset", "coarse"], [5, 3, 2])[0],
    }


def _random_prompt(
    rng: random.Random,
    bases: list[list[int]],
    earlier: list[list[int]],
    vocab: list[int],
    max_prompt: int,
    block_size: int,
) -> list[int]:
    roll = rng.random()
    if earlier and roll < 0.12:
        return list(rng.choice(earlier))  # an identical prompt: full-prefix hit
    prompt: list[int] = []
    if roll < 0.7:
        base = rng.choice(bases)
        prompt = base[: rng.randint(1, len(base))]
    suffix = rng.randint(0 if prompt else 1, max(1, max_prompt // 2))
    prompt += [rng.choice(vocab) for _ in range(suffix)]
    prompt = prompt[:max_prompt]
    if rng.random() < 0.15 and len(prompt) >= block_size:
        # Exactly whole blocks: the last prompt token must still be recomputed.
        prompt = prompt[: len(prompt) - len(prompt) % block_size]
    return prompt


def _random_request(
    rng: random.Random,
    index: int,
    prompt: list[int],
    arrivals: dict[str, Any],
    priorities: bool,
) -> Request:
    max_tokens = rng.choices([rng.randint(1, 8), rng.randint(1, 32), rng.randint(32, 96)], [5, 4, 1])[0]
    min_tokens = 0 if rng.random() < 0.7 else rng.randint(0, max_tokens)
    eos = EOS_TOKEN if rng.random() < 0.6 else None
    stop_ids = sorted(rng.sample(STOP_CANDIDATES, rng.randint(1, 2))) if rng.random() < 0.3 else []
    arrival_step = _arrival_step(rng, arrivals)
    req: Request = {
        # Unpadded numbers: "r10" < "r2" as strings, which exercises id tie-breaks.
        "request_id": f"r{index}",
        "prompt_token_ids": prompt,
        "max_tokens": max_tokens,
    }
    if min_tokens:
        req["min_tokens"] = min_tokens
    if eos is not None:
        req["eos_token_id"] = eos
    if rng.random() < 0.15:
        req["ignore_eos"] = True
    if stop_ids:
        req["stop_token_ids"] = stop_ids
    if priorities:
        req["priority"] = rng.randint(-2, 3)
    req["arrival_step"] = arrival_step
    arrival_time = _arrival_time(rng, arrivals, arrival_step)
    if arrival_time is not None:
        req["arrival_time"] = arrival_time
    req["sampled_token_ids"] = _random_script(rng, max_tokens, eos, stop_ids)
    return req


def _arrival_step(rng: random.Random, arrivals: dict[str, Any]) -> int:
    if arrivals["mode"] == "together":
        return 0
    if arrivals["mode"] == "spread":
        return rng.randint(0, arrivals["spread"])
    return int(rng.choice(arrivals["bursts"]))


def _arrival_time(rng: random.Random, arrivals: dict[str, Any], arrival_step: int) -> float | int | None:
    """None keeps the default (arrival_step); the others decouple the tie-break."""
    if arrivals["time"] == "default":
        return None
    if arrivals["time"] == "offset":
        offset: int | float = rng.choice([0, 0, 0.5, 2, 7])
        return arrival_step + offset
    # Few distinct values, unrelated to arrival order: many (priority, time) ties.
    return rng.randint(0, 4)


def _random_script(rng: random.Random, max_tokens: int, eos: int | None, stop_ids: list[int]) -> list[int]:
    """Scripted outputs; some positions hit EOS or a stop id (the rest 'normal' ids)."""
    stops = list(stop_ids) + ([eos] if eos is not None else [])
    hit_rate = rng.choice([0.0, 0.02, 0.08, 0.2]) if stops else 0.0
    length = rng.randint(0, max_tokens)
    script: list[int] = []
    for _ in range(length):
        if stops and rng.random() < hit_rate:
            script.append(rng.choice(stops))
        else:
            script.append(rng.randint(10, 99))
    return script


def _estimated_steps(req: Request, scheduler: dict[str, Any]) -> float:
    """A crude share of the steps this request adds (prefill chunks + decodes)."""
    budget = scheduler["max_num_batched_tokens"]
    parallel = max(1, min(scheduler["max_num_seqs"], budget))
    prefill = len(req["prompt_token_ids"]) / budget
    decode = req["max_tokens"] / min(parallel, 4)
    return float(prefill + decode + 0.5)


def _random_num_blocks(
    rng: random.Random,
    requests: list[Request],
    scheduler: dict[str, Any],
    block_size: int,
) -> int:
    needs = [request_blocks_needed(r, scheduler["max_model_len"], block_size) for r in requests]
    largest, total = max(needs), sum(needs)
    kind = rng.choices(["tight", "medium", "roomy"], [4, 3, 3])[0]
    # +1 for vLLM's null block, which is never handed out.
    if kind == "tight":
        return largest + 1 + rng.randint(0, 2)
    if kind == "medium":
        return largest + 1 + rng.randint(0, max(1, total // 2))
    return total + 1 + rng.randint(0, 32)


def _all_fit_at_once(
    requests: list[Request], scheduler: dict[str, Any], block_size: int, num_blocks: int
) -> bool:
    """True when every request fits in the KV cache at once, so nothing is preempted."""
    max_model_len = scheduler["max_model_len"]
    need = sum(request_blocks_needed(r, max_model_len, block_size) for r in requests)
    return need <= num_blocks - 1


def _break_priority_ties(requests: list[Request]) -> None:
    """Make every (priority, arrival_time) key unique by nudging arrival_time.

    vLLM's priority policy preempts max(running, key=(priority, arrival_time)), the
    first such request in running order on a tie. Two tied requests that each need
    several steps to re-prefill can then preempt themselves in turn forever (a real
    livelock in vLLM 0.33; seen with scheduler_reserve_full_isl false and a
    long-prefill threshold). With unique keys the best running request always
    progresses, so ties are kept only where the KV cache never forces preemption.
    """
    seen: set[tuple[int, float]] = set()
    for req in requests:
        priority = int(req.get("priority", 0))
        base = arrival_time_of(req)
        time, bump = base, 0
        while (priority, time) in seen:
            bump += 1
            time = round(base + bump / 100, 2)
        seen.add((priority, time))
        if time != base:
            req["arrival_time"] = time


def _random_aborts(rng: random.Random, requests: list[Request]) -> list[dict[str, Any]]:
    if rng.random() >= 0.35:
        return []
    horizon = max(int(r["arrival_step"]) for r in requests) + 40
    by_step: dict[int, list[str]] = {}
    for _ in range(rng.randint(1, 6)):
        req = rng.choice(requests)
        # Never before arrival: aborting an id the scheduler has not seen is undefined.
        step = rng.randint(int(req["arrival_step"]), horizon)
        ids = by_step.setdefault(step, [])
        if req["request_id"] not in ids:
            ids.append(req["request_id"])
    return [{"step": step, "request_ids": ids} for step, ids in sorted(by_step.items())]


# ---------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """Parse '0-199', '5', or '0-9,42,100-109' into a sorted list of seeds."""
    seeds: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            low, high = (int(x) for x in part.split("-", 1))
            seeds.update(range(low, high + 1))
        else:
            seeds.add(int(part))
    return sorted(seeds)


def write_random_scenarios(outdir: Path, seeds: list[int], vllm_version: str = BASE_RELEASE) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = outdir / f"random_{seed}.json"
        path.write_text(format_scenario(random_scenario(seed, vllm_version)))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write random_SEED.json scenarios.")
    parser.add_argument("outdir", type=Path, help="folder to write random_SEED.json into")
    parser.add_argument(
        "--seeds", default=CORPUS_SEEDS, help=f"e.g. 0-199 or 0-9,42 (default {CORPUS_SEEDS})"
    )
    args = parser.parse_args(argv)
    paths = write_random_scenarios(args.outdir, parse_seeds(args.seeds))
    print(f"wrote {len(paths)} scenarios to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
