"""Optional compiled build of the simulator's hot path.

    pip install mypy setuptools
    KVSCHED_COMPILE=1 pip install --no-build-isolation .

compiles the modules below with mypyc (part of mypy): the same typed Python
source, turned into C extensions, about twice as fast per simulated step
(``benchmarks/bench_simulate.py`` prints which build it timed). Without
``KVSCHED_COMPILE=1`` (and for editable installs, which would shadow the
sources being edited) nothing is compiled and every module stays plain
Python. Both builds make the same decisions: CI replays the conformance
goldens and compares simulations on the compiled build
(``benchmarks/check_compiled.py``).
"""

from __future__ import annotations

import os

from setuptools import setup

# The modules every simulated step runs through (measured with py-spy on
# random and trace workloads: the scheduler core, the request, the
# simulator's rank, instance and event loop). Modules that only set things
# up stay interpreted.
COMPILED_MODULES = [
    "kvsched/request.py",
    "kvsched/core/block_pool.py",
    "kvsched/core/kv_cache_manager.py",
    "kvsched/core/output.py",
    "kvsched/core/request_queue.py",
    "kvsched/core/scheduler.py",
    "kvsched/core/fast_forward.py",
    "kvsched/sim/rank.py",
    "kvsched/sim/instance.py",
    "kvsched/sim/cluster.py",
    "kvsched/sim/client.py",
    "kvsched/sim/samples.py",
    "kvsched/perf/decode_steps.py",
]


def _ext_modules() -> list[object]:
    flag = os.environ.get("KVSCHED_COMPILE", "")
    if flag not in ("", "0", "1"):
        raise SystemExit(f"KVSCHED_COMPILE={flag!r}: use 1 to compile the hot path with mypyc, "
                         "or leave it unset")
    if flag != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as e:
        raise SystemExit("KVSCHED_COMPILE=1 needs mypyc: `pip install mypy setuptools`, then "
                         "install with --no-build-isolation") from e
    return list(mypycify(COMPILED_MODULES, opt_level="3"))


setup(ext_modules=_ext_modules())
