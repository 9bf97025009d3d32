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
    from .telemetry.nvml import load, shutdown, system_versions, text

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
    from .paths import project_root
    from .version import __version__

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


# ---------------------------------------------------------------------------------------- device

def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def dtype_support(device: str, flags: set[str] | None = None, capability: tuple[int, int] | None = None) -> dict:
    """dtype -> None (the device computes in it) or why not. On a CPU: whether it has bfloat16 /
    float16 arithmetic instructions (without them a framework would convert every element, which
    measures the conversion, not the kernel); on a GPU: compute capability 5.3 (float16) and 8.0
    (bfloat16); unknown capability: left to the framework."""
    out: dict[str, str | None] = {"float32": None}
    if device == "cuda":
        if capability is None:
            return {**out, "float16": None, "bfloat16": None}
        out["float16"] = None if capability >= (5, 3) else f"compute capability {capability[0]}.{capability[1]} < 5.3"
        out["bfloat16"] = None if capability >= (8, 0) else f"compute capability {capability[0]}.{capability[1]} < 8.0"
        return out
    flags = cpu_flags() if flags is None else flags
    out["bfloat16"] = None if flags & {"avx512_bf16", "amx_bf16"} else \
        "this CPU has no bfloat16 arithmetic (neither avx512_bf16 nor amx_bf16)"
    out["float16"] = None if flags & {"avx512_fp16", "amx_fp16"} else \
        "this CPU has no float16 arithmetic (neither avx512_fp16 nor amx_fp16)"
    return out


def gpu_capability(nvml_module: str = "pynvml") -> tuple[int, int] | None:
    from .telemetry.nvml import load, shutdown

    nvml, _ = load(nvml_module)
    if nvml is None:
        return None
    try:
        return tuple(nvml.nvmlDeviceGetCudaComputeCapability(nvml.nvmlDeviceGetHandleByIndex(0)))
    except Exception:  # noqa: BLE001 - no GPU, or a binding without the query: the framework decides
        return None
    finally:
        shutdown(nvml)


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest cache of CPU 0 (sysfs `size`, e.g. "307200K"), or None where it cannot be read."""
    sizes = []
    for index in sysfs.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes) if sizes else None


# ---------------------------------------------------------------------------------------- capabilities
def _gpu_capabilities(nvml_module: str) -> dict:
    from .telemetry.nvml import GpuDevice, load, shutdown, system_versions

    nvml, reason = load(nvml_module)
    if nvml is None:
        return {"available": False, "reason": reason, "devices": []}
    try:
        versions, unsupported = system_versions(nvml)
        out = {"available": False, "reason": None, **versions, "unsupported": unsupported, "devices": []}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            return {**out, "reason": f"NVML: nvmlDeviceGetCount: {e}"}
        for index in range(count):
            device = GpuDevice(nvml, index, {})
            if device.lost is not None:
                out["devices"].append({"index": index, "unavailable": device.lost["reason"]})
                continue
            answers = device.probe()
            out["devices"].append({
                **device.static,
                "supported": [name for name, why in answers.items() if why is None],
                "unsupported": {**device.unsupported, **{name: why for name, why in answers.items() if why}},
            })
        out["available"] = bool(out["devices"])
        out["reason"] = None if out["devices"] else "NVML sees no GPU"
        return out
    finally:
        shutdown(nvml)


def _rapl_capabilities(root: Path) -> dict:
    from .telemetry.rapl import zones

    found, reason = zones(root)
    if reason is None and not any(z["readable"] for z in found):
        reason = "no zone readable"
    return {"available": reason is None, "reason": reason, "zones": found}


def _cpu_capabilities() -> dict:
    out = {"model": _cpu_model(), "logical_cores": psutil.cpu_count(logical=True),
           "physical_cores": psutil.cpu_count(logical=False), "available_cores": available_cpus(),
           "frequency_mhz": None, "frequency_reason": None}
    try:
        freq = psutil.cpu_freq()
    except (OSError, NotImplementedError) as e:
        freq, out["frequency_reason"] = None, str(e)
    if freq is None:
        out["frequency_reason"] = out["frequency_reason"] or "psutil reports no CPU frequency here"
    else:
        # a virtual machine often reports 0 for min and max: unknown, not zero
        out["frequency_mhz"] = {k: (getattr(freq, k) or None) for k in ("current", "min", "max")}
    return out


def machine_capabilities(nvml_module: str = "pynvml", powercap_root: Path | str | None = None) -> dict:
    """What telemetry this machine can give, for `dlbench info`: each GPU with the NVML queries it
    answers (every query asked once), RAPL zones readable or not and why, and the CPU."""
    from .telemetry.rapl import POWERCAP_ROOT

    powercap_root = POWERCAP_ROOT if powercap_root is None else powercap_root
    return {"gpu": _gpu_capabilities(nvml_module), "rapl": _rapl_capabilities(Path(powercap_root)),
            "cpu": _cpu_capabilities()}
