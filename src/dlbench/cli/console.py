"""Where the command line writes: `out` (results, on stdout) and `err` (progress, notes, errors, on
stderr), `fail` (one error message, then the exit status), and the progress bar of long runs.

Both consoles are made safe for the terminal: every string that reaches them (a framework's name
from a record, a reason, a file name) has its control characters shown as escapes (`\\x1b]0;...`
prints as those characters, never retitles the window or clears the screen), and so do the
Unicode controls that reorder or break lines. Only rich's own control codes (its colours and
cursor moves) reach the terminal raw. `safe` does the same to a string before a table lays it out,
so that the escape's width is counted; the plain table of `dlbench results` uses it too."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

import typer
from rich.console import Console
from rich.segment import Segment
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

# C0 and C1 controls but tab and newline; DEL; the line and paragraph separators and the
# bidirectional overrides and isolates (which reorder what the reader sees)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str) -> str:
    """`text` with its control characters written as escapes (ESC as the four characters \\x1b)."""
    return _CONTROL.sub(_escaped, text)


class SafeConsole(Console):
    """A rich Console that escapes control characters in everything it prints but its own codes."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control or not _CONTROL.search(segment.text)
            else Segment(safe(segment.text), segment.style, segment.control)
            for segment in buffer)


# Off a terminal rich assumes 80 columns and truncates; tables here are wide, so allow more.
out = SafeConsole(width=None if sys.stdout.isatty() else 220)
err = SafeConsole(stderr=True, width=None if sys.stderr.isatty() else 220)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` as the error and return the exit to raise: 2 is bad input, 1 a failure."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def progress_bar() -> Progress:
    """The progress line of `run`, `calibrate` and the kernels and distributed suites, on stderr."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=False)
