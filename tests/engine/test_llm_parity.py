"""Greedy outputs of kvsched.LLM equal transformers' generate, token for token,
under every scheduling feature: mixed batches, chunked prefill, prefix caching,
preemption, the priority policy and the long-prefill threshold.

Every case runs in each engine ``VARIANT``: the synchronous engine (which
the reference is checked against), async scheduling (vLLM's batch queue of
2), n-gram speculative decoding with K = 1, 3 and 5 drafts, and async
scheduling with the async n-gram proposer (``ngram_gpu``). Speculation and
async scheduling change when tokens are computed, never which: the outputs
must be the synchronous engine's, token for token. The prompts repeat short
units, so the n-gram proposer finds matches, and every speculative run must
have had drafts accepted (the scheduler's SpecDecodingStats).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvsched.engine.llm import LLM  # noqa: E402
from kvsched.request import SamplingParams  # noqa: E402

ARCHS = ["llama", "qwen3"]
VOCAB = 512
# Engine arguments of each variant on top of the case's own.
VARIANTS: dict[str, dict[str, Any]] = {
    "sync": {},
    "async": {"async_scheduling": True},
    "ngram-k1": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 1,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 3}},
    "ngram-k3": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                        "prompt_lookup_min": 1, "prompt_lookup_max": 4}},
    "ngram-k5": {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 5, '
                                       '"prompt_lookup_min": 1, "prompt_lookup_max": 5}'},
    "async-ngram_gpu-k3": {"async_scheduling": True,
                           "speculative_config": {"method": "ngram_gpu", "num_speculative_tokens": 3,
                                                  "prompt_lookup_min": 1, "prompt_lookup_max": 3}},
}


@pytest.fixture(scope="module", params=ARCHS)
def ckpt(request: pytest.FixtureRequest, tiny: Callable[..., Path]) -> Path:
    return tiny(arch=request.param)


@pytest.fixture(params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> dict[str, Any]:
    return VARIANTS[request.param]


def make_llm(ckpt: Path, variant: dict[str, Any], **kwargs: Any) -> LLM:
    return LLM(str(ckpt), **kwargs, **variant)


@pytest.fixture(scope="module")
def reference(ckpt: Path, hf_model: Callable[[Path], Any]) -> Callable[[list[int], int], list[int]]:
    """HF generate, one prompt at a time, no padding; memoised per (prompt, max_tokens)."""
    model = hf_model(ckpt)
    memo: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in memo:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                     do_sample=False, pad_token_id=model.generation_config.eos_token_id)
            memo[key] = out[0, len(prompt):].tolist()
        return memo[key]

    return generate


def _prompts(seed: int, n: int, lo: int, hi: int) -> list[list[int]]:
    """Prompts of lo..hi tokens; most repeat a short random unit (with a
    random tail), so their n-grams recur."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        length = rng.randint(lo, hi)
        if rng.random() < 0.25:
            prompts.append([rng.randrange(4, VOCAB) for _ in range(length)])
            continue
        unit = [rng.randrange(4, VOCAB) for _ in range(rng.randint(2, 7))]
        tail = [rng.randrange(4, VOCAB) for _ in range(rng.randint(0, 3))]
        body = (unit * (length // len(unit) + 1))[:max(length - len(tail), 1)]
        prompts.append((body + tail)[:length])
    return prompts


def _check(llm: LLM, prompts: list[list[int]], max_tokens: list[int],
           reference: Callable[[list[int], int], list[int]], accepted: bool = True,
           **generate_kwargs: Any) -> list[Any]:
    """Greedy outputs equal the reference; with speculation (and
    ``accepted``), some drafts were accepted in the engine's life so far."""
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in max_tokens]
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                        **generate_kwargs)
    for i, (p, m, out) in enumerate(zip(prompts, max_tokens, outs)):
        assert out.prompt_token_ids == p
        assert out.outputs[0].token_ids == reference(p, m), f"prompt {i} ({len(p)} tokens)"
    assert not llm.has_unfinished_requests()
    engine = llm.engine
    assert not engine.batch_queue
    engine.scheduler.check_invariants()
    engine.runner.check_invariants()
    if engine.speculative_config is not None and accepted:
        stats = engine.spec_decoding_stats
        # Drafts were verified and some were accepted.
        assert stats is not None and stats.num_draft_tokens > 0
        assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens
        assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    return outs


def test_64_mixed_length_prompts_in_one_run(ckpt: Path, reference: Any,
        variant: dict[str, Any]) -> None:
    prompts = _prompts(1, 64, 1, 300)
    max_tokens = [random.Random(i).randint(4, 24) for i in range(64)]
    llm = make_llm(ckpt, variant, max_num_seqs=64, max_num_batched_tokens=1024, kv_cache_memory="64MiB")
    outs = _check(llm, prompts, max_tokens, reference)
    assert all(o.metrics.first_token_time is not None for o in outs)
    assert all(o.metrics.arrival_time <= o.metrics.first_token_time <= o.metrics.finished_time
               for o in outs)


@pytest.mark.parametrize("budget", [16, 37, 64])
def test_chunked_prefill_budgets(ckpt: Path, reference: Any, variant: dict[str, Any],
                                budget: int) -> None:
    prompts = _prompts(2, 12, 20, 150)
    llm = make_llm(ckpt, variant, max_num_seqs=min(budget, 8), max_num_batched_tokens=budget,
              enable_prefix_caching=False, kv_cache_memory="16MiB")
    _check(llm, prompts, [12] * len(prompts), reference)


def test_prefix_caching_with_shared_prefixes_and_repeats(ckpt: Path, reference: Any,
        variant: dict[str, Any]) -> None:
    rng = random.Random(3)
    unit = [rng.randrange(4, VOCAB) for _ in range(5)]
    prefix = (unit * 14)[:66] + [rng.randrange(4, VOCAB) for _ in range(4)]
    prompts = [prefix + [rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(6)]
    # A repeat, a prompt that is only the prefix, and one whose every token
    # but the last is cached (admitted with one token to compute: with
    # speculation, padded with K -1 drafts).
    prompts += [prompts[0], prompts[3], prefix[:48], prefix[:49]]
    # 16-token blocks (the CPU's default is 32): the counts below are in them.
    llm = make_llm(ckpt, variant, max_num_seqs=4, max_num_batched_tokens=64, kv_cache_memory="16MiB",
                   block_size=16)
    _check(llm, prompts[:2], [10, 10], reference, accepted=False)  # warm the cache
    outs = _check(llm, prompts, [10] * len(prompts), reference)
    cached = [o.num_cached_tokens for o in outs]
    assert all(c >= 64 for c in cached[:6])  # the 70-token prefix: 4 full blocks of 16
    assert cached[6] >= 64 and cached[8] == 32  # a repeat, and a prompt that is only the prefix
    assert cached[9] == 48


def test_preemption_by_a_tiny_kv_cache(ckpt: Path, reference: Any,
        variant: dict[str, Any]) -> None:
    prompts = _prompts(4, 8, 30, 60)
    llm = make_llm(ckpt, variant, max_num_seqs=8, max_num_batched_tokens=128, block_size=4,
              num_gpu_blocks_override=40)
    outs = _check(llm, prompts, [40] * len(prompts), reference)
    assert sum(o.metrics.num_preemptions for o in outs) > 0


def test_priority_policy_with_preemption(ckpt: Path, reference: Any,
        variant: dict[str, Any]) -> None:
    prompts = _prompts(5, 8, 10, 50)
    llm = make_llm(ckpt, variant, scheduling_policy="priority", max_num_seqs=4, max_num_batched_tokens=64,
              block_size=4, num_gpu_blocks_override=36)
    outs = _check(llm, prompts, [30] * len(prompts), reference, priority=[3, 1, 2, 0, 3, 1, 0, 2])
    assert sum(o.metrics.num_preemptions for o in outs) > 0


def test_long_prefill_token_threshold(ckpt: Path, reference: Any,
        variant: dict[str, Any]) -> None:
    prompts = _prompts(6, 10, 5, 120)
    llm = make_llm(ckpt, variant, long_prefill_token_threshold=8, max_num_seqs=6, max_num_batched_tokens=48,
              kv_cache_memory="16MiB")
    _check(llm, prompts, [10] * len(prompts), reference)
