"""KV capacity per vLLM release: docs/catalogs.md's "40 model ids" table.

Each of the 40 model ids of issues 23 and 37 (``tests/sim/test_model_ids.py``:
MODEL_IDS, the same GPU, TP size, ``max_model_len`` 4096 and 4 random
requests of 256 in / 8 out) runs through the run spec as vLLM 0.33 and as
vLLM 0.34, each at its own defaults (0.33: 16-token blocks, 0.92 of the
device from the profiling estimate; 0.34: 64-token blocks, the extensible KV
cache sized after warmup, ``kvsched.perf.memory``). One markdown row per id:
its outcome, and per release the KV blocks (vLLM's ``num_gpu_blocks``) and
the "KV cache size" in tokens vLLM logs for them (``Deployment.kv_cache_size``:
the blocks over one 4096-token request's blocks, every KV cache group
counted, times 4096). Offline, as the test: the catalog, aiconfigurator-
core's bundled configs, and a local Hugging Face cache holding
tests/perf/data/hf_configs.

    PYTHONPATH=. python benchmarks/kv_capacity_versions.py
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import cast

from kvsched.sim.run import run
from kvsched.sim.spec import RunSpec, WorkloadSpec
from kvsched.vllm_versions import VLLM_VERSIONS

# The list the test keeps (tests/ is no package: loaded from its file).
_TEST = Path(__file__).resolve().parents[1] / "tests" / "sim" / "test_model_ids.py"
_found = importlib.util.spec_from_file_location("test_model_ids", _TEST)
assert _found is not None and _found.loader is not None
_module = importlib.util.module_from_spec(_found)
_found.loader.exec_module(_module)
CONFIGS = cast(Path, _module.CONFIGS)
MODEL_IDS = cast(dict[str, tuple[str, str, int, str | None]], _module.MODEL_IDS)


def hub_cache(where: Path) -> None:
    """A Hugging Face hub cache of tests/perf/data/hf_configs, offline (as the test's fixture)."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    for path in sorted(CONFIGS.glob("*.json")):
        repo = where / f"models--{path.stem}"
        (repo / "snapshots" / rev).mkdir(parents=True)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
        shutil.copy(path, repo / "snapshots" / rev / "config.json")
    os.environ["HF_HUB_CACHE"] = str(where)
    os.environ["HF_HUB_OFFLINE"] = "1"


def _spec(model_id: str, hardware: str, tp: int, version: str) -> RunSpec:
    """The test's run of ``model_id``, as vLLM ``version`` at its defaults."""
    return RunSpec(workload=WorkloadSpec(num_prompts=4, random_input_len=256, random_output_len=8,
                                         seed=0)).with_engine(
        vllm_version=version, model=model_id, hardware=hardware, tensor_parallel_size=tp, max_model_len=4096)


def row(number: int, model_id: str) -> str:
    source, hardware, tp, refusal = MODEL_IDS[model_id]
    cells = [str(number), f"`{model_id}`", source, f"{hardware} x{tp}"]
    outcome = ""
    if refusal is not None:
        try:
            run(_spec(model_id, hardware, tp, VLLM_VERSIONS[0]))
        except ValueError as err:
            # The reason alone: after the model's name, before what kvsched does about it.
            outcome = "refused: " + str(err).split("is not supported: ", 1)[-1].split(";", 1)[0]
        return "| " + " | ".join([*cells, outcome or "not refused", *("-" for _ in VLLM_VERSIONS)]) + " |"
    for version in VLLM_VERSIONS:
        result = run(_spec(model_id, hardware, tp, version))
        d = result.prepared.deployment
        blocks, size = d.cache_config.num_gpu_blocks, d.cache_config.block_size
        if not outcome:
            m = d.model
            slide = (f", {m.num_sliding_layers}/{m.num_layers} layers slide ({m.sliding_window})"
                     if m.num_sliding_layers else "")
            outcome = f"{m.num_params() / 1e9:.2f} B params{slide}; {result.metrics['completed']}/4 done"
            cells.append(outcome)
        cells.append(f"{blocks:,} x {size} ({d.kv_cache_size()[0]:,} tokens)")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hub_cache(Path(tmp) / "hub")
        print("| # | model id | config from | GPU x TP | outcome | "
              + " | ".join(f"vLLM {v}: KV blocks x block size (KV cache size)" for v in VLLM_VERSIONS) + " |")
        print("|---|---|---|---|---|" + "---|" * len(VLLM_VERSIONS))
        for number, model_id in enumerate(MODEL_IDS, 1):
            print(row(number, model_id), flush=True)


if __name__ == "__main__":
    main()
