"""Reading OpenAI request bodies: the prompt and vLLM's sampling parameters.

Every field is checked here, before the request reaches the engine, and a
bad one is an :class:`ApiError` naming it. Fields OpenAI defines that the
engine cannot honour (``n`` > 1, ``echo``, ``suffix``, ``logit_bias``, ...)
are refused, never dropped; fields nobody defines are ignored, as vLLM does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvsched.errors import UserInputError
from kvsched.request import SamplingParams
from kvsched.serve.errors import ApiError

# vLLM's default --max-logprobs: the most top tokens a request may ask for.
MAX_LOGPROBS = 20

# Body fields that map one to one onto SamplingParams, with the JSON kinds each takes.
_NUMBER = (int, float)
_SAMPLING_FIELDS: dict[str, tuple[type, ...]] = {
    "temperature": _NUMBER, "top_p": _NUMBER, "top_k": (int,), "min_p": _NUMBER,
    "presence_penalty": _NUMBER, "frequency_penalty": _NUMBER, "repetition_penalty": _NUMBER,
    "seed": (int,), "min_tokens": (int,), "ignore_eos": (bool,),
    "include_stop_str_in_output": (bool,), "skip_special_tokens": (bool,),
}


@dataclass(frozen=True, slots=True)
class StreamSettings:
    stream: bool
    include_usage: bool


def field(body: dict[str, Any], name: str, kinds: tuple[type, ...], what: str) -> Any:
    """``body[name]`` if present and not null, checked against ``kinds``
    (bool is not a number here, as in JSON); None if absent."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) and bool not in kinds:
        raise ApiError(f"{name}={value!r}: must be {what}", param=name)
    if not isinstance(value, kinds):
        raise ApiError(f"{name}={value!r:.80}: must be {what}", param=name)
    return value


def read_stream(body: dict[str, Any]) -> StreamSettings:
    stream = bool(field(body, "stream", (bool,), "true or false"))
    options = field(body, "stream_options", (dict,), "an object")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError("stream_options: only allowed with stream=true", param="stream_options")
        include_usage = bool(field(options, "include_usage", (bool,), "true or false"))
    return StreamSettings(stream, include_usage)


def check_model(body: dict[str, Any], served: str) -> None:
    """``model`` is the served name, or left out (the only model)."""
    name = field(body, "model", (str,), "a string")
    if name is not None and name != served:
        raise ApiError(f"The model `{name}` does not exist; this server serves `{served}`.",
                       status=404, param="model")


def refuse_unsupported(body: dict[str, Any], names: tuple[str, ...]) -> None:
    """OpenAI fields kvsched does not implement: a clear 400, not silence."""
    for name in names:
        value = body.get(name)
        if value in (None, False, {}, []):
            continue
        raise ApiError(f"{name}: not supported by kvsched serve; leave it out", param=name)


def check_response_format(body: dict[str, Any]) -> None:
    """``response_format``: plain text only (JSON modes need structured output)."""
    fmt = field(body, "response_format", (dict,), "an object")
    if fmt is not None and fmt.get("type", "text") != "text":
        raise ApiError(f"response_format.type={fmt.get('type')!r:.40}: kvsched serve has no "
                       "structured output; leave response_format out or use {'type': 'text'}",
                       param="response_format")


def read_completion_prompt(body: dict[str, Any]) -> str | list[int]:
    """``prompt``: one text, or one list of token ids (a list holding a single
    one of either is taken too); several prompts in one request are refused."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise ApiError("prompt: empty; give some text or token ids", param="prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        if any(t < 0 for t in prompt):
            raise ApiError("prompt: token ids must be >= 0", param="prompt")
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise ApiError(f"prompt: {len(prompt)} prompts in one request; kvsched serve takes one per "
                       "request (send them as separate requests)", param="prompt")
    raise ApiError(f"prompt={prompt!r:.80}: give a string or a list of token ids", param="prompt")


def read_n(body: dict[str, Any]) -> int:
    """OpenAI's ``n``: how many choices to generate for the prompt (default 1)."""
    n = field(body, "n", (int,), "an integer")
    if n is None:
        return 1
    if n < 1:
        raise ApiError(f"n={n}: must be at least 1", param="n")
    return int(n)


def sampling_params(body: dict[str, Any], defaults: SamplingParams, max_tokens_field: str,
                    num_logprobs: int | None, default_max_tokens: int) -> SamplingParams:
    """vLLM's SamplingParams from a request body: fields left out take
    ``defaults`` (the checkpoint's generation_config, as vLLM's server does),
    ``max_tokens`` left out is ``default_max_tokens`` (what the context has
    room for)."""
    best_of = field(body, "best_of", (int,), "an integer")
    if best_of is not None and best_of != 1:
        raise ApiError(f"best_of={best_of}: not supported; use 1", param="best_of")
    changes: dict[str, Any] = {}
    for name, kinds in _SAMPLING_FIELDS.items():
        value = field(body, name, kinds, "a boolean" if kinds == (bool,)
                      else "an integer" if kinds == (int,) else "a number")
        if value is not None:
            changes[name] = value
    max_tokens = field(body, max_tokens_field, (int,), "an integer")
    if max_tokens is None and max_tokens_field != "max_tokens":
        max_tokens = field(body, "max_tokens", (int,), "an integer")
    if max_tokens is not None and max_tokens < 1:
        raise ApiError(f"{max_tokens_field}={max_tokens}: must be at least 1", param=max_tokens_field)
    changes["max_tokens"] = max_tokens if max_tokens is not None else default_max_tokens
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ApiError(f"stop={stop!r:.80}: must be a string or a list of strings", param="stop")
        changes["stop"] = tuple(s for s in stop if s)  # OpenAI ignores empty stop strings
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list) or not all(type(t) is int and t >= 0 for t in stop_ids):
            raise ApiError(f"stop_token_ids={stop_ids!r:.80}: must be a list of token ids (integers "
                           ">= 0)", param="stop_token_ids")
        changes["stop_token_ids"] = tuple(stop_ids)
    if num_logprobs is not None:
        changes["logprobs"] = num_logprobs
    try:
        params = replace(defaults, **changes)
        params.validate()
    except (ValueError, UserInputError) as err:
        raise ApiError(str(err)) from None
    return params


def completion_logprobs(body: dict[str, Any]) -> int | None:
    """Completions' ``logprobs``: the number of top tokens per position."""
    n: int | None = field(body, "logprobs", (int,), "an integer")
    if n is not None and not 0 <= n <= MAX_LOGPROBS:
        raise ApiError(f"logprobs={n}: must be in [0, {MAX_LOGPROBS}]", param="logprobs")
    return n


def chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's ``logprobs`` (true/false) and ``top_logprobs`` (how many)."""
    wanted = field(body, "logprobs", (bool,), "true or false")
    top = field(body, "top_logprobs", (int,), "an integer")
    if top is not None and not wanted:
        raise ApiError("top_logprobs: needs logprobs=true", param="top_logprobs")
    if top is not None and not 0 <= top <= MAX_LOGPROBS:
        raise ApiError(f"top_logprobs={top}: must be in [0, {MAX_LOGPROBS}]", param="top_logprobs")
    return (top or 0) if wanted else None
