"""The torch runner's precision axis (contract.Precision): the request's precision checked once,
torch's float32 math pinned per precision and read back, the storage precision of `dlbench check`,
and mixed precision (torch.autocast, torch.amp.GradScaler).
"""

from __future__ import annotations

import contextlib

from runners.common.contract import CHECK_PRECISION, PRECISIONS, Precision
from runners.common.protocol import Skip
from runners.torch.framework import load_torch

# fp32 (IEEE float32, TF32 and reduced-precision reductions pinned off), tf32 (float32 storage, TF32
# allowed), amp_bf16 / amp_fp16 (torch.autocast; float16 with torch.amp.GradScaler for training) and,
# for `dlbench check` only, float64 (parameters, buffers and a floating input cast: the canonical
# float32 weights and input convert exactly, and rounding decides no ReLU or max-pool).
RUN_PRECISIONS = PRECISIONS + (CHECK_PRECISION,)
AMP_DTYPES = {"amp_bf16": "bfloat16", "amp_fp16": "float16"}
TF32_CAPABILITY = (8, 0)
TF32_NEEDS = "TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer"

# torch's per-backend float32 precision knobs (torch >= 2.9; "none" inherits from the parent): set
# and read back where this torch has them. Each is "ieee" for fp32 and the AMP modes (what autocast
# leaves in float32 stays IEEE), "tf32" for tf32.
FP32_PRECISION_KNOBS = ("fp32_precision", "cuda.matmul.fp32_precision", "cudnn.fp32_precision",
                        "cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision", "mkldnn.fp32_precision",
                        "mkldnn.matmul.fp32_precision", "mkldnn.conv.fp32_precision", "mkldnn.rnn.fp32_precision")
REDUCED_PRECISION_REDUCTIONS = ("cuda.matmul.allow_fp16_reduced_precision_reduction",
                                "cuda.matmul.allow_bf16_reduced_precision_reduction")


def request_precision(request: dict, accepted=RUN_PRECISIONS) -> Precision:
    """The request's precision (fp32 where it names none), or a ValueError naming it and the
    accepted ones (float64 is `dlbench check`'s only: a timed run that may not ask for it passes
    `accepted=PRECISIONS`)."""
    return Precision.parse(request.get("precision", "fp32"), who="torch runner", accepted=accepted)


def _checked(precision) -> Precision:
    """`precision` (a string or a Precision) as one this runner runs, or the same ValueError."""
    return Precision.parse(precision, who="torch runner", accepted=RUN_PRECISIONS)


def _backend_attr(path: str):
    """(object, attribute) of torch.backends.<path>, or None where this torch has no such knob."""
    obj = load_torch().backends
    *parents, name = path.split(".")
    for part in parents:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    try:
        getattr(obj, name)
    except (AttributeError, RuntimeError):
        return None
    return obj, name


def _unavailable(precision: str, device) -> str | None:
    """Why `precision` cannot run on `device` (the run is skipped), or None."""
    torch = load_torch()
    if precision == "tf32":
        if device.type != "cuda":
            return f"tf32: {TF32_NEEDS}; this run is on the {device.type.upper()}"
        cap = torch.cuda.get_device_capability(device)
        if cap < TF32_CAPABILITY:
            return (f"tf32: {TF32_NEEDS}; {torch.cuda.get_device_name(device)} has compute capability "
                    f"{cap[0]}.{cap[1]}")
    amp = AMP_DTYPES.get(precision)
    if amp and not torch.amp.autocast_mode.is_autocast_available(device.type):
        return f"{precision}: torch.autocast is not available for device type {device.type!r}"
    if precision == "amp_bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        cap = torch.cuda.get_device_capability(device)
        return (f"amp_bf16: {torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]}) has no "
                f"native bfloat16 (torch.cuda.is_bf16_supported(including_emulation=False) is False)")
    return None


def float32_math(precision: str, device) -> dict:
    """Pin torch's float32 math for `precision` on every backend, the same way on the CPU (where TF32
    is a no-op) as on the GPU, and return the flags as torch reports them afterwards. Raises Skip
    where the device cannot run the precision (tf32 off an Ampere-or-newer GPU)."""
    torch = load_torch()
    _checked(precision)
    why = _unavailable(precision, device)
    if why:
        raise Skip(why)
    tf32 = precision == "tf32"
    # the legacy switches first (they also write the new knobs), then the per-backend knobs
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    for path in FP32_PRECISION_KNOBS:
        knob = _backend_attr(path)
        if knob is not None:
            setattr(*knob, "tf32" if tf32 else "ieee")
    if precision not in AMP_DTYPES:  # no float16/bfloat16 GEMM is asked for: pin their reductions off too
        for path in REDUCED_PRECISION_REDUCTIONS:
            knob = _backend_attr(path)
            if knob is not None:
                setattr(*knob, False)
    flags = {"torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
             "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision()}
    for path in FP32_PRECISION_KNOBS + REDUCED_PRECISION_REDUCTIONS:
        knob = _backend_attr(path)
        flags[f"torch.backends.{path}"] = getattr(*knob) if knob is not None else "absent in this torch"
    return flags


def in_precision(model, x, precision: str):
    """(model, x) in the request's storage precision: float64 casts parameters, buffers and a
    floating input; every other precision stores float32."""
    if _checked(precision) != CHECK_PRECISION:
        return model, x
    return model.double(), (x.double() if x.is_floating_point() else x)


def mixed_precision(precision: str, device, train: bool):
    """(autocast() context factory, GradScaler or None, what they are in torch's terms) for the
    request's precision: torch.autocast in the AMP dtype, and for amp_fp16 training a
    torch.amp.GradScaler (dynamic loss scaling) on the device's type."""
    torch = load_torch()
    _checked(precision)
    amp = AMP_DTYPES.get(precision)
    amp_dtype = getattr(torch, amp) if amp else None

    def autocast():
        if amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=amp_dtype)

    scaler = torch.amp.GradScaler(device.type) if (train and amp_dtype is torch.float16) else None
    described = {
        "autocast": f"torch.autocast(device_type={device.type!r}, dtype=torch.{amp})" if amp else None,
        "grad_scaler": f"torch.amp.GradScaler({device.type!r})" if scaler is not None else None,
        "loss_scale": float(scaler.get_scale()) if scaler is not None else None,  # its initial scale
    }
    return autocast, scaler, described

