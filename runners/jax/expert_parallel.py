"""JAX expert parallelism (runners/common/contract.py Parallelism.EXPERT): one `jax.jit` of a
`jax.shard_map` over the "data" mesh (distributed.py), in which the experts' weights are sharded
along their expert axis (rank r holds experts r*E/W ... (r+1)*E/W - 1 of every block) and every
other weight is replicated, its gradients averaged by `lax.pmean`.

A block's forward on a rank's own tokens (transformer.py's MixtureOfExperts routes them, then calls
dispatch_and_combine): the (token, choice) pairs sorted by expert, each pair's row written into the
slot of a send buffer of W blocks, block j for rank j, each block C = N x min(k, E/W) rows (the most
one rank's N tokens can send another: every token choosing up to k distinct experts among its
E/W), so the dispatch is dropless with static shapes, padded to that worst case; `lax.all_to_all`
(tiled) sends block j to rank j, with the local expert id of every row (E/W marking padding) beside
it; the rows are grouped by local expert and multiplied by `lax.ragged_dot` (the padding a group of
its own, against zero weights); the outputs go back by the reverse all-to-all and are added to
their tokens, weighted. Autodiff transposes each all-to-all (the backward sends the gradients
back the same way), so an expert's gradient sums every rank's tokens; it is divided by the ranks,
as data parallelism's pmean averages, so both train the network alike.

What the record can say: the all-to-alls run inside one XLA executable, so the host clock cannot
time them apart. The rank reports the bytes it sends to the others per step from the buffers'
static shapes, the all-to-alls the compiled step holds (counted in its HLO), and the time as the
difference of two programs: `step_without_sync` is the same program with every all-to-all
replaced by the identity (each rank's rows stay with it and meet its own experts: the same
products, the wrong tokens) and without the pmean; the controller's exposed communication is then
the all-to-alls' and the all-reduce's together, and the all-to-alls' seconds are not given apart.
"""

from __future__ import annotations

import re
import time

from runners.common.contract import DataParallel
from runners.common.protocol import Skip
from runners.jax.framework import load_jax
from runners.jax.precision import request_precision
from runners.jax.runner import check_compile
from runners.jax.step import DeviceState, TrainingModel

EXPERT_LEAVES = ("expert_gate", "expert_up", "expert_down")
DISPATCH = ("dropless, padded: each rank sends every other rank a block of N x min(k, E/W) rows (its worst case) "
            "by lax.all_to_all, the unused rows zero, with each row's local expert id beside them")
_ALL_TO_ALL = re.compile(r"=\s*[^=\n]*?\ball-to-all(?:-start)?\(")


def dispatch_and_combine(tokens, chosen, weights, experts_held, experts: int, sharded: dict, cast):
    """The block's output (N, D) for this rank's tokens (N, D), their experts `chosen` (N, k) and
    weights (N, k), the experts held here (gate, up, down: (E/W, ...)); sharded: {"axis", "workers",
    "exchange"} (exchange False: the identity in place of each all-to-all, for step_without_sync)."""
    jax = load_jax()
    jnp = jax.numpy
    lax = jax.lax
    gate, up, down = experts_held
    n, d = tokens.shape
    top_k = chosen.shape[1]
    workers, axis = sharded["workers"], sharded["axis"]
    held = experts // workers
    slots = n * min(top_k, held)  # rows one rank may send another, at most

    def all_to_all(buffer):
        if not sharded["exchange"]:
            return buffer
        return lax.all_to_all(buffer, axis, split_axis=0, concat_axis=0, tiled=True)

    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)  # the pairs grouped by expert, so by rank too
    expert = flat[order]
    token_of = order // top_k
    rank = expert // held
    per_rank = jnp.bincount(rank, length=workers)
    first = jnp.cumsum(per_rank) - per_rank
    slot = rank * slots + (jnp.arange(flat.shape[0]) - first[rank])
    send = jnp.zeros((workers * slots, d), cast).at[slot].set(jnp.take(tokens, token_of, axis=0).astype(cast))
    send_expert = jnp.full((workers * slots,), held, jnp.int32).at[slot].set((expert % held).astype(jnp.int32))
    rows, row_expert = all_to_all(send), all_to_all(send_expert)
    grouped = jnp.argsort(row_expert, stable=True)
    sizes = jnp.bincount(row_expert, length=held + 1).astype(jnp.int32)  # the last group: padding

    def padded(w):  # (E/W, a, b) -> (E/W + 1, b, a): ragged_dot's layout, a zero expert for the padding
        w = jnp.swapaxes(w, 1, 2).astype(cast)
        return jnp.concatenate([w, jnp.zeros((1, *w.shape[1:]), w.dtype)])

    x = rows[grouped]
    h = jax.nn.silu(lax.ragged_dot(x, padded(gate), sizes)) * lax.ragged_dot(x, padded(up), sizes)
    y = jnp.zeros_like(x).at[grouped].set(lax.ragged_dot(h, padded(down), sizes))
    back = all_to_all(y)[slot]
    back = back * jnp.take(weights.reshape(-1), order).astype(back.dtype)[:, None]
    return jnp.zeros((n, d), back.dtype).at[token_of].add(back)


def sharded_network(network: dict, axis: str, workers: int, exchange: bool) -> dict:
    """The network with every Mixture-of-Experts block told to hold its shard and dispatch."""
    sharded = {"axis": axis, "workers": workers, "exchange": exchange}
    layers = []
    for layer in network["layers"]:
        if layer["type"] == "moe":
            layer = {**layer, "expert_parallel": sharded}
        elif isinstance(layer.get("moe"), dict):
            layer = {**layer, "moe": {**layer["moe"], "expert_parallel": sharded}}
        layers.append(layer)
    return {**network, "layers": layers}


def bytes_sent_per_step(network: dict, tokens: int, workers: int) -> tuple[int, int]:
    """(bytes one rank sends the others per step, all-to-alls per step): per block, forward the
    rows (float32) and their expert ids (int32) dispatched and the outputs combined, backward the
    two float32 ones again; each all-to-all keeps the rank's own block."""
    total, calls = 0, 0
    for layer in network["layers"]:
        moe = layer if layer["type"] == "moe" else layer.get("moe")
        if not isinstance(moe, dict):
            continue
        slots = tokens * min(moe["top_k"], moe["experts"] // workers)
        rows = (workers - 1) * slots
        dim = layer["in_shape"][-1]
        total += 4 * rows * dim * 4 + rows * 4
        calls += 5
    return total, calls


def is_expert_leaf(path) -> bool:
    return any(getattr(key, "key", None) in EXPERT_LEAVES for key in path)


def prepare_expert_parallel(runner, request: dict, cluster) -> DataParallel:
    """The rank's expert-parallel training step (the module docstring says how)."""
    import numpy as np

    jax = load_jax()
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from runners.jax.distributed import AXIS, _count_collectives

    mesh = runner._mesh
    world, rank = cluster.world_size, cluster.rank
    precision = request_precision(request)
    if precision != "fp32":
        raise Skip(f"precision {precision}: the jax expert-parallel step trains in fp32 only (mixed precision "
                   "is not written for it yet)")
    compression = request.get("compression")
    if compression is not None and str(compression) != "none":
        raise Skip(f"compression {compression}: the jax expert-parallel step all-reduces dense float32 gradients")
    network = request["network"]
    whole = TrainingModel({**request, "mode": "train"}, check_compile(request))
    seed = request.get("seed", 0)
    # the weights and batches data parallelism starts from (distributed.py's draws)
    x_np, y_np = whole.host_batch(request["batch_size"], np.random.default_rng(seed * 1000 + rank + 1))
    host = whole.host_variables(x_np.shape[1:], x_np.dtype, np.random.default_rng(seed))
    if host.get("batch_stats"):
        raise Skip("the jax expert-parallel step keeps no batch statistics (the MoE decoders have none)")
    models = {exchange: TrainingModel({**request, "mode": "train", "network": sharded_network(
        network, AXIS, world, exchange)}, check_compile(request)) for exchange in (True, False)}
    tm = models[True]
    n_params = TrainingModel.count_params(host["params"])

    def spec_of(path, _):
        return P(AXIS) if is_expert_leaf(path) else P()

    def shard_of(path, a):  # this rank's experts, or the whole array
        if not is_expert_leaf(path):
            return a
        held = a.shape[0] // world
        return a[rank * held:(rank + 1) * held]

    def global_tree(tree):
        return jax.tree_util.tree_map_with_path(
            lambda path, a: jax.make_array_from_process_local_data(NamedSharding(mesh, spec_of(path, a)),
                                                                   shard_of(path, a)), tree)

    param_specs = jax.tree_util.tree_map_with_path(spec_of, host["params"])
    host_opt = tm.host_opt_state(host["params"])
    opt_specs = jax.tree_util.tree_map_with_path(spec_of, host_opt)
    batch = NamedSharding(mesh, P(AXIS))
    replicated = NamedSharding(mesh, P())
    device_state = DeviceState({
        "params": global_tree(host["params"]), "batch_stats": {}, "opt_state": global_tree(host_opt),
        "key": jax.make_array_from_process_local_data(replicated, tm.host_key(seed + 1)),
        "x": jax.make_array_from_process_local_data(batch, x_np),
        "y": jax.make_array_from_process_local_data(batch, y_np)})
    state = device_state.state

    def make_step(exchange: bool):
        model = models[exchange]

        def local_step(p, stats, opt_state, key, x, y):
            key, sub = jax.random.split(key)
            loss, _, grads = model.gradients(p, {}, sub, x, y)
            grads = jax.tree_util.tree_map_with_path(
                lambda path, g: g / world if is_expert_leaf(path)
                else (jax.lax.pmean(g, AXIS) if exchange else g), grads)
            p, opt_state = model.update(p, grads, opt_state)
            return p, stats, opt_state, key, loss[None]

        spmd = jax.shard_map(local_step, mesh=mesh, check_vma=False,
                             in_specs=(param_specs, P(), opt_specs, P(), P(AXIS), P(AXIS)),
                             out_specs=(param_specs, P(), opt_specs, P(), P(AXIS)))
        return jax.jit(spmd, donate_argnums=(0, 2, 3))

    args = (state["params"], state["batch_stats"], state["opt_state"], state["key"], state["x"], state["y"])
    t0 = time.perf_counter()
    synced, unsynced = (make_step(e).lower(*args).compile() for e in (True, False))
    compile_s = time.perf_counter() - t0
    texts = [c.as_text() for c in (synced, unsynced)]
    all_to_alls = [len(_ALL_TO_ALL.findall(t)) for t in texts]
    if all_to_alls[0] == 0 or _count_collectives(texts[1]) != 0 or all_to_alls[1] != 0:
        raise RuntimeError(f"the compiled expert-parallel step holds {all_to_alls[0]} all-to-all(s), and without "
                           f"the exchange {all_to_alls[1]} all-to-all(s) and {_count_collectives(texts[1])} other "
                           "collective(s): expected some, then none")
    tokens = x_np.shape[0] * x_np.shape[1]
    sent, calls = bytes_sent_per_step(network, tokens, world)
    sample = jax.ShapeDtypeStruct((1, *x_np.shape[1:]), x_np.dtype)
    settings = whole.settings(runner._device_kind, request, host["params"], {}, sample)
    settings["precision_effective"]["tf32_override"] = runner._tf32_env
    held = [e // world for e in _experts(network)]
    settings.update({
        "api": "flax.linen + optax.sgd; jax.jit of jax.shard_map over a 1-D 'data' mesh, the experts' weights "
               "sharded along it, lax.all_to_all dispatching tokens",
        "compiled_step": "one executable per iteration, compiled before the first step", "parallelism": "expert",
        "compile_s": round(compile_s, 3),
        "expert_parallel": {
            "dispatch": DISPATCH, "experts_per_worker": held,
            "experts_held": [[rank * h, (rank + 1) * h - 1] for h in held],
            "all_to_alls_in_step": all_to_alls[0], "all_to_alls_counted": calls,
            "gradients": "the experts' divided by the workers; every other weight's lax.pmean (data parallelism's)",
            "all_to_all_timing": "not timed apart (inside one XLA executable): the exposed communication is the "
                                 "step minus the same program with each all-to-all the identity and no pmean"},
        "exposed_communication": "median step time minus median step time of the same program without the "
                                 "all-to-alls (the identity) and without the pmean",
    })
    grad_bytes = int(sum(a.size * a.dtype.itemsize for path, a in jax.tree_util.tree_leaves_with_path(host["params"])
                         if not is_expert_leaf(path)))
    totals = {"steps": 0}
    step = device_state.train_step(synced)

    def counted_step():
        step()
        totals["steps"] += 1

    def loss():
        return local_loss(device_state)

    return DataParallel(counted_step, device_state.train_step(unsynced), device_state.synchronize, n_params,
                        whole.output_shape(host["params"], {}, sample), settings, grad_bytes, loss=loss,
                        all_to_all=lambda: {"seconds": None, "bytes": sent * totals["steps"],
                                            "calls": calls * totals["steps"]})


def local_loss(device_state: DeviceState) -> float:
    """This rank's loss of the last step (its entry of the step's per-rank loss output)."""
    import numpy as np

    return float(np.asarray(device_state.last[4].addressable_shards[0].data).reshape(-1)[0])


def _experts(network: dict) -> list[int]:
    out = []
    for layer in network["layers"]:
        moe = layer if layer["type"] == "moe" else layer.get("moe")
        if isinstance(moe, dict):
            out.append(moe["experts"])
    return out
