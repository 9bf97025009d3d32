"""TensorFlow runner: builds a resolved dlbench network with Keras 3 layers and times its steps.

Runs inside the tensorflow environment only. TensorFlow is imported in `configure_threads`, after
TF_CPP_MIN_LOG_LEVEL is set, and its thread pools are sized there, before any op runs.

Choices (all recorded in the result's `settings`):
- layout: channels-last (NHWC) for images on every device; TensorFlow's CPU Conv2D kernels support
  only NHWC and cuDNN is at least as fast in it. Canonical channels-first inputs are transposed once
  in `prepare`, never inside the timed step. Weights are converted at load/export: conv OIHW <-> HWIO,
  dense (out, in) <-> (in, out), LSTM (4h, in) <-> (in, 4h).
- flatten: Keras flattens NHWC in H, W, C order; instead of transposing the feature map back to
  channels-first inside every step, the rows of the dense layer that consumes the flattened
  features (and any 1-d batch norm between them) are permuted at load/export, so the step runs a
  plain reshape. Only a flatten whose output reaches no dense layer (the network's logits) falls
  back to transposing to C, H, W before the reshape.
- padding: canonical padding is symmetric and floor-mode. TensorFlow's SAME is used where it is
  provably identical (same output size, same leading pad), VALID where there is no padding, and an
  explicit pad (zeros for conv, -inf for max-pool) followed by VALID otherwise, e.g. the stride-2
  convolutions on even-sized inputs, where SAME would pad bottom/right only. Only the trailing pad
  that a window actually reaches is added.
- batch norm: keras.layers.BatchNormalization with its call routed through TensorFlow's fused
  kernel (FusedBatchNormV3: oneDNN on CPU, cuDNN on GPU), the running statistics updated by the
  kernel itself (exponential_avg_factor = canonical momentum, unbiased batch variance as in the
  canonical/PyTorch convention). Keras 3's own call is unfused (moments + batch_normalization).
- LSTM: keras.layers.LSTM in its cuDNN-compatible configuration (tanh/sigmoid, no recurrent
  dropout, not unrolled, one bias vector: the canonical form); Keras runs the cuDNN kernel on GPU
  and its while-loop kernel on CPU.
- train step: one tf.function (forward, sparse softmax cross-entropy, gradient, Keras SGD update);
  XLA (jit_compile) when the request asks for it.
"""

from __future__ import annotations

import functools
import os
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported anywhere

INTER_OP_MAX = 2  # inter-op pool: min(threads, this)
ELEMENTWISE = ("relu", "sigmoid", "tanh", "dropout")


def _tf():
    import tensorflow as tf

    return tf


def _keras():
    import keras

    return keras


# --------------------------------------------------------------------------------------------------
# padding: canonical (symmetric, floor mode) -> SAME, VALID or explicit pads + VALID


def _window_plan(size: int, k: int, s: int, p: int):
    out = (size + 2 * p - k) // s + 1
    same_out = -(-size // s)
    total = max((same_out - 1) * s + k - size, 0)
    same_ok = same_out == out and total // 2 == p
    # only the trailing pad that the last window reaches matters (floor mode may drop the rest)
    explicit = (p, max(0, (out - 1) * s + k - size - p))
    return same_ok, p == 0, explicit


def padding_plan(hw, kernel, stride, padding):
    """('valid' | 'same', None) or ('valid', ((top, bottom), (left, right))) for canonical padding."""
    dims = [_window_plan(hw[i], kernel[i], stride[i], padding[i]) for i in (0, 1)]
    if all(d[1] for d in dims):
        return "valid", None
    if all(d[0] for d in dims):
        return "same", None
    return "valid", (dims[0][2], dims[1][2])


# --------------------------------------------------------------------------------------------------
# Keras layers (defined once TensorFlow is imported)


@functools.lru_cache(maxsize=None)
def _classes():
    tf, keras = _tf(), _keras()

    def _padded(shape, pads):
        n, h, w, c = shape
        return (n, None if h is None else h + sum(pads[0]), None if w is None else w + sum(pads[1]), c)

    class PaddedConv2D(keras.layers.Conv2D):
        """Conv2D with canonical padding that SAME cannot express: zero-pad, then VALID."""

        def __init__(self, pads, **kwargs):
            super().__init__(padding="valid", **kwargs)
            self.pads = pads

        def call(self, inputs):
            return super().call(tf.pad(inputs, [[0, 0], list(self.pads[0]), list(self.pads[1]), [0, 0]]))

        def compute_output_shape(self, input_shape):
            return super().compute_output_shape(_padded(input_shape, self.pads))

    class PaddedMaxPool2D(keras.layers.MaxPooling2D):
        """Max-pool with canonical padding that SAME cannot express: -inf pad, then VALID."""

        def __init__(self, pads, **kwargs):
            super().__init__(padding="valid", **kwargs)
            self.pads = pads

        def call(self, inputs):
            return super().call(tf.pad(inputs, [[0, 0], list(self.pads[0]), list(self.pads[1]), [0, 0]],
                                       constant_values=float("-inf")))

        def compute_output_shape(self, input_shape):
            return super().compute_output_shape(_padded(input_shape, self.pads))

    class FusedBatchNorm(keras.layers.BatchNormalization):
        """keras.layers.BatchNormalization computed by TensorFlow's fused kernel.

        Training: batch statistics (biased variance) normalise; the kernel also updates the running
        statistics as (1 - f) * running + f * batch with f = 1 - keras momentum = the canonical
        momentum, using the unbiased batch variance (PyTorch's convention). A flat (N, C) input is
        viewed as (N, 1, 1, C).
        """

        def __init__(self, canonical_momentum, kernel_epsilon, **kwargs):
            super().__init__(axis=-1, momentum=1.0 - canonical_momentum, **kwargs)
            self.canonical_momentum = canonical_momentum  # exactly as described, not 1 - (1 - m)
            self.kernel_epsilon = kernel_epsilon

        def call(self, inputs, training=None, mask=None):
            flat = len(inputs.shape) == 2
            x = tf.reshape(inputs, [-1, 1, 1, inputs.shape[-1]]) if flat else inputs
            common = dict(x=x, scale=tf.convert_to_tensor(self.gamma), offset=tf.convert_to_tensor(self.beta),
                          mean=tf.convert_to_tensor(self.moving_mean),
                          variance=tf.convert_to_tensor(self.moving_variance),
                          epsilon=self.kernel_epsilon, data_format="NHWC")
            if training and self.trainable:
                y, running_mean, running_var, _, _, _ = tf.raw_ops.FusedBatchNormV3(
                    exponential_avg_factor=self.canonical_momentum, is_training=True, **common)
                self.moving_mean.assign(running_mean)
                self.moving_variance.assign(running_var)
            else:
                y = tf.raw_ops.FusedBatchNormV3(exponential_avg_factor=1.0, is_training=False, **common)[0]
            return tf.reshape(y, tf.shape(inputs)) if flat else y

    class OptionAShortcut(keras.layers.Layer):
        """Every stride-th pixel from (0, 0), then zero channels appended after the existing ones."""

        def __init__(self, stride: int, extra_channels: int, **kwargs):
            super().__init__(**kwargs)
            self.stride, self.extra = stride, extra_channels

        def call(self, x):
            if self.stride > 1:
                x = x[:, ::self.stride, ::self.stride, :]
            return tf.pad(x, [[0, 0], [0, 0], [0, 0], [0, self.extra]]) if self.extra else x

        def compute_output_shape(self, s):
            h = None if s[1] is None else -(-s[1] // self.stride)
            w = None if s[2] is None else -(-s[2] // self.stride)
            return (s[0], h, w, s[3] + self.extra)

    class ChannelsFirstFlatten(keras.layers.Layer):
        """Flatten in C, H, W order (only where no dense layer can absorb the permutation)."""

        def call(self, x):
            return tf.reshape(tf.transpose(x, [0, 3, 1, 2]), [-1, x.shape[1] * x.shape[2] * x.shape[3]])

        def compute_output_shape(self, s):
            return (s[0], s[1] * s[2] * s[3])

    class ResidualBlock(keras.layers.Layer):
        """conv-bn-relu-conv-bn (basic) or 1x1-3x3(stride)-1x1(4x) (bottleneck), + shortcut, relu."""

        def __init__(self, spec: dict, bn_epsilon: float, **kwargs):
            super().__init__(**kwargs)
            cin, h, w = spec["in_shape"]
            cout, ho, wo = spec["out_shape"]
            f, s = spec["filters"], spec["stride"]
            if spec["block"] == "basic":
                plan = [(f, 3, s, (h, w)), (f, 3, 1, (ho, wo))]
            else:
                plan = [(f, 1, 1, (h, w)), (f, 3, s, (h, w)), (cout, 1, 1, (ho, wo))]
            self.convs = [conv2d(co, (k, k), (st, st), (k // 2, k // 2), hw, bias=False) for co, k, st, hw in plan]
            self.bns = [batch_norm(bn_epsilon, 0.1) for _ in plan]
            self.kind = spec["shortcut"]
            if self.kind == "projection":
                self.proj = conv2d(cout, (1, 1), (s, s), (0, 0), (h, w), bias=False)
                self.proj_bn = batch_norm(bn_epsilon, 0.1)
            elif self.kind == "option_a":
                self.option_a = OptionAShortcut(s, cout - cin)
            self.out_channels = cout

        def build(self, input_shape):
            shape = tuple(input_shape)
            for c, b in zip(self.convs, self.bns):
                c.build(shape)
                shape = c.compute_output_shape(shape)
                b.build(shape)
            if self.kind == "projection":
                self.proj.build(tuple(input_shape))
                self.proj_bn.build(self.proj.compute_output_shape(tuple(input_shape)))

        def call(self, x, training=None):
            y = x
            last = len(self.convs) - 1
            for i, (c, b) in enumerate(zip(self.convs, self.bns)):
                y = b(c(y), training=training)
                if i < last:
                    y = tf.nn.relu(y)
            if self.kind == "projection":
                shortcut = self.proj_bn(self.proj(x), training=training)
            elif self.kind == "option_a":
                shortcut = self.option_a(x)
            else:
                shortcut = x
            return tf.nn.relu(y + shortcut)

        def compute_output_shape(self, s):
            shape = tuple(s)
            for c in self.convs:
                shape = c.compute_output_shape(shape)
            return shape

    state = {"bn_floor": None}

    def conv2d(filters, kernel, stride, padding, hw, bias):
        mode, pads = padding_plan(hw, kernel, stride, padding)
        if pads is None:
            return keras.layers.Conv2D(filters, tuple(kernel), tuple(stride), padding=mode, use_bias=bias)
        return PaddedConv2D(pads, filters=filters, kernel_size=tuple(kernel), strides=tuple(stride), use_bias=bias)

    def batch_norm(eps, momentum):
        floor = state["bn_floor"]
        return FusedBatchNorm(momentum, max(eps, floor) if floor else eps, epsilon=eps)

    def max_pool(size, stride, padding, hw):
        mode, pads = padding_plan(hw, size, stride, padding)
        if pads is None:
            return keras.layers.MaxPooling2D(tuple(size), tuple(stride), padding=mode)
        return PaddedMaxPool2D(pads, pool_size=tuple(size), strides=tuple(stride))

    return types.SimpleNamespace(
        PaddedConv2D=PaddedConv2D, PaddedMaxPool2D=PaddedMaxPool2D, FusedBatchNorm=FusedBatchNorm,
        OptionAShortcut=OptionAShortcut, ChannelsFirstFlatten=ChannelsFirstFlatten, ResidualBlock=ResidualBlock,
        conv2d=conv2d, batch_norm=batch_norm, max_pool=max_pool, state=state)


# --------------------------------------------------------------------------------------------------
# building


def _flatten_plan(layers: list[dict]) -> tuple[dict[int, str], dict[int, tuple[int, int, int]]]:
    """How each flatten is done, and which later layers take H, W, C-ordered features.

    Returns ({flatten index: "reshape" | "channels_first"}, {layer index: (C, H, W)}) where the
    second maps every dense or 1-d batch norm whose input features arrive in H, W, C order.
    """
    modes, permuted = {}, {}
    for i, spec in enumerate(layers):
        if spec["type"] != "flatten":
            continue
        shape = spec["in_shape"]
        if len(shape) != 3 or shape[1] * shape[2] == 1:
            modes[i] = "reshape"  # already flat, or no spatial extent: orders agree
            continue
        followers = []
        for j in range(i + 1, len(layers)):
            t = layers[j]["type"]
            if t in ELEMENTWISE or t == "flatten":
                continue
            if t == "batch_norm":
                followers.append(j)
                continue
            if t == "dense":
                followers.append(j)
                modes[i] = "reshape"
                permuted.update({k: tuple(shape) for k in followers})
            break
        modes.setdefault(i, "channels_first")
    return modes, permuted


def build_network(network: dict, deterministic: bool = False):
    """A keras.Sequential for the resolved network and, per resolved layer, its Keras layers."""
    keras = _keras()
    C = _classes()
    layers = network["layers"]
    flatten_modes, permuted = _flatten_plan(layers)
    per_layer: list[list] = []
    for i, spec in enumerate(layers):
        t = spec["type"]
        in_shape = spec["in_shape"]
        hw = tuple(in_shape[1:]) if len(in_shape) == 3 else None
        if t == "dense":
            made = [keras.layers.Dense(spec["units"], use_bias=spec["bias"])]
        elif t == "conv2d":
            made = [C.conv2d(spec["filters"], spec["kernel"], spec["stride"], spec["padding"], hw, spec["bias"])]
        elif t == "max_pool":
            made = [C.max_pool(spec["size"], spec["stride"], spec["padding"], hw)]
        elif t == "avg_pool":
            made = [keras.layers.AveragePooling2D(tuple(spec["size"]), tuple(spec["stride"]), padding="valid")]
        elif t == "global_avg_pool":
            made = [keras.layers.GlobalAveragePooling2D()]
        elif t == "batch_norm":
            made = [C.batch_norm(spec["eps"], spec["momentum"])]
        elif t == "relu":
            made = [keras.layers.ReLU()]
        elif t in ("sigmoid", "tanh"):
            made = [keras.layers.Activation(t)]
        elif t == "flatten":
            if len(in_shape) == 1:
                made = []
            elif flatten_modes[i] == "channels_first":
                made = [C.ChannelsFirstFlatten()]
            else:
                made = [keras.layers.Flatten()]
        elif t == "dropout":
            made = [] if deterministic or spec["rate"] == 0 else [keras.layers.Dropout(spec["rate"])]
        elif t == "embedding":
            made = [keras.layers.Embedding(spec["vocabulary"], spec["dim"])]
        elif t == "lstm":
            # the cuDNN-compatible configuration (Keras picks cuDNN on GPU when it sees exactly this)
            made = [keras.layers.LSTM(spec["hidden"], activation="tanh", recurrent_activation="sigmoid",
                                      use_bias=True, dropout=0.0, recurrent_dropout=0.0, unroll=False,
                                      return_sequences=True) for _ in range(spec["layers"])]
        elif t == "residual":
            made = [C.ResidualBlock(spec, 1e-5)]
        else:
            raise ValueError(f"tensorflow runner: unsupported layer type {t!r}")
        per_layer.append(made)

    inp = network["input"]
    if inp["kind"] == "tokens":
        first = keras.Input(shape=(inp["sequence_length"],), dtype="int64")
    elif len(inp["shape"]) == 3:
        c, h, w = inp["shape"]
        first = keras.Input(shape=(h, w, c))
    else:
        first = keras.Input(shape=tuple(inp["shape"]))
    model = keras.Sequential([first] + [layer for made in per_layer for layer in made], name=network["name"])
    return model, per_layer, flatten_modes, permuted


# --------------------------------------------------------------------------------------------------
# canonical weights (src/dlbench/definitions/weights.py) <-> Keras variables


def _hwc_order(chw):
    """index array: position j of an H, W, C-ordered feature vector holds canonical feature idx[j]."""
    import numpy as np

    c, h, w = chw
    idx = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
    return idx, np.argsort(idx)


def canonical_variables(network: dict, per_layer: list, permuted: dict) -> dict:
    """name -> (keras variable, canonical -> keras array, keras -> canonical array)."""
    same = (lambda a: a, lambda a: a)
    conv = (lambda a: a.transpose(2, 3, 1, 0), lambda a: a.transpose(3, 2, 0, 1))
    transposed = (lambda a: a.T, lambda a: a.T)

    def bn_entries(prefix, bn, perm=None):
        fw = same if perm is None else (lambda a: a[perm[0]], lambda a: a[perm[1]])
        return {f"{prefix}.gamma": (bn.gamma, *fw), f"{prefix}.beta": (bn.beta, *fw),
                f"{prefix}.running_mean": (bn.moving_mean, *fw),
                f"{prefix}.running_var": (bn.moving_variance, *fw)}

    out = {}
    for i, (spec, made) in enumerate(zip(network["layers"], per_layer)):
        p, t = f"{i:03d}", spec["type"]
        perm = _hwc_order(permuted[i]) if i in permuted else None
        if t == "dense":
            (layer,) = made
            if perm is None:
                out[f"{p}.weight"] = (layer.kernel, *transposed)
            else:
                idx, inv = perm
                out[f"{p}.weight"] = (layer.kernel, lambda a, idx=idx: a.T[idx], lambda a, inv=inv: a[inv].T)
            if layer.bias is not None:
                out[f"{p}.bias"] = (layer.bias, *same)
        elif t == "conv2d":
            (layer,) = made
            out[f"{p}.weight"] = (layer.kernel, *conv)
            if layer.bias is not None:
                out[f"{p}.bias"] = (layer.bias, *same)
        elif t == "batch_norm":
            out.update(bn_entries(p, made[0], perm))
        elif t == "embedding":
            out[f"{p}.weight"] = (made[0].embeddings, *same)
        elif t == "lstm":
            for k, layer in enumerate(made):
                cell = layer.cell
                out[f"{p}.l{k}.w_ih"] = (cell.kernel, *transposed)
                out[f"{p}.l{k}.w_hh"] = (cell.recurrent_kernel, *transposed)
                out[f"{p}.l{k}.bias"] = (cell.bias, *same)
        elif t == "residual":
            block = made[0]
            for j, (c, b) in enumerate(zip(block.convs, block.bns), start=1):
                out[f"{p}.conv{j}.weight"] = (c.kernel, *conv)
                out.update(bn_entries(f"{p}.bn{j}", b))
            if spec["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = (block.proj.kernel, *conv)
                out.update(bn_entries(f"{p}.proj_bn", block.proj_bn))
    return out


def export_weights(variables: dict) -> dict:
    import numpy as np

    return {name: np.ascontiguousarray(to_canonical(np.array(var.numpy(), dtype=np.float32)))
            for name, (var, _, to_canonical) in variables.items()}


def load_weights(variables: dict, arrays: dict) -> None:
    import numpy as np

    if set(arrays) != set(variables):
        raise ValueError(f"weight set mismatch: missing {sorted(set(variables) - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(variables))[:5]}")
    for name, (var, to_framework, _) in variables.items():
        value = np.ascontiguousarray(to_framework(np.asarray(arrays[name], dtype=np.float32)))
        if tuple(value.shape) != tuple(var.shape):
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} gives {tuple(value.shape)}, "
                             f"keras expects {tuple(var.shape)}")
        var.assign(value)


# --------------------------------------------------------------------------------------------------


def _describe_flatten(layers, modes, permuted):
    out = {}
    for i, mode in modes.items():
        if mode == "channels_first":
            out[str(i)] = "transpose to C,H,W then reshape (no dense layer to absorb the order)"
        elif any(j > i and permuted[j] == tuple(layers[i]["in_shape"]) for j in permuted):
            out[str(i)] = "reshape in H,W,C order; consumer rows permuted at load/export"
        else:
            out[str(i)] = "reshape"
    return out or None


class Prepared:
    def __init__(self, step, synchronize, params, output_shape, settings, variables=None,
                 forward_loss=None, reset_optimizer=None):
        self.step = step
        self.synchronize = synchronize
        self.params = params
        self.output_shape = output_shape
        self.settings = settings
        self._variables = variables
        self.forward_loss = forward_loss
        self._reset_optimizer = reset_optimizer

    def export_weights(self) -> dict:
        return export_weights(self._variables)

    def load_weights(self, arrays: dict) -> None:
        load_weights(self._variables, arrays)
        self._reset_optimizer()


def _default_parallelism() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class TensorFlowRunner:
    name = "tensorflow"

    def configure_threads(self, threads: int | None) -> dict:
        tf = _tf()
        if threads:
            # must precede the first op (the eager context reads them when it starts)
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(min(threads, INTER_OP_MAX))
        intra = tf.config.threading.get_intra_op_parallelism_threads()
        inter = tf.config.threading.get_inter_op_parallelism_threads()
        # 0 means "TensorFlow decides": both pools then get one thread per schedulable CPU
        return {"requested": threads, "intra_op": intra or _default_parallelism(),
                "inter_op": inter or _default_parallelism(), "tf_setting": {"intra_op": intra, "inter_op": inter}}

    def framework_info(self, device: str) -> dict:
        tf, keras = _tf(), _keras()
        build = dict(tf.sysconfig.get_build_info())
        try:
            from tensorflow.python.util import _pywrap_util_port

            onednn = bool(_pywrap_util_port.IsMklEnabled())
        except Exception:  # noqa: BLE001 - private API; absent means unknown
            onednn = None
        devices = [{"type": "cpu"}]
        for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
            details = tf.config.experimental.get_device_details(gpu)
            cc = details.get("compute_capability")
            devices.append({"type": "cuda", "index": i, "name": details.get("device_name"),
                            "capability": f"{cc[0]}.{cc[1]}" if cc else None})
        return {
            "name": "tensorflow",
            "version": tf.__version__,
            "build": {
                "git": tf.version.GIT_VERSION,
                "compiler": tf.version.COMPILER_VERSION,
                "keras": keras.__version__,
                "keras_backend": keras.backend.backend(),
                "cuda_build": bool(build.get("is_cuda_build")),
                "rocm_build": bool(build.get("is_rocm_build")),
                "cuda": build.get("cuda_version"),
                "cudnn": build.get("cudnn_version"),
                "onednn": onednn,
                "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS"),
                "xla": tf.test.is_built_with_xla(),
            },
            "devices": devices,
        }

    def device_available(self, device: str) -> str | None:
        tf = _tf()
        gpus = tf.config.list_physical_devices("GPU")
        if device == "cuda":
            if not gpus:
                return "CUDA requested but this TensorFlow build or host has no usable GPU"
            return None
        if gpus:  # a CPU benchmark on a GPU host: keep TensorFlow off the GPUs entirely
            try:
                tf.config.set_visible_devices([], "GPU")
            except RuntimeError:
                pass
        return None

    def prepare_kernel(self, spec: dict, device: str):
        from tensorflow_kernels import prepare_kernel  # the kernels suite (runners/tensorflow/tensorflow_kernels.py)

        return prepare_kernel(spec, device)

    def prepare(self, request: dict) -> Prepared:
        import numpy as np

        tf, keras = _tf(), _keras()
        network = request["network"]
        cuda = request["device"] == "cuda"
        precision = request.get("precision", "float32")
        if precision != "float32":
            raise ValueError(f"tensorflow runner: precision {precision!r} is not supported (float32 only)")
        keras.utils.set_random_seed(request.get("seed", 0))
        inp = network["input"]
        tokens = inp["kind"] == "tokens"
        images = not tokens and len(inp["shape"]) == 3
        has_lstm = any(layer["type"] == "lstm" for layer in network["layers"])
        jit = bool(request.get("jit_compile", False))
        settings: dict = {"precision": precision, "data_format": "channels_last" if images else None,
                          "jit_compile_requested": jit}
        if jit and cuda and has_lstm:
            jit = False  # Keras' cuDNN LSTM kernel cannot be compiled by XLA
            settings["jit_compile_note"] = "disabled: the cuDNN LSTM kernel is not XLA-compatible"
        C = _classes()
        C.state["bn_floor"] = 1.001e-5 if cuda else None  # cuDNN's minimum epsilon
        device = "/GPU:0" if cuda else "/CPU:0"

        with tf.device(device):
            model, per_layer, flatten_modes, permuted = build_network(network, request.get("deterministic", False))
            variables = canonical_variables(network, per_layer, permuted)

            batch = request["batch_size"]
            if request.get("inputs"):
                with np.load(request["inputs"]) as data:
                    x_np, y_np = data["x"], data["y"]
                if images:  # canonical NCHW -> NHWC, once, outside the timed step
                    x_np = np.ascontiguousarray(x_np.transpose(0, 2, 3, 1))
                x = tf.identity(tf.constant(x_np))
                y = tf.identity(tf.constant(y_np))
            elif tokens:
                shape = (batch, inp["sequence_length"])
                x = tf.random.uniform(shape, 0, inp["vocabulary"], dtype=tf.int64)
                y = tf.random.uniform(shape, 0, inp["vocabulary"], dtype=tf.int64)
            else:
                shape = (batch, *inp["shape"][1:], inp["shape"][0]) if images else (batch, *inp["shape"])
                x = tf.random.normal(shape)
                y = tf.random.uniform((batch,), 0, inp["classes"], dtype=tf.int64)

            def loss_of(labels, logits):
                return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=tf.reshape(labels, [-1]), logits=tf.reshape(logits, [-1, logits.shape[-1]])))

            trainable = model.trainable_variables
            params = int(sum(int(np.prod(v.shape)) for v in trainable))
            optimizer = keras.optimizers.SGD(learning_rate=request["learning_rate"], momentum=request["momentum"])
            optimizer.build(trainable)

        def reset_optimizer():
            for m in optimizer.momentums:
                m.assign(tf.zeros_like(m))
            optimizer.iterations.assign(0)

        train = request["mode"] == "train"

        def forward_loss():
            with tf.device(device):
                logits = model(x, training=train)
                loss = loss_of(y, logits)
            return logits.numpy(), float(loss)

        if train:
            @tf.function(jit_compile=jit)
            def compiled(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_of(y, model(x, training=True))
                grads = tape.gradient(loss, trainable)
                optimizer.apply_gradients(zip(grads, trainable))
                return loss
        else:
            @tf.function(jit_compile=jit)
            def compiled(x, y):
                return model(x, training=False)

        last = []

        def step():
            with tf.device(device):
                last[:] = [compiled(x, y)]

        sync_devices = tf.test.experimental.sync_devices

        def synchronize():
            # GPU kernels run asynchronously: SyncDevice on every device + the eager executor's
            # async_wait blocks until everything queued (the whole step, updates included) is done.
            # On CPU the call returns computed tensors already; this costs microseconds.
            sync_devices()

        settings.update({
            "input_transpose": "NCHW->NHWC once in prepare" if images else None,
            "flatten": _describe_flatten(network["layers"], flatten_modes, permuted),
            "step": "tf.function" + (" (XLA)" if jit else ""),
            "jit_compile": jit,
            "batch_norm": "keras BatchNormalization via FusedBatchNormV3" + (" (oneDNN)" if not cuda else " (cuDNN)"),
            "batch_norm_epsilon_floor": C.state["bn_floor"],
            "lstm": ("keras.layers.LSTM, " + ("cuDNN kernel" if cuda else "while-loop kernel")) if has_lstm else None,
            "loss": "sparse_softmax_cross_entropy_with_logits, mean",
            "optimizer": "keras.optimizers.SGD(momentum)",
            "inter_op_threads": tf.config.threading.get_inter_op_parallelism_threads(),
            "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
        })
        output_shape = [int(d) for d in model.output_shape[1:]]
        return Prepared(step, synchronize, params, output_shape, settings, variables, forward_loss, reset_optimizer)
