"""Start one worker process, hand it a request, and get its result back whatever happens to it.

The worker is started by path with its environment's interpreter, in a new session (its own process
group), so that a timeout, an error in the controller or Ctrl-C ends the worker *and* anything it
started. The request and the result travel as JSON files in a private temporary directory; the
worker writes its result atomically, so a result is either whole or absent. Output (stdout and
stderr together) goes to a file, whose tail is kept for the record: no pipe can fill and block;
a worker that writes more than OUTPUT_LIMIT_BYTES is stopped. The result is read only if it is a
regular file within RESULT_LIMIT_BYTES and is validated (worker_result.py) before anything else
sees it: a malformed one is a `failed` outcome naming the field. Each worker's environment carries
a token (WORKER_VARIABLE) by which the processes that left its process group are found and ended.

With a container (the docker backend, containers.py) the process started is the `docker run`
client, the temporary directory is mounted into the container, the sampler follows the container's
process, and every way of stopping the worker also stops the container by its name: killing the
client alone would leave it running.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil

from .interrupts import shielded, temporary_folder
from .worker_result import PROTOCOL_VERSION, ResultError, parse_result

if TYPE_CHECKING:
    from .containers import ContainerSpec

STDERR_TAIL_CHARS = 4000
TERMINATE_GRACE_S = 3.0
RESULT_LIMIT_BYTES = 64 * 2**20  # a result file larger than this is refused unread
OUTPUT_LIMIT_BYTES = 256 * 2**20  # a worker that prints more (stdout and stderr) is stopped
POLL_S = 0.2  # how often the output's size is looked at while the worker runs
WORKER_VARIABLE = "DLBENCH_WORKER"  # carries a token per worker: finds what escaped its process group

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


def _stop_worker(proc: subprocess.Popen, container: ContainerSpec | None, name: str | None,
                 token: str | None = None) -> None:
    """Stop the container (by name), the worker's process group, and whatever carries its token;
    not to be cut short by a signal (interrupts.shielded)."""
    with shielded():
        if container is not None and name is not None:
            container.stop(name)  # even if the client is gone: the container outlives it; then the client exits
        _stop_group(proc)
        if token is not None:
            _kill_tagged(token)


def tagged(variable: str, token: str) -> dict[int, float]:
    """pid -> create time of this machine's processes whose environment carries variable=token
    (a worker's or a job's descendants, also those that left its process group with setsid)."""
    found = {}
    me = os.getpid()
    for p in psutil.process_iter(["pid", "create_time"]):
        if p.info["pid"] == me:
            continue
        try:
            if p.environ().get(variable) == token:
                found[p.info["pid"]] = p.info["create_time"]
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return found


def _kill_tagged(token: str) -> None:
    for pid, created in tagged(WORKER_VARIABLE, token).items():
        with contextlib.suppress(psutil.Error, OSError):
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.01:
                p.kill()


@contextlib.contextmanager
def killer(proc: subprocess.Popen, container: ContainerSpec | None = None, name: str | None = None,
           token: str | None = None):
    """End the worker's whole process group (and its container) on any exception, KeyboardInterrupt included."""
    try:
        yield proc
    except BaseException:
        _stop_worker(proc, container, name, token)
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
    token = secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k not in _ISOLATE}
    env["PYTHONUNBUFFERED"] = "1"
    env[WORKER_VARIABLE] = token
    env.update(extra_env or {})
    with temporary_folder("dlbench-worker-") as tmp:  # one worker's, removed whatever ends the run
        req_path, res_path, out_path = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "output.log")
        req_path.write_text(json.dumps(request))
        argv = [str(python), str(worker), str(req_path), str(res_path)]
        name = None
        if container is not None:
            name = container.new_name()
            argv = container.run_command(name, python, worker, argv[2:], Path(tmp),
                                         {"PYTHONUNBUFFERED": "1", **(extra_env or {})}, tuple(shared_dirs))
        flooded = False
        with monitor or contextlib.nullcontext(), open(out_path, "wb") as out:
            started = time.perf_counter()
            born_ns = time.monotonic_ns()
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        env=env, cwd=worker.parent, start_new_session=True)
            except OSError as e:  # no interpreter (a broken environment), not executable, ...
                return WorkerOutcome("failed", f"could not start the worker with {argv[0]}: {e}", None, "", None,
                                     time.perf_counter() - started)
            with killer(proc, container, name, token):
                if monitor is not None:
                    pid = container.worker_pid(name, proc) if container is not None else proc.pid
                    if pid is not None:
                        monitor.watch(pid)
                returncode, flooded = _wait(proc, out, timeout_s - (time.perf_counter() - started))
                if returncode is None:  # its time is up, or it floods: stop it, container and all
                    _stop_worker(proc, container, name, token)
                else:  # nothing the worker started outlives it
                    _stop_worker(proc, None, None, token)
            ended_ns = time.monotonic_ns()
        wall = time.perf_counter() - started
        tail = _tail(out_path)
        if flooded:
            return WorkerOutcome("failed", f"worker wrote more than {OUTPUT_LIMIT_BYTES // 2**20} MiB of output "
                                 "(stdout and stderr) and was stopped", None, tail, None, wall)
        if returncode is None:
            return WorkerOutcome("timeout", f"worker exceeded its timeout of {timeout_s:g} s and was killed",
                                 None, tail, None, wall)
        engine_failure = None
        if container is not None and name is not None:  # read the finished container, then remove it
            reading = container.finish(name, returncode)
            returncode, engine_failure = reading.returncode, reading.engine_failure
        try:
            raw = read_result_bytes(res_path)
        except ResultError as e:
            return WorkerOutcome("failed", str(e), None, tail, returncode, wall)
        if raw is None:
            if engine_failure:
                last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
                return WorkerOutcome("failed", f"{engine_failure}: {last.strip()}" if last else engine_failure,
                                     None, tail, returncode, wall)
            return WorkerOutcome("failed", _describe_exit(returncode, tail), None, tail, returncode, wall)
        try:
            # a container shares the host's monotonic clock only where its kernel is the host's
            lifetime = (born_ns, ended_ns) if container is None else None
            parsed = parse_result(raw, request.get("action", "benchmark"), lifetime, request.get("mode"))
        except ResultError as e:
            return WorkerOutcome("failed", str(e), None, tail, returncode, wall)
        # the validated fields only, as the worker gave them (nothing downstream reads the raw JSON)
        result = parsed.model_dump(exclude_unset=True)
        return WorkerOutcome(parsed.status, parsed.reason, result, tail, returncode, wall)


def _wait(proc: subprocess.Popen, out, timeout_s: float) -> tuple[int | None, bool]:
    """(exit status, or None after the timeout; whether the output outgrew OUTPUT_LIMIT_BYTES)."""
    deadline = time.perf_counter() + max(0.0, timeout_s)
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(POLL_S, deadline - time.perf_counter()))), False
        except subprocess.TimeoutExpired:
            pass
        if os.fstat(out.fileno()).st_size > OUTPUT_LIMIT_BYTES:
            return None, True
        if time.perf_counter() >= deadline:
            return None, False


def read_result_bytes(path: Path) -> bytes | None:
    """The result file's bytes; None when there is none. Only a regular file of at most
    RESULT_LIMIT_BYTES is read (not a link, FIFO or device the worker left in its place)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ResultError("result", f"cannot be opened ({e.strerror}: a link or something else that is "
                                    "not a file)") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ResultError("result", "is not a regular file")
        if info.st_size > RESULT_LIMIT_BYTES:
            raise ResultError("result", f"{info.st_size} bytes, more than the {RESULT_LIMIT_BYTES // 2**20} MiB "
                                        "a result may have")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(RESULT_LIMIT_BYTES + 1)
    except OSError as e:
        raise ResultError("result", f"cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > RESULT_LIMIT_BYTES:
        raise ResultError("result", f"more than the {RESULT_LIMIT_BYTES // 2**20} MiB a result may have")
    return data


def thread_env(threads: int | None) -> dict[str, str]:
    # Set before the interpreter starts: OpenMP pools size themselves at load time.
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
