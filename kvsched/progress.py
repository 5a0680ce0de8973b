"""The one-line progress bar of long commands (simulate, generate, tune), on stderr."""

from __future__ import annotations

import sys
from typing import TextIO


def draw_progress(done: int, total: int, note: str, unit: str = "requests") -> None:
    """Redraw ``[#####.....] done/total requests  note``; a newline once complete."""
    width = 30
    filled = int(width * done / total) if total else width
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {unit}  {note}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


class ProgressBar:
    """A progress line that knows whether it is open: :meth:`close` ends it
    (a newline) when the work stopped before ``done`` reached ``total`` (a
    search whose total is an estimate), so what is printed next starts on a
    line of its own."""

    def __init__(self, unit: str, stream: TextIO | None = None) -> None:
        self.unit = unit
        self.stream = stream
        self.open = False

    def draw(self, done: int, total: int, note: str) -> None:
        out = self.stream if self.stream is not None else sys.stderr
        total = max(total, done)
        width = 30
        filled = int(width * done / total) if total else width
        out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {self.unit}  {note}")
        self.open = done < total
        if not self.open:
            out.write("\n")
        out.flush()

    def close(self) -> None:
        if self.open:
            out = self.stream if self.stream is not None else sys.stderr
            out.write("\n")
            out.flush()
            self.open = False
