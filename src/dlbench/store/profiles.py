"""A machine profile: what one machine was measured to do, which the performance model predicts from.

It holds the machine's ceilings (peak matrix-multiply FLOP/s per dtype with the framework that
reached it, copy bandwidth by working-set size, and per framework the time of its smallest
operation, i.e. what any operation costs however little it does, and the bandwidth its
element-wise operations reach), the kernel times each framework
measured in the `kernels` suite (by `KernelSpec.key`), and for data-parallel training the all-reduce
cost fitted per framework and worker count from the `comm` suite. `dlbench calibrate` makes one.

Stored in the results store, versioned and never overwritten:
`STORE/machines/<machine_id>/profile-<revision>.json`, revision 1, 2, ... per machine, each written
whole or not at all (the store's temporary file + link) and carrying the checksum of its content
(the same canonical SHA-256 as run records), the machine's fingerprint and the dlbench that made
it. A profile file can be copied to another store, or named by path, to predict for a machine one
does not have.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .document import DocumentKind, checksummed_file
from .store import Store

PROFILE_FORMAT = 3
# 1: before class probes; read as a profile without them (no field of format 1 changed meaning)
# 2: before the yardstick; read as a profile without one (its predictions are scored raw only)
READABLE_FORMATS = (1, 2, PROFILE_FORMAT)


class ProfileError(Exception):
    """A profile that cannot be found or read; the message names it."""


PROFILE_FILE = DocumentKind("machine profile", ProfileError, "format", READABLE_FORMATS)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MatmulCeiling(_Model):
    flops_per_s: float
    framework: str
    kernel: str  # the KernelSpec key of the matmul that reached it


class BandwidthPoint(_Model):
    bytes: int  # bytes moved by one copy (read + written): its working set
    bytes_per_s: float
    framework: str


class KernelTime(_Model):
    median_s: float
    run_id: str  # the kernels-suite record it comes from
    # how it was timed: "cold" (a CPU's caches flushed before each call, the kernels suite's
    # default) or "warm" (calibrate's ceilings, a GPU, records made before cold timing); None: unknown
    cache: Literal["cold", "warm"] | None = None


class ProbeTime(_Model):
    """One class probe (performance/class_efficiency.py): a layer shape timed by `dlbench calibrate` to
    measure its operation class's efficiency, with what the model needs to redo that arithmetic."""

    spec: dict[str, Any]  # KernelSpec.to_dict
    median_s: float
    run_id: str
    cache: Literal["cold", "warm"] | None = None


class Yardstick(_Model):
    """A framework's yardstick (performance/yardstick.py) over the workers of one calibration: how fast
    the machine ran while the profile was measured, and how much that moved within the calibration."""

    median_s: dict[str, float]  # kernel key -> the median over the workers of each worker's median
    workers: int
    # the slowest and the fastest worker's speed ratio to median_s: 1.3 / 0.9 say the machine ran
    # the yardstick 1.3x as long at one point of the calibration, 0.9x at another
    slowest: float
    fastest: float


class CommFit(_Model):
    """A collective's time = startup_s + per_byte_s * bytes, fitted for `workers` (linear regression):
    all_reduce (bytes: the message), all_to_all (bytes: each rank's send buffer)."""

    framework: str
    workers: int
    collective: str = "all_reduce"
    startup_s: float
    per_byte_s: float
    alpha_s: float  # the link's α and β under the collective's model (communication.COSTS[collective].link)
    beta_s_per_byte: float
    r2: float
    points: int
    min_bytes: int
    max_bytes: int
    run_ids: list[str]


class MachineProfile(_Model):
    format: int = PROFILE_FORMAT
    machine_id: str
    revision: int = 0  # set when stored
    created_at: datetime
    dlbench: dict[str, Any]
    machine: dict[str, Any]  # the fingerprint (machine.py)
    device: str  # cpu | cuda
    threads: int | None  # threads per worker the measurements ran with
    matmul_peak: dict[str, MatmulCeiling] = {}  # dtype ->
    copy_bandwidth: list[BandwidthPoint] = []  # ascending bytes
    elementwise_bandwidth: dict[str, list[BandwidthPoint]] = {}  # framework -> its relu's, ascending bytes
    dispatch_s: dict[str, float] = {}  # framework -> time of its smallest operation
    dispatch_cold_s: dict[str, float] = {}  # framework -> the same, its caches flushed before each call
    kernels: dict[str, dict[str, KernelTime]] = {}  # framework -> kernel key ->
    # framework -> the class probes calibrate timed (format 2): the model divides the roofline of a
    # shape that was not timed by its class's efficiency at these (performance/class_efficiency.py)
    class_probes: dict[str, list[ProbeTime]] = {}
    comm: list[CommFit] = []
    yardstick: dict[str, Yardstick] = {}  # framework -> (format 3)
    sources: dict[str, Any] = {}  # run ids and worker results the ceilings came from
    notes: list[str] = []
    # "measured": made by calibrate on the machine; "datasheet": made from a vendor's published
    # figures (performance/datasheet.py), never stored, its ceilings peaks that `efficiency` corrects
    source: Literal["measured", "datasheet"] = "measured"
    # operation class (matmul, convolution, attention, elementwise) -> the fraction of the peak
    # (of the bandwidth, for elementwise) the roofline divides by; absent: 1 (a measured ceiling)
    efficiency: dict[str, float] = {}

    @property
    def ref(self) -> str:
        if self.source == "datasheet":
            return f"datasheet:{self.machine_id}"
        return f"{self.machine_id[:12]}@{self.revision}"

    def peak_flops(self, dtype: str = "float32") -> float | None:
        ceiling = self.matmul_peak.get(dtype) or self.matmul_peak.get("float32")
        return ceiling.flops_per_s if ceiling else None

    def bandwidth(self, nbytes: float, framework: str | None = None) -> float | None:
        """Bandwidth at a working set of `nbytes`: the framework's element-wise (relu) bandwidth when
        measured, else the machine's copy bandwidth; interpolated in log(bytes) between the measured
        sizes, the nearest measured one outside them (caches make small working sets faster)."""
        points = sorted(self.elementwise_bandwidth.get(framework) or self.copy_bandwidth, key=lambda p: p.bytes)
        if not points:
            return None
        if nbytes <= points[0].bytes:
            return points[0].bytes_per_s
        for lo, hi in zip(points, points[1:]):
            if nbytes <= hi.bytes:
                w = (math.log(nbytes) - math.log(lo.bytes)) / (math.log(hi.bytes) - math.log(lo.bytes))
                return lo.bytes_per_s + w * (hi.bytes_per_s - lo.bytes_per_s)
        return points[-1].bytes_per_s

    def comm_fit(self, framework: str, workers: int, collective: str = "all_reduce") -> CommFit | None:
        """The framework's own fit of `collective` for `workers`, else its fit for the nearest worker count."""
        own = [c for c in self.comm if c.framework == framework and c.collective == collective]
        exact = [c for c in own if c.workers == workers]
        if exact:
            return exact[0]
        return min(own, key=lambda c: abs(c.workers - workers)) if own else None


def profile_file(profile: MachineProfile) -> bytes:
    return checksummed_file(json.loads(profile.model_dump_json()), sort_keys=True)


def read_profile(path: Path) -> MachineProfile:
    """Read and verify one profile file; ProfileError naming it otherwise."""
    document = PROFILE_FILE.read(path)
    body = document.body()
    body["format"] = PROFILE_FORMAT  # an older profile is a current one without what came later
    return PROFILE_FILE.validate(MachineProfile, body, document.path)


class ProfileStore:
    """STORE/machines/<machine_id>/profile-<revision>.json."""

    def __init__(self, store: Store):
        self.store = store
        self.root = store.root / "machines"

    def _dir(self, machine_id: str) -> Path:
        return self.root / machine_id

    def revisions(self, machine_id: str) -> list[int]:
        d = self._dir(machine_id)
        out = []
        for p in d.glob("profile-*.json") if d.is_dir() else []:
            tail = p.stem.removeprefix("profile-")
            if tail.isdigit():
                out.append(int(tail))
        return sorted(out)

    def path(self, machine_id: str, revision: int) -> Path:
        return self._dir(machine_id) / f"profile-{revision:04d}.json"

    def write(self, profile: MachineProfile) -> MachineProfile:
        """Store `profile` as the machine's next revision (never replacing one); returns it as stored."""
        for _ in range(100):
            revision = (self.revisions(profile.machine_id) or [0])[-1] + 1
            stored = profile.model_copy(update={"revision": revision})
            content, final = profile_file(stored), self.path(profile.machine_id, revision)
            try:  # a full disk, a read-only mount: kept where `dlbench store merge` takes it back
                self.store.add(content, final, "machine profile")
                return stored
            except FileExistsError:
                continue  # another calibrate took this revision a moment ago: take the next
        raise ProfileError(f"{self._dir(profile.machine_id)}: could not find a free revision")

    def machines(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()) if self.root.is_dir() else []

    def latest(self, machine_id: str) -> MachineProfile | None:
        revs = self.revisions(machine_id)
        return read_profile(self.path(machine_id, revs[-1])) if revs else None

    def latest_matching(self, machine_id: str, device: str, threads: int | None) -> MachineProfile | None:
        """The newest profile measured on `device` with `threads` threads per worker, else the newest
        on `device` (its predictions then say the thread counts differ), else None."""
        newest_on_device = None
        for revision in reversed(self.revisions(machine_id)):
            profile = read_profile(self.path(machine_id, revision))
            if profile.device != device:
                continue
            if threads is None or profile.threads == threads:
                return profile
            newest_on_device = newest_on_device or profile
        return newest_on_device

    def resolve(self, spec: str | None, machine_id: str) -> MachineProfile:
        """`--machine`: None (this machine's latest profile), a profile file's path, or a machine id
        (a unique prefix will do) or hostname, with `@REVISION` for an older revision."""
        if spec is None:
            found = self.latest(machine_id)
            if found is None:
                raise ProfileError(f"no machine profile of this machine ({machine_id[:12]}) in {self.root}; "
                                   "run `dlbench calibrate` first")
            return found
        if Path(spec).is_file():
            return read_profile(Path(spec))
        name, _, rev = spec.partition("@")
        if rev and not rev.isdigit():
            raise ProfileError(f"--machine {spec}: the revision after @ must be a number")
        candidates = [m for m in self.machines() if m.startswith(name)]
        if not candidates:  # a hostname: the machines whose latest profile names it
            candidates = [m for m in self.machines() if (self.latest(m) or _NONE).machine.get("hostname") == name]
        if not candidates:
            known = ", ".join(f"{m[:12]} ({(self.latest(m) or _NONE).machine.get('hostname')})" for m in self.machines())
            raise ProfileError(f"--machine {spec}: no such profile file or machine in {self.root}"
                               f"{'; known: ' + known if known else ''}")
        if len(candidates) > 1:
            raise ProfileError(f"--machine {spec}: matches several machines ({', '.join(c[:12] for c in candidates)})")
        mid = candidates[0]
        if rev:
            path = self.path(mid, int(rev))
            if not path.is_file():
                raise ProfileError(f"--machine {spec}: {mid[:12]} has revisions {self.revisions(mid)}, not {rev}")
            return read_profile(path)
        return self.latest(mid)


class _NoProfile:
    machine: dict = {}


_NONE = _NoProfile()
