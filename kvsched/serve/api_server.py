"""The OpenAI-compatible HTTP API (FastAPI): completions, chat, models, health, metrics.

Request and response shapes are OpenAI's, with vLLM's extensions (its
sampling fields, ``stop_reason``). Streams are server-sent events
(``data: {json}\\n\\n`` per chunk, then ``data: [DONE]``). A request whose
client disconnects is aborted in the engine, streaming or not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvsched.engine.llm import LLM, PromptType
from kvsched.engine.outputs import RequestOutput
from kvsched.request import SamplingParams
from kvsched.serve.async_engine import AsyncEngine, RequestStream
from kvsched.serve.chat import ChatTemplate, read_messages
from kvsched.serve.errors import ApiError, error_body
from kvsched.serve.protocol import (
    chat_logprobs,
    check_model,
    check_response_format,
    completion_logprobs,
    field,
    read_completion_prompt,
    read_n,
    read_stream,
    refuse_unsupported,
    sampling_params,
)

T = TypeVar("T")

# Structured output (OpenAI's response_format, vLLM's guided_* and
# structured_outputs) needs a grammar engine kvsched does not have.
_STRUCTURED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")
_COMPLETION_UNSUPPORTED = ("echo", "suffix", "logit_bias", "prompt_logprobs", *_STRUCTURED)
_CHAT_UNSUPPORTED = ("tools", "functions", "logit_bias", "prompt_logprobs", "continue_final_message",
                     *_STRUCTURED)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    served_model_name: str
    model_path: str
    api_key: str | None
    chat_template: ChatTemplate | None


class ClientDisconnected(Exception):
    pass


def build_app(engine: AsyncEngine, config: ServerConfig) -> FastAPI:
    """The ASGI app. The caller starts and stops ``engine`` (its thread)."""
    app = FastAPI(title="kvsched serve", docs_url=None, redoc_url=None, openapi_url=None)
    llm = engine.llm
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it: the client has gone

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(err.detail), err.status_code), status_code=err.status_code)

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Callable[[Request], Awaitable[Response]]
                            ) -> Response:
        # vLLM's --api-key: every /v1 route wants "Authorization: Bearer KEY".
        if config.api_key is not None and request.url.path.startswith("/v1"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {config.api_key}".encode()):
                return JSONResponse(error_body("Unauthorized: give 'Authorization: Bearer <api key>'",
                                               401), status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health() -> Response:
        if engine.error is not None:
            return JSONResponse(error_body(f"the engine has stopped: {engine.error}", 500),
                                status_code=500)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> dict[str, bool]:
        # vLLM's dev endpoint (VLLM_SERVER_DEV_MODE), for benchmarks: {"success": false}
        # while a request holds blocks (retry once it has finished).
        for name in ("reset_running_requests", "reset_external"):
            if request.query_params.get(name, "false").lower() not in ("false", "0"):
                raise ApiError(f"{name}={request.query_params[name]}: kvsched serve resets only "
                               "an idle prefix cache; leave it out", param=name)
        return {"success": await engine.reset_prefix_cache()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": config.served_model_name, "object": "model", "created": created,
            "owned_by": "kvsched", "root": config.model_path, "parent": None,
            "max_model_len": llm.engine.scheduler_config.max_model_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _request_body(request, config.served_model_name, _COMPLETION_UNSUPPORTED)
        prompt = read_completion_prompt(body)
        token_ids = prompt if isinstance(prompt, list) else llm.tokenizer.encode(prompt).ids
        text = prompt if isinstance(prompt, str) else None
        num_logprobs = completion_logprobs(body)
        params = _params(llm, body, "max_tokens", num_logprobs, len(token_ids))
        engine_prompt: PromptType = {"prompt_token_ids": token_ids, "prompt": text}
        return await _answer(request, engine, body, f"cmpl-{uuid.uuid4().hex}", engine_prompt, params,
                             _CompletionChunks, config.served_model_name, num_logprobs)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _request_body(request, config.served_model_name, _CHAT_UNSUPPORTED)
        if config.chat_template is None:
            raise ApiError("this model has no chat template (tokenizer_config.json has no "
                           "chat_template); start the server with --chat-template FILE, or use "
                           "/v1/completions", param="messages")
        messages = read_messages(body)
        add_generation_prompt = field(body, "add_generation_prompt", (bool,), "true or false")
        extra = field(body, "chat_template_kwargs", (dict,), "an object") or {}
        prompt = config.chat_template.render(
            messages, True if add_generation_prompt is None else add_generation_prompt, extra)
        # The template writes the special tokens itself (vLLM: add_special_tokens=False).
        token_ids = llm.tokenizer.encode(prompt, add_special_tokens=False).ids
        if not token_ids:
            raise ApiError("messages: the chat template rendered an empty prompt", param="messages")
        num_logprobs = chat_logprobs(body)
        params = _params(llm, body, "max_completion_tokens", num_logprobs, len(token_ids))
        return await _answer(request, engine, body, f"chatcmpl-{uuid.uuid4().hex}",
                             {"prompt_token_ids": token_ids, "prompt": prompt}, params, _ChatChunks,
                             config.served_model_name, num_logprobs)

    return app


async def _request_body(request: Request, served_model_name: str,
                        unsupported: tuple[str, ...]) -> dict[str, Any]:
    """A generation request's JSON body, with what both endpoints check
    first: the model's name, the fields kvsched refuses on this endpoint
    and the response format."""
    body = await _json_body(request)
    check_model(body, served_model_name)
    refuse_unsupported(body, unsupported)
    check_response_format(body)
    return body


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(f"the request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    return body


def _priority(body: dict[str, Any]) -> int:
    """vLLM's ``priority`` field (lower runs first under --scheduling-policy priority)."""
    value: int | None = field(body, "priority", (int,), "an integer")
    return 0 if value is None else value


def _return_token_ids(body: dict[str, Any]) -> bool:
    return bool(field(body, "return_token_ids", (bool,), "true or false"))


def _tokens_as_token_ids(body: dict[str, Any]) -> bool:
    return bool(field(body, "return_tokens_as_token_ids", (bool,), "true or false"))


def _params(llm: LLM, body: dict[str, Any], max_tokens_field: str, num_logprobs: int | None,
            prompt_len: int) -> SamplingParams:
    max_model_len = llm.engine.scheduler_config.max_model_len
    if prompt_len >= max_model_len:
        raise ApiError(f"prompt: {prompt_len} tokens, at least max_model_len ({max_model_len}); "
                       "shorten it (the model must generate at least one token)", param="prompt")
    # vLLM's default max_tokens: what the context has room for.
    return sampling_params(body, llm.default_sampling_params, max_tokens_field, num_logprobs,
                           max_model_len - prompt_len)


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _submit(engine: AsyncEngine, request_id: str, prompt: PromptType, params: SamplingParams,
            priority: int, n: int) -> list[RequestStream]:
    """One engine request per choice. ``n`` > 1 is vLLM's parallel sampling:
    child ``i`` is request ``f"{i}_{request_id}"`` with ``seed + i`` when a
    seed is given (one seed would draw the same tokens n times); the
    children share the prompt's blocks through the prefix cache. A refusal
    part-way (overload) aborts the children already submitted."""
    if n == 1:
        return [engine.submit(request_id, prompt, params, priority)]
    streams: list[RequestStream] = []
    try:
        for i in range(n):
            child = params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
            streams.append(engine.submit(f"{i}_{request_id}", prompt, child, priority))
    except ApiError:
        _abort_unfinished(engine, streams)
        raise
    return streams


def _abort_unfinished(engine: AsyncEngine, streams: list[RequestStream]) -> None:
    for stream in streams:
        if not stream.finished:
            engine.abort(stream.request_id)


async def _until_disconnected(request: Request, engine: AsyncEngine, streams: list[RequestStream],
                              work: Awaitable[T]) -> T:
    """``work``'s result; if the client disconnects first (or ``work``
    fails), every unfinished request of ``streams`` is aborted in the engine
    and the handler ends. On success the requests run on (a stream's first
    outputs are only its start)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        raise ClientDisconnected
    except BaseException:
        _abort_unfinished(engine, streams)
        raise
    finally:
        for t in (task, watcher):
            t.cancel()


async def _last_output(stream: RequestStream) -> RequestOutput:
    while True:
        out = await stream.next()
        if out.finished:
            return out


async def _answer(request: Request, engine: AsyncEngine, body: dict[str, Any], request_id: str,
                  prompt: PromptType, params: SamplingParams, chunk_type: type[_Chunks], model: str,
                  num_logprobs: int | None) -> Response:
    """Submit the request's ``n`` choices and answer them (both endpoints)."""
    settings = read_stream(body)
    n = read_n(body)
    streams = _submit(engine, request_id, prompt, params, _priority(body), n)
    created = int(time.time())
    chunks = [chunk_type(request_id, model, engine.llm, num_logprobs, _return_token_ids(body),
                         _tokens_as_token_ids(body), i, created) for i in range(n)]
    return await _respond(request, engine, streams, chunks, settings.stream, settings.include_usage)


async def _respond(request: Request, engine: AsyncEngine, streams: list[RequestStream],
                   chunks: Sequence[_Chunks], stream: bool, include_usage: bool) -> Response:
    """The answer to a request of ``len(streams)`` choices: the whole JSON, or
    server-sent events once every choice has its first output (so a request
    the engine refuses is a 400, not a stream)."""
    if not stream:
        finals = await _until_disconnected(
            request, engine, streams, asyncio.gather(*(_last_output(s) for s in streams)))
        body = chunks[0].whole_head()
        body["choices"] = [c.whole_choice(out) for c, out in zip(chunks, finals)]
        body["usage"] = _usage(finals)
        return JSONResponse(body)
    firsts = await _until_disconnected(
        request, engine, streams, asyncio.gather(*(s.next() for s in streams)))
    return _sse(engine, streams, firsts, chunks, include_usage)


def _sse(engine: AsyncEngine, streams: list[RequestStream], firsts: list[RequestOutput],
         chunks: Sequence[_Chunks], include_usage: bool) -> StreamingResponse:
    async def pump(i: int, queue: asyncio.Queue[tuple[int, RequestOutput]]) -> None:
        out = firsts[i]
        await queue.put((i, out))
        while not out.finished:
            out = await streams[i].next()
            await queue.put((i, out))

    async def events() -> AsyncIterator[str]:
        queue: asyncio.Queue[tuple[int, RequestOutput]] = asyncio.Queue()
        tasks = [asyncio.ensure_future(pump(i, queue)) for i in range(len(streams))]
        try:
            for c in chunks:
                for chunk in c.start():
                    yield _event(chunk)
            finals: dict[int, RequestOutput] = {}
            while len(finals) < len(streams):
                i, out = await queue.get()
                for chunk in chunks[i].delta(out, include_usage):
                    yield _event(chunk)
                if out.finished:
                    finals[i] = out
            if include_usage:
                yield _event(chunks[0].usage_chunk([finals[i] for i in range(len(streams))]))
            yield "data: [DONE]\n\n"
        finally:
            # The client went away mid-stream (the task is cancelled): abort.
            for t in tasks:
                t.cancel()
            _abort_unfinished(engine, streams)

    return StreamingResponse(events(), media_type="text/event-stream")


def _event(chunk: dict[str, Any]) -> str:
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


def _usage(outs: Sequence[RequestOutput]) -> dict[str, Any]:
    """The prompt counted once, every choice's tokens (vLLM's usage for n choices)."""
    prompt = len(outs[0].prompt_token_ids)
    completion = sum(len(out.outputs[0].token_ids) for out in outs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Chunks:
    """What has been sent of one request's output; the deltas to send next."""

    object_name = ""
    chunk_object_name = ""

    def __init__(self, request_id: str, model: str, llm: LLM, num_logprobs: int | None,
                 return_token_ids: bool, tokens_as_token_ids: bool = False, index: int = 0,
                 created: int | None = None) -> None:
        self.request_id = request_id
        self.index = index  # the choice's index among n
        self.return_token_ids = return_token_ids
        # vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:N",
        # which stays exact where several ids decode to the same text.
        self.tokens_as_token_ids = tokens_as_token_ids
        self.model = model
        self.llm = llm
        self.num_logprobs = num_logprobs
        self.created = int(time.time()) if created is None else created
        self.sent_text = 0
        self.sent_tokens = 0

    def _head(self, name: str) -> dict[str, Any]:
        return {"id": self.request_id, "object": name, "created": self.created, "model": self.model}

    def start(self) -> list[dict[str, Any]]:
        return []

    def usage_chunk(self, outs: Sequence[RequestOutput]) -> dict[str, Any]:
        return {**self._head(self.chunk_object_name), "choices": [], "usage": _usage(outs)}

    def delta(self, out: RequestOutput, include_usage: bool) -> list[dict[str, Any]]:
        c = out.outputs[0]
        text = c.text[self.sent_text:]
        start = self.sent_tokens
        self.sent_text, self.sent_tokens = len(c.text), len(c.token_ids)
        if not text and start == len(c.token_ids) and not out.finished:
            return []
        choice = self._choice_delta(text, self._logprobs(c.logprobs, c.token_ids, start))
        choice["finish_reason"] = c.finish_reason
        choice["stop_reason"] = c.stop_reason
        self._token_ids(choice, out, start)
        chunk = {**self._head(self.chunk_object_name), "choices": [choice]}
        if include_usage:
            chunk["usage"] = None
        return [chunk]

    def whole_head(self) -> dict[str, Any]:
        return self._head(self.object_name)

    def whole_choice(self, out: RequestOutput) -> dict[str, Any]:
        c = out.outputs[0]
        choice = self._choice_whole(c.text, self._logprobs(c.logprobs, c.token_ids, 0))
        choice["finish_reason"] = c.finish_reason
        choice["stop_reason"] = c.stop_reason
        self._token_ids(choice, out, 0)
        return choice

    def _token_ids(self, choice: dict[str, Any], out: RequestOutput, start: int) -> None:
        """vLLM's ``return_token_ids``: the prompt's ids with the first chunk,
        each chunk's new ids."""
        if self.return_token_ids:
            if start == 0:
                choice["prompt_token_ids"] = list(out.prompt_token_ids)
            choice["token_ids"] = out.outputs[0].token_ids[start:]

    def _choice_delta(self, text: str, logprobs: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _choice_whole(self, text: str, logprobs: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _logprobs(self, entries: list[dict[int, Any]] | None, token_ids: list[int], start: int) -> Any:
        raise NotImplementedError

    def _top(self, entry: dict[int, Any]) -> list[tuple[int, Any]]:
        """The top ``num_logprobs`` of one position, best first (the sampled
        token is in the entry as well, whatever its rank)."""
        ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)
        return [(tid, lp) for tid, lp in ranked if lp.rank <= (self.num_logprobs or 0)]

    def _text(self, token_id: int, lp: Any) -> str:
        if self.tokens_as_token_ids:
            return f"token_id:{token_id}"
        if lp.decoded_token is not None:
            return str(lp.decoded_token)
        return str(self.llm.tokenizer.decode([token_id], skip_special_tokens=False))


class _CompletionChunks(_Chunks):
    object_name = chunk_object_name = "text_completion"

    def _choice_delta(self, text: str, logprobs: Any) -> dict[str, Any]:
        return {"index": self.index, "text": text, "logprobs": logprobs}

    _choice_whole = _choice_delta

    def _logprobs(self, entries: list[dict[int, Any]] | None, token_ids: list[int], start: int) -> Any:
        if entries is None or self.num_logprobs is None:
            return None
        tokens, token_logprobs, top, offsets = [], [], [], []
        offset = 0
        for tid, entry in zip(token_ids[start:], entries[start:]):
            sampled = entry[tid]
            piece = self._text(tid, sampled)
            tokens.append(piece)
            token_logprobs.append(sampled.logprob)
            top.append({self._text(t, lp): lp.logprob for t, lp in self._top(entry)}
                       if self.num_logprobs else None)
            offsets.append(offset)
            offset += len(piece)
        return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
                "text_offset": offsets}


class _ChatChunks(_Chunks):
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def start(self) -> list[dict[str, Any]]:
        # OpenAI's first chunk names the role.
        return [{**self._head(self.chunk_object_name), "choices": [{
            "index": self.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
            "finish_reason": None}]}]

    def _choice_delta(self, text: str, logprobs: Any) -> dict[str, Any]:
        return {"index": self.index, "delta": {"content": text}, "logprobs": logprobs}

    def _choice_whole(self, text: str, logprobs: Any) -> dict[str, Any]:
        return {"index": self.index, "message": {"role": "assistant", "content": text},
                "logprobs": logprobs}

    def _logprobs(self, entries: list[dict[int, Any]] | None, token_ids: list[int], start: int) -> Any:
        if entries is None or self.num_logprobs is None:
            return None
        content = []
        for tid, entry in zip(token_ids[start:], entries[start:]):
            sampled = entry[tid]
            piece = self._text(tid, sampled)
            content.append({"token": piece, "logprob": sampled.logprob,
                            "bytes": list(piece.encode("utf-8")),
                            "top_logprobs": [{"token": self._text(t, lp), "logprob": lp.logprob,
                                              "bytes": list(self._text(t, lp).encode("utf-8"))}
                                             for t, lp in self._top(entry)]})
        return {"content": content}
