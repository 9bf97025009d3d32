"""Run one multi-worker job: start its processes, watch every rank, and end all of it together.

The processes of a job (ProcessSpecs from launch_styles.py: torchrun per host, or one per rank)
each start in a session of their own, output to a log in the job folder. Ranks announce
themselves in the job folder (`rank<R>.started`: pid and host) and leave their result there
(`rank<R>.json`), so the watcher knows every rank whatever started it. While the job runs, every
process seen under a launcher is remembered (psutil), because launchers put their ranks in
sessions of their own (torchrun does) and a killed launcher would orphan them. Every process of
the job also inherits DLBENCH_JOB=<token>, and the teardown looks for that token in the
environment of every process of this machine's user: a process that left its session and lost its
parent between two looks (a daemonised helper, a rank's own child) is found that way too.

The job ends, and everything left is stopped (SIGTERM to every launcher's group and to every
remembered process, then SIGKILL after a grace period), as soon as:
- a rank reports a failure, or a rank of this machine is gone without a result, or a launcher
  exits with a non-zero status: the job failed;
- the timeout passes: the job timed out (a hung rank, a lost peer);
- every rank has a result and every launcher has exited (or failed to exit within a grace period).
Whatever the ending, the job is not over until no remembered process is alive; any that
survived SIGKILL is reported (`left_behind`).

Which rank failed first: a reported failure is dated by the rank's own clock (`finished_at`), a
death by the last time the rank was seen alive (so a rank killed between two looks is dated
before the error its peers report on losing it); deaths found in the same look (the killed rank
and the peer its launcher then stopped) are ordered by the moment each process exited
(`_ExitClock`: a pidfd per local rank). The earliest is the job's reason, with its rank and the
tail of its log.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .interrupts import shielded
from .launch_styles import ProcessSpec
from .launcher import STDERR_TAIL_CHARS, TERMINATE_GRACE_S, read_result_bytes
from .launcher import tagged as tagged_processes
from .rank_result import parse_rank_result, parse_rank_started
from .worker_result import ResultError

PROTOCOL_VERSION = 1  # of the request/result files; must match runners/common/distributed_harness.py
POLL_S = 0.05
EXIT_GRACE_S = 30.0  # after the last result, for the processes to leave their process groups and exit
JOB_VARIABLE = "DLBENCH_JOB"

# Variables that would let the controller's own environment leak into a framework environment.
_ISOLATE = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")


@dataclass
class JobOutcome:
    status: str  # ok | failed | timeout | skipped
    reason: str | None
    results: dict[int, dict]  # rank -> its result (ranks that wrote none are absent)
    failed_rank: int | None
    output_tail: str
    wall_s: float
    left_behind: list[int] = field(default_factory=list)  # pids alive after teardown (should be none)
    # on a shaped link: the bytes each worker sent in rank 0's measured window (wire.py), or why not
    wire_sent: list[float] | None = None
    wire_reason: str | None = None


def _tail(path: Path, chars: int = STDERR_TAIL_CHARS) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_line(text: str) -> str:
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), "")


def _read_rank_file(path: Path, parse) -> dict | None:
    """A rank's file parsed (rank_result.py); None while there is none. A file that is not a
    regular one, too large or malformed raises ResultError (writes are atomic: never half-written)."""
    data = read_result_bytes(path)
    return None if data is None else parse(data)


def _alive(pid: int, created: float) -> bool:
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - created) < 0.01 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class _ExitClock:
    """When each watched process exited, by this machine's wall clock: a thread waits on a pidfd per
    process (os.pidfd_open, Linux 5.3 and later) and dates its exit as it happens. A process that
    cannot be watched so (already gone, no pidfd support) is simply not known here."""

    def __init__(self):
        self.exited: dict[int, float] = {}  # pid -> time.time() of its exit
        self._lock = threading.Lock()
        self._pending: list[tuple[int, int]] = []  # (fd, pid) to register before the next wait
        self._fds: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return
        with self._lock:
            self._pending.append((fd, pid))
        if self._thread is None:
            self._thread = threading.Thread(target=self._wait, name="dlbench-exit-clock", daemon=True)
            self._thread.start()

    def _wait(self) -> None:
        poller = select.poll()
        while not self._stop.is_set():
            with self._lock:  # registered here, between waits, never while another thread polls
                for fd, pid in self._pending:
                    self._fds[fd] = pid
                    poller.register(fd, select.POLLIN)
                self._pending.clear()
            for fd, _ in poller.poll(POLL_S * 1000):
                now = time.time()
                poller.unregister(fd)
                with self._lock:
                    self.exited.setdefault(self._fds.pop(fd), now)
                os.close(fd)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            for fd in [*self._fds, *(fd for fd, _ in self._pending)]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()
            self._pending.clear()


class _Watch:
    """What the watcher knows of a running job."""

    def __init__(self, job_dir: Path, world_size: int, procs: list[subprocess.Popen], request: dict | None = None):
        self.job_dir, self.world, self.procs, self.request = job_dir, world_size, procs, request
        self.malformed: dict[int, tuple[float, str]] = {}  # rank -> (when seen, why) of a file that broke its schema
        self.known: dict[int, float] = {}  # pid -> create time of every process seen in the job
        self.started: dict[int, dict] = {}  # rank -> its .started (pid, host)
        self.results: dict[int, dict] = {}
        self.last_alive: dict[int, float] = {}  # rank -> wall clock when last seen running
        self.deaths: dict[int, float] = {}  # rank -> last seen alive, for ranks gone without a result
        self.exited: dict[int, float] = {}  # rank -> when its process exited (else when found gone), for those
        self.exits = _ExitClock()
        self.hostname = socket.gethostname()

    def remember_tree(self) -> None:
        for p in self.procs:
            try:
                parent = psutil.Process(p.pid)
                family = [parent, *parent.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for q in family:
                with contextlib.suppress(psutil.NoSuchProcess):
                    self.known.setdefault(q.pid, q.create_time())

    def look(self, record_deaths: bool = True) -> None:
        """Read what the ranks wrote and see which are alive; record_deaths=False after the teardown,
        whose own kills are no rank's failure (a server that died first is the reason, not the
        ranks the teardown then stopped)."""
        now = time.time()
        self.remember_tree()
        for rank in range(self.world):
            if rank in self.malformed:
                continue  # its failure is known; the teardown stops it
            try:
                self._read(rank)
            except ResultError as e:
                self.malformed[rank] = (now, f"wrote a malformed file: {e}")
                continue
            info = self.started.get(rank)
            if info is None or rank in self.results or rank in self.deaths or info.get("host") != self.hostname:
                continue  # a rank on another machine is watched through its launcher only
            pid = info["pid"]
            if pid in self.known and _alive(pid, self.known[pid]):
                self.last_alive[rank] = now
            elif record_deaths and not (self.job_dir / f"rank{rank}.json").exists():  # no result just written
                self.deaths[rank] = self.last_alive.get(rank, info.get("started_at") or now)
                self.exited[rank] = self.exits.exited.get(pid, now)

    def _read(self, rank: int) -> None:
        """The rank's announcement and result where they are new, each parsed against its schema."""
        if rank not in self.started:
            info = _read_rank_file(self.job_dir / f"rank{rank}.started", lambda d: parse_rank_started(d, rank))
            if info is not None:
                self.started[rank] = info
                if info["host"] == self.hostname:
                    with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                        self.known.setdefault(info["pid"], psutil.Process(info["pid"]).create_time())
                        self.exits.watch(info["pid"])
        if rank not in self.results:
            res = _read_rank_file(self.job_dir / f"rank{rank}.json",
                                  lambda d: parse_rank_result(d, rank, self.world, self.request))
            if res is not None:
                self.results[rank] = res

    def failures(self) -> list[tuple[float, int, str]]:
        """(when, rank, why) of every rank known to have failed, earliest first. Deaths found in the
        same look share their "last seen alive": the order their processes exited in decides."""
        out = [(float(res.get("finished_at") or time.time()), rank, str(res.get("reason") or "failed"))
               for rank, res in self.results.items() if res.get("status") == "failed"]
        for rank, when in self.deaths.items():
            out.append((when, rank, None))  # worded once its log is read
        out += [(when, rank, why) for rank, (when, why) in self.malformed.items()]
        return sorted(out, key=lambda f: (f[0], self.exited.get(f[1], f[0]) if f[2] is None else f[0]))


def _signal_all(procs: list[subprocess.Popen], known: dict[int, float], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)
    for pid, created in known.items():
        if _alive(pid, created):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def tagged(token: str) -> dict[int, float]:
    """pid -> create time of this machine's processes whose environment carries DLBENCH_JOB=token."""
    return tagged_processes(JOB_VARIABLE, token)


def teardown(procs: list[subprocess.Popen], known: dict[int, float], grace_s: float = TERMINATE_GRACE_S,
             token: str | None = None) -> list[int]:
    """Stop every launcher's process group and every process ever seen in the job (and, with a
    token, every process carrying it); the pids still alive afterwards (none, unless a process
    survives SIGKILL)."""
    if token is not None:
        for pid, created in tagged(token).items():
            known.setdefault(pid, created)
    _signal_all(procs, known, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not any(_alive(pid, c) for pid, c in known.items()) and all(p.returncode is not None for p in procs):
            break
        time.sleep(POLL_S)
    if token is not None:  # a process may have started one more while being stopped
        for pid, created in tagged(token).items():
            known.setdefault(pid, created)
    _signal_all(procs, known, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid, c) for pid, c in known.items()):
        time.sleep(POLL_S)
    return sorted(pid for pid, c in known.items() if _alive(pid, c))


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ else \
            f"killed by signal {-code}"
    return f"exited with status {code}"


def run_job(specs: list[ProcessSpec], command_for, job_dir: Path, world_size: int, timeout_s: float,
            cwd: Path, poll_s: float = POLL_S, exit_grace_s: float = EXIT_GRACE_S,
            request: dict | None = None) -> JobOutcome:
    """`command_for(spec) -> argv`: the local command for a spec (Placement.command_on); `request`,
    what the ranks were asked (its action decides what an ok rank result must hold)."""
    token = f"{job_dir.name}-{os.getpid()}"
    base_env = {k: v for k, v in os.environ.items() if k not in _ISOLATE}
    base_env[JOB_VARIABLE] = token
    procs: list[subprocess.Popen] = []
    logs = [job_dir / f"launcher{i}.log" for i in range(len(specs))]
    started = time.perf_counter()
    watch = _Watch(job_dir, world_size, procs, request)
    status, reason = "ok", None
    try:
        for spec, log in zip(specs, logs):
            with open(log, "wb") as out:
                try:
                    procs.append(subprocess.Popen(command_for(spec), stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=subprocess.STDOUT, env={**base_env, **spec.env,
                                                                                 JOB_VARIABLE: token},
                                                  cwd=cwd, start_new_session=True))
                except OSError as e:
                    status, reason = "failed", f"could not start {spec.label}: {e}"
                    break
        all_results_at = None
        while status == "ok":
            watch.look()
            codes = [p.poll() for p in procs]
            if watch.failures():
                status = "failed"
                break
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                watch.look()  # a rank's result or death may explain the exit
                status = "failed"
                break
            done = len(watch.results) == world_size
            if done and all(c == 0 for c in codes):
                break
            if all(c == 0 for c in codes) and not done:
                watch.look()
                if len(watch.results) < world_size:
                    missing = [r for r in range(world_size) if r not in watch.results]
                    status, reason = "failed", f"the launchers exited without a result from rank(s) {missing}"
                break
            if done:
                all_results_at = all_results_at or time.perf_counter()
                if time.perf_counter() - all_results_at > exit_grace_s:
                    status, reason = "failed", (f"every rank wrote its result but the job's processes did not exit "
                                                f"within {exit_grace_s:g} s")
                    break
            if time.perf_counter() - started > timeout_s:
                status = "timeout"
                break
            time.sleep(poll_s)
        watch.remember_tree()
    except BaseException:  # Ctrl-C, an error here: nothing of the job may outlive the controller
        with shielded():  # nor may another signal cut the teardown short
            watch.remember_tree()
            teardown(procs, watch.known, token=token)
            watch.exits.close()
        raise
    codes = [p.poll() for p in procs]
    left = teardown(procs, watch.known, token=token)
    wall = time.perf_counter() - started
    watch.look(record_deaths=False)  # results written just before the end; no deaths: the teardown's
    watch.exits.close()
    results = dict(watch.results)
    failed_rank, tail = None, ""
    if status == "timeout":
        waiting = [r for r in range(world_size) if r not in results]
        reason = (f"job exceeded its timeout of {timeout_s:g} s and was stopped; "
                  f"rank(s) {waiting} had not finished" if waiting else
                  f"job exceeded its timeout of {timeout_s:g} s and was stopped")
        tail = _job_tail(job_dir, waiting[0] if waiting else None, logs, _ranks_summary(watch))
    elif status == "failed" and reason is None:
        failures = watch.failures()
        if failures:
            _, failed_rank, why = failures[0]
            rank_log = _tail(job_dir / f"rank{failed_rank}.log")
            if why is None:
                last = _last_line(rank_log)
                why = "died without a result" + (f": {last}" if last else "")
            host = (watch.started.get(failed_rank) or {}).get("host", "?")
            reason = f"rank {failed_rank} (of {world_size}, on {host}) failed: {why}"
        else:
            i, code = next(((i, c) for i, c in enumerate(codes) if c not in (None, 0)), (0, None))
            last = _last_line(_tail(logs[i])) if i < len(logs) else ""
            label = specs[i].label if i < len(specs) else "launcher"
            reason = f"{label} {_describe_exit(code) if code is not None else 'failed'}" + (f": {last}" if last else "")
        tail = _job_tail(job_dir, failed_rank, logs, _ranks_summary(watch))
    elif status == "ok":
        statuses = {res.get("status") for res in results.values()}
        if statuses == {"skipped"}:
            status, reason = "skipped", str(results[0].get("reason") if 0 in results else "skipped")
        elif statuses != {"ok"}:
            status, reason = "failed", f"ranks disagree: statuses {sorted(map(str, statuses))}"
    if left:
        reason = (reason + "; " if reason else "") + f"processes {left} survived SIGKILL"
        status = "failed" if status == "ok" else status
    return JobOutcome(status, reason, results, failed_rank, tail, wall, left)


def _ranks_summary(watch: "_Watch") -> str:
    """One line per rank: how it ended, as far as the watcher knows."""
    lines = []
    for rank in range(watch.world):
        res, info = watch.results.get(rank), watch.started.get(rank)
        where = f" on {info.get('host')} (pid {info.get('pid')})" if info else ""
        if res is not None:
            state = str(res.get("status")) + (f": {res.get('reason')}" if res.get("reason") else "")
        elif rank in watch.deaths:
            state = "died without a result"
        else:
            state = "no result (stopped with the job)" if info else "never started"
        lines.append(f"rank {rank}{where}: {state}")
    return "\n".join(lines)


def _job_tail(job_dir: Path, rank: int | None, logs: list[Path], ranks: str = "") -> str:
    """Each rank's ending, the failing rank's log, then the launchers', within the record's tail budget."""
    parts = [("ranks", ranks[:STDERR_TAIL_CHARS // 4])] if ranks else []
    if rank is not None:
        parts.append((f"rank{rank}.log", _tail(job_dir / f"rank{rank}.log", STDERR_TAIL_CHARS // 2)))
    share = STDERR_TAIL_CHARS // (2 * max(1, len(logs)))
    parts += [(log.name, _tail(log, share)) for log in logs]
    return "\n".join(f"--- {name} ---\n{text.rstrip()}" for name, text in parts if text.strip())
