"""First use speaks: building a framework's environment says which framework, which step, how long,
and at the end what was built and what reused from the cache (execution reports BuildProgress, the
command line prints it). The venv and pip steps are faked at the subprocess boundary: each is a
short process that prints what the real one would."""

from __future__ import annotations

import fcntl
import io
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress
from typer.testing import CliRunner

from dlbench.cli import app
from dlbench.cli.build_progress import BuildLog, describe
from dlbench.cli.run import _ProgressEvents
from dlbench.execution import environments
from dlbench.execution.environments import (
    BUILT,
    CACHED,
    CREATING,
    FAILED,
    INSTALLING,
    MARKER,
    VERIFYING,
    WAITING,
    BuildProgress,
    EnvironmentBuildError,
    VenvBackend,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")

PIP_OUTPUT = [
    "Collecting numpy==2.1.0 (from -r /x/requirements-cpu.txt (line 1))",
    "  Downloading numpy-2.1.0-cp311-cp311-manylinux_2_17_x86_64.whl (16.3 MB)",
    "Requirement already satisfied: setuptools in ./lib/python3.11/site-packages",
    "Installing collected packages: numpy",
    "Successfully installed numpy-2.1.0",
]


class FakeSteps:
    """Stands in for subprocess.Popen in environments.py: the venv step makes the folder (its
    python a link to this interpreter, so the package listing runs), the pip step prints `pip_lines`,
    sleeps `pip_sleep_s` and exits with `pip_status`."""

    def __init__(self, pip_lines=PIP_OUTPUT, pip_sleep_s: float = 0.0, pip_status: int = 0):
        self.pip_lines, self.pip_sleep_s, self.pip_status = pip_lines, pip_sleep_s, pip_status
        self.commands: list[list[str]] = []
        self._popen = subprocess.Popen

    def __call__(self, cmd, **kwargs):
        if cmd[1:3] not in (["-m", "venv"], ["-m", "pip"]):  # the package listing (subprocess.run) runs
            return self._popen(cmd, **kwargs)
        self.commands.append(list(cmd))
        if cmd[1:3] == ["-m", "venv"]:
            (Path(cmd[3]) / "bin").mkdir(parents=True)
            (Path(cmd[3]) / "bin" / "python").symlink_to(sys.executable)
            script = "pass"
        else:
            script = (f"import sys, time; print({chr(10).join(self.pip_lines)!r}, flush=True); "
                      f"time.sleep({self.pip_sleep_s}); sys.exit({self.pip_status})")
        return self._popen([sys.executable, "-c", script], **kwargs)


@pytest.fixture
def steps(monkeypatch):
    fake = FakeSteps()
    monkeypatch.setattr(environments.subprocess, "Popen", fake)
    return fake


@pytest.fixture
def venv(tmp_path):
    return VenvBackend(tmp_path / "cache")


def test_a_build_reports_each_step_then_built_and_a_second_ensure_says_cached(steps, venv, fake):
    heard: list[BuildProgress] = []
    env = venv.ensure(fake, "cpu", heard.append)
    path = str(venv.path_for(fake, "cpu"))
    assert env.path == Path(path) and len(steps.commands) == 2
    assert {(p.framework, p.flavour, p.where) for p in heard} == {("fake", "cpu", path)}
    begun = [p.step for p in heard if p.starts_step]
    assert begun == [CREATING, INSTALLING, VERIFYING, BUILT]
    installing = next(p for p in heard if p.step == INSTALLING and p.starts_step)
    assert installing.note == f"from {fake.requirements_for('cpu')}"
    # pip's milestones, in order, and not its other lines
    assert [p.output for p in heard if p.output] == [PIP_OUTPUT[0], PIP_OUTPUT[1].strip(), *PIP_OUTPUT[3:]]
    assert all(p.step == INSTALLING for p in heard if p.output)
    elapsed = [p.elapsed_s for p in heard]
    assert elapsed == sorted(elapsed) and heard[-1].elapsed_s > 0

    again: list[BuildProgress] = []
    assert venv.ensure(fake, "cpu", again.append).path == env.path
    assert len(steps.commands) == 2, "a cached environment was built again"
    built_at = json.loads((env.path / MARKER).read_text())["built_at"]
    assert again == [BuildProgress("fake", "cpu", CACHED, where=path, note=f"built {built_at}")]


def test_the_lines_name_framework_step_and_package_and_sum_up_built_and_cached(steps, venv, fake):
    console = Console(file=io.StringIO(), width=400)
    log = BuildLog(console)
    venv.ensure(fake, "cpu", log)
    lines = console.file.getvalue().splitlines()
    path = venv.path_for(fake, "cpu")
    assert lines[0] == f"fake (cpu): building the environment {path}: creating the venv"
    # elapsed seconds are the machine's: matched, never asserted (a loaded VM takes its time)
    assert re.fullmatch(rf"fake \(cpu\): installing requirements \[\d+ s\] \(from {re.escape(str(fake.requirements_for('cpu')))}\)",
                        lines[1])
    assert re.fullmatch(r"fake \(cpu\): installing requirements \[\d+ s\]: Collecting numpy==2\.1\.0", lines[2])  # "(from ...)" dropped
    assert any(ln.endswith(": Installing collected packages: numpy") for ln in lines)
    assert not any("Requirement already satisfied" in ln for ln in lines)
    assert re.fullmatch(r"fake \(cpu\): verifying \[\d+ s\] \(the new interpreter lists its packages\)", lines[-2])
    assert re.fullmatch(rf"fake \(cpu\): environment built in \d+ s: {re.escape(str(path))}", lines[-1])
    assert re.fullmatch(rf"environments: built fake \(cpu\) in \d+ s, in {re.escape(str(venv.root))}", log.summary())

    again = BuildLog(Console(file=io.StringIO(), width=400))
    venv.ensure(fake, "cpu", again)
    cached = again.console.file.getvalue().splitlines()
    assert len(cached) == 1 and cached[0].startswith(f"fake (cpu): environment cached, reusing {path} (built ")
    assert again.summary() == f"environments: reused from the cache: fake (cpu), in {venv.root}"


def test_a_silent_pip_is_reported_while_it_stays_silent(monkeypatch, venv, fake):
    monkeypatch.setattr(environments.subprocess, "Popen", FakeSteps(
        pip_lines=["Collecting torch==2.5.1", "  Downloading torch-2.5.1-cp311-none-linux_x86_64.whl (797.1 MB)"],
        pip_sleep_s=0.6))
    monkeypatch.setattr(environments, "SILENCE_REPORT_S", 0.15)
    heard: list[BuildProgress] = []
    venv.ensure(fake, "cpu", heard.append)
    silent = [p for p in heard if p.silent_s is not None]
    assert silent, heard  # at least once: how often a loaded machine wakes the reader is its own business
    assert all(p.step == INSTALLING and p.output.startswith("Downloading torch-2.5.1") for p in silent)
    assert re.match(r"fake \(cpu\): installing requirements \[\d+ s\]: still on Downloading torch-2\.5\.1",
                    describe(silent[0]))
    assert describe(silent[0]).endswith(", nothing new for 0 s")


def test_a_failed_build_says_so_with_its_log(monkeypatch, venv, fake):
    monkeypatch.setattr(environments.subprocess, "Popen", FakeSteps(
        pip_lines=["ERROR: No matching distribution found for numpy==99"], pip_status=1))
    log = BuildLog(Console(file=io.StringIO(), width=400))
    with pytest.raises(EnvironmentBuildError):
        venv.ensure(fake, "cpu", log)
    last = log.console.file.getvalue().splitlines()[-1]
    build_log = venv.root / f"{venv.path_for(fake, 'cpu').name}.build.log"
    assert re.fullmatch(rf"fake \(cpu\): environment build failed after \d+ s \(log: {re.escape(str(build_log))}\)", last)
    assert log.summary() == "environments: failed: fake (cpu), in " + str(venv.root)


def test_waiting_on_another_process_building_it_says_so_then_cached(steps, venv, fake):
    """Another dlbench holds the build's lock: this one says it waits, and takes what the other built."""
    path = venv.path_for(fake, "cpu")
    venv.root.mkdir(parents=True)
    heard: list[BuildProgress] = []
    waiting = threading.Event()

    def hear(progress):
        heard.append(progress)
        if progress.step == WAITING:
            waiting.set()

    with open(venv.root / f".{path.name}.lock", "w") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        found: list = []
        builder = threading.Thread(target=lambda: found.append(venv.ensure(fake, "cpu", hear)))
        builder.start()
        assert waiting.wait(10), "no WAITING while the lock was held"
        path.mkdir()  # the other process finishes its build
        (path / MARKER).write_text(json.dumps({"key": path.name.rsplit("-", 1)[1], "built_at": "then"}))
    builder.join(10)
    assert [p.step for p in heard] == [WAITING, CACHED] and found[0].path == path
    assert steps.commands == [], "built although the other process had"
    assert "another dlbench process is building it" in describe(heard[0])


def test_run_prints_a_build_s_steps_and_shows_pip_s_lines_on_its_progress_bar():
    console = Console(file=io.StringIO(), width=300, force_terminal=False)
    with Progress(console=console) as bar:
        task = bar.add_task("starting", total=1)
        events = _ProgressEvents(bar, task)
        start = BuildProgress("torch", "cpu", CREATING, 0.0, "/cache/envs/torch-cpu-1")
        collecting = BuildProgress("torch", "cpu", INSTALLING, 12.0, "/cache/envs/torch-cpu-1",
                                   output="Collecting numpy==2.1.0")
        events.environment("torch", start)
        events.environment("torch", collecting)
        assert "torch (cpu): installing requirements [12 s]: Collecting numpy==2.1.0" in bar.tasks[0].description
        events.environment("torch", BuildProgress("torch", "cpu", BUILT, 183.0, "/cache/envs/torch-cpu-1"))
        events.environment("jax", BuildProgress("jax", "cpu", CACHED, where="/cache/envs/jax-cpu-2"))
    printed = console.file.getvalue()
    assert "torch (cpu): building the environment /cache/envs/torch-cpu-1: creating the venv" in printed
    assert "torch (cpu): environment built in 3 min 3 s: /cache/envs/torch-cpu-1" in printed
    assert "jax (cpu): environment cached, reusing /cache/envs/jax-cpu-2" in printed
    assert "Collecting" not in printed  # pip's lines only pass over the bar


def test_env_create_writes_a_line_per_step_to_stderr_and_the_path_to_stdout(steps, project, tmp_path, monkeypatch):
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))

    def create():
        result = CliRunner().invoke(app, ["env", "create", "fake", "--device", "cpu"], catch_exceptions=False)
        return result.exit_code, result.stdout, ANSI.sub("", result.stderr).splitlines()

    code, out, err = create()
    envs = tmp_path / "cache" / "envs"
    path = next(p for p in envs.glob("fake-cpu-*") if p.is_dir())
    assert code == 0 and out.strip() == f"fake (cpu): {path}"
    assert err[0] == f"fake (cpu): building the environment {path}: creating the venv"
    assert any(ln.startswith("fake (cpu): installing requirements [") for ln in err)
    assert any(ln.endswith(": Collecting numpy==2.1.0") for ln in err)
    assert any(ln.startswith("fake (cpu): environment built in ") for ln in err)
    assert re.fullmatch(rf"environments: built fake \(cpu\) in \d+ s, in {re.escape(str(envs))}", err[-1])

    code, out, err = create()
    assert code == 0 and out.strip() == f"fake (cpu): {path}" and len(steps.commands) == 2
    assert err[0].startswith(f"fake (cpu): environment cached, reusing {path} (built ")
    assert err[1:] == [f"environments: reused from the cache: fake (cpu), in {envs}"]


def test_env_create_that_fails_sums_up_and_exits_1(monkeypatch, project, tmp_path):
    monkeypatch.setenv("DLBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(environments.subprocess, "Popen", FakeSteps(pip_lines=["ERROR: no"], pip_status=1))
    result = CliRunner().invoke(app, ["env", "create", "fake", "--device", "cpu"], catch_exceptions=False)
    err = " ".join(ANSI.sub("", result.stderr).split())
    assert result.exit_code == 1 and "fake (cpu): environment build failed after" in err
    assert "error: could not build the venv environment of fake (cpu); the reasons are above" in err
