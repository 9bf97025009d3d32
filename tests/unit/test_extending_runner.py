"""Add a fifth framework runner: its folder and its Dockerfiles, nothing in src/ (docs/extending.md,
"Add a framework runner").

In a temporary dlbench root (DLBENCH_ROOT: the repository's suites, reports, runners and Dockerfiles,
linked, beside one new runner folder `runners/toy/` and `docker/toy/`) the toy framework is found
by `dlbench list` and `dlbench env list`, its images are keyed from its own Dockerfiles and pass the
Dockerfile checks, a smoke run of one network on it works through `--env current` with the
prediction its runner.toml's [model] asks for, a bad [model] is one clear error, and the nightly
workflow's matrix takes it in. The toy's runner object is the fake runner's code
(tests/fixtures/runners/fake) under the toy's name: what is tested here is how dlbench finds and
drives a runner, not a framework.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from test_dockerfiles import base_images, tool
from test_workflows import load, run_job_steps
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.execution.containers import dockerfile_path
from dlbench.execution.registry import FLAVOURS, RunnerRegistry
from dlbench.machine import fingerprint
from dlbench.performance.model import FrameworkFacts
from dlbench.store.profiles import BandwidthPoint, MachineProfile, MatmulCeiling, ProfileStore
from dlbench.store.store import Store

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fixtures" / "runners" / "fake"
FAKE_DOCKER = ROOT / "tests" / "fixtures" / "fake_docker.py"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# The toy runner's files, as docs/extending.md lists them.
RUNNER_TOML = '''\
# The controller reads this; it never imports the framework.
name = "toy"
display_name = "Toy (docs/extending.md)"
import_name = "json"           # checked in a child process for the `current` environment backend
worker = "worker.py"

# Pinned requirements per device flavour, installed by `dlbench env create toy`.
[requirements]
cpu = "requirements-cpu.txt"
cuda = "requirements-cuda.txt"

# What it runs, per axis: dlbench refuses any other value before a worker starts.
[capabilities]
precisions = ["fp32"]
compile = ["eager", "compiled"]
modes = ["train", "infer"]

# What the performance model assumes of this runner: its step is one compiled call; its engine
# sends each layer's gradient as soon as it is computed.
[model]
step = "graph"
schedule = "wfbp"
'''
WORKER = '''\
"""The toy framework's worker, started by path: the shared harness with the toy's runner object."""

import sys
from pathlib import Path

# the folder that holds the runners package takes the place of this one on the path
sys.path[0] = str(Path(__file__).resolve().parents[2])

from runners.common import harness  # noqa: E402
from runners.toy.runner import ToyRunner  # noqa: E402

if __name__ == "__main__":
    sys.exit(harness.main(ToyRunner()))
'''
TOY_RUNNER = f'''\
"""The toy framework: the fake runner's code (time.sleep for a step) under the toy's name."""

import sys

sys.path.insert(0, {str(FAKE)!r})

from fake_runner import FakeRunner  # noqa: E402


class ToyRunner(FakeRunner):
    name = "toy"

    def framework_info(self, device):
        return {{**super().framework_info(device), "name": "toy", "version": "0.1"}}
'''
REQUIREMENTS = "# nothing: the toy framework uses the standard library only\n"
DOCKERFILE = '''\
# Toy, {flavour} flavour. The build context holds requirements.txt (dlbench copies
# runners/toy/requirements-{flavour}.txt there, the same pins the venv backend installs) and
# wheelhouse/, the wheels they resolve to; the base image is a build argument.
ARG BASE_IMAGE=python:3.11.15-slim-bookworm

FROM ${{BASE_IMAGE}} AS install
LABEL org.dlbench.stage=install
COPY requirements.txt /opt/dlbench/requirements.txt
COPY wheelhouse /opt/dlbench/wheelhouse
RUN python3 -m venv /opt/dlbench/venv \\
    && /opt/dlbench/venv/bin/python3 -m pip install --no-cache-dir --disable-pip-version-check --no-index \\
        --find-links /opt/dlbench/wheelhouse -r /opt/dlbench/requirements.txt

FROM ${{BASE_IMAGE}}
COPY --from=install /opt/dlbench/venv /opt/dlbench/venv
ENV PATH=/opt/dlbench/venv/bin:$PATH
'''


def add_toy_runner(root: Path) -> None:
    folder = root / "runners" / "toy"
    folder.mkdir(parents=True)
    (folder / "runner.toml").write_text(RUNNER_TOML)
    (folder / "__init__.py").write_text('"""The toy runner (docs/extending.md)."""\n')
    (folder / "worker.py").write_text(WORKER)
    (folder / "runner.py").write_text(TOY_RUNNER)
    for flavour in FLAVOURS:
        (folder / f"requirements-{flavour}.txt").write_text(REQUIREMENTS)
        path = dockerfile_path(root / "docker", "toy", flavour)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(DOCKERFILE.format(flavour=flavour))


@pytest.fixture
def tree(tmp_path, monkeypatch) -> Path:
    """A dlbench root: the repository's suites, reports, runner folders and Dockerfiles, linked, and
    the toy runner beside them."""
    root = tmp_path / "dlbench"
    for kind in ("runners", "docker"):
        (root / kind).mkdir(parents=True)
        for entry in (ROOT / kind).iterdir():  # runners/__init__.py too: the temporary root's runners package
            if entry.name != "__pycache__":
                (root / kind / entry.name).symlink_to(entry)
    for kind in ("suites", "reports"):
        (root / kind).symlink_to(ROOT / kind)
    add_toy_runner(root)
    monkeypatch.setenv("DLBENCH_ROOT", str(root))
    monkeypatch.setenv("DLBENCH_STORE", str(tmp_path / "default-store"))
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)
    monkeypatch.setenv("COLUMNS", "250")  # rich's tables: wide enough for a row per line
    monkeypatch.chdir(tmp_path)
    return root


@pytest.fixture
def fake_docker(tmp_path, monkeypatch) -> Path:
    """A stand-in docker client (tests/fixtures/fake_docker.py): the image listing without an engine."""
    client = tmp_path / "bin" / "docker"
    client.parent.mkdir()
    client.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_DOCKER} \"$@\"\n")
    client.chmod(0o755)
    monkeypatch.setenv("DLBENCH_DOCKER", str(client))
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(tmp_path / "engine"))
    monkeypatch.setenv("FAKE_DOCKER_PYTHON", sys.executable)
    for knob in ("FAKE_DOCKER_DAEMON_DOWN", "FAKE_DOCKER_BUILD_FAIL", "FAKE_DOCKER_NO_GPU_RUNTIME"):
        monkeypatch.delenv(knob, raising=False)
    return client


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, ANSI.sub("", result.stdout), " ".join(ANSI.sub("", result.stderr).split())


def test_dlbench_list_and_env_list_find_the_toy_runner(tree, fake_docker):
    names = RunnerRegistry(ROOT / "runners").names()
    code, out, err = invoke("list", "--device", "cpu")
    assert code == 0, err
    assert f"frameworks: {', '.join(sorted(names + ['toy']))}" in out

    code, out, err = invoke("env", "list")
    assert code == 0, err
    for flavour in FLAVOURS:
        # its environment, keyed by its own requirements file, and its image, by its own Dockerfile
        assert re.search(rf"toy\s+│\s+{flavour}\s+│\s+not built\s+│\s+\S*toy", out), out
        assert re.search(rf"toy\s+│\s+{flavour}\s+│\s+not built\s+│\s+dlbench/toy:{flavour}-[0-9a-f]+", out), out
    assert "no Dockerfile" not in out


def test_the_toy_dockerfiles_pass_the_repositorys_dockerfile_checks(tree):
    runners = RunnerRegistry(tree / "runners")
    dockerfiles = sorted((tree / "docker").glob("*/*.Dockerfile"))
    assert set(dockerfiles) == {dockerfile_path(tree / "docker", n, f) for n in runners.names() for f in FLAVOURS}
    for flavour in FLAVOURS:
        path = dockerfile_path(tree / "docker", "toy", flavour)
        text = path.read_text()
        assert "COPY requirements.txt /opt/dlbench/requirements.txt" in text  # as test_dockerfiles asks
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base_images(path)[0])
    done = subprocess.run([tool("hadolint"), "--no-color", *(str(dockerfile_path(tree / "docker", "toy", f))
                                                             for f in FLAVOURS)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "", done.stdout + done.stderr


def test_a_smoke_run_on_the_toy_runner_with_its_prediction(tree, tmp_path):
    store = tmp_path / "store"
    # a machine profile of this machine, so that the run is predicted; the toy's call time d is 1 ms
    ProfileStore(Store(store)).write(MachineProfile(
        machine_id=fingerprint()["machine_id"], created_at=datetime(2026, 12, 1, tzinfo=timezone.utc), dlbench={},
        machine={"hostname": "box"}, device="cpu", threads=1, dispatch_s={"toy": 1e-3},
        matmul_peak={"float32": MatmulCeiling(flops_per_s=1e11, framework="toy", kernel="k")},
        copy_bandwidth=[BandwidthPoint(bytes=1 << 20, bytes_per_s=1e10, framework="toy")]))
    code, out, err = invoke("run", "--no-check", "--replace-contended", "0", "--suite", "fcn", "--framework", "toy",
                            "--benchmark", "fcn5-train",
                            "--profile", "smoke", "--device", "cpu", "--env", "current", "--threads", "1",
                            "--repeats", "2", "--store", str(store))
    assert code == 0, err
    assert "1 runs on cpu (toy)" in err and "fcn5-train" in out
    (record,) = Store(store).records()
    assert record.status == "ok" and record.framework["name"] == "toy" and len(record.repeats) == 2
    assert record.summary.median_s > 0 and record.params == record.network.params_described
    # runner.toml's [model] step = "graph": the call is paid once per iteration, as the step_call phase
    assert RunnerRegistry(tree / "runners").get("toy").model == FrameworkFacts("graph", "wfbp")
    assert record.prediction is not None and record.prediction.error is None
    assert record.prediction.phases["step_call"] == pytest.approx(1e-3)

    code, out, _ = invoke("results", "--store", str(store), "--format", "json")
    assert code == 0 and [(r["framework"], r["benchmark"], r["status"]) for r in json.loads(out)] == [
        ("toy", "fcn5-train", "ok")]


def test_a_bad_model_section_is_one_error_naming_the_file_and_field(tree, tmp_path):
    toml = tree / "runners" / "toy" / "runner.toml"
    toml.write_text(RUNNER_TOML.replace('step = "graph"', 'step = "lazy"'))
    code, _, err = invoke("run", "--no-check", "--suite", "fcn", "--framework", "toy", "--profile", "smoke", "--device", "cpu",
                          "--env", "current", "--store", str(tmp_path / "store"))
    assert code == 2
    assert f"{toml}: model.step: 'lazy' is not one of eager, graph" in err
    assert not (tmp_path / "store").exists()


def test_the_nightly_matrix_takes_the_toy_runner_in(tree):
    # the start job's listing step, run here against the tree: the bench matrix gets a toy column
    outputs = run_job_steps(load("nightly.yml"), "start", tree)
    assert json.loads(outputs["frameworks"]) == sorted(RunnerRegistry(ROOT / "runners").names() + ["toy"])
    # ci.yml runs every runner there is (`--framework all`) and keys its cache on every runner's pins
    ci = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    assert "hashFiles('runners/*/requirements-cpu.txt')" in ci
    assert set(re.findall(r"--framework (\S+)", ci)) == {"all"}
