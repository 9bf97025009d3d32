"""Where the command line writes: `out` (results, on stdout) and `err` (progress, notes, errors, on
stderr), `fail` (one error message, then the exit status), and the progress bar of long runs."""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

# Off a terminal rich assumes 80 columns and truncates; tables here are wide, so allow more.
out = Console(width=None if sys.stdout.isatty() else 220)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 220)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` as the error and return the exit to raise: 2 is bad input, 1 a failure."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def progress_bar() -> Progress:
    """The progress line of `run`, `calibrate` and the kernels and distributed suites, on stderr."""
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=err, transient=False)
