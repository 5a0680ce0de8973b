"""A running ``kvsched serve`` (uvicorn on a real socket, in a thread) on a tiny checkpoint."""

from __future__ import annotations

import json
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# No importorskip: the server's packages are in the dev extra, so a missing
# one fails here loudly instead of skipping the server's tests in CI.
import uvicorn

from kvsched.serve.command import Server, ServeSettings, build_server

# A template in the shape checkpoints ship (special tokens written by the template).
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
# The engine settings every server here and its offline reference share.
ENGINE_ARGS: dict[str, Any] = dict(dtype="float32", device="cpu", max_num_seqs=4,
                                   kv_cache_memory="32MiB", seed=0)


@dataclass
class Running:
    base_url: str
    server: Server
    model: Path
    _uvicorn: uvicorn.Server
    _thread: threading.Thread
    _sock: socket.socket

    @property
    def url(self) -> str:
        return self.base_url.removesuffix("/v1")

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join()
        self.server.close()
        self._sock.close()


def start_server(model: Path, engine_args: dict[str, Any] | None = None, **overrides: Any) -> Running:
    """``kvsched serve`` on ``model`` with ENGINE_ARGS (``engine_args`` added) and
    the server settings ``overrides`` changes."""
    settings = dict(model=str(model), tokenizer=None, served_model_name="tiny", api_key=None,
                    chat_template=None, max_pending_requests=64)
    settings.update(overrides)
    server = build_server(ServeSettings(**settings), **{**ENGINE_ARGS, **(engine_args or {})})
    # Listening before uvicorn starts: clients connect at once, no wait for readiness.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    config = uvicorn.Config(server.app, log_level="warning", lifespan="off")
    userver = uvicorn.Server(config)
    thread = threading.Thread(target=userver.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    port = sock.getsockname()[1]
    return Running(f"http://127.0.0.1:{port}/v1", server, model, userver, thread, sock)


@pytest.fixture(scope="session")
def chat_model(tiny: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint (long context, for the abort test) with a chat template."""
    out = tmp_path_factory.mktemp("chat") / "tiny"
    shutil.copytree(tiny(max_position_embeddings=8192), out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def served(chat_model: Path) -> Iterator[Running]:
    running = start_server(chat_model)
    yield running
    running.stop()
