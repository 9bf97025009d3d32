"""The precision axis in the JAX runner: the request's precision (runners/common/contract.py
Precision), the flax compute dtype each one means, jax's matmul-precision flag and
NVIDIA_TF32_OVERRIDE pinned for it and read back, and amp_fp16's dynamic loss scaling rule (the
step that applies it is step.py's TrainingModel.update).
"""

from __future__ import annotations

from runners.common.contract import Precision
from runners.common.protocol import Skip
from runners.jax.framework import load_jax

# every precision, the check's float64 included
ACCEPTED_PRECISIONS = tuple(Precision)
# flax's own mixed precision: the modules' `dtype` is the computation's, their parameters stay float32
COMPUTE_DTYPE = {"fp32": "float32", "tf32": "float32", "amp_bf16": "bfloat16", "amp_fp16": "float16",
                 "float64": "float64"}
# jax_default_matmul_precision (dots and convolutions on 32-bit inputs): TF32 in tf32 only; every
# other precision pins float32 dots at full precision (what is left in float32 under amp too)
MATMUL_PRECISION = {"tf32": "tensorfloat32"}
FULL_MATMUL_PRECISION = "highest"
# NVIDIA_TF32_OVERRIDE=0 switches TF32 off in cuBLAS and cuDNN whatever the caller asks; read when
# the CUDA libraries load, so the runner sets it before jax creates its CUDA backend (runner.py)
TF32_OVERRIDE_VAR = "NVIDIA_TF32_OVERRIDE"
TF32_MIN_COMPUTE_CAPABILITY = 8.0
TF32_ON_CPU = ("tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
               "this run is on the CPU")
# Dynamic loss scaling of amp_fp16 (jmp is not in the environment; these are jmp's and torch
# GradScaler's rule): the loss is multiplied by the scale, the gradients divided by it; a step with
# a non-finite gradient leaves weights and momentum as they were and halves the scale; after
# LOSS_SCALE_GROWTH_INTERVAL finite steps in a row the scale doubles.
LOSS_SCALE_INITIAL = 2.0 ** 15
LOSS_SCALE_GROWTH_INTERVAL = 2000
LOSS_SCALE_FACTOR = 2.0
LOSS_SCALING = (f"dynamic, in the jitted train step (jax/optax primitives; jmp is not installed): loss x scale, "
                f"gradients / scale in float32, a non-finite gradient skips the update and divides the scale by "
                f"{LOSS_SCALE_FACTOR:g}, {LOSS_SCALE_GROWTH_INTERVAL} finite steps in a row multiply it by "
                f"{LOSS_SCALE_FACTOR:g}")


def request_precision(request: dict) -> Precision:
    """The request's precision, or one ValueError naming it and the accepted ones."""
    return Precision.parse(request.get("precision", "fp32"), who="jax runner", accepted=ACCEPTED_PRECISIONS)


def compute_dtype(precision: str):
    """The jax.numpy dtype flax's modules compute in under `precision` (their `dtype`)."""
    import jax.numpy as jnp

    return getattr(jnp, COMPUTE_DTYPE[precision])


def tf32_override(precision: str) -> str | None:
    """NVIDIA_TF32_OVERRIDE's value for a precision on CUDA: "0" (TF32 off) but for tf32 (unset)."""
    return None if precision == "tf32" else "0"


def pin_precision(precision: str, device: str) -> None:
    """Sets jax's flags for `precision` (before anything is traced); Skip where the device cannot."""
    jax = load_jax()
    if precision == "tf32":
        if device != "cuda":
            raise Skip(TF32_ON_CPU)
        gpu = jax.local_devices(backend="gpu")[0]
        capability = getattr(gpu, "compute_capability", None)
        if capability is None or float(capability) < TF32_MIN_COMPUTE_CAPABILITY:
            raise Skip(f"tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
                       f"this GPU ({gpu.device_kind}) has compute capability {capability}")
    if precision == "float64":
        # The equivalence check's precision (one step of a ReLU network is not decided by
        # rounding there). jax computes in float32 unless x64 is on; parameters, batch
        # statistics, the optimiser's trace and the input are then float64 too (host_*).
        jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION.get(precision, FULL_MATMUL_PRECISION))


def precision_flags() -> dict:
    """jax's precision flags as jax reports them now."""
    import os

    jax = load_jax()
    return {"jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
            "jax_enable_x64": bool(jax.config.jax_enable_x64),
            TF32_OVERRIDE_VAR: os.environ.get(TF32_OVERRIDE_VAR)}

