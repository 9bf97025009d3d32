"""Environment backends: where a runner's worker gets its interpreter and framework.

- `venv` (default): one virtual environment per framework and device flavour, built from the
  runner's pinned requirements and cached under <cache>/envs/<framework>-<flavour>-<key>. The key
  hashes the base interpreter and the requirements file, so an environment is rebuilt exactly when
  one of them changes. A finished environment carries a marker file; a half-built one (a killed
  build) has none and is removed before the next attempt. Builds are serialised with a file lock,
  so two dlbench processes never build the same environment at once. A build takes minutes, so it
  says where it is: each backend's `ensure` reports BuildProgress (cached, or each step of the
  build, pip's own milestones, and a heartbeat while pip prints nothing) to a callback, and the
  command line shows it.
- `current`: the interpreter dlbench runs in, for users who installed the framework themselves.
- `docker`: an image per framework and flavour, the worker run in a container (containers.py).

The package list of the environment (name==version for every distribution) goes into each record.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .interrupts import shielded
from .registry import RunnerInfo

ENV_FORMAT = 1  # bump to invalidate every cached environment (layout of the env dir changed)
MARKER = ".dlbench-env.json"

_LIST_PACKAGES = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted({d.metadata['Name'] + '==' + d.version for d in m.distributions() "
    "if d.metadata['Name']})))"
)


class EnvironmentBuildError(Exception):
    """The environment could not be built or used; str() says why (with the log's tail)."""


# The steps BuildProgress names. A build goes CREATING, INSTALLING, VERIFYING, then BUILT (or
# FAILED); an environment already made is one CACHED; WAITING comes first when another dlbench
# process holds the build's lock. The docker backend's build is one step, BUILDING_IMAGE.
CACHED = "cached"
WAITING = "waiting"
CREATING = "creating"
INSTALLING = "installing"
VERIFYING = "verifying"
BUILDING_IMAGE = "building image"
BUILT = "built"
FAILED = "failed"

# pip's lines that say which package it is on; the rest (requirement already satisfied, the
# download bar's last frame) only go to the build log
_PIP_MILESTONE = re.compile(r"(Collecting|Downloading|Using cached|Building wheels? for|Installing build dependencies|"
                            r"Installing collected packages|Successfully installed)\b")
SILENCE_REPORT_S = 30.0  # a build step silent this long is reported again: still on its last line


@dataclass(frozen=True)
class BuildProgress:
    """Where the making of one framework's environment is, for the command line to show.

    An event that begins a step has neither `output` nor `silent_s`; within a step, `output` is the
    build tool's own line (pip's "Collecting numpy==2.1.0"), and `silent_s` marks a heartbeat: the
    step has printed nothing for that many seconds and is still on `output`."""

    framework: str
    flavour: str
    step: str  # one of the steps above
    elapsed_s: float = 0.0  # since the build began (0 where nothing is built)
    where: str | None = None  # the environment: a venv folder, an image tag
    note: str | None = None  # about the step: the requirements file, when a cached one was built, the log
    output: str | None = None
    silent_s: float | None = None

    @property
    def starts_step(self) -> bool:
        return self.output is None and self.silent_s is None


ProgressCallback = Callable[[BuildProgress], None]


def _ignore(progress: BuildProgress) -> None:
    pass


@dataclass
class Environment:
    framework: str
    backend: str
    flavour: str
    python: Path
    key: str
    path: Path | None = None
    packages: list[str] = field(default_factory=list)  # the lock: every name==version installed
    python_version: str | None = None
    # docker: the worker runs in this image (a containers.ContainerSpec, which builds on this module),
    # `python` inside it
    container: Any = None

    def describe(self) -> dict:
        return {"backend": self.backend, "flavour": self.flavour, "python": str(self.python),
                "python_version": self.python_version,
                "key": self.key, "path": str(self.path) if self.path else None, "packages": self.packages,
                **(self.container.describe() if self.container else {})}


def _base_interpreter() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def environment_key(requirements: Path, flavour: str) -> str:
    h = hashlib.sha256()
    for part in (str(ENV_FORMAT), _base_interpreter(), platform.python_version(), flavour,
                 requirements.read_text()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _stop_build(proc: subprocess.Popen) -> None:
    """End a build step's whole session (pip and its children): SIGKILL, it holds nothing to save."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _follow(proc: subprocess.Popen, log, on_line: Callable[[str], None],
            on_silence: Callable[[float], None]) -> int:
    """Copy a build step's output to `log`, each line to `on_line`, and call `on_silence(seconds)`
    each time it has printed nothing for another SILENCE_REPORT_S (pip downloading a wheel of hundreds of
    MB prints nothing for minutes); its exit status. A thread reads, so that the wait can time out
    while this thread stays the one that receives signals."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="dlbench-build-output", daemon=True).start()
    last_line_at = time.monotonic()
    while True:
        try:
            line = lines.get(timeout=SILENCE_REPORT_S)
        except queue.Empty:
            on_silence(time.monotonic() - last_line_at)
            continue
        if line is None:
            return proc.wait()
        last_line_at = time.monotonic()
        log.write(line)
        if line.strip():
            on_line(line.strip())


def _marker(path: Path) -> dict | None:
    """The marker of a finished venv environment, None where there is none (not built, or half-built)."""
    marker = path / MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def _packages(python: Path) -> list[str]:
    out = subprocess.run([str(python), "-c", _LIST_PACKAGES], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return []
    return json.loads(out.stdout)


class VenvBackend:
    name = "venv"

    def __init__(self, cache: Path):
        self.root = cache / "envs"

    def path_for(self, runner: RunnerInfo, flavour: str) -> Path:
        key = environment_key(runner.requirements_for(flavour), flavour)
        return self.root / f"{runner.name}-{flavour}-{key}"

    def existing(self, runner: RunnerInfo, flavour: str) -> Environment | None:
        path = self.path_for(runner, flavour)
        meta = _marker(path)
        if meta is None:
            return None
        return Environment(runner.name, self.name, flavour, path / "bin" / "python", meta["key"], path,
                           meta.get("packages", []), meta.get("python_version"))

    def ensure(self, runner: RunnerInfo, flavour: str, on_progress: ProgressCallback | None = None) -> Environment:
        """Return the environment, building it first if it does not exist yet; `on_progress` hears
        that it was cached, or each step of the build."""
        report = on_progress or _ignore
        found = self._cached(runner, flavour, report)
        if found:
            return found
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(runner, flavour)
        lock_path = self.root / f".{path.name}.lock"
        with open(lock_path, "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # another dlbench is building it right now: say why nothing moves
                report(BuildProgress(runner.name, flavour, WAITING, where=str(path),
                                     note=f"another dlbench process is building it (it holds {lock_path})"))
                fcntl.flock(lock, fcntl.LOCK_EX)
            found = self._cached(runner, flavour, report)
            if found:
                return found
            self._build(runner, flavour, path, report)
        return self.existing(runner, flavour)  # type: ignore[return-value]

    def _cached(self, runner: RunnerInfo, flavour: str, report: ProgressCallback) -> Environment | None:
        found = self.existing(runner, flavour)
        if found:
            built_at = (_marker(found.path) or {}).get("built_at") if found.path else None
            report(BuildProgress(runner.name, flavour, CACHED, where=str(found.path),
                                 note=f"built {built_at}" if built_at else None))
        return found

    def _build(self, runner: RunnerInfo, flavour: str, path: Path, report: ProgressCallback) -> None:
        if path.exists():
            shutil.rmtree(path)  # a build that was killed part-way
        log_path = self.root / f"{path.name}.build.log"
        requirements = runner.requirements_for(flavour)
        steps = [
            (CREATING, None, [sys.executable, "-m", "venv", str(path)]),
            (INSTALLING, f"from {requirements}",
             [str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
              "-r", str(requirements)]),
        ]
        started = time.monotonic()

        def progress(step: str, note: str | None = None, output: str | None = None,
                     silent_s: float | None = None) -> None:
            report(BuildProgress(runner.name, flavour, step, round(time.monotonic() - started, 1), str(path),
                                 note, output, None if silent_s is None else round(silent_s)))

        with open(log_path, "w") as log:
            for step, note, cmd in steps:
                progress(step, note)
                milestone: list[str] = []  # the last line that said what the step is on
                log.write(f"$ {' '.join(cmd)}\n")
                log.flush()

                def on_line(line: str, step=step, milestone=milestone) -> None:
                    if _PIP_MILESTONE.match(line):
                        milestone[:] = [line]
                        progress(step, output=line)

                def on_silence(seconds: float, step=step, milestone=milestone) -> None:
                    progress(step, output=milestone[0] if milestone else None, silent_s=seconds)

                # a session of its own: an interrupt stops pip and whatever it started (build backends)
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
                try:
                    code = _follow(proc, log, on_line, on_silence)
                except BaseException:  # a signal (Interrupted), an error: no half-built environment stays
                    with shielded():
                        _stop_build(proc)
                        shutil.rmtree(path, ignore_errors=True)
                    raise
                if code != 0:
                    log.flush()
                    shutil.rmtree(path, ignore_errors=True)
                    progress(FAILED, note=f"log: {log_path}")
                    tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
                    raise EnvironmentBuildError(
                        f"building the {runner.name} ({flavour}) environment failed at `{' '.join(cmd[:4])} ...`; "
                        f"log: {log_path}\n{tail}")
        python = path / "bin" / "python"
        progress(VERIFYING, "the new interpreter lists its packages")
        marker = {
            "framework": runner.name, "flavour": flavour, "key": path.name.rsplit("-", 1)[1],
            "requirements": requirements.read_text(), "base_interpreter": _base_interpreter(),
            "python_version": platform.python_version(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.monotonic() - started, 1), "packages": _packages(python),
        }
        tmp = path / f"{MARKER}.partial"
        tmp.write_text(json.dumps(marker, indent=1))
        os.replace(tmp, path / MARKER)
        progress(BUILT)

    def list(self) -> list[dict]:
        out = []
        for marker in sorted(self.root.glob(f"*/{MARKER}")):
            meta = json.loads(marker.read_text())
            meta["path"] = str(marker.parent)
            out.append(meta)
        return out

    def remove(self, framework: str) -> list[Path]:
        removed = []
        for path in sorted(self.root.glob(f"{framework}-*")):
            if path.is_dir():
                shutil.rmtree(path)
                removed.append(path)
        return removed


class CurrentBackend:
    """The interpreter dlbench runs in; the framework must already be importable there."""

    name = "current"

    def ensure(self, runner: RunnerInfo, flavour: str, on_progress: ProgressCallback | None = None) -> Environment:
        python = Path(sys.executable)
        probe = subprocess.run(
            [str(python), "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({runner.import_name!r}) is None)"],
            capture_output=True, timeout=60)
        if probe.returncode != 0:
            raise EnvironmentBuildError(
                f"{runner.import_name} is not importable by {python}; install it there or use --env venv")
        return Environment(runner.name, self.name, flavour, python, "current", None, _packages(python),
                           platform.python_version())
