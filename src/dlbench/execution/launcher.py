"""Start one worker process, hand it a request, and get its result back whatever happens to it.

The worker is started by path with its environment's interpreter, in a new session (its own process
group), so that a timeout, an error in the controller or Ctrl-C ends the worker *and* anything it
started. The request and the result travel as JSON files in a private temporary directory; the
worker writes its result atomically, so a result is either whole or absent. Output (stdout and
stderr together) goes to a file, whose tail is kept for the record: no pipe can fill and block.

With a container (the docker backend, containers.py) the process started is the `docker run`
client, the temporary directory is mounted into the container, the sampler follows the container's
process, and every way of stopping the worker also stops the container by its name: killing the
client alone would leave it running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .containers import ContainerSpec

PROTOCOL_VERSION = 1  # of the request/result files; must match runners/common/harness.py
STDERR_TAIL_CHARS = 4000
TERMINATE_GRACE_S = 3.0

# Variables that would let the controller's own environment leak into a framework environment.
_ISOLATE = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")


@dataclass
class WorkerOutcome:
    status: str  # ok | failed | timeout | skipped
    reason: str | None
    result: dict | None
    output_tail: str
    returncode: int | None
    wall_s: float


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the worker's process group, then SIGKILL whatever is left after a grace period."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the leader exited; children may remain
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _stop_worker(proc: subprocess.Popen, container: ContainerSpec | None, name: str | None) -> None:
    if container is not None and name is not None:
        container.stop(name)  # even if the client is gone: the container outlives it; then the client exits
    _stop_group(proc)


@contextlib.contextmanager
def killer(proc: subprocess.Popen, container: ContainerSpec | None = None, name: str | None = None):
    """End the worker's whole process group (and its container) on any exception, KeyboardInterrupt included."""
    try:
        yield proc
    except BaseException:
        _stop_worker(proc, container, name)
        raise


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - STDERR_TAIL_CHARS))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _describe_exit(returncode: int, tail: str) -> str:
    if returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGKILL:
            return f"worker killed by {name} (most often the kernel's out-of-memory killer)"
        return f"worker killed by signal {name}"
    last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
    if "MemoryError" in last or "out of memory" in last.lower():
        return f"out of memory: {last.strip()}"
    return f"worker exited with status {returncode} without a result" + (f": {last.strip()}" if last else "")


class Monitor(Protocol):
    """Runs beside a worker (the telemetry sampler): entered before the worker starts, so it is
    ready before the worker's measured window can open, told the worker's pid, left after it ends."""

    def __enter__(self): ...
    def __exit__(self, *exc_info): ...
    def watch(self, pid: int) -> None: ...


def run_worker(python: Path, worker: Path, request: dict, timeout_s: float,
               extra_env: dict[str, str] | None = None, monitor: Monitor | None = None,
               container: ContainerSpec | None = None, shared_dirs: tuple[Path, ...] = ()) -> WorkerOutcome:
    """shared_dirs: folders named in the request that the worker reads or writes (mounted into a container)."""
    worker = Path(worker).resolve()  # the worker runs in its own folder
    env = {k: v for k, v in os.environ.items() if k not in _ISOLATE}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory(prefix="dlbench-worker-") as tmp:
        req_path, res_path, out_path = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "output.log")
        req_path.write_text(json.dumps(request))
        argv = [str(python), str(worker), str(req_path), str(res_path)]
        name = None
        if container is not None:
            name = container.new_name()
            argv = container.run_command(name, python, worker, argv[2:], Path(tmp),
                                         {"PYTHONUNBUFFERED": "1", **(extra_env or {})}, tuple(shared_dirs))
        with monitor or contextlib.nullcontext(), open(out_path, "wb") as out:
            started = time.perf_counter()
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, cwd=worker.parent, start_new_session=True)
            except OSError as e:  # no interpreter (a broken environment), not executable, ...
                return WorkerOutcome("failed", f"could not start the worker with {argv[0]}: {e}", None, "", None,
                                     time.perf_counter() - started)
            with killer(proc, container, name):
                if monitor is not None:
                    pid = container.worker_pid(name, proc) if container is not None else proc.pid
                    if pid is not None:
                        monitor.watch(pid)
                try:
                    returncode: int | None = proc.wait(timeout=max(0.0, timeout_s - (time.perf_counter() - started)))
                except subprocess.TimeoutExpired:
                    _stop_worker(proc, container, name)
                    returncode = None
                else:
                    _stop_group(proc)  # nothing the worker started outlives it
        wall = time.perf_counter() - started
        tail = _tail(out_path)
        if returncode is None:
            return WorkerOutcome("timeout", f"worker exceeded its timeout of {timeout_s:g} s and was killed",
                                 None, tail, None, wall)
        engine_failure = None
        if container is not None:
            returncode, engine_failure = container.describe_exit(returncode)
        result = None
        if res_path.is_file():
            try:
                result = json.loads(res_path.read_text())
            except json.JSONDecodeError as e:
                return WorkerOutcome("failed", f"worker wrote an unreadable result: {e}", None, tail, returncode, wall)
        if result is None:
            if engine_failure:
                last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
                return WorkerOutcome("failed", f"{engine_failure}: {last.strip()}" if last else engine_failure,
                                     None, tail, returncode, wall)
            return WorkerOutcome("failed", _describe_exit(returncode, tail), None, tail, returncode, wall)
        status = result.get("status", "failed")
        if status not in ("ok", "failed", "skipped"):
            status, result["reason"] = "failed", f"worker reported unknown status {status!r}"
        return WorkerOutcome(status, result.get("reason"), result, tail, returncode, wall)


def thread_env(threads: int | None) -> dict[str, str]:
    # Set before the interpreter starts: OpenMP pools size themselves at load time.
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
