"""Fresh random scripted-KV-connector scenarios through vLLM's oracle and
kvsched, compared live.

    python tests/conformance/compare_live_kv.py --seeds 0-99

Each scenario is random_scenarios.py's scenario for the seed plus a scripted
connector (random role, load-failure policy, pending block frees), async
scheduling one time in three, and per-request scripts (external hits of a
block, two blocks, the whole or half the prompt; synchronous or asynchronous
loads of 1-3 batches; request- or block-level failures; delayed frees of 1-3
batches). Some never finish in vLLM: a scalar ``load_fail`` applies to every
retried load, so a request whose every load fails for good loops (and so do
vLLM 0.33's own livelocks, SCENARIO_FORMAT.md); those are compared up to
``max_steps`` (both must stop there). Needs the reference environment
(``bash ../shared/reference/setup.sh``); prints the counts, exits 1 on any
difference.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from random_scenarios import parse_seeds, random_scenario  # noqa: E402
from regenerate import ReferenceMissing, reference_paths  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.errors import CannotServe  # noqa: E402
from kvsched.replay import load_scenario, replay  # noqa: E402

MAX_STEPS = 3000
# Run in the reference environment: every scenario of a folder through the
# oracle in one process (vLLM takes ~20 s to start); a scenario that hits
# max_steps keeps its partial trace as NAME.vllm.jsonl.stuck.
_ORACLE_LOOP = """
import glob, json, os, sys
sys.path.insert(0, sys.argv[1])
import vllm_replay
for path in sorted(glob.glob(sys.argv[2] + "/*.json")):
    out = path[:-5] + ".vllm.jsonl"
    try:
        with open(out, "w") as f:
            vllm_replay.replay(json.load(open(path)), f)
    except RuntimeError as e:
        if "did not finish" not in str(e):
            raise
        os.rename(out, out + ".stuck")
"""


def random_kv_scenario(seed: int) -> dict[str, Any]:
    scenario: dict[str, Any] = random_scenario(seed)
    rng = random.Random(seed * 7919 + 1)
    block_size = int(scenario["cache"].get("block_size", 16))
    policy = rng.choice(["fail", "recompute"])
    scenario["kv_connector"] = {
        "type": "scripted", "kv_role": rng.choice(["kv_both", "kv_producer", "kv_consumer"]),
        "load_failure_policy": policy, "pending_block_frees": rng.random() < 0.3}
    if rng.random() < 0.35:
        scenario["async_scheduling"] = True
    for r in scenario["requests"]:
        n = len(r["prompt_token_ids"])
        # A one-token prompt loaded whole is vLLM 0.33's livelock: left out.
        if n < 2 or rng.random() < 0.3:
            continue
        r["external_hit_tokens"] = rng.choice([block_size, 2 * block_size, n, n // 2,
                                               3 * block_size + 1])
        r["load_async"] = rng.random() < 0.5
        if r["load_async"]:
            r["load_steps"] = rng.randint(1, 3)
        x = rng.random()
        if x < 0.15 and r["load_async"] and policy == "fail":
            r["load_fail"] = "request"
        elif x < 0.3:
            r["load_fail"] = rng.randint(0, 2)
        if rng.random() < 0.3:
            r["send_steps"] = rng.randint(1, 3)
    scenario["max_steps"] = MAX_STEPS
    scenario.pop("description", None)
    return scenario


def compare(path: Path) -> tuple[str, str | None]:
    """("finished" | "stuck", None when identical else the first difference)."""
    golden = path.with_name(path.stem + ".vllm.jsonl")
    stuck = not golden.exists()
    if stuck:
        golden = golden.with_name(golden.name + ".stuck")
    expected = [json.loads(x) for x in golden.read_text().splitlines() if x.strip()]
    out = io.StringIO()
    try:
        replay(load_scenario(str(path)), out)
        if stuck:
            return "stuck", "vLLM stopped at max_steps, kvsched finished"
    except CannotServe as e:
        if not stuck:
            return "finished", f"kvsched stopped: {e}"
    except (ValueError, NotImplementedError, RuntimeError) as e:
        return ("stuck" if stuck else "finished"), f"kvsched did not replay it: {e}"
    actual = [json.loads(x) for x in out.getvalue().splitlines()]
    return ("stuck" if stuck else "finished"), first_difference(expected, actual)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--seeds", default="0-99", help="seed range, e.g. 0-99 (default)")
    args = ap.parse_args(argv)
    try:
        python, oracle = reference_paths()
    except ReferenceMissing as e:
        print(e, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for seed in parse_seeds(args.seeds):
            path = Path(tmp) / f"kvconn_random_{seed}.json"
            path.write_text(json.dumps(random_kv_scenario(seed)))
            paths.append(path)
        proc = subprocess.run([str(python), "-c", _ORACLE_LOOP, str(oracle.parent), tmp],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode:
            sys.stderr.write(proc.stderr[-4000:])
            return 2
        counts = {"finished": 0, "stuck": 0}
        failures = 0
        for path in paths:
            kind, diff = compare(path)
            if diff is None:
                counts[kind] += 1
            else:
                failures += 1
                print(f"{path.name}: {diff}")
    print(f"{counts['finished']} identical, {counts['stuck']} identical up to max_steps={MAX_STEPS} "
          f"(vLLM never finishes them), {failures} different")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
