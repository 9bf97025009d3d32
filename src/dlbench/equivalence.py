"""`dlbench check`: prove that every framework builds the same network.

For each network: one canonical weight set and one input batch are made from the description alone
(numpy), every framework loads them, runs the forward pass and one SGD-momentum step, and exports
its weights. Compared across frameworks (each against the reference, the first framework asked
for):
  - parameter count built by the framework = count from the description (exactly);
  - the exported initial weights have the canonical names and shapes, and loading then exporting
    gives back exactly what was loaded (the layouts are right both ways);
  - logits and loss, and the update of every weight after one step (after - loaded, which is what
    the gradients decide; comparing the weights themselves would hide a wrong gradient behind
    lr * g << w), to a relative error <= 1e-4 on networks without batch norm and <= 1e-3 with.
Relative error of a tensor: max |a - b| / max |b| (b the reference), floored to avoid 0/0.

Results are kept in STORE/checks/ (one JSON per network, framework and framework version, written
atomically) so that every run record can carry the equivalence status of what it measured.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .definitions.analysis import NetworkSummary
from .definitions.weights import random_weights, trainable_count, weight_shapes
from .execution.environments import Environment, EnvironmentBuildError
from .execution.launcher import PROTOCOL_VERSION, run_worker
from .execution.registry import RunnerInfo

TOLERANCE_PLAIN = 1e-4
TOLERANCE_BATCH_NORM = 1e-3
_FLOOR = 1e-12


def tolerance_for(network: NetworkSummary) -> float:
    uses_bn = any(layer["type"] in ("batch_norm", "residual") for layer in network.resolved["layers"])
    return TOLERANCE_BATCH_NORM if uses_bn else TOLERANCE_PLAIN


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, _FLOOR)
    with np.errstate(invalid="ignore"):
        err = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
    return err if np.isfinite(err) else float("inf")  # a NaN or inf is never within any tolerance


def check_batch_size(network: NetworkSummary) -> int:
    return 2 if network.flops_per_sample > 1e9 else 4


def make_inputs(network: NetworkSummary, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    inp = network.resolved["input"]
    if inp["kind"] == "tokens":
        shape = (batch, inp["sequence_length"])
        return {"x": rng.integers(0, inp["vocabulary"], shape, dtype=np.int64),
                "y": rng.integers(0, inp["vocabulary"], shape, dtype=np.int64)}
    return {"x": rng.standard_normal((batch, *inp["shape"])).astype(np.float32),
            "y": rng.integers(0, inp["classes"], (batch,), dtype=np.int64)}


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

    @property
    def ok(self) -> bool:
        return self.status in ("reference", "equivalent", "skipped")


def _probe(runner: RunnerInfo, env: Environment, network: NetworkSummary, workdir: Path, device: str,
           timeout_s: float, weights_path: Path, inputs_path: Path, batch: int) -> tuple[dict | None, str | None, str]:
    outputs = workdir / f"{runner.name}-outputs.npz"
    request = {
        "protocol": PROTOCOL_VERSION, "action": "check", "network": network.resolved, "mode": "train",
        "batch_size": batch, "precision": "float32", "device": device, "threads": None,
        "learning_rate": 0.1, "momentum": 0.9, "seed": 0, "deterministic": True,
        "inputs": str(inputs_path), "weights_in": str(weights_path), "outputs": str(outputs),
    }
    outcome = run_worker(env.python, runner.worker, request, timeout_s)
    if outcome.status != "ok":
        return None, outcome.reason, outcome.status
    with np.load(outputs) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["__params__"] = outcome.result.get("params")
    arrays["__version__"] = outcome.result.get("framework", {}).get("version")
    return arrays, None, "ok"


def _section(arrays: dict, prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def check_network(network: NetworkSummary, runners: list[tuple[RunnerInfo, Environment | EnvironmentBuildError]],
                  device: str = "cpu", timeout_s: float = 900, seed: int = 0) -> list[FrameworkCheck]:
    shapes = weight_shapes(network.resolved)
    tol = tolerance_for(network)
    batch = check_batch_size(network)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results: list[FrameworkCheck] = []
    reference: dict | None = None
    with tempfile.TemporaryDirectory(prefix="dlbench-check-") as tmp:
        work = Path(tmp)
        weights = random_weights(network.resolved, seed)
        np.savez(work / "weights.npz", **weights)
        np.savez(work / "inputs.npz", **make_inputs(network, batch, seed))
        for runner, env in runners:
            res = FrameworkCheck(network.name, runner.name, None, "failed", params_described=network.params,
                                 tolerance=tol, network_hash=network.definition_hash, checked_at=now)
            results.append(res)
            if isinstance(env, EnvironmentBuildError):
                res.reason = str(env)
                continue
            arrays, reason, status = _probe(runner, env, network, work, device, timeout_s,
                                            work / "weights.npz", work / "inputs.npz", batch)
            if arrays is None:
                res.status, res.reason = ("skipped" if status == "skipped" else "failed"), reason
                continue
            res.framework_version = arrays.pop("__version__")
            res.params = arrays.pop("__params__")
            problems = []
            if res.params != network.params:
                problems.append(f"built {res.params} parameters, the description has {network.params}")
            init = _section(arrays, "init/")
            bad_shapes = [n for n, s in shapes.items() if n not in init or tuple(init[n].shape) != tuple(s)]
            extra = sorted(set(init) - set(shapes))
            if bad_shapes or extra:
                problems.append(f"exported weights do not match the canonical format: "
                                f"{(bad_shapes + extra)[:4]}")
            loaded = _section(arrays, "loaded/")
            roundtrip = max((relative_error(loaded.get(n, np.empty(0)), w) for n, w in weights.items()), default=0.0)
            res.errors["roundtrip"] = roundtrip
            if roundtrip > 1e-6:
                problems.append(f"load then export changes the weights (relative error {roundtrip:.2e})")
            after = _section(arrays, "after/")
            update = {n: after[n] - loaded[n] for n in after if n in loaded}
            if reference is None:
                outputs = [arrays["logits"], arrays["loss"], *update.values()]
                if not all(np.isfinite(a).all() for a in outputs):
                    problems.append("non-finite logits, loss or update: cannot serve as the reference")
                if problems:
                    res.reason = "; ".join(problems)
                    continue  # a broken reference cannot judge the others; the next one becomes it
                reference = {"logits": arrays["logits"], "loss": arrays["loss"], "update": update,
                             "framework": runner.name}
                res.status = "reference"
                continue
            res.errors["logits"] = relative_error(arrays["logits"], reference["logits"])
            res.errors["loss"] = relative_error(arrays["loss"], reference["loss"])
            worst, worst_name = 0.0, None
            for name, ref_update in reference["update"].items():
                if name.rsplit(".", 1)[-1] in ("running_mean", "running_var"):
                    continue  # statistics, not trained weights
                err = relative_error(update.get(name, np.empty(0)), ref_update)
                if err > worst:
                    worst, worst_name = err, name
            res.errors["update"] = worst
            res.worst_tensor = worst_name
            for key in ("logits", "loss", "update"):
                if res.errors[key] > tol:
                    problems.append(f"{key} differ from {reference['framework']} by {res.errors[key]:.2e} "
                                    f"(tolerance {tol:g})" + (f", worst {worst_name}" if key == "update" else ""))
            res.status = "mismatch" if problems else "equivalent"
            res.reason = "; ".join(problems) or None
    if trainable_count(shapes) != network.params:  # the format and the counter must agree
        raise AssertionError(f"{network.name}: canonical format counts {trainable_count(shapes)} parameters, "
                             f"the description {network.params}")
    return results


class CheckStore:
    """STORE/checks/<network>--<framework>--<version>.json: the latest check of each."""

    def __init__(self, store_root: Path):
        self.root = Path(store_root) / "checks"

    def _path(self, network: str, framework: str, version: str | None) -> Path:
        safe = "".join(c if c.isalnum() or c in "._+-" else "_" for c in f"{network}--{framework}--{version}")
        return self.root / f"{safe}.json"

    def save(self, result: FrameworkCheck) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(result.network, result.framework, result.framework_version)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(result), indent=1))
        os.replace(tmp, path)

    def status(self, network: str, network_hash: str, framework: str, version: str | None) -> dict:
        """What a run record says about equivalence: the status of the matching check, if any."""
        path = self._path(network, framework, version)
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
                "errors": data.get("errors", {})}
