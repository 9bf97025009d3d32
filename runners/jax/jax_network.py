"""The JAX runner's building blocks: the flax network from a resolved dlbench description (one
builder per layer type, in LAYERS), the build plan (how flatten is done on NHWC maps), canonical
weights in and out, numpy-drawn initial values, and TrainingModel (loss, optimiser, one training
iteration). jax_runner.py, jax_kernels.py and jax_distributed.py all build from here.

Nothing that starts threads (jax, flax, numpy) is imported at module level: the runner restricts
the CPU affinity first, and XLA:CPU sizes its thread pools from it when jax is first imported.

Canonical weights (src/dlbench/definitions/weights.py) <-> flax variables:
  conv kernels OIHW <-> HWIO; dense weight (out, in) <-> kernel (in, out); LSTM w_ih (4h, in) /
  w_hh (4h, h) <-> fused (in, 4h) / (h, 4h) kernels, gates i, f, g, o, one bias; a dense layer fed
  by a flatten of an NHWC map takes its rows in H, W, C order, so its canonical C, H, W rows are
  permuted on load and export (likewise a batch norm between the two), which keeps the flatten
  free at run time.
"""

from __future__ import annotations

import functools

from contract import CHECK_PRECISION, COMPILE_MODES, PRECISIONS, LayerTable
from protocol import Skip

_FLAT_ELEMENTWISE = ("relu", "sigmoid", "tanh", "dropout", "batch_norm")
_FLATTEN_SETTING = {"nhwc": "NHWC reshape, next dense's rows permuted at load/export",
                    "nchw": "transpose to NCHW, then reshape", "plain": "reshape"}


def load_jax():
    """The jax module (imported on first use)."""
    import jax

    return jax


# ----------------------------------------------------------------------------------------------
# Precision and compile mode (runners/common/contract.py PRECISIONS, COMPILE_MODES)

ACCEPTED_PRECISIONS = (*PRECISIONS, CHECK_PRECISION)
# flax's own mixed precision: the modules' `dtype` is the computation's, their parameters stay float32
COMPUTE_DTYPE = {"fp32": "float32", "tf32": "float32", "amp_bf16": "bfloat16", "amp_fp16": "float16",
                 "float64": "float64"}
# jax_default_matmul_precision (dots and convolutions on 32-bit inputs): TF32 in tf32 only; every
# other precision pins float32 dots at full precision (what is left in float32 under amp too)
MATMUL_PRECISION = {"tf32": "tensorfloat32"}
FULL_MATMUL_PRECISION = "highest"
# NVIDIA_TF32_OVERRIDE=0 switches TF32 off in cuBLAS and cuDNN whatever the caller asks; read when
# the CUDA libraries load, so the runner sets it before jax creates its CUDA backend (jax_runner.py)
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
COMPILE_DEFAULT = "compiled"  # runner.toml [execution] compile: every step is one jax.jit executable
EAGER_SKIP = ("jax: training steps run under jax.jit (the whole iteration is one XLA executable); op-by-op "
              "dispatch of an un-jitted step, every primitive compiled and run on its own, is not how JAX trains, "
              "so the jax runner has no eager mode")


def check_precision(request: dict) -> str:
    """The request's precision, or one ValueError naming it and the accepted ones."""
    precision = request.get("precision", "fp32")
    if precision not in ACCEPTED_PRECISIONS:
        raise ValueError(f"jax runner: precision {precision!r} is not one of {', '.join(ACCEPTED_PRECISIONS)} "
                         f"({CHECK_PRECISION}: dlbench check only)")
    return precision


def check_compile(request: dict) -> str:
    """The compile mode that runs: `compiled` (jax.jit, also when the request names none); `eager`
    is skipped (JAX's training step is a jitted function); anything else is a ValueError."""
    mode = request.get("compile") or COMPILE_DEFAULT
    if mode not in COMPILE_MODES:
        raise ValueError(f"jax runner: compile mode {mode!r} is not one of {', '.join(COMPILE_MODES)}")
    if mode == "eager":
        raise Skip(EAGER_SKIP)
    return mode


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


# ----------------------------------------------------------------------------------------------
# Build plan: the decisions that depend on the description only (no framework needed).

def build_plan(network: dict) -> list[dict]:
    """Per layer: how the flatten is done and which flat-feature permutation a layer's weights see.

    A flatten of an image is done on the NHWC map as it is (rows in H, W, C order) when the flat
    vector reaches a dense layer through element-wise layers only: that dense layer's weight rows
    (and a batch norm's vectors on the way) are permuted instead. Otherwise (the flat vector is the
    output, or anything else comes first) the map is transposed to NCHW before flattening.
    """
    layers = network["layers"]
    plan: list[dict] = [{} for _ in layers]
    perm = None
    for i, layer in enumerate(layers):
        t = layer["type"]
        if t == "flatten":
            perm = None
            shape = layer["in_shape"]
            if len(shape) == 3 and shape[0] > 1 and shape[1] * shape[2] > 1:
                consumer = next((j for j in range(i + 1, len(layers))
                                 if layers[j]["type"] not in _FLAT_ELEMENTWISE), None)
                if consumer is not None and layers[consumer]["type"] == "dense":
                    plan[i]["flatten"] = "nhwc"
                    c, h, w = shape
                    import numpy as np

                    perm = np.arange(c * h * w).reshape(c, h, w).transpose(1, 2, 0).reshape(-1)
                else:
                    plan[i]["flatten"] = "nchw"
            else:
                plan[i]["flatten"] = "plain"
        elif t in ("dense", "batch_norm") and perm is not None:
            plan[i]["perm"] = perm  # internal feature j is canonical feature perm[j]
            if t == "dense":
                perm = None
        elif t not in _FLAT_ELEMENTWISE:
            perm = None
    return plan


# ----------------------------------------------------------------------------------------------
# flax modules (defined lazily: flax is imported only after the thread configuration)

@functools.lru_cache(maxsize=None)
def lstm_layer_class():
    """The LSTM layer module (also what the kernels suite times as `lstm_layer`, jax_kernels.py)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    def lstm_init(hidden):
        bound = 1.0 / hidden ** 0.5  # torch's and Keras' U(-1/sqrt(h), 1/sqrt(h))
        return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)

    class LSTMLayer(nn.Module):
        """One LSTM layer, time-major in and out, gates i, f, g, o, one bias of 4*hidden."""

        hidden: int
        unroll: int = 1
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):  # x: (T, B, F)
            h = self.hidden
            init = lstm_init(h)
            w_ih = self.param("w_ih", init, (x.shape[-1], 4 * h))
            w_hh = self.param("w_hh", init, (h, 4 * h))
            bias = self.param("bias", nn.initializers.zeros_init(), (4 * h,))
            w_ih, w_hh, bias, x = (a.astype(self.dtype) for a in (w_ih, w_hh, bias, x))
            # every step's input projection at once: one (T*B, F) x (F, 4h) matmul
            xw = jnp.einsum("tbf,fg->tbg", x, w_ih) + bias

            def cell(carry, xw_t):
                h_prev, c_prev = carry
                z = xw_t + h_prev @ w_hh
                i, f, g, o = jnp.split(z, 4, axis=-1)
                c = jax.nn.sigmoid(f) * c_prev + jax.nn.sigmoid(i) * jnp.tanh(g)
                h_new = jax.nn.sigmoid(o) * jnp.tanh(c)
                return (h_new, c), h_new

            zeros = jnp.zeros((x.shape[1], h), self.dtype)
            _, hs = jax.lax.scan(cell, (zeros, zeros), xw, unroll=self.unroll)
            return hs

    return LSTMLayer


@functools.lru_cache(maxsize=None)
def _blocks():
    """flax modules that need the framework (defined once, lazily): LSTM, Residual, batch_norm."""
    import types

    import flax.linen as nn
    import jax.numpy as jnp

    LSTMLayer = lstm_layer_class()

    class LSTM(nn.Module):
        hidden: int
        layers: int
        unroll: int = 1
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):  # (B, T, F) -> (B, T, hidden)
            x = jnp.swapaxes(x, 0, 1)
            for k in range(self.layers):
                x = LSTMLayer(self.hidden, self.unroll, self.dtype, name=f"l{k}")(x)
            return jnp.swapaxes(x, 0, 1)

    def batch_norm(train, momentum, eps, dtype, name):
        # flax's momentum is the weight of the old running value: 1 - the canonical momentum
        return nn.BatchNorm(use_running_average=not train, momentum=1.0 - momentum, epsilon=eps,
                            dtype=dtype, name=name)

    class Residual(nn.Module):
        """conv-bn-relu-conv-bn (+ shortcut), relu; bottleneck 1x1 - 3x3(stride) - 1x1(4x). NHWC."""

        block: str
        filters: int
        stride: int
        shortcut: str
        cin: int
        cout: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, train: bool):
            f, s = self.filters, self.stride

            def conv(y, co, k, stride, name):
                return nn.Conv(co, (k, k), (stride, stride), padding=[(k // 2, k // 2)] * 2, use_bias=False,
                               dtype=self.dtype, name=name)(y)

            def bn(y, name):
                return batch_norm(train, 0.1, 1e-5, self.dtype, name)(y)

            if self.block == "basic":
                convs = [(f, 3, s), (f, 3, 1)]
            else:
                convs = [(f, 1, 1), (f, 3, s), (self.cout, 1, 1)]
            y = x
            for j, (co, k, stride) in enumerate(convs, start=1):
                y = bn(conv(y, co, k, stride, f"conv{j}"), f"bn{j}")
                if j < len(convs):
                    y = nn.relu(y)
            if self.shortcut == "projection":
                short = bn(conv(x, self.cout, 1, s, "proj"), "proj_bn")
            elif self.shortcut == "option_a":
                short = x[:, ::s, ::s, :] if s > 1 else x
                short = jnp.pad(short, ((0, 0), (0, 0), (0, 0), (0, self.cout - self.cin)))
            else:
                short = x
            return nn.relu(y + short)

    return types.SimpleNamespace(LSTM=LSTM, Residual=Residual, batch_norm=batch_norm)


def _linen():
    import flax.linen as nn

    return nn


def _jnp():
    import jax.numpy as jnp

    return jnp


class LayerCall:
    """Where a layer's builder is called: inside Network's compact __call__ (the flax modules it
    makes belong to that network), with the layer's name, the mode and its build plan."""

    def __init__(self, net, name: str, train: bool, how: dict):
        self.net, self.name, self.train, self.how = net, name, train, how
        self.dtype = net.dtype


# ------------------------------------------------------------------ layers: type -> builder(x, spec, at) -> x


def _dense(x, spec, at):
    return _linen().Dense(spec["units"], use_bias=spec["bias"], dtype=at.dtype, name=at.name)(x)


def _conv2d(x, spec, at):
    (ph, pw) = spec["padding"]
    return _linen().Conv(spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]), padding=[(ph, ph), (pw, pw)],
                         use_bias=spec["bias"], dtype=at.dtype, name=at.name)(x)


def _max_pool(x, spec, at):
    (ph, pw) = spec["padding"]  # reduce_window pads with the init value, -inf
    return _linen().max_pool(x, tuple(spec["size"]), tuple(spec["stride"]), ((ph, ph), (pw, pw)))


def _avg_pool(x, spec, at):
    return _linen().avg_pool(x, tuple(spec["size"]), tuple(spec["stride"]), "VALID")


def _global_avg_pool(x, spec, at):
    return _jnp().mean(x, axis=(1, 2))


def _batch_norm(x, spec, at):
    return _blocks().batch_norm(at.train, spec["momentum"], spec["eps"], at.dtype, at.name)(x)


def _relu(x, spec, at):
    return _linen().relu(x)


def _sigmoid(x, spec, at):
    return _linen().sigmoid(x)


def _tanh(x, spec, at):
    return _jnp().tanh(x)


def _flatten(x, spec, at):
    if at.how.get("flatten") == "nchw":
        x = _jnp().transpose(x, (0, 3, 1, 2))
    return x.reshape(x.shape[0], -1)


def _dropout(x, spec, at):
    if not at.net.deterministic and spec["rate"] > 0:
        x = _linen().Dropout(spec["rate"], deterministic=not at.train)(x)
    return x


def _embedding(x, spec, at):
    return _linen().Embed(spec["vocabulary"], spec["dim"], dtype=at.dtype, name=at.name)(x)


def _lstm(x, spec, at):
    return _blocks().LSTM(spec["hidden"], spec["layers"], at.net.lstm_unroll, at.dtype, name=at.name)(x)


def _residual(x, spec, at):
    return _blocks().Residual(spec["block"], spec["filters"], spec["stride"], spec["shortcut"], spec["in_shape"][0],
                              spec["out_shape"][0], at.dtype, name=at.name)(x, at.train)


LAYERS = LayerTable("jax", {
    "dense": _dense, "conv2d": _conv2d, "max_pool": _max_pool, "avg_pool": _avg_pool,
    "global_avg_pool": _global_avg_pool, "batch_norm": _batch_norm, "relu": _relu, "sigmoid": _sigmoid,
    "tanh": _tanh, "flatten": _flatten, "dropout": _dropout, "embedding": _embedding, "lstm": _lstm,
    "residual": _residual,
})


@functools.lru_cache(maxsize=None)
def network_class():
    """The flax module of a resolved network (defined once, lazily)."""
    import flax.linen as nn
    import jax.numpy as jnp

    class Network(nn.Module):
        """A resolved dlbench network; images NHWC, sequences (batch, steps, features)."""

        layers: tuple
        plan: tuple
        deterministic: bool = False
        lstm_unroll: int = 1
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, train: bool):
            for i, (spec, how) in enumerate(zip(self.layers, self.plan)):
                x = LAYERS.builder(spec["type"])(x, spec, LayerCall(self, f"layer{i:03d}", train, how))
                if i == 0:  # kept only where "intermediates" is mutable (TrainingModel.forward_dtypes)
                    self.sow("intermediates", "first_layer_output", x)
            return x

    return Network


# ----------------------------------------------------------------------------------------------
# Canonical weights <-> flax variables

def _entries(network: dict, plan: list[dict]):
    """(canonical name, collection, path in the collection, kind, perm) for every canonical tensor."""
    for i, layer in enumerate(network["layers"]):
        p, t, m = f"{i:03d}", layer["type"], f"layer{i:03d}"
        perm = plan[i].get("perm")
        if t == "dense":
            yield f"{p}.weight", "params", (m, "kernel"), "dense", perm
            if layer["bias"]:
                yield f"{p}.bias", "params", (m, "bias"), "vector", None
        elif t == "conv2d":
            yield f"{p}.weight", "params", (m, "kernel"), "conv", None
            if layer["bias"]:
                yield f"{p}.bias", "params", (m, "bias"), "vector", None
        elif t == "batch_norm":
            yield from _bn_entries(p, (m,), perm)
        elif t == "embedding":
            yield f"{p}.weight", "params", (m, "embedding"), "vector", None
        elif t == "lstm":
            for k in range(layer["layers"]):
                yield f"{p}.l{k}.w_ih", "params", (m, f"l{k}", "w_ih"), "transpose", None
                yield f"{p}.l{k}.w_hh", "params", (m, f"l{k}", "w_hh"), "transpose", None
                yield f"{p}.l{k}.bias", "params", (m, f"l{k}", "bias"), "vector", None
        elif t == "residual":
            for j in range(1, (3 if layer["block"] == "bottleneck" else 2) + 1):
                yield f"{p}.conv{j}.weight", "params", (m, f"conv{j}", "kernel"), "conv", None
                yield from _bn_entries(f"{p}.bn{j}", (m, f"bn{j}"), None)
            if layer["shortcut"] == "projection":
                yield f"{p}.proj.weight", "params", (m, "proj", "kernel"), "conv", None
                yield from _bn_entries(f"{p}.proj_bn", (m, "proj_bn"), None)


def _bn_entries(prefix: str, path: tuple, perm):
    yield f"{prefix}.gamma", "params", path + ("scale",), "vector", perm
    yield f"{prefix}.beta", "params", path + ("bias",), "vector", perm
    yield f"{prefix}.running_mean", "batch_stats", path + ("mean",), "vector", perm
    yield f"{prefix}.running_var", "batch_stats", path + ("var",), "vector", perm


def _to_internal(a, kind: str, perm):
    import numpy as np

    if kind == "conv":  # OIHW -> HWIO
        return np.ascontiguousarray(a.transpose(2, 3, 1, 0))
    if kind == "dense":  # (out, in) -> (in, out), rows in the internal flat order
        if perm is not None:
            a = a[:, perm]
        return np.ascontiguousarray(a.T)
    if kind == "transpose":
        return np.ascontiguousarray(a.T)
    return np.ascontiguousarray(a[perm] if perm is not None else a)


def _to_canonical(a, kind: str, perm):
    import numpy as np

    if kind == "conv":  # HWIO -> OIHW
        return np.ascontiguousarray(a.transpose(3, 2, 0, 1))
    if kind == "dense":
        w = a.T
        if perm is not None:
            out = np.empty_like(w)
            out[:, perm] = w
            w = out
        return np.ascontiguousarray(w)
    if kind == "transpose":
        return np.ascontiguousarray(a.T)
    if perm is not None:
        out = np.empty_like(a)
        out[perm] = a
        return out
    return np.ascontiguousarray(a)


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree: dict, path, value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def export_weights(variables: dict, network: dict, plan: list[dict]) -> dict:
    import numpy as np

    jax = load_jax()
    host = jax.device_get(variables)
    return {name: _to_canonical(_host_float(_get(host[coll], path)), kind, perm)
            for name, coll, path, kind, perm in _entries(network, plan)}


def _host_float(value):
    """A variable as numpy: float64 stays float64 (the check's precision), anything else float32."""
    import numpy as np

    value = np.asarray(value)
    return value.astype(np.float64 if value.dtype == np.float64 else np.float32)


def canonical_to_variables(arrays: dict, network: dict, plan: list[dict], like: dict) -> dict:
    """Numpy variables {collection: tree} from canonical arrays, checked against `like`'s shapes."""
    import numpy as np

    entries = list(_entries(network, plan))
    expected = {e[0] for e in entries}
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - expected)[:5]}")
    out: dict = {coll: {} for coll in like}
    for name, coll, path, kind, perm in entries:
        target = _get(like[coll], path)
        dtype = np.float64 if target.dtype == np.float64 else np.float32  # float32 converts to float64 exactly
        value = _to_internal(np.asarray(arrays[name], dtype=dtype), kind, perm)
        want = tuple(target.shape)
        if value.shape != want:
            raise ValueError(f"{name}: shape {tuple(arrays[name].shape)} gives {value.shape} in flax, "
                             f"which expects {want}")
        _set(out[coll], path, value)
    return out


# ----------------------------------------------------------------------------------------------

def host_init(abstract: dict, rng) -> dict:
    """Initial values for flax's variable shapes, drawn with numpy (the same schemes as flax's
    defaults: LeCun-normal kernels, zero biases, N(0, 1/dim) embeddings, unit BN scale and
    variance, U(-1/sqrt(h), 1/sqrt(h)) LSTM weights)."""
    import numpy as np

    def one(path, s):
        leaf = path[-1].key
        shape = tuple(s.shape)
        if leaf == "kernel":
            fan_in = int(np.prod(shape[:-1]))
            return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        if leaf == "embedding":
            return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)
        if leaf in ("w_ih", "w_hh"):
            bound = 1.0 / np.sqrt(shape[-1] // 4)
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if leaf in ("scale", "var"):
            return np.ones(shape, np.float32)
        return np.zeros(shape, np.float32)  # bias, beta, running mean

    import jax

    return jax.tree_util.tree_map_with_path(one, abstract)


class TrainingModel:
    """What a training run of one resolved network needs, independent of where it runs: the flax
    module, host (numpy) data and initial variables, the loss, the optimiser and one iteration's
    function (shared by the single-process runner and jax_distributed.py)."""

    def __init__(self, request: dict):
        import jax.numpy as jnp
        import numpy as np
        import optax

        network = request["network"]
        precision = check_precision(request)
        self.compile = check_compile(request)
        pin_precision(precision, request.get("device", "cpu"))
        dtype = getattr(jnp, COMPUTE_DTYPE[precision])
        self.storage = np.float64 if precision == "float64" else np.float32
        self.network = network
        self.precision = precision
        self.compute_dtype = COMPUTE_DTYPE[precision]
        self.loss_scaling = precision == "amp_fp16"
        self.train = request.get("mode", "train") == "train"
        self.deterministic = bool(request.get("deterministic", False))
        self.plan = build_plan(network)
        inp = network["input"]
        self.images = inp["kind"] == "tensor" and len(inp["shape"]) == 3
        self.tokens = inp["kind"] == "tokens"
        self.has_lstm = any(layer["type"] == "lstm" for layer in network["layers"])
        self.lstm_unroll = 1  # the recurrence is small next to the vocabulary dense; unrolling only slows compilation
        for layer in network["layers"]:
            LAYERS.builder(layer["type"])  # an unknown type fails here, naming it, before anything is traced
        self.model = network_class()(layers=tuple(network["layers"]), plan=tuple(self.plan),
                                deterministic=self.deterministic, lstm_unroll=self.lstm_unroll, dtype=dtype)
        self.has_dropout = not self.deterministic and any(layer["type"] == "dropout" and layer["rate"] > 0
                                                          for layer in network["layers"])
        self.tx = optax.sgd(request["learning_rate"], momentum=request["momentum"])

    def host_batch(self, batch: int, rng, inputs: str | None = None):
        """(x, y) as contiguous numpy arrays: images NHWC, tokens int32."""
        import numpy as np

        inp = self.network["input"]
        if inputs:
            with np.load(inputs) as data:
                x_np, y_np = data["x"], data["y"]
            if self.images:
                x_np = x_np.transpose(0, 2, 3, 1)  # canonical NCHW -> NHWC, once
        elif self.tokens:
            shape = (batch, inp["sequence_length"])
            x_np = rng.integers(0, inp["vocabulary"], shape)
            y_np = rng.integers(0, inp["vocabulary"], shape)
        else:
            shape = (batch, *inp["shape"][1:], inp["shape"][0]) if self.images else (batch, *inp["shape"])
            x_np = rng.standard_normal(shape, dtype=np.float32)
            y_np = rng.integers(0, inp["classes"], (batch,))
        return (np.ascontiguousarray(x_np, dtype=np.int32 if self.tokens else self.storage),
                np.ascontiguousarray(y_np, dtype=np.int32))

    def host_variables(self, sample_shape, dtype, rng) -> dict:
        """Numpy variables: shapes from flax (traced, not compiled), values drawn by `host_init`."""
        jax = load_jax()
        abstract = jax.eval_shape(functools.partial(self.model.init, train=False), {"params": jax.random.PRNGKey(0)},
                                  jax.ShapeDtypeStruct((1, *sample_shape), dtype))
        return jax.tree.map(lambda v: v.astype(self.storage), host_init(abstract, rng))

    def host_opt_state(self, params):
        """optax.sgd's state is the momentum trace (zeros) and empty states: built on the host.
        With dynamic loss scaling: {"sgd": that, "loss_scale": {"scale", "finite_steps"}}."""
        import numpy as np

        jax = load_jax()
        sgd = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(self.tx.init, params))
        if not self.loss_scaling:
            return sgd
        return {"sgd": sgd, "loss_scale": {"scale": np.asarray(LOSS_SCALE_INITIAL, np.float32),
                                           "finite_steps": np.asarray(0, np.int32)}}

    @staticmethod
    def host_key(seed: int):
        import numpy as np

        jax = load_jax()
        return np.asarray(jax.random.key_data(jax.random.PRNGKey(seed)))

    @staticmethod
    def count_params(params) -> int:
        import numpy as np

        return int(sum(int(np.prod(p.shape)) for p in load_jax().tree.leaves(params)))

    def output_shape(self, params, stats, x) -> list[int]:
        """Per-sample output shape (traced, not compiled); `x` may be a ShapeDtypeStruct."""
        out = load_jax().eval_shape(lambda p, s, x: self.apply(p, s, None, x, False)[0], params, stats, x)
        return list(out.shape[1:])

    def apply(self, p, stats, key, x, train: bool):
        """(logits, batch statistics): updated ones in training mode where the network has any."""
        variables = {"params": p, "batch_stats": stats} if stats else {"params": p}
        rngs = {"dropout": key} if (self.has_dropout and train) else None
        if train and stats:
            out, upd = self.model.apply(variables, x, train=True, mutable=["batch_stats"], rngs=rngs)
            return out, upd["batch_stats"]
        return self.model.apply(variables, x, train=train, rngs=rngs), stats

    @staticmethod
    def loss_of(logits, y):
        import jax.numpy as jnp
        import optax

        logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # bfloat16 up, float64 kept
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).mean()

    def gradients(self, p, stats, key, x, y, loss_scale=None):
        """(loss, new batch statistics, gradients) of one batch; `key` is this step's dropout key.
        With dynamic loss scaling (amp_fp16), `loss_scale` is the scale in use: the backward pass
        runs on loss x scale and the float32 gradients come back divided by it (inf/NaN stay so)."""
        jax = load_jax()
        if self.loss_scaling and loss_scale is None:
            raise ValueError("amp_fp16: the gradients need the dynamic loss scale (opt_state['loss_scale'])")

        def objective(p):
            logits, new_stats = self.apply(p, stats, key, x, True)
            loss = self.loss_of(logits, y)
            return (loss if loss_scale is None else loss * loss_scale), (loss, new_stats)

        (_, (loss, new_stats)), grads = jax.value_and_grad(objective, has_aux=True)(p)
        if loss_scale is not None:
            grads = jax.tree.map(lambda g: g / loss_scale.astype(g.dtype), grads)
        return loss, new_stats, grads

    def update(self, p, grads, opt_state):
        """The SGD-momentum update; with dynamic loss scaling also the scale's: a non-finite gradient
        keeps weights and momentum and halves the scale, LOSS_SCALE_GROWTH_INTERVAL finite steps in
        a row double it."""
        import jax.numpy as jnp
        import optax

        if not self.loss_scaling:
            updates, opt_state = self.tx.update(grads, opt_state, p)
            return optax.apply_updates(p, updates), opt_state
        jax = load_jax()
        finite = jax.tree.reduce(lambda ok, g: ok & jnp.all(jnp.isfinite(g)), grads, jnp.asarray(True))
        updates, sgd = self.tx.update(grads, opt_state["sgd"], p)
        keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
        p, sgd = keep(optax.apply_updates(p, updates), p), keep(sgd, opt_state["sgd"])
        scale, steps = opt_state["loss_scale"]["scale"], opt_state["loss_scale"]["finite_steps"]
        steps = jnp.where(finite, steps + 1, 0)
        grow = steps >= LOSS_SCALE_GROWTH_INTERVAL
        grown = jnp.where(grow, scale * LOSS_SCALE_FACTOR, scale)
        scale = jnp.where(finite, jnp.where(jnp.isfinite(grown), grown, scale),
                          jnp.maximum(scale / LOSS_SCALE_FACTOR, 1.0))
        steps = jnp.where(grow, 0, steps).astype(jnp.int32)
        return p, {"sgd": sgd, "loss_scale": {"scale": scale.astype(jnp.float32), "finite_steps": steps}}

    def train_step(self, p, stats, opt_state, key, x, y):
        """One iteration: forward, loss, backward, SGD-momentum update, batch statistics, key split
        (and the dynamic loss scale's update under amp_fp16)."""
        key, sub = load_jax().random.split(key)
        scale = opt_state["loss_scale"]["scale"] if self.loss_scaling else None
        loss, new_stats, grads = self.gradients(p, stats, sub, x, y, scale)
        p, opt_state = self.update(p, grads, opt_state)
        return p, new_stats, opt_state, key, loss

    def forward_dtypes(self, p, stats, x) -> dict:
        """The dtypes of the first layer's output and of the logits in the step's forward pass.
        Abstractly evaluated (jax.eval_shape traces the same module apply the step runs: in JAX
        every dtype is fixed when the function is traced, before anything executes)."""
        import numpy as np

        jax = load_jax()
        variables = {"params": p, "batch_stats": stats} if stats else {"params": p}

        def forward(variables, x, key):
            rngs = {"dropout": key} if (self.has_dropout and self.train) else None
            mutable = ["intermediates", "batch_stats"] if self.train else ["intermediates"]
            out, state = self.model.apply(variables, x, train=self.train, mutable=mutable, rngs=rngs)
            return out, state["intermediates"]["first_layer_output"][0]

        key = jax.ShapeDtypeStruct((2,), np.uint32)
        logits, first = jax.eval_shape(forward, variables, x, key)
        return {"first_layer_output_dtype": str(first.dtype), "logits_dtype": str(logits.dtype)}

    def precision_settings(self, p=None, stats=None, x=None) -> dict:
        """settings["precision_effective"]: the flags read back from jax, the dtypes in use, the loss scale."""
        jax = load_jax()
        out = {**precision_flags(), "compute_dtype": self.compute_dtype}
        if p is not None:
            dtypes = sorted({str(a.dtype) for a in jax.tree.leaves(p)})
            out["param_dtype"] = dtypes[0] if len(dtypes) == 1 else dtypes
        if p is not None and x is not None:
            out.update(self.forward_dtypes(p, stats, x))
        out["loss_scale"] = LOSS_SCALE_INITIAL if self.loss_scaling else None
        if self.loss_scaling:
            out["loss_scaling"] = LOSS_SCALING
        return out

    def settings(self, platform: str, request: dict, params=None, stats=None, x=None) -> dict:
        """What was built; with the parameters and a batch (or their shapes), the forward's dtypes too."""
        network = self.network
        plan = self.plan
        settings = {
            "api": "flax.linen + optax.sgd",
            "platform": platform,
            "layout": "NHWC" if self.images else ("batch-major tokens, time-major LSTM scan" if self.has_lstm else "NC"),
            "input_transpose": "NCHW->NHWC once at prepare" if (self.images and request.get("inputs")) else None,
            "flatten": sorted({_FLATTEN_SETTING[p["flatten"]] for p in plan if "flatten" in p}) or None,
            "lstm": (f"fused gates (in,4h)/(h,4h), input projection hoisted out of lax.scan, unroll={self.lstm_unroll}"
                     if self.has_lstm else None),
            "batch_norm": "flax BatchNorm (biased batch variance in running_var)"
            if any(layer["type"] in ("batch_norm", "residual") for layer in network["layers"]) else None,
            "dropout": ("identity (deterministic)" if self.deterministic else "per-step key split inside the step")
            if any(layer["type"] == "dropout" for layer in network["layers"]) else None,
            "precision": self.precision,
            "precision_effective": self.precision_settings(params, stats, x),
            "matmul_precision": load_jax().config.jax_default_matmul_precision or "default",
            "mixed_precision": (f"flax modules with dtype={self.compute_dtype}, float32 parameters (param_dtype)"
                                if self.precision.startswith("amp_") else None),
            "compile": self.compile,
        }
        return {k: v for k, v in settings.items() if v is not None}


class DeviceState:
    """A training state on the device (params, batch_stats, opt_state, key, x, y) and what the last
    dispatched step returned, which synchronize() waits for. step functions dispatch a compiled
    iteration and keep its outputs as the new state: nothing goes back to the host."""

    def __init__(self, state: dict):
        self.state = state
        self.last: list = []
        self._block = load_jax().block_until_ready

    def train_step(self, compiled):
        """step(): one compiled train_step (p, stats, opt_state, key, x, y) -> (p, stats, opt_state, key, loss)."""
        state, last = self.state, self.last

        def step():
            s = state
            p, st, opt, key, loss = compiled(s["params"], s["batch_stats"], s["opt_state"], s["key"], s["x"], s["y"])
            s.update(params=p, batch_stats=st, opt_state=opt, key=key)
            last[:] = [p, st, opt, key, loss]

        return step

    def infer_step(self, compiled):
        """step(): one compiled inference (p, stats, x) -> logits."""
        state, last = self.state, self.last

        def step():
            last[:] = [compiled(state["params"], state["batch_stats"], state["x"])]

        return step

    def synchronize(self) -> None:
        if self.last:
            self._block(self.last)
