"""`dlbench check`: prove that every framework builds the same network.

For each network: one canonical weight set and one input batch are made from the description alone
(numpy), every framework loads them, runs the forward pass and one SGD-momentum step, and exports
its weights. The check runs in float64 unless asked for fp32 (see "Why float64" below). Compared
across frameworks (each against the reference, the first framework asked for):
  - parameter count built by the framework = count from the description (exactly);
  - the exported initial weights have the canonical names and shapes, and loading then exporting
    gives back exactly what was loaded (the layouts are right both ways);
  - logits and loss (relative error in the max norm) and the weights after one step: in float64 to
    <= TOLERANCE_FLOAT64; in float32 to <= 1e-4 on networks without batch norm and <= 1e-3 with;
  - the update itself (after - loaded, which is what the gradients decide: the weights can hide a
    wrong gradient behind lr * g << w), to the same tolerance: in float64 on every network, in
    float32 on networks without batch norm.
The weights and the update are compared normwise over all trained tensors together,
||a - b||_2 / ||b||_2, the usual relative error of a vector; the update is observed through the
weights, so one unit in the last place of the updated weight (in its precision) is allowed per
element. One float32 step of a deep ReLU/batch-norm network is decided in part by rounding: a
pre-activation within rounding of zero flips a ReLU and moves a few gradient elements a lot.
Measured here: PyTorch against itself at 1 and 2 threads differs by 2.0e-3 in ResNet-50's weights
after one step and 1.0e-2 in its update. So on batch-norm networks the update is reported, not
gated, and the weights' tolerance widens to SPREAD_FACTOR times the reference's own spread (the
reference is run a second time on one thread) where that exceeds 1e-3. The element-wise worst
tensor is reported as a diagnostic.
Relative error of logits/loss: max |a - b| / max |b| (b the reference), floored to avoid 0/0.

Why float64. What float32 leaves to rounding is not only batch norm: on an AMD EPYC (Zen 3) CPU,
JAX's AlexNet update differed from PyTorch's by 3.5e-3 (tolerance 1e-4) while TensorFlow and MXNet
agreed with PyTorch to 7e-7. Every piece of JAX's step matched PyTorch in float64 given the same
input; the whole step did not. conv5's float32 output differs from PyTorch's by 1.2e-6, and in one
of the 18,432 max-pool windows after it the two largest values were within that: the window's
gradient went to another element, and from there through every layer below. Such a flip is a fact
of float32, not of the network, and where it happens depends on the CPU. In float64 (unit roundoff
1.1e-16) no decision of these networks is within rounding, so every framework's step is compared to
TOLERANCE_FLOAT64 on every network, batch norm included, with the update gated too. The networks
and weight layouts are the same in both precisions; float64 only removes rounding as an excuse.
TOLERANCE_FLOAT64 = 1e-9: ResNet-50's step is some 10^2 layers of sums over up to ~10^5 terms, a
worst-case rounding bound near 10^-11 in float64; 1e-9 keeps a hundredfold margin above that and
stays many orders below any difference of definition (an epsilon, a layout, a padding side moves
the results by 1e-6 or more).

Mixed precision (`--precision amp_bf16 | amp_fp16`). Every framework, the reference framework
included, takes one step in the mixed precision, and is compared with the reference framework's
float64 step (the truth, to 1e-13, once the float64 check has passed). float32 weights and
float32 accumulation leave the compute format's unit roundoff u (bfloat16 2^-8 = 3.9e-3, float16
2^-11 = 4.9e-4) as the dominant error: each operand of a product is rounded once to it. How far
that moves a step depends on the network, so the tolerances are a model of the network, in u:
  - Forward. A layer that multiplies (dense, conv2d, one LSTM step) rounds both operands once:
    about 2u relative error in its output. With L the products in sequence on the longest path from
    input to logits (rounding_depth: an LSTM layer of T steps is T of them, a residual block its
    convolutions; each layer type declares its count in the layer table, definitions/layers/), the
    worst case grows as 2Lu (Higham, "Accuracy and Stability of Numerical Algorithms", section
    3.1), but independent roundings add in quadrature, as 2 sqrt(L) u (Higham
    and Mary, "A new approach to probabilistic rounding error analysis", SISC 2019); the largest of
    a batch's logits reaches some 4 standard deviations. Logits, loss and the weights after the
    step are held to 8 sqrt(L) u.
  - Backward: the update passes every product twice more (the gradients of its input and of its
    weights), 8 sqrt(3L) u; and, unlike the forward pass, it is not smooth in the rounding: a ReLU
    whose pre-activation lies within rounding of zero, or a max-pool window whose two largest
    values do, goes either way, and the gradient below it then moves by the whole of that unit's
    signal. The fraction of such units is about the pre-activation's relative error (~2u for
    roughly Gaussian pre-activations), so R such decisions on the path (decision_depth) move the
    update normwise by about sqrt(2 u R): an error of order sqrt(u), not u. The update is held to
    8 sqrt(3L) u + sqrt(2 u R).
  Measured in torch, JAX and TensorFlow against float64 on an AMD EPYC (Zen 3) CPU in bfloat16, as
  a fraction of these tolerances: logits 0.03-0.47 (ResNet-50 0.34-0.47, AlexNet 0.06-0.15,
  FCN-5 0.06-0.15), the update of AlexNet 0.20-0.23 (layer by layer, in torch, it grows from 1.4u
  at the last dense layer, below one ReLU, to 62u at the first convolution, below ten decisions),
  of AlexNet-R and FCN-5 0.10 or less. A flat 8u, as first tried, failed AlexNet's update and
  ResNet-50's logits in every framework alike: it judged the format, not the frameworks. With
  batch norm the update is reported, not gated: the batch statistics of a 2-4 sample batch make
  one step ill-conditioned (below its last block ResNet-50's update differs by ~300u, in torch,
  JAX and TensorFlow alike).
  What the gate still catches is what a wrong mixed-precision step does: master weights kept in the
  compute format (updates below its ulp vanish), a loss scale not undone (the update off by a power
  of two), a layer left out of the cast on one side only where it changes the step by more.

Results are kept in STORE/checks/ (one JSON per network, framework and framework version, written
atomically) so that every run record can carry the equivalence status of what it measured.

By default `dlbench run` makes the checks it lacks before it times anything (`ensure_checks`): for
every (network, framework version, check precision) of its plan with no stored check (the same
network definition hash; a failed or skipped check counts as stored, so a framework that cannot run
a precision is not asked again until its version changes), it runs one check of that network with
the reference framework first (torch where a torch runner exists, whether or not the run includes
it, else the run's first framework) and the frameworks lacking it after. So `dlbench run
--framework jax` is judged against torch; a run of the reference framework alone can only show
that it builds the described network (parameters, canonical weights both ways, a finite step),
and its status says "reference". The framework version is learned first from a worker that does
nothing but report its framework (a `kernels` request with no kernels): the stored checks are per
version.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np

from ..axes import CHECK_PRECISION, Precision
from ..definitions import layers
from ..definitions.network import NetworkSummary
from ..definitions.weights import random_weights, trainable_count, weight_shapes
from ..store.checks import CheckStore, FrameworkCheck, check_precisions
from .environments import Environment, EnvironmentBuildError
from .interrupts import temporary_folder
from .launcher import PROTOCOL_VERSION, run_worker
from .registry import RunnerInfo

TOLERANCE_PLAIN = 1e-4
TOLERANCE_BATCH_NORM = 1e-3
TOLERANCE_FLOAT64 = 1e-9
# Mixed precision against the float64 step, in the compute format's unit roundoff (bfloat16 2^-8,
# float16 2^-11) scaled by the network's depth; see "Mixed precision" in the docstring.
UNIT_ROUNDOFF = {p.value: p.unit_roundoff for p in Precision if p.mixed}
PRECISIONS = (CHECK_PRECISION, Precision.FP32.value, *UNIT_ROUNDOFF)
# A framework need not agree with the reference better than the reference agrees with itself when
# only its thread count changes (summation order): the weights' tolerance widens to this many times
# that measured spread where it exceeds the tolerance.
SPREAD_FACTOR = 3.0
_FLOOR = 1e-12


def uses_batch_norm(network: NetworkSummary) -> bool:
    return any(layer["type"] in ("batch_norm", "residual") for layer in network.resolved["layers"])


def rounding_depth(network: NetworkSummary) -> int:
    """Products (dense, conv2d, LSTM steps, attention's) in sequence on the longest path from input
    to logits: the sum of what the layer table declares for each resolved entry."""
    return sum(layers.lookup(entry["type"]).rounding_depth_of(entry) for entry in network.resolved["layers"])


def decision_depth(network: NetworkSummary) -> int:
    """ReLUs and max-pools on the path: where rounding can send the gradient elsewhere (a transformer
    has none: GELU, softmax and layer norm are smooth); as the layer table declares them."""
    return sum(layers.lookup(entry["type"]).decisions_of(entry) for entry in network.resolved["layers"])


def mixed_tolerances(network: NetworkSummary, precision: str) -> dict[str, float]:
    """What a mixed-precision step may differ from float64 by, per quantity (the docstring's model)."""
    u = UNIT_ROUNDOFF[precision]
    depth = rounding_depth(network)
    forward = 8 * np.sqrt(depth) * u
    update = 8 * np.sqrt(3 * depth) * u + np.sqrt(2 * u * decision_depth(network))
    return {"logits": float(forward), "loss": float(forward), "weights": float(forward), "update": float(update)}


def tolerance_for(network: NetworkSummary, precision: str = "fp32") -> float:
    """The tolerance of logits and loss (and, but for mixed precision's update, of every quantity)."""
    if precision == "float64":
        return TOLERANCE_FLOAT64
    if precision in UNIT_ROUNDOFF:
        return mixed_tolerances(network, precision)["logits"]
    return TOLERANCE_BATCH_NORM if uses_batch_norm(network) else TOLERANCE_PLAIN


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    scale = max(float(np.max(np.abs(b))) if b.size else 0.0, _FLOOR)
    with np.errstate(invalid="ignore"):
        err = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
    return err if np.isfinite(err) else float("inf")  # a NaN or inf is never within any tolerance


def _update_excess(after, loaded, ref_after, ref_loaded) -> tuple[np.ndarray, np.ndarray] | None:
    """(|our update - the reference's| net of one ulp of the updated weight, reference update)."""
    if after.shape != ref_after.shape or loaded.shape != ref_loaded.shape:
        return None
    ours = after.astype(np.float64) - loaded.astype(np.float64)
    theirs = ref_after.astype(np.float64) - ref_loaded.astype(np.float64)
    # one unit in the last place of the updated weight, in the precision it was computed in
    unit = np.float64 if ref_after.dtype == np.float64 else np.float32
    allowance = np.spacing(np.abs(ref_after.astype(unit))).astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.maximum(np.abs(ours - theirs) - allowance, 0.0), theirs


def update_error(after: np.ndarray, loaded: np.ndarray, ref_after: np.ndarray, ref_loaded: np.ndarray) -> float:
    """Relative error (max norm) of one tensor's update against the reference's, net of float32 resolution."""
    pair = _update_excess(after, loaded, ref_after, ref_loaded)
    if pair is None:
        return float("inf")
    excess, theirs = pair
    scale = max(float(np.max(np.abs(theirs))) if theirs.size else 0.0, _FLOOR)
    err = float(np.max(excess)) / scale if excess.size else 0.0
    return err if np.isfinite(err) else float("inf")


def normwise_error(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """||a - b||_2 / ||b||_2 over all the tensors together: the usual normwise relative error."""
    if any(a.shape != b.shape for a, b in zip(ours, theirs)) or len(ours) != len(theirs):
        return float("inf")
    num = sum(float(np.sum((a.astype(np.float64) - b.astype(np.float64)) ** 2)) for a, b in zip(ours, theirs))
    den = sum(float(np.sum(b.astype(np.float64) ** 2)) for b in theirs)
    err = np.sqrt(num) / max(np.sqrt(den), _FLOOR)
    return float(err) if np.isfinite(err) else float("inf")


def update_normwise_error(after: dict, loaded: dict, ref_after: dict, ref_loaded: dict, names: list[str]) -> float:
    """Normwise relative error of the whole update (all trained tensors), net of float32 resolution."""
    excess_sq = ref_sq = 0.0
    missing = np.empty(0)
    for n in names:
        pair = _update_excess(after.get(n, missing), loaded.get(n, missing), ref_after[n], ref_loaded[n])
        if pair is None:
            return float("inf")
        excess, theirs = pair
        excess_sq += float(np.sum(excess ** 2))
        ref_sq += float(np.sum(theirs ** 2))
    err = np.sqrt(excess_sq) / max(np.sqrt(ref_sq), _FLOOR)
    return float(err) if np.isfinite(err) else float("inf")


def check_batch_size(network: NetworkSummary) -> int:
    return 2 if network.flops_per_sample > 1e9 else 4


def make_inputs(network: NetworkSummary, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    inp = network.resolved["input"]
    if inp["kind"] == "tokens":
        shape = (batch, inp["sequence_length"])
        return {"x": rng.integers(0, inp["vocabulary"], shape, dtype=np.int64),
                "y": rng.integers(0, inp["vocabulary"], shape, dtype=np.int64)}
    if inp["kind"] == "masked_tokens":  # y: the masked positions' tokens, then the next-sentence label
        masked = len(inp["masked_positions"])
        y = rng.integers(0, inp["vocabulary"], (batch, masked + 1), dtype=np.int64)
        y[:, masked] = rng.integers(0, 2, batch)
        return {"x": rng.integers(0, inp["vocabulary"], (batch, inp["sequence_length"]), dtype=np.int64), "y": y}
    return {"x": rng.standard_normal((batch, *inp["shape"])).astype(np.float32),
            "y": rng.integers(0, inp["classes"], (batch,), dtype=np.int64)}


def _probe(runner: RunnerInfo, env: Environment, network: NetworkSummary, workdir: Path, device: str,
           timeout_s: float, weights_path: Path, inputs_path: Path, batch: int,
           threads: int | None = None, learning_rate: float = 0.1,
           momentum: float = 0.9, precision: str = "float64") -> tuple[dict | None, str | None, str]:
    outputs = workdir / f"{runner.name}-{threads}-outputs.npz"
    request = {
        "protocol": PROTOCOL_VERSION, "action": "check", "network": network.resolved, "mode": "train",
        "batch_size": batch, "precision": precision, "device": device, "threads": threads,
        "learning_rate": learning_rate, "momentum": momentum, "seed": 0, "deterministic": True,
        "inputs": str(inputs_path), "weights_in": str(weights_path), "outputs": str(outputs),
    }
    outcome = run_worker(env.python, runner.worker, request, timeout_s, container=env.container,
                         shared_dirs=(workdir,))
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
                  device: str = "cpu", timeout_s: float = 900, seed: int = 0, learning_rate: float = 0.1,
                  momentum: float = 0.9, precision: str = "float64") -> list[FrameworkCheck]:
    """The step uses the learning rate and momentum the network is trained with in its suite."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: the check runs in {' or '.join(PRECISIONS)}")
    hyper = {"learning_rate": learning_rate, "momentum": momentum, "precision": precision}
    shapes = weight_shapes(network.resolved)
    tol = tolerance_for(network, precision)
    batch = check_batch_size(network)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results: list[FrameworkCheck] = []
    reference: dict | None = None
    mixed = precision in UNIT_ROUNDOFF
    # (runner, env, precision of its step, whether it may become the reference). Mixed precision is
    # judged against the first framework's float64 step, which is not itself a result; every
    # framework, that one included, then runs in the mixed precision.
    probes = ([(*runners[0], "float64", True)] if mixed and runners else []) + \
        [(runner, env, precision, not mixed) for runner, env in runners]
    no_reference = "no framework gave a usable reference step"
    with temporary_folder("dlbench-check-") as work:
        weights = random_weights(network.resolved, seed)
        np.savez(work / "weights.npz", **weights)
        np.savez(work / "inputs.npz", **make_inputs(network, batch, seed))
        for index, (runner, env, step_precision, may_refer) in enumerate(probes):
            res = FrameworkCheck(network.name, runner.name, None, "failed", params_described=network.params,
                                 tolerance=tol, network_hash=network.definition_hash, checked_at=now,
                                 precision=step_precision)
            if not (mixed and index == 0):
                results.append(res)
            if isinstance(env, EnvironmentBuildError):
                res.reason = str(env)
                continue
            if reference is None and not may_refer:
                res.reason = no_reference
                continue
            arrays, reason, status = _probe(runner, env, network, work, device, timeout_s, work / "weights.npz",
                                            work / "inputs.npz", batch, **{**hyper, "precision": step_precision})
            if arrays is None:
                res.status, res.reason = ("skipped" if status == "skipped" else "failed"), reason
                if mixed and index == 0:
                    no_reference = f"no float64 reference step from {runner.name}: {reason}"
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
            trained = [n for n in shapes if n.rsplit(".", 1)[-1] not in ("running_mean", "running_var")]
            if reference is None:
                outputs = [arrays["logits"], arrays["loss"], *(after[n] for n in trained if n in after)]
                if not all(np.isfinite(a).all() for a in outputs):
                    problems.append("non-finite logits, loss or weights after the step: cannot serve as the reference")
                if any(n not in after or n not in loaded for n in trained):
                    problems.append("not every trained tensor was exported after the step")
                if problems:
                    res.reason = "; ".join(problems)
                    if mixed:
                        no_reference = f"no float64 reference step from {runner.name}: {res.reason}"
                    continue  # a broken reference cannot judge the others; the next one becomes it
                reference = {"logits": arrays["logits"], "loss": arrays["loss"], "after": after, "loaded": loaded,
                             "framework": runner.name if not mixed else f"{runner.name} float64", "spread": 0.0,
                             "label": " ".join(filter(None, (runner.name, res.framework_version,
                                                             "float64" if mixed else None)))}
                res.status = "reference"
                if step_precision == "float64":
                    continue  # rounding decides nothing there: a fixed tolerance, no spread to measure
                # The reference again on one thread: how far rounding alone moves one step.
                again, _, _ = _probe(runner, env, network, work, device, timeout_s, work / "weights.npz",
                                     work / "inputs.npz", batch, threads=1, **hyper)
                if again is not None and all(n in _section(again, "after/") for n in trained):
                    again_after = _section(again, "after/")
                    reference["spread"] = normwise_error([again_after[n] for n in trained], [after[n] for n in trained])
                res.errors["self_spread_weights"] = reference["spread"]
                continue
            res.reference = reference["label"]
            res.errors["logits"] = relative_error(arrays["logits"], reference["logits"])
            res.errors["loss"] = relative_error(arrays["loss"], reference["loss"])
            missing = np.empty(0)
            res.errors["weights"] = normwise_error([after.get(n, missing) for n in trained],
                                                   [reference["after"][n] for n in trained])
            res.errors["update"] = update_normwise_error(after, loaded, reference["after"], reference["loaded"], trained)
            # Where the update differs most, element-wise: a diagnostic, not a gate (see the docstring).
            worst, worst_name = 0.0, None
            for n in trained:
                err = update_error(after.get(n, missing), loaded.get(n, missing), reference["after"][n],
                                   reference["loaded"][n])
                if err > worst:
                    worst, worst_name = err, n
            res.errors["worst_tensor_update"] = worst
            res.worst_tensor = worst_name
            if mixed:
                allowed = mixed_tolerances(network, precision)
                if uses_batch_norm(network):
                    del allowed["update"]  # reported, not gated (see the docstring)
                else:
                    res.errors["allowed_update"] = allowed["update"]
            else:
                allowed = {"logits": tol, "loss": tol, "weights": max(tol, SPREAD_FACTOR * reference["spread"])}
                if precision == "float64" or tol == TOLERANCE_PLAIN:
                    allowed["update"] = tol
            res.errors["allowed_weights"] = allowed["weights"]
            for key, limit in allowed.items():
                if res.errors[key] > limit:
                    problems.append(f"{key} differ from {reference['framework']} by {res.errors[key]:.2e} "
                                    f"(tolerance {limit:.1e})" + (f", most in {worst_name}" if key == "update" else ""))
            res.status = "mismatch" if problems else "equivalent"
            res.reason = "; ".join(problems) or None
    if trainable_count(shapes) != network.params:  # the format and the counter must agree
        raise AssertionError(f"{network.name}: canonical format counts {trainable_count(shapes)} parameters, "
                             f"the description {network.params}")
    return results




# `dlbench check --mode generate`: greedy generation from the canonical weights and one prompt.
GENERATION_PRECISIONS = (Precision.FP32.value, CHECK_PRECISION)


def check_generation(network: NetworkSummary, runners: list[tuple[RunnerInfo, Environment | EnvironmentBuildError]],
                     prompt_length: int, new_tokens: int, device: str = "cpu", timeout_s: float = 900, seed: int = 0,
                     precision: str = "fp32") -> list[FrameworkCheck]:
    """Every framework loads the canonical weights, takes the same prompt (the first `prompt_length`
    ids of make_inputs' batch) and generates `new_tokens` greedily with its own key/value cache;
    each is compared with the reference (the first framework that gives a result):
      - parameter count built = the description's;
      - the logits of the first step (the prompt's last position, before any cache is read back)
        to the forward tolerance of `precision` (TOLERANCE_PLAIN in fp32, TOLERANCE_FLOAT64 in
        float64): the prefill computes what the network's forward pass computes;
      - the generated ids exactly: each later token goes through the cache, so a cache written at
        the wrong row, read with the wrong mask or at the wrong position changes them.
    Greedy ids are a discrete decision: two frameworks within rounding of each other could still
    choose differently where two logits tie within that rounding. The canonical weights are random
    (the description's initialisation scales), whose top logits are far apart compared with float32
    rounding (1e-7 relative), so any difference found is reported with the step and sequence where
    it starts. Results are stored as checks of precision `generate-<precision>`, beside the train
    checks, never standing for a run's equivalence status (that is the network's float64 check)."""
    if precision not in GENERATION_PRECISIONS:
        raise ValueError(f"precision {precision!r}: the generation check runs in {' or '.join(GENERATION_PRECISIONS)}")
    tol = TOLERANCE_FLOAT64 if precision == "float64" else TOLERANCE_PLAIN
    batch = check_batch_size(network)
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results: list[FrameworkCheck] = []
    reference: dict | None = None
    with temporary_folder("dlbench-check-") as work:
        np.savez(work / "weights.npz", **random_weights(network.resolved, seed))
        np.savez(work / "inputs.npz", **make_inputs(network, batch, seed))
        for runner, env in runners:
            res = FrameworkCheck(network.name, runner.name, None, "failed", params_described=network.params,
                                 tolerance=tol, network_hash=network.definition_hash, checked_at=now,
                                 precision=f"generate-{precision}")
            results.append(res)
            if isinstance(env, EnvironmentBuildError):
                res.reason = str(env)
                continue
            outputs = work / f"{runner.name}-generate.npz"
            request = {
                "protocol": PROTOCOL_VERSION, "action": "check", "mode": "generate", "network": network.resolved,
                "batch_size": batch, "precision": precision, "device": device, "threads": None, "seed": seed,
                "learning_rate": 0.01, "momentum": 0.9,  # unused by generation; runners build their optimiser alike
                "deterministic": True, "inputs": str(work / "inputs.npz"), "weights_in": str(work / "weights.npz"),
                "outputs": str(outputs), "generation": {"prompt_length": prompt_length, "new_tokens": new_tokens},
            }
            outcome = run_worker(env.python, runner.worker, request, timeout_s, container=env.container,
                                 shared_dirs=(work,))
            if outcome.status != "ok":
                res.status = "skipped" if outcome.status == "skipped" else "failed"
                res.reason = outcome.reason
                continue
            res.framework_version = (outcome.result.get("framework") or {}).get("version")
            res.params = outcome.result.get("params")
            with np.load(outputs) as data:
                tokens, logits = data["tokens"], data["first_logits"]
            problems = []
            if res.params != network.params:
                problems.append(f"built {res.params} parameters, the description has {network.params}")
            vocabulary = network.resolved["input"]["vocabulary"]
            if tokens.shape != (batch, new_tokens) or logits.shape != (batch, vocabulary):
                problems.append(f"tokens {tokens.shape} and first logits {logits.shape}, expected "
                                f"{(batch, new_tokens)} and {(batch, vocabulary)}")
            if reference is None:
                if not problems and not np.isfinite(logits).all():
                    problems.append("non-finite first-step logits: cannot serve as the reference")
                if problems:
                    res.reason = "; ".join(problems)
                    continue  # a broken reference cannot judge the others; the next one becomes it
                reference = {"tokens": tokens, "logits": logits, "framework": runner.name,
                             "label": " ".join(filter(None, (runner.name, res.framework_version)))}
                res.status = "reference"
                continue
            res.reference = reference["label"]
            if not problems:
                res.errors["first_logits"] = relative_error(logits, reference["logits"])
                differ = tokens != reference["tokens"]
                res.errors["token_mismatches"] = float(np.count_nonzero(differ))
                if res.errors["first_logits"] > tol:
                    problems.append(f"first-step logits differ from {reference['framework']} by "
                                    f"{res.errors['first_logits']:.2e} (tolerance {tol:.1e})")
                if differ.any():
                    step = int(np.argmax(differ.any(axis=0)))
                    seq = int(np.argmax(differ[:, step]))
                    problems.append(f"{int(differ.sum())} of {differ.size} generated ids differ from "
                                    f"{reference['framework']}'s, first at new token {step} of sequence {seq} "
                                    f"({int(tokens[seq, step])} against {int(reference['tokens'][seq, step])})")
            res.status = "mismatch" if problems else "equivalent"
            res.reason = "; ".join(problems) or None
    return results


def framework_version(runner: RunnerInfo, env: Environment, device: str,
                      timeout_s: float = 300) -> tuple[str | None, str | None]:
    """(version, None) as the runner's worker reports it, or (None, why not): a `kernels` request
    without kernels, which imports the framework and answers with its framework_info only."""
    request = {"protocol": PROTOCOL_VERSION, "action": "kernels", "device": device, "threads": None, "seed": 0,
               "kernel_policy": {"warmup_iters": 0, "min_iters": 1, "min_time_s": 0.0, "max_iters": 1,
                                 "flush_bytes": 0}, "kernels": []}
    outcome = run_worker(env.python, runner.worker, request, timeout_s, container=env.container)
    version = ((outcome.result or {}).get("framework") or {}).get("version")
    if isinstance(version, str) and version:
        return version, None
    return None, outcome.reason or f"{runner.name} reported no framework version"


@dataclass(frozen=True)
class CheckWanted:
    """A planned run's need: its network checked on its framework in its precision's checks."""
    runner: RunnerInfo
    network: NetworkSummary
    precision: str  # the run's (fp32, tf32, amp_bf16, amp_fp16)
    learning_rate: float
    momentum: float


@dataclass
class CheckMade:
    """One check `ensure_checks` ran: a network in one precision, the reference and the frameworks
    that lacked it, its results (saved) and what it cost."""
    network: str
    precision: str
    frameworks: list[str]
    seconds: float
    results: list[FrameworkCheck] = field(default_factory=list)
    error: str | None = None  # the check itself could not be made (its frameworks stay unchecked)


def ensure_checks(wanted: list[CheckWanted], environment: Callable[[RunnerInfo], Environment | EnvironmentBuildError],
                  checks: CheckStore, device: str, reference: RunnerInfo | None = None, timeout_s: float = 900,
                  on_check: Callable[[str, str, list[str]], None] | None = None) -> tuple[list[CheckMade], float]:
    """Make every check `wanted` lacks (see the module docstring) and save it; ([checks made], seconds
    spent, version probes included). `reference`: the framework every check is made against (None:
    the first of each check's frameworks). A framework whose environment or version cannot be had is
    left out: its runs will fail or be skipped, and say so themselves."""
    started = time.perf_counter()
    versions: dict[str, str | None] = {}

    def usable(runner: RunnerInfo) -> Environment | None:
        env = environment(runner)
        if isinstance(env, EnvironmentBuildError):
            return None
        if runner.name not in versions:
            versions[runner.name] = framework_version(runner, env, device, min(timeout_s, 300))[0]
        return env if versions[runner.name] else None

    groups: dict[tuple, dict] = {}
    for w in wanted:
        if usable(w.runner) is None:
            continue
        for precision in check_precisions(w.precision):
            key = (w.network.name, w.network.definition_hash, precision)
            group = groups.setdefault(key, {"network": w.network, "lr": w.learning_rate, "momentum": w.momentum,
                                            "runners": {}})
            if not checks.has(w.network.name, w.network.definition_hash, w.runner.name, versions[w.runner.name],
                              precision):
                group["runners"].setdefault(w.runner.name, w.runner)
    made: list[CheckMade] = []
    for (name, _, precision), group in groups.items():
        lacking = list(group["runners"].values())
        if not lacking:
            continue
        order = ([reference] if reference is not None and reference.name not in group["runners"] else []) + \
            sorted(lacking, key=lambda r: reference is None or r.name != reference.name)
        envs = [(r, env) for r in order if (env := usable(r)) is not None]
        if on_check is not None:
            on_check(name, precision, [r.name for r, _ in envs])
        t0 = time.perf_counter()
        try:
            results = check_network(group["network"], envs, device, timeout_s, learning_rate=group["lr"],
                                    momentum=group["momentum"], precision=precision)
            error = None
        except (AssertionError, ValueError, OSError) as e:  # the check cannot be made: nobody is judged by it
            results, error = [], f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        for res in results:
            res.framework_version = res.framework_version or versions.get(res.framework)
            res.check_s = round(seconds, 3)
            res.checked_by = "dlbench run"
            checks.save(res)
        made.append(CheckMade(name, precision, [r.name for r, _ in envs], seconds, results, error))
    return made, time.perf_counter() - started
