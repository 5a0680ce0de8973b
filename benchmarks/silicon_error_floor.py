"""How much of kvsched's error on the silicon rows the rows themselves set.

    python benchmarks/silicon_error_floor.py                      # the data alone
    python benchmarks/silicon_error_floor.py --results OUT.json   # plus a validate_silicon --json run

1. Repeats: rows of aiconfigurator-core's silicon_sample.csv (vLLM, agg,
   H100/H200/B200) that describe the same deployment and load (model,
   system, precision, ISL, OSL, concurrency, TP, attention-DP, MoE TP/EP)
   but carry different measurements. Pairs with the same vLLM version
   bound run-to-run noise (some are one measurement recorded twice, rounded
   differently); pairs from different versions show how far vLLM itself
   moved. The kernel tables kvsched and AIConfigurator
   read are one version's (0.24), the rows are 0.12 to 0.19 and nightlies.
2. With ``--results`` (``benchmarks/validate_silicon.py --json``), on the
   held-out B200 rows: how kvsched's errors go with AIConfigurator's (both
   price kernels from the same tables), and kvsched's error on the rows
   where AIConfigurator's is small, i.e. where the tables describe the run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections import defaultdict
from typing import Any

from kvsched.validation.silicon_rows import load_rows

SYSTEMS = ("h100_sxm", "h200_sxm", "b200_sxm")


def repeats() -> dict[str, list[tuple[float, float]]]:
    """|a/b - 1| of TTFT and TPOT for every pair of distinct measurements of
    one configuration, split by whether the vLLM versions agree."""
    groups: dict[tuple[Any, ...], list[Any]] = defaultdict(list)
    for r in load_rows():
        if r.system in SYSTEMS:
            groups[(r.model_path, r.system, r.precision, r.isl, r.osl, r.concurrency, r.tp_size,
                     r.attention_dp_size, r.moe_tp_size, r.moe_ep_size)].append(r)
    out: dict[str, list[tuple[float, float]]] = {"same version": [], "different versions": []}
    for rows in groups.values():
        distinct = {(r.ttft_ms, r.tpot_ms): r for r in rows}.values()
        for a, b in itertools.combinations(distinct, 2):
            kind = "same version" if a.backend_version == b.backend_version else "different versions"
            out[kind].append((abs(a.ttft_ms / b.ttft_ms - 1), abs(a.tpot_ms / b.tpot_ms - 1)))
    return out


def shared_error(path: str, system: str = "b200_sxm") -> list[str]:
    with open(path) as f:
        data = json.load(f)
    rows = []
    for item in data["rows"]:
        row, k, a = item["row"], item["kvsched"].get("measured", {}), item.get("aic") or {}
        if row["system"] != system or "mean_ttft_ms" not in k or not a.get("tpot_ms"):
            continue
        rows.append((k["mean_ttft_ms"] / row["ttft_ms"] - 1, k["mean_tpot_ms"] / row["tpot_ms"] - 1,
                     a["ttft_ms"] / row["ttft_ms"] - 1, a["tpot_ms"] / row["tpot_ms"] - 1))
    lines = [f"{system}: {len(rows)} rows priced by both"]
    for name, ks, aic in (("TTFT", 0, 2), ("TPOT", 1, 3)):
        x = [r[ks] for r in rows]
        y = [r[aic] for r in rows]
        lines.append(f"  {name}: correlation of kvsched's and AIConfigurator's signed errors "
                     f"{statistics.correlation(x, y):.2f}")
        for limit in (0.05, 0.10):
            near = [abs(r[ks]) for r in rows if abs(r[aic]) <= limit]
            lines.append(f"  {name}: on the {len(near)} rows where AIConfigurator is within "
                         f"{limit:.0%}, kvsched's median |error| is {statistics.median(near):.1%}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="a benchmarks/validate_silicon.py --json output")
    args = ap.parse_args(argv)
    for kind, pairs in repeats().items():
        if pairs:
            apart = sum(1 for p in pairs if max(p) > 0.01)
            print(f"{kind}: {len(pairs)} pairs of repeated configurations ({apart} more than 1 % "
                  f"apart); median |ratio - 1| TTFT {statistics.median(p[0] for p in pairs):.1%}, "
                  f"TPOT {statistics.median(p[1] for p in pairs):.1%}")
    if args.results:
        print("\n".join(shared_error(args.results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
