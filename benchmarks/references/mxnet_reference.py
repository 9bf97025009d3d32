"""MXNet reference: gluon's model zoo ResNet-50 v1 and, for LSTM-32, gluon's Embedding + rnn.LSTM +
Dense, hybridised with static allocation as gluon's performance guide recommends, trained with
autograd.record and a gluon Trainer.

The model zoo's resnet50_v1 strides the first 1x1 convolution of a downsampling block; the suite's
ResNet-50 (like torchvision's) strides the 3x3, which costs about 5% more FLOPs at the same parameter
count. So that the ratio compares the same network, the reference moves each of those strides from
the zoo block's 1x1 to its 3x3 after construction (DLBENCH_REFERENCE_ZOO_STRIDES=1 keeps the zoo's own placement) and
says so in its model name. Threads: OMP_NUM_THREADS, set by the caller before the interpreter starts
(MXNet sizes its pool when the library loads).

GPT-2 small: GluonNLP 0.10.0, the last release for MXNet 1.x (on PyPI, an sdist), has no GPT-2 in
its package: its GPT2Model lives in the repository's scripts/text_generation/model/gpt.py, beside
pretrained-weight downloads. So the model here is written the way that GPT2Model is: Gluon
HybridBlocks, nn.Embedding for tokens and for positions (looked up with contrib.arange_like), per
layer one nn.Dense to q, k and v, split and folded to (batch x heads, T, S), the scores by batch_dot
of the pre-scaled queries, a causal mask (broadcast_lesser_equal of the positions, one per head) and
GluonNLP's masked softmax (the masked scores filled with -1e18, softmax, multiplied by the mask),
dropout on the probabilities, batch_dot with the values, an out nn.Dense; nn.LayerNorm, GluonNLP's
tanh GELU written from operators, and the head a bias-free nn.Dense sharing the token embedding's
parameters (params=embed.params). GPT-2's other dropouts (embeddings, both branches, 0.1) are added:
GluonNLP's pretrained configuration sets 0 and applies dropout to the probabilities only. Trained with
SoftmaxCrossEntropyLoss (per sample the mean over the positions) and Trainer.step(batch): the mean over
every position.
"""

from __future__ import annotations

import os

import math

from reference_loop import (CLASSES, EMBEDDING, GPT2, HIDDEN, IMAGE, SEQUENCE, VOCABULARY, canonical_inputs, parse_args,
                            sequence, time_steps)


def gpt2_model(mx):
    """GPT-2 small as GluonNLP's GPT2Model (scripts/text_generation/model/gpt.py) builds it, with
    GPT-2's training dropouts."""
    from mxnet.gluon import HybridBlock, nn

    units, heads, rate = GPT2["width"], GPT2["heads"], GPT2["dropout"]
    weight_init = mx.init.Normal(0.02)

    class GELU(HybridBlock):  # GluonNLP's GELU(approximate=True)
        def hybrid_forward(self, F, x):
            return 0.5 * x * (1 + F.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x ** 3))))

    class SelfAttention(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.qkv_proj = nn.Dense(3 * units, flatten=False, in_units=units, weight_initializer=weight_init,
                                         prefix="qkv_proj_")
                self.attn_dropout = nn.Dropout(rate)
                self.out_proj = nn.Dense(units, flatten=False, in_units=units, weight_initializer=weight_init,
                                         prefix="out_proj_")

        def hybrid_forward(self, F, data):
            positions = F.contrib.arange_like(data, axis=1)
            mask = F.broadcast_lesser_equal(positions.reshape((1, -1)), positions.reshape((-1, 1)))  # (T, T)
            mask = F.broadcast_like(F.expand_dims(mask, axis=0), data, lhs_axes=(0,), rhs_axes=(0,))
            mask = F.concat(*[mask] * heads, dim=0)  # (heads x batch, T, T), head-major as the folded heads
            qkv = F.swapaxes(self.qkv_proj(data), 1, 2)  # (B, 3 units, T)
            query, key, value = (F.swapaxes(F.reshape(F.reshape(part, shape=(0, -4, heads, -1, 0)),
                                                      shape=(-1, 0, 0), reverse=True), 1, 2)
                                 for part in F.split(qkv, num_outputs=3, axis=1))  # each (heads x B, T, S)
            scores = F.batch_dot(F.contrib.div_sqrt_dim(query), key, transpose_b=True)
            scores = F.where(mask, scores, -1e18 * F.ones_like(scores))  # GluonNLP's _masked_softmax
            weights = self.attn_dropout(F.softmax(scores, axis=-1) * mask)
            out = F.batch_dot(weights, value)  # (heads x B, T, S)
            out = F.transpose(F.reshape(out, shape=(-1, heads, 0, 0), reverse=True), axes=(0, 2, 1, 3))
            return self.out_proj(F.reshape(out, shape=(0, 0, -1)))

    class FFN(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.hidden_map = nn.Dense(4 * units, flatten=False, in_units=units, weight_initializer=weight_init)
                self.out_map = nn.Dense(units, flatten=False, in_units=4 * units, weight_initializer=weight_init)
                self.act = GELU()

        def hybrid_forward(self, F, data):
            return self.out_map(self.act(self.hidden_map(data)))

    class GPT2Model(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.pos_embed = nn.Embedding(GPT2["context"], units, weight_initializer=mx.init.Normal(0.01),
                                              prefix="pos_embed_")
                self.embed = nn.Embedding(GPT2["vocabulary"], units, weight_initializer=weight_init, prefix="embed_")
                self.logits_proj = nn.Dense(GPT2["vocabulary"], in_units=units, use_bias=False, flatten=False,
                                            params=self.embed.params)  # the tied head
                self.embed_dropout = nn.Dropout(rate)
                self.attention, self.ffn = nn.HybridSequential(), nn.HybridSequential()
                self.attn_ln, self.ffn_ln = nn.HybridSequential(), nn.HybridSequential()
                self.attn_dropout, self.ffn_dropout = nn.HybridSequential(), nn.HybridSequential()
                for i in range(GPT2["layers"]):
                    self.attention.add(SelfAttention(prefix=f"self_attn{i}_"))
                    self.ffn.add(FFN(prefix=f"ffn{i}_"))
                    self.attn_ln.add(nn.LayerNorm(epsilon=GPT2["eps"], in_channels=units, prefix=f"attn_ln{i}_"))
                    self.ffn_ln.add(nn.LayerNorm(epsilon=GPT2["eps"], in_channels=units, prefix=f"ffn_ln{i}_"))
                    self.attn_dropout.add(nn.Dropout(rate))
                    self.ffn_dropout.add(nn.Dropout(rate))
                self.final_ln = nn.LayerNorm(epsilon=GPT2["eps"], in_channels=units, prefix="final_ln_")

        def hybrid_forward(self, F, data):
            positions = F.broadcast_like(F.expand_dims(F.contrib.arange_like(data, axis=1), axis=0), data,
                                         lhs_axes=(0,), rhs_axes=(0,))
            out = self.embed_dropout(self.embed(data) + self.pos_embed(positions))
            for i in range(GPT2["layers"]):
                out = out + self.attn_dropout[i](self.attention[i](self.attn_ln[i](out)))
                out = out + self.ffn_dropout[i](self.ffn[i](self.ffn_ln[i](out)))
            return self.logits_proj(self.final_ln(out))

    return GPT2Model(prefix="gpt2_")


def _stride_on_3x3(net) -> int:
    """Move each BottleneckV1's stride from its first (1x1) convolution to its 3x3; return how many.

    Blocks are still deferred (no shapes yet), so changing the convolutions' stride arguments before
    the first forward changes the network that is built."""
    from mxnet.gluon.model_zoo.vision.resnet import BottleneckV1

    moved = 0
    for stage in net.features._children.values():
        for block in getattr(stage, "_children", {}).values():
            if not isinstance(block, BottleneckV1):
                continue
            convs = [c for c in block.body._children.values() if type(c).__name__ == "Conv2D"]
            if convs[0]._kwargs["stride"] != (1, 1):
                convs[1]._kwargs["stride"], convs[0]._kwargs["stride"] = convs[0]._kwargs["stride"], (1, 1)
                moved += 1
    return moved


def main() -> None:
    args = parse_args()
    os.environ.setdefault("MXNET_CPU_WORKER_NTHREADS", "1")
    import mxnet as mx
    from mxnet import autograd, gluon

    ctx = mx.gpu(0) if args.device == "cuda" else mx.cpu()
    mx.random.seed(0)
    if args.network == "resnet50":
        net = gluon.model_zoo.vision.resnet50_v1(classes=CLASSES)
        source = "gluon model_zoo.vision.resnet50_v1"
        if os.environ.get("DLBENCH_REFERENCE_ZOO_STRIDES") != "1":
            moved = _stride_on_3x3(net)
            source += f" (stride moved to the 3x3 in {moved} blocks: v1.5, as the suite)"
        x = mx.nd.random.normal(shape=(args.batch, IMAGE[2], IMAGE[0], IMAGE[1]), ctx=ctx)
        y = mx.nd.random.randint(0, CLASSES, shape=(args.batch,), ctx=ctx).astype("float32")
    elif args.network == "gpt2_small":
        net = gpt2_model(mx)
        source = ("Gluon GPT-2 small written as GluonNLP's GPT2Model (batch_dot attention, masked softmax, "
                  "params-shared head) with GPT-2's dropouts")
        x = mx.nd.random.randint(0, GPT2["vocabulary"], shape=(args.batch, sequence(args)), ctx=ctx).astype("float32")
        y = mx.nd.random.randint(0, GPT2["vocabulary"], shape=(args.batch, sequence(args)), ctx=ctx).astype("float32")
    else:
        net = gluon.nn.HybridSequential()
        net.add(gluon.nn.Embedding(VOCABULARY, EMBEDDING),
                gluon.rnn.LSTM(HIDDEN, num_layers=2, layout="NTC", input_size=EMBEDDING),
                gluon.nn.Dense(VOCABULARY, flatten=False, in_units=HIDDEN))
        source = "gluon Embedding + rnn.LSTM(num_layers=2) + Dense"
        x = mx.nd.random.randint(0, VOCABULARY, shape=(args.batch, SEQUENCE), ctx=ctx).astype("float32")
        y = mx.nd.random.randint(0, VOCABULARY, shape=(args.batch, SEQUENCE), ctx=ctx).astype("float32")
    given = canonical_inputs(args)
    if given is not None:  # the runner's batch (Gluon's loss and embedding take indices as float32)
        x, y = (mx.nd.array(a, ctx=ctx, dtype="float32") for a in given)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.learning_rate, "momentum": args.momentum})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def step():
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(args.batch)

    step()  # materialise the deferred shapes before counting parameters
    mx.nd.waitall()
    params = sum(int(p.data().size) for p in net.collect_params().values() if p.grad_req != "null")
    time_steps(step, mx.nd.waitall, args, model=source, params=params, framework=f"mxnet {mx.__version__}",
               threads=int(os.environ.get("OMP_NUM_THREADS", "0")) or None)


if __name__ == "__main__":
    main()
