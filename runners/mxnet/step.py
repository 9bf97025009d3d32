"""What the mxnet runner's single-process and multi-worker steps share: the Gluon network built
from the layer table (layers.py), initialised and wrapped with its loss (masked_lm_and_next_sentence
among them), hybridised; synthetic data and its transfer to the device; the SGD-momentum optimiser;
the trainable parameters and the output shape. runner.py, distributed.py, generate.py and
convergence.py build from here.
"""

from __future__ import annotations

import functools
import types

from runners.mxnet.framework import has_attention, load_mxnet
from runners.mxnet.layers import LAYERS, block_classes
from runners.mxnet.transformer import fused_attention_unavailable


@functools.lru_cache(maxsize=None)
def with_loss_class():
    """The WithLoss block class, which needs the framework (defined once, lazily)."""
    mx = load_mxnet()

    class WithLoss(mx.gluon.HybridBlock):
        """The network and its loss: the mean softmax cross-entropy (over the batch, and the steps of an
        LM), or with `masked` (the M masked positions of a masked_tokens input) BERT's
        masked_lm_and_next_sentence: the network gives (masked-LM logits, next-sentence logits), y is
        (B, M + 1), and the loss is the mean cross-entropy over the B*M masked positions plus the mean
        next-sentence cross-entropy over the B samples. Returns (logits, loss): the masked-LM logits."""

        def __init__(self, net, masked: int | None = None, **kwargs):
            super().__init__(**kwargs)
            self.masked = masked
            with self.name_scope():
                self.net = net
                self.loss = mx.gluon.loss.SoftmaxCrossEntropyLoss(axis=-1, sparse_label=True)

        def hybrid_forward(self, F, x, y):
            out = self.net(x)
            if self.masked is None:
                # per sample the loss is already the mean over the steps (of an LM); then the batch mean
                return out, F.mean(self.loss(out, y))
            masked_lm, next_sentence = out
            m = self.masked
            lm = F.mean(self.loss(masked_lm, F.slice_axis(y, axis=1, begin=0, end=m)))  # M per sample: B*M mean
            ns = F.mean(self.loss(next_sentence, F.reshape(F.slice_axis(y, axis=1, begin=m, end=m + 1), shape=(-1,))))
            return masked_lm, lm + ns

    return WithLoss


def build_block(spec: dict, build):
    """One resolved layer (see dlbench.definitions.network) as a Gluon HybridBlock."""
    return LAYERS.builder(spec["type"])(spec, build)


def build_network(network: dict, deterministic: bool = False, fused_attention: bool = True, float64: bool = False):
    """(HybridSequential, [block per resolved layer, None where the layer is dropped], classes).
    `deterministic`: dropout layers are left out, and attention and transformer blocks are built with
    dropout rate 0 (on the probabilities and the branches). `fused_attention`: MXNet's fused
    interleaved_matmul_selfatt operators (False: their documented equivalent, batch_dot; see
    fused_attention_unavailable). `float64`: the network will be cast to float64 (GELU's erf form and
    layer norm are then built from operators that compute in float64; see GeluErf, LayerNormFloat64)."""
    mx = load_mxnet()
    build = types.SimpleNamespace(classes=block_classes(), built=[], fused_attention=fused_attention, float64=float64,
                                  input=network["input"])
    net = mx.gluon.nn.HybridSequential(prefix="net_")
    with net.name_scope():
        for layer in network["layers"]:
            if deterministic and layer["type"] == "dropout":
                build.built.append(None)  # dropout as the identity: simply not in the graph
                continue
            if deterministic and layer.get("dropout"):  # attention, transformer_block: their own rate
                layer = {**layer, "dropout": 0.0}
            block = build_block(layer, build)
            net.add(block)
            build.built.append(block)
    return net, build.built, build.classes


# ---------------------------------------------------------------------------------------------
# what the single-process and the multi-worker steps share


HYBRIDIZE = {"static_alloc": True, "static_shape": True}


def build_model(network: dict, ctx, deterministic: bool = False, dtype: str = "float32", hybridize: bool = True,
                fused_attention: bool | None = None):
    """(net, blocks, model): the network initialised on `ctx` (He-normal weights, fan-in; biases,
    batch norms and LSTM biases keep their own initialisers) and, around it, the block of the network
    and its loss, hybridised unless `hybridize` is False (then `hybridize_model(model)` does it later):
    one cached graph per mode, memory planned once.

    `dtype` "float64": Gluon's own mechanism, Block.cast, before initialisation, so that every
    parameter and batch-norm statistic is created in float64 (Gluon's BatchNorm keeps float32
    statistics only under float16); the LSTM layer's cast also makes its zero initial states
    float64. Activations, gradients and the loss then follow the parameters' and the input's dtype.

    `fused_attention` None: MXNet's fused self-attention operators wherever they run in `dtype` on
    `ctx` (fused_attention_unavailable).
    """
    mx = load_mxnet()
    if fused_attention is None:
        fused_attention = not has_attention(network) or fused_attention_unavailable(ctx, dtype) is None
    net, blocks, _ = build_network(network, deterministic, fused_attention, float64=dtype == "float64")
    if dtype != "float32":
        net.cast(dtype)  # the Embedding operator takes its dtype from the (now float64) weight
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctx)
    model = with_loss_class()(net, masked_count(network))
    if hybridize:
        hybridize_model(model)
    return net, blocks, model


def masked_count(network: dict) -> int | None:
    """M, the masked positions of a network trained with masked_lm_and_next_sentence (else None)."""
    if network.get("loss") != "masked_lm_and_next_sentence":
        return None
    return len(network["input"]["masked_positions"])


def hybridize_model(model) -> None:
    """Gluon's graph mode: the CachedOp of the network and its loss (static_alloc, static_shape),
    built on the next call; it also hybridises the network (what the inference step calls)."""
    model.hybridize(**HYBRIDIZE)


def synthetic_batch(network: dict, batch: int, rng):
    """(x, y) as numpy arrays drawn from `rng` (numpy.random.Generator), channels-first images; a
    masked_tokens input's y is (batch, M + 1), as equivalence.make_inputs draws it."""
    import numpy as np

    inp = network["input"]
    if inp["kind"] == "tokens":
        shape = (batch, inp["sequence_length"])
        return rng.integers(0, inp["vocabulary"], shape), rng.integers(0, inp["vocabulary"], shape)
    if inp["kind"] == "masked_tokens":  # y: the M masked positions' tokens, then the next-sentence label
        masked = len(inp["masked_positions"])
        x_np = rng.integers(0, inp["vocabulary"], (batch, inp["sequence_length"]))
        y_np = rng.integers(0, inp["vocabulary"], (batch, masked + 1))
        y_np[:, masked] = rng.integers(0, 2, batch)
        return x_np, y_np
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
    if isinstance(sym, (list, tuple)):  # pretraining_heads: (masked-LM logits, next-sentence logits)
        sym = sym[0]
    _, out_shapes, _ = sym.infer_shape(data=(1, *x.shape[1:]))
    return list(out_shapes[0][1:])
