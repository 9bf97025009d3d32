"""Who measured: the machine's fingerprint and its GPUs, without importing any framework.

GPUs are read through NVML (nvidia-ml-py, `import pynvml`); a host without the NVIDIA library or
without a device simply has no GPUs, and the reason is kept.
"""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from pathlib import Path

import psutil


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus() -> dict:
    """{"gpus": [...], "driver": ..., "cuda_driver": ...} or {"gpus": [], "unavailable": reason}."""
    try:
        import pynvml
    except ImportError as e:  # nvidia-ml-py is a dependency, but be honest if it is missing
        return {"gpus": [], "unavailable": f"pynvml not importable: {e}"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"gpus": [], "unavailable": f"NVML: {e}"}
    try:
        out = {"driver": _text(pynvml.nvmlSystemGetDriverVersion()), "gpus": []}
        try:
            v = pynvml.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver"] = f"{v // 1000}.{v % 1000 // 10}"
        except pynvml.NVMLError as e:
            out["cuda_driver"] = None
            out["cuda_driver_unavailable"] = str(e)
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out["gpus"].append({"index": i, "name": _text(pynvml.nvmlDeviceGetName(h)),
                                "uuid": _text(pynvml.nvmlDeviceGetUUID(h)), "memory_bytes": int(mem.total)})
        return out
    except pynvml.NVMLError as e:
        return {"gpus": [], "unavailable": f"NVML: {e}"}
    finally:
        pynvml.nvmlShutdown()


def detect_device() -> str:
    """`--device auto`: cuda when NVML sees a GPU, else cpu."""
    return "cuda" if gpus()["gpus"] else "cpu"


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def fingerprint() -> dict:
    vm = psutil.virtual_memory()
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _cpu_model(),
        "cpu_logical": psutil.cpu_count(logical=True),
        "cpu_physical": psutil.cpu_count(logical=False),
        "cpu_available": available_cpus(),
        "memory_bytes": vm.total,
        "os": platform.platform(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "arch": platform.machine(),
        **gpus(),
    }


@functools.lru_cache(maxsize=1)
def dlbench_provenance() -> dict:
    from . import __version__
    from .paths import project_root

    info = {"version": __version__, "commit": None, "dirty": None}
    try:
        root = project_root()
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            info["commit"] = head.stdout.strip()
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=10)
            info["dirty"] = bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info
