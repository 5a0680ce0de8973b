"""``kvsched serve`` end to end, driven by the ``openai`` client over a real socket:
greedy outputs equal the offline engine's token for token, streaming or not,
alone or concurrent; usage, /metrics, errors, aborts."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvsched.engine.llm import LLM
from kvsched.engine.outputs import CompletionOutput
from kvsched.request import SamplingParams
from tests.serve.conftest import ENGINE_ARGS, Running, start_server

PROMPTS = ["hello world", "the quick brown fox", "a", "kv cache blocks and the scheduler"]


@pytest.fixture(scope="module")
def offline(chat_model: Path) -> LLM:
    return LLM(str(chat_model), **ENGINE_ARGS)


def reference_outputs(llm: LLM, prompts: list[Any], max_tokens: int) -> list[CompletionOutput]:
    """The offline engine's greedy outputs."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def reference(llm: LLM, prompts: list[Any], max_tokens: int) -> list[list[int]]:
    return [o.token_ids for o in reference_outputs(llm, prompts, max_tokens)]


def client(running: Running, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url, api_key=kwargs.pop("api_key", "none"),
                         max_retries=0, timeout=120, **kwargs)


def metrics(running: Running) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{running.url}/metrics", timeout=60) as resp:
        text = resp.read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name",
                                                                                       "engine")))):
            s.value for family in text_string_to_metric_families(text) for s in family.samples}


def post(running: Running, path: str, body: Any, headers: dict[str, str] | None = None
         ) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{running.url}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_completions_match_offline_engine(served: Running, offline: LLM) -> None:
    expected = reference_outputs(offline, PROMPTS, 12)
    c = client(served)
    for prompt, want_out in zip(PROMPTS, expected):
        want = want_out.token_ids
        r = c.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                 extra_body={"ignore_eos": True, "return_token_ids": True})
        choice = r.choices[0]
        assert choice.model_extra is not None
        assert choice.model_extra["token_ids"] == want
        assert choice.finish_reason == "length"
        assert choice.text == want_out.text
        prompt_ids = offline.tokenizer.encode(prompt).ids
        assert choice.model_extra["prompt_token_ids"] == prompt_ids
        assert r.usage is not None
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
            len(prompt_ids), 12, len(prompt_ids) + 12)


def test_token_id_prompt_and_streaming_with_usage(served: Running, offline: LLM) -> None:
    prompt = [5, 77, 300, 41, 9, 9, 120]
    [want_out] = reference_outputs(offline, [{"prompt_token_ids": prompt}], 10)
    want = want_out.token_ids
    chunks = list(client(served).completions.create(
        model="tiny", prompt=prompt, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, "return_token_ids": True}))
    *token_chunks, last = chunks
    got = [t for ch in token_chunks for t in ch.choices[0].model_extra["token_ids"]]
    assert got == want
    assert "".join(ch.choices[0].text for ch in token_chunks) == want_out.text
    assert [ch.choices[0].finish_reason for ch in token_chunks][-1] == "length"
    assert all(ch.usage is None for ch in token_chunks)
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (7, 10)


def test_n_choices_are_vllms_parallel_sampling(served: Running, offline: LLM) -> None:
    # Choice i is a request of its own with seed + i (vLLM's ParentRequest),
    # so each equals the offline engine run with that seed.
    prompt = [5, 77, 300, 41, 9]
    want = [offline.generate([{"prompt_token_ids": prompt}],
                             SamplingParams(max_tokens=6, temperature=1.0, seed=40 + i, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0].token_ids for i in range(3)]
    assert len({tuple(w) for w in want}) > 1  # the seeds differ, so do the choices
    r = client(served).completions.create(
        model="tiny", prompt=prompt, max_tokens=6, temperature=1.0, seed=40, n=3,
        extra_body={"ignore_eos": True, "return_token_ids": True})
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.model_extra["token_ids"] for c in r.choices] == want
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (5, 18)
    # Streaming chat: the choices' chunks interleave, each carries its index.
    chunks = list(client(served).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5, temperature=0, n=2,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *token_chunks, last = chunks
    texts = ["", ""]
    for ch in token_chunks:
        for choice in ch.choices:
            texts[choice.index] += choice.delta.content or ""
    whole = client(served).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True})
    assert texts == [whole.choices[0].message.content] * 2  # greedy: both choices alike
    assert last.usage is not None and last.usage.completion_tokens == 10
    assert served.server.engine.wait_idle(60)
    assert served.server.engine.llm.engine.scheduler.kv_cache_manager.usage == 0


def test_concurrent_requests_match_offline_engine(served: Running, offline: LLM) -> None:
    prompts = [f"request number {i} asks" + " more" * i for i in range(8)]
    expected = reference(offline, prompts, 16)
    aclient = openai.AsyncOpenAI(base_url=served.base_url, api_key="none", max_retries=0, timeout=120)

    async def one(i: int) -> list[int]:
        extra = {"ignore_eos": True, "return_token_ids": True}
        if i % 2:
            stream = await aclient.completions.create(model="tiny", prompt=prompts[i], max_tokens=16,
                                                      temperature=0, stream=True, extra_body=extra)
            return [t async for ch in stream for t in ch.choices[0].model_extra["token_ids"]]
        r = await aclient.completions.create(model="tiny", prompt=prompts[i], max_tokens=16,
                                             temperature=0, extra_body=extra)
        return list(r.choices[0].model_extra["token_ids"])

    async def run_all() -> list[list[int]]:
        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    assert asyncio.run(run_all()) == expected


@pytest.mark.parametrize("engine_args", [
    {"async_scheduling": True},
    {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3}},
    {"enable_prefix_caching": False, "max_num_batched_tokens": 16},
], ids=["async_scheduling", "ngram", "chunked_no_prefix_cache"])
def test_engine_flags_keep_outputs(chat_model: Path, offline: LLM, engine_args: dict[str, Any]) -> None:
    """vLLM's engine flags reach the served engine, and greedy outputs stay the
    offline engine's (default flags) token for token."""
    prompts = [f"again {i}" + " and again" * (3 * i) for i in range(4)]
    expected = reference(offline, prompts, 12)
    running = start_server(chat_model, engine_args)
    try:
        config = running.server.engine.llm.engine
        assert config.async_scheduling == engine_args.get("async_scheduling", False)
        aclient = openai.AsyncOpenAI(base_url=running.base_url, api_key="none", max_retries=0,
                                     timeout=120)

        async def one(prompt: str) -> list[int]:
            r = await aclient.completions.create(
                model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            return list(r.choices[0].model_extra["token_ids"])

        async def run_all() -> list[list[int]]:
            return list(await asyncio.gather(*(one(p) for p in prompts)))

        assert asyncio.run(run_all()) == expected
    finally:
        running.stop()


def test_stop_strings_and_stop_token_ids(served: Running, offline: LLM) -> None:
    [full] = reference_outputs(offline, ["stop me"], 12)
    stop_id = full.token_ids[5]
    cut = full.token_ids.index(stop_id)  # the first time it comes
    r = client(served).completions.create(
        model="tiny", prompt="stop me", max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [stop_id], "return_token_ids": True})
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.model_extra["stop_reason"] == stop_id
    assert choice.model_extra["token_ids"] == full.token_ids[:cut + 1]
    text = full.text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    [want] = offline.generate(["stop me"], params, use_tqdm=False)
    r = client(served).completions.create(model="tiny", prompt="stop me", max_tokens=12,
                                          temperature=0, stop=stop, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == want.outputs[0].text
    assert not r.choices[0].text.endswith(stop)


def test_chat_uses_the_chat_template(served: Running, offline: LLM) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    # What the template in conftest renders, written out by hand.
    rendered = "<s><|system|>be brief\n<|user|>hi there\n<|assistant|>"
    ids = offline.tokenizer.encode(rendered, add_special_tokens=False).ids
    [want_out] = reference_outputs(offline, [{"prompt_token_ids": ids}], 8)
    want = want_out.token_ids
    c = client(served)
    r = c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True, "return_token_ids": True})
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].model_extra["token_ids"] == want
    assert r.choices[0].message.content == want_out.text
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    stream = c.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=8,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_logprobs(served: Running, offline: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=2)
    [out] = offline.generate(["hello world"], params, use_tqdm=False)
    want = [entry[t].logprob for t, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs)]
    r = client(served).completions.create(model="tiny", prompt="hello world", max_tokens=4,
                                          temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert lp is not None and lp.token_logprobs == pytest.approx(want)
    assert lp.top_logprobs is not None and all(len(top) == 2 for top in lp.top_logprobs)
    # Greedy: the sampled token is the best one.
    assert all(max(top.values()) == pytest.approx(v) for top, v in zip(lp.top_logprobs, want))
    chat = client(served).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 3 for t in content)


def test_logprobs_name_tokens_by_id_on_request(served: Running, offline: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=2)
    [out] = offline.generate([{"prompt_token_ids": [7, 8, 9, 10]}], params, use_tqdm=False)
    ids = out.outputs[0].token_ids
    r = client(served).completions.create(
        model="tiny", prompt=[7, 8, 9, 10], max_tokens=3, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens == [f"token_id:{t}" for t in ids]
    assert lp.top_logprobs is not None
    for t, top, entry in zip(ids, lp.top_logprobs, out.outputs[0].logprobs):
        assert set(top) == {f"token_id:{i}" for i, e in entry.items() if e.rank <= 2}
        assert top[f"token_id:{t}"] == pytest.approx(entry[t].logprob)
    chat = client(served).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=2, temperature=0,
        logprobs=True, top_logprobs=1, extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    assert all(t.token.startswith("token_id:") for t in chat.choices[0].logprobs.content)


def test_models_health_and_metrics_count_requests(served: Running) -> None:
    models = client(served).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    with urllib.request.urlopen(f"{served.url}/health", timeout=60) as resp:
        assert resp.status == 200
    before = metrics(served)
    c = client(served)
    for n in (3, 5):
        c.completions.create(model="tiny", prompt="count me", max_tokens=n, temperature=0,
                             extra_body={"ignore_eos": True})
    after = metrics(served)
    prompt_len = len(served.server.engine.llm.tokenizer.encode("count me").ids)

    def delta(name: str, *labels: tuple[str, str]) -> float:
        key = (name, tuple(sorted(labels)))
        return after[key] - before.get(key, 0.0)

    assert delta("vllm:request_success_total", ("finished_reason", "length")) == 2
    assert delta("vllm:generation_tokens_total") == 8
    assert delta("vllm:prompt_tokens_total") == 2 * prompt_len
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    assert delta("vllm:inter_token_latency_seconds_count") == 2 + 4
    assert after[("vllm:num_requests_running", ())] == 0
    assert ("vllm:kv_cache_usage_perc", ()) in after


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"prompt": "x", "temperature": -1}, 400, None),
    ({"prompt": "x", "top_p": 0}, 400, None),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "echo": True}, 400, "echo"),
    ({"prompt": "x", "guided_json": {"type": "object"}}, 400, "guided_json"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "priority": "high"}, 400, "priority"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": [1, 10**9]}, 400, None),  # a token id outside the vocabulary
    ({"prompt": list(range(8192))}, 400, "prompt"),  # longer than max_model_len
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({}, 400, "prompt"),
])
def test_bad_requests_get_openai_error_bodies(served: Running, body: dict[str, Any], status: int,
                                              param: str | None) -> None:
    code, reply = post(served, "/v1/completions", body)
    assert code == status
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param and error["message"]
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]


def test_malformed_json_and_unknown_route(served: Running) -> None:
    code, reply = post(served, "/v1/completions", b"{not json")
    assert code == 400 and "not valid JSON" in reply["error"]["message"]
    code, reply = post(served, "/v1/nothing", {})
    assert code == 404 and reply["error"]["type"] == "NotFoundError"
    with pytest.raises(openai.BadRequestError) as err:
        client(served).chat.completions.create(model="tiny", messages=[], max_tokens=2)
    assert err.value.status_code == 400


@pytest.fixture(params=[False, True], ids=["sync", "async_scheduling"])
def one_slot(tiny: Callable[..., Path], request: pytest.FixtureRequest) -> Iterator[Running]:
    """A server holding one request at most, with an API key, on a checkpoint
    without a chat template; synchronous or async scheduling (an abort may
    find a batch in flight)."""
    running = start_server(tiny(max_position_embeddings=8192), {"async_scheduling": request.param},
                           max_pending_requests=1, api_key="sesame")
    yield running
    running.stop()


def test_overload_answered_and_disconnect_aborts(one_slot: Running) -> None:
    c = client(one_slot, api_key="sesame")
    engine = one_slot.server.engine
    scheduler = engine.llm.engine.scheduler
    stream = c.completions.create(model="tiny", prompt="a long one", max_tokens=8000, stream=True,
                                  temperature=0, extra_body={"ignore_eos": True})
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    # The one slot is taken: the next request is refused at once, not queued.
    with pytest.raises(openai.InternalServerError) as err:
        c.completions.create(model="tiny", prompt="me too", max_tokens=2)
    assert err.value.status_code == 503
    assert "overloaded" in str(err.value)
    # The client goes away: the engine aborts the request and frees its blocks.
    stream.close()
    assert engine.wait_idle(timeout=120)
    assert scheduler.get_num_unfinished_requests() == 0
    assert scheduler.kv_cache_manager.usage == 0.0
    assert engine.num_pending == 0
    m = metrics(one_slot)
    assert m[("vllm:request_success_total", (("finished_reason", "abort"),))] == 1
    assert m[("vllm:request_success_total", (("finished_reason", "length"),))] == 0
    # The slot is free again.
    r = c.completions.create(model="tiny", prompt="me too", max_tokens=2)
    assert r.usage is not None and r.usage.completion_tokens == 2


def test_api_key_and_missing_chat_template(one_slot: Running) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(one_slot, api_key="wrong").models.list()
    with urllib.request.urlopen(f"{one_slot.url}/health", timeout=60) as resp:
        assert resp.status == 200  # not behind the key, as in vLLM
    code, reply = post(one_slot, "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "hi"}]},
                       {"Authorization": "Bearer sesame"})
    assert code == 400 and "--chat-template" in reply["error"]["message"]


def test_served_engine_takes_vllm_api_server_batch_defaults(served: Running, offline: LLM) -> None:
    # vLLM on CPU: 2048 batched tokens served (SchedulerConfig's default), 4096 offline.
    assert served.server.engine.llm.engine.scheduler_config.max_num_batched_tokens == 2048
    assert offline.engine.scheduler_config.max_num_batched_tokens == 4096


def test_reset_prefix_cache_forgets_hits_and_fails_while_blocks_are_held(served: Running) -> None:
    """vLLM's dev endpoint: {"success": true} when idle, after which a repeated
    prompt finds nothing cached; {"success": false} while a request holds blocks."""
    c = client(served)
    # 128 tokens: 2 blocks of 64 (the default release's, vLLM 0.34, block on a CPU).
    prompt = list(range(100, 228))

    def hits_of_one_request() -> float:
        before = metrics(served)[("vllm:prefix_cache_hits_total", ())]
        c.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0,
                             extra_body={"ignore_eos": True})
        return metrics(served)[("vllm:prefix_cache_hits_total", ())] - before

    assert post(served, "/reset_prefix_cache", b"") == (200, {"success": True})
    assert hits_of_one_request() == 0
    # The last prompt token is always computed: 1 of its 2 blocks hits.
    assert hits_of_one_request() == 64
    assert post(served, "/reset_prefix_cache", b"") == (200, {"success": True})
    assert hits_of_one_request() == 0
    stream = c.completions.create(model="tiny", prompt="a long one", max_tokens=4000, stream=True,
                                  temperature=0, extra_body={"ignore_eos": True})
    next(iter(stream))  # running: it holds blocks
    assert post(served, "/reset_prefix_cache", b"") == (200, {"success": False})
    stream.close()
    assert served.server.engine.wait_idle(timeout=120)
    assert post(served, "/reset_prefix_cache", b"") == (200, {"success": True})
    code, reply = post(served, "/reset_prefix_cache?reset_running_requests=true", b"")
    assert code == 400 and reply["error"]["param"] == "reset_running_requests"


def test_llm_reset_prefix_cache_only_when_no_request_holds_blocks(offline: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    offline.add_request({"prompt_token_ids": list(range(200, 240))}, params, request_id="held")
    offline.step()  # scheduled: its blocks are allocated
    assert offline.reset_prefix_cache() is False
    while offline.has_unfinished_requests():
        offline.step()
    assert offline.reset_prefix_cache() is True
    assert offline.engine.scheduler.kv_cache_manager.block_pool.cached == {}
