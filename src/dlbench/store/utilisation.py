"""Model FLOPs, achieved model FLOP/s, MFU and tokens/s of a run: derived, never stored.

Everything here is computed from a record's own fields and, for MFU, from the machine profile of
the machine the run was on (`dlbench calibrate`, store/profiles.py). Nothing is written into the
record, so a profile calibrated after a run still gives that run its MFU, and a better profile
changes it without a migration.

- model FLOPs per iteration: the network's analytical forward FLOPs per sample (definitions:
  a multiply-add = 2) x batch size x 3 for training (forward + backward, the backward counted as
  twice the forward: one product for the input gradient and one for the weight gradient, the
  convention of model FLOPs utilisation as PaLM and MLPerf report it; the optimiser's update and
  recomputation are not counted) or x 1 for inference.
- model TFLOP/s: model FLOPs per iteration / median iteration time, in 1e12 FLOP/s.
- MFU: model FLOP/s / the profile's measured peak matmul FLOP/s in the run's precision (fp32 ->
  float32, amp_bf16 -> bfloat16, amp_fp16 -> float16), as a fraction (0.42 = 42%). No ceiling is
  measured for tf32 (calibrate's float32 kernels run with TF32 off), so a tf32 run has none; where
  there is no MFU, `mfu_reason` says why.
- tokens/s: samples/s x sequence length, for networks whose input kind is "tokens".
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..axes import KERNEL_DTYPE
from .profiles import MachineProfile, ProfileError, ProfileStore
from .store import Store

# forward + backward = 1 + 2 forwards (see the module docstring)
TRAIN_FLOPS_FACTOR = 3
MODE_FLOPS_FACTOR = {"train": TRAIN_FLOPS_FACTOR, "infer": 1}

# the dtype whose matmul ceiling bounds a run of each precision; tf32 is absent on purpose
PRECISION_DTYPE = KERNEL_DTYPE


def model_flops_per_iter(mode: str, batch_size: int, flops_per_sample: int | None) -> int | None:
    """None for a collective (no network) or a description without FLOPs."""
    factor = MODE_FLOPS_FACTOR.get(mode)
    if factor is None or not flops_per_sample:
        return None
    return int(flops_per_sample) * int(batch_size) * factor


def model_tflops(flops_per_iter: int | None, median_s: float | None) -> float | None:
    if flops_per_iter is None or not median_s:
        return None
    return flops_per_iter / median_s / 1e12


def tokens_per_s(definition: dict[str, Any], samples_per_s: float | None) -> float | None:
    """samples/s x sequence length for a token network (its resolved input); None for the others."""
    inp = definition.get("input") if isinstance(definition, dict) else None
    if samples_per_s is None or not isinstance(inp, dict) or inp.get("kind") not in ("tokens", "masked_tokens"):
        return None
    length = inp.get("sequence_length")
    return samples_per_s * length if isinstance(length, int) else None


class Mfu(NamedTuple):
    mfu: float | None
    reason: str | None  # why there is no MFU (None when there is one, or nothing was measured)
    peak_tflops: float | None = None  # the ceiling divided by, and where it comes from
    source: str | None = None


class Peaks:
    """MFU of runs against the machine profiles of one store, each profile read once per
    (machine, device, threads): the profile `dlbench predict` and `kernels` would use for the run
    (ProfileStore.latest_matching: the newest with the run's threads, else the newest on its device)."""

    def __init__(self, store: Store | None):
        self.profiles = ProfileStore(store) if store is not None else None
        self._found: dict[tuple, tuple[MachineProfile | None, str | None]] = {}

    def _profile(self, machine_id: str, device: str, threads: int | None) -> tuple[MachineProfile | None, str | None]:
        key = (machine_id, device, threads)
        if key not in self._found:
            if self.profiles is None or not machine_id:
                self._found[key] = (None, "no profile")
            else:
                try:
                    found = self.profiles.latest_matching(machine_id, device, threads)
                    self._found[key] = (found, None if found else
                                        f"no profile of machine {machine_id[:12]} for {device} (`dlbench calibrate` makes one)")
                except ProfileError as e:
                    self._found[key] = (None, f"no profile: it cannot be read ({e})")
        return self._found[key]

    def mfu(self, *, tflops: float | None, precision: str, machine_id: str, device: str, threads: int | None,
            workers: int | None = None) -> Mfu:
        if tflops is None:
            return Mfu(None, None)  # nothing measured, or no model FLOPs: status and reason say why
        if workers is not None and workers > 1:
            return Mfu(None, f"{workers} workers: a machine profile's peak is one machine's, not the job's")
        dtype = PRECISION_DTYPE.get(precision)
        if dtype is None:
            why = ("no TF32 ceiling is measured (calibrate's float32 matmuls run with TF32 off)" if precision == "tf32"
                   else "no ceiling is measured for this precision")
            return Mfu(None, f"{precision}: {why}")
        profile, why = self._profile(machine_id, device, threads)
        if profile is None:
            return Mfu(None, why)
        ceiling = profile.matmul_peak.get(dtype)  # no float32 fallback (peak_flops has one): a wrong peak
        if ceiling is None or not ceiling.flops_per_s:
            return Mfu(None, f"profile {profile.ref} has no {dtype} matmul ceiling "
                             "(none is measured where the device only emulates it)")
        peak = ceiling.flops_per_s / 1e12
        return Mfu(tflops / peak, None, peak, f"{dtype} matmul peak {peak:.4g} TFLOP/s ({ceiling.framework}) "
                                              f"of profile {profile.ref}")

    def attach(self, row: dict) -> dict:
        """Fill a row's `mfu` and `mfu_reason` (rows.run_row leaves them empty: the row index caches
        rows, and a cached row must not depend on the profiles)."""
        found = self.mfu(tflops=row.get("model_tflops"), precision=str(row.get("precision")),
                         machine_id=str(row.get("machine_id") or ""), device=str(row.get("device")),
                         threads=row.get("threads"), workers=row.get("workers"))
        row["mfu"], row["mfu_reason"] = found.mfu, found.reason
        return row
