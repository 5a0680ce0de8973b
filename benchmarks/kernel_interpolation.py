"""How well kvsched interpolates aiconfigurator-core's measured vLLM kernel tables.

    python benchmarks/kernel_interpolation.py [--system h100_sxm ...] [--markdown]

Leave-one-out: each interior measured point is predicted from the others by
kvsched.perf.kernels' scheme (piecewise linear along m / length / size /
tokens, bilinear across GEMM shapes, linear across batch sizes) and compared
with its measurement: GEMMs, attention, the MLA modules (the rows with
16-bit projections, every heads per GPU and KV dtype), the custom
all-reduce and DeepEP's MoE all-to-all. A left-out point's neighbours are twice as far apart as in
use, so these errors bound the interpolation error from above.
"""

from __future__ import annotations

import argparse
import sys

from kvsched.perf.kernels import leave_one_out_errors, load_tables

SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--system", action="append", help=f"systems (default: {', '.join(SYSTEMS)})")
    args = ap.parse_args(argv)
    print("| system | table | points | median abs error | p90 abs error |")
    print("| --- | --- | --- | --- | --- |")
    for system in args.system or SYSTEMS:
        tables = load_tables(system)
        results = leave_one_out_errors(tables, "bfloat16") + leave_one_out_errors(tables, "fp8")[:2]
        for r in results:
            print(f"| {system} | {r.table} | {r.points:,} | {r.median_abs_error:.1%} "
                  f"| {r.p90_abs_error:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
