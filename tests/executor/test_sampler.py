"""Sampler: each feature against a naive per-row reference or hand-computed values."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from kvsched.executor.sampler import (  # noqa: E402
    Sampler,
    SamplingState,
    apply_penalties,
    mask_stop_tokens,
)
from kvsched.request import SamplingParams  # noqa: E402


def _state(params: SamplingParams, prompt: list[int] | None = None,
           output: list[int] | None = None, sampler: Sampler | None = None) -> SamplingState:
    generator = sampler.make_generator(params) if sampler is not None else None
    return SamplingState(params, list(prompt or [0]), list(output or []), generator)


# ---- a plain reference: one row at a time, float64, Python loops ----

def _reference_distribution(logits: list[float], params: SamplingParams) -> dict[int, float]:
    """Token -> probability after temperature, min-p, top-k, top-p (no ties in inputs)."""
    scaled = [v / params.temperature for v in logits]
    peak = max(scaled)
    weights = {t: math.exp(v - peak) for t, v in enumerate(scaled)}
    total = sum(weights.values())
    probs = {t: w / total for t, w in weights.items()}
    top = max(probs.values())
    probs = {t: p for t, p in probs.items() if p >= params.min_p * top}
    ranked = sorted(probs, key=lambda t: -probs[t])
    if params.top_k > 0:
        ranked = ranked[:params.top_k]
    total = sum(probs[t] for t in ranked)
    kept: list[int] = []
    mass = 0.0
    for t in ranked:
        kept.append(t)
        mass += probs[t] / total
        if mass >= params.top_p:
            break
    total = sum(probs[t] for t in kept)
    return {t: probs[t] / total for t in kept}


def _chi_square(counts: Counter[int], expected: dict[int, float], n: int) -> float:
    assert set(counts) <= set(expected), f"sampled outside the allowed set: {set(counts) - set(expected)}"
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in expected.items())


def _draw_many(logits_row: list[float], params: SamplingParams, n: int, seed: int = 0) -> Counter[int]:
    """n draws in one batch of n identical rows (the unseeded batched path)."""
    sampler = Sampler(seed=seed)
    logits = torch.tensor([logits_row] * n, dtype=torch.float32)
    out = sampler.sample(logits, [_state(params) for _ in range(n)])
    return Counter(out.token_ids)


# Chi-square critical values at p = 0.001, by degrees of freedom.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}

TINY = [1.3, -0.4, 0.9, 2.1, -1.7, 0.2, 1.6, -0.9]  # V = 8, no ties


def test_greedy_is_argmax_per_row() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 300, generator=gen)
    states = [_state(SamplingParams(temperature=0.0)) for _ in range(64)]
    out = Sampler().sample(logits, states)
    assert out.token_ids == [max(range(300), key=lambda t, r=r: logits[r, t].item()) for r in range(64)]
    assert out.logprobs == [None] * 64


def test_greedy_rows_mixed_with_random_rows_stay_argmax() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(40, 100, generator=gen)
    params = [SamplingParams(temperature=0.0) if r % 2 else SamplingParams(temperature=1.0, top_k=5)
              for r in range(40)]
    out = Sampler().sample(logits, [_state(p) for p in params])
    for r in range(1, 40, 2):
        assert out.token_ids[r] == int(logits[r].argmax())
    for r in range(0, 40, 2):
        assert out.token_ids[r] in set(logits[r].topk(5).indices.tolist())


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_k=1),
                                    SamplingParams(temperature=1.5, top_p=1e-6),
                                    SamplingParams(temperature=1.0, min_p=1.0)],
                         ids=["top_k=1", "top_p tiny", "min_p=1"])
def test_filters_that_keep_one_token_behave_like_greedy(params: SamplingParams) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(200, 50, generator=gen)
    out = Sampler(seed=7).sample(logits, [_state(params) for _ in range(200)])
    assert out.token_ids == logits.argmax(dim=1).tolist()


FILTERS = [
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=0.7, top_p=0.6),
    SamplingParams(temperature=1.3, min_p=0.3),
    SamplingParams(temperature=1.0, min_p=0.1, top_k=5, top_p=0.8),
    SamplingParams(temperature=2.0, top_k=6, top_p=0.9),
]


@pytest.mark.parametrize("params", FILTERS,
                         ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_filtered_sampling_stays_in_the_allowed_set_and_matches_its_distribution(
        params: SamplingParams) -> None:
    n = 20000
    expected = _reference_distribution(TINY, params)
    assert 1 < len(expected) < len(TINY)  # the case really filters, and really samples
    counts = _draw_many(TINY, params, n, seed=11)
    stat = _chi_square(counts, expected, n)
    assert stat < CHI2_999[len(expected) - 1], (counts, expected)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_temperature_sampling_frequencies_approach_softmax(temperature: float) -> None:
    n = 20000
    params = SamplingParams(temperature=temperature)
    expected = _reference_distribution(TINY, params)
    assert len(expected) == len(TINY)
    counts = _draw_many(TINY, params, n, seed=5)
    assert _chi_square(counts, expected, n) < CHI2_999[len(TINY) - 1]
    # The test can tell temperatures apart: T=1's distribution is rejected for T != 1.
    if temperature != 1.0:
        other = _reference_distribution(TINY, SamplingParams(temperature=1.0))
        assert _chi_square(counts, other, n) > 10 * CHI2_999[len(TINY) - 1]


def test_seeded_rows_sample_the_same_distribution() -> None:
    # Per-row draws from each request's generator: 4000 requests with seeds 0..3999.
    params = [SamplingParams(temperature=0.9, top_p=0.95, seed=s) for s in range(4000)]
    sampler = Sampler()
    logits = torch.tensor([TINY] * 4000)
    out = sampler.sample(logits, [_state(p, sampler=sampler) for p in params])
    expected = _reference_distribution(TINY, params[0])
    assert _chi_square(Counter(out.token_ids), expected, 4000) < CHI2_999[len(expected) - 1]


# ---- penalties and min_tokens ----

def test_penalties_match_hand_computed_logits() -> None:
    raw = [2.0, -1.0, 0.5, -3.0, 1.0, 0.0]
    params = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    state = _state(params, prompt=[0, 1, 3], output=[1, 2, 2])
    logits = torch.tensor([raw, raw])
    apply_penalties(logits, [_state(SamplingParams()), state], [1])
    # token 0: prompt, positive -> 2/2.  token 1: prompt+output once, negative -> -1*2 - 0.5 - 0.25.
    # token 2: output twice, positive -> 0.5/2 - 2*0.5 - 0.25.  token 3: prompt, negative -> -3*2.
    expected = [1.0, -2.75, -1.0, -6.0, 1.0, 0.0]
    assert logits[1].tolist() == pytest.approx(expected)
    assert logits[0].tolist() == raw  # rows not listed are untouched


def test_penalties_per_row_match_a_naive_reference() -> None:
    rng = random.Random(4)
    vocab = 40
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(12, vocab, generator=gen) * 3
    states = []
    for _ in range(12):
        params = SamplingParams(repetition_penalty=rng.choice([1.0, 0.7, 1.3]),
                                frequency_penalty=rng.uniform(-2, 2), presence_penalty=rng.uniform(-2, 2))
        states.append(_state(params, prompt=[rng.randrange(vocab) for _ in range(rng.randint(1, 30))],
                             output=[rng.randrange(vocab) for _ in range(rng.randint(0, 30))]))
    expected = logits.double().clone()
    for r, s in enumerate(states):
        counts = Counter(s.output_token_ids)
        for t in set(s.prompt_token_ids) | set(s.output_token_ids):
            v = expected[r, t].item()
            p = s.params.repetition_penalty
            expected[r, t] = v / p if v > 0 else v * p
        for t, c in counts.items():
            expected[r, t] -= s.params.frequency_penalty * c + s.params.presence_penalty
    processed = logits.clone()
    apply_penalties(processed, states, list(range(12)))
    assert torch.allclose(processed.double(), expected, atol=1e-5)
    # Again, with the prompt masks cached by the first call, in another row order.
    order = list(range(11, -1, -1))
    again = logits[order].clone()
    apply_penalties(again, [states[r] for r in order], list(range(12)))
    assert torch.allclose(again.double(), expected[order], atol=1e-5)


def test_penalties_change_the_greedy_choice() -> None:
    # Token 0 leads by 1.0, but it was sampled three times: 3 * 0.5 frequency penalty.
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    plain = Sampler().sample(logits, [_state(SamplingParams(temperature=0), output=[0, 0, 0])])
    penalised = Sampler().sample(
        logits, [_state(SamplingParams(temperature=0, frequency_penalty=0.5), output=[0, 0, 0])])
    assert plain.token_ids == [0]
    assert penalised.token_ids == [1]
    assert logits.tolist() == [[3.0, 2.0, 0.0]]  # the caller's logits are not modified


EOS, STOP = 5, 3


def _min_tokens_pick(output_len: int, ignore_eos: bool = False,
                     model_eos: tuple[int, ...] = ()) -> int:
    # EOS has the largest logit, the stop id the second, token 1 the third.
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0, 0.5, 3.0]])
    params = SamplingParams(temperature=0, min_tokens=3, eos_token_id=EOS, stop_token_ids=(STOP,),
                            ignore_eos=ignore_eos)
    sampler = Sampler(eos_token_ids=model_eos)
    return sampler.sample(logits, [_state(params, output=[4] * output_len)]).token_ids[0]


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    assert [_min_tokens_pick(n) for n in range(5)] == [1, 1, 1, EOS, EOS]
    params = SamplingParams(min_tokens=2, eos_token_id=EOS, stop_token_ids=(STOP, 1))
    logits = torch.zeros(3, 6)
    mask_stop_tokens(logits, [_state(params, output=[0] * n) for n in (1, 2, 3)], [0, 1, 2])
    inf = math.inf
    assert logits.tolist() == [[0, -inf, 0, -inf, 0, -inf], [0] * 6, [0] * 6]


def test_min_tokens_masks_eos_even_with_ignore_eos() -> None:
    # vLLM masks all_stop_token_ids below min_tokens, which hold EOS whether
    # or not the request ignores it.
    assert [_min_tokens_pick(n, ignore_eos=True) for n in (0, 2, 3)] == [1, 1, EOS]
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0, 0.5, 3.0]])
    params = SamplingParams(min_tokens=2, eos_token_id=EOS, stop_token_ids=(STOP,), ignore_eos=True)
    mask_stop_tokens(logits, [_state(params)], [0])
    assert logits.tolist() == [[0.0, 1.0, -1.0, -math.inf, 0.5, -math.inf]]


def test_min_tokens_masks_the_models_other_eos_ids() -> None:
    # Token 1 is one of the model's EOS ids (generation_config.json): masked
    # too, with or without ignore_eos; token 4 comes next.
    assert _min_tokens_pick(0, model_eos=(EOS, 1)) == 4
    assert _min_tokens_pick(0, ignore_eos=True, model_eos=(1,)) == 4
    assert _min_tokens_pick(3, model_eos=(EOS, 1)) == EOS
    logits = torch.zeros(1, 6)
    mask_stop_tokens(logits, [_state(SamplingParams(min_tokens=1))], [0], eos_token_ids=(0, 2, 99))
    assert logits.tolist() == [[-math.inf, 0, -math.inf, 0, 0, 0]]


def test_min_tokens_masking_applies_to_random_rows() -> None:
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0, 0.5, 3.0]] * 500)
    params = SamplingParams(temperature=1.0, min_tokens=1, eos_token_id=EOS, stop_token_ids=(STOP,))
    out = Sampler().sample(logits, [_state(params) for _ in range(500)])
    counts = Counter(out.token_ids)
    assert EOS not in counts and STOP not in counts
    assert set(counts) == {0, 1, 2, 4}


# ---- logprobs ----

def test_logprobs_come_from_raw_logits_with_ranks_and_top_k() -> None:
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(6, 30, generator=gen) * 2
    params = [SamplingParams(temperature=0, logprobs=3, repetition_penalty=1.8),
              SamplingParams(temperature=1.0, logprobs=0, seed=1),
              SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.5, logprobs=5, top_k=10, frequency_penalty=1.0),
              SamplingParams(temperature=1.0, logprobs=30),
              SamplingParams(temperature=1.0, logprobs=2, presence_penalty=2.0)]
    sampler = Sampler()
    states = [_state(p, prompt=[1, 2, 3], output=[4, 4, 5], sampler=sampler) for p in params]
    out = sampler.sample(logits, states)
    assert out.logprobs[2] is None
    for r, p in enumerate(params):
        if p.logprobs is None:
            continue
        entry = out.logprobs[r]
        assert entry is not None
        row = logits[r].double()
        ref = (row - torch.logsumexp(row, dim=0)).tolist()
        token = out.token_ids[r]
        assert next(iter(entry)) == token  # the sampled token comes first
        assert entry[token].logprob == pytest.approx(ref[token], abs=1e-5)
        assert entry[token].rank == 1 + sum(1 for v in ref if v > ref[token])
        top = sorted(range(30), key=lambda t, ref=ref: -ref[t])[:p.logprobs]
        assert set(entry) == set(top) | {token}
        for t in top:
            assert entry[t].logprob == pytest.approx(ref[t], abs=1e-5)
            assert entry[t].rank == top.index(t) + 1


def test_logprob_ranks_count_strictly_greater_values_on_ties() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    out = Sampler().sample(logits, [_state(SamplingParams(temperature=0, logprobs=3))])
    entry = out.logprobs[0]
    assert entry is not None
    assert out.token_ids == [1]
    assert {t: e.rank for t, e in entry.items()} == {1: 1, 2: 1, 0: 3}


# ---- seeds ----

def _run_seeded(sampler: Sampler, seed: int, steps: int, logits: torch.Tensor) -> list[int]:
    state = _state(SamplingParams(temperature=1.0, seed=seed, top_p=0.9), sampler=sampler)
    for step in range(steps):
        state.output_token_ids.append(sampler.sample(logits[step:step + 1], [state]).token_ids[0])
    return state.output_token_ids


def test_same_seed_same_tokens_across_sampler_instances() -> None:
    logits = torch.randn(30, 64, generator=torch.Generator().manual_seed(0))
    a = _run_seeded(Sampler(seed=0), 123, 30, logits)
    b = _run_seeded(Sampler(seed=999), 123, 30, logits)
    c = _run_seeded(Sampler(seed=0), 124, 30, logits)
    assert a == b
    assert a != c


def test_seeded_rows_do_not_depend_on_batch_composition() -> None:
    steps, vocab = 12, 64
    logits = torch.randn(steps, vocab, generator=torch.Generator().manual_seed(1))
    seeded = [SamplingParams(temperature=1.0, seed=s, top_k=20, min_p=0.05) for s in (7, 8)]

    def run(extra: int, shuffle_seed: int) -> dict[int, list[int]]:
        sampler = Sampler(seed=shuffle_seed)
        rng = random.Random(shuffle_seed)
        noise = torch.Generator().manual_seed(shuffle_seed)
        states = [_state(p, sampler=sampler) for p in seeded]
        others = [_state(SamplingParams(temperature=rng.choice([0.0, 0.5, 1.0]),
                                        seed=rng.choice([None, 1000 + k]),
                                        repetition_penalty=rng.choice([1.0, 1.5])), sampler=sampler)
                  for k in range(extra)]
        for step in range(steps):
            batch = states + others[:rng.randint(0, extra)]
            rng.shuffle(batch)
            rows = torch.stack([logits[step] if any(s is x for x in states)
                                else torch.randn(vocab, generator=noise) for s in batch])
            out = sampler.sample(rows, batch)
            for s, t in zip(batch, out.token_ids):
                s.output_token_ids.append(t)
        return {p.seed or 0: s.output_token_ids for p, s in zip(seeded, states)}

    alone = run(0, 0)
    assert alone == run(5, 1) == run(40, 2)
    assert alone[7] != alone[8]


def test_unseeded_sampling_is_deterministic_given_the_sampler_seed() -> None:
    logits = torch.randn(50, 40, generator=torch.Generator().manual_seed(2))
    params = SamplingParams(temperature=1.0)
    a = Sampler(seed=3).sample(logits, [_state(params) for _ in range(50)]).token_ids
    b = Sampler(seed=3).sample(logits, [_state(params) for _ in range(50)]).token_ids
    c = Sampler(seed=4).sample(logits, [_state(params) for _ in range(50)]).token_ids
    assert a == b
    assert a != c


def test_logits_rows_must_match_states() -> None:
    with pytest.raises(ValueError, match=r"logits shape=\(3, 5\)"):
        Sampler().sample(torch.zeros(3, 5), [_state(SamplingParams())])
