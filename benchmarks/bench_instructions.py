"""Simulator cost in CPU instructions per request, counted by valgrind.

    python benchmarks/bench_instructions.py                       # random at 20 req/s, 4k and 8k requests
    python benchmarks/bench_instructions.py --sizes 500 1000 --rate 20   # ~40 s; same per-request count
    PYTHONPATH=build/compiled python benchmarks/bench_instructions.py   # the compiled build

Wall and CPU seconds on a shared virtual machine move by +-20 % from one run
to the next (the same build timed 204 s and 231 s for 1M requests on two
days), which hides the few per cent a hot-path change is worth, and this
machine's hypervisor exposes no hardware counters to ``perf stat``. So this
counts instructions with ``valgrind --tool=callgrind`` (deterministic: the
same build gives the same count however loaded the machine is) for two
workload sizes and reports the difference per request, which cancels
start-up (imports, loading the roofline, the end-of-run metrics). Each run
is ``bench_simulate.py --child`` under valgrind, about 40x slower than
native, so the sizes are small; the two run side by side.

Prints instructions per request, and writes ``--callgrind-dir`` files that
``callgrind_annotate --inclusive=yes FILE`` breaks down per function.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def count(size: int, rate: str, backend: str, out_dir: Path) -> int:
    """Instructions of one simulation of ``size`` random requests."""
    out = out_dir / f"callgrind.random-{size}-{rate}.out"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
           str(HERE / "bench_simulate.py"), "--child", f"random:{size}:{rate}",
           "--step-time-backend", backend]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"valgrind run for {size} requests failed:\n{proc.stderr[-2000:]}")
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if match is None:
        raise SystemExit(f"valgrind printed no instruction count for {size} requests")
    return int(match.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs=2, default=[4000, 8000], metavar=("SMALL", "LARGE"),
                    help="the two workload sizes (requests); default 4000 8000")
    ap.add_argument("--rate", default="20", help="request rate (req/s, or inf); default 20")
    ap.add_argument("--step-time-backend", default="roofline", choices=["auto", "measured", "roofline"])
    ap.add_argument("--callgrind-dir", type=Path, default=Path("/tmp"),
                    help="where the callgrind files go (default /tmp)")
    args = ap.parse_args()
    small, large = args.sizes
    if not 0 < small < large:
        raise SystemExit(f"--sizes {small} {large}: give two sizes, the first smaller, both > 0")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    args.callgrind_dir.mkdir(parents=True, exist_ok=True)
    # Both sizes at once: valgrind runs one thread, the machine has two cores.
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda n: count(n, args.rate, args.step_time_backend, args.callgrind_dir),
                        (small, large))
    per_request = (b - a) / (large - small)
    print(f"random at {args.rate} req/s, {args.step_time_backend}: {a:,} instructions for {small:,} "
          f"requests, {b:,} for {large:,}: {per_request:,.0f} per request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
