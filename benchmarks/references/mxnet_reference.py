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

The llm suite (llama_tiny, smollm2_135m; moe_tiny): GluonNLP has no Llama (its last MXNet 1.x release
predates it), so the decoder is a Gluon Llama written as that GPT2Model is, from the configuration
fairness.py passes (--llm: the suite's description): HybridBlocks, an RMSNorm composed from operators
(MXNet 1.9 has none), bias-free nn.Dense q, k and v, rotary position embedding from cos and sin
constants (the rotate-half form), the key/value heads repeated to the query heads (transformers'
repeat_kv), batch_dot attention with the causal masked softmax, a SwiGLU of bias-free nn.Dense (SiLU
as x * sigmoid(x)). The MoE block is written as a Gluon user with static shapes must (a hybridised
graph has no data-dependent shapes): a router nn.Dense, softmax, F.topk, the chosen weights
renormalised and scattered to (tokens, E) by one_hot, then each expert, a SwiGLU of its own, on every
token, weighted and summed (keras_hub's Mixtral computes its experts the same dense way); its
load-balancing loss (Switch's E * sum(f*P), times the coefficient over the blocks) is the network's
second output, added to every sample's loss.
"""

from __future__ import annotations

import os

import math

from reference_loop import (CLASSES, EMBEDDING, GPT2, HIDDEN, IMAGE, LLM_NETWORKS, SEQUENCE, VOCABULARY,
                            canonical_inputs, parse_args, sequence, time_steps)


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


def llama_model(mx, cfg: dict, steps: int):
    """The suite's Llama-style decoder (with experts, its MoE) as Gluon HybridBlocks, for `steps` tokens."""
    import numpy as np
    from mxnet.gluon import HybridBlock, nn

    width, heads, kv_heads = cfg["width"], cfg["heads"], cfg["kv_heads"]
    size = width // heads
    half = size // 2
    angles = np.arange(steps)[:, None] * (1.0 / cfg["rope_theta"] ** (np.arange(half) / half))[None, :]
    cos_table = np.concatenate([np.cos(angles)] * 2, -1).astype("float32")  # (T, S)
    sin_table = np.concatenate([np.sin(angles)] * 2, -1).astype("float32")
    causal = np.tril(np.ones((steps, steps), dtype="float32"))[None]  # (1, T, T)

    def dense(units, in_units, **kwargs):
        return nn.Dense(units, in_units=in_units, flatten=False, use_bias=False, **kwargs)

    class RMSNorm(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.gamma = self.params.get("gamma", shape=(width,), init=mx.init.One())

        def hybrid_forward(self, F, x, gamma):
            scale = F.rsqrt(F.mean(F.square(x), axis=-1, keepdims=True) + cfg["eps"])
            return F.broadcast_mul(F.broadcast_mul(x, scale), gamma)

    class Attention(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.q, self.k = dense(heads * size, width), dense(kv_heads * size, width)
                self.v, self.out = dense(kv_heads * size, width), dense(width, heads * size)
                self.cos = self.params.get_constant("cos", mx.nd.array(cos_table[None, None]))  # (1, 1, T, S)
                self.sin = self.params.get_constant("sin", mx.nd.array(sin_table[None, None]))
                self.mask = self.params.get_constant("mask", mx.nd.array(causal))

        def hybrid_forward(self, F, x, cos, sin, mask):
            def split(t, n):  # (B, T, n*S) -> (B, n, T, S)
                return F.transpose(F.reshape(t, shape=(0, 0, n, size)), axes=(0, 2, 1, 3))

            def rotate(t):
                rotated = F.concat(-F.slice_axis(t, axis=-1, begin=half, end=None),
                                   F.slice_axis(t, axis=-1, begin=0, end=half), dim=-1)
                return F.broadcast_mul(t, cos) + F.broadcast_mul(rotated, sin)

            q, k, v = rotate(split(self.q(x), heads)), rotate(split(self.k(x), kv_heads)), split(self.v(x), kv_heads)
            if heads != kv_heads:  # each key/value head serves heads / kv_heads consecutive query heads
                k, v = (F.repeat(t, repeats=heads // kv_heads, axis=1) for t in (k, v))
            q, k, v = (F.reshape(t, shape=(-3, 0, 0)) for t in (q, k, v))  # (B*H, T, S)
            scores = F.batch_dot(F.contrib.div_sqrt_dim(q), k, transpose_b=True)
            full = F.broadcast_like(mask, scores, lhs_axes=(0,), rhs_axes=(0,))
            scores = F.where(full, scores, -1e18 * F.ones_like(scores))  # GluonNLP's masked softmax
            out = F.batch_dot(F.softmax(scores, axis=-1) * full, v)  # (B*H, T, S)
            out = F.transpose(F.reshape(out, shape=(-4, -1, heads, 0, 0)), axes=(0, 2, 1, 3))
            return self.out(F.reshape(out, shape=(0, 0, -1)))

    class SwiGLU(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.gate, self.up = dense(cfg["hidden"], width), dense(cfg["hidden"], width)
                self.down = dense(width, cfg["hidden"])

        def hybrid_forward(self, F, x):
            g = self.gate(x)
            return self.down(g * F.sigmoid(g) * self.up(x))

    class MoE(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.router = dense(cfg["experts"], width)
                self.experts = nn.HybridSequential()
                for e in range(cfg["experts"]):
                    self.experts.add(SwiGLU(prefix=f"expert{e}_"))

        def hybrid_forward(self, F, x):
            tokens = F.reshape(x, shape=(-3, 0))  # (N, D)
            p = F.softmax(self.router(tokens), axis=-1)  # (N, E)
            picked, chosen = F.topk(p, k=cfg["top_k"], ret_typ="both", axis=-1)
            picked = F.broadcast_div(picked, F.sum(picked, axis=-1, keepdims=True))
            onehot = F.one_hot(chosen, cfg["experts"])  # (N, k, E)
            weights = F.sum(F.broadcast_mul(onehot, F.expand_dims(picked, axis=2)), axis=1)  # (N, E)
            out = None
            for e in range(cfg["experts"]):
                part = F.broadcast_mul(self.experts[e](tokens), F.slice_axis(weights, axis=1, begin=e, end=e + 1))
                out = part if out is None else out + part
            fraction = F.mean(F.sum(onehot, axis=1), axis=0)  # f_e
            aux = cfg["experts"] * F.sum(fraction * F.mean(p, axis=0)) * (cfg["aux_loss_coefficient"] / cfg["layers"])
            return F.reshape_like(out, x), aux

    class Llama(HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.embed = nn.Embedding(cfg["vocabulary"], width, weight_initializer=mx.init.Normal(cfg["init_std"]),
                                          prefix="embed_")
                self.attention, self.ffn = nn.HybridSequential(), nn.HybridSequential()
                self.attn_norm, self.ffn_norm = nn.HybridSequential(), nn.HybridSequential()
                for i in range(cfg["layers"]):
                    self.attention.add(Attention(prefix=f"attn{i}_"))
                    self.ffn.add(MoE(prefix=f"moe{i}_") if cfg["experts"] else SwiGLU(prefix=f"mlp{i}_"))
                    self.attn_norm.add(RMSNorm(prefix=f"attn_norm{i}_"))
                    self.ffn_norm.add(RMSNorm(prefix=f"ffn_norm{i}_"))
                self.final_norm = RMSNorm(prefix="final_norm_")
                self.head = (dense(cfg["vocabulary"], width, params=self.embed.params) if cfg["tied"]
                             else dense(cfg["vocabulary"], width, prefix="head_"))

        def hybrid_forward(self, F, data):
            out, aux = self.embed(data), F.zeros((1,))
            for i in range(cfg["layers"]):
                out = out + self.attention[i](self.attn_norm[i](out))
                y = self.ffn[i](self.ffn_norm[i](out))
                if cfg["experts"]:
                    y, extra = y
                    aux = F.broadcast_add(aux, extra)
                out = out + y
            return self.head(self.final_norm(out)), aux

    return Llama(prefix="llama_")


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
    elif args.network in LLM_NETWORKS:
        net = llama_model(mx, args.llm, sequence(args))
        source = (f"Gluon Llama written as GluonNLP's GPT2Model (the suite's {args.llm['name']}: composed RMSNorm "
                  "and rotary, repeat_kv, batch_dot attention"
                  + (", every expert on every token, top-k weighted)" if args.llm["experts"] else ")"))
        x = mx.nd.random.randint(0, args.llm["vocabulary"], shape=(args.batch, sequence(args)), ctx=ctx).astype("float32")
        y = mx.nd.random.randint(0, args.llm["vocabulary"], shape=(args.batch, sequence(args)), ctx=ctx).astype("float32")
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
            if args.llm:  # (logits, the blocks' load-balancing loss), the latter added to every sample's
                logits, aux = net(x)
                loss = mx.nd.broadcast_add(loss_fn(logits, y), aux)
            else:
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
