"""Draft verification in the model runner and the rejection sampler.

- Hand-built steps: a request's drafts run after its last sampled token;
  greedy accepts the drafts that equal the argmax and adds the argmax at the
  first mismatch (or the bonus token); -1 placeholders run as if no draft
  was scheduled; under async scheduling the placeholders stand for the
  runner's own drafts of the step before.
- The real scheduler driving the runner with n-gram drafts gives the
  non-speculative tokens under penalties and min_tokens, and seeded random
  sampling is reproducible.
- vLLM's rejection rule for drafts without probabilities: a draft is
  accepted with its target probability, and the first token out is
  distributed as the target distribution.
"""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from test_model_runner import Spy, make_prompts, reference_greedy, tiny  # noqa: E402

from kvsched.config import CacheConfig, SchedulerConfig, SpeculativeConfig  # noqa: E402
from kvsched.core.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from kvsched.core.scheduler import Scheduler  # noqa: E402
from kvsched.executor.model_runner import ModelRunner  # noqa: E402
from kvsched.executor.ngram_proposer import NgramProposer, propose_ngram  # noqa: E402
from kvsched.executor.rejection_sampler import Verification, verify  # noqa: E402
from kvsched.executor.sampler import Sampler, SamplingState  # noqa: E402
from kvsched.request import Request, SamplingParams  # noqa: E402

GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)


class Counter(Spy):
    """Also records the number of tokens of every forward pass."""

    def __init__(self, model):
        super().__init__(model)
        self.num_tokens: list[int] = []

    def forward(self, input_ids, positions, attention):
        self.num_tokens.append(int(input_ids.shape[0]))
        return super().forward(input_ids, positions, attention)


@pytest.fixture(scope="module")
def model():
    return tiny("LlamaForCausalLM", seed=2)


def _runner(model, **kwargs):
    config, m = model
    spy = Counter(m)
    return ModelRunner(spy, config, 64, 4, "cpu", torch.float32, Sampler(), **kwargs), spy


def _step(runner, *, new=(), scheduled=None, spec=None, cached_ids=(), k=0):
    so = SchedulerOutput(list(new), CachedRequestData(req_ids=list(cached_ids)), scheduled or {},
                         sum((scheduled or {}).values()), set(), set())
    so.scheduled_spec_decode_tokens = spec or {}
    so.num_spec_tokens_to_schedule = k
    out = runner.execute_model(so)
    runner.check_invariants()
    return out


def test_greedy_verification_accepts_the_drafts_that_match(model):
    prompt = make_prompts(7)[2]
    ref = reference_greedy(model, prompt, 12)
    runner, spy = _runner(model)
    blocks = list(range(1, 20))
    out = _step(runner, new=[NewRequestData("a", prompt, blocks, 0, GREEDY)], scheduled={"a": len(prompt)})
    assert out.sampled_token_ids == [[ref[0]]]
    # Two right drafts and a wrong one: both accepted, then the argmax.
    wrong = (ref[3] + 1) % 256
    out = _step(runner, scheduled={"a": 4}, spec={"a": [ref[1], ref[2], wrong]}, cached_ids=["a"])
    assert out.sampled_token_ids == [ref[1:4]]
    assert spy.num_tokens[-1] == 4 and spy.logit_rows[-1] == 4
    state = runner.requests["a"]
    # The rejected draft's position is computed again next step.
    assert state.num_computed_tokens == len(prompt) + 3
    assert state.token_ids == prompt + ref[:4]
    # Every draft right: all accepted and the bonus token.
    out = _step(runner, scheduled={"a": 4}, spec={"a": ref[4:7]}, cached_ids=["a"])
    assert out.sampled_token_ids == [ref[4:8]]
    # The first draft wrong: just the argmax.
    out = _step(runner, scheduled={"a": 3}, spec={"a": [(ref[8] + 1) % 256, ref[9]]},
                cached_ids=["a"])
    assert out.sampled_token_ids == [[ref[8]]]
    assert runner.requests["a"].num_computed_tokens == len(prompt) + 8
    # A step without drafts continues from there.
    out = _step(runner, scheduled={"a": 1}, cached_ids=["a"])
    assert out.sampled_token_ids == [[ref[9]]]


def test_padding_drafts_run_as_one_token(model):
    """-1 drafts (a request admitted with one token to compute is padded
    with K of them) are never fed to the model and never accepted: the
    request runs exactly as if it had been scheduled with one token."""
    prompt = make_prompts(8)[3]
    blocks = list(range(1, 20))
    runs = []
    for padded in (False, True):
        runner, spy = _runner(model)
        # Another request computes the prefix's KV into the blocks, then
        # leaves; "a" is admitted on them with one token to compute (a
        # prefix-cache hit of all but its last token).
        _step(runner, new=[NewRequestData("x", prompt[:-1], blocks, 0, GREEDY)],
              scheduled={"x": len(prompt) - 1})
        runner.requests.pop("x")
        scheduled, spec = ({"a": 4}, {"a": [-1, -1, -1]}) if padded else ({"a": 1}, None)
        out = _step(runner, new=[NewRequestData("a", prompt, blocks, len(prompt) - 1, GREEDY)],
                    scheduled=scheduled, spec=spec)
        runs.append((out.sampled_token_ids, spy.num_tokens[-1], spy.logit_rows[-1],
                     runner.requests["a"].num_computed_tokens, runner.kv_caches[0][0].clone()))
    (plain, n0, rows0, computed0, kv0), (padded_out, n1, rows1, computed1, kv1) = runs
    assert padded_out == plain == [[reference_greedy(model, prompt, 1)[0]]]
    assert n0 == n1 == 1 and rows0 == rows1 == 1
    assert computed0 == computed1 == len(prompt)
    assert torch.equal(kv0, kv1)


class Successor:
    """A fake model whose next token is always the last one plus 1 (mod V),
    so which drafts are right is known by hand."""

    def __init__(self, vocab: int = 16) -> None:
        self.vocab = vocab

    def forward(self, input_ids, positions, attention):
        return torch.nn.functional.one_hot(input_ids, self.vocab).float()

    def compute_logits(self, hidden):
        return torch.roll(hidden, 1, dims=-1) * 10.0


def test_async_placeholders_take_the_runners_own_drafts(model):
    config, _ = model
    proposer = NgramProposer(SpeculativeConfig("ngram_gpu", 3, prompt_lookup_min=1,
                                               prompt_lookup_max=2), max_model_len=256)
    fake = Successor()
    runner = ModelRunner(fake, config, 64, 4, "cpu", torch.float32, Sampler(), proposer=proposer,
                         async_drafts=True)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    out = _step(runner, new=[NewRequestData("a", prompt, list(range(1, 20)), 0, GREEDY)],
                scheduled={"a": len(prompt)}, k=3)
    assert out.sampled_token_ids == [[2]]
    assert runner.take_draft_token_ids() is None  # async: nothing for the scheduler
    # The runner proposed [3, 1, 2] after [..., 1, 2] (the 2-gram's earliest
    # occurrence); the scheduler sends placeholders for them.
    out = _step(runner, scheduled={"a": 4}, spec={"a": [-1, -1, -1]}, cached_ids=["a"], k=3)
    assert out.sampled_token_ids == [[3, 4]]  # 3 accepted, 1 rejected: the model's 4
    state = runner.requests["a"]
    assert state.num_computed_tokens == len(prompt) + 2 and state.token_ids == [*prompt, 2, 3, 4]
    # After [..., 3, 4] no earlier 4: no drafts, so the placeholders run as one token.
    out = _step(runner, scheduled={"a": 4}, spec={"a": [-1, -1, -1]}, cached_ids=["a"], k=3)
    assert out.sampled_token_ids == [[5]]
    assert runner.last_metadata is not None and runner.last_metadata.num_tokens == 1
    # Drafts are for the request's next step only: a step without it drops them.
    out = _step(runner, new=[NewRequestData("c", prompt, list(range(20, 30)), 0, GREEDY)],
                scheduled={"c": len(prompt)}, k=3)
    assert out.sampled_token_ids == [[2]]  # and [3, 1, 2] proposed
    _step(runner, new=[NewRequestData("b", [9, 9, 9], [30], 0, GREEDY)], scheduled={"b": 3}, k=3)
    out = _step(runner, scheduled={"c": 4}, spec={"c": [-1, -1, -1]}, cached_ids=["c"], k=3)
    assert out.sampled_token_ids == [[3]] and runner.last_metadata.num_tokens == 1


def test_synchronous_drafts_go_to_the_scheduler(model):
    proposer = NgramProposer(SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=2),
                             max_model_len=256)
    runner, _ = _runner(model, proposer=proposer)
    prompt = [5, 6, 7, 5, 6]
    out = _step(runner, new=[NewRequestData("a", prompt, [1, 2, 3], 0, GREEDY),
                             NewRequestData("b", [9, 8, 7, 6, 5, 4], [4, 5], 0, GREEDY)],
                scheduled={"a": 5, "b": 3}, k=3)
    drafts = runner.take_draft_token_ids()
    assert drafts is not None and drafts.req_ids == ["a", "b"]
    # b is mid-prefill: it sampled nothing, so no drafts.
    assert drafts.draft_token_ids == [propose_ngram(prompt + out.sampled_token_ids[0], 1, 2, 3, 256), []]
    assert runner.take_draft_token_ids() is None  # taken once


def drive_spec(model, prompts, params, spec: SpeculativeConfig | None, *, budget=64, blocks=200,
               max_num_seqs=4):
    """The real scheduler and the runner, with vLLM's synchronous step loop
    (drafts handed over after each step)."""
    config, m = model
    scheduler = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                          max_model_len=256),
                          CacheConfig(num_gpu_blocks=blocks, block_size=4, enable_prefix_caching=True),
                          speculative_config=spec)
    proposer = NgramProposer(spec, 256) if spec is not None else None
    runner = ModelRunner(m, config, blocks, 4, "cpu", torch.float32, Sampler(seed=3), proposer=proposer)
    reqs = [Request(f"r{i}", p, params(i)) for i, p in enumerate(prompts)]
    for r in reqs:
        scheduler.add_request(r)
    accepted = 0
    while scheduler.has_unfinished_requests():
        so = scheduler.schedule()
        mro = runner.execute_model(so)
        runner.check_invariants()
        stats = scheduler.update_from_output(so, mro).spec_decoding_stats
        accepted += stats.num_accepted_tokens if stats else 0
        drafts = runner.take_draft_token_ids()
        if drafts is not None:
            scheduler.update_draft_token_ids(drafts)
        scheduler.check_invariants()
    return [r.output_token_ids for r in reqs], accepted


def _looping_prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [(u * 12)[:rng.randint(6, 30)] for u in
            ([rng.randrange(3, 256) for _ in range(rng.randint(1, 4))] for _ in range(6))]


@pytest.mark.parametrize("k", [1, 3])
def test_penalties_and_min_tokens_see_the_drafts_before_each_row(model, k):
    """Greedy with penalties: row j of a verification is penalised with the
    outputs and the drafts before it, so speculation changes no token."""
    prompts = _looping_prompts(1)

    def params(i):
        # Penalties that favour repeats (so drafts get accepted), and the
        # prompt's first token as EOS held back by min_tokens.
        return SamplingParams(max_tokens=20, temperature=0.0, repetition_penalty=0.7 + 0.1 * (i % 2),
                              presence_penalty=-0.5 * (i % 3), frequency_penalty=-0.3 * (i % 2),
                              min_tokens=5 * (i % 2), eos_token_id=prompts[i][0] if i % 2 else None)

    plain, _ = drive_spec(model, prompts, params, None)
    spec, accepted = drive_spec(model, prompts, params,
                                SpeculativeConfig("ngram", k, prompt_lookup_min=1, prompt_lookup_max=3))
    assert spec == plain
    assert accepted > 0


def test_seeded_random_sampling_with_drafts_is_reproducible(model):
    """Random requests verify with vLLM's rejection rule, greedy ones next
    to them with the argmax rule: the greedy outputs are the plain ones."""
    prompts = _looping_prompts(2)
    config = SpeculativeConfig("ngram", 3, prompt_lookup_min=1, prompt_lookup_max=3)

    def params(i, seed=10):
        if i % 3 == 0:
            return SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        return SamplingParams(max_tokens=16, temperature=0.7, top_k=8, seed=seed + i, ignore_eos=True)

    first, accepted = drive_spec(model, prompts, params, config)
    again, _ = drive_spec(model, prompts, params, config)
    assert first == again
    assert accepted > 0
    other, _ = drive_spec(model, prompts, lambda i: params(i, seed=20), config)
    assert other != first
    plain, _ = drive_spec(model, prompts, params, None)
    greedy = [i for i in range(len(prompts)) if i % 3 == 0]
    assert [first[i] for i in greedy] == [plain[i] for i in greedy] == [other[i] for i in greedy]


# -- the rejection sampler on made-up logits ----------------------------------

def _state(params: SamplingParams, outputs=()) -> SamplingState:
    return SamplingState(params, [1, 2, 3], list(outputs), None)


def test_greedy_rows_accept_while_the_draft_is_the_argmax():
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 5.0
    state = _state(SamplingParams(temperature=0.0))
    cases = [([2, 4, 1], [2, 4, 1, 3]), ([2, 4, 5], [2, 4, 1]), ([0, 4, 1], [2]), ([2, 0, 1], [2, 4])]
    for drafts, expected in cases:
        [result] = verify(Sampler(), logits, [Verification(0, drafts, state)])
        assert result.token_ids == expected
    # Two requests in one batch, rows after rows.
    results = verify(Sampler(), torch.cat([logits[:3], logits]),
                     [Verification(0, [2, 0], state), Verification(3, [2, 4, 1], state)])
    assert [r.token_ids for r in results] == [[2, 4], [2, 4, 1, 3]]


def test_random_drafts_are_accepted_with_their_target_probability():
    """vLLM's rule for drafts without probabilities (draft prob 1): accept
    with probability p(draft); on rejection draw from p with the draft
    removed. The first token out is then distributed as p itself."""
    target = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])
    row = torch.log(target)
    n = 4000
    draft = 1
    params = SamplingParams(temperature=1.0)
    logits = row.repeat(2 * n, 1)  # each item: the draft row and the bonus row
    items = [Verification(2 * i, [draft], _state(params)) for i in range(n)]
    results = verify(Sampler(seed=5), logits, items)
    first = torch.tensor([r.token_ids[0] for r in results])
    accepted = sum(len(r.token_ids) == 2 for r in results)
    sigma = math.sqrt(target[draft] * (1 - target[draft]) / n)
    assert abs(accepted / n - float(target[draft])) < 4 * sigma
    freq = torch.bincount(first, minlength=5).float() / n
    assert torch.allclose(freq, target, atol=0.03), freq
    # A rejected draft is never the token that replaces it.
    assert all(r.token_ids[0] != draft for r in results if len(r.token_ids) == 1)


def test_top_k_and_temperature_shape_the_target_but_min_p_does_not():
    sampler = Sampler()
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top2 = sampler.target_probs(logits, [SamplingParams(temperature=1.0, top_k=2)])
    assert torch.allclose(top2, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    # min_p would drop token 3 (0.05 < 0.2 * 0.5); vLLM verifies without it.
    assert torch.allclose(sampler.target_probs(logits, [SamplingParams(temperature=1.0, min_p=0.2)]),
                          torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    # top_k=1: only the argmax can be accepted, and it always is.
    state = _state(SamplingParams(temperature=1.0, top_k=1))
    for _ in range(20):
        [bad] = verify(sampler, logits.repeat(2, 1), [Verification(0, [1], state)])
        [good] = verify(sampler, logits.repeat(2, 1), [Verification(0, [0], state)])
        assert bad.token_ids == [0] and good.token_ids == [0, 0]


def test_seeded_requests_draw_from_their_own_generator():
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0))

    def run(seed: int, batch_seed: int) -> list[list[int]]:
        sampler = Sampler(seed=batch_seed)
        state = SamplingState(SamplingParams(temperature=1.0, seed=seed), [1], [], None)
        other = _state(SamplingParams(temperature=1.0))
        out = []
        for _ in range(5):
            results = verify(sampler, torch.cat([logits[:3], logits[3:]]),
                             [Verification(0, [7, 8], other), Verification(3, [7, 8, 9, 10], state)])
            out.append(results[1].token_ids)
        return out

    assert run(4, 0) == run(4, 1)  # the unseeded neighbour's draws do not matter
    assert run(4, 0) != run(5, 0)


def test_logprobs_of_every_verified_token():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    top = logits.argmax(dim=-1).tolist()
    state = _state(SamplingParams(temperature=0.0, logprobs=2))
    [result] = verify(Sampler(), logits, [Verification(0, [top[0], top[1]], state)])
    assert result.token_ids == top
    expected = torch.log_softmax(logits, dim=-1)
    assert len(result.logprobs) == 3
    for row, (token, lp) in enumerate(zip(result.token_ids, result.logprobs)):
        assert lp is not None and lp[token].rank == 1 and len(lp) == 2
        assert lp[token].logprob == pytest.approx(float(expected[row, token]), abs=1e-5)
