"""The engine's answers parsed (container_engine.py), against outputs recorded from real engines
(tests/fixtures/engines/: dockerd through the docker CLI 28 without buildx and Debian's CLI 20.10,
podman's CLI, the docker CLI on podman's socket), and the engine told apart from them."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from dlbench.execution.container_engine import (
    ContainerEngine,
    EngineError,
    normalise_id,
    parse_image_ids,
    parse_images,
    parse_state,
    parse_version,
    strip_registry,
)
from dlbench.execution.containers import lock_differences, parse_tag, pip_target

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
FAKE_DOCKER = Path(__file__).resolve().parents[1] / "fixtures" / "fake_docker.py"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


@pytest.mark.parametrize("name, client, engine, engine_version", [
    ("docker-28-cli", "docker", "docker", "20.10.24+dfsg1"),
    ("docker-20-cli", "docker", "docker", "20.10.24+dfsg1"),
    ("podman-cli", "podman", "podman", "4.3.1"),
    ("podman-socket", "docker", "podman", "4.3.1"),
])
def test_the_engine_is_told_from_its_version_answer(name, client, engine, engine_version):
    found = parse_version(recorded(f"{name}.version.json"))
    assert (found["client_kind"], found["engine"], found["engine_version"], found["server"]) == (
        client, engine, engine_version, True)


def test_a_docker_cli_without_a_server_says_so_in_its_json():
    found = parse_version(recorded("docker-down.version.json"))
    assert found == {"client_kind": "docker", "client_version": "28.2.2", "engine": None, "engine_version": None,
                     "server": False}
    with pytest.raises(ValueError):
        parse_version("Cannot connect to the Docker daemon at unix:///var/run/docker.sock.")


@pytest.mark.parametrize("name", ["docker", "podman", "podman-socket"])
def test_images_read_the_same_from_every_engine(name):
    (image,) = parse_images(recorded(f"{name}.image-inspect.json"))
    assert image.id.startswith("sha256:") and len(image.id) == 71  # podman's CLI omits the prefix
    assert image.tags == ("dlbench/base:bookworm-local",)  # podman's localhost/ is not part of dlbench's tag
    assert image.size_bytes > 200e6
    assert image.created.startswith("2026-12-07")


def test_ids_and_references():
    ids = parse_image_ids(recorded("docker.image-ls-ids.txt") + recorded("docker.image-ls-ids.txt"))
    assert ids and all(i.startswith("sha256:") for i in ids) and len(ids) == len(set(ids))
    assert normalise_id("7a8047a509da") == "sha256:7a8047a509da"
    assert strip_registry("localhost/dlbench/torch:cpu-k") == "dlbench/torch:cpu-k"
    assert strip_registry("ghcr.io/x/y:1") == "x/y:1" and strip_registry("dlbench/torch:cpu-k") == "dlbench/torch:cpu-k"
    assert parse_tag("localhost/dlbench/torch:cpu-0123") == ("torch", "cpu", "0123")


@pytest.mark.parametrize("engine, oom_flag", [("docker", True), ("podman", False)])
def test_container_states(engine, oom_flag):
    running = parse_state(recorded(f"{engine}.container-state-running.json"))
    assert running.status == "running" and running.pid > 0
    killed = parse_state(recorded(f"{engine}.container-state-oom.json"))
    assert killed.exit_code == 137 and killed.pid == 0
    assert killed.oom_killed is oom_flag  # podman 4.3 on cgroup v1 does not say it


def fake_client(tmp_path: Path, monkeypatch, kind: str, buildx: bool = False) -> ContainerEngine:
    client = tmp_path / "bin" / "client"
    client.parent.mkdir(exist_ok=True)
    client.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_DOCKER} \"$@\"\n")
    client.chmod(client.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("FAKE_DOCKER_KIND", kind)
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/some.sock")
    monkeypatch.delenv("FAKE_DOCKER_DAEMON_DOWN", raising=False)
    if buildx:
        monkeypatch.setenv("FAKE_DOCKER_BUILDX", "1")
    else:
        monkeypatch.delenv("FAKE_DOCKER_BUILDX", raising=False)
    return ContainerEngine(str(client))


@pytest.mark.parametrize("kind, buildx, expected", [
    ("docker", False, ("docker", "docker", "docker-api", "classic")),
    ("docker", True, ("docker", "docker", "docker-api", "buildx")),
    ("podman", False, ("podman", "podman", "podman-cli", "podman")),
    ("podman-socket", False, ("docker", "podman", "docker-api", "classic")),
])
def test_detection_and_the_build_command_of_each_engine(tmp_path, monkeypatch, kind, buildx, expected):
    engine = fake_client(tmp_path, monkeypatch, kind, buildx)
    info = engine.info()
    assert (info.client_kind, info.engine, info.api, info.builder) == expected
    assert info.endpoint == (None if kind == "podman" else "unix:///run/some.sock")
    args = engine.build_command(Path("/d/cpu.Dockerfile"), "dlbench/x:cpu-k", Path("/ctx"), {"org.dlbench.k": "v"},
                                {"BASE_IMAGE": "b:1"}, Path("/ctx/.iid"), offline=True)
    if info.builder == "buildx":
        assert args[:5] == ["buildx", "build", "--load", "--progress", "plain"]
    else:  # the classic builder and podman's have no --progress; the classic one is asked for explicitly
        assert args[0] == "build" and "--progress" not in args
    assert (engine.build_env() or {}).get("DOCKER_BUILDKIT") == ("0" if info.builder == "classic" else None)
    assert args[-1] == "/ctx" and "--iidfile" in args and args[args.index("--network") + 1] == "none"
    assert args[args.index("--build-arg") + 1] == "BASE_IMAGE=b:1"


def test_an_unreadable_version_answer_is_an_engine_error(tmp_path, monkeypatch):
    client = tmp_path / "client"
    client.write_text("#!/bin/sh\necho 'segmentation fault' >&2\nexit 139\n")
    client.chmod(0o755)
    with pytest.raises(EngineError, match=r"`.*client version` failed \(exit status 139\): segmentation fault"):
        ContainerEngine(str(client)).info()


def test_pip_is_asked_for_the_base_images_python_and_platform():
    args = pip_target({"implementation": "cpython", "version": [3, 11], "libc": ["glibc", "2.36"],
                       "machine": "x86_64"})
    assert args[:1] == ["--only-binary=:all:"]
    assert args[args.index("--python-version") + 1] == "311"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--abi"] == ["cp311", "abi3", "none"]
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms and platforms[-1] == "linux_x86_64"
    assert "manylinux_2_37_x86_64" not in platforms  # newer than the image's glibc: would not load


def test_the_lock_check():
    requirements = "# pins\ntorch==2.13.0\nnumpy==2.4.6  # with a comment\ntensorflow[and-cuda]==2.21.0\n"
    image = ["torch==2.13.0+cpu", "numpy==2.4.6", "tensorflow==2.21.0", "pip==23.0.1", "sympy==1.14.0"]
    venv = ["torch==2.13.0+cpu", "numpy==2.4.6", "tensorflow==2.21.0", "pip==24.0", "sympy==1.14.0"]
    assert lock_differences(image, requirements, venv) == []  # a local label meets its pin; pip is no pin
    assert lock_differences(image, requirements, None) == []
    drifted = ["torch==2.13.0+cpu", "numpy==2.4.5", "tensorflow==2.21.0", "sympy==1.13.0"]
    problems = lock_differences(drifted, requirements, venv)
    assert "numpy: requirements pin 2.4.6, the image has 2.4.5" in problems
    assert "sympy: the venv has 1.14.0, the image 1.13.0" in problems
    assert lock_differences(image, "mxnet==1.9.1\n", None) == ["mxnet: requirements pin 1.9.1, the image has none"]


def test_the_recorded_outputs_are_what_the_readme_says():
    listed = {p.name for p in RECORDED.iterdir()} - {"README.md"}
    readme = recorded("README.md")
    for name in listed:
        stem = name.split(".")[0]
        assert stem.split("-cli")[0].split("-down")[0] in readme or stem in readme, name
    assert json.loads(recorded("docker.info-root.json")) == "/var/tmp/dlbench-engine/data"
    assert os.path.isabs(json.loads(recorded("podman.info-root.json")))
