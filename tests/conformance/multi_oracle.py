"""vLLM's real MultiConnector through the reference oracle (run in the oracle's
environment, never imported by kvsched's tests).

    REF/bin/python tests/conformance/multi_oracle.py ../shared/reference FOLDER

replays every FOLDER/NAME.json whose ``kv_connector`` is
``{"type": "multi", "kv_role": R, "load_failure_policy": P, "connectors":
[CHILD, ...]}`` (each CHILD an oracle ``nixl`` or ``offloading`` connector
object, SCENARIO_FORMAT.md) through vLLM 0.33.0's scheduler and writes
NAME.vllm.jsonl (NAME.vllm.jsonl.stuck when it stops at ``max_steps``,
NAME.vllm.crash when vLLM fails an assertion), as compare_live_kv.py's
oracle loop does for the oracle's own connector types.

The oracle (``vllm_replay.py`` and ``replay_connectors.py``) is imported and
reused, not copied: its ``replay`` loop, fake model, request building and
trace lines run unchanged. It has no MultiConnector key, so three of
``replay_connectors``' entry points are wrapped for the run
(:func:`multi_support`), each falling through to the oracle's own for any
other scenario:

- ``kv_transfer_config``: each child's KVTransferConfig is the one the oracle
  builds for that child alone; vLLM's MultiConnector gets them as
  ``kv_connector_extra_config.connectors`` (vLLM's JSON shape), so vLLM's
  factory builds the real MultiConnector with the real NixlConnector and
  OffloadingConnector inside;
- ``make_kv_worker``: the oracle's fake worker of each child sees that
  child's metadata of every batch (vLLM's worker-side MultiConnector hands
  each child its own, ``bind_connector_metadata``); their reports are
  combined as vLLM's worker-side MultiConnector combines them
  (``get_transfer_results``: unions, a request held by several children sent
  once all of them sent it; ``build_connector_worker_meta``: one worker
  metadata per child);
- ``KVObserver``: the oracle's observer, plus the ``offload`` trace key of the
  offloading child (the same fields the oracle writes for ``offloading``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
import traceback
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

CHILD_TYPES = ("nixl", "offloading")


def _child_scenario(scenario: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """The scenario as if ``child`` were its only connector (the oracle's
    own view), with the MultiConnector's load-failure policy."""
    kvc = {**child, "load_failure_policy": scenario["kv_connector"].get("load_failure_policy", "fail")}
    return {**scenario, "kv_connector": kvc}


@contextlib.contextmanager
def multi_support(rc: ModuleType) -> Iterator[None]:
    """``rc`` (replay_connectors) with MultiConnector scenarios supported, for
    the duration of the block (see the module)."""
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
        MultiKVConnectorMetadata,
        MultiKVConnectorWorkerMetadata,
    )
    from vllm.v1.outputs import KVConnectorOutput

    own_config, own_worker, own_observer = rc.kv_transfer_config, rc.make_kv_worker, rc.KVObserver

    def is_multi(scenario: dict[str, Any]) -> bool:
        return (scenario.get("kv_connector") or {}).get("type") == "multi"

    def kv_transfer_config(scenario: dict[str, Any]) -> Any:
        if not is_multi(scenario):
            return own_config(scenario)
        kvc = scenario["kv_connector"]
        unknown = set(kvc) - {"type", "kv_role", "load_failure_policy", "connectors"}
        if unknown:
            raise ValueError(f"kv_connector: unknown keys {sorted(unknown)}")
        children = []
        for child in kvc["connectors"]:
            if child.get("type") not in CHILD_TYPES:
                raise ValueError(f"kv_connector.connectors: type {child.get('type')!r}: one of {CHILD_TYPES}")
            ktc = own_config(_child_scenario(scenario, child))
            children.append({"kv_connector": ktc.kv_connector, "kv_role": ktc.kv_role,
                             "kv_connector_extra_config": ktc.kv_connector_extra_config,
                             "kv_load_failure_policy": ktc.kv_load_failure_policy})
        return KVTransferConfig(kv_connector="MultiConnector", kv_role=kvc.get("kv_role", "kv_both"),
                                engine_id=rc.ENGINE_ID,
                                kv_connector_extra_config={"connectors": children},
                                kv_load_failure_policy=kvc.get("load_failure_policy", "fail"))

    class MultiWorker:
        """vLLM's worker-side MultiConnector over the oracle's fake workers."""

        def __init__(self, workers: list[Any]) -> None:
            self.workers = workers
            self.extra_async_saves: dict[str, int] = {}

        def capture(self, so: Any) -> Any:
            meta = so.kv_connector_metadata
            assert isinstance(meta, MultiKVConnectorMetadata), type(meta)
            if meta.extra_async_saves:
                self.extra_async_saves.update(meta.extra_async_saves)
            outs = [w.capture(SimpleNamespace(kv_connector_metadata=m))
                    for w, m in zip(self.workers, meta.metadata, strict=True)]
            sending: set[str] = set()
            for out in outs:
                for rid in out.finished_sending:
                    extra = self.extra_async_saves.get(rid)
                    if extra is None:
                        sending.add(rid)
                    elif extra == 1:
                        del self.extra_async_saves[rid]
                    else:
                        self.extra_async_saves[rid] = extra - 1
            metas = tuple(out.kv_connector_worker_meta for out in outs)
            combined = KVConnectorOutput(
                finished_sending=sending,
                finished_recving=set().union(*(o.finished_recving for o in outs)),
                failed_recving=set().union(*(o.failed_recving for o in outs)),
                invalid_block_ids=set().union(*(o.invalid_block_ids for o in outs)),
                kv_connector_worker_meta=(MultiKVConnectorWorkerMetadata(metadata=metas)
                                          if any(m is not None for m in metas) else None),
            )
            combined.kvsched_load_failed = set().union(*(o.kvsched_load_failed for o in outs))
            return combined

    def make_kv_worker(scenario: dict[str, Any]) -> Any:
        if not is_multi(scenario):
            return own_worker(scenario)
        return MultiWorker([own_worker(_child_scenario(scenario, child))
                            for child in scenario["kv_connector"]["connectors"]])

    class MultiObserver(own_observer):  # type: ignore[misc, valid-type]
        """The oracle's observer; for a MultiConnector also the offloading
        child's ``offload`` key."""

        def __init__(self, sched: Any, kind: str) -> None:
            super().__init__(sched, kind)
            self.offload_index = None
            if kind == "multi":
                self.offload_index = next((i for i, c in enumerate(sched.connector.sub_connectors)
                                           if type(c).__name__ == "OffloadingConnector"), None)

        def record(self, so: Any, mro: Any) -> dict[str, Any]:
            rec = super().record(so, mro)
            i = self.offload_index
            if i is None:
                return rec
            kvo = mro.kv_connector_output if mro is not None else None
            meta = so.kv_connector_metadata.metadata[i] if so is not None else None
            multi_wm = kvo.kv_connector_worker_meta if kvo is not None else None
            wm = multi_wm.metadata[i] if multi_wm is not None else None
            manager = self.sched.connector.sub_connectors[i].connector_scheduler.manager
            rec["offload"] = {
                "store": [rc._job(j, e) for j, e in sorted(meta.store_jobs.items())] if meta else [],
                "load": [[*rc._job(j, e), e.sync] for j, e in sorted(meta.load_jobs.items())] if meta else [],
                "flush": sorted(meta.jobs_to_flush or ()) if meta else [],
                "done": sorted(wm.completed_jobs) if wm is not None else [],
                "cpu_chunks": manager._num_allocated_chunks - len(manager._free_list),
            }
            return rec

    rc.kv_transfer_config, rc.make_kv_worker = kv_transfer_config, make_kv_worker
    rc.KVObserver = MultiObserver
    try:
        yield
    finally:
        rc.kv_transfer_config, rc.make_kv_worker, rc.KVObserver = own_config, own_worker, own_observer


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ref_dir, folder = argv
    sys.path.insert(0, os.path.abspath(ref_dir))
    # vllm_replay first: it sets vLLM's environment (CPU device) before vLLM loads.
    import vllm_replay
    rc = vllm_replay.rc

    with multi_support(rc):
        for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
            out = path[:-5] + ".vllm.jsonl"
            try:
                with open(path) as f, open(out, "w") as trace:
                    vllm_replay.replay(json.load(f), trace)
            except RuntimeError as e:
                if "did not finish" not in str(e):
                    raise
                os.rename(out, out + ".stuck")
            except AssertionError:
                os.remove(out)
                with open(path[:-5] + ".vllm.crash", "w") as f:
                    f.write(traceback.format_exc())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
