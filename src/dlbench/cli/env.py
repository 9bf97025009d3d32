"""`dlbench env list|create|remove`: the framework environments, a venv or a docker image per
framework and device flavour."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from .. import paths
from ..execution.backends import backend
from ..execution.environments import EnvironmentBuildError, VenvBackend
from . import lookup
from .build_progress import BuildLog
from .console import err, fail, out
from .options import DEVICES, check_choice, resolve_device
from .signals import stops_on_signals

env_app = typer.Typer(help="Framework environments: a venv, or a docker image, per framework and device flavour.",
                      no_args_is_help=True)

BUILDABLE = ("venv", "docker")  # `current` is the interpreter dlbench runs in: nothing to build


@env_app.command("list")
def env_list() -> None:
    """Cached environments and docker images, and whether each runner's is built for its current files."""
    venv = VenvBackend(paths.cache_dir())
    t = Table(title=f"environments in {venv.root}")
    for c in ("framework", "flavour", "state", "path", "built"):
        t.add_column(c)
    current = set()
    registry = lookup.registry()
    runners = [lookup.runner(registry, n) for n in registry.names()]
    for runner in runners:
        for flavour in ("cpu", "cuda"):
            path = venv.path_for(runner, flavour)
            current.add(str(path))
            found = venv.existing(runner, flavour)
            t.add_row(runner.name, flavour, "ready" if found else "not built", str(path),
                      json.loads((path / ".dlbench-env.json").read_text())["built_at"] if found else "")
    for meta in venv.list():
        if meta["path"] not in current:
            t.add_row(meta["framework"], meta["flavour"], "stale (requirements changed)", meta["path"], meta["built_at"])
    out.print(t)
    _image_list(runners)


def _image_list(runners) -> None:
    """The docker images: one row per runner and flavour (its current tag), then dlbench's other images."""
    docker = backend("docker", paths.cache_dir())
    try:
        images = docker.list()
    except EnvironmentBuildError as e:
        out.print(f"docker images: not listed ({escape(str(e))})", highlight=False, soft_wrap=True)
        return
    built = {row["tag"]: row for row in images}
    t = Table(title=f"docker images (Dockerfiles in {docker.docker_dir})")
    for c in ("framework", "flavour", "state", "image", "id", "created", "size"):
        t.add_column(c)
    expected = set()
    for runner in runners:
        for flavour in ("cpu", "cuda"):
            try:
                tag, _, _ = docker.image_for(runner, flavour)
            except EnvironmentBuildError:
                t.add_row(runner.name, flavour, "no Dockerfile", "", "", "", "")
                continue
            expected.add(tag)
            row = built.get(tag)
            t.add_row(runner.name, flavour, "ready" if row else "not built", tag,
                      *((row["id"], row["created"], row["size"]) if row else ("", "", "")))
    for row in images:
        if row["tag"] not in expected:
            t.add_row(row["framework"], row["flavour"], "stale (Dockerfile or requirements changed)", row["tag"],
                      row["id"], row["created"], row["size"])
    out.print(t)


@env_app.command("create")
@stops_on_signals
def env_create(
    framework: Annotated[str, typer.Argument(help="Framework name, or 'all'.")],
    device: Annotated[str, typer.Option(help="auto | cpu | cuda: which flavour to build")] = "auto",
    env: Annotated[str, typer.Option(help="venv (a virtual environment) | docker (an image)")] = "venv",
) -> None:
    """Build (or find) the cached environment or the docker image of a framework.

    Progress goes to stderr a line at a time (each step, each package pip starts on, a note when
    it is silent for long), readable in a CI log; stdout gets each environment's path."""
    registry = lookup.registry()
    check_choice("framework", framework, registry.names() + ["all"])
    check_choice("device", device, DEVICES)
    check_choice("environment backend", env, BUILDABLE)
    flavour = resolve_device(device)
    names = registry.names() if framework == "all" else [framework]
    chosen = backend(env, paths.cache_dir())
    log = BuildLog(err)
    failed = []
    try:
        for name in names:  # a framework that fails to build does not stop the others
            runner = lookup.runner(registry, name)
            try:
                built = chosen.ensure(runner, flavour, log)
            except EnvironmentBuildError as e:
                err.print(f"{name} ({flavour}): {escape(str(e))}", highlight=False, soft_wrap=True)
                failed.append(name)
                continue
            out.print(f"{name} ({flavour}): {built.path or built.key}", highlight=False)
    finally:  # what was built and what reused, also when a build failed or was interrupted part-way
        summary = log.summary()
        if summary:
            err.print(escape(summary), highlight=False, soft_wrap=True)
    if failed:
        raise fail(f"could not build the {env} environment of {', '.join(failed)} ({flavour}); the reasons are above", 1)


@env_app.command("remove")
def env_remove(
    framework: Annotated[str, typer.Argument(help="Framework name, or 'all'.")],
    env: Annotated[str, typer.Option(help="venv (its environments) | docker (its images)")] = "venv",
) -> None:
    """Delete the cached environments (or docker images) of a framework, every flavour and version."""
    registry = lookup.registry()
    check_choice("framework", framework, registry.names() + ["all"])
    check_choice("environment backend", env, BUILDABLE)
    chosen = backend(env, paths.cache_dir())
    for name in registry.names() if framework == "all" else [framework]:
        try:
            removed = chosen.remove(name)
        except EnvironmentBuildError as e:
            raise fail(str(e), 1) from None
        for item in removed:
            out.print(f"removed {item}")
