"""Who measured: the machine's fingerprint and its GPUs, without importing any framework.

GPUs are read through NVML (nvidia-ml-py, `import pynvml`); a host without the NVIDIA library or
without a device simply has no GPUs, and the reason is kept.
"""

from __future__ import annotations

import functools
import hashlib
import json
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


def gpus(nvml_module: str = "pynvml") -> dict:
    """{"driver", "cuda_driver", "gpus": [...]} with what NVML could not answer under "unsupported",
    or {"gpus": [], "unavailable": reason}. Each GPU: index, name, uuid, serial, memory_bytes,
    pci_bus_id (None where NVML cannot say, e.g. a consumer board has no serial)."""
    from .telemetry.nvml import load, shutdown, system_versions, text  # telemetry imports this module

    nvml, reason = load(nvml_module)
    if nvml is None:
        return {"gpus": [], "unavailable": reason}
    try:
        versions, unsupported = system_versions(nvml)
        out = {**versions, "gpus": [], "unsupported": unsupported}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu = {"index": i, "name": text(nvml.nvmlDeviceGetName(handle)),
                   "uuid": text(nvml.nvmlDeviceGetUUID(handle)),
                   "memory_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total)}
            for key, query, read in (("serial", "nvmlDeviceGetSerial", lambda f, h: text(f(h))),
                                     ("pci_bus_id", "nvmlDeviceGetPciInfo", lambda f, h: text(f(h).busId))):
                gpu[key] = None
                try:
                    gpu[key] = read(getattr(nvml, query), handle)
                except AttributeError:
                    unsupported[f"{query}[{i}]"] = f"the NVML binding has no {query}"
                except nvml.NVMLError as e:
                    unsupported[f"{query}[{i}]"] = str(e)
            out["gpus"].append(gpu)
        return out
    except nvml.NVMLError as e:
        return {"gpus": [], "unavailable": f"NVML: {e}"}
    finally:
        shutdown(nvml)


def detect_device() -> str:
    """`--device auto`: cuda when NVML sees a GPU, else cpu."""
    return "cuda" if gpus()["gpus"] else "cpu"


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_id(fp: dict) -> str:
    """A stable name for the machine a fingerprint describes, to filter and merge on.

    A hash of what identifies the hardware: hostname, CPU model and counts, architecture and the
    GPUs' UUIDs. Software (OS, kernel, drivers, Python) and anything that varies from run to run
    (free memory, the CPUs this process may use) are left out: a driver update is the same machine,
    filtered on separately. So is the memory total: the kernel reports less than is installed, by an
    amount that changes with the kernel version, and any rounding of it has a boundary some machine
    sits on. Records written before schema 4 get theirs from their stored fingerprint
    (migrations.update_to_4), so this definition must not change without a new schema version.
    """
    identity = {
        "hostname": fp.get("hostname"),
        "cpu_model": fp.get("cpu_model"),
        "cpu_logical": fp.get("cpu_logical"),
        "cpu_physical": fp.get("cpu_physical"),
        "arch": fp.get("arch"),
        "gpus": sorted(str(g.get("uuid")) for g in fp.get("gpus") or [] if isinstance(g, dict)),
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return digest[:16]


@functools.lru_cache(maxsize=4)
def fingerprint(nvml_module: str = "pynvml") -> dict:
    """The machine as a record keeps it: CPU, memory, OS, GPUs with driver and CUDA driver versions,
    and `machine_id` (see machine_id())."""
    vm = psutil.virtual_memory()
    fp = {
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
        **gpus(nvml_module),
    }
    fp["machine_id"] = machine_id(fp)
    return fp


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
