"""The JAX side of the convergence suite (runners/common/convergence.py drives it): the flax
module of step.py (its TrainingModel: loss, gradients, host initialisation), SGD with
momentum and weight decay in torch's form from optax (add_decayed_weights, then trace: v = m v + g
+ wd w; w -= lr v, the rate an argument of the step), the train and evaluation steps jitted and
compiled ahead of time at initialisation (jit(...).lower(...).compile(): no data touched), and the
data through Grain, the input pipeline JAX's own projects use: a MapDataset over the split read
from disk, shuffled globally per epoch with a seed of (seed, epoch), batched (the last partial batch
dropped), the task's augmentation (datasets.crop_flip) and normalisation in a random_map seeded by
Grain per batch, read ahead by `loader_workers` threads (ReadOptions). Evaluation batches are
padded to one shape with a mask, so that one compiled step serves them all.

Data-parallel (the convergence suite with --workers, `prepare_distributed_convergence`): the same
optimiser and pipeline in a jax.jit of a jax.shard_map over the distributed runner's "data" mesh,
as its data-parallel step is (distributed.py): every rank takes its contiguous share of each
global batch (the same shuffle on every rank), the gradients are exchanged by the request's
compression (distributed.py GradientExchange), and each rank evaluates its share of the evaluation
split (padded to one shape), the counts psum'd inside the compiled evaluation."""

from __future__ import annotations

from runners.common.convergence import rank_share
from runners.common.datasets import crop_flip, normalise
from runners.common.protocol import Skip
from runners.jax.framework import load_jax
from runners.jax.precision import COMPUTE_DTYPE
from runners.jax.step import MeshArrays, TrainingModel, logits_of

EVAL_BATCH = 500


def prepare_convergence(request: dict, device):
    import numpy as np
    import optax

    from runners.common.contract import Trainer

    jax = load_jax()
    jnp = jax.numpy
    precision = request["precision"]
    if precision == "amp_fp16":
        raise Skip("jax convergence: amp_fp16 needs the dynamic loss scale, which this loop's step does not carry")
    tm = TrainingModel({**request, "mode": "train", "compile": "compiled", "learning_rate": 0.0,
                           "momentum": request["optimizer"]["momentum"]})
    opt = request["optimizer"]
    batch = request["batch_size"]
    seed = request["seed"]
    rng = np.random.default_rng(seed)
    network = request["network"]
    shape = network["input"]["shape"]
    sample = (shape[1], shape[2], shape[0]) if tm.images else tuple(shape)  # NHWC for images
    variables = jax.device_put(tm.host_variables(sample, np.float32, rng), device)
    tx = optax.chain(optax.add_decayed_weights(opt["weight_decay"]), optax.trace(decay=opt["momentum"]))
    state = {"params": variables["params"], "batch_stats": variables.get("batch_stats", {}),
             "key": jax.device_put(tm.host_key(seed + 1), device)}
    state["opt"] = jax.device_put(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                                               jax.eval_shape(tx.init, state["params"])), device)

    def train_step(p, stats, opt_state, key, x, y, lr):
        key, sub = jax.random.split(key)
        _, new_stats, grads = tm.gradients(p, stats, sub, x, y)
        updates, opt_state = tx.update(grads, opt_state, p)
        p = jax.tree.map(lambda w, u: w - lr.astype(w.dtype) * u, p, updates)
        return p, new_stats, opt_state, key

    def eval_step(p, stats, x, y, mask):
        out, _ = tm.apply(p, stats, None, x, False)
        return jnp.sum((jnp.argmax(logits_of(out), axis=-1) == y) * mask)

    spec = jax.ShapeDtypeStruct
    x_spec, y_spec = spec((batch, *sample), np.float32), spec((batch,), np.int32)
    # compiled now, at initialisation (abstract shapes: nothing runs, no data is touched)
    train_c = jax.jit(train_step, donate_argnums=(0, 1, 2, 3)).lower(
        state["params"], state["batch_stats"], state["opt"], state["key"], x_spec, y_spec,
        spec((), np.float32)).compile()
    eval_c = jax.jit(eval_step).lower(state["params"], state["batch_stats"], spec((EVAL_BATCH, *sample), np.float32),
                                      spec((EVAL_BATCH,), np.int32), spec((EVAL_BATCH,), np.float32)).compile()
    ds, aug = request["dataset"], request["augmentation"]
    workers = request["loader_workers"]
    data: dict = {}

    def to_input(x_uint8, generator):
        if generator is not None:
            x_uint8 = crop_flip(x_uint8, aug["crop_padding"], aug["horizontal_flip"], generator)
        x = normalise(x_uint8, ds["mean"], ds["std"])
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if tm.images else x.reshape(len(x), *sample)
        return x

    def attach(train, evaluation, run_seed):
        data["train"], data["eval"], data["seed"] = train, evaluation, run_seed
        return {"pipeline": "grain (MapDataset)", "version": _grain().__version__ if hasattr(_grain(), "__version__")
                else None, "shuffle": "MapDataset.shuffle, global, seed (seed, epoch)",
                "transform": "random_map per batch (augmentation, normalisation)", "read_threads": workers,
                "augmentation": aug, "eval_batch": f"{EVAL_BATCH}, the last padded and masked"}

    def train_batches(epoch):
        grain = _grain()
        x, y = data["train"]
        augmenting = bool(aug["crop_padding"] or aug["horizontal_flip"])

        def make(indices, generator):
            idx = np.asarray(indices)
            return to_input(x[idx], generator if augmenting else None), y[idx].astype(np.int32)

        pipeline = (grain.MapDataset.range(len(y)).shuffle(seed=data["seed"] * 100_003 + epoch)
                    .batch(batch, drop_remainder=True).random_map(make, seed=data["seed"] * 100_003 + epoch))
        return iter(pipeline.to_iter_dataset(grain.ReadOptions(num_threads=workers, prefetch_buffer_size=4)))

    def step(b, lr):
        x, y = jax.device_put(b, device)
        state["params"], state["batch_stats"], state["opt"], state["key"] = train_c(
            state["params"], state["batch_stats"], state["opt"], state["key"], x, y, np.float32(lr))

    def eval_batches():
        grain = _grain()
        x, y = data["eval"]

        def make(start):
            stop = min(start + EVAL_BATCH, len(y))
            xb, yb = to_input(x[start:stop], None), y[start:stop].astype(np.int32)
            pad = EVAL_BATCH - len(yb)
            mask = np.concatenate([np.ones(len(yb), np.float32), np.zeros(pad, np.float32)])
            if pad:
                xb = np.concatenate([xb, np.zeros((pad, *xb.shape[1:]), xb.dtype)])
                yb = np.concatenate([yb, np.zeros(pad, np.int32)])
            return xb, yb, mask, stop - start

        pipeline = grain.MapDataset.source(list(range(0, len(y), EVAL_BATCH))).map(make)
        return iter(pipeline.to_iter_dataset(grain.ReadOptions(num_threads=workers, prefetch_buffer_size=4)))

    def evaluate(b):
        x, y, mask, count = b
        return int(eval_c(state["params"], state["batch_stats"], x, y, mask)), int(count)

    def synchronize():
        jax.block_until_ready(state["params"])

    settings = {"precision": precision, "compute_dtype": COMPUTE_DTYPE[precision],
                "step": "jax.jit, lowered and compiled at initialisation", "data_format": "NHWC" if tm.images else None,
                "optimizer": "optax.add_decayed_weights + optax.trace (torch's SGD form), lr an argument of the step"}
    return Trainer(attach, train_batches, step, eval_batches, evaluate, synchronize,
                   tm.count_params(state["params"]), settings)


def _grain():
    import grain

    return grain


def prepare_distributed_convergence(request: dict, mesh, cluster, exchange, axis: str):
    """This rank's trainer of a data-parallel convergence run over `mesh` (the distributed runner's
    1-D mesh of every rank's device along `axis`, jax.distributed joined); `exchange`: the request's
    compression as distributed.py's GradientExchange."""
    import numpy as np
    import optax
    from jax.sharding import PartitionSpec as P

    from runners.common.contract import Trainer

    jax = load_jax()
    jnp = jax.numpy
    precision = request["precision"]
    if precision == "amp_fp16":
        raise Skip("jax convergence: amp_fp16 needs the dynamic loss scale, which this loop's step does not carry")
    rank, world = cluster.rank, cluster.world_size
    tm = TrainingModel({**request, "mode": "train", "compile": "compiled", "learning_rate": 0.0,
                        "momentum": request["optimizer"]["momentum"]})
    opt = request["optimizer"]
    batch = request["batch_size"]
    seed = request["seed"]
    network = request["network"]
    shape = network["input"]["shape"]
    sample = (shape[1], shape[2], shape[0]) if tm.images else tuple(shape)  # NHWC for images
    arrays = MeshArrays(mesh, axis)
    replicated, sharded = arrays.replicated, arrays.sharded
    global_array, replicate, per_rank = arrays.global_array, arrays.replicate, arrays.per_rank

    host = tm.host_variables(sample, np.float32, np.random.default_rng(seed))  # every rank the same
    tx = optax.chain(optax.add_decayed_weights(opt["weight_decay"]), optax.trace(decay=opt["momentum"]))
    state = {"params": replicate(host["params"]),
             "rank": per_rank({"batch_stats": host.get("batch_stats", {}),
                               "compression": exchange.host_state(host["params"], np.random.default_rng(seed + 2))}),
             "opt": replicate(jax.tree.map(lambda a: np.zeros(a.shape, a.dtype),
                                           jax.eval_shape(tx.init, host["params"]))),
             "key": replicate(tm.host_key(seed + 1))}

    def local_step(p, rank_state, opt_state, key, x, y, lr):
        rank_state = jax.tree.map(lambda a: a[0], rank_state)
        key, sub = jax.random.split(key)
        sub = jax.random.fold_in(sub, jax.lax.axis_index(axis))  # each rank its own dropout mask
        _, new_stats, grads = tm.gradients(p, rank_state["batch_stats"], sub, x, y)
        grads, kept = exchange.exchange(grads, rank_state["compression"])
        updates, opt_state = tx.update(grads, opt_state, p)
        p = jax.tree.map(lambda w, u: w - lr.astype(w.dtype) * u, p, updates)
        return p, jax.tree.map(lambda a: a[None], {"batch_stats": new_stats, "compression": kept}), opt_state, key

    def local_eval(p, rank_state, x, y, mask):
        out, _ = tm.apply(p, jax.tree.map(lambda a: a[0], rank_state)["batch_stats"], None, x, False)
        correct = jnp.sum((jnp.argmax(logits_of(out), axis=-1) == y) * mask)
        return jax.lax.psum(correct, axis), jax.lax.psum(jnp.sum(mask), axis)

    spec = jax.ShapeDtypeStruct
    step_c = jax.jit(jax.shard_map(local_step, mesh=mesh, check_vma=False,
                                   in_specs=(P(), P(axis), P(), P(), P(axis), P(axis), P()),
                                   out_specs=(P(), P(axis), P(), P())), donate_argnums=(0, 1, 2, 3)).lower(
        state["params"], state["rank"], state["opt"], state["key"],
        spec((batch, *sample), np.float32, sharding=sharded), spec((batch,), np.int32, sharding=sharded),
        spec((), np.float32, sharding=replicated)).compile()
    eval_c = jax.jit(jax.shard_map(local_eval, mesh=mesh, check_vma=False,
                                   in_specs=(P(), P(axis), P(axis), P(axis), P(axis)), out_specs=(P(), P()))).lower(
        state["params"], state["rank"], spec((EVAL_BATCH * world, *sample), np.float32, sharding=sharded),
        spec((EVAL_BATCH * world,), np.int32, sharding=sharded),
        spec((EVAL_BATCH * world,), np.float32, sharding=sharded)).compile()
    ds, aug = request["dataset"], request["augmentation"]
    workers = request["loader_workers"]
    share = rank_share(batch, rank, world)
    data: dict = {}

    def to_input(x_uint8, generator):
        if generator is not None:
            x_uint8 = crop_flip(x_uint8, aug["crop_padding"], aug["horizontal_flip"], generator)
        x = normalise(x_uint8, ds["mean"], ds["std"])
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if tm.images else x.reshape(len(x), *sample)

    def attach(train, evaluation, run_seed):
        mine = rank_share(len(evaluation[1]), rank, world)
        data["train"], data["eval"], data["seed"] = train, (evaluation[0][mine], evaluation[1][mine]), run_seed
        # every rank the same number of evaluation batches: of the largest share
        data["eval_batches"] = -(-(-(-len(evaluation[1]) // world)) // EVAL_BATCH)
        return {"pipeline": "grain (MapDataset)", "shuffle": "MapDataset.shuffle, global, seed (seed, epoch); "
                f"rank {rank} takes items {share.start}-{share.stop - 1} of each global batch",
                "transform": "random_map per batch (augmentation, normalisation)", "read_threads": workers,
                "augmentation": aug, "eval_batch": f"{EVAL_BATCH} per rank, the last padded and masked"}

    def train_batches(epoch):
        grain = _grain()
        x, y = data["train"]
        augmenting = bool(aug["crop_padding"] or aug["horizontal_flip"])

        def make(indices, generator):
            idx = np.asarray(indices)[share]
            return to_input(x[idx], generator if augmenting else None), y[idx].astype(np.int32)

        pipeline = (grain.MapDataset.range(len(y)).shuffle(seed=data["seed"] * 100_003 + epoch)
                    .batch(batch, drop_remainder=True).random_map(make, seed=data["seed"] * 100_003 + epoch))
        return iter(pipeline.to_iter_dataset(grain.ReadOptions(num_threads=workers, prefetch_buffer_size=4)))

    def step(b, lr):
        x, y = (global_array(sharded, a) for a in b)
        state["params"], state["rank"], state["opt"], state["key"] = step_c(
            state["params"], state["rank"], state["opt"], state["key"], x, y,
            global_array(replicated, np.float32(lr)))

    def eval_batches():
        x, y = data["eval"]
        for k in range(data["eval_batches"]):
            xb, yb = to_input(x[k * EVAL_BATCH:(k + 1) * EVAL_BATCH], None), y[k * EVAL_BATCH:(k + 1) * EVAL_BATCH]
            pad = EVAL_BATCH - len(yb)
            mask = np.concatenate([np.ones(len(yb), np.float32), np.zeros(pad, np.float32)])
            xb = np.concatenate([xb, np.zeros((pad, *sample), np.float32)])
            yb = np.concatenate([yb.astype(np.int32), np.zeros(pad, np.int32)])
            yield xb, yb, mask

    def evaluate(b):  # every rank's share counted: the same totals on every rank
        correct, count = eval_c(state["params"], state["rank"], *(global_array(sharded, a) for a in b))
        return int(correct), int(count)

    def synchronize():
        jax.block_until_ready(state["params"])

    settings = {"precision": precision, "compute_dtype": COMPUTE_DTYPE[precision],
                "step": "jax.jit of jax.shard_map over the 'data' mesh, lowered and compiled at initialisation",
                "data_format": "NHWC" if tm.images else None,
                "optimizer": "optax.add_decayed_weights + optax.trace (torch's SGD form), lr an argument of the step",
                "gradient_exchange": exchange.describe(), "compression": exchange.settings(),
                "data_parallel": {"ranks": world, "rank_batch": batch // world,
                                  "evaluation": "each rank its share, counts psum'd in the compiled evaluation"}}
    return Trainer(attach, train_batches, step, eval_batches, evaluate, synchronize,
                   tm.count_params(host["params"]), settings)
