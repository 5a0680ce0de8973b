"""Scheduler speed: microseconds per running request per step, kvsched vs vLLM.

Builds a decode-heavy scenario (N requests admitted at once, then decoding for
a fixed number of steps), replays it through kvsched in this process and, when
the reference environment exists, through vLLM 0.33.0's real scheduler in the
same run; checks the two traces are identical and prints the ratio.

    python benchmarks/bench_scheduler.py                 # N = 256 and 1024
    python benchmarks/bench_scheduler.py --num-requests 256 --steps 200 --no-vllm
    python benchmarks/bench_scheduler.py --features async spec spec-async

``--features`` runs the same scenario with vLLM's async scheduling and/or
speculative decoding (K = 3 n-gram drafts, each verification accepting a
seeded random 0-3 of them), through both schedulers.

Only time inside schedule() and update_from_output() counts, on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvsched.core.trace import first_difference
from kvsched.scenario import parse_scenario, replay

REPO = Path(__file__).resolve().parent.parent
REFERENCE_DIR = Path(os.environ.get("KVSCHED_REFERENCE_DIR", REPO.parent / "shared" / "reference"))
REFERENCE_PYTHON = Path(os.environ.get(
    "KVSCHED_REFERENCE_PYTHON", Path.home() / ".cache/kvsched-reference/venv/bin/python"))


FEATURES = ("none", "async", "spec", "spec-async")
NUM_SPEC_TOKENS = 3


def decode_scenario(num_requests: int, steps: int, prompt_len: int, prefix_caching: bool,
                    seed: int = 0, features: str = "none") -> dict[str, Any]:
    rng = random.Random(seed)
    block_size = 16
    per_request = -(-(prompt_len + steps + 1) // block_size)
    requests = [
        {"request_id": f"r{i}", "prompt_token_ids": [rng.randrange(1, 30000) for _ in range(prompt_len)],
         "max_tokens": steps, "ignore_eos": True}
        for i in range(num_requests)
    ]
    scenario: dict[str, Any] = {
        "scheduler": {"max_num_seqs": num_requests,
                      "max_num_batched_tokens": max(num_requests * prompt_len, 2048),
                      "max_model_len": 4096},
        "cache": {"block_size": block_size, "num_gpu_blocks": num_requests * per_request + 1,
                  "enable_prefix_caching": prefix_caching},
        "requests": requests,
    }
    if features in ("async", "spec-async"):
        scenario["async_scheduling"] = True
    if features in ("spec", "spec-async"):
        scenario["speculative"] = {"num_speculative_tokens": NUM_SPEC_TOKENS}
        # Drafts occupy KV slots: room for K more per request.
        scenario["cache"]["num_gpu_blocks"] = num_requests * (per_request + 1) + 1
        for r in requests:
            r["accepted_drafts"] = [rng.randrange(NUM_SPEC_TOKENS + 1) for _ in range(steps)]
    return scenario


def request_steps(trace: list[dict[str, Any]]) -> int:
    return sum(len(rec["scheduled"]) for rec in trace)


def run_kvsched(scenario: dict[str, Any], repeats: int) -> tuple[float, list[dict[str, Any]]]:
    best = float("inf")
    trace: list[dict[str, Any]] = []
    for _ in range(repeats):
        records: list[dict[str, Any]] = []

        def keep(step: int, output: object, record: dict[str, Any], sched: object,
                 records: list[dict[str, Any]] = records) -> None:
            records.append(record)

        result = replay(parse_scenario(scenario), on_step=keep)
        best = min(best, result.scheduler_seconds)
        trace = records
    return best, trace


def run_vllm(scenario: dict[str, Any], repeats: int) -> tuple[float, list[dict[str, Any]]] | None:
    if not REFERENCE_PYTHON.exists():
        return None
    best = float("inf")
    trace: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            # One oracle process per repeat: its folder mode shares the import cost.
            path = Path(tmp) / f"bench{r}.json"
            path.write_text(json.dumps(scenario))
        out = subprocess.run([str(REFERENCE_PYTHON), str(REFERENCE_DIR / "vllm_replay.py"), tmp],
                             capture_output=True, text=True, check=True)
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                best = min(best, json.loads(line)["scheduler_seconds"])
        trace = [json.loads(x) for x in (Path(tmp) / "bench0.vllm.jsonl").read_text().splitlines()]
    return best, trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, nargs="*", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=200, help="decode steps per request")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    ap.add_argument("--prefix-caching", choices=["on", "off", "both"], default="both")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM reference")
    ap.add_argument("--features", nargs="*", choices=FEATURES, default=["none"],
                    help="async scheduling and/or speculative decoding (default: none)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    modes = {"on": [True], "off": [False], "both": [True, False]}[args.prefix_caching]
    rows = []
    for features in args.features:
        for n in args.num_requests:
            for caching in modes:
                rows.append(measure(args, features, n, caching))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r.get("identical_traces", True) for r in rows) else 1


def measure(args: argparse.Namespace, features: str, n: int, caching: bool) -> dict[str, Any]:
    scenario = decode_scenario(n, args.steps, args.prompt_len, caching, features=features)
    ks_seconds, ks_trace = run_kvsched(scenario, args.repeats)
    work = request_steps(ks_trace)
    row: dict[str, Any] = {"num_requests": n, "prefix_caching": caching, "features": features,
                           "request_steps": work, "kvsched_us": 1e6 * ks_seconds / work}
    ref = None if args.no_vllm else run_vllm(scenario, args.repeats)
    if ref is not None:
        v_seconds, v_trace = ref
        row["vllm_us"] = 1e6 * v_seconds / work
        row["speedup"] = v_seconds / ks_seconds
        diff = first_difference(v_trace, ks_trace)
        row["identical_traces"] = diff is None
        if diff:
            print(f"TRACE MISMATCH (n={n}, caching={caching}): {diff}", file=sys.stderr)
    vllm = (f"vLLM {row['vllm_us']:6.2f} us  speedup {row['speedup']:5.2f}x  "
            f"identical={row['identical_traces']}") if "vllm_us" in row else "vLLM not run"
    print(f"{features:10s} N={n:5d} prefix_caching={'on ' if caching else 'off'}  "
          f"kvsched {row['kvsched_us']:6.2f} us/request-step  {vllm}", flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
