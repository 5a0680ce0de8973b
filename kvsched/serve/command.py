"""``kvsched serve MODEL_DIR``: the engine behind an OpenAI-compatible server (uvicorn)."""

from __future__ import annotations

import argparse
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsched.engine.command import add_engine_flags, engine_kwargs
from kvsched.errors import UserInputError
from kvsched.scheduler_defaults import UsageContext
from kvsched.serve.cpu_binding import BIND_VAR, engine_cpus

_log = logging.getLogger("kvsched.serve")

# vLLM's --port default.
DEFAULT_PORT = 8000
# Requests the server holds at once (submitted, not finished) before it
# answers 503: far above what a CPU engine runs in a batch, low enough that
# a flood is refused at once rather than queued for hours.
DEFAULT_MAX_PENDING_REQUESTS = 4096


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a local checkpoint with an OpenAI-compatible API",
                       description="Serve a checkpoint with kvsched's engine behind an OpenAI-compatible "
                                   "HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
                                   "/health, /metrics), as `vllm serve` does.")
    p.add_argument("model_tag", nargs="?", metavar="MODEL_DIR",
                   help="checkpoint directory (or give --model)")
    p.add_argument("--model", help="checkpoint directory (vLLM's spelling; MODEL_DIR wins)")
    p.add_argument("--tokenizer", help="tokenizer directory (default: the checkpoint's)")
    s = p.add_argument_group("server (vLLM's frontend flags)")
    s.add_argument("--host", help="address to listen on (default: every interface, as vLLM)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default: %(default)s)")
    s.add_argument("--served-model-name", help="the model's name in the API (default: the model "
                   "path as given)")
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes")
    s.add_argument("--chat-template", help="a Jinja chat template (file or text) for models whose "
                   "tokenizer_config.json has none")
    s.add_argument("--max-pending-requests", type=int, default=DEFAULT_MAX_PENDING_REQUESTS,
                   help="requests held at once; more are answered 503 (kvsched's; default: "
                        "%(default)s)")
    s.add_argument("--enable-logging-iteration-details", action="store_true",
                   help="log every engine step as vLLM does: its context and generation requests "
                        "and tokens and the model's execution time")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="uvicorn's log level (default: %(default)s)")
    add_engine_flags(p.add_argument_group("engine (vLLM's engine arguments)"))
    p.set_defaults(func=run_serve)


@dataclass(frozen=True, slots=True)
class ServeSettings:
    """What the server needs besides the engine's arguments."""

    model: str
    tokenizer: str | None
    served_model_name: str
    api_key: str | None
    chat_template: str | None
    max_pending_requests: int
    log_iteration_details: bool = False
    # CPUs for the engine thread on a CPU device (``cpu_binding``); None: the OS places it.
    engine_cpus: list[int] | None = None


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    model = args.model_tag or args.model
    if not model:
        raise UserInputError("serve: no model; give the checkpoint directory, e.g. "
                             "`kvsched serve ./tiny` (`kvsched make-tiny-model ./tiny` writes one)")
    if args.model_tag and args.model and args.model_tag != args.model:
        raise UserInputError(f"serve: MODEL_DIR={args.model_tag!r} and --model={args.model!r} differ; "
                             "give one")
    if not 1 <= args.max_pending_requests <= 1_000_000:
        raise UserInputError(f"--max-pending-requests={args.max_pending_requests}: must be in "
                             "[1, 1000000]")
    if not 0 <= args.port <= 65535:
        raise UserInputError(f"--port={args.port}: must be in [0, 65535]")
    if args.api_key is not None and not args.api_key:
        raise UserInputError("--api-key: empty; give a key, or leave the flag out")
    return ServeSettings(model, args.tokenizer, args.served_model_name or model, args.api_key,
                         args.chat_template, args.max_pending_requests,
                         args.enable_logging_iteration_details,
                         engine_cpus(os.environ, os.sched_getaffinity(0)))


@dataclass(slots=True)
class Server:
    """The ASGI app and the engine thread behind it (started; ``close`` stops it)."""

    app: Any
    engine: Any

    def close(self) -> None:
        self.engine.shutdown()


def build_server(settings: ServeSettings, **engine_args: Any) -> Server:
    """Load the checkpoint, start the engine thread, build the app."""
    from kvsched.engine.llm import LLM
    from kvsched.serve.api_server import ServerConfig, build_app
    from kvsched.serve.async_engine import AsyncEngine
    from kvsched.serve.chat import load_chat_template
    from kvsched.serve.metrics import ServerMetrics

    template = load_chat_template(Path(settings.tokenizer or settings.model), settings.chat_template)
    # vLLM's API server's batch defaults, not its LLM class's.
    llm = LLM(settings.model, tokenizer=settings.tokenizer,
              usage_context=UsageContext.OPENAI_API_SERVER, **engine_args)
    core = llm.engine
    # vLLM's start-up line, which log readers (kvsched profile) parse.
    _log.info("%s KV cache size: %s tokens", core.device.type.upper(),
              f"{core.cache_config.num_gpu_blocks * core.cache_config.block_size:,}")
    if settings.log_iteration_details:
        usage = core.scheduler.kv_cache_manager
        core.iteration_observer = lambda d: _log.info(d.log_line(usage.usage))
    metrics = ServerMetrics(settings.served_model_name, core.scheduler_config.max_model_len)
    # vLLM's CPU-backend variables place CPU engines only.
    cpus = settings.engine_cpus if core.device.type == "cpu" else None
    if cpus is not None:
        _log.info("engine thread on CPUs %s, %d torch threads (%s)", ",".join(map(str, cpus)), len(cpus),
                  BIND_VAR)
    engine = AsyncEngine(llm, metrics, settings.max_pending_requests, cpus)
    app = build_app(engine, ServerConfig(settings.served_model_name, settings.model, settings.api_key,
                                         template))
    engine.start()
    return Server(app, engine)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    settings = serve_settings(args)
    # The server's own lines (start-up, per-step details) on stderr beside uvicorn's.
    if not _log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)
    # Bind before loading the model: a port in use fails in a second, not after the load.
    sock = socket.socket(socket.AF_INET6 if args.host and ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host or "0.0.0.0", args.port))
    except OSError as err:
        sock.close()
        raise UserInputError(f"--host={args.host or '0.0.0.0'} --port={args.port}: cannot listen "
                             f"there ({err.strerror}); pick another port") from None
    try:
        server = build_server(settings, **engine_kwargs(args))
        try:
            # vLLM's keep-alive timeout (VLLM_HTTP_TIMEOUT_KEEP_ALIVE).
            config = uvicorn.Config(server.app, log_level=args.uvicorn_log_level, timeout_keep_alive=5)
            host, port = sock.getsockname()[:2]
            print(f"kvsched serve: {settings.served_model_name} on http://{host}:{port}/v1", flush=True)
            uvicorn.Server(config).run(sockets=[sock])
        finally:
            server.close()
    finally:
        sock.close()
    return 0
