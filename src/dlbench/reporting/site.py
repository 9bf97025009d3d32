"""Render the store as a static HTML comparison page (jinja2 templates in reports/, autoescaped).

A view model is built once from the records; the template only lays it out. Every string from a
record reaches the page through autoescaping, so hostile names or error text stay inert.
"""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from .. import __version__, paths
from ..store.record import Record
from ..store.rows import run_row


def machine_label(r: Record) -> str:
    m = r.machine
    gpus = [g["name"] for g in m.get("gpus", [])]
    if r.workload.device == "cuda" and gpus:
        return f"{gpus[0]}" + (f" x{len(gpus)}" if len(gpus) > 1 else "")
    return f"{m.get('cpu_model', '?')} ({r.settings.threads_requested or m.get('cpu_available')} threads)"


def build_view(records: list[Record]) -> dict:
    """Group runs into comparisons: same benchmark, device, batch and precision on one machine."""
    groups: dict[tuple, dict[str, list[Record]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        key = (r.suite, r.benchmark, r.workload.device, machine_label(r), r.workload.batch_size, r.workload.precision)
        groups[key][r.framework.get("name", "?")].append(r)
    comparisons = []
    for key in sorted(groups):
        suite, bench, device, machine, batch, precision = key
        rows = []
        for fw, runs in groups[key].items():
            runs.sort(key=lambda r: r.started_at)
            latest_ok = next((r for r in reversed(runs) if r.status == "ok"), None)
            shown = latest_ok or runs[-1]
            row = run_row(shown)
            row["runs"] = len(runs)
            row["network_hash"] = shown.network.hash[:12]
            rows.append(row)
        best = max((r["samples_per_s"] or 0 for r in rows), default=0)
        for row in rows:
            sps = row["samples_per_s"]
            row["relative"] = sps / best if sps and best else None
            row["bar_pct"] = round(100 * row["relative"], 1) if row["relative"] else 0
        rows.sort(key=lambda r: (r["samples_per_s"] is None, -(r["samples_per_s"] or 0)))
        comparisons.append({"suite": suite, "benchmark": bench, "device": device, "machine": machine,
                            "batch_size": batch, "precision": precision, "rows": rows,
                            "network": rows[0]["network"], "mode": rows[0]["mode"],
                            "flops_per_sample": rows[0]["flops_per_sample"],
                            "params_described": rows[0]["params_described"]})
    suites = defaultdict(list)
    for c in comparisons:
        suites[c["suite"]].append(c)
    status_counts = defaultdict(int)
    for r in records:
        status_counts[r.status] += 1
    return {
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dlbench_version": __version__,
        "suites": dict(suites),
        "runs": [run_row(r) for r in sorted(records, key=lambda r: r.started_at, reverse=True)],
        "status_counts": dict(status_counts),
        "total": len(records),
    }


def _environment() -> Environment:
    return Environment(loader=FileSystemLoader(str(paths.reports_dir() / "templates")),
                       autoescape=select_autoescape(default=True, default_for_string=True),
                       undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def write_report(records: list[Record], out_dir: Path) -> Path:
    """Write out_dir/index.html atomically and return its path."""
    env = _environment()
    css = (paths.reports_dir() / "static" / "style.css").read_text()
    html = env.get_template("index.html.j2").render(view=build_view(records), css=css)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = out_dir / "index.html"
    tmp = out_dir / f".index.html.{os.getpid()}.tmp"
    tmp.write_text(html)
    os.replace(tmp, index)
    return index
