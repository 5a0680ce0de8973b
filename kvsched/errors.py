"""Who is to blame for an error, and how it reads.

kvsched raises :class:`UserInputError` where input from outside the program
(a flag, a file, a run spec, an API argument) is wrong: its message names
the field, the value and the fix, and the command line prints it as one
line with exit status 2. Every other exception is kvsched's own bug: the
command line prints it as an internal error (exit status 3) asking for a
report, so a broken invariant is never blamed on the user.

``UserInputError`` is a ``ValueError``: library callers that catch
``ValueError`` for bad arguments keep working.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Input from outside kvsched is wrong; the message says what to fix."""


class CannotServe(UserInputError):
    """The deployment as configured cannot serve the load: the simulation
    reached a state in which nothing would ever progress (an admission gate
    that holds every request, say). An answer about the settings, not a bug."""


REPORT_HINT = ("this is a bug in kvsched: please report it with the command line at the kvsched "
               "issue tracker (run with --debug before the command to see the traceback)")


def one_line(text: str, limit: int = 2000) -> str:
    """``text`` on one line (an error message is one line), at most ``limit`` characters."""
    flat = " ".join(part.strip() for part in text.splitlines() if part.strip())
    return flat if len(flat) <= limit else flat[:limit] + f"... ({len(flat)} characters)"
