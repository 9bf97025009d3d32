"""The docker backend against a fake engine (tests/fixtures/fake_docker.py stands in for the `docker`
client: there is no Docker engine here). What is tested is what dlbench sends to the engine and what
it does with the answers: tags, builds, the `docker run` command, timeouts, exit statuses, listing."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
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
    ContainerSpec,
    DockerBackend,
    gpu_request,
    image_key,
    image_tag,
    parse_tag,
)
from dlbench.execution.backends import backend
from dlbench.execution.environments import EnvironmentBuildError
from dlbench.execution.interrupts import Interrupted, deliver_signals
from dlbench.execution.launcher import run_worker
from dlbench.execution.orchestrator import Orchestrator, RunOptions, build_request, plan
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FAKE_DOCKER = ROOT / "tests" / "fixtures" / "fake_docker.py"
DOCKERFILE = "FROM python:3.11.15-slim-bookworm\nCOPY requirements.txt /opt/dlbench/requirements.txt\n"


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

    def running(self) -> list[str]:
        return [p.stem for p in (self.state / "containers").glob("*.pid")] if (self.state / "containers").is_dir() else []


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
    for knob in ("FAKE_DOCKER_DAEMON_DOWN", "FAKE_DOCKER_BUILD_FAIL", "FAKE_DOCKER_NO_GPU_RUNTIME",
                 "DLBENCH_FAKE_BEHAVIOUR", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(knob, raising=False)
    yield Engine(state)
    # a test that failed may have left a fake container running: end its process group
    for pidfile in (state / "containers").glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)


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
    key = image_key(dockerfile, requirements, "cpu")
    assert re.fullmatch(r"[0-9a-f]{16}", key) and key == image_key(dockerfile, requirements, "cpu")
    assert image_key(dockerfile, requirements, "cuda") != key
    requirements.write_text("torch==2.13.1\n")
    changed_requirements = image_key(dockerfile, requirements, "cpu")
    dockerfile.write_text(DOCKERFILE + "ENV X=1\n")
    assert len({key, changed_requirements, image_key(dockerfile, requirements, "cpu")}) == 3
    assert image_tag("torch", "cpu", key) == f"dlbench/torch:cpu-{key}"
    assert parse_tag("dlbench/torch", f"cpu-{key}") == ("torch", "cpu", key)
    assert parse_tag("python", "3.11.15-slim-bookworm") is None


def test_the_runner_tag_follows_its_files(runner, docker, docker_project):
    tag, dockerfile, requirements = docker.image_for(runner, "cpu")
    assert dockerfile == docker_project / "docker" / "fake" / "cpu.Dockerfile"
    assert requirements == runner.requirements_for("cpu")
    assert tag == image_tag("fake", "cpu", image_key(dockerfile, requirements, "cpu"))
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
    assert option_values(build, "--progress") == ["plain"]
    assert set(option_values(build, "--label")) == {"org.dlbench.framework=fake", "org.dlbench.flavour=cpu",
                                                     f"org.dlbench.key={tag.rsplit('-', 1)[1]}"}
    # the context is the runner's requirements file and nothing else: one source for the versions
    assert engine.images()[tag]["context"] == {"requirements.txt": runner.requirements_for("cpu").read_text()}
    # progress reached the caller: the build's step, docker's own lines, then built
    assert [p.step for p in lines if p.starts_step] == ["building image", "built"]
    assert any("load build definition" in p.output for p in lines if p.output)
    assert {(p.framework, p.flavour, p.where) for p in lines} == {("fake", "cpu", tag)}
    assert env.backend == "docker" and env.key == tag and env.container.image == tag
    assert env.container.image_id == engine.images()[tag]["id"]
    # the probe ran in the image: its interpreter, version and lock
    assert env.python == Path(sys.executable) and env.python_version
    assert any(p.startswith("pydantic==") for p in env.packages)
    described = env.describe()
    assert described["image"] == tag and described["dockerfile"] == "docker/fake/cpu.Dockerfile"

    lines.clear()
    again = docker.ensure(runner, "cpu", lines.append)
    assert len(engine.calls("build")) == 1  # found, not rebuilt, and it says so
    assert [(p.step, p.where) for p in lines] == [("cached", tag)]
    assert len(engine.calls("run")) == 1  # the probe is cached per image id
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
    assert "building the fake (cpu) image" in message and "did not complete successfully" in message
    log = Path(re.search(r"log: (\S+)", message).group(1))
    assert log.is_file() and "--progress plain" in log.read_text()
    assert engine.images() == {}


def test_a_runner_without_a_dockerfile_is_refused_by_path(runner, docker, docker_project, engine):
    (docker_project / "docker" / "fake" / "cuda.Dockerfile").unlink()
    with pytest.raises(EnvironmentBuildError, match=r"no Dockerfile for fake \(cuda\): .*docker/fake/cuda.Dockerfile"):
        docker.ensure(runner, "cuda")
    assert engine.calls() == []


def test_no_client_and_no_daemon_are_clear_errors(runner, docker_project, engine, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_DOCKER", str(tmp_path / "no-such-docker"))
    with pytest.raises(EnvironmentBuildError, match="no docker client"):
        backend("docker", tmp_path / "cache").ensure(runner, "cpu")
    monkeypatch.setenv("DLBENCH_DOCKER", str(tmp_path / "bin" / "docker"))
    monkeypatch.setenv("FAKE_DOCKER_DAEMON_DOWN", "1")
    with pytest.raises(EnvironmentBuildError, match="Cannot connect to the Docker daemon"):
        backend("docker", tmp_path / "cache").ensure(runner, "cpu")


# ---- the docker run command ----------------------------------------------------------------------

def test_the_run_command(runner, docker, docker_project, tmp_path):
    env = docker.ensure(runner, "cpu")
    exchange, shared = tmp_path / "exchange", tmp_path / "check-work"
    worker = runner.worker.resolve()
    argv = env.container.run_command("dlbench-fake-1", env.python, worker, ["req.json", "res.json"], exchange,
                                     {"OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}, (shared,))
    assert argv[:4] == [os.environ["DLBENCH_DOCKER"], "run", "--rm", "--name"] and argv[4] == "dlbench-fake-1"
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


def test_an_engine_failure_is_named(runner, docker, engine, suite, monkeypatch):
    env = docker.ensure(runner, "cuda")
    monkeypatch.setenv("FAKE_DOCKER_NO_GPU_RUNTIME", "1")
    outcome = run_worker(env.python, runner.worker, request_for(runner, suite, "cuda"), 60, container=env.container)
    assert outcome.status == "failed"
    assert outcome.reason.startswith("docker could not start the container: ")
    assert "could not select device driver" in outcome.reason


def test_describe_exit():
    assert ContainerSpec.describe_exit(0) == (0, None)
    assert ContainerSpec.describe_exit(137) == (-9, None)
    assert ContainerSpec.describe_exit(125)[1] == "docker could not start the container"
    assert "could not be run" in ContainerSpec.describe_exit(127)[1]


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
    tag = next(iter(engine.images()))
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
    assert removed.exit_code == 0 and engine.images() == {}
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
