"""SIGINT, SIGTERM and SIGHUP for every command that starts processes (issue 18): `dlbench run`
(every suite kind), `check`, `calibrate`, `env create`. One decorator, `stops_on_signals`, so the
behaviour is the same everywhere: the first signal becomes `Interrupted` (execution/interrupts.py),
whose unwinding stops the worker's process group (and what escaped it, and its container), removes
the temporary folders and ends a half-built environment; later signals are swallowed so that they
cannot cut that clean-up short; the command prints one line naming the signal and exits 128 + it.

A command with more to say (how many runs were kept: `dlbench run`, every suite kind) catches
KeyboardInterrupt itself and ends with `interrupted`; the decorator's own line is for the others."""

from __future__ import annotations

import contextlib
import functools

import typer
from rich.markup import escape

from ..execution.interrupts import deliver_signals, exit_status, signal_name
from .console import err


def stops_on_signals(command):
    """Run `command` with the signals delivered as Interrupted; an interrupt ends it with one line
    and exit 128 + the signal (the worker and its folder are gone by then)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        with deliver_signals():
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt as e:
                say(f"interrupted by {signal_name(e)}: workers stopped, temporary folders removed, "
                    "nothing partial kept")
                raise typer.Exit(exit_status(e)) from None

    return wrapper


def say(line: str) -> None:
    """The one line of an interrupted command; a terminal that hung up (SIGHUP) may refuse it."""
    with contextlib.suppress(OSError):
        err.print(line, highlight=False, soft_wrap=True)


def interrupted(e: KeyboardInterrupt, kept: int, what: str, not_recorded: str | None = None):
    """The end of a command that records as it goes, interrupted by `e`: one line naming the signal,
    how many complete `what` (runs, kernel runs) the store holds and which one was cut (none is
    kept partial), then exit 128 + the signal."""
    cut = f"; {escape(not_recorded)} was not recorded" if not_recorded else ""
    say(f"interrupted by {signal_name(e)}: workers stopped; {kept} complete {what} are in the store, "
        f"none partial{cut}")
    raise typer.Exit(exit_status(e)) from None
