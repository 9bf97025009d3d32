"""`dlbench check`'s results in the store: STORE/checks/<network>--<framework>--<version>.json, the
latest check of each network on each framework version in float64 (the check of the definition,
which run records carry; files written before float64 was the check's precision hold an fp32
check), and <network>--<framework>--<version>--<precision>.json for the other precisions (written by execution/equivalence.py, read
by every run to say whether its network was checked)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .store import StoreError, read_regular


class CheckStore:
    """STORE/checks/<network>--<framework>--<version>.json: the latest check of each."""

    def __init__(self, store_root: Path):
        self.root = Path(store_root) / "checks"

    def _path(self, network: str, framework: str, version: str | None, precision: str = "float64") -> Path:
        name = f"{network}--{framework}--{version}" + ("" if precision == "float64" else f"--{precision}")
        safe = "".join(c if c.isalnum() or c in "._+-" else "_" for c in name)
        return self.root / f"{safe}.json"

    def save(self, result: FrameworkCheck) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(result.network, result.framework, result.framework_version, result.precision)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(result), indent=1))
        os.replace(tmp, path)

    def status(self, network: str, network_hash: str, framework: str, version: str | None,
               precision: str = "float64") -> dict:
        """What a run record says about equivalence: the status of the matching check, if any."""
        path = self._path(network, framework, version, precision)
        if not path.is_file():
            return {"status": "unchecked"}
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None
        if not isinstance(data, dict) or "status" not in data:
            return {"status": "unchecked", "reason": f"unreadable check file {path.name}"}
        if data.get("network_hash") != network_hash:
            return {"status": "unchecked", "reason": "the last check was of another version of the network"}
        return {"status": data["status"], "checked_at": data.get("checked_at"), "reason": data.get("reason"),
                "errors": data.get("errors", {}), "precision": data.get("precision", "fp32")}


@dataclass
class FrameworkCheck:
    network: str
    framework: str
    framework_version: str | None
    status: str  # reference | equivalent | mismatch | failed | skipped
    reason: str | None = None
    params: int | None = None
    params_described: int | None = None
    tolerance: float | None = None
    errors: dict[str, float] = field(default_factory=dict)  # logits, loss, update (worst), roundtrip
    worst_tensor: str | None = None
    network_hash: str | None = None
    checked_at: str = ""
    # what the step was compared in (float64 | fp32 | amp_bf16 | amp_fp16); status() reads a file
    # from before it was recorded as fp32
    precision: str = "float64"

    @property
    def ok(self) -> bool:
        return self.status in ("reference", "equivalent", "skipped")


def check_file_problem(path: Path) -> str | None:
    """Why an equivalence check file cannot be used, or None (see CheckStore)."""
    try:
        data = json.loads(read_regular(Path(path)))
    except StoreError as e:
        return str(e)
    except (OSError, ValueError, RecursionError) as e:
        return f"{path}: unreadable check: {e}"
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        return f"{path}: not an equivalence check (no status)"
    return None
