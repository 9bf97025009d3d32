"""`dlbench check`'s results in the store: STORE/checks/<network>--<framework>--<version>.json, the
latest check of each network on each framework version in float64 (the check of the definition,
which run records carry; files written before float64 was the check's precision hold an fp32
check), and <network>--<framework>--<version>--<precision>.json for the other precisions (written by execution/equivalence.py, read
by every run to say whether its network was checked).

`dlbench run` makes the checks it lacks before timing (execution/equivalence.py: ensure_checks):
which check stands for a run is `check_precisions`: a fp32 or tf32 run by the float64 check (the
check of the definition; a float32 check is decided in part by rounding, see equivalence.py), an
amp_bf16 or amp_fp16 run by the float64 check and the check in its own precision."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .document import DocumentKind
from .store import Store, StoreError

# Check files have never carried a checksum or a version; their format is kept as it is.
CHECK_FILE = DocumentKind("equivalence check", StoreError, checksummed_from=None)
QUANTITIES = ("logits", "loss", "weights", "update")  # compared with the reference; `worst` is among these


def _replace_file(path: Path, content: bytes) -> None:
    """`path` (STORE/checks/<name>.json) with `content`, whole or not at all (Store.replace_file)."""
    Store(path.parent.parent).replace_file(content, path)


def check_precisions(run_precision: str) -> tuple[str, ...]:
    """The checks that stand for a run in this precision, the definition's (float64) first."""
    return ("float64", run_precision) if run_precision in ("amp_bf16", "amp_fp16") else ("float64",)


def worst_error(errors: dict) -> dict | None:
    """{quantity, error}: the largest of the compared quantities' relative errors, or None."""
    found = [(float(errors[q]), q) for q in QUANTITIES if isinstance(errors.get(q), (int, float))]
    if not found:
        return None
    error, quantity = max(found)
    return {"quantity": quantity, "error": error}


class CheckStore:
    """STORE/checks/<network>--<framework>--<version>.json: the latest check of each."""

    def __init__(self, store_root: Path):
        self.root = Path(store_root) / "checks"

    def _path(self, network: str, framework: str, version: str | None, precision: str = "float64") -> Path:
        name = f"{network}--{framework}--{version}" + ("" if precision == "float64" else f"--{precision}")
        safe = "".join(c if c.isalnum() or c in "._+-" else "_" for c in name)
        return self.root / f"{safe}.json"

    def save(self, result: FrameworkCheck) -> None:
        """Replace the stored check of this network, framework version and precision, whole or not
        at all. A write the file system refuses (a full disk, a read-only mount) keeps the file in a
        spare store and raises StoreWriteError saying where (Store.keep_file_elsewhere)."""
        path = self._path(result.network, result.framework, result.framework_version, result.precision)
        content = json.dumps(asdict(result), indent=1).encode()
        try:
            _replace_file(path, content)
        except OSError as e:
            raise Store(self.root.parent).keep_file_elsewhere(path, content, e, "check") from None

    def status(self, network: str, network_hash: str, framework: str, version: str | None,
               precision: str = "float64") -> dict:
        """What a run record says about equivalence: the status of the matching check, if any."""
        path = self._path(network, framework, version, precision)
        if not path.is_file():
            return {"status": "unchecked"}
        try:
            data = CHECK_FILE.read(path).data
        except StoreError:
            data = {}
        if "status" not in data:
            return {"status": "unchecked", "reason": f"unreadable check file {path.name}"}
        if data.get("network_hash") != network_hash:
            return {"status": "unchecked", "reason": "the last check was of another version of the network"}
        errors = data.get("errors", {}) if isinstance(data.get("errors"), dict) else {}
        return {"status": data["status"], "checked_at": data.get("checked_at"), "reason": data.get("reason"),
                "errors": errors, "precision": data.get("precision", "fp32"), "reference": data.get("reference"),
                "worst": worst_error(errors), "check_s": data.get("check_s"),
                "checked_by": data.get("checked_by", "dlbench check")}

    def has(self, network: str, network_hash: str, framework: str, version: str | None,
            precision: str = "float64") -> bool:
        """A stored check of this network (same definition hash), framework version and precision,
        whatever its outcome (a failed or skipped check is not made again until the version changes)."""
        return self.status(network, network_hash, framework, version, precision)["status"] != "unchecked"

    def status_for_run(self, network: str, network_hash: str, framework: str, version: str | None,
                       run_precision: str) -> dict:
        """What a run record says: the check of its precision (check_precisions), unless the float64
        check of the definition does not hold, which then speaks for it."""
        precisions = check_precisions(run_precision)
        definition = self.status(network, network_hash, framework, version, precisions[0])
        if len(precisions) == 1 or definition["status"] not in ("reference", "equivalent"):
            return definition
        return self.status(network, network_hash, framework, version, precisions[1])


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
    reference: str | None = None  # "<framework> <version>" compared against (the reference itself: None)
    check_s: float | None = None  # seconds the whole check of this network and precision took
    checked_by: str = "dlbench check"  # or "dlbench run" (made before timing)

    @property
    def ok(self) -> bool:
        return self.status in ("reference", "equivalent", "skipped")


def check_file_problem(path: Path) -> str | None:
    """Why an equivalence check file cannot be used, or None (see CheckStore)."""
    try:
        data = CHECK_FILE.read(path).data
    except StoreError as e:
        return str(e)
    if not isinstance(data.get("status"), str):
        return f"{path}: not an equivalence check (no status)"
    return None
