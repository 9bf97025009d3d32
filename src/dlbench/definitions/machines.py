"""Datasheet machines: the published figures of accelerators one does not have (`suites/machines/`).

A machine file states what a vendor publishes for one accelerator: dense peak rates per precision,
memory bandwidth, the links between accelerators and to the host, how many sit in one node and the
board's power. Every figure names its source (a key of the file's `sources`: the vendor's document
and its address) and, where the file's value is not the published one as printed, how it follows
from it (`derived`: e.g. half of a figure published "with sparsity"). What was looked for and not
found is listed under `not_found`, not guessed.

`efficiency.yaml` beside them states what fraction of those peaks a framework is taken to reach per
operation class, and the other assumptions a prediction from a datasheet needs (the launch overhead
of an operation, an all-reduce step's latency), each with its reasoning. A user's file of the same
form (`--efficiency FILE`) overrides any of them; the CLI's `--efficiency CLASS=VALUE` one.

Validated once, here: a bad file is one DefinitionError naming the file and the field.
The performance model turns a sheet into a machine profile (performance/datasheet.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from .loader import DefinitionError, read_yaml, validate
from .schema import Int, Real, _Strict

# The operation classes a datasheet prediction scales by an efficiency (performance/kernels.py
# OP_CLASS maps each kernel kind to one; element-wise work is whatever is not a kernel of the others).
OP_CLASSES = ("matmul", "convolution", "attention", "elementwise", "all_reduce")
OpClass = Literal["matmul", "convolution", "attention", "elementwise", "all_reduce"]
Text = Annotated[str, Field(min_length=1, max_length=2000)]
Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")]


class Source(_Strict):
    document: Text  # the vendor's document, by its title
    url: Annotated[str, Field(pattern=r"^https://\S+$", max_length=2000)]
    # other public pages the figures were found on or checked against (a reader can follow them
    # where the vendor's own document moved)
    seen_via: list[Annotated[str, Field(pattern=r"^https://\S+$", max_length=2000)]] = []


class Figure(_Strict):
    value: Real(gt=0, le=1e9)
    source: Name  # a key of the file's `sources`
    derived: Text | None = None  # how `value` follows from the figure as published, when it is not that figure


class PeakRates(_Strict):
    """Dense (no structured sparsity) peak rates in TFLOP/s: `float32` on the vector units (IEEE
    float32, what the `fp32` precision runs), `tf32` / `bfloat16` / `float16` on the matrix units."""

    float32: Figure | None = None
    tf32: Figure | None = None
    bfloat16: Figure | None = None
    float16: Figure | None = None


class Link(_Strict):
    """A kind of link: `topology` says how the accelerators of one node reach each other over it:
    `switch` (a switch gives each its whole bandwidth to any other: NVSwitch), `mesh` (a direct
    link to each other one) or `host` (through the host's PCIe)."""

    kind: Text  # e.g. "NVLink 4", "Infinity Fabric", "PCIe Gen5 x16"
    topology: Literal["switch", "mesh", "host"]
    total_gb_per_s: Figure  # all its links together, both directions, GB/s (10^9 bytes)
    links: Figure | None = None  # how many
    link_gb_per_s: Figure | None = None  # one link, both directions


class MachineSheet(_Strict):
    name: Text  # the product, as the vendor names it
    vendor: Text
    device: Literal["cuda"] = "cuda"  # what a framework calls it (ROCm builds present AMD GPUs as cuda too)
    sources: Annotated[dict[Name, Source], Field(min_length=1)]
    peak_tflops: PeakRates
    memory_gb_per_s: Figure  # GB/s (10^9 bytes)
    memory_gb: Figure | None = None
    gpu_link: Link | None = None  # between the accelerators of one node (None: only through the host)
    host_link: Link | None = None
    gpus_per_node: Figure | None = None  # in the vendor's own node (HGX, the MI300X platform)
    board_power_w: Figure | None = None  # the board's maximum (TDP, TBP)
    not_found: list[Text] = []  # figures looked for and not found: left out, not guessed
    # what the driver calls this board (NVML's device name, a record's machine.gpus[].name): a run or
    # a calibrated profile of a GPU of exactly this name (ignoring case) is this sheet's machine, so
    # `predict --accuracy` sets the sheet's prediction beside the calibrated one. Not a figure.
    gpu_names: list[Text] = []

    def figures(self) -> list[tuple[str, Figure]]:
        """Every figure of the file with its field path."""
        out: list[tuple[str, Figure]] = []
        for dtype in PeakRates.model_fields:
            if (f := getattr(self.peak_tflops, dtype)) is not None:
                out.append((f"peak_tflops.{dtype}", f))
        for name in ("memory_gb_per_s", "memory_gb", "gpus_per_node", "board_power_w"):
            if (f := getattr(self, name)) is not None:
                out.append((name, f))
        for link_name in ("gpu_link", "host_link"):
            link = getattr(self, link_name)
            for name in ("total_gb_per_s", "links", "link_gb_per_s"):
                if link is not None and (f := getattr(link, name)) is not None:
                    out.append((f"{link_name}.{name}", f))
        return out


class Factor(_Strict):
    value: Real(gt=0, le=1)
    why: Text


class Assumption(_Strict):
    value: Real(gt=0, le=1e6)
    why: Text


class EfficiencyFile(_Strict):
    """What fraction of a datasheet's peak each operation class reaches, and the assumptions a
    datasheet prediction adds. In the shipped defaults every field is present; a user's file may
    give any of them."""

    efficiency: dict[OpClass, Factor] = {}
    launch_overhead_us: Assumption | None = None  # one operation's call from an eager step
    all_reduce_step_latency_us: Assumption | None = None  # α: one step of a ring all-reduce
    host_linked_gpus: Int(2, 1024) | None = None  # most GPUs on one PCIe host where the sheet gives no node
    host_linked_gpus_why: Text | None = None


def load_machine_sheet(path: Path) -> MachineSheet:
    """One machine file, validated; every figure's source must be one the file names."""
    sheet = validate(MachineSheet, read_yaml(path), path)
    if not any(getattr(sheet.peak_tflops, d) for d in PeakRates.model_fields):
        raise DefinitionError(path, "peak_tflops", "no rate at all: at least one precision's figure is needed")
    for where, figure in sheet.figures():
        if figure.source not in sheet.sources:
            raise DefinitionError(path, f"{where}.source",
                                  f"{figure.source!r} is not one of sources ({', '.join(sheet.sources)})")
    return sheet


def load_efficiency(path: Path, complete: bool = False) -> EfficiencyFile:
    """A file of efficiencies and assumptions; `complete`: every one must be given (the defaults)."""
    spec = validate(EfficiencyFile, read_yaml(path), path)
    if complete:
        for cls in OP_CLASSES:
            if cls not in spec.efficiency:
                raise DefinitionError(path, f"efficiency.{cls}", "missing: the defaults must state every class")
        for name in ("launch_overhead_us", "all_reduce_step_latency_us", "host_linked_gpus", "host_linked_gpus_why"):
            if getattr(spec, name) is None:
                raise DefinitionError(path, name, "missing: the defaults must state every assumption")
    return spec
