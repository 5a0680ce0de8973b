"""Check kvsched's performance model against every usable published number.

A thin wrapper: the data and comparisons live in ``kvsched.validation.published``,
the tables and the doc update in ``kvsched.validation.published_report``.

    python benchmarks/validate_perf.py                      # every table, full Splitwise table last
    python benchmarks/validate_perf.py --update-doc docs/validation.md
    python benchmarks/validate_perf.py --check-doc docs/validation.md   # exit 1 if the doc is stale
"""

from __future__ import annotations

import sys

from kvsched.validation.published_report import main

if __name__ == "__main__":
    sys.exit(main())
