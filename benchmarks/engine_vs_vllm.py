"""kvsched serve against real vLLM's CPU build, same checkpoint, same flags (issue 24 item 2).

Both servers serve one tiny float32 checkpoint with the same engine flags
(:data:`SERVER_FLAGS`, plus ``--block-size`` :data:`BLOCK_SIZE`: vLLM's CPU
platform picks 128 when none is given, kvsched's default is vLLM's GPU 16)
and the same number of KV tokens: vLLM gets ``VLLM_CPU_KVCACHE_SPACE`` GiB
and logs the tokens that holds; kvsched serve is then started with
``--kv-cache-memory`` = those tokens' bytes (its own ``kv_bytes_per_block``).
Both are measured by vLLM's own ``vllm bench serve`` client
(``real_vllm/bench_client.py`` run with the vLLM environment's Python).

Subcommands:

``run``
    The speed matrix: every workload of :data:`WORKLOADS` ``--repeats``
    times per engine, the engines interleaved A B B A A B ... (see
    :func:`run_order`) so drift cancels. Both servers are started once and
    left running (their idle CPU is measured and recorded: an idle server
    must cost nothing), each warmed up first, the prefix cache reset before
    every run (``POST /reset_prefix_cache``; vLLM needs
    ``VLLM_SERVER_DEV_MODE=1``). Resumable: a run whose result exists is
    skipped; when all exist no server starts.
``report``
    Per workload, per engine the median and [min-max] over repeats of each
    metric of :data:`METRICS`, and kvsched/vLLM of the medians; written to
    ``<tag>/README.md`` and printed.
``parity``
    Greedy outputs token by token: :data:`PARITY_PROMPTS` prompts of random
    token ids (some sharing prefixes), 64 tokens each, ``logprobs: 5``, sent
    to both servers one at a time and then all at once. Per prompt: identical,
    or the first position where they differ with both engines' top-2 there.
    ``<tag>/parity.json`` and ``<tag>/parity.md`` (one entry per model).

**CPU placement** (2 cores), the same for both servers: the model's compute
on core 0 alone, everything else on core 1. vLLM's CPU worker binds its
OpenMP thread to core 0 itself (``VLLM_CPU_OMP_THREADS_BIND=auto``). For
each server the threads whose affinity is exactly {0} are taken as its
worker and every other thread of its process group is moved to core 1; a
server with no thread bound to core 0 is left as it is (said in the output
and in ``<engine>.server.json``). kvsched serve reads the same variable
(``kvsched/serve/cpu_binding.py``): its engine thread binds itself to core 0
and runs one torch thread (``OMP_NUM_THREADS=1`` as well, for a kvsched
without that binding). The client runs on core 1.

Outputs under ``results_engine_vs_vllm/<tag>/<model>/``: each run's vllm
bench JSON (``<workload>.<engine>.r<k>.json``, generated texts dropped, with
the load averages before and after), ``<engine>.server.json`` (command,
environment, start-up time, KV tokens, pinning, idle CPU) and each server
start's whole log, gzipped.

    python benchmarks/engine_vs_vllm.py run --tag T [--models llama qwen3] [--repeats 3]
    python benchmarks/engine_vs_vllm.py report --tag T
    python benchmarks/engine_vs_vllm.py parity --tag T

(run from the repository root with kvsched's environment; ``PYTHONPATH=.``
is set for the kvsched server it starts).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import gzip
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE / "real_vllm") not in sys.path:
    sys.path.insert(0, str(HERE / "real_vllm"))
import run_matrix as rm  # noqa: E402  (the real-vLLM harness: workloads, trace slices)

from kvsched.profile.iteration_log import parse_kv_cache_tokens  # noqa: E402

RESULTS = HERE / "results_engine_vs_vllm"
VLLM_PYTHON = rm.VLLM_PYTHON
ENGINES = ("vllm", "kvsched")
WORKER_CORE, OTHER_CORE = 0, 1
SERVER_FLAGS = ("--dtype", "float32", "--max-model-len", "2048", "--max-num-seqs", "64",
                "--max-num-batched-tokens", "512")
# vLLM's CPU platform sets 128 when no block size is given; given to both.
BLOCK_SIZE = 128
VLLM_KV_GIB = 1
START_TIMEOUT_S = rm.START_TIMEOUT_S
# Idle CPU: IDLE_WINDOWS consecutive windows of IDLE_SAMPLE_S after the
# warm-up (vLLM spins for a while after its last request, then sleeps).
IDLE_SAMPLE_S, IDLE_WINDOWS = 5.0, 3
MAX_IDLE_LOAD = 0.5
MODELS = {name: dir_ for name, (dir_, _) in rm.MODELS.items()}

RANDOM = rm.RANDOM
# 256 +-50 % in, 32 +-50 % out, --ignore-eos: Poisson rates and closed loops.
RANDOM_256_32 = (*RANDOM, "--random-input-len", "256", "--random-output-len", "32")
WORKLOADS: dict[str, rm.ClientWorkload] = {w.name: w for w in (
    rm.ClientWorkload("poisson0.5", (*RANDOM_256_32, "--num-prompts", "30", "--request-rate", "0.5"), 21),
    rm.WORKLOADS["poisson1"],
    rm.ClientWorkload("poisson2", (*RANDOM_256_32, "--num-prompts", "60", "--request-rate", "2"), 22),
    rm.WORKLOADS["closed8"],
    rm.ClientWorkload("closed1", (*RANDOM_256_32, "--num-prompts", "16", "--max-concurrency", "1"), 23),
    rm.WORKLOADS["azureconv"],
)}
WARMUP = rm.WORKLOADS["warmup"]

# The report's metrics: vllm bench's result keys and how each is shown.
METRICS: tuple[tuple[str, str], ...] = (
    ("output_throughput", "output tok/s"), ("request_throughput", "req/s"),
    ("mean_ttft_ms", "mean TTFT ms"), ("median_ttft_ms", "median TTFT ms"), ("p99_ttft_ms", "p99 TTFT ms"),
    ("mean_tpot_ms", "mean TPOT ms"), ("median_itl_ms", "median ITL ms"), ("p99_itl_ms", "p99 ITL ms"),
    ("mean_e2el_ms", "mean E2E ms"),
)

PARITY_PROMPTS, PARITY_MAX_TOKENS, PARITY_SEED = 64, 64, 24
PARITY_MIN_LEN, PARITY_MAX_LEN = 16, 512
# Every PARITY_SHARE_EVERY-th prompt opens with an earlier prompt's first
# half (prefix-cache hits change which kernels compute its prefill).
PARITY_SHARE_EVERY = 8


# ---------------------------------------------------------------------------
# Pure parts (tested without vLLM)


def run_order(workloads: Sequence[str], repeats: int, engines: Sequence[str] = ENGINES
              ) -> list[tuple[str, int, str]]:
    """(workload, repeat, engine) in the order run: each repeat runs both
    engines back to back, the pair's order alternating from one pair to the
    next (A B, B A, A B, ... across workloads too), so a slow drift of the
    machine weighs on both alike."""
    out = []
    pair = 0
    for w in workloads:
        for k in range(1, repeats + 1):
            order = list(engines) if pair % 2 == 0 else list(reversed(engines))
            out += [(w, k, e) for e in order]
            pair += 1
    return out


def median_range(values: Sequence[float]) -> tuple[float, float, float]:
    """Median, min, max."""
    if not values:
        raise ValueError("median_range: no values")
    return statistics.median(values), min(values), max(values)


def ratio(a: float, b: float) -> float | None:
    """a / b, None when b is 0 (a metric both engines report as 0)."""
    return None if b == 0 else a / b


def fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}" if abs(x) < 1 else f"{x:.1f}"


def workload_table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """One workload's markdown table: per metric, each engine's median
    [min-max] over its repeats and kvsched/vLLM of the medians."""
    counts = {e: len(results.get(e, [])) for e in ENGINES}
    lines = [f"| metric | vLLM (runs: {counts['vllm']}) | kvsched (runs: {counts['kvsched']}) "
             "| kvsched/vLLM |",
             "| --- | --- | --- | --- |"]
    for key, label in METRICS:
        cells, medians = [], {}
        for e in ENGINES:
            values = [float(r[key]) for r in results.get(e, []) if key in r]
            if not values:
                cells.append("—")
                continue
            med, lo, hi = median_range(values)
            medians[e] = med
            cells.append(f"{fmt(med)} [{fmt(lo)}-{fmt(hi)}]" if len(values) > 1 else fmt(med))
        r = ratio(medians["kvsched"], medians["vllm"]) if len(medians) == 2 else None
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {'—' if r is None else f'{r:.2f}'} |")
    return lines


def parity_prompts(vocab_size: int, n: int = PARITY_PROMPTS, seed: int = PARITY_SEED) -> list[list[int]]:
    """``n`` prompts of random token ids (lengths PARITY_MIN_LEN..PARITY_MAX_LEN,
    away from the vocabulary's ends where special tokens sit); every
    PARITY_SHARE_EVERY-th one opens with the first half of the one before."""
    rng = random.Random(seed)
    prompts: list[list[int]] = []
    for i in range(n):
        length = rng.randint(PARITY_MIN_LEN, PARITY_MAX_LEN)
        ids = [rng.randrange(100, vocab_size - 100) for _ in range(length)]
        if i and i % PARITY_SHARE_EVERY == 0:
            shared = prompts[i - 1][:len(prompts[i - 1]) // 2]
            ids = (shared + ids)[:max(length, len(shared) + 1)]
        prompts.append(ids)
    return prompts


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """One engine's greedy output of one prompt: its token ids and, per
    position, the top logprobs as {token: logprob}, the token its id as a
    string, or ``?'text'`` where the server sent text that several ids
    decode to."""

    token_ids: list[int]
    top: list[dict[str, float]]
    # The logprob of each chosen token.
    logprobs: list[float] = dataclasses.field(default_factory=list)


def first_difference(a: Completion, b: Completion) -> int | None:
    """The first position where two outputs differ (None: identical)."""
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)):
        if x != y:
            return i
    if len(a.token_ids) != len(b.token_ids):
        return min(len(a.token_ids), len(b.token_ids))
    return None


def compare(prompt_len: int, outs: dict[str, Completion]) -> dict[str, Any]:
    """One prompt's verdict: identical, or where the engines part and each
    one's top-2 there (and its gap, the margin of its choice)."""
    a, b = outs["vllm"], outs["kvsched"]
    pos = first_difference(a, b)
    row: dict[str, Any] = {"prompt_len": prompt_len, "identical": pos is None}
    # How far the two engines' numbers are apart where they agree on the tokens.
    same = len(a.token_ids) if pos is None else pos
    diffs = [abs(x - y) for x, y in zip(a.logprobs[:same], b.logprobs[:same])]
    row["max_abs_logprob_diff"] = round(max(diffs), 8) if diffs else None
    if pos is None:
        return row
    row["position"] = pos
    for e, c in outs.items():
        top = sorted(c.top[pos].items(), key=lambda kv: -kv[1])[:2] if pos < len(c.top) else []
        row[e] = {"token": c.token_ids[pos] if pos < len(c.token_ids) else None,
                  "top2": [[t, round(lp, 6)] for t, lp in top],
                  "gap": round(top[0][1] - top[1][1], 6) if len(top) == 2 else None}
    return row


# ---------------------------------------------------------------------------
# Servers


def group_threads(leader: int) -> list[tuple[int, int, str]]:
    """(pid, tid, thread name) of every thread of the process group."""
    out = []
    for pid in rm.group_pids(leader):
        try:
            for t in Path(f"/proc/{pid}/task").iterdir():
                out.append((pid, int(t.name), (t / "comm").read_text().strip()))
        except OSError:
            continue
    return out


def cpu_seconds(leader: int) -> dict[str, float]:
    """User + system CPU time so far of each process of the group, by
    "name(pid)"."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for pid in rm.group_pids(leader):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        out[f"{name}({pid})"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def loadavg() -> list[str]:
    return Path("/proc/loadavg").read_text().split()[:3]


class Server:
    """One engine's OpenAI server in its own process group, its log in a file."""

    def __init__(self, engine: str, model: str, out_dir: Path, kv_cache_memory: int | None = None) -> None:
        self.engine = engine
        self.model_dir = MODELS[model]
        self.port = rm.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # Both log every step (vLLM's line; kvsched serve writes the same), so
        # the runs' step times can be compared beside the client's figures.
        common = [*SERVER_FLAGS, "--block-size", str(BLOCK_SIZE), "--host", "127.0.0.1",
                  "--port", str(self.port), "--enable-logging-iteration-details"]
        env_extra: dict[str, str] = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                                     "VLLM_CPU_OMP_THREADS_BIND": "auto"}
        if engine == "vllm":
            self.cmd = [VLLM_PYTHON, "-m", rm.SERVER_MODULE, "--model", self.model_dir, *common]
            env_extra |= {"VLLM_CPU_KVCACHE_SPACE": str(VLLM_KV_GIB), "VLLM_SERVER_DEV_MODE": "1"}
        else:
            if kv_cache_memory is None:
                raise ValueError("kvsched serve needs kv_cache_memory (vLLM's KV tokens in bytes)")
            self.cmd = [sys.executable, "-m", "kvsched.cli", "serve", self.model_dir, *common,
                        "--kv-cache-memory", str(kv_cache_memory), "--uvicorn-log-level", "warning"]
            env_extra |= {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        self.env_extra = env_extra
        self.log_path = out_dir / f"{engine}.server-{datetime.now():%H%M%S}.log"
        self._log = self.log_path.open("w", encoding="utf-8")
        self._log.write("$ " + " ".join(self.cmd) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **env_extra}, start_new_session=True, cwd=REPO)
        self.started = time.monotonic()

    def wait_ready(self) -> float:
        ready = rm.wait_healthy(self.proc, self.base, self.started, f"{self.engine} server", self.log_path)
        if ready is not None:
            return ready
        raise SystemExit(f"{self.engine} server did not answer /health within {START_TIMEOUT_S:.0f} s; "
                         f"see {self.log_path}")

    def reset_prefix_cache(self) -> None:
        # Between runs nothing is in flight, but a server may still be
        # freeing the last request's blocks: a few tries.
        for _ in range(20):
            req = urllib.request.Request(self.base + "/reset_prefix_cache", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=60) as r:
                body = r.read()
            if json.loads(body or b"{}").get("success", True):
                return
            time.sleep(0.5)
        raise SystemExit(f"{self.engine}: POST /reset_prefix_cache kept answering success=false")

    def pin(self) -> dict[str, Any]:
        """Threads bound to exactly {WORKER_CORE} stay (the worker); every
        other thread of the group goes to OTHER_CORE. Without such a thread
        nothing is moved (the worker could not be told apart)."""
        threads = group_threads(self.proc.pid)
        masks: dict[int, set[int]] = {}
        for _, tid, _ in threads:
            try:
                masks[tid] = os.sched_getaffinity(tid)
            except OSError:
                continue
        workers = [(pid, tid, name) for pid, tid, name in threads if masks.get(tid) == {WORKER_CORE}]
        if not workers:
            print(f"  {self.engine}: no thread is bound to core {WORKER_CORE}; nothing pinned "
                  f"({len(threads)} threads float over every core)", flush=True)
            return {"pinned": False, "threads": len(threads), "why": f"no thread bound to core {WORKER_CORE}"}
        moved = 0
        for _, tid, _ in threads:
            if masks.get(tid) == {WORKER_CORE}:
                continue
            try:
                os.sched_setaffinity(tid, {OTHER_CORE})
                moved += 1
            except OSError:
                pass
        names: dict[str, int] = {}
        for _, _, name in workers:
            names[name] = names.get(name, 0) + 1
        return {"pinned": True, "threads": len(threads), "moved_to_core_1": moved,
                "left_on_core_0": {"pids": sorted({p for p, _, _ in workers}), "threads_by_name": names}}

    def idle_cpu_percent(self, seconds: float = IDLE_SAMPLE_S, windows: int = IDLE_WINDOWS
                         ) -> list[dict[str, float]]:
        """Each process's CPU use while nothing is sent, percent of one core,
        in consecutive windows."""
        out = []
        before = cpu_seconds(self.proc.pid)
        for _ in range(windows):
            time.sleep(seconds)
            now = cpu_seconds(self.proc.pid)
            out.append({k: round(100.0 * (v - before.get(k, 0.0)) / seconds, 1) for k, v in now.items()})
            before = now
        return out

    def kv_tokens_logged(self) -> int | None:
        """vLLM's "CPU KV cache size: N tokens" line."""
        for line in self.log_path.read_text(errors="replace").splitlines():
            tokens = parse_kv_cache_tokens(line)
            if tokens is not None:
                return tokens
        return None

    def stop(self) -> None:
        rm.stop_process_group(self.proc)
        self._log.close()
        with self.log_path.open("rb") as f, gzip.open(self.log_path.with_suffix(".log.gz"), "wb") as g:
            g.write(f.read())
        self.log_path.unlink()


def kvsched_kv_memory(model: str, tokens: int) -> tuple[int, int]:
    """The ``--kv-cache-memory`` bytes that hold ``tokens`` KV tokens in
    kvsched (float32, BLOCK_SIZE), and the tokens it will hold (kvsched's
    own sizing rule: whole blocks of ``kv_bytes_per_block``)."""
    import torch

    from kvsched.engine.core import kv_bytes_per_block
    from kvsched.model.config import load_model_config

    per_block = kv_bytes_per_block(load_model_config(MODELS[model]), BLOCK_SIZE, torch.float32)
    blocks = -(-tokens // BLOCK_SIZE)
    return blocks * per_block, blocks * BLOCK_SIZE


@dataclasses.dataclass(slots=True)
class Pair:
    """Both servers of one model, started and warmed."""

    servers: dict[str, Server]
    meta: dict[str, dict[str, Any]]

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()


def check_no_foreign_servers() -> None:
    out = subprocess.run(["pgrep", "-af", "kvsched.cli serve|vllm.entrypoints"], capture_output=True,
                         text=True, check=False).stdout.strip()
    if out:
        raise SystemExit("another kvsched or vLLM server is running (wait until it has gone):\n" + out)


def start_pair(model: str, out_dir: Path, warm: Callable[[Server], None]) -> Pair:
    """vLLM first (its log names the KV tokens), then kvsched serve sized to
    hold as many; each pinned, warmed, pinned again (threads started since),
    then its idle CPU measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    servers: dict[str, Server] = {}
    meta: dict[str, dict[str, Any]] = {}
    pair = Pair(servers, meta)
    try:
        servers["vllm"] = Server("vllm", model, out_dir)
        startup = servers["vllm"].wait_ready()
        tokens = servers["vllm"].kv_tokens_logged()
        if tokens is None:
            raise SystemExit(f"vLLM's log names no KV cache size; see {servers['vllm'].log_path}")
        memory, kvsched_tokens = kvsched_kv_memory(model, tokens)
        meta["vllm"] = {"startup_s": round(startup, 1), "kv_cache_tokens": tokens,
                        "kv_cache_tokens_source": "its log (CPU KV cache size)"}
        print(f"{model}: vLLM ready in {startup:.0f} s, {tokens:,} KV tokens", flush=True)
        servers["kvsched"] = Server("kvsched", model, out_dir, memory)
        startup = servers["kvsched"].wait_ready()
        # kvsched serve logs vLLM's line too: the size it holds must be the one asked for.
        logged = servers["kvsched"].kv_tokens_logged()
        if logged != kvsched_tokens:
            raise SystemExit(f"kvsched serve logged {logged} KV tokens, {kvsched_tokens:,} were asked "
                             f"for with --kv-cache-memory {memory}; see {servers['kvsched'].log_path}")
        meta["kvsched"] = {"startup_s": round(startup, 1), "kv_cache_tokens": kvsched_tokens,
                           "kv_cache_memory": memory,
                           "kv_cache_tokens_source": "its log (CPU KV cache size)"}
        print(f"{model}: kvsched ready in {startup:.0f} s, {kvsched_tokens:,} KV tokens "
              f"(--kv-cache-memory {memory})", flush=True)
        for e, s in servers.items():
            s.pin()
            warm(s)
            meta[e] |= {"engine": e, "model": model, "model_dir": s.model_dir, "command": s.cmd,
                        "environment": s.env_extra, "pinning": s.pin(),
                        "idle_cpu_percent": s.idle_cpu_percent(),
                        "started": datetime.now().isoformat(timespec="seconds")}
            print(f"  {e}: warmed; idle CPU {meta[e]['idle_cpu_percent']} % of a core in "
                  f"{IDLE_SAMPLE_S:.0f}-s windows; pinning {meta[e]['pinning']}", flush=True)
            (out_dir / f"{e}.server.json").write_text(json.dumps(meta[e], indent=1) + "\n")
    except BaseException:
        pair.stop()
        raise
    return pair


# ---------------------------------------------------------------------------
# run


def with_num_prompts(flags: list[str], n: int | None) -> list[str]:
    if n is None:
        return flags
    out = list(flags)
    if "--num-prompts" in out:
        out[out.index("--num-prompts") + 1] = str(n)
    else:
        out += ["--num-prompts", str(n)]
    return out


def bench(server: Server, w: rm.ClientWorkload, out_dir: Path, stem: str, num_prompts: int | None
          ) -> dict[str, Any]:
    """One ``vllm bench serve`` run (client on OTHER_CORE); its result, the
    generated texts dropped and the load averages added."""
    server.reset_prefix_cache()
    flags = with_num_prompts(rm.client_flags(w), num_prompts)
    cmd = ["taskset", "-c", str(OTHER_CORE), VLLM_PYTHON, str(HERE / "real_vllm" / "bench_client.py"),
           "--backend", "vllm", "--base-url", server.base, "--model", server.model_dir, *flags,
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
           "--save-result", "--save-detailed", "--result-dir", str(out_dir), "--result-filename",
           f"{stem}.json"]
    before = loadavg()
    t0 = time.monotonic()
    log = out_dir / f"{stem}.client.log"
    with log.open("w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    if code != 0:
        raise SystemExit(f"{stem}: vllm bench serve failed (status {code}); see {log}")
    path = out_dir / f"{stem}.json"
    result: dict[str, Any] = json.loads(path.read_text())
    if result.get("failed") or not result.get("completed"):
        # Not a result to keep (nor to skip on resuming).
        bad = path.with_suffix(".failed.json")
        path.rename(bad)
        raise SystemExit(f"{stem}: {result.get('failed')} requests failed, {result.get('completed')} "
                         f"completed; see {bad} and {log}")
    result.pop("generated_texts", None)
    result["engine_vs_vllm"] = {"engine": server.engine, "workload": w.name, "client_flags": flags,
                                "wall_s": round(time.monotonic() - t0, 2),
                                "loadavg_before_after": [before, loadavg()],
                                "finished": datetime.now().isoformat(timespec="seconds")}
    path.write_text(json.dumps(result) + "\n")
    log.unlink()
    return result


def run_path(out_dir: Path, workload: str, repeat: int, engine: str) -> Path:
    return out_dir / f"{workload}.{engine}.r{repeat}.json"


def cmd_run(args: argparse.Namespace) -> None:
    workloads = args.workloads or list(WORKLOADS)
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"--workloads: unknown {unknown}; known: {list(WORKLOADS)}")
    tag_dir = RESULTS / args.tag
    for model in args.models:
        out_dir = tag_dir / model
        todo = [(w, k, e) for w, k, e in run_order(workloads, args.repeats)
                if not run_path(out_dir, w, k, e).exists()]
        if not todo:
            print(f"{model}: every run exists", flush=True)
            continue
        check_quiet(args.allow_busy)
        check_no_foreign_servers()

        def warm(s: Server, out_dir: Path = out_dir) -> None:
            bench(s, WARMUP, out_dir, f"warmup.{s.engine}", None)

        pair = start_pair(model, out_dir, warm)
        try:
            for w, k, e in todo:
                stem = run_path(out_dir, w, k, e).stem
                r = bench(pair.servers[e], WORKLOADS[w], out_dir, stem, args.num_prompts)
                print(f"  {stem}: {r['completed']} done, {r['output_throughput']:.1f} tok/s, "
                      f"mean TTFT {r['mean_ttft_ms']:.1f} ms, mean TPOT {r['mean_tpot_ms']:.2f} ms, "
                      f"load {r['engine_vs_vllm']['loadavg_before_after']}", flush=True)
        finally:
            pair.stop()
    cmd_report(args)


def check_quiet(allow_busy: bool) -> None:
    load = load1()
    if load > MAX_IDLE_LOAD and not allow_busy:
        raise SystemExit(f"the 1-minute load average is {load:.2f} (> {MAX_IDLE_LOAD}): the machine is "
                         "busy and the timings would measure that; wait, or give --allow-busy for a "
                         "smoke run")


# ---------------------------------------------------------------------------
# report


def idle_totals(windows: Any) -> Any:
    """Each idle window's CPU summed over the server's processes (files of
    an older harness hold one number)."""
    if isinstance(windows, list):
        return [round(sum(w.values()), 1) for w in windows]
    return windows


def cmd_report(args: argparse.Namespace) -> None:
    tag_dir = RESULTS / args.tag
    lines = [f"# kvsched serve vs vLLM {args.tag}", "",
             "Made by `benchmarks/engine_vs_vllm.py report`; each cell the median [min-max] over "
             "repeats, measured by `vllm bench serve`. kvsched/vLLM above 1 is better for kvsched on "
             "throughput, worse on latency. Load: the 1-minute load average before each run (min-max); "
             "a quiet machine reads below 1.", ""]
    for model_dir in sorted(p for p in tag_dir.iterdir() if p.is_dir()):
        for e in ENGINES:
            meta_path = model_dir / f"{e}.server.json"
            if meta_path.exists():
                m = json.loads(meta_path.read_text())
                lines.append(f"- {model_dir.name} {e}: start-up {m['startup_s']} s, "
                             f"{m['kv_cache_tokens']:,} KV tokens ({m['kv_cache_tokens_source']}), "
                             f"idle CPU {idle_totals(m['idle_cpu_percent'])} % of a core "
                             f"({IDLE_SAMPLE_S:.0f}-s windows "
                             f"after the warm-up), pinned: {m['pinning']['pinned']}")
        lines.append("")
        for w in WORKLOADS:
            results: dict[str, list[dict[str, Any]]] = {}
            for e in ENGINES:
                results[e] = [json.loads(p.read_text()) for p in sorted(model_dir.glob(f"{w}.{e}.r*.json"))
                              if not p.name.endswith(".failed.json")]
            if not any(results.values()):
                continue
            prompts = {r["completed"] for rs in results.values() for r in rs}
            loads = [float(r["engine_vs_vllm"]["loadavg_before_after"][0][0])
                     for rs in results.values() for r in rs if "engine_vs_vllm" in r]
            load = f", load {min(loads):.2f}-{max(loads):.2f}" if loads else ""
            lines += [f"## {model_dir.name} / {w} ({'/'.join(map(str, sorted(prompts)))} requests "
                      f"completed{load})", "", *workload_table(results), ""]
    text = "\n".join(lines) + "\n"
    (tag_dir / "README.md").write_text(text)
    print(text)


# ---------------------------------------------------------------------------
# parity


class TokenNames:
    """Top-logprobs keys as token ids: vLLM sends "token_id:N"
    (``return_tokens_as_token_ids``); a server that sends each token's text
    instead (kvsched serve ignores that field) is mapped back through the
    tokenizer, where the text names one id."""

    def __init__(self, model_dir: str) -> None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(Path(model_dir, "tokenizer.json")))
        self.ids_of: dict[str, list[int]] = {}
        for i in range(tok.get_vocab_size()):
            self.ids_of.setdefault(tok.decode([i], skip_special_tokens=False), []).append(i)

    def __call__(self, key: str) -> str:
        if key.startswith("token_id:"):
            return key.removeprefix("token_id:")
        ids = self.ids_of.get(key, [])
        return str(ids[0]) if len(ids) == 1 else f"?{key!r}"


def complete(server: Server, prompt: list[int], names: TokenNames) -> tuple[Completion, dict[str, Any]]:
    body = {"model": server.model_dir, "prompt": prompt, "max_tokens": PARITY_MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "logprobs": 5, "return_token_ids": True,
            "return_tokens_as_token_ids": True}
    req = urllib.request.Request(server.base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.loads(r.read())
    choice = reply["choices"][0]
    ids = [int(t) for t in choice["token_ids"]]
    top = [{names(key): float(lp) for key, lp in entry.items()}
           for entry in choice["logprobs"]["top_logprobs"]]
    if len(ids) != PARITY_MAX_TOKENS:
        raise SystemExit(f"{server.engine}: {len(ids)} tokens back, not {PARITY_MAX_TOKENS} "
                         "(ignore_eos, max_tokens)")
    return Completion(ids, top, [float(x) for x in choice["logprobs"]["token_logprobs"]]), reply


def run_parity_mode(server: Server, prompts: list[list[int]], concurrent_: bool, names: TokenNames
                    ) -> list[Completion]:
    server.reset_prefix_cache()
    if not concurrent_:
        return [complete(server, p, names)[0] for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return [c for c, _ in pool.map(lambda p: complete(server, p, names), prompts)]


def cmd_parity(args: argparse.Namespace) -> None:
    tag_dir = RESULTS / args.tag
    model = args.models[0]
    out_dir = tag_dir / model
    check_no_foreign_servers()
    config = json.loads(Path(MODELS[model], "config.json").read_text())
    prompts = parity_prompts(int(config["vocab_size"]), args.parity_prompts)
    names = TokenNames(MODELS[model])

    def warm(s: Server) -> None:
        complete(s, prompts[0][:32], names)

    pair = start_pair(model, out_dir / "parity-servers", warm)
    outs: dict[str, dict[str, list[Completion]]] = {}
    try:
        for mode in ("sequential", "concurrent"):
            outs[mode] = {}
            for e in ENGINES:
                t0 = time.monotonic()
                outs[mode][e] = run_parity_mode(pair.servers[e], prompts, mode == "concurrent", names)
                print(f"  parity {mode} {e}: {time.monotonic() - t0:.1f} s", flush=True)
    finally:
        pair.stop()
    report: dict[str, Any] = {"model": model, "prompts": len(prompts), "max_tokens": PARITY_MAX_TOKENS,
                              "seed": PARITY_SEED, "prompt_lens": [len(p) for p in prompts], "modes": {}}
    md = [f"# Greedy parity, kvsched serve vs vLLM: {model}", "",
          f"{len(prompts)} prompts of random token ids ({PARITY_MIN_LEN}-{PARITY_MAX_LEN} tokens, seed "
          f"{PARITY_SEED}; every {PARITY_SHARE_EVERY}th opens with half the one before), "
          f"{PARITY_MAX_TOKENS} tokens each, temperature 0, ignore_eos, float32 both.", ""]
    for mode, by_engine in outs.items():
        rows = [compare(len(p), {e: by_engine[e][i] for e in ENGINES}) for i, p in enumerate(prompts)]
        same = sum(r["identical"] for r in rows)
        self_same = {e: sum(first_difference(outs["sequential"][e][i], outs["concurrent"][e][i]) is None
                            for i in range(len(prompts))) for e in ENGINES}
        lp_diff = max((r["max_abs_logprob_diff"] or 0.0) for r in rows)
        unnamed = sum(k.startswith("?") for c in by_engine["kvsched"] for t in c.top for k in t)
        report["modes"][mode] = {"identical": same, "max_abs_logprob_diff": lp_diff,
                                 "kvsched_top_keys_unnamed": unnamed, "rows": rows}
        md += [f"## {mode}: {same}/{len(prompts)} identical", "",
               f"Largest |vLLM - kvsched| of a chosen token's logprob where the tokens agree: {lp_diff:.2e}. "
               f"kvsched's top-logprob keys (text) that the tokenizer could not name as one id: {unnamed}.",
               ""]
        diffs = [(i, r) for i, r in enumerate(rows) if not r["identical"]]
        if diffs:
            md += ["| prompt | len | position | vLLM top-2 (token: logprob) | vLLM gap | kvsched top-2 | "
                   "kvsched gap |", "| --- | --- | --- | --- | --- | --- | --- |"]
            for i, r in diffs:
                def top2(x: dict[str, Any]) -> str:
                    return ", ".join(f"{t}: {lp:.4f}" for t, lp in x["top2"])
                md.append(f"| {i} | {r['prompt_len']} | {r['position']} | {top2(r['vllm'])} | "
                          f"{r['vllm']['gap']} | {top2(r['kvsched'])} | {r['kvsched']['gap']} |")
            md.append("")
        if mode == "concurrent":
            report["sequential_vs_concurrent_identical"] = self_same
            md += [f"Each engine against itself, sequential vs concurrent: "
                   f"vLLM {self_same['vllm']}/{len(prompts)}, kvsched {self_same['kvsched']}/{len(prompts)}",
                   ""]
    # One file for every model checked under this tag: this model's entry replaced.
    path = tag_dir / "parity.json"
    every = json.loads(path.read_text()) if path.exists() else {}
    every[model] = {**report, "markdown": md}
    path.write_text(json.dumps(every, indent=1) + "\n")
    lines = [line for m in every.values() for line in m["markdown"]]
    (tag_dir / "parity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(md))


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}; the servers are stopped, finished runs kept")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "report", "parity"))
    p.add_argument("--tag", required=True, help="the results' directory under results_engine_vs_vllm/")
    p.add_argument("--models", nargs="+", default=["llama"], choices=list(MODELS),
                   help="checkpoints (run_matrix.MODELS; default: llama; parity takes the first)")
    p.add_argument("--repeats", type=int, default=3, help="runs per workload and engine (default: 3)")
    p.add_argument("--workloads", nargs="*", help=f"default: all of {list(WORKLOADS)}")
    p.add_argument("--num-prompts", type=int, help="override every workload's --num-prompts (smoke runs)")
    p.add_argument("--parity-prompts", type=int, default=PARITY_PROMPTS,
                   help="parity: number of prompts (default: %(default)s)")
    p.add_argument("--allow-busy", action="store_true",
                   help=f"run even when the 1-minute load average is above {MAX_IDLE_LOAD}")
    args = p.parse_args(argv)
    # SIGTERM (and SIGINT, which a shell's background job ignores) stop the
    # servers: the exit runs every `finally`.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    if args.repeats < 1:
        raise SystemExit(f"--repeats={args.repeats}: must be at least 1")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise SystemExit(f"--num-prompts={args.num_prompts}: must be at least 1")
    {"run": cmd_run, "report": cmd_report, "parity": cmd_parity}[args.command](args)


if __name__ == "__main__":
    main()
