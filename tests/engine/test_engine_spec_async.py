"""The engine with n-gram speculative decoding and async scheduling: the
same tokens as the synchronous non-speculative engine (greedy, and seeded
sampling under async scheduling), stop strings and stop tokens inside a
step of several tokens, logprobs per token, the async step API, and the
settings refused with one clear error before any weights load."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from kvsched.cli import main  # noqa: E402
from kvsched.core.output import (  # noqa: E402  # noqa: E402
    CachedRequestData,
    EngineCoreOutput,
    EngineCoreOutputs,
    ModelRunnerOutput,
    SchedulerOutput,
)
from kvsched.engine import core as engine_core  # noqa: E402
from kvsched.engine.core import StepResult  # noqa: E402
from kvsched.engine.detokenizer import load_tokenizer  # noqa: E402
from kvsched.engine.llm import LLM  # noqa: E402
from kvsched.engine.output_processor import OutputProcessor  # noqa: E402
from kvsched.executor.sampler import Logprob  # noqa: E402
from kvsched.request import Request, SamplingParams  # noqa: E402

VOCAB = 512
COMMON: dict[str, Any] = {"max_num_seqs": 8, "max_num_batched_tokens": 96, "kv_cache_memory": "16MiB"}


def ngram(k: int, lo: int | None = 1, hi: int | None = 3, method: str = "ngram") -> dict[str, Any]:
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": k}
    if lo is not None:
        config["prompt_lookup_min"] = lo
    if hi is not None:
        config["prompt_lookup_max"] = hi
    return config


@pytest.fixture(scope="module")
def engines(tiny: Callable[..., Path]) -> Callable[..., LLM]:
    """engines(arch, **engine args) -> an LLM, built once per distinct arguments."""
    made: dict[str, LLM] = {}

    def get(arch: str, **kwargs: Any) -> LLM:
        key = json.dumps([arch, kwargs], sort_keys=True)
        if key not in made:
            made[key] = LLM(str(tiny(arch=arch)), **COMMON, **kwargs)
        return made[key]

    return get


def _generate(llm: LLM, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[Any]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert not llm.has_unfinished_requests() and not llm.engine.batch_queue
    llm.engine.scheduler.check_invariants()
    llm.engine.runner.check_invariants()
    return outs


def _tokens(outs: list[Any]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


@st.composite
def repetitive_prompts(draw: st.DrawFn) -> list[list[int]]:
    prompts = []
    for _ in range(draw(st.integers(1, 4))):
        unit = draw(st.lists(st.integers(4, VOCAB - 1), min_size=1, max_size=6))
        body = unit * draw(st.integers(1, 8))
        tail = draw(st.lists(st.integers(4, VOCAB - 1), max_size=4))
        prompts.append((body + tail)[:draw(st.integers(1, 60))])
    return prompts


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(prompts=repetitive_prompts(), arch=st.sampled_from(["llama", "qwen3"]), k=st.integers(1, 5),
       lo=st.integers(1, 4), extra=st.integers(0, 3), async_scheduling=st.booleans(),
       max_tokens=st.integers(1, 24))
def test_speculative_greedy_output_is_the_plain_output(
        engines: Callable[..., LLM], prompts: list[list[int]], arch: str, k: int, lo: int, extra: int,
        async_scheduling: bool, max_tokens: int) -> None:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    plain = _tokens(_generate(engines(arch), prompts, params))
    if async_scheduling:
        spec = engines(arch, async_scheduling=True, speculative_config=ngram(k, lo, lo + extra, "ngram_gpu"))
    else:
        spec = engines(arch, speculative_config=ngram(k, lo, lo + extra))
    assert _tokens(_generate(spec, prompts, params)) == plain


def _repeating(seed: int, n: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        unit = [rng.randrange(4, VOCAB) for _ in range(rng.randint(2, 5))]
        out.append((unit * 10)[:rng.randint(8, 40)])
    return out


SPEC_VARIANTS = [
    {"speculative_config": ngram(5)},
    {"speculative_config": ngram(3, 1, 2)},
    {"async_scheduling": True},
    {"async_scheduling": True, "speculative_config": ngram(3, method="ngram_gpu")},
]


@pytest.mark.parametrize("variant", SPEC_VARIANTS, ids=["ngram-k5", "ngram-k3", "async", "async-ngram_gpu"])
def test_stop_tokens_stop_strings_and_logprobs_as_without_speculation(
        engines: Callable[..., LLM], variant: dict[str, Any]) -> None:
    """Stops inside a step that appended several tokens keep the tokens up
    to the stop (the scheduler cuts at a stop token or the length cap, the
    output processor at the token completing a stop string)."""
    prompts = _repeating(1, 6)
    base = engines("qwen3")
    full = _tokens(_generate(base, prompts, SamplingParams(max_tokens=30, temperature=0.0,
                                                           ignore_eos=True)))
    tokenizer = base.get_tokenizer()
    params = []
    for i, out in enumerate(full):
        cut = 6 + 3 * i
        if i % 3 == 0:  # a stop token id from the middle of the output
            params.append(SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[out[cut]],
                                         logprobs=2))
        elif i % 3 == 1:  # a stop string: the text of two tokens from the middle
            text = tokenizer.decode(out[cut:cut + 2])
            params.append(SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                                         stop=[text] if text.strip() else [], logprobs=1))
        else:
            params.append(SamplingParams(max_tokens=cut, temperature=0.0, ignore_eos=True))
    expected = _generate(base, prompts, params)
    got = _generate(engines("qwen3", **variant), prompts, params)
    for e, g in zip(expected, got):
        ec, gc = e.outputs[0], g.outputs[0]
        assert (gc.token_ids, gc.text, gc.finish_reason, gc.stop_reason) == (
            ec.token_ids, ec.text, ec.finish_reason, ec.stop_reason)
        if ec.logprobs is None:
            assert gc.logprobs is None
            continue
        assert len(gc.logprobs) == len(ec.logprobs) == len(ec.token_ids)
        for t, le, lg in zip(ec.token_ids, ec.logprobs, gc.logprobs):
            assert le.keys() == lg.keys()
            assert lg[t].logprob == pytest.approx(le[t].logprob, abs=1e-4)
        assert gc.cumulative_logprob == pytest.approx(ec.cumulative_logprob, abs=1e-3)
    stats = engines("qwen3", **variant).engine.spec_decoding_stats
    if "speculative_config" in variant:
        assert stats is not None and stats.num_accepted_tokens > 0


def _step_entries(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Drive the engine step by step; per request, how many tokens each step
    that gave it tokens appended."""
    ids = [llm.add_request({"prompt_token_ids": p}, params) for p in prompts]
    seen = dict.fromkeys(ids, 0)
    entries: dict[str, list[int]] = {rid: [] for rid in ids}
    while llm.has_unfinished_requests():
        for out in llm.step():
            n = len(out.outputs[0].token_ids)
            entries[out.request_id].append(n - seen[out.request_id])
            seen[out.request_id] = n
    return [entries[rid] for rid in ids]


def test_stops_inside_a_step_of_several_tokens(engines: Callable[..., LLM]) -> None:
    """The length cap and a stop string each land strictly inside a step
    that appended several tokens (found by a first run): the tokens after
    the stop are dropped, as vLLM does, and the outputs are the plain
    engine's. (A stop token id cannot be placed so: an accepted draft
    copies a token the output already had, which would have stopped it.)"""
    variant = {"speculative_config": ngram(5, 1, 4)}
    prompts = _repeating(4, 8)
    probe = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full = _tokens(_generate(engines("qwen3"), prompts, probe))
    entries = _step_entries(engines("qwen3", **variant), prompts, probe)
    tokenizer = engines("qwen3").get_tokenizer()
    cases: list[tuple[int, SamplingParams]] = []
    for i, (out, sizes) in enumerate(zip(full, entries)):
        assert sum(sizes) == len(out) == 30
        # Positions that are not the last token of their step.
        inner, end = [], 0
        for size in sizes:
            inner.extend(range(end, end + size - 1))
            end += size
        if inner:
            cases.append((i, SamplingParams(max_tokens=inner[0] + 1, temperature=0.0, ignore_eos=True)))
        stop = _first_stop_string_ending_at(tokenizer, out, inner)
        if stop is not None:
            cases.append((i, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                                            stop=[stop], include_stop_str_in_output=i % 2 == 0)))
    kinds = {"stop" if params.stop else "length" for _, params in cases}
    assert kinds == {"stop", "length"}, cases
    case_prompts = [prompts[i] for i, _ in cases]
    case_params = [params for _, params in cases]
    expected = _generate(engines("qwen3"), case_prompts, case_params)
    got = _generate(engines("qwen3", **variant), case_prompts, case_params)
    for (_, params), e, g in zip(cases, expected, got):
        ec, gc = e.outputs[0], g.outputs[0]
        assert (gc.token_ids, gc.text, gc.finish_reason, gc.stop_reason) == (
            ec.token_ids, ec.text, ec.finish_reason, ec.stop_reason)
        assert ec.finish_reason == ("stop" if params.stop else "length") and len(ec.token_ids) < 30


def _first_stop_string_ending_at(tokenizer: Any, out: list[int], positions: list[int]) -> str | None:
    """A text that first appears in the output ending with the token at one
    of ``positions`` (so a stop string completes exactly there)."""
    for cut in positions:
        text = tokenizer.decode(out[:cut + 1])
        if "\ufffd" in text or not text.startswith(tokenizer.decode(out[:cut])):
            continue
        for j in range(cut, -1, -1):
            piece = tokenizer.decode(out[j:cut + 1])
            if piece.strip() and text.endswith(piece) and text.find(piece) == len(text) - len(piece):
                return piece
    return None


def test_seeded_sampling_under_async_scheduling_is_the_synchronous_one(
        engines: Callable[..., LLM]) -> None:
    """A seeded request draws from its own generator once per token, and
    async scheduling computes the same tokens: the same samples."""
    prompts = _repeating(2, 6)
    params = [SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, seed=7 + i,
                             repetition_penalty=1.1, ignore_eos=True) for i in range(6)]
    sync = _tokens(_generate(engines("llama"), prompts, params))
    assert _tokens(_generate(engines("llama", async_scheduling=True), prompts, params)) == sync


def test_async_step_api_and_abort(engines: Callable[..., LLM]) -> None:
    llm = engines("llama", async_scheduling=True)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    rid = llm.add_request({"prompt_token_ids": _repeating(3, 1)[0]}, params)
    # The first step only fills the batch queue; the second applies the first batch.
    assert llm.step() == [] and len(llm.engine.batch_queue) == 1
    assert llm.engine.scheduler.num_steps_in_flight == 1
    outs = llm.step()
    assert [o.request_id for o in outs] == [rid] and len(outs[0].outputs[0].token_ids) == 1
    assert len(llm.engine.batch_queue) == 1  # the next batch is in flight
    # Abort with a batch in flight: its tokens are dropped when it is applied.
    (aborted,) = llm.abort(rid)
    assert aborted.outputs[0].finish_reason == "abort"
    assert llm.has_unfinished_requests()  # the batch in flight is still to apply
    while llm.has_unfinished_requests():
        assert llm.step() == []
    llm.step()  # hands the finished id to the runner
    assert llm.engine.runner.requests == {} and not llm.engine.batch_queue


def test_the_output_processor_keeps_tokens_up_to_the_stop(tiny: Callable[..., Path]) -> None:
    """A hand-made step giving two requests three tokens each: one stopped by
    the scheduler at the second (a stop token: the EngineCoreOutput keeps
    two), one whose stop string the second token completes."""
    tokenizer = load_tokenizer(tiny(arch="llama"))
    processor = OutputProcessor(tokenizer)
    a_ids = tokenizer.encode(" one two three").ids[:3]
    b_ids = tokenizer.encode(" red green blue").ids[:3]
    stop = tokenizer.decode(b_ids[1:2]).strip()
    ra = Request("a", [5, 6], SamplingParams(max_tokens=9, stop_token_ids=(a_ids[1],), logprobs=0))
    rb = Request("b", [5, 6], SamplingParams(max_tokens=9, stop=(stop,), logprobs=0))
    for r in (ra, rb):
        processor.add_request(r, None, 0.0)

    def lps(tokens: list[int]) -> list[dict[int, Logprob]]:
        return [{t: Logprob(-0.5, 1)} for t in tokens]

    mro = ModelRunnerOutput(["a", "b"], [list(a_ids), list(b_ids)], [lps(a_ids), lps(b_ids)])
    core = EngineCoreOutputs(mro, [EngineCoreOutput("a", list(a_ids[:2]), "stop", a_ids[1])], [])
    so = SchedulerOutput([], CachedRequestData(), {"a": 3, "b": 3}, 6, set(), set())
    outs, stopped = processor.process(StepResult(so, so, mro, core), 1.0)
    by_id = {o.request_id: o.outputs[0] for o in outs}
    assert by_id["a"].token_ids == a_ids[:2] and by_id["a"].finish_reason == "stop"
    assert len(by_id["a"].logprobs or []) == 2 and by_id["a"].cumulative_logprob == -1.0
    assert by_id["b"].token_ids == b_ids[:2] and by_id["b"].stop_reason == stop
    assert len(by_id["b"].logprobs or []) == 2
    assert stopped == ["b"] and processor.states == {}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"speculative_config": {"method": "eagle", "num_speculative_tokens": 2}},
     r"speculative_config\.method='eagle': eagle/mtp need a drafter model kvsched's engine does not run"),
    ({"speculative_config": '{"method": "mtp", "num_speculative_tokens": 1}'}, "drafter model"),
    ({"speculative_config": ngram(2, method="ngram_gpu")}, r"'ngram_gpu'.*only with async scheduling"),
    ({"speculative_config": '{"method": "ngram", "num_speculative_tokens": }'},
     r"speculative_config: not valid JSON"),
    ({"speculative_config": "[3]"}, r"speculative_config=\[3\]: must be a JSON object"),
    ({"speculative_config": {"method": "ngram", "num_spec_tokens": 2}},
     r"speculative_config\.num_spec_tokens: unknown key; did you mean 'num_speculative_tokens'"),
    ({"speculative_config": {"num_speculative_tokens": 2}}, r"speculative_config\.method: missing"),
    ({"speculative_config": {"method": "ngram"}}, r"speculative_config\.num_speculative_tokens: missing"),
    ({"speculative_config": {"method": "ngarm", "num_speculative_tokens": 2}},
     r"unknown speculative method; did you mean 'ngram'"),
    ({"speculative_config": ngram(0)}, r"speculative_config\.num_speculative_tokens=0"),
    ({"speculative_config": ngram(2, 4, 2)}, r"speculative_config\.prompt_lookup_min=4: exceeds"),
    ({"speculative_config": ngram(4), "max_num_seqs": 2, "max_num_batched_tokens": 4},
     r"max_num_batched_tokens=4: below 1 \+ num_speculative_tokens"),
    ({"async_scheduling": "yes"}, r"async_scheduling='yes': must be True or False"),
])
def test_bad_settings_fail_before_the_weights_load(
        tiny: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, kwargs: dict[str, Any],
        match: str) -> None:
    def no_weights(*args: Any) -> Any:
        raise AssertionError("the weights were loaded before the settings were checked")

    monkeypatch.setattr(engine_core, "load_model", no_weights)
    with pytest.raises(ValueError, match=match):
        LLM(str(tiny(arch="llama")), **kwargs)


def test_generate_command_with_speculation_and_async(tiny: Callable[..., Path], tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tiny(arch="llama"))
    base = ["generate", "--model", model, "--prompt", "the cat the cat the cat", "--max-tokens", "8",
            "--temperature", "0", "--ignore-eos", "--no-progress", "--kv-cache-memory", "8MiB"]
    rows = []
    # The engine follows the default release, vLLM 0.34, which runs "ngram"
    # with async scheduling as its GPU n-gram speculator (0.33 refused the
    # pair: tests/core/test_spec_async.py pins that).
    for extra in ([], ["--speculative-config", json.dumps(ngram(3))],
                  ["--async-scheduling"],
                  ["--async-scheduling", "--speculative-config", json.dumps(ngram(2, method="ngram_gpu"))],
                  ["--async-scheduling", "--speculative-config", json.dumps(ngram(2))]):
        out = tmp_path / "o.json"
        assert main([*base, *extra, "--output-json", str(out)]) == 0
        rows.append(json.loads(out.read_text())[0]["token_ids"])
    assert all(r == rows[0] and len(r) == 8 for r in rows)
    capsys.readouterr()
    assert main([*base, "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}']) == 2
    assert "eagle/mtp need a drafter model" in capsys.readouterr().err
