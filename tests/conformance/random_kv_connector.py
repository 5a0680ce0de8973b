"""Random scripted-KV-connector scenarios, and how a replay is compared with
the oracle's trace of one.

`random_kv_scenario(seed)` builds one scenario deterministically from its seed:
a base scenario chosen by `seed % len(BASES)` (random_scenarios.py's plain
scenario, or random_features.py's scenario with async scheduling, speculative
decoding, the LoRA cap or a mix of them; both give token budgets, chunked
prefill, fcfs/priority, prefix caching on and off, tight KV caches that preempt,
aborts) plus the scripted connector of SCENARIO_FORMAT.md ("KV connectors"):

- the connector: role `kv_both`, `kv_producer` or `kv_consumer`; load-failure
  policy `fail` or `recompute`; `pending_block_frees` sometimes;
- per request (most requests): external hits of one block, two blocks, half or the
  whole prompt, or an off-block count; synchronous or asynchronous loads of 1-3
  batches; request-level (`"request"`, asynchronous loads) or block-level load
  failures under both policies; delayed frees (`send_steps` 1-3); often a list
  with one script per load, so a retried load after a preemption or a failed load
  is scripted differently.

Every combination of BASES with every connector option is one that both the oracle
and kvsched replay (SCENARIO_FORMAT.md lists no exclusion for the scripted
connector; the only refused feature pair, `ngram` with async scheduling, is never
drawn: random_features.py uses `ngram_gpu` there).

vLLM 0.33 orders some frees by iterating a set of request ids (str), whose
order depends on the oracle process's hash seed (PYTHONHASHSEED): the delayed
frees a batch reports together in `finished_sending`, and the requests a step
finishes with an error under the `fail` policy (`finish_requests(set(ids))`).
The order they free their blocks in decides the free queue, so later prefix hits
and evictions; such a trace changes from one oracle run to the next (seen:
seeds 193 and 239 of an earlier draw gave different traces under
PYTHONHASHSEED=0 and 1), so no golden can pin it, and kvsched frees in id
order. The generator therefore gives delayed frees (`send_steps`) to one request
per scenario, and failing loads under `fail` to one request per scenario
(HASH_ORDER_NOTE).

Livelocks: a scalar `load_fail` applies to every retried load, so under the
`recompute` policy a request whose every load fails is retried for ever (vLLM
0.33 does the same). The generator writes such a script only for seeds with
`seed % LIVELOCK_EVERY == LIVELOCK_AT` (a few of the corpus), with a short
`max_steps`; every other failure is a one-entry list (the retry loads cleanly),
so most scenarios finish. A scenario whose oracle run stops at `max_steps` keeps
its partial trace as NAME.vllm.jsonl.stuck and is compared step by step up to
there (kvsched must stop at max_steps too).

Usage:
    python tests/conformance/random_kv_connector.py OUTDIR --seeds 0-299

The checked-in corpus (tests/conformance/kv_connector_random/) is seeds
KV_CORPUS_SEEDS; `regenerate.py --only kv_connector_random` rewrites it. Live runs
(compare_live_kv.py) draw seeds from LIVE_SEEDS_FROM on, disjoint from it.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import random
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_features import MIXES, draft_lookahead, random_feature_scenario  # noqa: E402
from random_scenarios import (  # noqa: E402
    ADMISSION_KNOB_RELEASES,
    Scenario,
    add_cache_aware_admission,
    format_scenario,
    parse_seeds,
    random_scenario,
)
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.errors import CannotServe  # noqa: E402
from kvsched.scenario import load_scenario, replay  # noqa: E402

KV_CORPUS_SEEDS = "0-319"
# Fresh live seeds start here, clear of the corpus.
LIVE_SEEDS_FROM = 100_000
FILE_PREFIX = "kvconn_random_"
TRACE_SUFFIX = ".vllm.jsonl"
STUCK_SUFFIX = ".stuck"
GZ_SUFFIX = ".gz"
# The base scenario, by seed % len(BASES): a plain one or a random_features mix.
BASES = ("plain", *MIXES)
MAX_STEPS = 3000
# Scenarios scripted to livelock stop early: their trace repeats after a while.
LIVELOCK_MAX_STEPS = 250
LIVELOCK_EVERY = 40
LIVELOCK_AT = 17
ROLES = ("kv_both", "kv_producer", "kv_consumer")
POLICIES = ("fail", "recompute")
# vLLM 0.34's --max-num-inflight-kv-loads in 0.34 scenarios: unset (None) or a cap.
INFLIGHT_KV_LOAD_CAPS = (None, 1, 2, 3, 4, 5, 6)


def base_of(seed: int) -> str:
    return BASES[seed % len(BASES)]


def random_kv_scenario(seed: int, vllm_version: str = SHARED_REFERENCE_VERSION) -> Scenario:
    """Build a random scripted-connector scenario; the same seed (and release)
    always gives the same one. A release in ADMISSION_KNOB_RELEASES also gets
    vLLM 0.34's admission knobs (add_admission_knobs), drawn apart so that the
    rest is the base release's scenario."""
    base = base_of(seed)
    if base == "plain":
        scenario: Scenario = random_scenario(seed)
    else:
        # A random_features seed whose mix is `base` (it picks by seed % len(MIXES)).
        scenario = random_feature_scenario(len(MIXES) * seed + MIXES.index(base))
    rng = random.Random(f"random_kv_connector:{seed}")
    block_size = int(scenario["cache"].get("block_size", 16))
    _fit_drafts_alone(scenario, block_size)
    livelock = seed % LIVELOCK_EVERY == LIVELOCK_AT
    policy = rng.choice(POLICIES)
    if livelock:
        policy = "recompute"
    scenario["kv_connector"] = {
        "type": "scripted", "kv_role": rng.choice(ROLES),
        "load_failure_policy": policy,
        "pending_block_frees": rng.random() < 0.3}
    share = rng.choice([0.4, 0.7, 0.9])
    fail_rate = rng.choice([0.0, 0.2, 0.4])
    failing: str | None = None
    for r in scenario["requests"]:
        n = len(r["prompt_token_ids"])
        # A one-token prompt loaded whole is vLLM 0.33's livelock: left out.
        if n >= 2 and rng.random() < share:
            # Under `fail` only one request's loads may fail (see HASH_ORDER_NOTE).
            may_fail = policy == "recompute" or failing in (None, r["request_id"])
            _script_loads(rng, r, n, block_size, fail_rate if may_fail else 0.0)
            if r.get("load_fail") is not None and any(f is not None for f in r["load_fail"]):
                failing = r["request_id"]
        # One request with delayed frees per scenario (see HASH_ORDER_NOTE).
        if rng.random() < 0.3 and not any("send_steps" in q for q in scenario["requests"]):
            r["send_steps"] = rng.randint(1, 3)
    if livelock:
        _script_livelock(rng, scenario["requests"], block_size)
    scenario["max_steps"] = LIVELOCK_MAX_STEPS if livelock else MAX_STEPS
    knobs = ""
    if vllm_version in ADMISSION_KNOB_RELEASES:
        knobs = f", vLLM {vllm_version}'s admission knobs"
        add_admission_knobs(scenario, random.Random(f"random_kv_connector:admission:{seed}"))
    scenario["description"] = (f"Random scripted-KV-connector scenario from seed {seed}: base {base}"
                               f"{', scripted to livelock' if livelock else ''}{knobs} "
                               "(tests/conformance/random_kv_connector.py).")
    return scenario


def add_admission_knobs(scenario: Scenario, rng: random.Random) -> None:
    """vLLM 0.34's in-flight KV load cap (INFLIGHT_KV_LOAD_CAPS: with one, the
    requests scripted with an asynchronous load wait in async_kv_waiting and start
    loading while the batch is full) and cache-aware admission
    (random_scenarios.add_cache_aware_admission, which switches half the scenarios
    to FCFS with prefix caching); the base scenario keeps its priority policy
    otherwise, so the queue merge is exercised under both policies."""
    cap = rng.choice(INFLIGHT_KV_LOAD_CAPS)
    if cap is not None:
        scenario["scheduler"]["max_num_inflight_kv_loads"] = cap
    add_cache_aware_admission(scenario, rng)


def _fit_drafts_alone(scenario: Scenario, block_size: int) -> None:
    """Grow the KV cache so that every request fits alone with its draft
    look-ahead (random_features.draft_lookahead). random_features.py needs that
    only with prefix caching (fit_lookahead), but an external hit, like a prefix
    hit, admits a request with one token to compute, padded to 1 + K: in a
    smaller cache vLLM then livelocks with nothing running. Under async
    scheduling with a producer role a self-preempted request also loses its
    in-flight output every time (requires_kv_delivery) and never advances."""
    lookahead = draft_lookahead(scenario)
    if not lookahead:
        return
    max_model_len = int(scenario["scheduler"].get("max_model_len", 8192))
    longest = max(min(len(r["prompt_token_ids"]) + int(r["max_tokens"]) + lookahead, max_model_len)
                  for r in scenario["requests"])
    cache = scenario["cache"]
    cache["num_gpu_blocks"] = max(int(cache["num_gpu_blocks"]), -(-longest // block_size) + 1)


def _script_loads(rng: random.Random, r: dict[str, Any], n: int, block_size: int,
                  fail_rate: float) -> None:
    """One load script, or a list of 2-3 (one per load: a retry after a preemption
    or a failed load gets the next entry, then the defaults: no hit)."""
    scripts = [_one_load(rng, n, block_size, fail_rate) for _ in range(rng.choice([1, 1, 2, 3]))]
    as_list = len(scripts) > 1 or any(s["load_fail"] is not None for s in scripts)
    for key in ("external_hit_tokens", "load_async", "load_steps", "load_fail"):
        values = [s[key] for s in scripts]
        if as_list:
            r[key] = values
        elif values[0] is not None:
            r[key] = values[0]


def _one_load(rng: random.Random, n: int, block_size: int, fail_rate: float) -> dict[str, Any]:
    load_async = rng.random() < 0.5
    fail: str | int | None = None
    if rng.random() < fail_rate:
        fail = "request" if load_async and rng.random() < 0.4 else rng.randint(0, 2)
    return {"external_hit_tokens": rng.choice([block_size, 2 * block_size, n, n // 2,
                                               3 * block_size + 1]),
            "load_async": load_async, "load_steps": rng.randint(1, 3) if load_async else 1,
            "load_fail": fail}


def _script_livelock(rng: random.Random, requests: list[dict[str, Any]], block_size: int) -> None:
    """A request whose every load fails (a scalar load_fail), under recompute."""
    candidates = [r for r in requests if len(r["prompt_token_ids"]) >= 2]
    if not candidates:
        return
    r = rng.choice(candidates)
    for key in ("external_hit_tokens", "load_async", "load_steps", "load_fail"):
        r.pop(key, None)
    r["external_hit_tokens"] = max(block_size, len(r["prompt_token_ids"]))
    r["load_async"] = rng.random() < 0.5
    r["load_fail"] = "request" if r["load_async"] and rng.random() < 0.5 else 0


# ---------------------------------------------------------------------------
# Files, the comparison, the command line.
# ---------------------------------------------------------------------------


def kv_scenario_path(outdir: Path, seed: int) -> Path:
    return outdir / f"{FILE_PREFIX}{seed}.json"


def write_kv_scenarios(outdir: Path, seeds: list[int],
                       vllm_version: str = SHARED_REFERENCE_VERSION) -> list[Path]:
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for seed in seeds:
        path = kv_scenario_path(outdir, seed)
        path.write_text(format_scenario(random_kv_scenario(seed, vllm_version)))
        paths.append(path)
    return paths


def golden_of(path: Path) -> tuple[Path, bool]:
    """The oracle's trace of a scenario file, plain or gzipped (the committed
    corpus), and whether vLLM stopped at max_steps (NAME.vllm.jsonl.stuck)
    rather than finishing (NAME.vllm.jsonl)."""
    finished = path.with_name(path.stem + TRACE_SUFFIX)
    stuck = finished.with_name(finished.name + STUCK_SUFFIX)
    for golden, is_stuck in ((finished, False), (stuck, True)):
        for candidate in (golden, golden.with_name(golden.name + GZ_SUFFIX)):
            if candidate.exists():
                return candidate, is_stuck
    raise FileNotFoundError(f"no golden trace for {path.name} ({finished.name}[{STUCK_SUFFIX}][{GZ_SUFFIX}])")


def read_trace(golden: Path) -> list[dict[str, Any]]:
    data = golden.read_bytes()
    text = (gzip.decompress(data) if golden.name.endswith(GZ_SUFFIX) else data).decode()
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def gzip_trace(src: Path, dst_dir: Path) -> Path:
    """A trace gzipped into dst_dir, byte-identical for the same content (no
    timestamp or file name in the header)."""
    dst = dst_dir / (src.name + GZ_SUFFIX)
    dst.write_bytes(gzip.compress(src.read_bytes(), compresslevel=9, mtime=0))
    return dst


def compare_with_golden(path: Path, golden: Path | None = None,
                        vllm_version: str = SHARED_REFERENCE_VERSION) -> tuple[bool, str | None]:
    """(stuck, None when kvsched's replay equals the oracle's trace step by step,
    else the first difference). A stuck golden needs kvsched to stop at max_steps too.
    ``golden``: another release's trace (default: the one beside the scenario),
    replayed by kvsched as ``vllm_version``."""
    if golden is None:
        golden, stuck = golden_of(path)
    else:
        stuck = STUCK_SUFFIX in golden.name
    expected = read_trace(golden)
    if not expected:
        return stuck, f"{golden.name}: empty golden trace"
    out = io.StringIO()
    try:
        replay(load_scenario(str(path), vllm_version), out)
        if stuck:
            return stuck, "vLLM stopped at max_steps, kvsched finished"
    except CannotServe as e:
        if not stuck:
            return stuck, f"kvsched stopped: {e}"
    except (ValueError, NotImplementedError, RuntimeError) as e:
        return stuck, f"kvsched did not replay it: {e}"
    actual = [json.loads(x) for x in out.getvalue().splitlines()]
    return stuck, first_difference(expected, actual)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Write {FILE_PREFIX}SEED.json scenarios.")
    parser.add_argument("outdir", type=Path, help=f"folder to write {FILE_PREFIX}SEED.json into")
    parser.add_argument("--seeds", default=KV_CORPUS_SEEDS,
                        help=f"e.g. 0-299 or 0-9,42 (default {KV_CORPUS_SEEDS})")
    args = parser.parse_args(argv)
    paths = write_kv_scenarios(args.outdir, parse_seeds(args.seeds))
    print(f"wrote {len(paths)} scenarios to {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
