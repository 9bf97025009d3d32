"""Environment backends: where a runner's worker gets its interpreter and framework.

- `venv` (default): one virtual environment per framework and device flavour, built from the
  runner's pinned requirements and cached under <cache>/envs/<framework>-<flavour>-<key>. The key
  hashes the base interpreter and the requirements file, so an environment is rebuilt exactly when
  one of them changes. A finished environment carries a marker file; a half-built one (a killed
  build) has none and is removed before the next attempt. Builds are serialised with a file lock,
  so two dlbench processes never build the same environment at once.
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
import shutil
import signal
import subprocess
import sys
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
        marker = path / MARKER
        if not marker.is_file():
            return None
        meta = json.loads(marker.read_text())
        return Environment(runner.name, self.name, flavour, path / "bin" / "python", meta["key"], path,
                           meta.get("packages", []), meta.get("python_version"))

    def ensure(self, runner: RunnerInfo, flavour: str, on_output: Callable[[str], None] | None = None) -> Environment:
        """Return the environment, building it first if it does not exist yet."""
        found = self.existing(runner, flavour)
        if found:
            return found
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.path_for(runner, flavour)
        with open(self.root / f".{path.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another dlbench may be building it right now
            found = self.existing(runner, flavour)
            if found:
                return found
            self._build(runner, flavour, path, on_output)
        return self.existing(runner, flavour)  # type: ignore[return-value]

    def _build(self, runner: RunnerInfo, flavour: str, path: Path, on_output) -> None:
        if path.exists():
            shutil.rmtree(path)  # a build that was killed part-way
        log_path = self.root / f"{path.name}.build.log"
        requirements = runner.requirements_for(flavour)
        steps = [
            [sys.executable, "-m", "venv", str(path)],
            [str(path / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
             "-r", str(requirements)],
        ]
        started = time.time()
        with open(log_path, "w") as log:
            for cmd in steps:
                log.write(f"$ {' '.join(cmd)}\n")
                log.flush()
                # a session of its own: an interrupt stops pip and whatever it started (build backends)
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
                assert proc.stdout is not None
                try:
                    for line in proc.stdout:
                        log.write(line)
                        if on_output and line.strip() and not line.startswith("WARNING: Location"):
                            on_output(line.strip())
                    code = proc.wait()
                except BaseException:  # a signal (Interrupted), an error: no half-built environment stays
                    with shielded():
                        _stop_build(proc)
                        shutil.rmtree(path, ignore_errors=True)
                    raise
                if code != 0:
                    log.flush()
                    shutil.rmtree(path, ignore_errors=True)
                    tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
                    raise EnvironmentBuildError(
                        f"building the {runner.name} ({flavour}) environment failed at `{' '.join(cmd[:4])} ...`; "
                        f"log: {log_path}\n{tail}")
        python = path / "bin" / "python"
        marker = {
            "framework": runner.name, "flavour": flavour, "key": path.name.rsplit("-", 1)[1],
            "requirements": requirements.read_text(), "base_interpreter": _base_interpreter(),
            "python_version": platform.python_version(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.time() - started, 1), "packages": _packages(python),
        }
        tmp = path / f"{MARKER}.partial"
        tmp.write_text(json.dumps(marker, indent=1))
        os.replace(tmp, path / MARKER)

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

    def ensure(self, runner: RunnerInfo, flavour: str, on_output=None) -> Environment:
        python = Path(sys.executable)
        probe = subprocess.run(
            [str(python), "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({runner.import_name!r}) is None)"],
            capture_output=True, timeout=60)
        if probe.returncode != 0:
            raise EnvironmentBuildError(
                f"{runner.import_name} is not importable by {python}; install it there or use --env venv")
        return Environment(runner.name, self.name, flavour, python, "current", None, _packages(python),
                           platform.python_version())
