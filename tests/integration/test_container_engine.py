"""The docker backend against a real engine: one framework's image (mxnet's, the smallest and
quickest to build) built from nothing and run, the container facts in the record, a graceful stop,
and the engine failures named (missing image mid-run, OOM kill, permission denied on the socket).

The engine is the one bin/test starts (a private dockerd, scripts/private-engine.sh) and names in
DLBENCH_TEST_ENGINE_HOST, with the base image DLBENCH_TEST_BASE_IMAGE (a stand-in Debian made by
mmdebstrap where no registry can be reached). Without one these tests skip, and fail under CI=true.
The other three frameworks' images, podman and the throughput against the venv are measured by
benchmarks/containers.py (too slow for CI)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.execution.backends import backend
from dlbench.execution.container_engine import ContainerEngine
from dlbench.execution.containers import STOP_GRACE_S, ContainerSpec
from dlbench.execution.launcher import run_worker
from dlbench.execution.registry import RunnerRegistry
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORK = "mxnet"


@pytest.fixture(scope="module")
def real_engine():
    host = os.environ.get("DLBENCH_TEST_ENGINE_HOST")
    if not host:
        message = "no container engine for the real-engine tests (bin/test starts one where it can: root and apt-get)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return host, os.environ.get("DLBENCH_TEST_BASE_IMAGE")


@pytest.fixture
def engine_env(real_engine, monkeypatch, tmp_path_factory):
    host, base = real_engine
    monkeypatch.setenv("DOCKER_HOST", host)
    monkeypatch.delenv("DLBENCH_DOCKER", raising=False)
    monkeypatch.delenv("DLBENCH_CONTAINER_MEMORY", raising=False)
    if base:
        monkeypatch.setenv("DLBENCH_BASE_IMAGE", base)
    return host


@pytest.fixture(scope="module")
def built(real_engine):
    """`dlbench env create mxnet --env docker` from nothing: (seconds, the command's output)."""
    host, base = real_engine
    env = {**os.environ, "DOCKER_HOST": host, **({"DLBENCH_BASE_IMAGE": base} if base else {})}
    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "dlbench"), "env", "create", FRAMEWORK, "--env", "docker",
                           "--device", "cpu"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr
    return time.monotonic() - started, done.stdout + done.stderr


def test_the_image_is_built_and_a_suite_runs_in_it(built, engine_env, tmp_path):
    _, output = built
    assert f"dlbench/{FRAMEWORK}:cpu-" in output
    store = tmp_path / "store"
    done = CliRunner().invoke(app, ["run", "--suite", "cnn", "--framework", FRAMEWORK, "--benchmark", "alexnet_r",
                                    "--env", "docker", "--profile", "smoke", "--device", "cpu", "--repeats", "1",
                                    "--no-check", "--no-telemetry", "--store", str(store)])
    assert done.exit_code == 0, done.output
    records = list(Store(store).records())
    assert records and {r.status for r in records} == {"ok"}, [r.reason for r in records]
    env = records[0].environment
    engine = ContainerEngine()
    assert env["backend"] == "docker" and env["image_id"] == engine.image_id(env["image"])
    facts = env["container"]
    assert facts["engine"]["engine"] == "docker" and facts["engine"]["endpoint"] == engine_env
    assert facts["base_image"] == os.environ.get("DLBENCH_BASE_IMAGE", facts["base_image"])
    assert facts["base_image_id"] and facts["image_size_bytes"] > 100e6
    assert facts["venv_lock_checked"] in (True, False)
    assert {"--init", "--network", "none"} <= set(facts["run_options"])
    assert ContainerEngine().container_state("no-such-container") is None
    # nothing is left behind: every worker's container was removed after its state was read
    left = engine.call("ps", "--all", "--quiet", "--filter", f"label=org.dlbench.framework={FRAMEWORK}")
    assert left.returncode == 0 and left.stdout.strip() == ""


def test_a_stop_is_graceful(built, engine_env):
    """With --init the worker gets SIGTERM and exits by it (143) well within the grace; as PID 1
    without an init it ignores SIGTERM and the engine kills it after the grace (137)."""
    image = ContainerEngine().image_id(_tag())
    engine = ContainerEngine()
    results = {}
    for init in (True, False):
        name = f"dlbench-stoptest-{os.getpid()}-{int(init)}"
        started = engine.call("run", "--detach", "--name", name, *(["--init"] if init else []), "--network", "none",
                              "--entrypoint", "python3", image, "-c", "import time; time.sleep(120)")
        assert started.returncode == 0, started.stderr
        time.sleep(1)
        began = time.monotonic()
        engine.stop(name, STOP_GRACE_S)
        took = time.monotonic() - began
        state = engine.container_state(name)
        engine.remove_container(name)
        results[init] = (state.exit_code, took)
    assert results[True][0] == 143 and results[True][1] < STOP_GRACE_S  # SIGTERM, within the grace
    assert results[False][0] == 137  # the bare PID 1 waited out the grace and was killed


def _tag() -> str:
    registry = RunnerRegistry(ROOT / "runners")
    return backend("docker", Path(os.environ.get("DLBENCH_CACHE", Path.home() / ".cache" / "dlbench"))).image_for(
        registry.get(FRAMEWORK), "cpu")[0]


def _spec(**changes) -> tuple[ContainerSpec, object]:
    registry = RunnerRegistry(ROOT / "runners")
    runner = registry.get(FRAMEWORK)
    env = backend("docker", Path(os.environ.get("DLBENCH_CACHE", Path.home() / ".cache" / "dlbench"))).ensure(
        runner, "cpu")
    return dataclasses.replace(env.container, **changes), (runner, env)


def _request() -> dict:
    from dlbench.definitions.catalog import SuiteCatalog
    from dlbench.execution.orchestrator import RunOptions, build_request, plan

    suite = SuiteCatalog(ROOT / "suites").load_suite(ROOT / "suites" / "cnn.yaml", "smoke", "cpu", ("train",))
    runner = RunnerRegistry(ROOT / "runners").get(FRAMEWORK)
    bench = next(b for b in suite.benchmarks if b.network.name == "alexnet_r")
    return build_request(plan([runner], [bench])[0], RunOptions(device="cpu", env_backend="docker", threads=1,
                                                                repeats=None, timeout_s=300, cache=Path("/nonexistent")))


def test_an_image_gone_mid_run_is_named(built, engine_env):
    spec, (runner, env) = _spec(image="dlbench/mxnet:cpu-0000000000000000",
                                image_id="sha256:" + "0" * 64)
    outcome = run_worker(env.python, runner.worker, _request(), 120, container=spec)
    assert outcome.status == "failed"
    assert "is no longer in the engine: it was removed while dlbench ran" in outcome.reason


def test_an_oom_killed_container_is_named(built, engine_env):
    spec, (runner, env) = _spec(memory="64m")
    outcome = run_worker(env.python, runner.worker, _request(), 300, container=spec)
    assert outcome.status == "failed"
    assert "the engine killed the container for exceeding its memory limit of 64m (OOMKilled)" in outcome.reason


def test_permission_denied_on_the_socket_is_named(real_engine):
    """A user outside the socket's group (nobody) asks the engine: the reason is the socket's errno."""
    host, _ = real_engine
    setpriv = shutil.which("setpriv")
    if os.getuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to ask as another user")
    as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable]
    if subprocess.run([*as_nobody, "-c", "import pydantic"], capture_output=True, timeout=120,
                      env={"PYTHONPATH": str(ROOT / "src")}).returncode != 0:
        pytest.skip("the controller's interpreter cannot be run by another user here")
    code = ("from dlbench.execution.container_engine import ContainerEngine, EngineError\n"
            "try:\n    ContainerEngine().info()\nexcept EngineError as e:\n    print(e)\n")
    done = subprocess.run([*as_nobody, "-c", code],
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "DOCKER_HOST": host, "HOME": "/tmp",
                               "PYTHONPATH": str(ROOT / "src")})
    assert "permission denied on" in done.stdout and "this user may not use the engine" in done.stdout, (
        done.stdout + done.stderr)
    assert json.dumps(host)  # the socket named is the one asked
