"""The telemetry sampler: a process of its own that samples GPUs, CPU and RAPL on a fixed schedule.

A separate process, so that sampling neither waits on the controller's interpreter nor adds to the
worker's; started with 'spawn', so it begins clean (no copied threads or locks) and imports the NVML
binding by name. That name (`nvml_module`) is how tests substitute a scripted binding: the child
must be able to import it, and spawn gives the child the parent's sys.path and environment.

One pipe carries the protocol. Child -> ("ready", None) once NVML is initialised and the first
sample is taken; parent -> ("watch", pid) to follow a worker started after the sampler (so that
sampling is already running when the worker's measured window opens); parent -> "stop"; child -> ("result", dict) after one last sample (so the sampled
span reaches the moment of stopping). Either side may instead meet ("error", traceback) or the
end of the pipe; the parent then records why telemetry is missing, and never raises for it.

The result is columnar: one timestamp column `t_ns` on time.monotonic_ns (the clock the worker
marks its measured window with, runners/common/harness.py) and, per source, a dict of columns as
long as `t_ns`, None where a value is missing.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .host import HostTelemetry
from .nvml import GpuTelemetry
from .rapl import POWERCAP_ROOT, RaplTelemetry

MIN_INTERVAL_S = 0.01
MAX_INTERVAL_S = 1.0
READY_TIMEOUT_S = 30.0  # NVML's initialisation alone can take seconds per GPU without persistence mode
STOP_TIMEOUT_S = 5.0
JOIN_TIMEOUT_S = 2.0
CLOCK = "time.monotonic_ns"


@dataclass(frozen=True)
class TelemetryConfig:
    interval_s: float = 0.1
    # None: every GPU NVML sees (meant for cuda runs); (): no GPU at all (cpu runs never touch NVML)
    gpu_indices: tuple[int, ...] | None = None

    def __post_init__(self):
        interval = self.interval_s
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
                or not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
            raise ValueError(f"telemetry interval_s must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} s, "
                             f"got {interval!r}")
        if self.gpu_indices is not None:
            indices = tuple(self.gpu_indices)
            if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in indices) \
                    or len(set(indices)) != len(indices):
                raise ValueError(f"gpu_indices must be distinct non-negative integers, got {self.gpu_indices!r}")
            object.__setattr__(self, "gpu_indices", indices)


class Collector:
    """Every source, sampled together at one timestamp per sample."""

    def __init__(self, config: TelemetryConfig, pid: int | None = None, nvml_module: str = "pynvml",
                 powercap_root: Path | str = POWERCAP_ROOT, clock: Callable[[], int] = time.monotonic_ns):
        self.config = config
        self._clock = clock
        self.t_ns: list[int] = []
        self.gpu = GpuTelemetry(nvml_module, config.gpu_indices)
        self.host = HostTelemetry(pid)
        self.rapl = RaplTelemetry(Path(powercap_root))

    def sample(self) -> None:
        t = self._clock()
        rows_before = len(self.t_ns)
        self.t_ns.append(t)
        self.gpu.sample(t, rows_before)
        self.host.sample(t)
        self.rapl.sample()

    def result(self) -> dict:
        return {
            "interval_s": self.config.interval_s,
            "clock": CLOCK,
            "error": None,
            "t_ns": self.t_ns,
            "gpu": self.gpu.result(),
            "cpu": {**self.host.result(), "rapl": self.rapl.result()},
        }

    def close(self) -> None:
        self.gpu.close()


def sample_until_stopped(conn, config: TelemetryConfig, pid: int | None, nvml_module: str,
                         powercap_root: str) -> None:
    """The child process: sample every interval until the parent says stop."""
    # Ctrl-C reaches the whole foreground process group; the parent decides when sampling ends.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    collector = None
    try:
        collector = Collector(config, pid, nvml_module, powercap_root)
        collector.sample()
        conn.send(("ready", None))
        interval_ns = round(config.interval_s * 1e9)
        start = collector.t_ns[0]
        tick = 1
        # Ticks are multiples of the interval from the first sample, so waits do not accumulate
        # drift; a wait is a poll on the pipe, so a stop is answered at once and nothing spins.
        while True:
            if conn.poll(max(0, start + tick * interval_ns - time.monotonic_ns()) / 1e9):
                message = conn.recv()
                if isinstance(message, tuple) and message[0] == "watch":
                    collector.host.watch(message[1], len(collector.t_ns))
                    continue
                break  # "stop"
            collector.sample()
            # a sample that overran skips the ticks it missed rather than bunching samples after it
            tick = max(tick + 1, (time.monotonic_ns() - start) // interval_ns + 1)
        collector.sample()
        conn.send(("result", collector.result()))
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone: nobody is waiting for a result
    except BaseException:  # noqa: BLE001 - whatever went wrong is the parent's to record
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        if collector is not None:
            collector.close()
        conn.close()


class Sampler:
    """Samples in its own process between __enter__ and __exit__. Afterwards `result` holds the
    columns (Collector.result), or, when sampling failed, {"interval_s", "clock", "error": why} (and
    "traceback" when the sampler raised). A sampling problem is never raised to the caller.

    As always with spawn, the child imports the caller's main module again: a script that starts a
    Sampler keeps its top level behind `if __name__ == "__main__":`."""

    def __init__(self, config: TelemetryConfig, pid: int | None = None, nvml_module: str = "pynvml",
                 powercap_root: Path | str = POWERCAP_ROOT):
        self.config = config
        self.pid = pid
        self.nvml_module = nvml_module
        self.powercap_root = Path(powercap_root)
        self.result: dict | None = None
        self.process_pid: int | None = None  # the sampler's own process, once started
        self._process = None
        self._conn = None
        self._used = False

    def __enter__(self) -> "Sampler":
        if self._used:
            raise RuntimeError("a Sampler samples once; make a new one")
        self._used = True
        context = multiprocessing.get_context("spawn")
        self._conn, child_end = context.Pipe()
        process = context.Process(
            target=sample_until_stopped, name="dlbench-telemetry", daemon=True,
            args=(child_end, self.config, self.pid, self.nvml_module, str(self.powercap_root)))
        try:
            process.start()
        except OSError as e:
            self._conn.close()
            self.result = self._failure(f"telemetry sampler could not start: {e}")
            return self
        finally:
            child_end.close()  # the parent's copy; once closed, the child's exit reads as end of pipe
        self._process, self.process_pid = process, process.pid
        try:
            self._receive(READY_TIMEOUT_S, "report ready")
        except BaseException:  # Ctrl-C while waiting: the sampler must not outlive the caller
            self._end_process(kill=True)
            raise
        return self

    def watch(self, pid: int) -> None:
        """Follow the resident memory of `pid` from the next sample on."""
        self.pid = pid
        if self._process is not None:
            try:
                self._conn.send(("watch", pid))
            except OSError:
                pass  # the child is gone; __exit__ records why

    def __exit__(self, *exc_info) -> bool:
        if self._process is None:  # it never ran; the reason is already in `result`
            return False
        try:
            try:
                self._conn.send("stop")
            except OSError:
                pass  # the child is gone; _receive says how
            message = self._receive(STOP_TIMEOUT_S, "send its result")
            if message is not None:
                self.result = message[1]
        finally:
            self._end_process(kill=False)
        return False

    def _receive(self, timeout_s: float, waiting_for: str) -> tuple | None:
        """The child's next message; or None, the process ended and `result` saying why."""
        failure = None
        try:
            if self._conn.poll(timeout_s):
                kind, payload = self._conn.recv()
                if kind != "error":
                    return kind, payload
                failure = self._failure(f"telemetry sampler failed: {payload.strip().splitlines()[-1]}")
                failure["traceback"] = payload
            else:
                failure = self._failure(f"telemetry sampler did not {waiting_for} within {timeout_s:g} s")
        except (EOFError, OSError):
            self._process.join(JOIN_TIMEOUT_S)
            failure = self._failure(f"telemetry sampler exited with status {self._process.exitcode} "
                                    f"before it could {waiting_for}")
        self.result = failure
        self._end_process(kill=True)
        return None

    def _failure(self, reason: str) -> dict:
        return {"interval_s": self.config.interval_s, "clock": CLOCK, "error": reason}

    def _end_process(self, kill: bool) -> None:
        """Join the sampler; kill it at once when it failed, or when it outstays JOIN_TIMEOUT_S."""
        if self._process is None:
            return
        if not kill:
            self._process.join(JOIN_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self._conn.close()
        self._process = None
