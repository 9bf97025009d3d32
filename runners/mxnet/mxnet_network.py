"""The MXNet runner's building blocks: the Gluon network from a resolved dlbench description (one
builder per layer type, in LAYERS), its canonical weights in and out, and what the single-process
and the multi-worker steps share (initialisation, the loss block, data, output shape).
mxnet_runner.py, mxnet_kernels.py and mxnet_distributed.py all build from here.

mxnet is imported on first use (`load_mxnet()`), after the runner has set the OpenMP variables
that its engine reads when the library loads. The semantics (batch-norm momentum, the LSTM's two
biases, the Trainer's rescaling) are described in mxnet_runner.py.
"""

from __future__ import annotations

import functools

from contract import LayerTable

_mx = None

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
    import os

    global _pinned_before_import
    os.environ.update(PRE_IMPORT_FLOAT32_PINS)
    if _pinned_before_import is None:
        _pinned_before_import = _mx is None
    return _pinned_before_import


def float32_math_env() -> dict:
    """The variables as the process has them now (what libmxnet, cuBLAS and cuDNN read)."""
    import os

    return {name: os.environ.get(name) for name in FLOAT32_MATH_VARS}


def load_mxnet():
    """The mxnet module (imported on first use, its import-time warnings silenced)."""
    global _mx
    if _mx is None:
        import warnings

        with warnings.catch_warnings():
            # mxnet 1.9.1 warns on import (numpy aliases, distutils); nothing the user can act on.
            warnings.simplefilter("ignore")
            import mxnet

        _mx = mxnet
    return _mx


def mxnet_loaded() -> bool:
    """Whether load_mxnet() has imported mxnet already."""
    return _mx is not None


@functools.lru_cache(maxsize=None)
def block_classes() -> dict:
    """Gluon block classes that need the framework (defined once, lazily)."""
    mx = load_mxnet()
    nn = mx.gluon.nn

    class SequenceLSTM(mx.gluon.HybridBlock):
        """gluon.rnn.LSTM (the fused RNN operator), batch-major, returning the output sequence."""

        def __init__(self, features: int, hidden: int, layers: int, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.lstm = mx.gluon.rnn.LSTM(hidden, num_layers=layers, layout="NTC", input_size=features,
                                              h2h_bias_initializer="zeros", i2h_bias_initializer="zeros")
            for k in range(layers):
                getattr(self.lstm, f"l{k}_h2h_bias").grad_req = "null"  # canonical: one bias per layer

        def hybrid_forward(self, F, x):
            return self.lstm(x)  # no states given: zero initial state, output sequence only

    class OptionA(mx.gluon.HybridBlock):
        """Every stride-th pixel from (0, 0), then zero channels appended after the existing ones."""

        def __init__(self, stride: int, extra: int, **kwargs):
            super().__init__(**kwargs)
            self.stride, self.extra = stride, extra

        def hybrid_forward(self, F, x):
            s = self.stride
            if s > 1:
                x = F.slice(x, begin=(None, None, None, None), end=(None, None, None, None), step=(1, 1, s, s))
            if self.extra:
                zero = F.zeros_like(F.slice_axis(x, axis=1, begin=0, end=1))
                x = F.concat(x, F.broadcast_axis(zero, axis=1, size=self.extra), dim=1)
            return x

    class Residual(mx.gluon.HybridBlock):
        """conv-bn-relu-conv-bn (basic) or 1x1-3x3(stride)-1x1 (bottleneck), + shortcut, then relu."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            cin, cout = spec["in_shape"][0], spec["out_shape"][0]
            f, s = spec["filters"], spec["stride"]
            if spec["block"] == "basic":
                convs = [(cin, f, 3, s, True), (f, f, 3, 1, False)]
            else:
                convs = [(cin, f, 1, 1, True), (f, f, 3, s, True), (f, cout, 1, 1, False)]
            self.kind = spec["shortcut"]
            with self.name_scope():
                self.body = nn.HybridSequential(prefix="body_")
                self.conv_bn = []  # (conv, bn) positions in body, for the canonical weight names
                with self.body.name_scope():
                    for ci, co, k, stride, relu in convs:
                        self.conv_bn.append((len(self.body), len(self.body) + 1))
                        self.body.add(nn.Conv2D(co, k, stride, k // 2, in_channels=ci, use_bias=False),
                                      nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=co))
                        if relu:
                            self.body.add(nn.Activation("relu"))
                if self.kind == "projection":
                    self.proj = nn.Conv2D(cout, 1, s, 0, in_channels=cin, use_bias=False)
                    self.proj_bn = nn.BatchNorm(momentum=0.9, epsilon=1e-5, in_channels=cout)
                elif self.kind == "option_a":
                    self.option_a = OptionA(s, cout - cin)

        def hybrid_forward(self, F, x):
            if self.kind == "projection":
                short = self.proj_bn(self.proj(x))
            elif self.kind == "option_a":
                short = self.option_a(x)
            else:
                short = x
            # Activation, not F.relu: on CPU only Activation is a oneDNN primitive; the plain relu
            # operator forces oneDNN-layout tensors back to NCHW around it, forward and backward
            # (measured on ResNet-50 training, b4: 10-25% of the step).
            return F.Activation(self.body(x) + short, act_type="relu")

    class WithLoss(mx.gluon.HybridBlock):
        """The network and its mean softmax cross-entropy (over the batch, and the steps of an LM)."""

        def __init__(self, net, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.net = net
                self.loss = mx.gluon.loss.SoftmaxCrossEntropyLoss(axis=-1, sparse_label=True)

        def hybrid_forward(self, F, x, y):
            out = self.net(x)
            # per sample the loss is already the mean over the steps (of an LM); then the batch mean
            return out, F.mean(self.loss(out, y))

    return {"SequenceLSTM": SequenceLSTM, "OptionA": OptionA, "Residual": Residual, "WithLoss": WithLoss}


# ------------------------------------------------------------------ layers: type -> builder(spec, classes)


def _nn():
    return load_mxnet().gluon.nn


def _dense(spec, classes):
    # flatten=False keeps a (batch, steps, features) input and applies the weights at every step
    in_shape = spec["in_shape"]
    return _nn().Dense(spec["units"], use_bias=spec["bias"], flatten=len(in_shape) != 2, in_units=in_shape[-1])


def _conv2d(spec, classes):
    return _nn().Conv2D(spec["filters"], tuple(spec["kernel"]), tuple(spec["stride"]), tuple(spec["padding"]),
                        in_channels=spec["in_shape"][0], use_bias=spec["bias"], layout="NCHW")


def _max_pool(spec, classes):
    # pooling_convention "valid" (ceil_mode False) is the canonical floor; padded cells never win
    return _nn().MaxPool2D(tuple(spec["size"]), tuple(spec["stride"]), tuple(spec["padding"]), ceil_mode=False)


def _avg_pool(spec, classes):
    return _nn().AvgPool2D(tuple(spec["size"]), tuple(spec["stride"]), 0, ceil_mode=False)


def _global_avg_pool(spec, classes):
    nn = _nn()
    seq = nn.HybridSequential()
    seq.add(nn.GlobalAvgPool2D(), nn.Flatten())
    return seq


def _batch_norm(spec, classes):
    return _nn().BatchNorm(axis=1, momentum=1.0 - spec["momentum"], epsilon=spec["eps"],
                           in_channels=spec["in_shape"][0])


def _activation(spec, classes):  # relu, sigmoid, tanh: MXNet's own names
    return _nn().Activation(spec["type"])


def _flatten(spec, classes):
    return _nn().Flatten()  # (C, H, W) row-major: the canonical order for NCHW


def _dropout(spec, classes):
    return _nn().Dropout(spec["rate"])


def _embedding(spec, classes):
    return _nn().Embedding(spec["vocabulary"], spec["dim"])


def _lstm(spec, classes):
    return classes["SequenceLSTM"](spec["in_shape"][-1], spec["hidden"], spec["layers"])


def _residual(spec, classes):
    return classes["Residual"](spec)


LAYERS = LayerTable("mxnet", {
    "dense": _dense, "conv2d": _conv2d, "max_pool": _max_pool, "avg_pool": _avg_pool,
    "global_avg_pool": _global_avg_pool, "batch_norm": _batch_norm, "relu": _activation, "sigmoid": _activation,
    "tanh": _activation, "flatten": _flatten, "dropout": _dropout, "embedding": _embedding, "lstm": _lstm,
    "residual": _residual,
})


def build_block(spec: dict, classes: dict):
    """One resolved layer (see dlbench.definitions.analysis) as a Gluon HybridBlock."""
    return LAYERS.builder(spec["type"])(spec, classes)


def build_network(network: dict, deterministic: bool = False):
    """(HybridSequential, [block per resolved layer, None where the layer is dropped])."""
    mx = load_mxnet()
    classes = block_classes()
    net = mx.gluon.nn.HybridSequential(prefix="net_")
    blocks = []
    with net.name_scope():
        for layer in network["layers"]:
            if deterministic and layer["type"] == "dropout":
                blocks.append(None)  # dropout as the identity: simply not in the graph
                continue
            block = build_block(layer, classes)
            net.add(block)
            blocks.append(block)
    return net, blocks, classes


# ---------------------------------------------------------------------------------------------
# Canonical weights (see src/dlbench/definitions/weights.py) <-> Gluon parameters. Gluon's layouts
# are the canonical ones (OIHW, out x in, LSTM gates i f g o), so only the LSTM's biases need care.


def _bn_params(prefix: str, bn) -> dict:
    return {f"{prefix}.gamma": bn.gamma, f"{prefix}.beta": bn.beta,
            f"{prefix}.running_mean": bn.running_mean, f"{prefix}.running_var": bn.running_var}


def canonical_params(blocks: list, network: dict) -> dict:
    """name -> gluon Parameter for every canonical weight except LSTM biases."""
    out = {}
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        p, t = f"{i:03d}", layer["type"]
        if block is None:
            continue
        if t in ("dense", "conv2d"):
            out[f"{p}.weight"] = block.weight
            if block.bias is not None:
                out[f"{p}.bias"] = block.bias
        elif t == "batch_norm":
            out.update(_bn_params(p, block))
        elif t == "embedding":
            out[f"{p}.weight"] = block.weight
        elif t == "lstm":
            for k in range(layer["layers"]):
                out[f"{p}.l{k}.w_ih"] = getattr(block.lstm, f"l{k}_i2h_weight")
                out[f"{p}.l{k}.w_hh"] = getattr(block.lstm, f"l{k}_h2h_weight")
        elif t == "residual":
            for j, (c, b) in enumerate(block.conv_bn, start=1):
                out[f"{p}.conv{j}.weight"] = block.body[c].weight
                out.update(_bn_params(f"{p}.bn{j}", block.body[b]))
            if layer["shortcut"] == "projection":
                out[f"{p}.proj.weight"] = block.proj.weight
                out.update(_bn_params(f"{p}.proj_bn", block.proj_bn))
    return out


def _lstm_biases(blocks: list, network: dict):
    for i, (layer, block) in enumerate(zip(network["layers"], blocks)):
        if layer["type"] == "lstm":
            for k in range(layer["layers"]):
                yield (f"{i:03d}.l{k}.bias", getattr(block.lstm, f"l{k}_i2h_bias"),
                       getattr(block.lstm, f"l{k}_h2h_bias"))


def export_weights(blocks: list, network: dict, dtype: str = "float32") -> dict:
    """name -> numpy array in `dtype`, the precision the network computes in (float32 or float64):
    a float64 network's weights are exported whole, not rounded to float32."""
    out = {n: p.data().asnumpy().astype(dtype, copy=True) for n, p in canonical_params(blocks, network).items()}
    for name, b_i2h, b_h2h in _lstm_biases(blocks, network):
        out[name] = (b_i2h.data() + b_h2h.data()).asnumpy().astype(dtype, copy=True)  # h2h is zero: exact
    return out


def load_weights(blocks: list, network: dict, arrays: dict) -> None:
    mx = load_mxnet()
    params = canonical_params(blocks, network)
    biases = {name: (b_i2h, b_h2h) for name, b_i2h, b_h2h in _lstm_biases(blocks, network)}
    expected = set(params) | set(biases)
    if set(arrays) != expected:
        raise ValueError(f"weight set mismatch: missing {sorted(expected - set(arrays))[:5]}, "
                         f"unexpected {sorted(set(arrays) - set(expected))[:5]}")
    for name, p in params.items():
        src = arrays[name]
        if tuple(src.shape) != tuple(p.shape):
            raise ValueError(f"{name}: shape {tuple(src.shape)}, mxnet expects {tuple(p.shape)}")
        # in the parameter's own dtype: float32 canonical weights into a float64 network are exact
        p.set_data(mx.nd.array(src, dtype=p.dtype))
    for name, (b_i2h, b_h2h) in biases.items():
        b_i2h.set_data(mx.nd.array(arrays[name], dtype=b_i2h.dtype))
        b_h2h.set_data(mx.nd.zeros(b_h2h.shape, dtype=b_h2h.dtype))
    mx.nd.waitall()


# ---------------------------------------------------------------------------------------------
# what the single-process and the multi-worker steps share


HYBRIDIZE = {"static_alloc": True, "static_shape": True}


def build_model(network: dict, ctx, deterministic: bool = False, dtype: str = "float32", hybridize: bool = True):
    """(net, blocks, model): the network initialised on `ctx` (He-normal weights, fan-in; biases,
    batch norms and LSTM biases keep their own initialisers) and, around it, the block of the network
    and its loss, hybridised unless `hybridize` is False (then `hybridize_model(model)` does it later):
    one cached graph per mode, memory planned once.

    `dtype` "float64": Gluon's own mechanism, Block.cast, before initialisation, so that every
    parameter and batch-norm statistic is created in float64 (Gluon's BatchNorm keeps float32
    statistics only under float16); the LSTM layer's cast also makes its zero initial states
    float64. Activations, gradients and the loss then follow the parameters' and the input's dtype.
    """
    mx = load_mxnet()
    net, blocks, classes = build_network(network, deterministic)
    if dtype != "float32":
        net.cast(dtype)  # the Embedding operator takes its dtype from the (now float64) weight
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctx)
    model = classes["WithLoss"](net)
    if hybridize:
        hybridize_model(model)
    return net, blocks, model


def hybridize_model(model) -> None:
    """Gluon's graph mode: the CachedOp of the network and its loss (static_alloc, static_shape),
    built on the next call; it also hybridises the network (what the inference step calls)."""
    model.hybridize(**HYBRIDIZE)


# ---------------------------------------------------------------------------------------------
# mixed precision (mxnet.contrib.amp) and what a forward pass shows of it


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


class ReducedPrecisionUnsupported(Exception):
    """The framework cannot run a layer of the network in the requested reduced precision here."""


def _framework_message(e: Exception) -> str:
    """The framework's own sentence of an MXNetError (its last "MXNetError: ..." line, the source file)."""
    lines = [l.strip() for l in str(e).strip().splitlines() if l.strip()]
    message = next((l for l in reversed(lines) if l.startswith("MXNetError:")), lines[-1] if lines else repr(e))
    where = next((l.split('"')[1] for l in lines if l.startswith('File "') and '"' in l[6:]), None)
    message = message.replace("MXNetError: ", "", 1)
    return f"{message} ({where.lstrip('./')})" if where else message


def _cpu_bf16_isa() -> str:
    """What this CPU offers oneDNN for bfloat16, from /proc/cpuinfo's flags."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((l for l in f if l.startswith("flags")), "").split(":", 1)[-1].split())
    except OSError:
        return "its instruction set is unknown"
    wanted = ("avx512f", "avx512bw", "avx512_bf16", "amx_bf16")
    have = [w for w in wanted if w in flags]
    if have:
        return f"this CPU has {', '.join(have)}"
    return (f"this CPU has {'avx2' if 'avx2' in flags else 'no avx2'} and none of {', '.join(wanted)}; oneDNN's "
            "bfloat16 kernels need AVX-512 (avx512_core) or newer")


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
        why = _framework_message(e)
        if sample.context.device_type == "cpu" and "primitive descriptor" in why:
            why = f"oneDNN: {why} (no {target} implementation: {_cpu_bf16_isa()})"
        return ReducedPrecisionUnsupported(
            f"{precision}: MXNet {mx.__version__} cannot run {where} in {target} on "
            f"{'the CPU' if sample.context.device_type == 'cpu' else str(sample.context)}: {why}")

    with mx.autograd.record(train_mode=False) if (amp and train) else mx.autograd.predict_mode():
        h = sample
        for i in range(len(net)):
            try:
                h = net[i](h)
                h.wait_to_read()
            except mx.base.MXNetError as e:
                if not amp:
                    raise
                kind = layers[i]["type"] if i < len(layers) else type(net[i]).__name__
                raise unsupported(f"layer {i} ({kind}, {type(net[i]).__name__})", e) from e
            if i == 0:
                dtypes["first_layer_output_dtype"] = dtype_name(h.dtype)
        dtypes["logits_dtype"] = dtype_name(h.dtype)
    if amp and train:
        try:
            h.backward(mx.nd.ones_like(h))
            mx.nd.waitall()
        except mx.base.MXNetError as e:
            raise unsupported("the backward pass", e) from e
    return dtypes


def synthetic_batch(network: dict, batch: int, rng):
    """(x, y) as numpy arrays drawn from `rng` (numpy.random.Generator), channels-first images."""
    import numpy as np

    inp = network["input"]
    if inp["kind"] == "tokens":
        shape = (batch, inp["sequence_length"])
        return rng.integers(0, inp["vocabulary"], shape), rng.integers(0, inp["vocabulary"], shape)
    x_np = rng.standard_normal((batch, *inp["shape"]), dtype=np.float32)
    return x_np, rng.integers(0, inp["classes"], (batch,))


def to_device(x_np, y_np, ctx, dtype: str = "float32"):
    """x and y as NDArrays on `ctx`: images in `dtype` (the network's precision); token ids and
    labels as float32 in every precision, as Gluon's Embedding and the sparse-label loss take
    indices (exact below 2**24; they are only indices, with any weight dtype)."""
    mx = load_mxnet()
    x_dtype = "float32" if x_np.dtype.kind in "iub" else dtype
    return mx.nd.array(x_np, ctx=ctx, dtype=x_dtype), mx.nd.array(y_np, ctx=ctx, dtype="float32")


@functools.lru_cache(maxsize=None)
def _sgd_float64_class():
    mx = load_mxnet()

    class SGDMomentumFloat64(mx.optimizer.Optimizer):
        """MXNet's SGD-momentum rule (mom = momentum * mom - lr * (rescale_grad * grad + wd * weight);
        weight += mom) in NDArray arithmetic, whose scalar operands are doubles. MXNet's fused update
        operators (sgd_mom_update, multi_sgd_mom_update) take lr, momentum and wd as float32
        parameters: lr 0.01 is applied as 0.0099999997765 (measured), a 2e-8 error in every float64
        update. The momentum state has the weight's dtype; there is no float32 master copy."""

        def __init__(self, momentum: float = 0.0, **kwargs):
            super().__init__(**kwargs)
            self.momentum = float(momentum)

        def create_state(self, index, weight):
            return mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype) if self.momentum else None

        def update(self, index, weight, grad, state):
            if self.clip_gradient is not None:
                raise NotImplementedError("SGDMomentumFloat64: clip_gradient is not supported")
            self._update_count(index)
            lr, wd = self._get_lr(index), self._get_wd(index)
            step = grad if self.rescale_grad == 1.0 else grad * self.rescale_grad
            if wd:
                step = step + wd * weight
            if state is None:
                weight -= lr * step
            else:
                state[:] = self.momentum * state - lr * step
                weight += state

    return SGDMomentumFloat64


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
    return list(notes.values())


def sgd_momentum(learning_rate: float, momentum: float, dtype: str = "float32"):
    """(optimizer, optimizer_params) for gluon.Trainer: MXNet's aggregated multi-tensor SGD-momentum
    update on the float32 weights (every precision but float64: AMP keeps float32 weights); in
    float64 the same rule in float64 arithmetic (see SGDMomentumFloat64)."""
    if dtype != "float64":
        return "sgd", {"learning_rate": learning_rate, "momentum": momentum, "wd": 0.0}
    return _sgd_float64_class()(learning_rate=learning_rate, momentum=momentum, wd=0.0), None


def trainable_params(net) -> list:
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def count_params(params: list) -> int:
    import numpy as np

    return int(sum(int(np.prod(p.shape)) for p in params))


def output_shape(net, x) -> list[int]:
    """The per-sample output shape as the framework infers it (no computation, no rebinding)."""
    mx = load_mxnet()
    sym = net(mx.sym.var("data"))
    _, out_shapes, _ = sym.infer_shape(data=(1, *x.shape[1:]))
    return list(out_shapes[0][1:])
