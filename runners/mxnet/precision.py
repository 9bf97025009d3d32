"""The precision axis of the mxnet runner (runners/common/contract.py Precision): the request's
precision checked, float32 math pinned (TF32 off, no float32 -> float16 tensor-core conversion) and
read back, MXNet's AMP (mxnet.contrib.amp: its target dtype, the operators kept in float32, dynamic
loss scaling for float16), a one-sample probe of the dtypes a forward pass really gives (and of the
layers MXNet cannot run in a reduced dtype here), and what float64, the check's precision, leaves
in float32 or builds from other operators. What each precision means is described in runner.py.
"""

from __future__ import annotations

import os

from runners.common.contract import CHECK_PRECISION, PRECISIONS, Precision
from runners.common.protocol import Skip
from runners.mxnet.framework import (FUSED_ATTENTION_OPS, cpu_bf16_isa, framework_message, has_attention, load_mxnet,
                                     mxnet_loaded)

# ------------------------------------------------------------------ float32 math on CUDA (precision fp32)
# MXNet 1.9 has no TF32 switch of its own. Its two tensor-core variables govern float16 tensor-core
# math (MXNET_CUDA_ALLOW_TENSOR_CORE, default 1) and the conversion of float32 convolutions and GEMMs
# to float16 tensor-core math (MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION, default 0). TF32 is left to
# the NVIDIA libraries, which allow it by default on compute capability 8.0+ (cuDNN 8's default math
# mode; mxnet/test_utils.py effective_dtype: "TF32 ... the default on arch 80 GPUs" unless
# NVIDIA_TF32_OVERRIDE=0): their own NVIDIA_TF32_OVERRIDE=0 turns it off everywhere. On the CPU all
# three are no-ops; they are set on every device because the same code runs on the GPU.
#
# Set before mxnet is imported (configure_threads), as cuBLAS and cuDNN load with libmxnet:
PRE_IMPORT_FLOAT32_PINS = {"NVIDIA_TF32_OVERRIDE": "0", "MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION": "0"}
# Set per precision in prepare, before the first operator: MXNet reads it once, when its first cuDNN
# or cuBLAS operator is set up (not at import), and the kernels suite keeps MXNet's default (1).
TENSOR_CORE_VAR = "MXNET_CUDA_ALLOW_TENSOR_CORE"
FLOAT32_MATH_VARS = (TENSOR_CORE_VAR, *PRE_IMPORT_FLOAT32_PINS)
_pinned_before_import: bool | None = None  # whether pin_float32_math ran before mxnet was imported


def pin_float32_math() -> bool:
    """Pin TF32 and the float32 -> float16 tensor-core conversion off (idempotent): True when mxnet
    had not been imported yet, the first time (the libraries then load with the variables set)."""
    global _pinned_before_import
    os.environ.update(PRE_IMPORT_FLOAT32_PINS)
    if _pinned_before_import is None:
        _pinned_before_import = not mxnet_loaded()
    return _pinned_before_import


def float32_math_env() -> dict:
    """The variables as the process has them now (what libmxnet, cuBLAS and cuDNN read)."""
    return {name: os.environ.get(name) for name in FLOAT32_MATH_VARS}


def request_precision(request: dict) -> Precision:
    """The request's precision (absent: fp32), or one ValueError naming it and the accepted ones:
    the timed runs' precisions and float64, the check's."""
    return Precision.parse(request.get("precision", "fp32"), who="mxnet runner",
                           accepted=(*PRECISIONS, CHECK_PRECISION))


AMP_TARGET = {"amp_bf16": "bfloat16", "amp_fp16": "float16"}

# What float64 means for the operators (measured: DNNL_VERBOSE shows no oneDNN primitive executed in
# a float64 check; the logits agree with a float64 numpy forward to ~1e-15)
FLOAT64_CPU = ("every parameter, activation, gradient, batch-norm statistic, SGD-momentum state and the loss in "
               "float64; MXNet's native CPU operators (oneDNN has no float64 kernels): im2col + BLAS gemm "
               "convolution and dense, native pooling, batch norm, activations, fused RNN and softmax")
FLOAT64_CUDA = ("every parameter, activation, gradient, batch-norm statistic, SGD-momentum state and the loss in "
                "float64 (MXNet's CUDA and cuDNN operators in double)")


def float32_math(precision: str, ctx) -> dict:
    """Set MXNet's tensor-core variable for `precision` and pin TF32 off (Skip: tf32), before any
    operator runs; the flags read back as the process has them (settings["precision_effective"])."""
    mx = load_mxnet()
    cuda = ctx.device_type == "gpu"
    capability = None
    if cuda:
        try:
            cc = mx.util.get_cuda_compute_capability(ctx)
            capability = f"{cc // 10}.{cc % 10}"
        except (OSError, ValueError):
            capability = None
    if precision == "tf32":
        if not cuda:
            raise Skip("tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
                       "this run is on the CPU")
        if capability is not None and float(capability) < 8.0:
            raise Skip(f"tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
                       f"this GPU is {capability}")
        raise Skip("tf32: MXNet 1.9 has no TF32 mode of its own to select or read back: its tensor-core variables "
                   "(MXNET_CUDA_ALLOW_TENSOR_CORE, MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION) govern float16 "
                   "tensor-core math and the float32 -> float16 conversion, not TF32; TF32 is the NVIDIA libraries' "
                   "default (cuDNN 8's default math mode on compute capability 8.0+), whichever operators they "
                   "apply it to (the runner's fp32 pins it off with NVIDIA_TF32_OVERRIDE=0)")
    before_import = pin_float32_math()
    # float16 tensor-core math for AMP float16 (MXNet's default); off for IEEE float32 and float64
    os.environ[TENSOR_CORE_VAR] = "1" if precision in AMP_TARGET else "0"
    features = mx.runtime.Features()
    return {
        **float32_math_env(),
        # NVIDIA_TF32_OVERRIDE and the conversion: before cuBLAS and cuDNN load (configure_threads);
        # MXNET_CUDA_ALLOW_TENSOR_CORE: here, before MXNet sets up its first cuDNN/cuBLAS operator, when it reads it
        "set_before_mxnet_import": {**{name: before_import for name in PRE_IMPORT_FLOAT32_PINS},
                                    TENSOR_CORE_VAR: False},
        "tf32": ("off (NVIDIA_TF32_OVERRIDE=0)" if cuda and os.environ.get("NVIDIA_TF32_OVERRIDE") == "0" else
                 "not applicable: no TF32 on the CPU" if not cuda else "the NVIDIA libraries' default"),
        # what MXNet itself reports: its build features (no run-time tensor-core or TF32 query exists)
        "features": {name: features.is_enabled(name) for name in ("CUDA", "CUDNN", "MKLDNN")},
        "device": "cpu" if not cuda else f"cuda (compute capability {capability})",
        "dtypes_probe": "one sample, a real imperative forward pass layer by layer before hybridize",
    }


# ------------------------------------------------------------------ mixed precision (mxnet.contrib.amp)


def dtype_name(dtype) -> str:
    """An NDArray dtype as a name: MXNet's bfloat16 is a numpy structured dtype ([('bfloat16', '<u2')])."""
    import numpy as np

    names = getattr(dtype, "names", None)
    return names[0] if names else np.dtype(dtype).name


def amp_dtype(target: str):
    """What mxnet.contrib.amp calls the target: its numpy bfloat16 dtype, or numpy float16."""
    import numpy as np
    from mxnet.contrib.amp import amp

    return amp.bfloat16 if target == "bfloat16" else np.dtype(np.float16)


def amp_fp32_ops(target: str, network: dict) -> list[str]:
    """Operators AMP must run in float32 for a network with attention, beyond its own lists (in bfloat16
    only): the fused self-attention operators are on none of AMP's bfloat16 lists, so they would take
    the projection's bfloat16, and have no bfloat16 kernel (CPU: float32 only; CUDA: float16, float32,
    float64); Dropout is on its dtype-neutral list, but 1.9.1's has no bfloat16 kernel either
    (dropout.cc: "Unknown type enum 12", measured), which a block's branch dropout after its bfloat16
    out projection would meet."""
    return [*FUSED_ATTENTION_OPS, "Dropout"] if target == "bfloat16" and has_attention(network) else []


def amp_init(target: str, fp32_ops: list[str] | None = None) -> None:
    """mxnet.contrib.amp.init(target_dtype): once per process (it rewrites MXNet's operator functions)."""
    from mxnet.contrib import amp
    from mxnet.contrib.amp import amp as amp_module

    if amp_module._amp_initialized:
        raise RuntimeError("mxnet.contrib.amp is already initialised in this process (once per process)")
    amp.init(target_dtype=target, fp32_ops=fp32_ops or None)


def amp_settings(target: str, scaled: bool, compiled: bool, fp32_ops: list[str]) -> dict:
    from mxnet.contrib.amp import amp

    dtype = amp_dtype(target)
    return {"mechanism": f"mxnet.contrib.amp.init(target_dtype={target!r}" +
                         (f", fp32_ops={fp32_ops!r})" if fp32_ops else ")") +
                         (", amp.init_trainer(trainer), amp.scale_loss(loss, trainer)" if scaled else ""),
            "target_dtype_ops": amp.list_lp16_ops(dtype),
            "loss_scaling": ("dynamic: mxnet.contrib.amp LossScaler (initial 2**16, halved and the update skipped on "
                             "an overflow, doubled after 2000 clean steps; the overflow flag is read back every step)")
            if scaled else None,
            "weights": "float32 (the operators cast them; the SGD-momentum update is on float32)",
            "graph": "hybridised: AMP's symbol wrappers insert amp_cast into the traced graph" if compiled else
                     "imperative: AMP's NDArray wrappers cast at every call"}


def init_loss_scaling(trainer) -> None:
    """AMP float16's dynamic loss scaling on `trainer` (amp.init_trainer): a fresh loss scaler; the
    step then runs the backward pass under amp.scale_loss(loss, trainer)."""
    from mxnet.contrib import amp

    amp.init_trainer(trainer)


def loss_scale(trainer) -> float:
    """The current scale of the trainer's dynamic loss scaler (after init_loss_scaling)."""
    return float(trainer._amp_loss_scaler.loss_scale)


class ReducedPrecisionUnsupported(Exception):
    """The framework cannot run a layer of the network in the requested reduced precision here."""


def probe_dtypes(net, blocks: list, network: dict, x, precision: str, train: bool) -> dict:
    """A real forward pass of one sample through the network, layer by layer, imperatively (before
    hybridisation, so that the timed step still pays its graph construction in its first iteration;
    one sample, so that no oneDNN primitive of the timed batch is created here): the dtype of the first
    layer's output and of the logits. With AMP (after mxnet.contrib.amp.init) the same operator
    wrappers cast as in the hybridised graph. A layer the framework cannot run in a reduced
    precision here raises ReducedPrecisionUnsupported naming it; in training the backward pass of
    that sample is run too (in predict mode: running statistics unchanged)."""
    mx = load_mxnet()
    amp = precision.startswith("amp_")
    layers = [l for l, b in zip(network["layers"], blocks) if b is not None]  # net's children, in order
    sample = x[0:1]
    dtypes: dict = {}

    def unsupported(where: str, e: Exception) -> ReducedPrecisionUnsupported:
        target = "bfloat16" if precision == "amp_bf16" else "float16"
        why = framework_message(e)
        if sample.context.device_type == "cpu" and "primitive descriptor" in why:
            why = f"oneDNN: {why} (no {target} implementation: {cpu_bf16_isa()})"
        return ReducedPrecisionUnsupported(
            f"{precision}: MXNet {mx.__version__} cannot run {where} in {target} on "
            f"{'the CPU' if sample.context.device_type == 'cpu' else str(sample.context)}: {why}")

    with mx.autograd.record(train_mode=False) if (amp and train) else mx.autograd.predict_mode():
        h = sample
        for i in range(len(net)):
            try:
                h = net[i](h)
                # pretraining_heads give (masked-LM logits, next-sentence logits): the logits are the first
                outputs = list(h) if isinstance(h, (list, tuple)) else [h]
                for o in outputs:
                    o.wait_to_read()
            except mx.base.MXNetError as e:
                if not amp:
                    raise
                kind = layers[i]["type"] if i < len(layers) else type(net[i]).__name__
                raise unsupported(f"layer {i} ({kind}, {type(net[i]).__name__})", e) from e
            if i == 0:
                dtypes["first_layer_output_dtype"] = dtype_name(outputs[0].dtype)
        dtypes["logits_dtype"] = dtype_name(outputs[0].dtype)
    if amp and train:
        try:
            mx.autograd.backward(outputs, [mx.nd.ones_like(o) for o in outputs])
            mx.nd.waitall()
        except mx.base.MXNetError as e:
            raise unsupported("the backward pass", e) from e
    return dtypes


def probe_in_child(request: dict, target: str) -> None:
    """Run this request's preparation, whose one-sample probe tries every layer in `target` (and, in
    training, its backward pass), in a child worker first. MXNet 1.9.1's oneDNN reduced-precision
    kernels either refuse a layer (an MXNetError, which the probe turns into a Skip naming it) or, on
    AVX-512/AMX CPUs, corrupt the heap and abort the process (glibc: "corrupted size vs. prev_size",
    measured 2026-12-02 on a transformer block in bfloat16): a crash cannot be caught in-process, so
    the child takes it, and the run is a Skip saying what crashed instead of a worker killed mid-run."""
    import json
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="dlbench-mxnet-probe-") as tmp:
        asked, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        asked.write_text(json.dumps({**request, "action": "inspect", "isolated_probe": True}))
        out = subprocess.run([sys.executable, str(Path(__file__).with_name("worker.py")), str(asked), str(result)],
                             capture_output=True, text=True, timeout=900, check=False)
        if out.returncode < 0:
            stderr = [line for line in out.stderr.strip().splitlines() if line.strip()]
            raise Skip(f"{request['precision']}: MXNet {load_mxnet().__version__} crashed running this network in "
                       f"{target} on the CPU ({signal.Signals(-out.returncode).name}: "
                       f"{stderr[-1] if stderr else 'nothing on stderr'}) in a probe process "
                       f"({cpu_bf16_isa() if target == 'bfloat16' else 'float16'}); not timed")
        if result.exists():
            probed = json.loads(result.read_text())
            if probed.get("status") == "skipped":
                raise Skip(probed.get("reason") or f"{request['precision']}: skipped by the probe process")


# ------------------------------------------------------------------ float64 (dlbench check)


def float32_operator_parameters(network: dict, deterministic: bool) -> list[str]:
    """What a float64 network still passes through a float32 operator parameter (MXNet declares
    BatchNorm's momentum and Dropout's p as float32; eps, the scalar arithmetic and every tensor are
    float64), where float32 does not hold the value exactly."""
    import numpy as np

    notes = {}
    for layer in network["layers"]:
        if layer["type"] in ("batch_norm", "residual"):
            m = 1.0 - layer["momentum"] if layer["type"] == "batch_norm" else 0.9  # Residual: canonical 0.1
            if float(np.float32(m)) != m:
                notes[f"bn{m}"] = (f"BatchNorm momentum {m} enters as {float(np.float32(m))!r} (a float32 operator "
                                   "parameter): only the float64 running statistics' update, not the normalisation, "
                                   "the gradients or the step")
        elif layer["type"] == "dropout" and not deterministic and float(np.float32(layer["rate"])) != layer["rate"]:
            notes[f"do{layer['rate']}"] = (f"Dropout p {layer['rate']} enters as {float(np.float32(layer['rate']))!r} "
                                           "(a float32 operator parameter)")
        if layer["type"] in ("attention", "transformer_block") and layer["dropout"] and not deterministic \
                and float(np.float32(layer["dropout"])) != layer["dropout"]:
            rate = layer["dropout"]
            notes[f"do{rate}"] = f"Dropout p {rate} enters as {float(np.float32(rate))!r} (a float32 operator parameter)"
    return list(notes.values())


def float64_composites(network: dict, fused_unavailable: str | None) -> list[str]:
    """What a float64 network builds from MXNet's operators instead of the operator float32 uses."""
    notes = []
    layers = network["layers"]
    if any(l["type"] == "gelu" and l["form"] == "erf" or l["type"] in ("transformer_block", "pretraining_heads")
           and l["gelu"] == "erf" for l in layers):
        notes.append("GELU (erf form): 0.5 x (1 + erf(x / sqrt(2))) from the erf operator, not nn.GELU: MXNet's "
                     "gelu computes in float32 for every dtype (src/operator/mshadow_op.h casts to float)")
    if any(l["type"] in ("layer_norm", "transformer_block", "pretraining_heads") for l in layers):
        notes.append("layer norm: nn.LayerNorm's gamma and beta, normalised by mean, square, sqrt and broadcast "
                     "operators with eps a double: the LayerNorm operator declares eps a float32 parameter")
    if has_attention(network) and fused_unavailable:
        notes.append("attention: the products by batch_dot on the interleaved projection, the fused "
                     f"interleaved_matmul_selfatt operators' documented equivalent; the fused ones: {fused_unavailable}")
    return notes
