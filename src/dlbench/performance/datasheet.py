"""A machine one does not have, as a machine profile made from its datasheet (suites/machines/).

`datasheet_profile` turns a validated MachineSheet (definitions/machines.py) and the stated
efficiencies into the same MachineProfile the performance model predicts from after `calibrate`,
so a datasheet prediction takes exactly the measured path with other numbers in it:

- matmul_peak: the sheet's dense peak per precision (float32 on the vector units; tf32, bfloat16 and
  float16 on the matrix units). The model divides an operation's FLOPs by the peak of its dtype
  times the efficiency of its class (matmul, convolution, attention; element-wise FLOPs unscaled).
- copy_bandwidth: the memory bandwidth, one figure at every size; every operation's bytes are divided
  by it times the `elementwise` efficiency.
- dispatch_s: the assumed launch overhead, for each framework given (an eager step pays it per
  operation, a compiled step once per iteration, as for a measured profile).
- comm: for 2 … N workers of one node (N: the sheet's GPUs per node, else the assumed number of GPUs
  on one PCIe host), the ring all-reduce t = 2(n−1)·α + 2(n−1)/n·β·bytes with α the assumed step
  latency and β = 1 / (one direction of the GPU's links × the `all_reduce` efficiency): half the
  both-directions total of its GPU link (NVSwitch, a mesh) or, without one, of its host link.
  More workers than one node holds are refused (model.collective_cost): no datasheet gives the
  network between nodes.

Nothing here is measured, and the profile says so: `source` "datasheet", its ref `datasheet:<name>`,
and every prediction from it carries a note naming the efficiencies (model.datasheet_note).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..definitions.loader import DefinitionError
from ..definitions.machines import (OP_CLASSES, EfficiencyFile, MachineSheet, load_efficiency,
                                    load_machine_sheet)
from ..store.profiles import BandwidthPoint, CommFit, MatmulCeiling, MachineProfile
from ..version import __version__
from .communication import AllReduceCost

DTYPES = ("float32", "tf32", "bfloat16", "float16")


@dataclass(frozen=True)
class Efficiency:
    """The assumptions of a datasheet prediction: per operation class the fraction of the peak
    reached (OP_CLASSES), one operation's launch overhead, one ring step's latency, and how many
    GPUs one PCIe host holds where a sheet gives no node; `why` keeps each one's reasoning."""

    factors: Mapping[str, float]
    launch_overhead_s: float
    step_latency_s: float
    host_linked_gpus: int
    why: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_file(cls, spec: EfficiencyFile) -> Efficiency:
        """From the complete defaults file (definitions/machines.load_efficiency(complete=True))."""
        return cls({k: f.value for k, f in spec.efficiency.items()}, spec.launch_overhead_us.value * 1e-6,
                   spec.all_reduce_step_latency_us.value * 1e-6, spec.host_linked_gpus,
                   {**{k: f.why for k, f in spec.efficiency.items()},
                    "launch_overhead": spec.launch_overhead_us.why,
                    "all_reduce_step_latency": spec.all_reduce_step_latency_us.why,
                    "host_linked_gpus": spec.host_linked_gpus_why})

    def overridden(self, spec: EfficiencyFile | None = None, values: Mapping[str, float] | None = None,
                   origin: str = "given") -> Efficiency:
        """These, with what a user's file and then single `CLASS=VALUE` settings replace."""
        factors, why = dict(self.factors), dict(self.why)
        overhead, latency, gpus = self.launch_overhead_s, self.step_latency_s, self.host_linked_gpus
        if spec is not None:
            for k, f in spec.efficiency.items():
                factors[k], why[k] = f.value, f.why
            if spec.launch_overhead_us is not None:
                overhead, why["launch_overhead"] = spec.launch_overhead_us.value * 1e-6, spec.launch_overhead_us.why
            if spec.all_reduce_step_latency_us is not None:
                latency = spec.all_reduce_step_latency_us.value * 1e-6
                why["all_reduce_step_latency"] = spec.all_reduce_step_latency_us.why
            if spec.host_linked_gpus is not None:
                gpus, why["host_linked_gpus"] = spec.host_linked_gpus, spec.host_linked_gpus_why or origin
        for k, v in (values or {}).items():
            if k not in OP_CLASSES:
                raise ValueError(f"unknown operation class {k!r}; expected one of {', '.join(OP_CLASSES)}")
            if not 0 < v <= 1:
                raise ValueError(f"efficiency {k}={v}: must be in (0, 1]")
            factors[k], why[k] = v, origin
        return Efficiency(factors, overhead, latency, gpus, why)


def default_efficiency(path: Path) -> Efficiency:
    """The shipped defaults (suites/machines/efficiency.yaml); DefinitionError naming the field."""
    return Efficiency.from_file(load_efficiency(path, complete=True))


def parse_efficiency_setting(text: str) -> tuple[str, float]:
    """`matmul=0.6` -> ("matmul", 0.6); ValueError saying what is wrong."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"--efficiency {text!r}: expected CLASS=VALUE ({', '.join(OP_CLASSES)}) or a file")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--efficiency {text!r}: {value!r} is not a number") from None
    if name.strip() not in OP_CLASSES:
        raise ValueError(f"--efficiency {text!r}: unknown operation class; expected one of {', '.join(OP_CLASSES)}")
    if not 0 < number <= 1:
        raise ValueError(f"--efficiency {text!r}: a fraction of the peak must be in (0, 1]")
    return name.strip(), number


def all_reduce_link(sheet: MachineSheet) -> tuple[str, float] | None:
    """(the link a node's all-reduce crosses, its one-direction bandwidth in bytes/s): the GPU link
    where there is one, else the host link; None when the sheet has neither."""
    link = sheet.gpu_link or sheet.host_link
    if link is None:
        return None
    return link.kind, link.total_gb_per_s.value * 1e9 / 2


def node_gpus(sheet: MachineSheet, efficiency: Efficiency) -> int:
    return int(sheet.gpus_per_node.value) if sheet.gpus_per_node is not None else efficiency.host_linked_gpus


def datasheet_profile(name: str, sheet: MachineSheet, efficiency: Efficiency,
                      frameworks: Iterable[str]) -> MachineProfile:
    """The MachineProfile of `sheet` (machine id `name`, the file's stem) under `efficiency`, with the
    assumed launch overhead and all-reduce fits for each of `frameworks`."""
    frameworks = list(frameworks)
    peaks = {d: getattr(sheet.peak_tflops, d) for d in DTYPES if getattr(sheet.peak_tflops, d) is not None}
    matmul_peak = {d: MatmulCeiling(flops_per_s=f.value * 1e12, framework="datasheet", kernel=f"peak_tflops.{d}")
                   for d, f in peaks.items()}
    notes = [f"made from the datasheet file of the {sheet.name}: nothing in it was measured"]
    missing = [d for d in ("bfloat16", "float16") if d not in peaks]
    if missing and "float32" in peaks:
        notes.append(f"no {' or '.join(missing)} rate in the datasheet: such work at the float32 rate")
    if "float32" not in peaks:
        notes.append("no float32 rate in the datasheet: element-wise work by its bytes alone, float32 "
                     "products not predicted")
    comm: list[CommFit] = []
    link = all_reduce_link(sheet)
    if link is not None:
        kind, one_way = link
        alpha = efficiency.step_latency_s
        beta = 1.0 / (one_way * efficiency.factors["all_reduce"])
        for n in range(2, node_gpus(sheet, efficiency) + 1):
            cost = AllReduceCost.ring(alpha, beta, n)
            comm += [CommFit(framework=fw, workers=n, startup_s=cost.startup_s, per_byte_s=cost.per_byte_s,
                             alpha_s=alpha, beta_s_per_byte=beta, r2=1.0, points=0, min_bytes=0, max_bytes=0,
                             run_ids=[]) for fw in frameworks]
        notes.append(f"all-reduce: a ring over {kind} at {one_way / 1e9:g} GB/s each way x "
                     f"{efficiency.factors['all_reduce']:g}, {efficiency.step_latency_s * 1e6:g} µs per step")
    return MachineProfile(
        machine_id=name, revision=0, created_at=datetime.now(timezone.utc), dlbench={"version": __version__},
        machine={"hostname": None, "datasheet": sheet.name, "vendor": sheet.vendor}, device=sheet.device,
        threads=None, matmul_peak=matmul_peak,
        copy_bandwidth=[BandwidthPoint(bytes=1, bytes_per_s=sheet.memory_gb_per_s.value * 1e9, framework="datasheet")],
        dispatch_s={fw: efficiency.launch_overhead_s for fw in frameworks},
        dispatch_cold_s={fw: efficiency.launch_overhead_s for fw in frameworks},
        comm=comm, source="datasheet",
        efficiency={k: v for k, v in efficiency.factors.items() if k != "all_reduce"},
        sources={"datasheet": {
            "name": sheet.name, "file": f"suites/machines/{name}.yaml",
            "board_power_w": sheet.board_power_w.value if sheet.board_power_w is not None else None,
            "gpus_per_node": node_gpus(sheet, efficiency) if link is not None else 1,
            "efficiency": dict(efficiency.factors), "launch_overhead_s": efficiency.launch_overhead_s,
            "all_reduce_step_latency_s": efficiency.step_latency_s,
            "figures": {where: {"value": f.value, "source": sheet.sources[f.source].url,
                                **({"derived": f.derived} if f.derived else {})} for where, f in sheet.figures()},
            "not_found": list(sheet.not_found)}},
        notes=notes)


def board_power_w(profile: MachineProfile) -> float | None:
    """The board's maximum power a datasheet profile states (None for a measured profile or a sheet without it)."""
    sheet = profile.sources.get("datasheet") if profile.source == "datasheet" else None
    return sheet.get("board_power_w") if isinstance(sheet, dict) else None


class DatasheetMachines:
    """The shipped datasheet machines of one folder (the catalog's machines_dir), as profiles."""

    def __init__(self, folder: Path, efficiency: Efficiency | None = None):
        self.folder = folder
        self.efficiency = efficiency or default_efficiency(folder / "efficiency.yaml")

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.folder.glob("*.yaml") if p.stem != "efficiency")

    def sheet(self, name: str) -> MachineSheet:
        path = self.folder / f"{name}.yaml"
        if name not in self.names():
            raise DefinitionError(path, "", f"no datasheet machine {name!r}; shipped: {', '.join(self.names())}")
        return load_machine_sheet(path)

    def profile(self, name: str, frameworks: Iterable[str]) -> MachineProfile:
        return datasheet_profile(name, self.sheet(name), self.efficiency, frameworks)
