"""The one-line progress bar of long commands (simulate, generate), on stderr."""

from __future__ import annotations

import sys


def draw_progress(done: int, total: int, note: str, unit: str = "requests") -> None:
    """Redraw ``[#####.....] done/total requests  note``; a newline once complete."""
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}  {note}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()
