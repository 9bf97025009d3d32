"""Ctrl-C, SIGTERM and SIGHUP during `dlbench run`: the worker and everything it started are
stopped, the command says so in one line and exits 128 + the signal, no temporary folder is left,
and the store holds no record of the interrupted run (and nothing half-written)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlbench.execution.interrupts import Interrupted, deliver_signals, exit_status, shielded

ROOT = Path(__file__).resolve().parents[2]


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "runners").mkdir(parents=True)
    (root / "suites").symlink_to(ROOT / "suites")
    (root / "reports").symlink_to(ROOT / "reports")
    (root / "runners" / "fake").symlink_to(ROOT / "tests" / "fixtures" / "runners" / "fake")
    return root


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_stops_workers_and_leaves_no_partial_record(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    store = tmp_path / "store"
    env = dict(os.environ, DLBENCH_ROOT=str(_project(tmp_path)), DLBENCH_FAKE_BEHAVIOUR="hang_with_child",
               DLBENCH_FAKE_PIDFILE=str(pidfile), DLBENCH_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlbench.cli", "run", "--no-check", "--suite", "fcn", "--framework", "fake", "--profile", "smoke",
         "--device", "cpu", "--env", "current", "--store", str(store), "--timeout", "600"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(pidfile.exists, 30), "the fake worker never started"
        time.sleep(0.2)  # the pid is written before the worker settles into its hang
        grandchild = int(pidfile.read_text())
        assert psutil.pid_exists(grandchild)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr

    def gone() -> bool:
        try:
            return psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    assert _wait_for(gone, 10), "the worker's child outlived Ctrl-C"
    for folder in ("runs", ".incoming"):
        left = list((store / folder).glob("*")) if (store / folder).exists() else []
        assert left == [], f"{folder} holds {left}"


# --- SIGTERM, SIGHUP and a repeated Ctrl-C (issue 18, class 3) ---------------------------------

def _faulty_project(tmp_path: Path) -> Path:
    root = _project(tmp_path)
    (root / "runners" / "faulty").symlink_to(ROOT / "tests" / "fixtures" / "runners" / "faulty")
    return root


def _family(pid: int) -> dict[int, float]:
    """pid -> create time of `pid` and every process below it."""
    me = psutil.Process(pid)
    out = {pid: me.create_time()}
    for p in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            out[p.pid] = p.create_time()
    return out


def _survivors(processes: dict[int, float]) -> list[int]:
    left = []
    for pid, created in processes.items():
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.parametrize("signals, fault", [
    ((signal.SIGTERM,), "hang_with_child"),
    ((signal.SIGHUP,), "hang_with_child"),
    # Ctrl-C twice, to the terminal's process group, while the worker (and its child) sit out the
    # SIGTERM grace period: the second must not cut the clean-up short
    ((signal.SIGINT, signal.SIGINT), "stubborn_with_child"),
], ids=["SIGTERM", "SIGHUP", "SIGINT-twice"])
def test_signals_stop_everything_and_leave_nothing(tmp_path, signals, fault):
    pidfile, store, tmp = tmp_path / "pids", tmp_path / "store", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, DLBENCH_ROOT=str(_faulty_project(tmp_path)), DLBENCH_FAULT=fault,
               DLBENCH_FAULT_PIDFILE=str(pidfile), DLBENCH_CACHE=str(tmp_path / "cache"), TMPDIR=str(tmp))
    env.pop("DLBENCH_FAULTS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlbench.cli", "run", "--no-check", "--suite", "fcn", "--framework", "faulty", "--profile", "smoke",
         "--device", "cpu", "--env", "current", "--store", str(store), "--timeout", "600"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2, 60), \
            "the faulty worker never started its child"
        processes = _family(proc.pid)  # the controller, its sampler, the worker and the worker's child
        worker, child = (int(p) for p in pidfile.read_text().split())
        assert {worker, child} <= set(processes) and len(processes) >= 4, processes
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.5)
            if sig == signal.SIGINT:
                os.killpg(proc.pid, sig)  # what Ctrl-C does: the whole foreground group
            else:
                proc.send_signal(sig)  # what `kill` does
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signals[0], stderr
    said = [line for line in stderr.splitlines() if "interrupted" in line]
    assert len(said) == 1 and signal.Signals(signals[0]).name in said[0], stderr
    assert "Traceback" not in stderr, stderr
    assert _wait_for(lambda: not _survivors(processes), 10), f"survivors: {_survivors(processes)}"
    assert list(tmp.iterdir()) == [], "temporary files left behind"
    left = list((store / "runs").glob("*")) if (store / "runs").exists() else []
    assert left == [], "the interrupted run was recorded"


# --- the handler itself (execution/interrupts.py), in this process ------------------------------

def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.2)  # the handler runs between two bytecodes of this thread, well within this


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_signal_is_an_interrupt_with_its_exit_status(sig):
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as caught:
        with deliver_signals():
            _signal_self(sig)
    assert isinstance(caught.value, KeyboardInterrupt)  # every `except BaseException` clean-up runs
    assert caught.value.signum == sig and exit_status(caught.value) == 128 + sig
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_a_repeated_signal_does_not_cut_the_clean_up_short():
    cleaned = []
    with pytest.raises(Interrupted):
        with deliver_signals():
            try:
                _signal_self(signal.SIGINT)
            finally:
                _signal_self(signal.SIGINT)  # the second Ctrl-C, in the middle of the clean-up
                cleaned.append("all of it")
    assert cleaned == ["all of it"]


def test_a_shielded_section_finishes_before_the_interrupt():
    done = []
    with pytest.raises(Interrupted) as caught:
        with deliver_signals():
            with shielded():
                _signal_self(signal.SIGTERM)
                done.append("after the signal")
            done.append("never")
    assert done == ["after the signal"] and caught.value.signum == signal.SIGTERM


# --- every command that starts workers, not only `dlbench run` (issue 18) ----------------------

@pytest.mark.parametrize("command", [
    ["check", "--network", "transformer_tiny", "--precision", "float64"],
    ["calibrate"],
    ["run", "--suite", "kernels", "--profile", "smoke"],
], ids=["check", "calibrate", "run-kernels"])
def test_commands_that_start_workers_stop_them_on_sigterm(tmp_path, command):
    pidfile, store, tmp = tmp_path / "pids", tmp_path / "store", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, DLBENCH_ROOT=str(_faulty_project(tmp_path)), DLBENCH_FAULT="hang_with_child",
               DLBENCH_FAULT_PIDFILE=str(pidfile), DLBENCH_CACHE=str(tmp_path / "cache"), TMPDIR=str(tmp))
    env.pop("DLBENCH_FAULTS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlbench.cli", *command, "--framework", "faulty", "--device", "cpu",
         "--env", "current", "--store", str(store)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert _wait_for(lambda: pidfile.exists() and len(pidfile.read_text().split()) == 2, 60), \
            "the faulty worker never started its child"
        processes = _family(proc.pid)
        worker, child = (int(p) for p in pidfile.read_text().split())
        assert {worker, child} <= set(processes), processes
        assert list(tmp.iterdir()), "the command made no temporary folder to remove"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 143, stderr
    said = [line for line in stderr.splitlines() if "interrupted" in line]
    assert len(said) == 1 and "SIGTERM" in said[0], stderr
    assert "Traceback" not in stderr, stderr
    assert _wait_for(lambda: not _survivors(processes), 10), f"survivors: {_survivors(processes)}"
    assert list(tmp.iterdir()) == [], "temporary files left behind"


def test_an_interrupted_environment_build_stops_its_step_and_removes_the_half_built_folder(tmp_path, monkeypatch):
    """`dlbench env create` (and the builds of run and check): an interrupt while pip runs ends pip's
    session and leaves no half-built environment (a fake step: a process that prints, then sleeps)."""
    from types import SimpleNamespace

    from dlbench.execution import environments

    requirements = tmp_path / "requirements-cpu.txt"
    requirements.write_text("nothing==1\n")
    runner = SimpleNamespace(name="fake", requirements_for=lambda flavour: requirements)
    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def step(cmd, **kwargs):  # every build step: make the folder, print a line, then hang
        Path(cmd[-1] if cmd[1:3] == ["-m", "venv"] else tmp_path).mkdir(parents=True, exist_ok=True)
        started.append(real_popen([sys.executable, "-c", "import time; print('Collecting', flush=True); "
                                   "time.sleep(60)"], **kwargs))
        return started[-1]

    def interrupt(progress):  # the signal comes while the step runs: when its first line is reported
        if progress.output is not None:
            raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(environments.subprocess, "Popen", step)
    backend = environments.VenvBackend(tmp_path / "cache")
    with pytest.raises(Interrupted):
        backend.ensure(runner, "cpu", interrupt)
    assert started and started[0].poll() is not None, "the build step outlived the interrupt"
    assert not backend.path_for(runner, "cpu").exists(), "a half-built environment was left"
