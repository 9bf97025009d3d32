"""The precision axis in the TensorFlow runner (runners/common/contract.py): which precisions a
request may ask for here, Keras' dtype policy each builds under, TensorFlow's TF32 and float16
accumulation switches (set, then read back), the variables' dtype, and loss scaling.

- fp32 and tf32 build the network in float32 as Keras does by default and differ only in
  TensorFlow's TF32 switch (`float32_math`: set, then read back; pinned off for every precision but
  tf32). amp_bf16 and amp_fp16 are Keras' own mixed precision: the model and optimiser are built
  under the global dtype policy "mixed_bfloat16" or "mixed_float16" (`precision_scope`): float32
  variables, bfloat16/float16 computation, and, as Keras recommends, the network's output cast to
  float32 by a last float32 layer (keras.layers.Activation("linear", dtype="float32"), no weights:
  step.py), so logits and loss are float32; the batch norm's fused kernel takes the half-precision
  activations with float32 statistics (its U). amp_fp16 adds keras.optimizers.LossScaleOptimizer
  (dynamic loss scaling: `with_loss_scaling`).
- float64 (single-process `prepare` only, for `dlbench check`): the model and the optimiser are
  built under Keras' own dtype mechanism (`precision_scope`: the global dtype policy and floatx set
  to float64, restored afterwards), so every variable (parameters, running statistics, SGD momentum
  slots, the learning rate), activation, gradient and the loss are float64. The one exception is the
  fused batch-norm kernel: FusedBatchNormV3 has no float64 kernel (T is half, bfloat16 or float), so
  a float64 batch norm computes the same arithmetic with unfused TF ops (layers.py).
"""

from __future__ import annotations

import contextlib
import os

from runners.common.contract import CHECK_PRECISION, PRECISIONS, Precision
from runners.tensorflow.framework import load_keras, load_tf

ACCEPTED = PRECISIONS + (CHECK_PRECISION,)  # what `prepare` builds (the multi-worker step: fp32 only)
# The Keras global dtype policy each precision builds under (None: Keras' default, float32)
KERAS_POLICY = {"fp32": None, "tf32": None, "amp_bf16": "mixed_bfloat16", "amp_fp16": "mixed_float16",
                CHECK_PRECISION: "float64"}
MIXED = ("amp_bf16", "amp_fp16")
TF32_CAPABILITY = (8, 0)  # NVIDIA Ampere: the first GPUs with TF32 tensor cores
# the environment variables that pin float16 GEMMs and convolutions to float32 accumulation
FP16_ACCUMULATION = ("TF_FP16_MATMUL_USE_FP32_COMPUTE", "TF_FP16_CONV_USE_FP32_COMPUTE")


def request_precision(request: dict, accepted: tuple[str, ...] = ("fp32",)) -> Precision:
    """The request's precision (absent: fp32), or one clear error naming it and the accepted ones
    (the single-process `prepare` accepts every precision of the contract and float64, the
    multi-worker step fp32 only)."""
    return Precision.parse(request.get("precision", "fp32"), who="tensorflow runner", accepted=accepted)


def tf32_unavailable(cuda: bool) -> str | None:
    """None, or why TF32 cannot run here (the CPU, a GPU below compute capability 8.0, or TF32
    switched off under TensorFlow by NVIDIA_TF32_OVERRIDE=0)."""
    why = "tf32: TF32 is a tensor-core mode of NVIDIA GPUs of compute capability 8.0 or newer; "
    if not cuda:
        return why + "this run is on the CPU"
    tf = load_tf()
    gpu = tf.config.list_physical_devices("GPU")[0]
    details = tf.config.experimental.get_device_details(gpu)
    cc = details.get("compute_capability")
    if cc is None or tuple(cc) < TF32_CAPABILITY:
        have = "an unknown compute capability" if cc is None else f"compute capability {cc[0]}.{cc[1]}"
        return why + f"GPU:0 ({details.get('device_name')}) has {have}"
    if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
        return "tf32: NVIDIA_TF32_OVERRIDE=0 in the environment switches TF32 off in cuBLAS and cuDNN below TensorFlow"
    return None


def float32_math(precision: str) -> dict:
    """Sets TensorFlow's float32 math for `precision` and reads it back: TF32 execution enabled for
    tf32 only (tf.config.experimental.enable_tensor_float_32_execution; TensorFlow's default is on,
    so fp32, float64 and the AMP modes, whose float32 parts stay IEEE, pin it off; on the CPU the
    switch does nothing, but the same code runs on the GPU), and float16 matrix products and
    convolutions accumulating in float32 (TensorFlow's own default, pinned through the environment
    variables its float16 GEMM and convolution paths read at their first use; it has no other
    reduced-precision-reduction switch)."""
    tf = load_tf()
    tf.config.experimental.enable_tensor_float_32_execution(precision == "tf32")
    for name in FP16_ACCUMULATION:  # before any float16 op has run in this process
        os.environ[name] = "1"
    return {
        "tensor_float_32_execution_enabled": tf.config.experimental.tensor_float_32_execution_enabled(),
        "tf32_set_by": f"tf.config.experimental.enable_tensor_float_32_execution({precision == 'tf32'})",
        "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE"),
        **{name: os.environ[name] for name in FP16_ACCUMULATION},
        "ONEDNN_DEFAULT_FPMATH_MODE": os.environ.get("ONEDNN_DEFAULT_FPMATH_MODE"),
    }


def storage_dtype(precision: str) -> str:
    """The dtype of the variables (and of inputs, exported weights) under `precision`: float64 for
    the check's float64, float32 for every other (the AMP modes keep float32 variables)."""
    return "float64" if precision == CHECK_PRECISION else "float32"


@contextlib.contextmanager
def precision_scope(precision: str):
    """Keras' own dtype mechanism for what is built inside: fp32 and tf32 leave Keras as it is
    (float32); amp_bf16 / amp_fp16 set the global dtype policy to "mixed_bfloat16" /
    "mixed_float16" (float32 variables, reduced-precision computation); float64 sets the policy and
    floatx (keras.Input's default, the optimiser's learning-rate variable; its slots follow their
    variables) to float64. Both are restored on exit (a layer keeps the policy it was built with)."""
    name = KERAS_POLICY[precision]
    if name is None:
        yield
        return
    keras = load_keras()
    policy, floatx = keras.config.dtype_policy(), keras.config.floatx()
    keras.config.set_dtype_policy(name)
    if precision == CHECK_PRECISION:
        keras.config.set_floatx(CHECK_PRECISION)  # the plain string, not the Precision member
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


def with_loss_scaling(optimizer, precision: str):
    """(the optimiser the step applies, whether its loss is scaled): amp_fp16 wraps the optimiser in
    Keras' own dynamic loss scaling, keras.optimizers.LossScaleOptimizer (the loss scaled before the
    gradient, the gradients unscaled and checked in apply_gradients: a non-finite step is skipped,
    the scale halved); every other precision applies the optimiser as it is."""
    scaled = precision == "amp_fp16"
    return (load_keras().optimizers.LossScaleOptimizer(optimizer) if scaled else optimizer), scaled
