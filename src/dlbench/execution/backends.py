"""Environment backends by name (`--env`): where a framework's worker gets its interpreter. Each is
a class with `ensure(runner, flavour, log) -> Environment` (environments.py: `venv`, `current`;
containers.py: `docker`); a new backend is one entry in BACKENDS."""

from __future__ import annotations

from pathlib import Path
from typing import Callable


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
