"""The JAX runner's building blocks: the flax network from a resolved dlbench description (one
builder per layer type, in LAYERS), the build plan (how flatten is done on NHWC maps), canonical
weights in and out, numpy-drawn initial values, and TrainingModel (loss, optimiser, one training
iteration). jax_runner.py, jax_kernels.py and jax_distributed.py all build from here.

Nothing that starts threads (jax, flax, numpy) is imported at module level: the runner restricts
the CPU affinity first, and XLA:CPU sizes its thread pools from it when jax is first imported.

Canonical weights (src/dlbench/definitions/weights.py) <-> flax variables:
  conv kernels OIHW <-> HWIO (a patch embedding's too); dense weight (out, in) <-> kernel (in, out),
  also attention's q, k, v and out, a block's mlp.fc1/fc2 and an untied lm_head (nn.Dense; the q,
  k, v kernels' columns are the canonical head-major rows); layer norm gamma/beta <-> scale/bias; a
  position table and a class token as they are; a tied lm_head has only its bias (its weight is
  000.weight, the Embed table its attend decodes with); a segment embedding's (segments, D) table is
  its nn.Embed's; pretraining heads' pooler, next_sentence, transform and an untied decoder weight
  are nn.Dense kernels (transposed), transform_ln the nn.LayerNorm, decoder.bias the decoder's bias
  (tied: a bias only, decoding with the token embedding's Embed.attend, as a tied lm_head); LSTM
  w_ih (4h, in) / w_hh (4h, h) <-> fused (in, 4h) / (h, 4h) kernels, gates i, f, g, o, one bias; a
  dense layer fed by a flatten of an NHWC map takes its rows in H, W, C order, so its canonical
  C, H, W rows are permuted on load and export (likewise a batch norm between the two), which keeps
  the flatten free at run time.
"""

from __future__ import annotations

import functools

from runners.common.contract import CHECK_PRECISION, COMPILE_MODES, PRECISIONS, Layer, LayerTable
from runners.common.protocol import Skip

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
    """Per layer: how the flatten is done and which flat-feature permutation a layer's weights see
    (and, from a masked_tokens input, a segment embedding's boundary and the heads' masked positions).

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
        if t == "segment_embedding":  # the masked_tokens input's layout: segment 0, then 1
            plan[i]["segment_boundary"] = network["input"]["segment_boundary"]
        elif t == "pretraining_heads":  # the positions the masked-LM head gathers (sorted, unique)
            plan[i]["masked_positions"] = tuple(network["input"]["masked_positions"])
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
    makes belong to that network), with the layer's name, the mode, its build plan and the modules
    of earlier layers that a later one uses (`modules`, by name: a tied head's token embedding)."""

    def __init__(self, net, name: str, train: bool, how: dict, modules: dict):
        self.net, self.name, self.train, self.how, self.modules = net, name, train, how, modules
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


def batch_norm_module(train: bool, momentum: float, eps: float, dtype, name: str | None = None):
    """The flax BatchNorm the network builder makes (canonical momentum: the weight of the new value)."""
    return _blocks().batch_norm(train, momentum, eps, dtype, name)


def _batch_norm(x, spec, at):
    return batch_norm_module(at.train, spec["momentum"], spec["eps"], at.dtype, at.name)(x)


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
    nn = _linen()
    # the described scale, else flax's own variance-scaling initialiser
    init = {"embedding_init": nn.initializers.normal(stddev=spec["init_std"])} if spec.get("init_std") else {}
    embed = nn.Embed(spec["vocabulary"], spec["dim"], dtype=at.dtype, name=at.name, **init)
    at.modules[at.name] = embed  # a tied lm_head decodes with this module's table (Embed.attend)
    return embed(x)


def _lstm(x, spec, at):
    return _blocks().LSTM(spec["hidden"], spec["layers"], at.net.lstm_unroll, at.dtype, name=at.name)(x)


def _residual(x, spec, at):
    return _blocks().Residual(spec["block"], spec["filters"], spec["stride"], spec["shortcut"], spec["in_shape"][0],
                              spec["out_shape"][0], at.dtype, name=at.name)(x, at.train)


# ------------------------------------------------------------------ transformer layers (schema.py's semantics)
# Sequences are (B, T, D); images reach a patch embedding NHWC. Attention's q, k and v are nn.Dense
# to heads*head_size reshaped to (B, T, heads, head_size): head h is columns h*S .. (h+1)*S - 1 (the
# canonical head-major order), and (B, T, N, H) is the layout jax.nn.dot_product_attention takes.

ATTENTION_FUNCTION = "jax.nn.dot_product_attention"
FLAX_ATTENTION_FUNCTION = "flax.linen.dot_product_attention"
# Why an attention does not run through jax.nn.dot_product_attention (attention_function):
DROPOUT_ATTENTION = ("dropout on the probabilities in training: jax.nn.dot_product_attention has no dropout, "
                     "flax.linen.dot_product_attention applies it to the softmax it computes")
FLOAT64_ATTENTION = ("float64: jax.nn.dot_product_attention's XLA implementation casts the scores to float32 for "
                     "its softmax (jax/_src/nn/functions.py), flax.linen.dot_product_attention keeps float64")
CPU_FLOAT16_ATTENTION = ("float16 on the CPU: jax.nn.dot_product_attention's XLA implementation asks dot_general "
                         "for float32 results of float16 operands (F16_F16_F32), which XLA:CPU does not offer; "
                         "flax.linen.dot_product_attention multiplies in float16")
# cuDNN's fused attention (implementation="cudnn") takes fp16/bf16 (and fp8) q, k, v only
CUDNN_DTYPES = ("bfloat16", "float16")


def attention_function(dtype: str, dropout_on: bool, device: str) -> tuple[str, str | None]:
    """(the function an attention calls, why it is not jax.nn.dot_product_attention or None)."""
    if dropout_on:
        return FLAX_ATTENTION_FUNCTION, DROPOUT_ATTENTION
    if dtype == "float64":
        return FLAX_ATTENTION_FUNCTION, FLOAT64_ATTENTION
    if dtype == "float16" and device == "cpu":
        return FLAX_ATTENTION_FUNCTION, CPU_FLOAT16_ATTENTION
    return ATTENTION_FUNCTION, None


def attention_asked(dtype: str, device: str) -> str | None:
    """jax.nn.dot_product_attention's `implementation` argument: cuDNN's flash attention on a GPU in
    half precision (its fast path), else None (jax chooses)."""
    return "cudnn" if device == "cuda" and dtype in CUDNN_DTYPES else None


TRANSFORMER_TYPES = ("position_embedding", "patch_embedding", "layer_norm", "gelu", "attention", "transformer_block",
                     "token_pool", "lm_head", "segment_embedding", "pretraining_heads")
CUDNN_PRIMITIVE = "dot_product_attention"  # jax/_src/cudnn/fused_attention_stablehlo.py's primitives' prefix


def traced_primitives(closed) -> list[tuple[str, str]]:
    """(primitive, name stack) of every equation of a traced jaxpr, nested jaxprs (jit, custom_vjp,
    scan...) included, each nested stack prefixed with its caller's (flax names the stack by module)."""
    out: list[tuple[str, str]] = []

    def walk(jaxpr, prefix: str) -> None:
        for eqn in jaxpr.eqns:
            stack = prefix + str(eqn.source_info.name_stack)
            out.append((eqn.primitive.name, stack))
            for value in eqn.params.values():
                for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                    if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):  # a ClosedJaxpr
                        walk(sub.jaxpr, stack + "/")
                    elif hasattr(sub, "eqns"):  # a Jaxpr
                        walk(sub, stack + "/")

    walk(closed.jaxpr, "")
    return out


def dropout_rate(layer: dict) -> float:
    """The dropout a resolved layer applies in training: a dropout layer's rate, an attention's or a
    transformer block's `dropout` (on the probabilities and, in a block, on both branches)."""
    if layer["type"] == "dropout":
        return layer["rate"]
    return layer.get("dropout", 0.0) if layer["type"] in ("attention", "transformer_block") else 0.0


def cudnn_refusal(layer: dict, dtype: str, train: bool) -> str | None:
    """Why jax refuses implementation="cudnn" for this layer's attention (its shape, dtype, this GPU
    or cuDNN), traced on one sample as the step traces it (with the backward in training); None
    when it takes it. jax checks these when it traces the call, so nothing is compiled."""
    import jax.numpy as jnp

    jax = load_jax()
    t = layer["in_shape"][0]
    qkv = jax.ShapeDtypeStruct((1, t, layer["heads"], layer["head_size"]), getattr(jnp, dtype))

    def attend(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=layer["causal"], implementation="cudnn")

    def run(q, k, v):
        if not train:
            return attend(q, k, v)
        return jax.grad(lambda *a: attend(*a).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    try:
        jax.jit(run).lower(qkv, qkv, qkv)
    except Exception as e:  # noqa: BLE001 - jax's NotImplementedError / ValueError / RuntimeError: its reason
        return f"{type(e).__name__}: {e}"
    return None


@functools.cache
def transformer_modules():
    """The transformer layers' flax modules (defined once, lazily: flax is imported after the
    thread configuration)."""
    import types

    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    table_init = nn.initializers.normal(stddev=0.02)  # GPT-2's and ViT's tables and class token

    class PositionEmbedding(nn.Module):
        """x + P[0:T], a learned (max_length, D) table (GPT-2's wpe, ViT's pos_embedding)."""

        max_length: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            table = self.param("pos_embedding", table_init, (self.max_length, x.shape[-1]))
            return x + table[: x.shape[1]].astype(self.dtype)

    class PatchEmbedding(nn.Module):
        """A strided nn.Conv (kernel = stride = patch, VALID) on the NHWC image, its (h, w) grid as
        tokens in row-major order, the class token prepended (flax ViT's embedding and cls)."""

        patch: int
        dim: int
        class_token: bool
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            p = self.patch
            grid = nn.Conv(self.dim, (p, p), (p, p), padding="VALID", use_bias=True, dtype=self.dtype,
                           name="proj")(x)  # (B, H/p, W/p, dim)
            tokens = grid.reshape(grid.shape[0], -1, self.dim)  # NHWC: positions already row-major
            if not self.class_token:
                return tokens
            cls = self.param("class_token", table_init, (self.dim,)).astype(tokens.dtype)
            return jnp.concatenate([jnp.broadcast_to(cls, (tokens.shape[0], 1, self.dim)), tokens], axis=1)

    class SelfAttention(nn.Module):
        """Multi-head self-attention: q, k, v, out as nn.Dense; the heads' products in
        jax.nn.dot_product_attention (scale 1/sqrt(head_size), is_causal, `implementation`), or in
        flax.linen.dot_product_attention where attention_function says why."""

        heads: int
        head_size: int
        causal: bool
        bias: bool
        dropout: float
        deterministic: bool
        implementation: str | None = None
        dtype: object = jnp.float32
        function: str = ATTENTION_FUNCTION  # the runner's choice for this layer (plan_attention)

        @nn.compact
        def __call__(self, x, train: bool):
            b, t, d = x.shape
            inner = self.heads * self.head_size

            def heads(name):  # (B, T, H*S) -> (B, T, H, S)
                y = nn.Dense(inner, use_bias=self.bias, dtype=self.dtype, name=name)(x)
                return y.reshape(b, t, self.heads, self.head_size)

            q, k, v = heads("q"), heads("k"), heads("v")
            dropout_on = train and not self.deterministic and self.dropout > 0
            if self.function == ATTENTION_FUNCTION and not dropout_on:
                a = jax.nn.dot_product_attention(q, k, v, is_causal=self.causal, implementation=self.implementation)
            else:
                mask = nn.make_causal_mask(x[..., 0], dtype=jnp.bool_) if self.causal else None
                # per element, as the canonical dropout on p (flax's default shares one mask across
                # the batch and the heads); under amp its softmax is in the compute dtype, flax's default
                a = nn.dot_product_attention(q, k, v, mask=mask, dropout_rate=self.dropout if dropout_on else 0.0,
                                             dropout_rng=self.make_rng("dropout") if dropout_on else None,
                                             broadcast_dropout=False, deterministic=not dropout_on, dtype=self.dtype)
            return nn.Dense(d, use_bias=self.bias, dtype=self.dtype, name="out")(a.reshape(b, t, inner))

    class Mlp(nn.Module):
        """fc1 (D -> ratio*D), GELU in the network's form, fc2 (back to D)."""

        hidden: int
        bias: bool
        approximate: bool
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            y = nn.Dense(self.hidden, use_bias=self.bias, dtype=self.dtype, name="fc1")(x)
            y = jax.nn.gelu(y, approximate=self.approximate)
            return nn.Dense(x.shape[-1], use_bias=self.bias, dtype=self.dtype, name="fc2")(y)

    class TransformerBlock(nn.Module):
        """Layer norms, self-attention and the MLP with two residual joins, pre- or post-norm;
        the block's dropout on each branch before its join and on the attention's probabilities."""

        spec: dict
        deterministic: bool
        implementation: str | None = None
        dtype: object = jnp.float32
        function: str = ATTENTION_FUNCTION

        @nn.compact
        def __call__(self, x, train: bool):
            s = self.spec
            ln1 = nn.LayerNorm(epsilon=s["eps"], dtype=self.dtype, name="ln1")
            ln2 = nn.LayerNorm(epsilon=s["eps"], dtype=self.dtype, name="ln2")
            attn = SelfAttention(s["heads"], s["head_size"], s["causal"], s["bias"], s["dropout"], self.deterministic,
                                 self.implementation, self.dtype, self.function, name="attn")
            mlp = Mlp(s["mlp_ratio"] * x.shape[-1], s["bias"], s["gelu"] == "tanh", self.dtype, name="mlp")
            dropout_on = train and not self.deterministic and s["dropout"] > 0

            def drop(y):
                return nn.Dropout(s["dropout"], deterministic=False)(y) if dropout_on else y

            if s["norm"] == "pre":
                x = x + drop(attn(ln1(x), train))
                return x + drop(mlp(ln2(x)))
            x = ln1(x + drop(attn(x, train)))
            return ln2(x + drop(mlp(x)))

    class Bias(nn.Module):
        """A tied head's own bias, added to Embed.attend's logits."""

        features: int
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x):
            return x + self.param("bias", nn.initializers.zeros_init(), (self.features,)).astype(self.dtype)

    class PretrainingHeads(nn.Module):
        """BERT's pooler and pre-training heads (HuggingFace's FlaxBertForPreTraining): pooled =
        tanh(pooler(h[:, 0])), the next-sentence logits next_sentence(pooled); at the masked
        positions, gathered with jnp.take (one XLA gather, the positions static, sorted and unique),
        transform, GELU, transform_ln, then the decoder: an nn.Dense of its own, or with `embed` (the
        token embedding, tied) that module's Embed.attend plus the decoder's Bias. -> (masked-LM
        logits (B, M, V), next-sentence logits (B, 2))."""

        masked_positions: tuple
        vocabulary: int
        approximate: bool
        eps: float
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, embed=None):
            d = x.shape[-1]
            pooled = jnp.tanh(nn.Dense(d, dtype=self.dtype, name="pooler")(x[:, 0]))
            next_sentence = nn.Dense(2, dtype=self.dtype, name="next_sentence")(pooled)
            h = jnp.take(x, jnp.asarray(self.masked_positions, jnp.int32), axis=1, mode="clip",
                         indices_are_sorted=True, unique_indices=True)  # (B, M, D)
            h = jax.nn.gelu(nn.Dense(d, dtype=self.dtype, name="transform")(h), approximate=self.approximate)
            h = nn.LayerNorm(epsilon=self.eps, dtype=self.dtype, name="transform_ln")(h)
            if embed is None:
                return nn.Dense(self.vocabulary, dtype=self.dtype, name="decoder")(h), next_sentence
            return Bias(self.vocabulary, self.dtype, name="decoder")(embed.attend(h)), next_sentence

    return types.SimpleNamespace(PositionEmbedding=PositionEmbedding, PatchEmbedding=PatchEmbedding,
                                 SelfAttention=SelfAttention, Mlp=Mlp, TransformerBlock=TransformerBlock, Bias=Bias,
                                 PretrainingHeads=PretrainingHeads)


def _position_embedding(x, spec, at):
    return transformer_modules().PositionEmbedding(spec["max_length"], at.dtype, name=at.name)(x)


def _patch_embedding(x, spec, at):
    return transformer_modules().PatchEmbedding(spec["patch"], spec["dim"], spec["class_token"], at.dtype,
                                                name=at.name)(x)


def _layer_norm(x, spec, at):
    return _linen().LayerNorm(epsilon=spec["eps"], dtype=at.dtype, name=at.name)(x)


def _gelu(x, spec, at):
    return load_jax().nn.gelu(x, approximate=spec["form"] == "tanh")


def _attention(x, spec, at):
    return transformer_modules().SelfAttention(spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                               spec["dropout"], at.net.deterministic,
                                               at.how.get("attention_implementation"), at.dtype,
                                               at.how["attention_function"], name=at.name)(x, at.train)


def _transformer_block(x, spec, at):
    return transformer_modules().TransformerBlock(spec, at.net.deterministic, at.how.get("attention_implementation"),
                                                  at.dtype, at.how["attention_function"], name=at.name)(x, at.train)


def _token_pool(x, spec, at):
    return x[:, 0] if spec["mode"] == "class" else _jnp().mean(x, axis=1)


def _lm_head(x, spec, at):
    nn = _linen()
    vocabulary = spec["out_shape"][-1]
    if not spec["tied"]:
        return nn.Dense(vocabulary, use_bias=spec["bias"], dtype=at.dtype, name=at.name)(x)
    # the schema ties the head to layer 0, the token embedding: flax's tied decoder is that very
    # module's attend (x E^T with its table), so the table gets both uses' gradients and one update
    embed = at.modules.get("layer000")
    if not isinstance(embed, nn.Embed):
        raise TypeError(f"a tied lm_head needs the token embedding as layer 0, found {type(embed).__name__}")
    logits = embed.attend(x)
    return transformer_modules().Bias(vocabulary, at.dtype, name=at.name)(logits) if spec["bias"] else logits


SEGMENT_TABLE_STD = 0.02  # BERT's initialisation of its token-type table, as the other runners draw it


def _segment_embedding(x, spec, at):
    import numpy as np

    # BERT's token types: the fixed (T,) segment of each position looked up in an nn.Embed table
    # (flax BERT's token_type_embeddings), the same rows for every sample of the batch
    segment = np.asarray(np.arange(x.shape[1]) >= at.how["segment_boundary"], np.int32)
    nn = _linen()
    table = nn.Embed(spec["segments"], x.shape[-1], dtype=at.dtype, name=at.name,
                     embedding_init=nn.initializers.normal(stddev=SEGMENT_TABLE_STD))
    return x + table(_jnp().asarray(segment))[None]


def _pretraining_heads(x, spec, at):
    nn = _linen()
    embed = None
    if spec["tied"]:  # the decoder is layer 0's table, as a tied lm_head's (Embed.attend)
        embed = at.modules.get("layer000")
        if not isinstance(embed, nn.Embed):
            raise TypeError(f"tied pretraining_heads need the token embedding as layer 0, found {type(embed).__name__}")
    return transformer_modules().PretrainingHeads(at.how["masked_positions"], spec["out_shape"][-1],
                                                  spec["gelu"] == "tanh", spec["eps"], at.dtype,
                                                  name=at.name)(x, embed)


LAYERS = LayerTable("jax", {
    "dense": Layer(_dense), "conv2d": Layer(_conv2d), "max_pool": Layer(_max_pool), "avg_pool": Layer(_avg_pool),
    "global_avg_pool": Layer(_global_avg_pool), "batch_norm": Layer(_batch_norm), "relu": Layer(_relu), "sigmoid": Layer(_sigmoid),
    "tanh": Layer(_tanh), "flatten": Layer(_flatten), "dropout": Layer(_dropout), "embedding": Layer(_embedding), "lstm": Layer(_lstm),
    "residual": Layer(_residual), "position_embedding": Layer(_position_embedding), "patch_embedding": Layer(_patch_embedding),
    "layer_norm": Layer(_layer_norm), "gelu": Layer(_gelu), "attention": Layer(_attention), "transformer_block": Layer(_transformer_block),
    "token_pool": Layer(_token_pool), "lm_head": Layer(_lm_head), "segment_embedding": Layer(_segment_embedding),
    "pretraining_heads": Layer(_pretraining_heads),
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
            modules: dict = {}
            for i, (spec, how) in enumerate(zip(self.layers, self.plan)):
                x = LAYERS.builder(spec["type"])(x, spec, LayerCall(self, f"layer{i:03d}", train, how, modules))
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
        elif t == "position_embedding":
            yield f"{p}.weight", "params", (m, "pos_embedding"), "vector", None
        elif t == "patch_embedding":
            yield from _weight_bias_entries(p, (m, "proj"), True, "conv")
            if layer["class_token"]:
                yield f"{p}.class_token", "params", (m, "class_token"), "vector", None
        elif t == "layer_norm":
            yield from _ln_entries(p, (m,))
        elif t == "attention":
            yield from _attention_entries(p, (m,), layer["bias"])
        elif t == "transformer_block":
            yield from _ln_entries(f"{p}.ln1", (m, "ln1"))
            yield from _attention_entries(f"{p}.attn", (m, "attn"), layer["bias"])
            yield from _ln_entries(f"{p}.ln2", (m, "ln2"))
            for fc in ("fc1", "fc2"):
                yield from _weight_bias_entries(f"{p}.mlp.{fc}", (m, "mlp", fc), layer["bias"])
        elif t == "lm_head":
            if not layer["tied"]:
                yield from _weight_bias_entries(p, (m,), layer["bias"])
            elif layer["bias"]:  # tied: the weight is 000.weight, the embedding's table; only a bias of its own
                yield f"{p}.bias", "params", (m, "bias"), "vector", None
        elif t == "segment_embedding":
            yield f"{p}.weight", "params", (m, "embedding"), "vector", None
        elif t == "pretraining_heads":
            for part in ("pooler", "next_sentence", "transform"):
                yield from _weight_bias_entries(f"{p}.{part}", (m, part), True)
            yield from _ln_entries(f"{p}.transform_ln", (m, "transform_ln"))
            if not layer["tied"]:  # tied: the weight is 000.weight, the embedding's table
                yield f"{p}.decoder.weight", "params", (m, "decoder", "kernel"), "dense", None
            yield f"{p}.decoder.bias", "params", (m, "decoder", "bias"), "vector", None


def _weight_bias_entries(prefix: str, path: tuple, bias: bool, kind: str = "dense"):
    yield f"{prefix}.weight", "params", path + ("kernel",), kind, None
    if bias:
        yield f"{prefix}.bias", "params", path + ("bias",), "vector", None


def _ln_entries(prefix: str, path: tuple):
    yield f"{prefix}.gamma", "params", path + ("scale",), "vector", None
    yield f"{prefix}.beta", "params", path + ("bias",), "vector", None


def _attention_entries(prefix: str, path: tuple, bias: bool):
    # nn.Dense's (dim, heads*head_size) kernels: their columns are the canonical head-major rows
    for part in ("q", "k", "v", "out"):
        yield from _weight_bias_entries(f"{prefix}.{part}", path + (part,), bias)


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

def host_init(abstract: dict, rng, embedding_std: dict | None = None, dense_init: dict | None = None) -> dict:
    """Initial values for flax's variable shapes, drawn with numpy (the same schemes as flax's
    defaults: LeCun-normal kernels, zero biases, N(0, 1/dim) embeddings, unit BN and layer-norm
    scales, unit BN variance, U(-1/sqrt(h), 1/sqrt(h)) LSTM weights; N(0, 0.02^2) position tables
    and class tokens, as transformer_modules draws them). `embedding_std`: module name -> the
    described N(0, std^2) of that embedding's table (its `init_std`), in place of flax's default;
    `dense_init`: module name -> a dense layer's described `init` (variance scale / fan, normal or
    uniform; definitions/schema.py), in place of LeCun-normal."""
    import numpy as np

    embedding_std = embedding_std or {}
    dense_init = dense_init or {}

    def one(path, s):
        leaf = path[-1].key
        shape = tuple(s.shape)
        if leaf == "kernel":
            fan_in, fan_out = int(np.prod(shape[:-1])), shape[-1]
            init = dense_init.get(getattr(path[-2], "key", None)) if len(path) > 1 else None
            if init is None:
                return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
            fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[init["mode"]]
            std = np.sqrt(init["scale"] / fan)
            if init["distribution"] == "normal":
                return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
            return rng.uniform(-np.sqrt(3) * std, np.sqrt(3) * std, shape).astype(np.float32)
        if leaf == "embedding":
            std = embedding_std.get(getattr(path[-2], "key", None)) or 1 / np.sqrt(shape[-1])
            return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
        if leaf in ("pos_embedding", "class_token"):  # transformer_modules' table_init
            return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if leaf in ("w_ih", "w_hh"):
            bound = 1.0 / np.sqrt(shape[-1] // 4)
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if leaf in ("scale", "var"):
            return np.ones(shape, np.float32)
        return np.zeros(shape, np.float32)  # bias, beta, running mean

    import jax

    return jax.tree_util.tree_map_with_path(one, abstract)


def logits_of(out):
    """The logits of a network's output: pretraining heads' output is (masked-LM logits,
    next-sentence logits), whose logits are the first; any other network's output is its logits."""
    return out[0] if isinstance(out, tuple) else out


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
        self.tokens = inp["kind"] in ("tokens", "masked_tokens")  # int32 token ids
        self.masked = inp["kind"] == "masked_tokens"
        self.has_lstm = any(layer["type"] == "lstm" for layer in network["layers"])
        self.lstm_unroll = 1  # the recurrence is small next to the vocabulary dense; unrolling only slows compilation
        for layer in network["layers"]:
            LAYERS.builder(layer["type"])  # an unknown type fails here, naming it, before anything is traced
        self.has_dropout = not self.deterministic and any(dropout_rate(layer) > 0 for layer in network["layers"])
        self.device = request.get("device", "cpu")
        self.attention = self.plan_attention()  # writes each attention's `implementation` into the plan
        self.model = network_class()(layers=tuple(network["layers"]), plan=tuple(self.plan),
                                deterministic=self.deterministic, lstm_unroll=self.lstm_unroll, dtype=dtype)
        self.tx = optax.sgd(request["learning_rate"], momentum=request["momentum"])

    def plan_attention(self) -> dict:
        """Per attention (an attention layer's or a block's, by layer index): the function it calls
        in the step's mode and why (attention_function), the `implementation` asked of
        jax.nn.dot_product_attention, and, where cuDNN's was asked but jax refuses it for this layer's
        shape or this GPU, None asked instead and jax's reason. The asked implementation goes into
        the layer's plan, which the builder reads."""
        out = {}
        for i, layer in enumerate(self.network["layers"]):
            if layer["type"] not in ("attention", "transformer_block"):
                continue
            dropout_on = self.train and not self.deterministic and layer["dropout"] > 0
            function, why = attention_function(self.compute_dtype, dropout_on, self.device)
            entry = {"function": function, **({"why": why} if why else {})}
            self.plan[i]["attention_function"] = function
            if function == ATTENTION_FUNCTION:
                asked = attention_asked(self.compute_dtype, self.device)
                refused = cudnn_refusal(layer, self.compute_dtype, self.train) if asked == "cudnn" else None
                if refused:  # the step then passes None and jax chooses
                    entry["cudnn_refused"] = f"jax refused implementation='cudnn' for this layer: {refused}"
                    asked = None
                entry["implementation_asked"] = asked
                self.plan[i]["attention_implementation"] = asked
            out[f"{i:03d}"] = entry
        return out

    def host_batch(self, batch: int, rng, inputs: str | None = None):
        """(x, y) as contiguous numpy arrays: images NHWC, tokens int32; masked tokens' y is (B, M + 1),
        the M masked positions' tokens then the next-sentence label (equivalence.make_inputs' draw)."""
        import numpy as np

        inp = self.network["input"]
        if inputs:
            with np.load(inputs) as data:
                x_np, y_np = data["x"], data["y"]
            if self.images:
                x_np = x_np.transpose(0, 2, 3, 1)  # canonical NCHW -> NHWC, once
        elif self.masked:
            masked = len(inp["masked_positions"])
            x_np = rng.integers(0, inp["vocabulary"], (batch, inp["sequence_length"]))
            y_np = rng.integers(0, inp["vocabulary"], (batch, masked + 1))
            y_np[:, masked] = rng.integers(0, 2, batch)
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
        described = {f"layer{i:03d}": layer["init_std"] if layer["type"] == "embedding" else SEGMENT_TABLE_STD
                     for i, layer in enumerate(self.network["layers"])
                     if layer.get("init_std") or layer["type"] == "segment_embedding"}
        dense = {f"layer{i:03d}": layer["init"] for i, layer in enumerate(self.network["layers"])
                 if layer["type"] == "dense" and layer.get("init")}
        return jax.tree.map(lambda v: v.astype(self.storage), host_init(abstract, rng, described, dense))

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
        out = load_jax().eval_shape(lambda p, s, x: logits_of(self.apply(p, s, None, x, False)[0]), params, stats, x)
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
    def loss_of(out, y):
        """The network's loss on its output: softmax cross-entropy, mean over the samples (or every
        position's token); for pretraining heads' (masked-LM, next-sentence) logits
        masked_lm_and_next_sentence, the mean over the B x M masked positions against y[:, :M] plus
        the mean over the B samples against y[:, M]."""
        import jax.numpy as jnp
        import optax

        def cross_entropy(logits, labels):
            logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # bfloat16 up, float64 kept
            return optax.softmax_cross_entropy_with_integer_labels(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).mean()

        if isinstance(out, tuple):
            masked_lm, next_sentence = out
            masked = masked_lm.shape[1]
            return cross_entropy(masked_lm, y[:, :masked]) + cross_entropy(next_sentence, y[:, masked])
        return cross_entropy(out, y)

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
        out, first = jax.eval_shape(forward, variables, x, key)
        logits = logits_of(out)
        return {"first_layer_output_dtype": str(first.dtype), "logits_dtype": str(logits.dtype)}

    def attention_settings(self, p, stats, x) -> dict | None:
        """settings["attention"]: per attention, the function called and the `implementation` asked
        (plan_attention), and the kernel jax traced for it, read from the step's jaxpr (the forward,
        and the backward in training, traced as the jitted step traces it; nothing compiled): cuDNN's
        fused attention where its dot_product_attention_* primitives are in the layer's scope, else
        XLA's own dot_general, softmax (exp) and dot_general. None when the network has no attention."""
        import json

        import numpy as np

        if not self.attention:
            return None
        jax = load_jax()
        variables = {"params": p, "batch_stats": stats} if stats else {"params": p}
        key = jax.ShapeDtypeStruct((2,), np.uint32)

        def step(variables, x, key):
            rngs = {"dropout": key} if (self.has_dropout and self.train) else None
            mutable = ["batch_stats"] if (self.train and stats) else False

            def forward(variables):
                out = self.model.apply(variables, x, train=self.train, mutable=mutable, rngs=rngs)
                out = out[0] if mutable else out
                return sum(o.astype(np.float32).sum() for o in jax.tree.leaves(out))  # both heads' logits

            return jax.grad(forward)(variables) if self.train else forward(variables)

        traced = traced_primitives(jax.make_jaxpr(step)(variables, x, key))
        kernels = {}
        for index in self.attention:
            layer = self.network["layers"][int(index)]
            scope = f"layer{index}/" + ("attn/" if layer["type"] == "transformer_block" else "")
            seen = {name for name, stack in traced if f"{stack}/".find(scope) >= 0}
            if any(name.startswith(CUDNN_PRIMITIVE) for name in seen):
                kernels[index] = "cudnn"
            elif {"dot_general", "exp"} <= seen:  # the products and the softmax (no other exp in an attention)
                kernels[index] = "xla"
            else:
                kernels[index] = "unknown: " + ", ".join(sorted(seen))

        def one_or_each(field: str, by_layer: dict | None = None):
            """One value where every attention has the field and the same value, else layer -> value
            for the attentions that have it."""
            if by_layer is None:
                by_layer = {i: e[field] for i, e in self.attention.items() if field in e}
            distinct = {json.dumps(v, sort_keys=True) for v in by_layer.values()}
            return next(iter(by_layer.values())) if len(by_layer) == len(self.attention) and len(distinct) == 1 \
                else by_layer

        out = {"function": one_or_each("function"), "kernel": one_or_each("kernel", kernels)}
        for field in ("implementation_asked", "why", "cudnn_refused"):
            if any(field in e for e in self.attention.values()):
                out[field] = one_or_each(field)
        out["probe"] = ("the kernel: primitives of each attention's flax scope in the step's jaxpr (jax.make_jaxpr of "
                        f"the {'forward and backward' if self.train else 'forward'} the jitted step runs): "
                        f"{CUDNN_PRIMITIVE}* is cuDNN's fused attention (a custom call), dot_general and the "
                        "softmax's exp XLA's own; implementation_asked None: jax chooses, and `kernel` is what it "
                        "chose")
        return out

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
            "dropout": ("identity (deterministic; attention and transformer blocks at rate 0)" if self.deterministic
                        else "per-step key split inside the step")
            if any(layer["type"] == "dropout" or dropout_rate(layer) > 0 for layer in network["layers"]) else None,
            "transformer": ("sequences (B, T, D); q, k, v as nn.Dense reshaped to (B, T, heads, head_size), heads "
                            "head-major; flax nn.LayerNorm, jax.nn.gelu in the network's form; a tied head is the "
                            "token embedding's Embed.attend"
                            if any(layer["type"] in TRANSFORMER_TYPES for layer in network["layers"]) else None),
            "pretraining_heads": ("segments: nn.Embed lookup of the fixed (T,) segment ids, broadcast over the batch; "
                                  "masked positions gathered by jnp.take (static, sorted, unique: one XLA gather); "
                                  "loss masked_lm_and_next_sentence (optax cross-entropy over B*M masked tokens + "
                                  "over B next-sentence labels)"
                                  if any(layer["type"] == "pretraining_heads" for layer in network["layers"]) else None),
            "precision": self.precision,
            "precision_effective": self.precision_settings(params, stats, x),
            "attention": self.attention_settings(params, stats, x) if params is not None and x is not None else None,
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
