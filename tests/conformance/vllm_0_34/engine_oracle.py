"""Scenario traces from vLLM 0.34.0's own engine loop: `EngineCore.step` /
`step_with_batch_queue` / `post_step` called on an EngineCore skeleton whose executor
is oracle.py's scripted model. Two uses:

    VENV=~/.cache/kvsched-reference/venv-0.34
    $VENV/bin/python tests/conformance/vllm_0_34/engine_oracle.py DIR --out OUTDIR
        # pipeline-parallel scenarios (top-level `pipeline_parallel_size`, the pp/
        # corpus): vLLM decides the batch queue depth (max_concurrent_batches: N,
        # N + 1 with async scheduling) and the scheduler's PP path
    $VENV/bin/python tests/conformance/vllm_0_34/engine_oracle.py --check DIR
        # replays DIR/*.json both ways (oracle.py's transcription of the loops and
        # vLLM's own loops) and reports any scenario whose traces differ

Traces go to OUTDIR/NAME.vllm.jsonl in oracle.py's format, with `processed` on every
line of a scenario whose engine keeps a batch queue (async scheduling or PP).
"""

from __future__ import annotations

import argparse
import io
import json
import queue
import sys
from collections import deque
from concurrent.futures import Future
from pathlib import Path

import oracle  # puts tests/conformance on sys.path too
import oracle_connectors as kvc
from scenario_timeline import scenario_timeline
from vllm.v1.engine.core import EngineCore
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT


class DeferredResult(Future):
    """The sampled tokens are produced when the engine collects the batch (they depend
    on the outputs processed before)."""

    def __init__(self, produce):
        super().__init__()
        self.produce = produce

    def result(self, timeout=None):
        if not self.done():
            self.set_result(self.produce())
        return super().result(timeout)


class ScriptedExecutor:
    """The executor calls EngineCore makes (execute_model, sample_tokens,
    take_draft_token_ids), answered by oracle.ScriptedModel."""

    def __init__(self, sched, model: oracle.ScriptedModel):
        self.sched, self.model = sched, model
        self.unsampled = None
        self.last = None
        self.executed: list = []  # scheduler outputs in execution order
        self.admitted: dict[int, tuple] = {}  # id(so) -> oracle.admissions() at schedule time

    def execute_model(self, so, non_block=False):
        self.executed.append(so)
        self.admitted[id(so)] = oracle.admissions(self.sched, so)
        batch = self.model.execute(self.sched, so)
        if so.total_num_scheduled_tokens == 0:
            result = EMPTY_MODEL_RUNNER_OUTPUT if batch.kv_output is None else self.model.output(batch)
        else:
            self.unsampled = (so, batch)
            result = None
        if not non_block:
            return result
        f = Future()
        f.set_result(result)
        return f

    def sample_tokens(self, grammar_output, non_block=False):
        so, batch = self.unsampled
        self.unsampled = None
        self.last = (so, batch)
        f = DeferredResult(lambda: self.model.output(batch))
        return f if non_block else f.result()

    def take_draft_token_ids(self):
        so, batch = self.last
        return self.model.drafts(batch, so.num_spec_tokens_to_schedule)


def engine_skeleton(sched, executor) -> EngineCore:
    """The EngineCore attributes that step(), step_with_batch_queue() and post_step() read."""
    engine = object.__new__(EngineCore)
    config = sched.vllm_config
    engine.vllm_config = config
    engine.scheduler = sched
    engine.model_executor = executor
    engine.log_stats = False
    engine._weight_version = "default"
    engine.is_mm_encoder_only = False
    engine.is_pooling_model = False
    engine.use_spec_decode = config.speculative_config is not None
    engine.check_for_draft_tokens = engine.use_spec_decode
    engine.async_scheduling = config.scheduler_config.async_scheduling
    engine.batch_queue_size = config.max_concurrent_batches
    engine.batch_queue = deque(maxlen=engine.batch_queue_size) if engine.batch_queue_size > 1 else None
    engine.step_fn = engine.step if engine.batch_queue is None else engine.step_with_batch_queue
    engine.aborts_queue = queue.Queue()
    return engine


def engine_replay(scenario: dict, out) -> dict:
    pp = int(scenario.get("pipeline_parallel_size", 1))
    use_async = bool(scenario.get("async_scheduling", False))
    use_spec = scenario.get("speculative") is not None
    kv_type = (scenario.get("kv_connector") or {}).get("type")
    sched = oracle.make_scheduler(scenario, pipeline_parallel_size=pp)
    depth = sched.vllm_config.max_concurrent_batches
    assert depth == (pp + 1 if use_async else pp) or (pp == 1 and depth == (2 if use_async else 1)), depth
    hasher = oracle.block_hasher(scenario)
    specs, arrivals, aborts, last_event, max_steps = scenario_timeline(scenario)

    model = oracle.ScriptedModel(specs, kvc.make_kv_worker(scenario))
    executor = ScriptedExecutor(sched, model)
    observer = kvc.KVObserver(sched, kv_type) if kv_type else None
    processed: list[tuple] = []
    inner_update = sched.update_from_output

    def update_from_output(so, mro):
        processed.append((so, mro))
        return inner_update(so, mro)

    sched.update_from_output = update_from_output
    engine = engine_skeleton(sched, executor)
    assert engine.async_scheduling == use_async

    def busy() -> bool:
        return sched.has_requests() if kv_type else sched.has_unfinished_requests()

    scheduled_in: dict[int, int] = {}
    step = 0
    while step <= last_event or busy() or engine.batch_queue:
        if step >= max_steps:
            raise RuntimeError(f"scenario did not finish within {max_steps} steps")
        if observer is not None:
            observer.begin_step()
        for r in arrivals.get(step, ()):
            engine.add_request(oracle.make_request(r, hasher, scenario))
        finished: list[list[str]] = []
        ids = oracle.abortable(sched, aborts.get(step, []))
        if ids:
            engine.abort_requests(ids)
            finished += [[rid, "abort"] for rid in ids]
        n_exec, n_proc = len(executor.executed), len(processed)
        outputs, executed = engine.step_fn()
        engine.post_step(executed)
        finished += oracle.finishes(outputs or {})
        new = executor.executed[n_exec:]
        assert len(new) <= 1
        so = new[0] if new else None
        if so is not None:
            scheduled_in[id(so)] = step
        done = processed[n_proc:]
        assert len(done) <= 1
        processed_step = scheduled_in.get(id(done[0][0])) if done else None
        mro = done[0][1] if done else None
        kv_fields = observer.record(so, mro) if observer is not None else None
        admitted = executor.admitted.get(id(so)) if so is not None else None
        line = oracle.step_line(
            step,
            so,
            admitted,
            finished,
            sched,
            use_spec,
            engine.batch_queue is not None,
            processed_step,
            kv_fields,
        )
        out.write(json.dumps(line, separators=(",", ":")) + "\n")
        step += 1
    return {"engine": f"vllm-{oracle.VLLM_VERSION} EngineCore", "steps": step}


def main(argv: list[str] | None = None) -> int:
    oracle.check_version()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--out", type=Path, help="where NAME.vllm.jsonl go")
    ap.add_argument("--check", action="store_true", help="compare with oracle.py instead of writing traces")
    args = ap.parse_args(argv)
    paths = sorted(args.folder.glob("*.json")) if args.folder.is_dir() else [args.folder]
    if args.check:
        bad = 0
        for path in paths:
            scenario = json.loads(path.read_text())
            a, b = io.StringIO(), io.StringIO()
            for run, out in ((oracle.replay, a), (engine_replay, b)):
                try:
                    run(scenario, out)
                except RuntimeError as exc:  # max_steps: compare the partial traces
                    if "did not finish" not in str(exc):
                        raise
            if a.getvalue() != b.getvalue():
                bad += 1
                x, y = a.getvalue().splitlines(), b.getvalue().splitlines()
                i = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                print(
                    f"{path.name}: DIFFERENT at line {i}\n  oracle: {x[i] if i < len(x) else '<end>'}"
                    f"\n  engine: {y[i] if i < len(y) else '<end>'}",
                    flush=True,
                )
        print(f"{len(paths) - bad}/{len(paths)} identical", flush=True)
        return 1 if bad else 0
    if args.out is None:
        ap.error("--out is needed")
    args.out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        scenario = json.loads(path.read_text())
        with open(args.out / (path.stem + oracle.TRACE_SUFFIX), "w") as out:
            summary = engine_replay(scenario, out)
        print(json.dumps({**summary, "scenario": path.name}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
