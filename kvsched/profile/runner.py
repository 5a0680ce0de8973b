"""Run a profile: start the user's vLLM, drive the designed points, write
the step profile after each point (so an interrupted run can ``--resume``),
fit the step-cost model and the serving path's terms at the end."""

from __future__ import annotations

import dataclasses
import os
import queue
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kvsched.errors import UserInputError
from kvsched.perf.model_catalog import get_model
from kvsched.perf.models import ModelSpec
from kvsched.perf.profile_fit import ProfileFit, fit_steps
from kvsched.perf.serving_fit import RequestSample, ServingFit, fit_serving
from kvsched.perf.step_profile import (
    MODEL_FIELDS,
    StepProfile,
    StepRecord,
    load_profile,
    save_profile,
)
from kvsched.perf.step_profile import serve_flag as flag_value
from kvsched.perf.step_time import CPU_PER_REQUEST_S, CPU_STEP_S
from kvsched.profile.attribution import PointLedger, SentRequest
from kvsched.profile.design import Point, design_points
from kvsched.profile.iteration_log import parse_iteration_line, parse_kv_cache_tokens
from kvsched.profile.server import VllmServer, probe_vllm
from kvsched.profile.serving import StreamTiming, request_sample
from kvsched.progress import ProgressBar

POINT_TIMEOUT_S = 600.0
# How often a point waiting on the HTTP side (not the log) looks again.
HTTP_POLL_S = 0.01
# Without --max-num-seqs the design's widest decode batch.
DEFAULT_MAX_BATCH = 64
# Prompt token ids are drawn from [_FIRST_ID, vocab): clear of the special ids.
_FIRST_ID = 10


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    """What ``kvsched profile`` was asked."""

    vllm_python: str
    model: str
    serve_flags: tuple[str, ...]
    output: str
    resume: bool = False
    progress: bool = True


@dataclass(frozen=True, slots=True)
class ProfileOutcome:
    profile: StepProfile
    fit: ProfileFit
    wall_s: float
    new_steps: int
    serving: ServingFit | None = None


def model_fields(spec: ModelSpec, model: str) -> dict[str, object]:
    out: dict[str, object] = {"name": spec.name, "path": model}
    out.update({name: getattr(spec, name) for name in MODEL_FIELDS})
    return out


def _environment() -> dict[str, str]:
    """The vLLM settings from the environment, recorded; offline by default
    (the model is a local directory or already in the cache)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    env["HF_HUB_OFFLINE"] = os.environ.get("HF_HUB_OFFLINE", "1")
    return env


def start_profile(req: ProfileRequest, spec: ModelSpec, info: dict[str, object]) -> StepProfile:
    fields = model_fields(spec, req.model)
    hardware = {"device": str(info["device"]), "name": str(info["name"]), "cpu": str(info["cpu"]),
                "cores": info["cores"]}
    vllm = {"version": str(info["version"]), "distribution": str(info["distribution"]),
            "python": req.vllm_python}
    out = Path(req.output)
    if req.resume and out.exists():
        old = load_profile(out)
        if {k: old.model.get(k) for k in MODEL_FIELDS} != {k: fields[k] for k in MODEL_FIELDS}:
            raise UserInputError(f"--resume: {out} profiles another model ({old.model.get('name')}); "
                                 "give another --output or the same --model")
        if old.serve_flags != list(req.serve_flags):
            raise UserInputError(f"--resume: {out} was run with serve flags "
                                 f"{' '.join(old.serve_flags)!r}, not {' '.join(req.serve_flags)!r}; give "
                                 "the same flags or another --output")
        if old.vllm.get("version") != vllm["version"]:
            raise UserInputError(f"--resume: {out} was run with vLLM {old.vllm.get('version')}, this "
                                 f"Python has {vllm['version']}; give another --output")
        old.fit = None
        old.serving = None
        old.path = str(out)
        return old
    if out.exists() and not req.resume:
        raise UserInputError(f"--output {out}: exists; give --resume to go on with it, or another path")
    return StepProfile(fields, hardware, vllm, list(req.serve_flags), _environment(), path=str(out))


class Server(Protocol):
    """What a point needs of the server (:class:`VllmServer`; a fake in tests)."""

    lines: queue.Queue[str | None]

    def complete(self, prompt: list[int], max_tokens: int) -> StreamTiming: ...

    def died(self) -> str | None: ...


class PointRun:
    """One point against the server: waves sent as the log shows the
    previous ones past their prompts, each logged step attributed, each
    request's client times kept. Where every request sent so far has
    finished, the next wave also waits for their responses to end, so a
    lone prompt meets an idle server (its TTFT then holds its own serving
    path only)."""

    def __init__(self, server: Server, point: Point, vocab: int, first_request: int,
                 seen: set[tuple[int, int, int]], pool: ThreadPoolExecutor) -> None:
        self.server, self.point, self.vocab, self.seen, self.pool = server, point, vocab, seen, pool
        self.next_id = first_request
        self.waves = [[SentRequest(p, o) for p, o in w.requests] for w in point.waves]
        self.ledger = PointLedger(point.name, [r for w in self.waves for r in w])
        self.futures: list[Future[StreamTiming]] = []
        # Per request sent: the request, its response, whether nothing else was in flight.
        self.sent: list[tuple[SentRequest, Future[StreamTiming], bool]] = []
        self.records: list[StepRecord] = []

    def _send(self, wave: list[SentRequest]) -> None:
        alone = len(wave) == 1 and all(f.done() for f in self.futures)
        for r in wave:
            # A prompt never sent before: prefix caching finds nothing.
            rng = random.Random(self.next_id)
            self.next_id += 1
            prompt = [rng.randrange(_FIRST_ID, self.vocab) for _ in range(r.prompt_len)]
            r.sent = True
            future = self.pool.submit(self.server.complete, prompt, r.max_tokens)
            self.futures.append(future)
            self.sent.append((r, future, alone))

    def samples(self) -> list[RequestSample]:
        """The point's requests' client times against their steps (after
        :meth:`run`; a request whose steps the ledger did not attribute is
        left out)."""
        steps = {s.iteration: s for s in self.records}
        out = []
        for r, future, alone in self.sent:
            if future.done() and future.exception() is None:
                sample = request_sample(self.point.name, r, future.result(), steps, alone)
                if sample is not None:
                    out.append(sample)
        return out

    def _ready_for_next_wave(self, http_done: bool) -> bool:
        if self.ledger.problem or not self.ledger.past_prefill():
            return False
        everything_finished = all(r.finished for r in self.ledger.requests if r.sent)
        return http_done or not everything_finished

    def run(self) -> None:
        pending = list(self.waves)
        self._send(pending.pop(0))
        deadline = time.monotonic() + POINT_TIMEOUT_S
        while True:
            for f in self.futures:
                error = f.exception() if f.done() else None
                if error is not None:
                    raise error  # an HTTP error: vLLM's message
            http_done = all(f.done() for f in self.futures)
            if self.ledger.done and http_done and not pending:
                return
            if self.ledger.problem and pending:
                for wave in pending:  # let the point finish; nothing more is attributed
                    self._send(wave)
                pending = []
            if self.ledger.problem and http_done:
                return
            if time.monotonic() > deadline:
                raise UserInputError(f"point {self.point.name}: not finished after {POINT_TIMEOUT_S:.0f} s")
            if pending and self._ready_for_next_wave(http_done):
                self._send(pending.pop(0))
                continue
            # Waiting on responses rather than the log: look again soon.
            waiting_http = (self.ledger.done or (bool(pending) and self.ledger.past_prefill())) \
                and not http_done
            try:
                line = self.server.lines.get(timeout=HTTP_POLL_S if waiting_http else 0.5)
            except queue.Empty:
                why = self.server.died()
                if why is not None:
                    raise UserInputError(why) from None
                continue
            if line is None:
                raise UserInputError(self.server.died() or "the vLLM server's output ended")
            it = parse_iteration_line(line)
            if it is None:
                continue
            record = self.ledger.step(it)
            if record is not None:
                shape = (it.context_requests, it.context_tokens, it.generation_requests)
                first = shape not in self.seen
                self.seen.add(shape)
                if first or self.point.name == "warmup":
                    record = dataclasses.replace(record, warmup=True)
                self.records.append(record)


def _int_flag(flags: list[str], name: str, default: int) -> int:
    """A server flag the design sizes its batches by, as an integer."""
    value = flag_value(flags, (name,), None)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise UserInputError(f"{name} {value}: kvsched profile sizes its batches by it; give a plain "
                             "integer") from None


def run_profile(req: ProfileRequest) -> ProfileOutcome:
    """Profile ``req.model`` on the user's vLLM (see the package docstring)."""
    start = time.monotonic()
    spec = get_model(req.model)
    info = probe_vllm(req.vllm_python)
    profile = start_profile(req, spec, info)
    max_len = _int_flag(profile.serve_flags, "--max-model-len", spec.max_position_embeddings)
    max_seqs = _int_flag(profile.serve_flags, "--max-num-seqs", DEFAULT_MAX_BATCH)
    out = Path(req.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    server = VllmServer(req.vllm_python, req.model, list(req.serve_flags),
                        out.with_name(out.name + ".server.log"), profile.environment)
    bar = ProgressBar("points") if req.progress else None
    new_steps = 0
    try:
        if bar is not None:
            bar.draw(0, 1, "starting vLLM (a minute or more: weights, warm-up, compilation)")
        server.wait_ready()
        while True:  # the start-up lines: the KV cache size
            try:
                line = server.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None and (kv := parse_kv_cache_tokens(line)) is not None:
                profile.kv_cache_tokens = kv
        points = [p for p in design_points(max_len, max_seqs, profile.kv_cache_tokens)
                  if p.name not in profile.points_done or p.name == "warmup"]
        seen: set[tuple[int, int, int]] = set()
        first_request = 0
        with ThreadPoolExecutor(max_workers=max(len(w.requests) for p in points for w in p.waves)) as pool:
            for i, point in enumerate(points):
                if bar is not None:
                    bar.draw(i, len(points), f"{point.name}  ({len(profile.steps)} steps)")
                run = PointRun(server, point, spec.vocab_size, first_request, seen, pool)
                run.run()
                first_request = run.next_id
                profile.steps.extend(run.records)
                if point.name != "warmup":
                    profile.requests.extend(run.samples())
                new_steps += len(run.records)
                if run.ledger.problem:
                    profile.notes.append(f"point {point.name}: steps after {run.ledger.problem} "
                                         "not attributed")
                if point.name not in profile.points_done:
                    profile.points_done.append(point.name)
                save_profile(profile, out)
            if bar is not None:
                bar.draw(len(points), len(points), f"done  ({len(profile.steps)} steps)")
    finally:
        if bar is not None:
            bar.close()
        server.stop()
    where = f"step profile {str(out)!r}"
    fit = fit_steps(profile.fit_steps(), where)
    profile.fit = fit.to_json()
    # The serving path, net of the CPU time per step the simulator adds to
    # every step (RuntimeConfig's defaults; the backend adjusts for others).
    try:
        profile.serving = fit_serving(profile.requests, CPU_STEP_S, CPU_PER_REQUEST_S, where)
    except UserInputError as e:
        profile.serving = None
        profile.notes.append(f"serving path not fitted: {e}")
    save_profile(profile, out)
    return ProfileOutcome(profile, fit, time.monotonic() - start, new_steps, profile.serving)
