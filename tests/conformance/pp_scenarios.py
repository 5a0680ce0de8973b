"""The pipeline-parallel scenarios of the pp/ corpus and the live PP comparer.

Pure Python (no vLLM), so that kvsched's side can write them for the 0.34 oracle
(vllm_0_34/engine_oracle.py) and the 0.33 oracle (pp_oracle.py, run in the
reference environment) can write the same ones. A seed always gives the same
scenario, whichever process draws it.
"""

from __future__ import annotations

import random
from typing import Any

from random_features import random_feature_scenario
from random_scenarios import random_scenario

PP_SIZES = (2, 4)
FILE_PREFIX = "pp_"
FEATURE_PREFIX = "ppf_"
# random_features.py's mixes without speculative decoding (seed % 7: async,
# lora, lora_async), which kvsched does not run with PP.
FEATURE_OFFSETS = (0, 3, 4)


def parse_pp_sizes(text: str) -> tuple[int, ...]:
    """'2,4' as (2, 4): the pipeline sizes a seed draws from (each in [2, 16])."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"pp sizes {text!r}: give comma-separated integers, e.g. 2,4") from None
    bad = [n for n in sizes if not 2 <= n <= 16]
    if bad:
        raise ValueError(f"pp sizes {text!r}: {bad[0]} is not a pipeline size in [2, 16]")
    return sizes


def pp_scenario(seed: int, pp_sizes: tuple[int, ...] = PP_SIZES) -> dict[str, Any]:
    """random_scenario(seed) with a pipeline of one of ``pp_sizes`` stages (2 or 4 by
    default), async scheduling on or off (both drawn from the seed; the scenario's own
    draws are unchanged)."""
    scenario = random_scenario(seed)
    rng = random.Random(f"pp-{seed}")
    scenario["pipeline_parallel_size"] = rng.choice(pp_sizes)
    scenario["async_scheduling"] = rng.random() < 0.5
    scenario["name"] = f"{FILE_PREFIX}{seed}"
    return scenario


def pp_feature_scenario(seed: int, pp_sizes: tuple[int, ...] = PP_SIZES) -> dict[str, Any]:
    """A random_features.py scenario without drafts (async scheduling, the LoRA cap,
    or both; tight caches, prefix hits, aborts while batches are in flight) with a
    pipeline of one of ``pp_sizes`` stages. Seed s takes feature seed
    7 (s // 3) + (0, 3, 4)[s % 3]."""
    scenario = random_feature_scenario(7 * (seed // 3) + FEATURE_OFFSETS[seed % 3])
    if "speculative" in scenario:
        raise AssertionError(f"feature seed of PP seed {seed} drew speculative decoding")
    scenario["pipeline_parallel_size"] = random.Random(f"ppf-{seed}").choice(pp_sizes)
    scenario["name"] = f"{FEATURE_PREFIX}{seed}"
    return scenario
