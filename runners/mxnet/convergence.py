"""The MXNet side of the convergence suite (runners/common/convergence.py drives it): the Gluon
network and loss of step.py, hybridized, gluon.Trainer with MXNet's SGD (momentum and
`wd`: MXNet's rule v = m v - lr (g + wd w), w += v), and the data through gluon.data.DataLoader with
worker processes, as a Gluon user feeds a model: a Dataset over the split read from disk whose items
are augmented (datasets.crop_flip, seeded by (seed, epoch, index)) and normalised in the workers, a
batch sampler over a seeded permutation per epoch (the last partial batch dropped), the default
batchify into shared-memory NDArrays. fp32 only."""

from __future__ import annotations

from runners.common.datasets import crop_flip, normalise
from runners.common.protocol import Skip
from runners.mxnet.framework import load_mxnet
from runners.mxnet.step import HYBRIDIZE, build_model, count_params, trainable_params

EVAL_BATCH = 500


def prepare_convergence(request: dict, ctx, effective: dict):
    import numpy as np

    from runners.common.contract import Trainer

    mx = load_mxnet()
    if request["precision"] != "fp32":
        raise Skip(f"mxnet convergence: {request['precision']} is not run by this loop (fp32 only)")
    network = request["network"]
    seed = request["seed"]
    mx.random.seed(seed)
    np.random.seed(seed)
    net, blocks, model = build_model(network, ctx, False, dtype="float32", hybridize=True)
    opt = request["optimizer"]
    trainer = mx.gluon.Trainer(trainable_params(net), "sgd",
                               {"learning_rate": opt["learning_rate"], "momentum": opt["momentum"],
                                "wd": opt["weight_decay"]}, kvstore=None)
    in_shape = tuple(network["input"]["shape"])
    batch = request["batch_size"]
    with mx.autograd.predict_mode():  # the inference graph built now (zeros: no data), not on the clock
        net(mx.nd.zeros((1, *in_shape), ctx=ctx)).wait_to_read()
    ds, aug = request["dataset"], request["augmentation"]
    workers = request["loader_workers"]
    augmenting = bool(aug["crop_padding"] or aug["horizontal_flip"])
    data: dict = {}

    class Split(mx.gluon.data.Dataset):
        """Item (epoch, index) -> (normalised float32 input of the network's shape, label)."""

        def __init__(self, x, y, augment: bool):
            self.x, self.y, self.augment = x, y, augment

        def __len__(self):
            return len(self.y)

        def __getitem__(self, item):
            epoch, i = item
            x = self.x[i:i + 1]
            if self.augment:
                x = crop_flip(x, aug["crop_padding"], aug["horizontal_flip"], np.random.default_rng([seed, epoch, i]))
            return normalise(x, ds["mean"], ds["std"]).reshape(in_shape), np.float32(self.y[i])

    class EpochBatches(mx.gluon.data.Sampler):
        def __init__(self, n: int, size: int, shuffle: bool):
            self.n, self.size, self.shuffle, self.epoch = n, size, shuffle, 0

        def __iter__(self):
            if self.shuffle:
                order = np.random.default_rng([seed, self.epoch]).permutation(self.n)
                for k in range(self.n // self.size):
                    yield [(self.epoch, int(i)) for i in order[k * self.size:(k + 1) * self.size]]
            else:
                for start in range(0, self.n, self.size):
                    yield [(0, i) for i in range(start, min(start + self.size, self.n))]

        def __len__(self):
            return self.n // self.size if self.shuffle else -(-self.n // self.size)

    def attach(train, evaluation, run_seed):
        data["sampler"] = EpochBatches(len(train[1]), batch, True)
        data["train"] = mx.gluon.data.DataLoader(Split(*train, augmenting), batch_sampler=data["sampler"],
                                                 num_workers=workers)
        data["eval"] = mx.gluon.data.DataLoader(Split(*evaluation, False),
                                                batch_sampler=EpochBatches(len(evaluation[1]), EVAL_BATCH, False),
                                                num_workers=workers)
        return {"pipeline": "mxnet.gluon.data.DataLoader", "workers": workers, "batchify": "default (shared memory)",
                "shuffle": "a permutation per epoch, seeded (seed, epoch)", "augmentation": aug,
                "eval_batch": EVAL_BATCH}

    def train_batches(epoch):
        data["sampler"].epoch = epoch
        return iter(data["train"])

    def step(b, lr):
        x, y = b[0].as_in_context(ctx), b[1].as_in_context(ctx)
        trainer.set_learning_rate(lr)
        with mx.autograd.record(train_mode=True):
            _, loss = model(x, y)
        loss.backward()
        trainer.step(1)  # the loss is the mean already

    def eval_batches():
        return iter(data["eval"])

    def evaluate(b):
        x, y = b[0].as_in_context(ctx), b[1].as_in_context(ctx)
        with mx.autograd.predict_mode():
            predicted = net(x).argmax(axis=1)
        return int((predicted == y).sum().asscalar()), int(y.shape[0])

    def close():
        data.clear()

    settings = {"precision": "fp32", "precision_effective": effective, "layout": "NCHW",
                "hybridize": dict(HYBRIDIZE), "optimizer": "gluon.Trainer sgd(momentum, wd)"}
    return Trainer(attach, train_batches, step, eval_batches, evaluate, mx.nd.waitall,
                   count_params(trainable_params(net)), settings, close)
