"""The torch side of the convergence suite (runners/common/convergence.py drives it): the network
of step.py, torch.optim.SGD (momentum, weight decay: torch's own form, which the suite
takes as canonical), and the data through torch.utils.data.DataLoader with worker processes, as a
torch user feeds a model: the sampler hands each worker a whole batch of indices (one shuffled
permutation per epoch from a seeded torch.Generator), the worker applies the task's augmentation
(datasets.crop_flip, seeded per epoch and batch so that it does not depend on which worker took
it) and the normalisation, and the loader prefetches (pinned memory on CUDA).

Data-parallel (the convergence suite with --workers; `cluster` given): the model is wrapped in
DistributedDataParallel with the request's compression as its communication hook (distributed.py
hands that in, as its data-parallel step registers it), every rank draws the same permutation and
takes its contiguous share of each global batch (so the optimiser sees the task's batch and
schedule), and each rank evaluates its share of the evaluation split, the counts all-reduced."""

from __future__ import annotations

from runners.common.convergence import rank_share
from runners.common.datasets import crop_flip, normalise
from runners.torch import step as st
from runners.torch.framework import load_torch, synchronizer
from runners.torch.precision import float32_math, mixed_precision, request_precision

EVAL_BATCH = 500


def prepare_convergence(request: dict, cluster=None, data_parallel=None):
    """The trainer of one process, or of rank `cluster.rank` of a data-parallel job (cluster:
    distributed_harness.Cluster; the process group joined), `data_parallel(model) -> (module the
    step calls, its settings)` wrapping the model as distributed.py does (DDP and its hook)."""
    from runners.common.contract import Trainer

    torch = load_torch()
    network = request["network"]
    device = torch.device(request["device"])
    precision = request_precision(request)
    settings: dict = {"precision": precision.value, "precision_effective": float32_math(precision, device)}
    torch.manual_seed(request["seed"])
    model, memory_format = st.place(st.build_network(network), network, device, settings)
    autocast, scaler, amp = mixed_precision(precision, device, True)
    settings["precision_effective"].update(amp)
    opt_spec = request["optimizer"]
    optimizer = torch.optim.SGD(st.trainable_params(model), lr=opt_spec["learning_rate"],
                                momentum=opt_spec["momentum"], weight_decay=opt_spec["weight_decay"])
    settings["optimizer"] = "torch.optim.SGD(momentum, weight_decay)"
    rank, world = (cluster.rank, cluster.world_size) if cluster is not None else (0, 1)
    trained = model  # what the training step calls: the module, or DDP around it
    if cluster is not None:
        trained, wrapped = data_parallel(model)
        settings.update(wrapped)
        settings["data_parallel"] = {"ranks": world, "rank_batch": request["batch_size"] // world,
                                     "evaluation": "each rank its share, counts all-reduced (torch.distributed.all_reduce)"}
    in_shape = tuple(network["input"]["shape"])
    images = st.is_images(network)
    workers = request["loader_workers"]
    aug = request["augmentation"]
    ds = request["dataset"]
    cuda = device.type == "cuda"
    state: dict = {}

    class Batches(torch.utils.data.Dataset):
        """Item (epoch, k, indices): batch k of an epoch, augmented and normalised in the worker."""

        def __init__(self, x, y, augment: bool, seed: int):
            self.x, self.y, self.augment, self.seed = x, y, augment, seed

        def __len__(self):
            return len(self.y)

        def __getitem__(self, item):
            import numpy as np

            epoch, k, idx = item
            x = self.x[idx]
            if self.augment:
                x = crop_flip(x, aug["crop_padding"], aug["horizontal_flip"],
                              np.random.default_rng([self.seed, epoch, k]))
            x = normalise(x, ds["mean"], ds["std"])
            return torch.from_numpy(x), torch.from_numpy(self.y[idx])

    class EpochSampler(torch.utils.data.Sampler):
        """Batches of a seeded permutation per epoch (training; the last partial batch dropped), or
        the split in order (evaluation)."""

        def __init__(self, n: int, batch: int, shuffle: bool, seed: int):
            self.n, self.batch, self.shuffle, self.seed, self.epoch = n, batch, shuffle, seed, 0

        def __iter__(self):
            if self.shuffle:
                order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 100_003 + self.epoch))
                share = rank_share(self.batch, rank, world)  # every rank the same order, its part of each batch
                for k in range(self.n // self.batch):
                    yield self.epoch, k, order[k * self.batch:(k + 1) * self.batch][share].numpy()
            else:
                for k, start in enumerate(range(0, self.n, self.batch)):
                    yield 0, k, torch.arange(start, min(start + self.batch, self.n)).numpy()

        def __len__(self):
            return self.n // self.batch if self.shuffle else -(-self.n // self.batch)

    def loader(x, y, batch, shuffle, seed):
        sampler = EpochSampler(len(y), batch, shuffle, seed)
        augment = shuffle and bool(aug["crop_padding"] or aug["horizontal_flip"])
        return sampler, torch.utils.data.DataLoader(
            Batches(x, y, augment, seed), sampler=sampler, batch_size=None, num_workers=workers,
            persistent_workers=workers > 0, pin_memory=cuda, prefetch_factor=2 if workers else None)

    def attach(train, evaluation, seed):
        if world > 1:  # this rank's share of the evaluation split
            share = rank_share(len(evaluation[1]), rank, world)
            evaluation = (evaluation[0][share], evaluation[1][share])
        state["train_sampler"], state["train"] = loader(*train, request["batch_size"], True, seed)
        _, state["eval"] = loader(*evaluation, EVAL_BATCH, False, seed)
        return {"pipeline": "torch.utils.data.DataLoader", "workers": workers, "prefetch_factor": 2 if workers else None,
                "pin_memory": cuda, "shuffle": "torch.randperm per epoch (seeded torch.Generator)",
                "augmentation": aug, "eval_batch": EVAL_BATCH}

    def to_device(batch):
        x, y = batch
        x = x.to(device, non_blocking=True).reshape(-1, *in_shape)
        if images:
            x = x.contiguous(memory_format=memory_format)
        return x, y.to(device, non_blocking=True)

    def train_batches(epoch):
        model.train()
        state["train_sampler"].epoch = epoch
        return iter(state["train"])

    def train_step(batch, lr):
        x, y = to_device(batch)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            value = st.loss(trained(x), y)
        if scaler is None:
            value.backward()
            optimizer.step()
        else:
            scaler.scale(value).backward()
            scaler.step(optimizer)
            scaler.update()

    def eval_batches():
        model.eval()
        return iter(state["eval"])

    def eval_step(batch):
        x, y = to_device(batch)
        with torch.inference_mode(), autocast():
            predicted = model(x).argmax(dim=1)
        return int((predicted == y).sum().item()), int(y.shape[0])

    def close():
        for name in ("train", "eval"):
            state.pop(name, None)  # persistent workers end with their loader

    def across_ranks(correct, count):
        if world == 1:
            return correct, count
        total = torch.tensor([correct, count], dtype=torch.int64, device=device)
        torch.distributed.all_reduce(total)
        return int(total[0]), int(total[1])

    params = sum(p.numel() for p in st.trainable_params(model))
    return Trainer(attach, train_batches, train_step, eval_batches, eval_step, synchronizer(device), params,
                   settings, close, across_ranks)
