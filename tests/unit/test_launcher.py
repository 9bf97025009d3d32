"""run_worker() with the fake worker: every way a worker can end, containment, and the environment."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlbench.definitions.catalog import SuiteCatalog
from dlbench.execution import launcher
from dlbench.execution.launcher import killer, run_worker
from dlbench.execution.orchestrator import PlannedRun, RunOptions, build_request
from dlbench.execution.registry import RunnerRegistry

ROOT = Path(__file__).resolve().parents[2]
PYTHON = Path(sys.executable)


@pytest.fixture(scope="module")
def fake():
    return RunnerRegistry(ROOT / "tests" / "fixtures" / "runners").get("fake")


@pytest.fixture(scope="module")
def req(fake):
    suite = SuiteCatalog(ROOT / "suites").load_suite(ROOT / "suites" / "fcn.yaml", "smoke", "cpu")
    b = suite.benchmarks[0]
    return build_request(PlannedRun(fake, b, b.batch_sizes[0]),
                         RunOptions(device="cpu", env_backend="current", threads=1, repeats=None,
                                    timeout_s=30, cache=ROOT / ".no-cache"))


@pytest.fixture(autouse=True)
def fast(monkeypatch):
    monkeypatch.setenv("DLBENCH_FAKE_STEP_S", "0.0005")
    monkeypatch.delenv("DLBENCH_FAKE_BEHAVIOUR", raising=False)


def behave(monkeypatch, b):
    monkeypatch.setenv("DLBENCH_FAKE_BEHAVIOUR", b)


def alive(pid: int, created: float | None = None) -> bool:
    """Running (zombies count as dead; a reused pid with another start time counts as dead)."""
    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - created) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(pid: int, created: float | None = None, within: float = 3.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not alive(pid, created):
            return True
        time.sleep(0.02)
    return not alive(pid, created)


def test_ok(monkeypatch, fake, req):
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "ok" and o.reason is None and o.returncode == 0
    assert o.result["status"] == "ok"
    assert o.result["params"] == req["network"]["params"]
    assert len(o.result["iter_s"]) >= req["policy"]["measure"]["min_iters"]
    assert o.result["framework"]["name"] == "fake"
    assert o.wall_s > 0


def test_raise_is_failed_with_reason_and_traceback(monkeypatch, fake, req):
    behave(monkeypatch, "raise")
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "failed"
    assert o.reason == "RuntimeError: fake failure while building the network"
    assert "Traceback" in o.result["traceback"]


def test_memory_error_is_out_of_memory(monkeypatch, fake, req):
    behave(monkeypatch, "memory")
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "failed"
    assert o.reason.startswith("out of memory") and "MemoryError" in o.reason


def test_exit_without_result_names_status_and_stderr_line(monkeypatch, fake, req):
    behave(monkeypatch, "exit")
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "failed" and o.result is None and o.returncode == 3
    assert "status 3" in o.reason
    assert "fake worker is exiting abruptly" in o.reason
    assert "fake worker is exiting abruptly" in o.output_tail


def test_sigkill_mentions_out_of_memory_killer(monkeypatch, fake, req):
    behave(monkeypatch, "sigkill")
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "failed" and o.returncode == -9
    assert "SIGKILL" in o.reason and "out-of-memory killer" in o.reason


def test_skip(monkeypatch, fake, req):
    behave(monkeypatch, "skip")
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "skipped" and o.reason == "fake runner skips on request"


def test_skip_on_unavailable_device(fake, req):
    o = run_worker(PYTHON, fake.worker, dict(req, device="cuda"), 30)
    assert o.status == "skipped" and "no GPU" in o.reason


def test_unreadable_result(monkeypatch, fake, req):
    behave(monkeypatch, "garbage")
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "failed" and o.result is None
    assert o.reason.startswith("worker result: not valid JSON")


def test_protocol_mismatch_is_failed(fake, req):
    o = run_worker(PYTHON, fake.worker, dict(req, protocol=999), 30)
    assert o.status == "failed" and o.returncode == 2
    assert "protocol 999 not understood" in o.reason


def test_hang_is_timeout_and_timeout_is_honoured(monkeypatch, fake, req):
    behave(monkeypatch, "hang")
    t0 = time.monotonic()
    o = run_worker(PYTHON, fake.worker, req, 1.5)
    elapsed = time.monotonic() - t0
    assert o.status == "timeout" and o.result is None and o.returncode is None
    assert "1.5 s" in o.reason
    assert 1.5 <= elapsed < 1.5 + 3.0  # SIGTERM ends a sleeping worker at once; no grace period spent


def test_hang_with_child_leaves_no_process_behind(monkeypatch, tmp_path, fake, req):
    pidfile = tmp_path / "child.pid"
    behave(monkeypatch, "hang_with_child")
    monkeypatch.setenv("DLBENCH_FAKE_PIDFILE", str(pidfile))
    t0 = time.monotonic()
    o = run_worker(PYTHON, fake.worker, req, 3.0)  # time enough to start its child, even on a busy machine
    assert time.monotonic() - t0 < 3.0 + 3.0 + 1.0
    assert o.status == "timeout"
    pid = int(pidfile.read_text())
    assert wait_dead(pid), f"grandchild {pid} outlived its worker"


def test_exited_worker_child_is_also_ended(tmp_path, fake):
    """A worker that exits normally but leaves a child behind: the child is ended too."""
    script = tmp_path / "worker.py"
    pidfile = tmp_path / "orphan.pid"
    script.write_text(
        "import json, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "json.dump({'status': 'skipped', 'reason': 'nothing to do'}, open(sys.argv[2], 'w'))\n"
    )
    o = run_worker(PYTHON, script, {"protocol": 1}, 30)
    assert o.status == "skipped"
    assert wait_dead(int(pidfile.read_text()))


def test_killer_ends_child_on_keyboard_interrupt():
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "print(p.pid, flush=True)\n"
         "time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        grandchild = int(proc.stdout.readline())
        created = psutil.Process(grandchild).create_time()
        assert alive(proc.pid) and alive(grandchild, created)
        with pytest.raises(KeyboardInterrupt):
            with killer(proc):
                raise KeyboardInterrupt
        assert proc.poll() is not None, "the worker survived Ctrl-C in the controller"
        assert wait_dead(grandchild, created), "the worker's child survived Ctrl-C in the controller"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def test_killer_leaves_child_alone_without_exception():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        with killer(proc):
            pass
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_controller_python_environment_is_not_passed(monkeypatch, tmp_path, fake, req):
    captured = {}
    real_popen = subprocess.Popen

    def spy(*args, **kwargs):
        captured.update(kwargs.get("env") or {})
        captured["__given__"] = "env" in kwargs
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(launcher.subprocess, "Popen", spy)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "leak"))
    monkeypatch.setenv("PYTHONSTARTUP", str(tmp_path / "leak.py"))
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
    monkeypatch.setenv("DLBENCH_KEEP_ME", "1")
    o = run_worker(PYTHON, fake.worker, req, 30, extra_env={"OMP_NUM_THREADS": "3"})
    assert o.status == "ok"
    assert captured["__given__"] is True
    for k in ("PYTHONPATH", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONHOME"):
        assert k not in captured
    assert captured["DLBENCH_KEEP_ME"] == "1"
    assert captured["OMP_NUM_THREADS"] == "3"
    assert captured["PYTHONUNBUFFERED"] == "1"


def _sitecustomize(dir_: Path, marker: Path) -> None:
    dir_.mkdir()
    (dir_ / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('leaked')\n")


def test_pythonpath_does_not_reach_the_worker_process(monkeypatch, tmp_path, fake, req):
    leak, marker = tmp_path / "leak", tmp_path / "leaked.txt"
    _sitecustomize(leak, marker)
    monkeypatch.setenv("PYTHONPATH", str(leak))
    # control: a process that does get this PYTHONPATH runs the sitecustomize
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert marker.exists()
    marker.unlink()
    o = run_worker(PYTHON, fake.worker, req, 30)
    assert o.status == "ok"
    assert not marker.exists(), "the controller's PYTHONPATH reached the worker"


def test_missing_interpreter_is_failed_not_raised(tmp_path, fake, req):
    o = run_worker(tmp_path / "no" / "python", fake.worker, req, 30)
    assert o.status == "failed" and o.result is None and o.returncode is None
    assert "could not start the worker" in o.reason and str(tmp_path / "no" / "python") in o.reason
