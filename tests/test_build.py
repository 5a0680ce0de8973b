"""The compiled hot path (setup.py, ``KVSCHED_COMPILE=1``) against the
interpreted sources.

CI runs the suite on the interpreted sources, then builds the compiled
package apart and runs this file, the conformance goldens and the
fast-forward fuzzers on it with ``KVSCHED_EXPECT_BUILD=compiled``
(``.ci/run``). Here the simulations below run in this process (whichever
build imported) and in a fresh interpreter on the repository's sources, and
must agree to the last bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsched.version import build

REPO = Path(__file__).resolve().parents[1]

# Each case: (workload, engine options) through the one runner. They cover
# both engine loops, fast-forward through arrivals and finishes, prefix
# caching hits and preemption under a small KV cache, and a hybrid KV cache
# (gpt-oss: full attention beside a sliding window) whose stretches replay
# its windows' frees.
CASES: dict[str, tuple[tuple[int, float, int], dict[str, object]]] = {
    # (num_prompts, request_rate, random_prefix_len), engine options
    "random-async": ((600, 20.0, 0), {}),
    "random-sync": ((600, 20.0, 0), {"async_scheduling": False}),
    "burst-preempting": ((300, float("inf"), 0), {"num_gpu_blocks_override": 900, "max_model_len": 4096}),
    "prefix-hits": ((400, 30.0, 512), {"max_num_seqs": 32}),
    "hybrid-preempting": ((300, float("inf"), 0), {"model": "openai/gpt-oss-20b",
                                                   "num_gpu_blocks_override": 900, "max_model_len": 4096}),
}

_RUN = """
import json, sys
from kvsched.sim.deployment import EngineOptions
from kvsched.sim.run import run
from kvsched.sim.spec import DeploymentSpec, InstanceGroup, RunSpec, WorkloadSpec
from kvsched.version import build
(n, rate, prefix), opts = json.loads(sys.argv[1])
engine = {"model": "Llama-3.1-8B", "hardware": "h100-sxm", "step_time_backend": "roofline"} | opts
spec = RunSpec(DeploymentSpec((InstanceGroup(EngineOptions(**engine)),)),
    workload=WorkloadSpec(num_prompts=n, request_rate=rate, random_prefix_len=prefix, seed=0))
metrics = dict(run(spec).metrics)
metrics.pop("simulation_wall_seconds")
print(json.dumps({"build": build(), "metrics": metrics}, sort_keys=True))
"""


def _simulate(case: tuple[int, float, int], opts: dict[str, object], env: dict[str, str],
              cwd: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-c", _RUN, json.dumps([case, opts])], env=env, cwd=cwd,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.splitlines()[-1])
    return result


def test_build_is_the_one_asked_for() -> None:
    # The interpreted sources unless CI says it runs the compiled build:
    # a stray compiled module beside the sources would make every other
    # test check the wrong thing.
    assert build() == os.environ.get("KVSCHED_EXPECT_BUILD", "interpreted")


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_metrics_as_the_interpreted_sources(name: str, tmp_path: Path) -> None:
    case, opts = CASES[name]
    env = dict(os.environ)
    # This process's build: the first kvsched on its path (the compiled
    # package in CI's second pass).
    here = Path(sys.modules["kvsched"].__file__ or "").resolve().parents[1]
    env["PYTHONPATH"] = str(here)
    mine = _simulate(case, opts, env, tmp_path)
    assert mine["build"] == build()
    env["PYTHONPATH"] = str(REPO)
    sources = _simulate(case, opts, env, tmp_path)
    assert sources["build"] == "interpreted"
    assert mine["metrics"] == sources["metrics"]
    metrics = mine["metrics"]
    assert isinstance(metrics, dict)
    # Each case exercises what it is named for.
    assert metrics["completed"] == case[0]
    assert metrics["fast_forwarded_steps"] > 0
    if name in ("burst-preempting", "hybrid-preempting"):
        assert metrics["num_preemptions"] > 0
    if name == "prefix-hits":
        assert metrics["prefix_cache_hit_rate"] > 0.3
