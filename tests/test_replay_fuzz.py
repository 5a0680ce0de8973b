"""File fuzzer for replay scenarios (issue 11): committed scenarios, corrupted
at random (truncation, bad bytes, huge, negative and non-finite numbers,
wrong types, missing, extra, misspelled and duplicate keys), each run through
``kvsched.cli.main(["replay", FILE])`` in a worker process under a memory
limit (RLIMIT_AS, 200 MB above the warmed-up worker) and a 2 s time limit
per case. Every file must either replay (exit 0) or give exactly one line
``kvsched: error: FILE: ...`` (exit 2); anything else fails the test with
the case to reproduce it.

KVSCHED_FILE_FUZZ_CASES sets the number of cases (default 300, about 10 s);
KVSCHED_FILE_FUZZ_SEED the seed (default 0).

This module also holds the harness ``tests/test_calibrate_fuzz.py`` uses.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CASE_SECONDS = 2.0
CASE_MEMORY = 200 * 2**20
DEFAULT_CASES = 300


def fuzz_cases() -> int:
    return int(os.environ.get("KVSCHED_FILE_FUZZ_CASES", DEFAULT_CASES))


def fuzz_seed() -> int:
    return int(os.environ.get("KVSCHED_FILE_FUZZ_SEED", 0))


# --------------------------------------------------------------------------
# Corruptions


class Pairs(list[tuple[str, Any]]):
    """A JSON object written with its pairs as they are (a key may repeat)."""


def dumps(value: Any) -> str:
    """JSON text of ``value``; Pairs keep repeated keys; NaN and Infinity
    are written as Python's json writes them."""
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {dumps(v)}" for k, v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


def odd_values(rng: random.Random, old: Any) -> Any:
    """A replacement value: out of range, of the wrong type, or at a bound."""
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.5:
        if rng.random() < 0.4:  # in range, often valid: the run must still be right
            return rng.randint(0, max(4, 4 * old))
        return rng.choice([0, 1, -1, old + 1, old - 1, old * 2, -old, 2**21, 2**24, 2**31 - 1, 2**31,
                           10**7 - 1, 10**7, 2**63, 10 ** rng.randint(6, 40), 10**400])
    return rng.choice([
        None, True, False, "", "x", "8", str(old)[:20], -1, -(10**9), 0, 1, 2.5, -0.0, 1e300, -1e300,
        math.nan, math.inf, -math.inf, 10**12, 10**30, 10 ** rng.randint(100, 4000), [], [1], [-1],
        [None], ["a"], [[1]], {}, {"a": 1}, 1e-300, 3.0, 2**62,
    ])


def _containers(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every dict and list inside ``value`` with its path."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    if isinstance(value, dict | list) and not isinstance(value, Pairs):
        out.append((path, value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        # Long lists (prompts) contribute their first entries only.
        for k, v in list(items)[:64]:
            out.extend(_containers(v, (*path, k)))
    return out


def mutate_structure(rng: random.Random, obj: Any, misspell: Callable[[str], str]) -> tuple[Any, str]:
    """One structural change to ``obj`` (in place where possible); the
    new object and a note of what changed."""
    containers = _containers(obj)
    if not containers:
        return obj, "nothing to change"
    path, target = rng.choice(containers)
    op = rng.choice(["replace", "replace", "replace", "delete", "extra", "misspell", "duplicate",
                     "wrap", "grow"])
    if isinstance(target, list):
        if not target or op in ("extra", "misspell", "duplicate"):
            target.append(odd_values(rng, 0))
            return obj, f"append to {path}"
        i = rng.randrange(len(target))
        if op == "delete":
            del target[i]
            return obj, f"delete {path}[{i}]"
        if op == "grow":
            target.extend(target[: rng.randint(1, 8)] * rng.randint(1, 50))
            return obj, f"grow {path}"
        target[i] = odd_values(rng, target[i])
        return obj, f"replace {path}[{i}]"
    if not target:
        target["x"] = 1
        return obj, f"add x to {path}"
    key = rng.choice(list(target))
    if op == "delete":
        del target[key]
        return obj, f"delete {path}.{key}"
    if op == "extra":
        target[rng.choice(["description", "extra", "max_token", "prioirty", "num_gpu_block",
                           "request_ids", "rank", "lora_id", "speculative", "seed"])] = odd_values(rng, 1)
        return obj, f"extra key in {path}"
    if op == "misspell":
        target[misspell(key)] = target.pop(key)
        return obj, f"misspell {path}.{key}"
    if op == "duplicate":
        pairs = Pairs(target.items())
        pairs.insert(rng.randrange(len(pairs) + 1), (key, odd_values(rng, target[key])))
        if not path:
            return pairs, f"duplicate {key}"
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = pairs
        return obj, f"duplicate {path}.{key}"
    if op == "wrap":
        target[key] = [target[key]] if rng.random() < 0.5 else {"value": target[key]}
        return obj, f"wrap {path}.{key}"
    target[key] = odd_values(rng, target[key])
    return obj, f"replace {path}.{key}"


def misspell(rng: random.Random) -> Callable[[str], str]:
    def change(key: str) -> str:
        if len(key) < 3:
            return key + "_"
        i = rng.randrange(len(key) - 1)
        return rng.choice([key[:i] + key[i + 1:], key[:i] + key[i + 1] + key[i] + key[i + 2:],
                           key + "s", key.upper()])
    return change


def mutate_bytes(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    op = rng.choice(["truncate", "flip", "insert", "delete", "repeat", "bom"])
    n = len(data)
    i = rng.randrange(max(n, 1))
    if op == "truncate":
        return data[:i], f"truncate at {i}"
    if op == "flip":
        bad = bytes([rng.choice([0x00, 0xFF, 0xC3, 0x80, 0xE2, 0x22, 0x5B, 0x7B, 0x7D, 0x2C, 0x30])])
        return data[:i] + bad + data[i + 1:], f"byte {bad!r} at {i}"
    if op == "insert":
        junk = rng.choice([b"\xff\xfe", b"\xed\xa0\x80", b"NaN", b"-", b"1e999", b"[" * 2000, b"\x00",
                           b'"', b"{}", b",,"])
        return data[:i] + junk + data[i:], f"insert {junk[:8]!r} at {i}"
    if op == "delete":
        return data[:i] + data[i + rng.randint(1, 40):], f"delete bytes at {i}"
    if op == "repeat":
        j = min(n, i + rng.randint(1, 200))
        return data[:j] + data[i:j] * rng.randint(1, 5) + data[j:], f"repeat bytes {i}:{j}"
    return b"\xef\xbb\xbf" + data, "BOM"


def corrupt(rng: random.Random, obj: Any, text: Callable[[Any], str] = dumps) -> tuple[bytes, str]:
    """A corrupted file from a valid object: 1-3 structural changes, then
    (sometimes) byte-level damage."""
    notes = []
    obj = json.loads(json.dumps(obj))
    change = misspell(rng)
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        obj, note = mutate_structure(rng, obj, change)
        notes.append(note)
    data = text(obj).encode("utf-8", "surrogatepass")
    if not notes or rng.random() < 0.3:
        data, note = mutate_bytes(rng, data)
        notes.append(note)
    return data, "; ".join(notes)


# --------------------------------------------------------------------------
# The worker: cases in one process, each under the limits


class CaseTimeout(BaseException):
    """Raised by the alarm: a BaseException so no library handler eats it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise CaseTimeout


def _vm_size() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")  # pragma: no cover


def check_cli(argv: list[str], path: str) -> str:
    """Run the CLI in-process; "ok" (exit 0), "refused" (exit 2, one line
    naming ``path``), else a description of the failure."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = __import__("kvsched.cli", fromlist=["main"]).main(argv)
    lines = err.getvalue().splitlines()
    if code == 0:
        return "ok"
    if code == 2 and len(lines) == 1 and lines[0].startswith("kvsched: error: ") and path in lines[0]:
        return "refused"
    return f"exit {code}, stderr {err.getvalue()[:300]!r}"


Case = Callable[[random.Random, Path], tuple[list[str], str, str]]


def run_worker(make_case: Case, count: int, seed: int, folder: Path,
               warm_up: Callable[[Path], None]) -> dict[str, Any]:
    """Run ``count`` cases; each is (argv, the corrupted file's path, note)."""
    warm_up(folder)  # imports and caches, before the baseline is taken
    limit = _vm_size() + CASE_MEMORY
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    outcomes: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    slowest = 0.0
    for index in range(count):
        rng = random.Random(f"{seed}-{index}")
        argv, path, note = make_case(rng, folder)
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
        try:
            outcome = check_cli(argv, path)
        except CaseTimeout:
            outcome = f"took more than {CASE_SECONDS} s"
        except MemoryError:
            outcome = f"MemoryError (more than {CASE_MEMORY >> 20} MB)"
        except BaseException as e:  # any other exception is the finding
            outcome = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        slowest = max(slowest, time.perf_counter() - t0)
        key = outcome if outcome in ("ok", "refused") else "failed"
        outcomes[key] = outcomes.get(key, 0) + 1
        if key == "failed" and len(failures) < 20:
            try:
                head = Path(path).read_bytes()[:400].decode("utf-8", "replace")
            except OSError:
                head = ""
            failures.append({"case": index, "seed": seed, "note": note, "outcome": outcome, "file": head})
    return {"cases": count, "outcomes": outcomes, "failures": failures, "slowest_s": round(slowest, 3)}


def run_in_subprocess(script: Path, fmt: str, folder: Path) -> dict[str, Any]:
    """Run a fuzz file's worker (``script --worker FMT SEED COUNT FOLDER``)
    and return its summary."""
    count, seed = fuzz_cases(), fuzz_seed()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), "--worker", fmt, str(seed), str(count), str(folder)],
                          capture_output=True, text=True, env=env, timeout=60 + 3 * CASE_SECONDS * count,
                          cwd=HERE.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{fmt}: {summary['cases']} cases, {summary['outcomes']}, slowest {summary['slowest_s']} s")
    return summary


def assert_clean(summary: dict[str, Any]) -> None:
    assert not summary["failures"], json.dumps(summary["failures"], indent=1)[:6000]
    assert sum(summary["outcomes"].values()) == summary["cases"]


# --------------------------------------------------------------------------
# Replay scenarios

CORPUS = sorted([*(HERE / "conformance" / "scenarios").glob("*.json"),
                 *(HERE / "conformance" / "cadence").glob("*.json")])
# Small ones (a case replays in milliseconds).
SEEDS = [p for p in CORPUS if p.stat().st_size < 6000]


def replay_case(rng: random.Random, folder: Path) -> tuple[list[str], str, str]:
    source = rng.choice(SEEDS)
    data, note = corrupt(rng, json.loads(source.read_text()))
    path = folder / "scenario.json"
    path.write_bytes(data)
    return ["replay", str(path)], str(path), f"{source.name}: {note}"


def replay_warm_up(folder: Path) -> None:
    path = folder / "warm.json"
    path.write_text(SEEDS[0].read_text())
    assert check_cli(["replay", str(path)], str(path)) == "ok"


# ~8 s: the input fuzzers' slow tier.
@pytest.mark.slow
def test_replay_scenario_fuzz(tmp_path: Path) -> None:
    assert len(SEEDS) >= 50
    summary = run_in_subprocess(Path(__file__), "replay", tmp_path)
    assert_clean(summary)
    # The corruptions reach both outcomes.
    assert summary["outcomes"].get("ok", 0) > 0 and summary["outcomes"].get("refused", 0) > 0


def test_the_harness_catches_a_hang_and_a_blow_up(tmp_path: Path) -> None:
    """The limits are live: a case that sleeps past the alarm or allocates
    past the memory limit is reported, not waited for."""
    script = tmp_path / "bad_worker.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "import test_replay_fuzz as f\n"
        "import kvsched.cli\n"
        "def main(argv):\n"
        "    if argv[0] == 'hang':\n"
        "        t = time.monotonic()\n"
        "        while time.monotonic() - t < 10: pass\n"
        "    return len(bytearray(400 * 2**20))\n"
        "kvsched.cli.main = main\n"
        "cases = [['hang'], ['big']]\n"
        "summary = f.run_worker(lambda rng, folder: (cases.pop(0), 'x', ''), 2, 0,\n"
        "                       f.Path(sys.argv[1]), lambda folder: None)\n"
        "print(f.json.dumps(summary))\n")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    outcomes = [f["outcome"] for f in summary["failures"]]
    assert outcomes[0].startswith("took more than") and outcomes[1].startswith("MemoryError"), outcomes


def _worker_main(argv: list[str]) -> int:
    fmt, seed, count, folder = argv[0], int(argv[1]), int(argv[2]), Path(argv[3])
    assert fmt == "replay"
    print(json.dumps(run_worker(replay_case, count, seed, folder, replay_warm_up)))
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker_main(sys.argv[2:]))
