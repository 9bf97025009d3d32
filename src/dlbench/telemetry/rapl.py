"""CPU package and DRAM energy from RAPL, read through the kernel's powercap interface.

Each zone `intel-rapl:N` (a package) or `intel-rapl:N:M` (a subzone, such as dram) has `name`,
`energy_uj` (a counter that wraps at `max_energy_range_uj`) and `max_energy_range_uj`. The raw
counter is kept as sampled; the wrap is undone when energy over a window is derived. Since the
PLATYPUS fix (late 2020) `energy_uj` is readable by root only, so a normal user usually has no
RAPL, and the reason says so.
"""

from __future__ import annotations

from pathlib import Path

POWERCAP_ROOT = Path("/sys/class/powercap")


def _sampled(name: str) -> bool:
    return name.startswith("package") or name == "dram"


def zones(root: Path) -> tuple[list[dict], str | None]:
    """Every RAPL zone with whether its counter can be read: ([{zone, name, readable, reason,
    max_energy_range_uj}], None), or ([], why there are none)."""
    if not root.is_dir():
        return [], f"no powercap interface at {root}"
    found = []
    for path in sorted(root.glob("intel-rapl:*")):
        zone = {"zone": path.name, "name": None, "readable": False, "reason": None, "max_energy_range_uj": None}
        try:
            zone["name"] = (path / "name").read_text().strip()
            zone["max_energy_range_uj"] = int((path / "max_energy_range_uj").read_text())
            int((path / "energy_uj").read_text())
            zone["readable"] = True
        except (OSError, ValueError) as e:
            zone["reason"] = str(e)
        found.append(zone)
    if not found:
        return [], f"no intel-rapl zones under {root}"
    return found, None


class RaplTelemetry:
    """The package and dram zones, one raw `energy_uj` reading per zone at every sample."""

    def __init__(self, root: Path = POWERCAP_ROOT):
        self._root = Path(root)
        found, self.reason = zones(self._root)
        self.domains = [{k: z[k] for k in ("zone", "name", "max_energy_range_uj")}
                        for z in found if z["readable"] and _sampled(z["name"])]
        # a zone whose name cannot be read may be a package: derive() counts it against package energy
        self.unreadable = [{k: z[k] for k in ("zone", "name", "reason")} for z in found if not z["readable"]]
        if found and not self.domains:
            self.reason = ("no readable package or dram zone: "
                           + "; ".join(f"{z['zone']}: {z['reason']}" for z in self.unreadable)
                           if self.unreadable else f"no package or dram zone under {self._root}")
        self.series: dict[str, list] = {d["zone"]: [] for d in self.domains}

    @property
    def available(self) -> bool:
        return bool(self.domains)

    def sample(self) -> None:
        for zone, values in self.series.items():
            try:
                values.append(int((self._root / zone / "energy_uj").read_text()))
            except (OSError, ValueError):
                values.append(None)  # a gap; the counter difference spans it

    def result(self) -> dict:
        return {"available": self.available, "reason": self.reason, "domains": self.domains,
                "unreadable": self.unreadable, "series": self.series}
