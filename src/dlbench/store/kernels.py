"""Kernel records: what one run of the `kernels` suite measured (performance/kernel_suite.py), in
STORE/kernels/<run_id>.json, written like run records (temporary file, link, checksum), beside
`runs/` rather than in it: a kernel record has no network, batch or iteration time, so it is no row
of `dlbench results` and no entry of a leaderboard."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .document import DocumentKind, checksummed_file
from .store import Store

KERNEL_RECORD_FORMAT = 1
# ValueError: what its readers catch
KERNEL_RECORD_FILE = DocumentKind("kernel record", ValueError, "format", (KERNEL_RECORD_FORMAT,))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KernelResult(_Model):
    key: str
    spec: dict[str, Any]
    status: Literal["ok", "failed", "skipped"]
    reason: str | None = None
    median_s: float | None = None  # over every timed call of every repeat
    first_s: float | None = None  # the first repeat's first call
    times_s: list[float] = []
    flops: int
    bytes: int
    achieved: float | None = None  # FLOP/s, or bytes/s for the memory-bound kinds
    unit: str
    ceiling: float | None = None  # the machine's, in the same unit
    fraction: float | None = None  # achieved / ceiling
    settings: dict[str, Any] = {}


class KernelRecord(_Model):
    format: int = KERNEL_RECORD_FORMAT
    run_id: str
    started_at: datetime
    ended_at: datetime
    dlbench: dict[str, Any]
    suite: str
    benchmark: str
    source: str
    profile: str
    device: str
    framework: dict[str, Any]
    environment: dict[str, Any]
    machine: dict[str, Any]
    threads_requested: int | None
    threads_effective: dict[str, Any] = {}
    timeout_s: float
    policy: dict[str, Any]
    repeats: list[dict[str, Any]] = []  # index, status, reason, wall_s per worker process
    status: Literal["ok", "failed", "timeout", "skipped"]
    reason: str | None = None
    output_tail: str = ""
    ceilings: str | None = None  # the machine profile the fractions are of ("<id>@<revision>")
    kernels: list[KernelResult] = []


class KernelStore:
    """STORE/kernels/<run_id>.json, written whole or not at all, never replaced, checksummed."""

    def __init__(self, store: Store):
        self.store = store
        self.root = store.root / "kernels"

    def write(self, record: KernelRecord) -> Path:
        """FileExistsError for a run id already stored (left alone); StoreWriteError where the file
        system refuses it (kept where `dlbench store merge` takes it back)."""
        final = self.root / f"{record.run_id}.json"
        self.store.add(checksummed_file(json.loads(record.model_dump_json())), final, "kernel record")
        return final

    @staticmethod
    def read(path: Path) -> KernelRecord:
        """ValueError naming the file when it is damaged or not a kernel record."""
        document = KERNEL_RECORD_FILE.read(path)
        return KERNEL_RECORD_FILE.validate(KernelRecord, document.body(), document.path)

    def records(self, problems: list[str] | None = None):
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                yield self.read(path)
            except ValueError as e:
                if problems is not None:
                    problems.append(str(e))

    def latest_times(self, machine_id: str, device: str, threads: int | None = None,
                     problems: list[str] | None = None) -> dict[str, dict[str, tuple[float, str, str]]]:
        """framework -> kernel key -> (median seconds, run id, "cold" | "warm"): the latest ok
        measurement of each kernel on this machine and device (and thread count, when given)."""
        out: dict[str, dict[str, tuple[float, str, str]]] = {}
        for rec in self.records(problems):  # oldest first (run ids sort by start time): later ones win
            if rec.machine.get("machine_id") != machine_id or rec.device != device:
                continue
            if threads is not None and rec.threads_requested not in (None, threads):
                continue
            framework = out.setdefault(str(rec.framework.get("name")), {})
            # records made before cold timing say nothing: they were warm; a GPU is never flushed
            cache = rec.policy.get("cache", "warm") if rec.device == "cpu" else "warm"
            for k in rec.kernels:
                if k.status == "ok" and k.median_s is not None:
                    framework[k.key] = (k.median_s, rec.run_id, cache)
        return out
