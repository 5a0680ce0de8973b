"""``kvsched profile`` with run_matrix.py's CPU placement (issue 34).

The profile now measures the serving path around vLLM's steps (its own
streamed requests' client times against the iteration log), so it must run
the way the judged runs do: vLLM's model worker alone on core 0 (it binds
itself there, ``VLLM_CPU_OMP_THREADS_BIND=auto``), every other thread of
the server (API server, engine core) and the client (here kvsched profile
itself) on core 1. This starts ``kvsched profile`` with the given
arguments and, while it runs, pins its server's and its own threads as
``run_matrix.py --pin`` does (every 2 s: threads start later too), then
writes what it pinned and the load averages before and after to
``OUTPUT.pinning.json``.

    PYTHONPATH=. python benchmarks/real_vllm/profile_pinned.py --vllm-python V --model DIR ... --output P.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import run_matrix as rm

PIN_EVERY_S = 2.0


def server_pid(parent: int) -> int | None:
    """The vLLM API server kvsched profile started (its child)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == parent and rm.SERVER_MODULE.encode() in cmd:
            return int(entry.name)
    return None


def main(argv: list[str]) -> int:
    output = argv[argv.index("--output") + 1]
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    started = datetime.now().isoformat(timespec="seconds")
    proc = subprocess.Popen([sys.executable, "-m", "kvsched.cli", "profile", *argv])
    pinned: list[dict[str, Any]] = []
    first_pinned = None
    while proc.poll() is None:
        server = server_pid(proc.pid)
        if server is not None:
            done = rm.pin_server(rm.group_pids(server), extra=[proc.pid], warn=False)
            if any("pinned" in d for d in done):
                pinned = done
                first_pinned = first_pinned or datetime.now().isoformat(timespec="seconds")
        time.sleep(PIN_EVERY_S)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    meta = {"command": ["kvsched", "profile", *argv], "started": started,
            "finished": datetime.now().isoformat(timespec="seconds"), "first_pinned": first_pinned,
            "pinned": pinned, "loadavg_before_after": [load_before, load_after], "status": proc.returncode}
    Path(output + ".pinning.json").write_text(json.dumps(meta, indent=1) + "\n")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
