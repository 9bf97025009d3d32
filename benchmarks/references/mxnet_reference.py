"""MXNet reference: gluon's model zoo ResNet-50 v1 and, for LSTM-32, gluon's Embedding + rnn.LSTM +
Dense, hybridised with static allocation as gluon's performance guide recommends, trained with
autograd.record and a gluon Trainer.

The model zoo's resnet50_v1 strides the first 1x1 convolution of a downsampling block; the suite's
ResNet-50 (like torchvision's) strides the 3x3, which costs about 5% more FLOPs at the same parameter
count. So that the ratio compares the same network, the reference moves each of those strides from
the zoo block's 1x1 to its 3x3 after construction (DLBENCH_REFERENCE_ZOO_STRIDES=1 keeps the zoo's own placement) and
says so in its model name. Threads: OMP_NUM_THREADS, set by the caller before the interpreter starts
(MXNet sizes its pool when the library loads).
"""

from __future__ import annotations

import os

from reference_loop import (CLASSES, EMBEDDING, HIDDEN, IMAGE, SEQUENCE, VOCABULARY, canonical_inputs, parse_args,
                            time_steps)


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
