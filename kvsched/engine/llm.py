"""The offline API, shaped like vLLM's ``LLM``: load a checkpoint, generate."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvsched.engine.args import EngineArgs, check_seed
from kvsched.engine.core import EngineCore
from kvsched.engine.detokenizer import load_tokenizer
from kvsched.engine.output_processor import OutputProcessor
from kvsched.engine.outputs import RequestOutput
from kvsched.errors import UserInputError
from kvsched.hf_config import read_config_json
from kvsched.model.config import load_model_config
from kvsched.progress import draw_progress
from kvsched.request import Request, RequestStatus, SamplingParams

PromptType = str | dict[str, Any]


class LLM:
    """``LLM(model=PATH, **engine_args)`` with vLLM's engine-argument names.

    ``generate`` runs every prompt to completion and returns the outputs in
    prompt order; ``add_request`` / ``step`` / ``abort`` drive the engine one
    step at a time, as vLLM's ``LLMEngine`` does.
    """

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.args = EngineArgs.from_kwargs(model, **kwargs)
        # Cheap checks first: a bad config or a missing tokenizer.json fails
        # before any weights load.
        load_model_config(self.args.model)
        self.tokenizer = load_tokenizer(Path(self.args.tokenizer or self.args.model))
        self.engine = EngineCore(self.args)
        self.output_processor = OutputProcessor(self.tokenizer)
        config = self.engine.model_config
        self._eos_token_id = config.eos_token_ids[0] if config.eos_token_ids else None
        self._extra_eos = tuple(config.eos_token_ids[1:])
        self._counter = itertools.count()
        self.default_sampling_params = default_sampling_params(Path(self.args.model))

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    # -- one request at a time ----------------------------------------------------
    def _make_request(self, prompt: PromptType, params: SamplingParams, priority: int,
                      request_id: str | None, arrival_time: float) -> tuple[Request, str | None]:
        if isinstance(prompt, str):
            text: str | None = prompt
            token_ids = self.tokenizer.encode(prompt).ids
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text = prompt.get("prompt")
            token_ids = list(prompt["prompt_token_ids"])
        else:
            raise UserInputError(f"prompt={prompt!r:.60}: give a string or {{'prompt_token_ids': [...]}}")
        if not isinstance(params, SamplingParams):
            raise UserInputError(f"sampling_params={params!r:.60}: must be a kvsched SamplingParams")
        check_seed("sampling_params.seed", params.seed)
        # The model's EOS ids, as vLLM takes them from the checkpoint: the
        # extra ones stop a request like stop ids, unless it ignores EOS.
        extra_eos = () if params.ignore_eos else self._extra_eos
        params = replace(params, eos_token_id=self._eos_token_id,
                         stop_token_ids=tuple(dict.fromkeys((*params.stop_token_ids, *extra_eos))))
        rid = request_id if request_id is not None else str(next(self._counter))
        request = Request(rid, token_ids, params, priority=priority, arrival_time=arrival_time)
        # Token ids within the model's vocabulary, lengths, times: the one check.
        request.validate(self.engine.scheduler_config.max_model_len,
                         self.engine.model_config.vocab_size)
        return request, text

    def add_request(self, prompt: PromptType, sampling_params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0,
                    arrival_time: float | None = None) -> str:
        """``arrival_time`` (``time.time()``): when the request reached the
        front end (a server's handler), so its metrics and FCFS order count
        from there, as vLLM's front end stamps it; default: now."""
        params = sampling_params or self.default_sampling_params
        request, text = self._make_request(prompt, params, priority, request_id,
                                           time.time() if arrival_time is None else arrival_time)
        self._add(request, text)
        return request.request_id

    def _add(self, request: Request, text: str | None) -> None:
        if request.request_id in self.output_processor.states:
            raise UserInputError(f"request_id={request.request_id!r}: already running; give a unique id")
        self.engine.add_request(request)
        self.output_processor.add_request(request, text, request.arrival_time)

    def abort(self, request_ids: str | Sequence[str]) -> list[RequestOutput]:
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.engine.abort_requests(ids)
        return self.output_processor.abort(ids, time.time())

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block hash, so no later request hits (vLLM's
        ``LLM.reset_prefix_cache``, for benchmarks). False, and nothing
        forgotten, while a request holds blocks."""
        return self.engine.scheduler.reset_prefix_cache()

    def step(self) -> list[RequestOutput]:
        """One engine step: outputs of the requests that got tokens or finished.
        Under async scheduling a step may only schedule a batch (and return
        nothing); ``has_unfinished_requests`` stays True until every batch
        in flight has been applied."""
        result = self.engine.step()
        outputs, stopped = self.output_processor.process(result, time.time())
        if stopped:
            self.engine.scheduler.finish_requests(stopped, RequestStatus.FINISHED_STOPPED)
        return outputs

    # -- the whole batch ----------------------------------------------------------
    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        n = len(prompts)
        if sampling_params is None:
            sampling_params = self.default_sampling_params
        params = ([sampling_params] * n if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != n:
            raise UserInputError(f"sampling_params: {len(params)} given for {n} prompts; give one, "
                                 f"or one each")
        prios = list(priority) if priority is not None else [0] * n
        if len(prios) != n:
            raise UserInputError(f"priority: {len(prios)} given for {n} prompts; give one per prompt")
        now = time.time()
        # Every prompt is checked before any is queued: bad input changes nothing.
        made = [self._make_request(p, sp, pr, None, now) for p, sp, pr in zip(prompts, params, prios)]
        order = {req.request_id: i for i, (req, _) in enumerate(made)}
        for req, text in made:
            self._add(req, text)
        results: list[RequestOutput | None] = [None] * n
        bar = _Progress(n, enabled=use_tqdm)
        try:
            while self.has_unfinished_requests():
                for out in self.step():
                    if out.finished and out.request_id in order:
                        results[order[out.request_id]] = out
                        bar.update(out)
        except BaseException:
            self.abort(list(order))  # leave the engine clean for the next call
            raise
        finally:
            bar.close()
        missing = [made[i][0].request_id for i, r in enumerate(results) if r is None]
        if missing:
            raise RuntimeError(f"requests {missing[:5]} ended without an output")
        return [r for r in results if r is not None]


# generation_config.json keys vLLM takes as the default sampling settings
# (ModelConfig.get_diff_sampling_param), with their SamplingParams names.
_GENERATION_DEFAULTS = {
    "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "temperature": "temperature", "top_k": "top_k",
    "top_p": "top_p", "min_p": "min_p", "max_new_tokens": "max_tokens",
    "skip_special_tokens": "skip_special_tokens",
}


def default_sampling_params(model: Path) -> SamplingParams:
    """vLLM's defaults for ``generate(prompts)`` without SamplingParams: the
    checkpoint's generation_config.json sampling settings (null ones skipped),
    if it has any."""
    path = model / "generation_config.json"
    if not path.is_file():
        return SamplingParams()
    config = read_config_json(path)
    found = {name: config[key] for key, name in _GENERATION_DEFAULTS.items()
             if config.get(key) is not None}
    try:
        return SamplingParams(**found)
    except ValueError as err:
        raise UserInputError(f"{path}: {err}") from None


class _Progress:
    """The progress bar while ``generate`` runs (only when stderr is a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.done = 0
        self.tokens = 0
        self.t0 = time.perf_counter()
        self.enabled = enabled and sys.stderr.isatty()

    def update(self, out: RequestOutput) -> None:
        self.done += 1
        self.tokens += len(out.outputs[0].token_ids)
        if self.enabled:
            elapsed = max(time.perf_counter() - self.t0, 1e-9)
            draw_progress(self.done, self.total, f"{self.tokens / elapsed:.1f} output tok/s")

    def close(self) -> None:
        if self.enabled and self.done < self.total:  # interrupted: end the line
            sys.stderr.write("\n")
