"""SIGINT, SIGTERM and SIGHUP to the controller, handled alike (issue 18).

`deliver_signals()` (the CLI wraps a command in it) turns the first of these signals into
`Interrupted`, a KeyboardInterrupt that knows its signal, so every `except BaseException` /
`finally` that stops workers and removes temporary folders runs for all three as it does for
Ctrl-C. Later signals while that exception unwinds are swallowed: a second Ctrl-C half a second
after the first must not cut the clean-up short. Code that must not be torn in the middle (stopping
a process group, removing a folder, publishing a record) runs `shielded()`: a first signal that
arrives inside is held and raised when the section ends.

Without `deliver_signals()` (the library, tests) nothing changes: Python's own SIGINT handler
raises KeyboardInterrupt at once and `shielded()` holds nothing.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
import threading
from pathlib import Path

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The controller was told to stop by `signum`; the process should exit with 128 + signum."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class _State:
    installed = False
    received: int | None = None  # the first signal
    raised = False  # Interrupted has been raised for it
    shield_depth = 0


_state = _State()


def _handler(signum, frame) -> None:
    if _state.received is not None:
        return  # a repeated signal: the first one's clean-up is under way
    _state.received = signum
    if _state.shield_depth == 0:
        _state.raised = True
        raise Interrupted(signum)


def exit_status(exc: BaseException) -> int:
    """128 + the signal that interrupted (130 for a KeyboardInterrupt of unknown origin)."""
    return exc.exit_status if isinstance(exc, Interrupted) else 128 + signal.SIGINT


def signal_name(exc: BaseException) -> str:
    return exc.name if isinstance(exc, Interrupted) else "SIGINT"


@contextlib.contextmanager
def deliver_signals():
    """Within: SIGINT, SIGTERM and SIGHUP raise Interrupted once; then the old handlers again.
    Outside the main thread (where Python cannot set handlers) a no-op."""
    if threading.current_thread() is not threading.main_thread() or _state.installed:
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    _state.installed, _state.received, _state.raised, _state.shield_depth = True, None, False, 0
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        _state.installed = False


@contextlib.contextmanager
def shielded():
    """A section that a signal must not cut in two: a first signal arriving inside is raised as
    Interrupted when it ends (chained to whatever else the section raised)."""
    _state.shield_depth += 1
    try:
        yield
    except BaseException as e:
        _state.shield_depth -= 1
        if _pending() and not isinstance(e, KeyboardInterrupt):
            _state.raised = True
            raise Interrupted(_state.received) from e
        raise
    _state.shield_depth -= 1
    if _pending():
        _state.raised = True
        raise Interrupted(_state.received)


def _pending() -> bool:
    return _state.shield_depth == 0 and _state.received is not None and not _state.raised


@contextlib.contextmanager
def temporary_folder(prefix: str, dir: Path | str | None = None):
    """A temporary folder (its Path), removed whatever ends the block; a signal cannot cut the
    removal in two (shielded), so a first signal arriving just then still leaves no folder."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
    try:
        yield path
    finally:
        with shielded():
            shutil.rmtree(path, ignore_errors=True)
