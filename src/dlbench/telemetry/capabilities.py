"""What telemetry this machine can give, for `dlbench info`: each GPU with the NVML queries it
answers (every query asked once), RAPL zones readable or not and why, and the CPU."""

from __future__ import annotations

from pathlib import Path

import psutil

from ..machine import _cpu_model, available_cpus
from .nvml import GpuDevice, load, shutdown, system_versions
from .rapl import POWERCAP_ROOT, zones


def _gpus(nvml_module: str) -> dict:
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


def _rapl(root: Path) -> dict:
    found, reason = zones(root)
    if reason is None and not any(z["readable"] for z in found):
        reason = "no zone readable"
    return {"available": reason is None, "reason": reason, "zones": found}


def _cpu() -> dict:
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


def machine_capabilities(nvml_module: str = "pynvml", powercap_root: Path | str = POWERCAP_ROOT) -> dict:
    return {"gpu": _gpus(nvml_module), "rapl": _rapl(Path(powercap_root)), "cpu": _cpu()}
