"""How the making of a framework's environment is shown (execution/environments.py reports it as
BuildProgress): one plain line per step, per package pip starts on and per long silence, which a CI
log (not a terminal) reads as well as a person; the same line on a progress bar; and at the end what
was built and what was reused from the cache."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID

from ..execution.environments import (
    BUILDING_IMAGE,
    BUILT,
    CACHED,
    CREATING,
    FAILED,
    INSTALLING,
    VERIFYING,
    WAITING,
    BuildProgress,
)
from .console import err

STEP_NAMES = {CREATING: "creating the venv", INSTALLING: "installing requirements", VERIFYING: "verifying",
              BUILDING_IMAGE: "building the image"}
BAR_WIDTH = 100  # what the progress bar's description shows of a line
LINE_WIDTH = 160  # of pip's own line, in a printed one (an "Installing collected packages" lists them all)

# pip's "Collecting numpy==2.1.0 (from -r /path/requirements-cpu.txt (line 2))": the part from "(from"
# says which file or package asked for it, which the step's first line said already
_PIP_FROM = re.compile(r" \(from .*\)$")


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def describe(progress: BuildProgress) -> str:
    """One line, plain text: which framework, which step (or cached, built, failed), how long so far."""
    who = f"{progress.framework} ({progress.flavour})"
    note = f" ({progress.note})" if progress.note else ""
    if progress.step == CACHED:
        return f"{who}: environment cached, reusing {progress.where}{note}"
    if progress.step == WAITING:
        return f"{who}: waiting for {progress.where}: {progress.note}"
    if progress.step == BUILT:
        return f"{who}: environment built in {_seconds(progress.elapsed_s)}: {progress.where}"
    if progress.step == FAILED:
        return f"{who}: environment build failed after {_seconds(progress.elapsed_s)}{note}"
    step = f"{who}: {STEP_NAMES.get(progress.step, progress.step)} [{_seconds(progress.elapsed_s)}]"
    output = _shorten(_PIP_FROM.sub("", progress.output), LINE_WIDTH) if progress.output else None
    if progress.silent_s is not None:
        return (f"{step}: still on {output}, nothing new for {_seconds(progress.silent_s)}" if output
                else f"{step}: nothing new for {_seconds(progress.silent_s)}")
    if output:
        return f"{step}: {output}"
    if progress.step in (CREATING, BUILDING_IMAGE):  # the first step: the line says a build starts, and where
        return f"{who}: building the environment {progress.where}: {STEP_NAMES[progress.step]}{note}"
    return step + note


def show_on_progress_bar(bar: Progress, task: TaskID, progress: BuildProgress) -> None:
    """`dlbench run` and the other commands with a progress bar: every event on the bar; a step's
    beginning (cached, built and failed included) and a silence also printed, so the log keeps them."""
    if progress.starts_step or progress.silent_s is not None:
        bar.console.print(escape(describe(progress)), highlight=False, soft_wrap=True)
    bar.update(task, description=f"[cyan]{escape(_shorten(describe(progress), BAR_WIDTH))}[/]")


class BuildLog:
    """The commands without a progress bar (`env create`, `check`): each event a line on stderr.
    Remembers how each environment ended (cached, built, failed) for `summary`."""

    def __init__(self, console: Console = err):
        self.console = console
        self.outcomes: dict[str, BuildProgress] = {}

    def __call__(self, progress: BuildProgress) -> None:
        if progress.step in (CACHED, BUILT, FAILED):
            self.outcomes[f"{progress.framework} ({progress.flavour})"] = progress
        self.console.print(escape(describe(progress)), highlight=False, soft_wrap=True)

    def summary(self) -> str | None:
        """"environments: built torch (cpu) in 3 min 5 s; reused from the cache: jax (cpu), in DIR"."""
        if not self.outcomes:
            return None
        parts = []
        built = [name for name, p in self.outcomes.items() if p.step == BUILT]
        if built:
            seconds = sum(p.elapsed_s for p in self.outcomes.values() if p.step == BUILT)
            parts.append(f"built {', '.join(built)} in {_seconds(seconds)}")
        cached = [name for name, p in self.outcomes.items() if p.step == CACHED]
        if cached:
            parts.append(f"reused from the cache: {', '.join(cached)}")
        failed = [name for name, p in self.outcomes.items() if p.step == FAILED]
        if failed:
            parts.append(f"failed: {', '.join(failed)}")
        folder = _common_folder(p.where for p in self.outcomes.values())
        return f"environments: {'; '.join(parts)}" + (f", in {folder}" if folder else "")


def _common_folder(wheres: Iterable[str | None]) -> str | None:
    """The folder every environment is in (venv), None where they are not folders (image tags)."""
    paths = [w for w in wheres if w]
    if not paths or not all(os.path.isabs(w) for w in paths):
        return None
    return os.path.dirname(os.path.commonpath(paths)) if len(paths) == 1 else os.path.commonpath(paths)
