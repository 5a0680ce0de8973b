"""kvsched's step traces with pipeline parallelism against vLLM 0.33.0's engine loop.

pp/ holds random scenarios (random_scenarios.py seeds PP_CORPUS_SEEDS, pp_*) with a
pipeline of 2 or 4 stages, synchronous or async, and random_features.py scenarios
without drafts (PP_FEATURE_CORPUS_SEEDS, ppf_*: async scheduling, the LoRA cap, tight
caches, aborts while batches are in flight), and their golden traces from
vLLM's own ``EngineCore.step_with_batch_queue`` on a scheduler built with
``ParallelConfig(pipeline_parallel_size=N)`` (pp_oracle.py, run in the
reference environment). Every field of every step must be identical.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
from reference_release import SHARED_REFERENCE_VERSION  # noqa: E402

from kvsched.core.trace import first_difference  # noqa: E402
from kvsched.scenario import load_scenario, parse_scenario, replay  # noqa: E402

SCENARIOS = sorted((HERE / "pp").glob("*.json"))


def test_corpus_covers_both_depths_both_loops_and_the_lora_cap() -> None:
    scenarios = [json.loads(p.read_text()) for p in SCENARIOS]
    kinds = {(s["pipeline_parallel_size"], s.get("async_scheduling", False), "max_loras" in s)
             for s in scenarios}
    assert {(pp, a) for pp, a, _ in kinds} == {(2, False), (2, True), (4, False), (4, True)}
    assert {(pp, lora) for pp, _, lora in kinds} >= {(2, True), (4, True)}
    assert len([p for p in SCENARIOS if p.name.startswith("pp_")]) == 40
    assert len([p for p in SCENARIOS if p.name.startswith("ppf_")]) == 20


def test_corpus_preempts_with_batches_in_flight() -> None:
    # The stale-output path (a request preempted while a batch of its is in
    # the pipeline) is exercised, not only plain decode.
    preempting = [p for p in SCENARIOS if '"preempted":["' in p.with_name(p.stem + ".vllm.jsonl").read_text()]
    assert len(preempting) >= 10


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_trace_matches_vllm(path: Path) -> None:
    golden = path.with_name(path.stem + ".vllm.jsonl")
    expected = [json.loads(line) for line in golden.read_text().splitlines() if line.strip()]
    out = io.StringIO()
    # pp_oracle.py ran the shared reference's release: replay as that one.
    replay(load_scenario(str(path), SHARED_REFERENCE_VERSION), out)
    actual = [json.loads(line) for line in out.getvalue().splitlines()]
    diff = first_difference(expected, actual)
    assert diff is None, diff


def _scenario(**extra: object) -> dict[str, object]:
    return {"scheduler": {"max_num_seqs": 2, "max_num_batched_tokens": 16, "max_model_len": 64},
            "cache": {"num_gpu_blocks": 16, "block_size": 4},
            "requests": [{"request_id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 2}], **extra}


@pytest.mark.parametrize("extra, match", [
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
    ({"pipeline_parallel_size": 17}, "pipeline_parallel_size"),
    ({"pipeline_parallel_size": 2, "speculative": {"num_speculative_tokens": 2}}, "pipeline_parallel_size"),
])
def test_the_replay_refuses_what_it_cannot_run(extra: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_scenario(_scenario(**extra))


def test_every_pp_trace_line_says_which_batch_it_processed() -> None:
    out = io.StringIO()
    replay(parse_scenario(_scenario(pipeline_parallel_size=2)), out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    # Sync PP 2: the prompt at step 0, nothing at step 1 (its output is in
    # the pipeline), which fills the queue: step 1 processes step 0's batch.
    assert [line["processed"] for line in lines[:2]] == [None, 0]
    assert lines[0]["scheduled"] == [["a", 3]] and lines[1]["scheduled"] == []
