"""The model runner with one block table per KV cache group, on a tiny random
Gemma 3 text checkpoint (6 layers, every third global, a window of 12):
vLLM's planner gives it two sliding-window groups and one full-attention
group. Expected tokens and logits come from transformers.

The hand-made scheduler outputs below do what vLLM's hybrid KV cache
manager does: every group draws distinct block ids from one pool; once a
sliding group's window has passed a block (the block's tokens are all
before position ``num_computed_tokens - window + 1``) the block is freed,
here by filling its pages with NaN (a read of it, even masked, would turn
the output to NaN), while the runner's copy of the table keeps the stale id;
and a request admitted on a prefix-cache hit gets the null block 0 in its
sliding tables where the window has passed."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvsched.core.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from kvsched.executor.model_runner import ModelRunner  # noqa: E402
from kvsched.executor.paged_attention import AttentionMetadata, PagedAttention  # noqa: E402
from kvsched.executor.sampler import Sampler  # noqa: E402
from kvsched.model.kv_groups import kv_cache_groups  # noqa: E402
from kvsched.model.loader import load_model  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402

WINDOW = 12
BLOCK = 4
CHECKPOINT = {"arch": "gemma3", "num_layers": 6, "sliding_window": WINDOW,
              "sliding_window_pattern": 3, "max_position_embeddings": 1024}


def _edit_config(src: Path, dst: Path, **changes: Any) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(("tied", "changes"), [
    pytest.param(False, {}, id="untied"),
    pytest.param(True, {}, id="tied"),
    pytest.param(False, {"final_logit_softcapping": 3.0,
                         "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, id="softcap-linear-rope"),
    pytest.param(False, {"sliding_window": 5, "sliding_window_pattern": 2, "query_pre_attn_scalar": 24},
                 id="window-5-alternating"),
])
def test_logits_match_transformers(tiny: Callable[..., Path], hf_model: Callable[[Path], Any],
                                   tmp_path: Path, tied: bool, changes: dict[str, Any]) -> None:
    """One 48-token prefill over the paged cache, every group on its own
    blocks: every position's logits equal transformers' (float32)."""
    path = tiny(**CHECKPOINT, tie_word_embeddings=tied)
    if changes:
        path = _edit_config(path, tmp_path / "edited", **changes)
    config, model = load_model(path, torch.float32, "cpu")
    hf = hf_model(path)
    ids = torch.randint(4, 512, (48,), generator=torch.Generator().manual_seed(1))
    groups = kv_cache_groups(config, BLOCK)
    tables = [list(range(1 + 12 * g, 13 + 12 * g)) for g in range(len(groups.groups))]
    mds = [AttentionMetadata.build([48], [48], [t], BLOCK, sliding_window=g.sliding_window)
           for g, t in zip(groups.groups, tables)]
    shape = (12 * len(tables) + 1, BLOCK, config.num_kv_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_layers)]
    attention = PagedAttention(caches, mds, layer_groups=groups.layer_groups, scale=config.attention_scale)
    with torch.inference_mode():
        ours = model.compute_logits(model(ids, mds[0].positions, attention))
        ref = hf(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=0)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


class Driver:
    """Hand-made scheduler outputs over one shared pool of block ids."""

    def __init__(self, runner: ModelRunner, num_blocks: int) -> None:
        self.runner = runner
        self.windows = runner.group_windows
        rng = random.Random(0)
        self.free = list(range(1, num_blocks))
        rng.shuffle(self.free)
        self.tables: dict[str, list[list[int]]] = {}  # the scheduler's view, nulls included
        self.holders: dict[int, set[str]] = {}
        self.tokens: dict[str, list[int]] = {}
        self.computed: dict[str, int] = {}
        self.outputs: dict[str, list[int]] = {}
        self.nulled = self.freed = 0

    def _grow(self, rid: str, num_tokens: int) -> list[list[int]]:
        new: list[list[int]] = []
        for table in self.tables[rid]:
            added = []
            while len(table) * BLOCK < num_tokens:
                block = self.free.pop()
                self.holders[block] = {rid}
                table.append(block)
                added.append(block)
            new.append(added)
        return new

    def step(self, scheduled: dict[str, int], new: dict[str, tuple[list[int], list[list[int]], int]],
             finished: set[str]) -> None:
        """``new``: request -> (prompt, per-group tables it starts with, cached tokens)."""
        new_reqs, cached, new_ids = [], [], {}
        for rid, (prompt, tables, hit) in new.items():
            self.tables[rid] = [list(t) for t in tables]
            for table in tables:
                for block in table:
                    if block:
                        self.holders.setdefault(block, set()).add(rid)
            self.tokens[rid], self.computed[rid], self.outputs[rid] = list(prompt), hit, []
        for rid, n in scheduled.items():
            grown = self._grow(rid, self.computed[rid] + n)
            if rid in new:
                new_reqs.append(NewRequestData(rid, new[rid][0], self.tables[rid], self.computed[rid],
                                               SamplingParams(temperature=0.0)))
            else:
                cached.append(rid)
                if any(grown):
                    new_ids[rid] = grown
        so = SchedulerOutput(new_reqs, CachedRequestData(cached, set(), new_ids,
                                                         {r: self.computed[r] for r in cached}),
                             dict(scheduled), sum(scheduled.values()), set(), set(finished))
        out = self.runner.execute_model(so)
        self.runner.check_invariants()
        for rid, tokens in zip(out.req_ids, out.sampled_token_ids):
            self.computed[rid] += scheduled[rid]
            self.tokens[rid] += tokens
            self.outputs[rid] += tokens
        for rid in scheduled:
            self._slide(rid)

    def _slide(self, rid: str) -> None:
        """vLLM's sliding-window manager after the step: blocks wholly before
        computed - window + 1 go back to the pool (here: poisoned, never reused)."""
        for table, window in zip(self.tables[rid], self.windows):
            if window is None:
                continue
            skipped = max(0, self.computed[rid] - window + 1)
            for j in range(skipped // BLOCK):
                block = table[j]
                if not block:
                    continue
                table[j] = 0
                self.holders[block].discard(rid)
                if not self.holders[block]:
                    for k_cache, v_cache in self.runner.kv_caches:
                        k_cache[block] = float("nan")
                        v_cache[block] = float("nan")
                    self.freed += 1


@pytest.mark.parametrize("shared", [False, True], ids=["tensor-per-layer", "vllm-shared-tensors"])
def test_per_group_tables_null_and_freed_blocks_match_transformers(
        tiny: Callable[..., Path], hf_model: Callable[[Path], Any], shared: bool) -> None:
    """``shared``: the groups share K/V tensors as in vLLM (layer i of every
    group on tensor i), which the distinct ids per group make sound."""
    path = tiny(**CHECKPOINT)
    config, model = load_model(path, torch.float32, "cpu")
    hf = hf_model(path)
    num_blocks = 256
    runner = ModelRunner(model, config, num_blocks, BLOCK, "cpu", torch.float32, Sampler(),
                         share_kv_tensors=shared)
    assert runner.group_windows == (WINDOW, WINDOW, None)
    # Layers 0, 1, 2 (the first of each group) on one tensor when shared.
    assert (runner.kv_caches[0][0] is runner.kv_caches[2][0]) == shared
    assert len({id(k) for k, _ in runner.kv_caches}) == (2 if shared else 6)
    drv = Driver(runner, num_blocks)
    rng = random.Random(5)
    a = [rng.randrange(4, 512) for _ in range(45)]
    b = [rng.randrange(4, 512) for _ in range(30)]
    c = a[:40] + [rng.randrange(4, 512) for _ in range(9)]  # a prefix-cache hit of 40 tokens on a
    max_tokens = 10
    no_tables: list[list[int]] = [[] for _ in runner.group_windows]

    # a's prompt in chunks of 16, 16, 8 (40 computed: its sliding blocks 0..6 are freed), then b joins.
    drv.step({"a": 16}, {"a": (a, no_tables, 0)}, set())
    drv.step({"a": 16, "b": 10}, {"b": (b, no_tables, 0)}, set())
    drv.step({"a": 8, "b": 20}, {}, set())
    assert drv.freed > 0 and drv.outputs["b"]
    # c is admitted on a's first 10 blocks: the full group shares them, the
    # sliding groups share the 3 in c's window and have the null block before.
    skipped_blocks = (40 - WINDOW + 1) // BLOCK
    c_tables = []
    for table, window in zip(drv.tables["a"], runner.group_windows):
        head = table[:10]
        c_tables.append(head if window is None else [0] * skipped_blocks + head[skipped_blocks:])
    assert all(t[skipped_blocks] for t in c_tables) and c_tables[0][:skipped_blocks] == [0] * skipped_blocks
    drv.step({"a": 5, "b": 1, "c": 9}, {"c": (c, c_tables, 40)}, set())
    state = runner.requests["c"]
    assert state.num_computed_tokens == 49
    assert state.block_ids[0][:skipped_blocks] == [0] * skipped_blocks
    assert state.block_ids[2][:10] == drv.tables["a"][2][:10]
    # Distinct ids per group, one pool.
    a_tables = runner.requests["a"].block_ids  # the runner's copy, extended in place
    ids = [set(t) - {0} for t in a_tables]
    assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
    finished: set[str] = set()
    while any(len(drv.outputs[r]) < max_tokens for r in ("a", "b", "c")):
        active = {r: 1 for r in ("a", "b", "c") if len(drv.outputs[r]) < max_tokens}
        drv.step(active, {}, finished)
        finished = {r for r in ("a", "b", "c") if len(drv.outputs[r]) >= max_tokens} - finished
    drv.step({}, {}, finished)

    for rid, prompt in (("a", a), ("b", b), ("c", c)):
        ids_t = torch.tensor([prompt])
        with torch.no_grad():
            ref = hf.generate(ids_t, attention_mask=torch.ones_like(ids_t), max_new_tokens=max_tokens,
                              do_sample=False, pad_token_id=2)[0, len(prompt):].tolist()
        assert drv.outputs[rid][:max_tokens] == ref, rid
    # The windows passed many blocks, which the runner's tables still name.
    assert drv.freed >= 20
    assert 0 not in a_tables[0] and torch.isnan(runner.kv_caches[0][0][a_tables[0][0]]).all()


def test_block_ids_in_either_form(tiny: Callable[..., Path]) -> None:
    """A flat list (today's scheduler) goes to every group; per-group lists
    are taken as they are, and must be one per group."""
    config, model = load_model(tiny(**CHECKPOINT), torch.float32, "cpu")
    runner = ModelRunner(model, config, 16, BLOCK, "cpu", torch.float32, Sampler())
    flat = runner.per_group([5, 6])
    assert flat == ([5, 6], [5, 6], [5, 6]) and flat[0] is not flat[1]
    assert runner.per_group([]) == ([], [], [])
    assert runner.per_group([[0, 7], [0, 8], [1, 2]]) == ([0, 7], [0, 8], [1, 2])
    with pytest.raises(RuntimeError, match="block ids for 2 KV cache groups, but the model has 3"):
        runner.per_group([[1], [2]])
    shared = ModelRunner(model, config, 16, BLOCK, "cpu", torch.float32, Sampler(), share_kv_tensors=True)
    with pytest.raises(RuntimeError, match="the groups share their K/V tensors: each group needs its own"):
        shared.per_group([5, 6])
