"""Where dlbench finds its definitions and runners, and where it keeps environments and results.

dlbench runs from its repository (installed editable by bin/dlbench): `suites/`, `runners/`,
`docker/` and `reports/` are data beside the package, not inside it. DLBENCH_ROOT points elsewhere if needed.
"""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    env = os.environ.get("DLBENCH_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parents[2]


def suites_dir() -> Path:
    return project_root() / "suites"


def runners_dir() -> Path:
    return project_root() / "runners"


def docker_dir() -> Path:
    """docker/<framework>/<flavour>.Dockerfile: the images of the docker environment backend."""
    return project_root() / "docker"


def reports_dir() -> Path:
    return project_root() / "reports"


def default_store() -> Path:
    """--store, else $DLBENCH_STORE, else ./results (relative to where dlbench is run)."""
    env = os.environ.get("DLBENCH_STORE")
    return Path(env) if env else Path.cwd() / "results"


def cache_dir() -> Path:
    """Framework environments: $DLBENCH_CACHE, else $XDG_CACHE_HOME/dlbench, else ~/.cache/dlbench."""
    env = os.environ.get("DLBENCH_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "dlbench"
