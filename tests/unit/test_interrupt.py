"""Ctrl-C during `dlbench run`: the worker and everything it started are stopped, the command exits
130, and the store holds no record of the interrupted run (and nothing half-written)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

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
        [sys.executable, "-m", "dlbench.cli", "run", "--suite", "fcn", "--framework", "fake", "--profile", "smoke",
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
