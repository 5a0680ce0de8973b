"""The model runner driven by the real scheduler: schedule -> execute_model ->
update_from_output. Greedy outputs must match a reference that recomputes
the whole sequence without any cache (CausalAttention) for every token, under
every scheduling regime: one big batch, chunked prefill, prefix caching and
preemption."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from kvsched.config import CacheConfig, SchedulerConfig  # noqa: E402
from kvsched.core.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from kvsched.core.scheduler import Scheduler  # noqa: E402
from kvsched.executor.model_runner import ModelRunner  # noqa: E402
from kvsched.executor.sampler import Sampler  # noqa: E402
from kvsched.model.attention import CausalAttention  # noqa: E402
from kvsched.model.config import ModelConfig  # noqa: E402
from kvsched.model.llama import LlamaForCausalLM  # noqa: E402
from kvsched.request import Request, SamplingParams  # noqa: E402

VOCAB = 256
MAX_TOKENS = 10


def tiny(arch: str, seed: int = 0):
    config = ModelConfig(
        architecture=arch, model_type="llama" if arch.startswith("Llama") else "qwen3",
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2,
        num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False, qk_norm=arch.startswith("Qwen3"))
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Large weights: well-separated logits, so no argmax near-ties.
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return config, model.eval()


@pytest.fixture(scope="module", params=["LlamaForCausalLM", "Qwen3ForCausalLM"])
def model(request):
    return tiny(request.param)


def reference_greedy(model, prompt, max_tokens):
    m = model[1]
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(max_tokens):
            t = torch.tensor(ids)
            hidden = m.forward(t, torch.arange(len(ids)), CausalAttention())
            ids.append(int(m.compute_logits(hidden[-1:]).argmax()))
    return ids[len(prompt):]


def make_prompts(seed=0, shared_prefix=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(3, VOCAB) for _ in range(shared_prefix)]
    lens = [1, 5, 17, 33, 8, 26, 41, 3]
    return [prefix + [rng.randrange(3, VOCAB) for _ in range(n)] for n in lens]


class Spy:
    """Wraps a model to record the rows compute_logits sees."""

    def __init__(self, model):
        self.model = model
        self.logit_rows: list[int] = []

    def forward(self, input_ids, positions, attention):
        return self.model.forward(input_ids, positions, attention)

    def compute_logits(self, hidden):
        self.logit_rows.append(hidden.shape[0])
        return self.model.compute_logits(hidden)


def drive(model, prompts, *, budget=4096, blocks=400, block_size=4, caching=False,
          params=None, max_num_seqs=8):
    config, m = model
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                        max_model_len=256),
        CacheConfig(num_gpu_blocks=blocks, block_size=block_size, enable_prefix_caching=caching))
    spy = Spy(m)
    runner = ModelRunner(spy, config, blocks, block_size, "cpu", torch.float32, Sampler(seed=0))
    reqs = []
    for i, prompt in enumerate(prompts):
        p = params(i) if params else SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                    ignore_eos=True)
        reqs.append(Request(f"r{i}", prompt, p))
        scheduler.add_request(reqs[-1])
    stats = {"preempted": 0, "resumed": 0, "mid_prefill": 0, "hits": 0, "sampled": 0}
    generators = {}
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        stats["preempted"] += len(so.preempted_req_ids)
        stats["resumed"] += len(so.scheduled_cached_reqs.resumed_req_ids)
        stats["hits"] += sum(n.num_computed_tokens for n in so.scheduled_new_reqs)
        before = len(spy.logit_rows)
        mro = runner.execute_model(so)
        runner.check_invariants()
        assert mro.req_ids == list(so.num_scheduled_tokens)
        for rid in so.preempted_req_ids:  # state kept, KV dropped
            state = runner.requests[rid]
            assert state.block_ids == ([],) and state.num_computed_tokens == 0
            if state.sampling.generator is not None:
                generators.setdefault(rid, state.sampling.generator)
                assert state.sampling.generator is generators[rid]
        num_sampling = sum(1 for t in mro.sampled_token_ids if t)
        stats["mid_prefill"] += len(mro.req_ids) - num_sampling
        stats["sampled"] += num_sampling
        # compute_logits saw exactly the rows that sample, in one call.
        assert spy.logit_rows[before:] == ([num_sampling] if num_sampling else [])
        scheduler.update_from_output(so, mro)
    runner.execute_model(scheduler.schedule())  # hands over the last finished ids
    assert runner.requests == {}
    return [r.output_token_ids for r in reqs], stats


def test_one_big_batch_matches_reference(model):
    prompts = make_prompts()
    outputs, stats = drive(model, prompts)
    assert outputs == [reference_greedy(model, p, MAX_TOKENS) for p in prompts]
    assert stats["mid_prefill"] == 0 and stats["preempted"] == 0


def test_chunked_prefill_budget_16(model):
    prompts = make_prompts(1)
    outputs, stats = drive(model, prompts, budget=16)
    assert outputs == [reference_greedy(model, p, MAX_TOKENS) for p in prompts]
    assert stats["mid_prefill"] > 0  # chunks that sampled nothing


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_prefix_caching_with_shared_prefixes(model, block_size):
    prompts = make_prompts(2, shared_prefix=37)
    prompts += [[*p, 7, 8] for p in prompts[:3]]  # whole earlier prompts as prefixes
    outputs, stats = drive(model, prompts, caching=True, block_size=block_size, budget=64,
                           max_num_seqs=4)
    assert outputs == [reference_greedy(model, p, MAX_TOKENS) for p in prompts]
    assert stats["hits"] > 0


def test_preemption_with_a_tiny_cache(model):
    prompts = make_prompts(3)
    outputs, stats = drive(model, prompts, blocks=22, block_size=4, budget=32, caching=True)
    assert outputs == [reference_greedy(model, p, MAX_TOKENS) for p in prompts]
    assert stats["preempted"] > 0 and stats["resumed"] > 0


def test_seeded_sampling_survives_preemption_and_chunking(model):
    # The generator persists across preemption, so the draws, and the tokens,
    # match a run that was never preempted; penalties see the same history.
    prompts = make_prompts(4)

    def params(i):
        return SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=100 + i,
                              ignore_eos=True, repetition_penalty=1.3, top_k=20)

    calm, _ = drive(model, prompts, params=params)
    squeezed, stats = drive(model, prompts, params=params, blocks=22, budget=16, caching=True)
    assert stats["preempted"] > 0
    assert squeezed == calm
    assert calm != drive(model, prompts, params=lambda i: params(i + 1))[0]


def test_logprobs_aligned_with_requests(model):
    config, m = model
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4,
                                          max_model_len=256),
                          CacheConfig(num_gpu_blocks=64, block_size=4))
    runner = ModelRunner(m, config, 64, 4, "cpu", torch.float32, Sampler())
    prompts = make_prompts(5)
    scheduler.add_request(Request("plain", prompts[1], SamplingParams(max_tokens=3,
                                                                      temperature=0.0)))
    scheduler.add_request(Request("lp", prompts[3], SamplingParams(max_tokens=3, temperature=0.0,
                                                                   logprobs=2)))
    seen = 0
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        mro = runner.execute_model(so)
        for rid, tokens, lp in zip(mro.req_ids, mro.sampled_token_ids,
                                   mro.logprobs or [None] * len(mro.req_ids)):
            if rid == "lp" and tokens:
                # One {token: Logprob} per sampled token.
                assert lp is not None and len(lp) == len(tokens) == 1
                assert tokens[0] in lp[0] and len(lp[0]) >= 2
                assert lp[0][tokens[0]].rank == 1  # greedy takes the top token
                seen += 1
            else:
                assert lp is None
        scheduler.update_from_output(so, mro)
    assert seen == 3


def test_resume_takes_table_and_tokens_from_the_scheduler():
    # Hand-built scheduler outputs: the resumed request's tokens and block
    # table come from the SchedulerOutput, its generator from before.
    config, m = tiny("LlamaForCausalLM", seed=1)
    runner = ModelRunner(m, config, 32, 4, "cpu", torch.float32, Sampler())
    greedy = SamplingParams(temperature=0.0, seed=5)
    prompt = [5, 6, 7, 8, 9]

    def step(new=(), cached=None, scheduled=None, preempted=(), finished=()):
        so = SchedulerOutput(list(new), cached or CachedRequestData(), scheduled or {},
                             sum((scheduled or {}).values()), set(preempted), set(finished))
        out = runner.execute_model(so)
        runner.check_invariants()
        return out

    out = step(new=[NewRequestData("a", prompt, [3, 5], 0, greedy)], scheduled={"a": 5})
    first = out.sampled_token_ids[0][0]
    assert first == reference_greedy((config, m), prompt, 1)[0]
    generator = runner.requests["a"].sampling.generator
    assert generator is not None
    step(preempted=["a"])
    state = runner.requests["a"]
    assert state.block_ids == ([],) and state.num_computed_tokens == 0
    assert state.token_ids == [*prompt, first]
    # The scheduler's view wins: here it holds a different last token.
    tokens = [*prompt, 99]
    out = step(cached=CachedRequestData(
        req_ids=["a"], resumed_req_ids={"a"}, new_block_ids={"a": [9, 4]},
        num_computed_tokens={"a": 0}, resumed_token_ids={"a": tokens}), scheduled={"a": 6})
    assert out.sampled_token_ids == [reference_greedy((config, m), tokens, 1)]
    state = runner.requests["a"]
    assert state.block_ids == ([9, 4],) and state.num_computed_tokens == 6
    assert state.sampling.output_token_ids == [99, out.sampled_token_ids[0][0]]
    assert state.sampling.generator is generator
    # The recomputed KV went to the new blocks 9 and 4, none to 3 or 5 after the preemption.
    k_cache = runner.kv_caches[0][0]
    assert k_cache[9].abs().sum() > 0 and k_cache[4, :2].abs().sum() > 0
    assert k_cache[4, 2:].abs().sum() == 0
    step(finished=["a"])
    assert runner.requests == {}


def test_scheduling_past_the_known_tokens_is_an_error():
    config, m = tiny("LlamaForCausalLM", seed=1)
    runner = ModelRunner(m, config, 8, 4, "cpu", torch.float32, Sampler())
    so = SchedulerOutput([NewRequestData("a", [5, 6, 7], [1], 0)], CachedRequestData(), {"a": 4},
                         4, set(), set())
    with pytest.raises(RuntimeError, match="out of step"):
        runner.execute_model(so)
