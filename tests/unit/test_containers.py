"""The docker backend against a fake engine (tests/fixtures/fake_docker.py stands in for the client, with
the output formats recorded from real engines in tests/fixtures/engines/; tests/integration/
test_container_engine.py runs a real one). What is tested is what dlbench sends to the engine and what
it does with the answers: tags, builds, the `run` command, timeouts, exit statuses, listing."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import re
import signal
import socket
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.execution.containers import (
    STOP_GRACE_S,
    NICE_WEIGHTS,
    CpuPlacement,
    DockerBackend,
    cpu_placement,
    gpu_request,
    image_key,
    image_tag,
    parse_tag,
)
from dlbench.execution.backends import backend
from dlbench.execution.container_engine import socket_problem
from dlbench.execution.environments import EnvironmentBuildError
from dlbench.execution.interrupts import Interrupted, deliver_signals
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import Orchestrator, RunOptions, build_request, plan
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FAKE_DOCKER = ROOT / "tests" / "fixtures" / "fake_docker.py"
BASE = "python:3.11.15-slim-bookworm"
DOCKERFILE = f"ARG BASE_IMAGE={BASE}\nFROM ${{BASE_IMAGE}}\nCOPY requirements.txt /opt/dlbench/requirements.txt\n"


class Engine:
    """The fake engine's state, read back."""

    def __init__(self, state: Path):
        self.state = state

    def calls(self, command: str | None = None) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        rows = [json.loads(line)["argv"] for line in path.read_text().splitlines()] if path.is_file() else []
        return [r for r in rows if command is None or r[0] == command]

    def images(self) -> dict:
        path = self.state / "images.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def containers(self) -> dict[str, dict]:
        folder = self.state / "containers"
        return {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")} if folder.is_dir() else {}

    def running(self) -> list[str]:
        return [name for name, state in self.containers().items() if state["Running"]]


@pytest.fixture
def engine(tmp_path, monkeypatch) -> Engine:
    state = tmp_path / "engine"
    client = tmp_path / "bin" / "docker"
    client.parent.mkdir()
    client.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_DOCKER} \"$@\"\n")
    client.chmod(client.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DLBENCH_DOCKER", str(client))
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    monkeypatch.setenv("FAKE_DOCKER_PYTHON", sys.executable)
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    monkeypatch.setenv("FAKE_DOCKER_BASES", BASE)
    for knob in ("FAKE_DOCKER_DAEMON_DOWN", "FAKE_DOCKER_BUILD_FAIL", "FAKE_DOCKER_NO_GPU_RUNTIME", "FAKE_DOCKER_OOM",
                 "FAKE_DOCKER_KIND", "FAKE_DOCKER_BUILDX", "DLBENCH_FAKE_BEHAVIOUR", "CUDA_VISIBLE_DEVICES",
                 "DLBENCH_BASE_IMAGE", "DLBENCH_CONTAINER_MEMORY", "DOCKER_HOST", "FAKE_DOCKER_CGROUPS",
                 "FAKE_DOCKER_ENDPOINT"):
        monkeypatch.delenv(knob, raising=False)
    yield Engine(state)
    # a test that failed may have left a fake container running: end its process group
    for container in (state / "containers").glob("*.json"):
        with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
            pid = json.loads(container.read_text())["Pid"]
            if pid:
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def docker_project(project):
    """The fake-runner project with a Dockerfile per flavour for the fake runner."""
    for flavour in ("cpu", "cuda"):
        path = project / "docker" / "fake" / f"{flavour}.Dockerfile"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(DOCKERFILE + f"# {flavour}\n")
    return project


@pytest.fixture
def runner(docker_project):
    return RunnerRegistry(docker_project / "runners").get("fake")


@pytest.fixture
def docker(docker_project, tmp_path, engine) -> DockerBackend:
    return backend("docker", tmp_path / "cache")


def option_values(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == name]


def request_for(runner, suite, device="cpu"):
    b = suite.benchmarks[0]
    return build_request(plan([runner], [b])[0], RunOptions(device=device, env_backend="docker", threads=1,
                                                            repeats=None, timeout_s=30, cache=Path("/nonexistent")))


# ---- tags ----------------------------------------------------------------------------------------

def test_the_tag_is_a_hash_of_dockerfile_requirements_and_flavour(tmp_path):
    dockerfile, requirements = tmp_path / "cpu.Dockerfile", tmp_path / "requirements.txt"
    dockerfile.write_text(DOCKERFILE)
    requirements.write_text("torch==2.13.0\n")
    key = image_key(dockerfile, requirements, "cpu", BASE)
    assert re.fullmatch(r"[0-9a-f]{16}", key) and key == image_key(dockerfile, requirements, "cpu", BASE)
    assert image_key(dockerfile, requirements, "cuda", BASE) != key
    assert image_key(dockerfile, requirements, "cpu", "dlbench/base:bookworm-local") != key  # the base is part of it
    requirements.write_text("torch==2.13.1\n")
    changed_requirements = image_key(dockerfile, requirements, "cpu", BASE)
    dockerfile.write_text(DOCKERFILE + "ENV X=1\n")
    assert len({key, changed_requirements, image_key(dockerfile, requirements, "cpu", BASE)}) == 3
    assert image_tag("torch", "cpu", key) == f"dlbench/torch:cpu-{key}"
    assert parse_tag(f"dlbench/torch:cpu-{key}") == ("torch", "cpu", key)
    assert parse_tag(f"localhost/dlbench/torch:cpu-{key}") == ("torch", "cpu", key)  # podman's tags
    assert parse_tag("python:3.11.15-slim-bookworm") is None
    assert parse_tag("registry.example.com:5000/dlbench/torch:cpu-0123") == ("torch", "cpu", "0123")


def test_the_runner_tag_follows_its_files(runner, docker, docker_project):
    tag, dockerfile, requirements = docker.image_for(runner, "cpu")
    assert dockerfile == docker_project / "docker" / "fake" / "cpu.Dockerfile"
    assert requirements == runner.requirements_for("cpu")
    assert tag == image_tag("fake", "cpu", image_key(dockerfile, requirements, "cpu", BASE))
    dockerfile.write_text(DOCKERFILE + "# edited\n")
    assert docker.image_for(runner, "cpu")[0] != tag


# ---- building ------------------------------------------------------------------------------------

def test_builds_the_image_when_missing_and_reuses_it(runner, docker, engine):
    lines = []
    env = docker.ensure(runner, "cpu", lines.append)
    tag = docker.image_for(runner, "cpu")[0]
    builds = engine.calls("build")
    assert len(builds) == 1
    build = builds[0]
    assert option_values(build, "--tag") == [tag]
    assert option_values(build, "--file") == [str(docker.docker_dir / "fake" / "cpu.Dockerfile")]
    assert "--progress" not in build  # the docker CLI without buildx: the classic builder has no such flag
    assert option_values(build, "--build-arg") == [f"BASE_IMAGE={BASE}"]
    assert option_values(build, "--network") == ["none"]  # a CPU image builds offline
    assert set(option_values(build, "--label")) == {"org.dlbench.framework=fake", "org.dlbench.flavour=cpu",
                                                     f"org.dlbench.key={tag.rsplit('-', 1)[1]}",
                                                     f"org.dlbench.base={BASE}",
                                                     f"org.dlbench.base-id={engine.images()[BASE]['id']}"}
    # the context is the runner's requirements file and its wheelhouse (none: the fake needs no package)
    assert engine.images()[tag]["context"] == {"requirements.txt": runner.requirements_for("cpu").read_text()}
    # the base image's Python was asked what wheels it takes, before the build
    platform_probe = engine.calls("run")[0]
    assert platform_probe[-3] == BASE and "--network" in platform_probe
    # progress reached the caller: the build's step, docker's own lines, then built
    assert [p.step for p in lines if p.starts_step] == ["building image", "verifying", "built"]
    assert any("Successfully built" in p.output for p in lines if p.output)
    assert {(p.framework, p.flavour, p.where) for p in lines} == {("fake", "cpu", tag)}
    assert env.backend == "docker" and env.key == tag and env.container.image == tag
    assert env.container.image_id == engine.images()[tag]["id"]
    # the probe ran in the image: its interpreter, version and lock
    assert env.python == Path(sys.executable) and env.python_version
    assert any(p.startswith("pydantic==") for p in env.packages)
    described = env.describe()
    assert described["image"] == tag and described["dockerfile"] == "docker/fake/cpu.Dockerfile"
    # the record's container facts (schema 15): engine, base image as built, how workers are run
    facts = described["container"]
    assert (facts["engine"]["engine"], facts["engine"]["builder"]) == ("docker", "classic")
    assert facts["base_image"] == BASE and facts["base_image_id"] == engine.images()[BASE]["id"]
    assert facts["image_digest"] is None and facts["image_size_bytes"] == 1_234_000_000
    assert facts["run_options"][:3] == ["--init", "--pull", "never"] and "--memory" not in facts["run_options"]

    lines.clear()
    again = docker.ensure(runner, "cpu", lines.append)
    assert len(engine.calls("build")) == 1  # found, not rebuilt, and it says so
    assert [(p.step, p.where) for p in lines] == [("cached", tag)]
    assert len(engine.calls("run")) == 2  # the base's platform and the image's lock; the probe is cached per image id
    assert again.container.image_id == env.container.image_id


def test_a_changed_requirements_file_builds_a_new_image(runner, docker, engine, docker_project, tmp_path):
    first = docker.ensure(runner, "cpu").key
    requirements = tmp_path / "requirements-cpu.txt"
    requirements.write_text(runner.requirements_for("cpu").read_text() + "# bumped\n")
    moved = dataclasses.replace(runner, requirements={**runner.requirements, "cpu": requirements})
    second = docker.ensure(moved, "cpu").key
    assert second != first and len(engine.calls("build")) == 2
    assert engine.images()[second]["context"]["requirements.txt"].endswith("# bumped\n")


def test_a_failed_build_says_why_and_leaves_no_image(runner, docker, engine, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_BUILD_FAIL", "1")
    with pytest.raises(EnvironmentBuildError) as e:
        docker.ensure(runner, "cpu")
    message = str(e.value)
    assert "building the fake (cpu) image" in message and "returned a non-zero code" in message
    assert re.search(r"the engine.s data root \S+ has [\d,]+ MiB free", message)  # room on the disk, said in numbers
    log = Path(re.search(r"log: (\S+)", message).group(1))
    assert log.is_file() and f"--build-arg BASE_IMAGE={BASE}" in log.read_text()
    assert engine.images() == {}


def test_a_build_the_disk_has_no_room_for_is_refused_before_it_starts(runner, docker, engine, monkeypatch):
    import shutil as real_shutil

    from dlbench.execution import containers

    made = docker._wheelhouse

    def with_wheels(*args, **kwargs):  # the fake needs no package: give its wheelhouse 8 MiB of wheels
        context = made(*args, **kwargs)
        (context / "wheelhouse" / "big-1.0-py3-none-any.whl").write_bytes(b"\0" * 8 * 2**20)
        return context

    monkeypatch.setattr(docker, "_wheelhouse", with_wheels)
    monkeypatch.setattr(containers.shutil, "disk_usage",
                        lambda path: real_shutil._ntuple_diskusage(100 * 2**20, 90 * 2**20, 10 * 2**20))
    with pytest.raises(EnvironmentBuildError, match=r"not enough disk for the image: the engine's data root \S+ has "
                                                    r"10 MiB free, and a build of 8 MiB of wheels needs about 32 MiB"):
        docker.ensure(runner, "cpu")
    assert engine.calls("build") == []


def test_a_runner_without_a_dockerfile_is_refused_by_path(runner, docker, docker_project, engine):
    (docker_project / "docker" / "fake" / "cuda.Dockerfile").unlink()
    with pytest.raises(EnvironmentBuildError, match=r"no Dockerfile for fake \(cuda\): .*docker/fake/cuda.Dockerfile"):
        docker.ensure(runner, "cuda")
    assert engine.calls() == []


def test_no_client_and_no_daemon_are_clear_errors(runner, docker_project, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_DOCKER", str(tmp_path / "no-such-docker"))
    with pytest.raises(EnvironmentBuildError, match="no container engine client .*no-such-docker"):
        backend("docker", tmp_path / "cache").ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_DOCKER", str(tmp_path / "bin" / "docker"))
    monkeypatch.setenv("FAKE_DOCKER_DAEMON_DOWN", "1")
    # the client reaches no server: the reason is the socket's, found by connecting to it here
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(EnvironmentBuildError, match=f"reaches no engine at unix://{tmp_path}/no.sock: there is no socket"):
        backend("docker", tmp_path / "cache").ensure(runner, "cpu")
    with socket.socket(socket.AF_UNIX) as bound:  # a socket nobody listens on: the engine has stopped
        bound.bind(str(tmp_path / "stopped.sock"))
        monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/stopped.sock")
        with pytest.raises(EnvironmentBuildError, match="nothing answers on .*stopped.sock .connection refused"):
            backend("docker", tmp_path / "cache").ensure(runner, "cpu")
    assert engine.calls("build") == []


def test_permission_denied_on_the_socket_is_named(tmp_path, monkeypatch):
    # root passes any socket's permissions, so the refusal is the kernel's errno, handed in
    path = tmp_path / "docker.sock"
    path.touch()

    def refuse(self, address):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    problem = socket_problem(f"unix://{path}")
    assert problem.startswith(f"permission denied on {path}: this user may not use the engine (add it to the group")
    assert socket_problem("tcp://10.0.0.1:2376") is None  # not a socket here: the client's business


# ---- the docker run command ----------------------------------------------------------------------

def test_the_run_command(runner, docker, docker_project, tmp_path):
    env = docker.ensure(runner, "cpu")
    exchange, shared = tmp_path / "exchange", tmp_path / "check-work"
    worker = runner.worker.resolve()
    argv = env.container.run_command("dlbench-fake-1", env.python, worker, ["req.json", "res.json"], exchange,
                                     {"OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}, (shared,))
    assert argv[:4] == [os.environ["DLBENCH_DOCKER"], "run", "--name", "dlbench-fake-1"]
    assert "--rm" not in argv  # removed after its state (exit status, OOM) has been read
    assert "--init" in argv and option_values(argv, "--pull") == ["never"]
    assert option_values(argv, "--network") == ["none"]
    assert option_values(argv, "--user") == [f"{os.getuid()}:{os.getgid()}"]
    assert {"OMP_NUM_THREADS=2", "PYTHONUNBUFFERED=1", "HOME=/tmp"} <= set(option_values(argv, "--env"))
    volumes = option_values(argv, "--volume")
    root = docker_project.resolve()
    assert f"{root}:{root}:ro" in volumes  # the repository, read-only
    assert f"{worker.parents[1]}:{worker.parents[1]}:ro" in volumes  # a runner folder outside it
    assert f"{exchange.resolve()}:{exchange.resolve()}:rw" in volumes and f"{shared}:{shared}:rw" in volumes
    assert not [v for v in volumes if v.endswith(":rw") and Path(v.split(":")[0]) in (root, *root.parents)]
    assert "--gpus" not in argv  # a CPU image gets no GPU
    assert option_values(argv, "--workdir") == [str(worker.parent)]
    assert option_values(argv, "--entrypoint") == [str(env.python)]
    assert argv[-4:] == [env.container.image, str(worker), "req.json", "res.json"]


# ---- CPU placement: the container weighs what its worker would weigh on the host -------------------

V1_AT_ROOT = "12:memory:/process_api/x\n3:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n"
V1_IN_A_GROUP = "3:cpu,cpuacct:/ci/job-7\n0::/\n"


def proc_files(tmp_path, cgroup: str, autogroup: str | None, enabled: str | None):
    proc = tmp_path / "proc-self"
    proc.mkdir(exist_ok=True)
    (proc / "cgroup").write_text(cgroup)
    if autogroup is not None:
        (proc / "autogroup").write_text(autogroup)
    switch = tmp_path / "sched_autogroup_enabled"
    if enabled is not None:
        switch.write_text(enabled)
    return proc, switch


@pytest.mark.parametrize("cgroups, cgroup, autogroup, enabled, expected", [
    # the caller at the root with autogroup: its session is one entity of its autogroup's weight
    ("cgroupfs,1", V1_AT_ROOT, "/autogroup-12 nice 0\n", "1", {(2, 0): "1024", (8, 10): "1024"}),
    ("cgroupfs,1", V1_AT_ROOT, "/autogroup-12 nice 5\n", "1", {(2, 0): "335"}),
    # no autogroup, or the caller in a cgroup of its own: the worker's threads at its niceness
    ("cgroupfs,1", V1_AT_ROOT, None, "0", {(2, 0): "2048", (2, 10): "220", (1, 19): "15"}),
    ("cgroupfs,1", V1_IN_A_GROUP, "/autogroup-3 nice 0\n", "1", {(4, 0): "4096", (1000, -20): "262144"}),
])
def test_the_container_goes_where_its_worker_would_compete(engine, tmp_path, monkeypatch, cgroups, cgroup,
                                                           autogroup, enabled, expected):
    from dlbench.execution.container_engine import ContainerEngine

    monkeypatch.setenv("FAKE_DOCKER_CGROUPS", cgroups)
    monkeypatch.setenv("DOCKER_HOST", "unix:///run/private/docker.sock")
    proc, switch = proc_files(tmp_path, cgroup, autogroup, enabled)
    placed = cpu_placement(ContainerEngine(), proc, switch)
    parent = "/ci/job-7" if cgroup == V1_IN_A_GROUP else "/"
    for (threads, nice), shares in expected.items():
        assert placed.options(threads, nice) == ["--cgroup-parent", parent, "--cpu-shares", shares]
    assert placed.describe()["placement"] == "caller" and placed.describe()["cgroup_parent"] == parent


@pytest.mark.parametrize("cgroups, host, kind, said", [
    ("systemd,1", "unix:///run/docker.sock", "docker", "cgroup driver is systemd"),
    ("cgroupfs,2", "unix:///run/docker.sock", "docker", "cgroup v2"),
    ("cgroupfs,1", "tcp://build-host:2376", "docker", "not on this host"),
])
def test_where_the_container_cannot_be_placed_the_record_says_why(engine, tmp_path, monkeypatch, cgroups, host,
                                                                  kind, said):
    from dlbench.execution.container_engine import ContainerEngine

    monkeypatch.setenv("FAKE_DOCKER_CGROUPS", cgroups)
    monkeypatch.setenv("DOCKER_HOST", host)
    proc, switch = proc_files(tmp_path, V1_AT_ROOT, "/autogroup-1 nice 0\n", "1")
    placed = cpu_placement(ContainerEngine(), proc, switch)
    assert placed.options(2, 0) == []
    assert placed.describe()["placement"] == "engine" and said in placed.describe()["reason"]


def test_podman_s_cli_names_its_cgroups_its_own_way(engine, tmp_path, monkeypatch):
    from dlbench.execution.container_engine import ContainerEngine

    monkeypatch.setenv("FAKE_DOCKER_KIND", "podman")
    monkeypatch.setenv("FAKE_DOCKER_CGROUPS", "cgroupfs,1")
    assert ContainerEngine().cgroups() == ("cgroupfs", "1")
    assert any("{{json .Host.CgroupsVersion}}" in c for c in engine.calls("info"))


def test_the_run_command_carries_the_placement_and_the_record_says_it(runner, docker, tmp_path):
    env = docker.ensure(runner, "cpu")
    spec = dataclasses.replace(env.container, cpu=CpuPlacement("/", session_nice=None))
    argv = spec.run_command("dlbench-fake-2", env.python, runner.worker.resolve(), ["req.json", "res.json"],
                            tmp_path / "exchange", {"OMP_NUM_THREADS": "3"})
    shares = 3 * NICE_WEIGHTS[os.nice(0) + 20]  # this process's niceness (pinned values: the test above)
    assert option_values(argv, "--cgroup-parent") == ["/"] and option_values(argv, "--cpu-shares") == [str(shares)]
    assert spec.describe()["container"]["cpu"]["placement"] == "caller"
    # the fake engine says systemd: the engine's placement stands, and the record says why
    assert env.container.describe()["container"]["cpu"] == {
        "placement": "engine", "reason": env.container.cpu.reason}
    assert "systemd" in env.container.cpu.reason


@pytest.mark.parametrize("visible, expected", [
    (None, "all"), ("", "all"), ("2", "device=2"), ("1,3", '"device=1,3"'),
    ("GPU-8f1e,GPU-77aa", '"device=GPU-8f1e,GPU-77aa"'),
])
def test_gpus_are_passed_through(visible, expected):
    assert gpu_request(visible) == expected


def test_a_cuda_image_gets_the_gpus_the_controller_sees(runner, docker, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    env = docker.ensure(runner, "cuda")
    argv = env.container.run_command("n", env.python, runner.worker, [], tmp_path, {})
    assert option_values(argv, "--gpus") == ['"device=0,1"']
    assert env.describe()["gpus"] == '"device=0,1"'


# ---- running workers -----------------------------------------------------------------------------

class WatchRecorder:
    """A Monitor that remembers which process it was told to follow."""

    def __init__(self, then=None):
        self.pids, self.cmdlines, self.then = [], [], then

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def watch(self, pid):
        self.pids.append(pid)
        self.cmdlines.append(psutil.Process(pid).cmdline())
        if self.then:
            self.then()


def test_a_worker_runs_in_the_container_and_the_sampler_follows_it(runner, docker, engine, suite, monkeypatch):
    env = docker.ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.1")  # alive for a second or more: long enough to be found
    monitor = WatchRecorder()
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite), 60, {"OMP_NUM_THREADS": "1"},
                         monitor, container=env.container)
    assert outcome.status == "ok", outcome.reason
    assert outcome.result["iter_s"]
    run = engine.calls("run")[-1]
    assert option_values(run, "--name")[0].startswith("dlbench-fake-")
    assert "OMP_NUM_THREADS=1" in option_values(run, "--env")
    # the monitor follows the worker inside the container, not the docker client
    assert len(monitor.pids) == 1
    assert str(runner.worker.resolve()) in monitor.cmdlines[0] and str(FAKE_DOCKER) not in monitor.cmdlines[0]
    assert engine.calls("stop") == [] and engine.running() == []  # --rm: nothing to stop, nothing left


def test_a_timeout_stops_the_container(runner, docker, engine, suite, tmp_path, monkeypatch):
    env = docker.ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "hang_with_child")
    monkeypatch.setenv("DLBENCH_FAKE_PIDFILE", str(tmp_path / "child.pid"))
    monitor = WatchRecorder()
    started = time.monotonic()
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite), 2, None, monitor,
                         container=env.container)
    assert outcome.status == "timeout" and "timeout of 2 s" in outcome.reason
    name = option_values(engine.calls("run")[-1], "--name")[0]
    assert engine.calls("stop") == [["stop", "--time", str(STOP_GRACE_S), name]]
    worker_pid, child_pid = monitor.pids[0], int((tmp_path / "child.pid").read_text())
    for pid in (worker_pid, child_pid):  # the whole container is gone, its worker's children too
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert engine.running() == []
    assert time.monotonic() - started < 2 + STOP_GRACE_S + 10


def test_an_interrupt_stops_the_container(runner, docker, engine, suite, monkeypatch):
    env = docker.ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "hang")

    def interrupt():
        raise KeyboardInterrupt

    monitor = WatchRecorder(then=interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_worker(env.python, runner.worker, request_for(runner, suite), 60, None, monitor, container=env.container)
    name = option_values(engine.calls("run")[-1], "--name")[0]
    assert ["stop", "--time", str(STOP_GRACE_S), name] in engine.calls("stop")
    pid = monitor.pids[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_sigterm_then_another_during_the_stop_still_stops_the_container(runner, docker, engine, suite, monkeypatch):
    """`kill` of the controller, and again while it stops the container: the container is stopped
    all the same (issue 18); the first signal is the one that counts."""
    env = docker.ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", "hang")
    engine_type = type(env.container.engine)
    real_stop = engine_type.stop

    def stop_and_be_signalled(self, name, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.2)
        return real_stop(self, name, *args, **kwargs)

    def terminate():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    monkeypatch.setattr(engine_type, "stop", stop_and_be_signalled)
    monitor = WatchRecorder(then=terminate)
    with pytest.raises(Interrupted) as caught, deliver_signals():
        run_worker(env.python, runner.worker, request_for(runner, suite), 60, None, monitor, container=env.container)
    assert caught.value.signum == signal.SIGTERM
    name = option_values(engine.calls("run")[-1], "--name")[0]
    assert ["stop", "--time", str(STOP_GRACE_S), name] in engine.calls("stop")
    assert engine.running() == []
    pid = monitor.pids[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("behaviour, reason", [
    ("sigkill", "worker killed by SIGKILL"),
    ("exit", "worker exited with status 3 without a result: fake worker is exiting abruptly"),
    ("raise", "RuntimeError: fake failure while building the network"),
])
def test_exit_statuses_read_as_on_the_host(runner, docker, engine, suite, monkeypatch, behaviour, reason):
    env = docker.ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", behaviour)
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite), 60, container=env.container)
    assert outcome.status == "failed" and reason in outcome.reason


def test_the_engine_s_oom_kill_is_named(runner, docker, engine, suite, monkeypatch):
    monkeypatch.setenv("DLBENCH_CONTAINER_MEMORY", "64m")
    env = docker.ensure(runner, "cpu")
    assert env.container.run_options()[-4:] == ["--memory", "64m", "--memory-swap", "64m"]
    monkeypatch.setenv("FAKE_DOCKER_OOM", "1")
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.1")
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite), 60, container=env.container)
    assert outcome.status == "failed"
    assert outcome.reason == "the engine killed the container for exceeding its memory limit of 64m (OOMKilled)"
    assert engine.containers() == {}  # read, then removed


def test_an_image_removed_mid_run_is_named(runner, docker, engine, suite):
    env = docker.ensure(runner, "cpu")
    images = engine.images()
    del images[env.container.image]
    (engine.state / "images.json").write_text(json.dumps(images))
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite), 60, container=env.container)
    assert outcome.status == "failed"
    assert outcome.reason.startswith(f"the image {env.container.image} ({env.container.image_id}) is no longer in "
                                     "the engine: it was removed while dlbench ran; `dlbench env create fake --env docker`")


def test_a_base_image_of_ones_own_is_a_build_argument(runner, docker, engine, monkeypatch):
    default_tag = docker.image_for(runner, "cpu")[0]
    monkeypatch.setenv("DLBENCH_BASE_IMAGE", "dlbench/base:bookworm-local")
    tag = docker.image_for(runner, "cpu")[0]
    assert tag != default_tag  # another base is another image
    with pytest.raises(EnvironmentBuildError, match=r"(?s)the base image dlbench/base:bookworm-local did not run "
                                                    r"python3 .*sets \$DLBENCH_BASE_IMAGE to a local image"):
        docker.ensure(runner, "cpu")  # the engine has no such image and no registry to pull it from
    assert engine.calls("build") == []
    monkeypatch.setenv("FAKE_DOCKER_BASES", f"{BASE},dlbench/base:bookworm-local")
    env = docker.ensure(runner, "cpu")
    assert option_values(engine.calls("build")[0], "--build-arg") == ["BASE_IMAGE=dlbench/base:bookworm-local"]
    assert env.describe()["container"]["base_image"] == "dlbench/base:bookworm-local"


@pytest.mark.parametrize("kind", ["podman", "podman-socket"])
def test_podman_its_cli_and_its_socket(runner, docker, engine, suite, monkeypatch, kind):
    monkeypatch.setenv("FAKE_DOCKER_KIND", kind)
    env = docker.ensure(runner, "cpu")
    assert env.describe()["container"]["engine"]["engine"] == "podman"
    assert env.container.image_id.startswith("sha256:")  # podman's CLI prints ids without the prefix
    assert docker.list()[0]["tag"] == env.container.image  # podman's localhost/ tags are dlbench's
    again = docker.ensure(runner, "cpu")  # found, not rebuilt
    assert len(engine.calls("build")) == 1 and again.container.image_id == env.container.image_id
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite), 60, container=env.container)
    assert outcome.status == "ok", outcome.reason


def test_an_engine_failure_is_named(runner, docker, engine, suite, monkeypatch):
    env = docker.ensure(runner, "cuda")
    monkeypatch.setenv("FAKE_DOCKER_NO_GPU_RUNTIME", "1")
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite, "cuda"), 60, container=env.container)
    assert outcome.status == "failed"
    assert outcome.reason.startswith("the container engine (docker) could not start the container: ")
    assert "could not select device driver" in outcome.reason


def test_exit_readings(runner, docker, engine):
    spec = docker.ensure(runner, "cpu").container
    assert spec.finish("gone", 0).returncode == 0 and spec.finish("gone", 0).engine_failure is None
    assert spec.finish("gone", 137).returncode == -9 and spec.finish("gone", 137).engine_failure is None
    assert spec.finish("gone", 125).engine_failure == "the container engine (docker) could not start the container"
    assert "could not be run" in spec.finish("gone", 127).engine_failure


def test_orchestrated_runs_record_the_image(runner, docker_project, engine, suite, tmp_path):
    options = RunOptions(device="cpu", env_backend="docker", threads=2, repeats=2, timeout_s=60,
                         cache=tmp_path / "cache")
    store = Store(tmp_path / "store")
    records = Orchestrator(store, options).execute(plan([runner], list(suite.benchmarks[:2])))
    assert [r.status for r in records] == ["ok", "ok"]
    assert len(engine.calls("build")) == 1  # one image for every run
    workers = [c for c in engine.calls("run") if "--name" in c]
    assert len(workers) == 4 and len({option_values(c, "--name")[0] for c in workers}) == 4
    assert all("OMP_NUM_THREADS=2" in option_values(c, "--env") for c in workers)
    stored = list(store.records())
    tag = engine.calls("build")[0][engine.calls("build")[0].index("--tag") + 1]
    assert {r.environment["backend"] for r in stored} == {"docker"}
    assert {r.environment["image"] for r in stored} == {tag}
    assert {r.environment["image_id"] for r in stored} == {engine.images()[tag]["id"]}


def test_a_broken_engine_fails_the_runs_not_the_plan(runner, docker_project, engine, suite, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_BUILD_FAIL", "1")
    options = RunOptions(device="cpu", env_backend="docker", threads=1, repeats=1, timeout_s=60,
                         cache=tmp_path / "cache")
    records = Orchestrator(Store(tmp_path / "store"), options).execute(plan([runner], list(suite.benchmarks[:2])))
    assert [r.status for r in records] == ["failed", "failed"]
    assert all("image" in r.reason and r.repeat_policy.stopped == "not_started" for r in records)


# ---- the command line ----------------------------------------------------------------------------

def test_env_create_list_remove(docker_project, engine, tmp_path):
    cli = CliRunner()
    listed = cli.invoke(app, ["env", "list"])
    assert listed.exit_code == 0, listed.output
    assert re.search(r"fake\s+│\s+cpu\s+│\s+not built\s+│\s+dlbench/fake:cpu-", listed.output)

    created = cli.invoke(app, ["env", "create", "fake", "--env", "docker", "--device", "cpu"])
    assert created.exit_code == 0, created.output
    tag = next(t for t in engine.images() if t.startswith("dlbench/"))
    assert tag in created.output
    # an image of an older Dockerfile is shown as stale
    images = engine.images()
    images["dlbench/fake:cpu-0123456789abcdef"] = {**images[tag], "created": "2026-01-01 00:00:00"}
    (engine.state / "images.json").write_text(json.dumps(images))
    listed = cli.invoke(app, ["env", "list"])
    assert re.search(r"fake\s+│\s+cpu\s+│\s+ready\s+│\s+" + re.escape(tag), listed.output)
    assert re.search(r"fake\s+│\s+cuda\s+│\s+not built", listed.output)
    assert re.search(r"stale .*dlbench/fake:cpu-0123456789abcdef", listed.output)

    removed = cli.invoke(app, ["env", "remove", "fake", "--env", "docker"])
    assert removed.exit_code == 0 and list(engine.images()) == [BASE]
    assert ["image", "rm", tag] in engine.calls("image")


def test_env_list_without_a_daemon_still_lists_venvs(docker_project, engine, monkeypatch):
    monkeypatch.setenv("FAKE_DOCKER_DAEMON_DOWN", "1")
    listed = CliRunner().invoke(app, ["env", "list"])
    assert listed.exit_code == 0
    assert "environments in" in listed.output and "docker images: not listed" in listed.output


def test_env_create_refuses_the_current_backend(docker_project, engine):
    done = CliRunner().invoke(app, ["env", "create", "fake", "--env", "current"])
    assert done.exit_code == 2 and "unknown environment backend 'current'" in done.output


def test_run_with_the_docker_backend(docker_project, engine, tmp_path):
    done = CliRunner().invoke(app, ["run", "--no-check", "--suite", "fcn", "--framework", "fake", "--env", "docker", "--profile",
                                    "smoke", "--device", "cpu", "--repeats", "1", "--no-telemetry",
                                    "--store", str(tmp_path / "store")])
    assert done.exit_code == 0, done.output
    records = list(Store(tmp_path / "store").records())
    assert len(records) == 2 and {r.environment["backend"] for r in records} == {"docker"}
    assert len([c for c in engine.calls("run") if "--name" in c]) == 2
