"""Environment backends by name (`--env`): where a framework's worker gets its interpreter. Each is
a class with `ensure(runner, flavour, on_progress) -> Environment` (environments.py: `venv`, `current`;
containers.py: `docker`); a new backend is one entry in BACKENDS."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .environments import BuildProgress, Environment, EnvironmentBuildError
from .registry import RunnerInfo


def _venv(cache: Path):
    from .environments import VenvBackend

    return VenvBackend(cache)


def _current(cache: Path):
    from .environments import CurrentBackend

    return CurrentBackend()


def _docker(cache: Path):
    from .. import paths
    from .containers import DockerBackend  # only when asked for: it needs no engine until then

    return DockerBackend(cache, paths.docker_dir(), paths.project_root())


BACKENDS: dict[str, Callable[[Path], object]] = {"venv": _venv, "current": _current, "docker": _docker}


def backend(name: str, cache: Path):
    try:
        return BACKENDS[name](cache)
    except KeyError:
        raise ValueError(f"unknown environment backend {name!r}") from None


class Environments:
    """Each runner's environment for one command, made (or found) by `backend` on first use and
    kept, a failure to build included: every run of that runner then reports the same reason.
    `on_progress(framework, progress)` hears whether it was cached or built, and the build's steps."""

    def __init__(self, backend, device: str, on_progress: Callable[[str, BuildProgress], None]):
        self.backend = backend
        self.flavour = "cuda" if device == "cuda" else "cpu"
        self.on_progress = on_progress
        self._made: dict[str, Environment | EnvironmentBuildError] = {}

    def get(self, runner: RunnerInfo) -> Environment | EnvironmentBuildError:
        if runner.name not in self._made:
            try:
                self._made[runner.name] = self.backend.ensure(runner, self.flavour,
                                                              lambda progress: self.on_progress(runner.name, progress))
            except EnvironmentBuildError as e:
                self._made[runner.name] = e
        return self._made[runner.name]
