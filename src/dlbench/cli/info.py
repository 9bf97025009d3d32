"""`dlbench info`: what this machine offers to measure with."""

from __future__ import annotations

import json
import os
import sys

from rich.markup import escape
from rich.table import Table

from ..machine import fingerprint
from .console import out
from .options import FormatOption, check_format


def info(format: FormatOption = "table") -> None:
    """What this machine offers to measure with: CPU, GPUs and their NVML capabilities, RAPL domains."""
    from ..machine import machine_capabilities

    check_format(format)
    caps = machine_capabilities(os.environ.get("DLBENCH_NVML_MODULE", "pynvml"))
    caps["machine"] = fingerprint()
    if format == "json":
        sys.stdout.write(json.dumps(caps, indent=1, default=str) + "\n")
        return
    m = caps["machine"]
    out.print(f"[bold]CPU[/] {escape(str(m['cpu_model']))}: {m['cpu_physical']} cores, {m['cpu_logical']} threads, "
              f"{m['cpu_available']} available to dlbench; memory {m['memory_bytes'] / 2**30:.1f} GiB; {escape(m['os'])}")
    gpu = caps["gpu"]
    if not gpu.get("available"):
        out.print(f"[bold]GPU[/] none usable: {escape(str(gpu.get('reason')))}")
    for g in gpu.get("devices", []):
        if "unavailable" in g:
            out.print(f"[bold]GPU {g['index']}[/] unavailable: {escape(str(g['unavailable']))}")
            continue
        t = Table(title=escape(f"GPU {g.get('index')}: {g.get('name')} ({g.get('uuid')})"))
        t.add_column("NVML query")
        t.add_column("status")
        for query in sorted(g.get("supported", [])):
            t.add_row(escape(query), "[green]supported[/]")
        for query, why in sorted(g.get("unsupported", {}).items()):
            t.add_row(escape(query), escape(f"unsupported: {why}"))
        out.print(t)
    rapl = caps["rapl"]
    zones = ", ".join(escape(f"{z.get('zone')} ({z.get('name')}): {'readable' if z.get('readable') else z.get('reason')}")
                      for z in rapl.get("zones", []))
    if rapl.get("available"):
        out.print(f"[bold]RAPL[/] {zones}")
    else:
        out.print(f"[bold]RAPL[/] unavailable: {escape(str(rapl.get('reason')))}" + (f" ({zones})" if zones else ""))
