"""JAX as a multi-worker runner: jax.distributed, a data-sharded jitted step, lax collectives.

dlbench starts every rank itself (runner.toml: [distributed] launch = "ranks"; JAX has no launcher
of its own) with torchrun's variables set; `join` turns them into `jax.distributed.initialize`
(the coordination service at MASTER_ADDR:MASTER_PORT, rank 0 hosts it). Every process then sees
every process's devices (one CPU device each; on CUDA the GPU of its local rank) and compiled
programs span them: a 1-D mesh "data" over all devices. Cross-process collectives on CPU are
XLA:CPU's gloo implementation (`jax_cpu_collectives_implementation = "gloo"`, set explicitly
though it is jax 0.10's default); on CUDA, XLA's NCCL. The contract is in
runners/common/distributed_harness.py.

Data-parallel step: one `jax.jit` of a `jax.shard_map` over "data": every rank runs the whole
network on its own batch (the global batch is sharded along "data"), the gradient tree is
averaged by `lax.pmean` (XLA all-reduce), and the SGD-momentum update is applied to replicated
parameters. Batch-norm running statistics stay per rank (stacked along "data"), as
DistributedDataParallel keeps them between its buffer broadcasts; dropout keys differ per rank.
shard_map runs unchecked (check_vma=False) so that its autodiff adds no implicit psum: the pmean
is the step's only collective, and `step_without_sync` is the same program without it (the
controller reports the difference of the two medians as the communication not hidden behind the
backward pass; XLA may schedule the all-reduce before the last gradients are computed, so only
what overlapping does not hide is counted). Without the exchange the ranks' parameters diverge,
which is why the harness runs those steps after the measured ones.

Collectives: `lax.psum` (all_reduce), `lax.all_gather` (tiled), `lax.psum_scatter` (tiled,
reduce_scatter), `lax.all_to_all` (tiled, split and concatenated along the buffer's one axis); JAX has no broadcast primitive, so broadcast is what
`jax.experimental.multihost_utils.broadcast_one_to_all` does: a psum of the root's buffer and
every other rank's zeros (an all-reduce's traffic). all_reduce and broadcast donate their buffer
and get it back (in place).

Threads: XLA:CPU sizes its client and intra-op pools from the affinity mask when the backend is
made, so a rank is pinned to its share of the machine's CPUs (disjoint from its neighbours').
Measured on the 2-core VM: with one thread per rank every cross-process collective costs about
4 ms (the median of a 4 KiB all-reduce; ~0.2 ms when each pool has two threads, by NPROC=2 or
a two-CPU mask; pinning or not does not change it, the pool size does; likely because XLA's
asynchronous execution blocks a pool thread until the program's thunks finish, and the
collective's work needs another). That is what one thread per rank costs with JAX: the records
show it as it is, with the threads per rank.

Gloo's address: jax builds its gloo collectives from the hostname's address; when dlbench names
this rank's host (DLBENCH_WORKER_ADDRESSES), the CPU backend is created with that address
instead (jax's own `make_gloo_tcp_collectives(hostname=...)`), as torchrun's --local-addr does,
so two "hosts" on loopback addresses really talk through those addresses.
"""

from __future__ import annotations

import ipaddress
import os
import re
import time

from runners.common.contract import (
    Compression,
    CompressionMethod,
    DataParallel,
    Parallelism,
    gtopk_tree,
    topk_count,
)
from runners.common.protocol import Skip
from runners.jax.framework import load_jax
from runners.jax.precision import request_precision
from runners.jax.runner import JaxRunner, check_compile
from runners.jax.step import DeviceState, MeshArrays, TrainingModel

AXIS = "data"
# jax.distributed's defaults are 300 s to connect and 100 s without a heartbeat; stated here so
# that a rank waiting for a lost peer fails with its own error before dlbench's job timeout.
INITIALIZATION_TIMEOUT_S = 300
HEARTBEAT_TIMEOUT_S = 100


def _address(host_port: str) -> str:
    return host_port.rsplit(":", 1)[0].strip("[]")


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def machine_slot(rank: int, local_rank: int, worker_addresses: tuple[str, ...]) -> int:
    """This rank's index among the ranks that share its machine's cores: those of its host, or,
    for a loopback address, every rank on a loopback address (all "hosts" of one machine)."""
    if not worker_addresses:
        return local_rank
    hosts = [_address(a) for a in worker_addresses]
    mine = hosts[rank]
    same = (lambda h: _is_loopback(h)) if _is_loopback(mine) else (lambda h: h == mine)
    return sum(1 for r in range(rank) if same(hosts[r]))


def cpu_slice(allowed: list[int], threads: int, slot: int) -> list[int]:
    """The `threads` CPUs of the rank in `slot`: consecutive blocks, wrapping around when the
    machine has fewer (the placement refuses to oversubscribe, so that only happens with --threads
    on a host that has fewer cores than dlbench assumed)."""
    return [allowed[(slot * threads + i) % len(allowed)] for i in range(threads)]


def _env_cluster(env=os.environ):
    """(rank, local_rank, worker addresses) from the variables dlbench sets, before `join`."""
    rank = int(env.get("RANK", "0"))
    addresses = tuple(a for a in env.get("DLBENCH_WORKER_ADDRESSES", "").split(",") if a)
    return rank, int(env.get("LOCAL_RANK", rank)), addresses


def slot_from_env(env=os.environ) -> int:
    """This rank's machine slot: as dlbench says (DLBENCH_MACHINE_SLOT: ranks in network namespaces
    of one machine, --link, have addresses of their own yet share its cores), else by the addresses."""
    given = env.get("DLBENCH_MACHINE_SLOT")
    return int(given) if given is not None else machine_slot(*_env_cluster(env))


class Collective:
    """One compiled collective over every rank's device; `run` dispatches it, `synchronize` waits."""

    def __init__(self, op: str, fn, make_input, in_place: bool):
        self.op, self._fn, self._make_input, self._in_place = op, fn, make_input, in_place
        self._send = self._out = None

    def load(self, array) -> None:
        self._send = self._make_input(array)
        self._out = None

    def run(self) -> None:
        if self._in_place:  # the buffer is donated and comes back as the result
            self._send = self._out = self._fn(self._send)
        else:
            self._out = self._fn(self._send)

    def synchronize(self) -> None:
        if self._out is not None:
            self._out.block_until_ready()

    def result(self):
        import numpy as np

        return np.asarray(self._out.addressable_data(0))


class JaxDistributedRunner(JaxRunner):
    def __init__(self):
        super().__init__()
        self._mesh = None
        self._device_kind = None
        self._barriers = 0

    # --- threads: XLA:CPU sizes its pools from the affinity mask, so ranks sharing a machine get
    # disjoint CPUs (the single-process runner takes the first `threads` of them)
    def configure_threads(self, threads: int | None) -> dict:
        if not threads:
            return super().configure_threads(threads)
        slot = slot_from_env()
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, cpu_slice(allowed, threads, slot))
        info = super().configure_threads(None)  # records the affinity just set
        info.update(requested=threads, machine_slot=slot, cpus_allowed_before=allowed)
        return info

    def framework_info(self, device: str) -> dict:
        # no backend yet: jax.distributed.initialize must come before the first backend is made
        # (the devices of every process are in `join`'s answer, the record's process_group)
        return self._framework_info(device, query_backend=False)

    def device_available(self, device: str) -> str | None:
        if device == "cpu":
            return None
        if device == "cuda":
            import importlib.util

            if any(importlib.util.find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")):
                return None  # whether a GPU is usable shows when join() makes the backend
            return "CUDA requested but this jax environment has no CUDA plugin"
        return f"device {device!r} is not supported by the jax runner"

    def join(self, cluster) -> dict:
        import numpy as np

        jax = self._init_jax(cluster.device)
        import jax.extend as jax_extend

        cuda = cluster.device == "cuda"
        if not cuda:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        coordinator = cluster.coordinator_address
        if ":" in coordinator:  # an IPv6 address
            coordinator = f"[{coordinator}]"
        jax.distributed.initialize(
            coordinator_address=f"{coordinator}:{cluster.coordinator_port}", num_processes=cluster.world_size,
            process_id=cluster.rank, local_device_ids=[cluster.local_rank] if cuda else None,
            initialization_timeout=INITIALIZATION_TIMEOUT_S, heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
        gloo_address = None
        if not cuda and cluster.worker_addresses:
            gloo_address = _address(cluster.worker_addresses[cluster.rank])
            self._cpu_backend_with_gloo_at(gloo_address)
        platform = "gpu" if cuda else "cpu"
        devices = jax.devices(platform)
        local = jax.local_devices(backend=platform)
        self._mesh = jax.sharding.Mesh(np.array(devices), (AXIS,))
        self._device_kind = platform
        return {
            "backend": "nccl" if cuda else jax.config.jax_cpu_collectives_implementation,
            "api": "jax.distributed.initialize (coordination service on rank 0)",
            "coordinator": f"{coordinator}:{cluster.coordinator_port}",
            "gloo_address": gloo_address if not cuda else None,
            "rank": jax.process_index(), "world_size": jax.process_count(),
            "devices": [{"id": d.id, "process": d.process_index, "kind": d.device_kind} for d in devices],
            "local_devices": [d.id for d in local],
            "mesh": {AXIS: len(devices)},
            "platform_version": jax_extend.backend.get_backend(platform).platform_version,
        }

    @staticmethod
    def _cpu_backend_with_gloo_at(address: str) -> None:
        """The CPU backend of a distributed job, its gloo collectives bound to `address` (jax's own
        factory otherwise resolves the machine's hostname). Must run before the first backend."""
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax as jaxlib_ext

        def factory():
            collectives = jaxlib_ext.make_gloo_tcp_collectives(
                distributed_client=distributed.global_state.client, hostname=address)
            return xla_bridge.make_cpu_client(collectives=collectives)

        xla_bridge.register_backend_factory("cpu", factory, priority=0, fail_quietly=False)

    def barrier(self) -> None:
        from jax.experimental import multihost_utils

        self._barriers += 1  # every rank calls barrier() in the same order: the names agree
        multihost_utils.sync_global_devices(f"dlbench-barrier-{self._barriers}")

    def leave(self) -> None:
        load_jax().distributed.shutdown()

    # ------------------------------------------------------------------ data-parallel training

    def prepare_data_parallel(self, request: dict, cluster) -> DataParallel:
        if request.get("parallelism") == Parallelism.EXPERT:  # its own step: "expert parallelism" below
            return prepare_expert_parallel(self, request, cluster)
        import numpy as np

        jax = load_jax()
        from jax.sharding import PartitionSpec as P

        mesh = self._mesh
        precision = request_precision(request)
        if precision == "float64":  # the equivalence check's precision, single-process only
            raise ValueError("the jax distributed runner does not train in float64 (fp32, tf32 and amp_bf16 only)")
        if precision == "amp_fp16":  # its dynamic loss scale is threaded through the single-process step only
            raise Skip("amp_fp16: the jax distributed runner's data-parallel step has no dynamic loss scaling "
                       "(fp32, tf32 and amp_bf16 only)")
        # pins the precision as the single-process runner does (NVIDIA_TF32_OVERRIDE was set in join,
        # before the CUDA backend was made); skips tf32 where there is no TF32
        tm = TrainingModel({**request, "mode": "train"}, check_compile(request))
        seed = request.get("seed", 0)
        # every rank the same initial weights, its own synthetic batch (as a sharded data set gives it)
        x_np, y_np = tm.host_batch(request["batch_size"], np.random.default_rng(seed * 1000 + cluster.rank + 1))
        host = tm.host_variables(x_np.shape[1:], x_np.dtype, np.random.default_rng(seed))

        arrays = MeshArrays(mesh, AXIS)
        global_array, replicate, per_rank = arrays.global_array, arrays.replicate, arrays.per_rank
        params = replicate(host["params"])
        exchange = GradientExchange(request.get("compression") or Compression(CompressionMethod.NONE),
                                    cluster.world_size)
        # per rank, beside the batch statistics: what the compressor keeps between steps (residuals,
        # PowerSGD's error and warm-started Q); every rank starts from the same
        stats = per_rank({"batch_stats": host.get("batch_stats", {}),
                          "compression": exchange.host_state(host["params"], np.random.default_rng(seed + 2))})
        device_state = DeviceState({"params": params, "batch_stats": stats,
                                       "opt_state": replicate(tm.host_opt_state(host["params"])),
                                       "key": replicate(tm.host_key(seed + 1)),
                                       "x": global_array(arrays.sharded, x_np),
                                       "y": global_array(arrays.sharded, y_np)})
        state = device_state.state

        def make_step(exchange_gradients: bool):
            def local_step(p, rank_state, opt_state, key, x, y):
                rank_state = jax.tree.map(lambda s: s[0], rank_state)
                stats, kept = rank_state["batch_stats"], rank_state["compression"]
                key, sub = jax.random.split(key)
                sub = jax.random.fold_in(sub, jax.lax.axis_index(AXIS))  # each rank its own dropout mask
                loss, new_stats, grads = tm.gradients(p, stats, sub, x, y)
                if exchange_gradients:  # the gradient exchange: the averaged gradients, as the method sends them
                    grads, kept = exchange.exchange(grads, kept)
                p, opt_state = tm.update(p, grads, opt_state)
                rank_state = {"batch_stats": new_stats, "compression": kept}
                return p, jax.tree.map(lambda s: s[None], rank_state), opt_state, key, loss[None]

            spmd = jax.shard_map(local_step, mesh=mesh, check_vma=False,
                                 in_specs=(P(), P(AXIS), P(), P(), P(AXIS), P(AXIS)),
                                 out_specs=(P(), P(AXIS), P(), P(), P(AXIS)))
            return jax.jit(spmd, donate_argnums=(0, 1, 2, 3))

        args = (state["params"], state["batch_stats"], state["opt_state"], state["key"], state["x"], state["y"])
        t0 = time.perf_counter()
        # compiled here, ahead of the first step, so that the programs' all-reduces can be counted
        synced, unsynced = (make_step(e).lower(*args).compile() for e in (True, False))
        compile_s = time.perf_counter() - t0
        collectives = [_count_collectives(c.as_text()) for c in (synced, unsynced)]
        if cluster.world_size > 1 and (collectives[0] == 0 or collectives[1] != 0):
            raise RuntimeError(f"the compiled step has {collectives[0]} collective(s) with the gradient exchange "
                               f"and {collectives[1]} without: expected some and none")
        n_params = tm.count_params(params)
        sample = jax.ShapeDtypeStruct((1, *x_np.shape[1:]), x_np.dtype)
        settings = tm.settings(self._device_kind, request, host["params"], host.get("batch_stats", {}), sample)
        settings["precision_effective"]["tf32_override"] = self._tf32_env
        settings.update({
            "api": "flax.linen + optax.sgd; jax.jit of jax.shard_map over a 1-D 'data' mesh of every rank's device",
            "compiled_step": "one executable per iteration, compiled before the first step",
            "compile_s": round(compile_s, 3),
            "donated": ["params", "batch_stats and compression state", "opt_state", "dropout_key"],
            "gradient_exchange": exchange.describe(),
            "compression": exchange.settings(),
            "collective_ops_in_step": collectives[0],
            "batch_norm_statistics": "per rank (not synchronised)",
            "exposed_communication": "median step time minus median step time of the same program without the pmean",
        })
        grad_bytes = int(sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(host["params"])))
        settings["parallelism"] = "data"
        return DataParallel(device_state.train_step(synced), device_state.train_step(unsynced),
                            device_state.synchronize, n_params,
                            tm.output_shape(params, host.get("batch_stats", {}), sample), settings, grad_bytes,
                            loss=lambda: local_loss(device_state))

    def prepare_distributed_convergence(self, request: dict, cluster):
        """This rank's trainer of a data-parallel convergence run (convergence.py: the sharded step
        with the request's compression, each rank its share of every global batch)."""
        from runners.jax.convergence import prepare_distributed_convergence

        exchange = GradientExchange(request.get("compression") or Compression(CompressionMethod.NONE),
                                    cluster.world_size)
        return prepare_distributed_convergence(request, self._mesh, cluster, exchange, AXIS)

    # ------------------------------------------------------------------ collectives

    def collective(self, op: str, send_count: int, recv_count: int) -> Collective:
        jax = load_jax()
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = self._mesh
        lax = jax.lax
        if op == "all_reduce":
            body, out = (lambda v: lax.psum(v, AXIS)), P(AXIS)
        elif op == "broadcast":  # multihost_utils.broadcast_one_to_all's way: root's data, zeros elsewhere, summed
            body = (lambda v: lax.psum(jnp.where(lax.axis_index(AXIS) == 0, v, jnp.zeros_like(v)), AXIS))
            out = P(AXIS)
        elif op == "all_gather":
            body, out = (lambda v: lax.all_gather(v, AXIS, tiled=True)), P(AXIS)
        elif op == "reduce_scatter":
            body, out = (lambda v: lax.psum_scatter(v, AXIS, scatter_dimension=0, tiled=True)), P(AXIS)
        elif op == "all_to_all":  # block j of each rank's buffer to rank j, received in rank order
            body, out = (lambda v: lax.all_to_all(v, AXIS, split_axis=0, concat_axis=0, tiled=True)), P(AXIS)
        else:
            raise ValueError(f"unknown collective {op!r}")
        in_place = op in ("all_reduce", "broadcast")
        fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=out),
                     donate_argnums=(0,) if in_place else ())
        sharded = NamedSharding(mesh, P(AXIS))
        return Collective(op, fn, lambda a: jax.make_array_from_process_local_data(sharded, a), in_place)


def _count_collectives(hlo_text: str) -> int:
    """Cross-rank collectives (all-reduce, all-gather, collective-permute; synchronous or started
    asynchronously) in a compiled module's HLO: lines `%name = <shape> all-reduce(...)`; a shape
    may hold `/*index=5*/` comments."""
    return len(_COLLECTIVE.findall(hlo_text))


_COLLECTIVE = re.compile(r"^\s*(?:ROOT\s+)?%\S+ = .* (?:all-reduce|all-gather|collective-permute)(?:-start)?\(",
                         re.MULTILINE)


# ------------------------------------------------------------------ gradient compression


class GradientExchange:
    """The request's compression as the data-parallel step's own collectives, traced inside the
    shard_map (every function here sees one rank's arrays). What a method keeps between steps is
    per rank (`host_state` builds it, `exchange` threads it through the step):
      none          lax.pmean of the gradient tree (XLA all-reduce);
      fp16, bf16    each gradient divided by the ranks, cast, lax.psum'd, cast back;
      powersgd      per matrix-shaped gradient (viewed as (size / last dim, last dim)) where the
                    factors are smaller (n m > (n + m) r): M = gradient + error, P = M Q,
                    P averaged (psum), orthonormalised (QR), Q = M^T P averaged, the gradient
                    P Q^T, error M - P Q^T, Q kept for the next step; other gradients pmean'd;
      topk          per gradient, k = ceil(density size) largest |gradient + residual| as (value,
                    index) pairs, every rank's pairs in one lax.all_gather (the int32 indices
                    bitcast to float32 words), summed into zeros, divided by the ranks;
      gtopk         the same local pairs merged up runners.common.contract.gtopk_tree's binomial
                    tree by lax.ppermute (each merge keeping every gradient's k largest), rank 0's
                    global pairs sent back down; the residual keeps what a rank selected that the
                    global set dropped."""

    def __init__(self, compression: Compression, world_size: int):
        self.compression, self.world_size = compression, world_size
        self.method = compression.method

    # -- what is kept between steps (numpy, on the host; a list per gradient leaf, in tree order)

    def _compressed(self, shape) -> bool:
        if len(shape) < 2:
            return False
        m = shape[-1]
        n = int(np_prod(shape)) // m
        return n * m > (n + m) * self.compression.rank

    def host_state(self, params, rng) -> dict:
        import numpy as np

        jax = load_jax()
        leaves = jax.tree.leaves(params)
        if self.method in (CompressionMethod.TOPK, CompressionMethod.GTOPK):
            return {"residual": [np.zeros(a.shape, np.float32) for a in leaves]}
        if self.method is CompressionMethod.POWERSGD:
            r = self.compression.rank
            return {"error": [np.zeros(a.shape, np.float32) if self._compressed(a.shape) else None for a in leaves],
                    "q": [rng.standard_normal((a.shape[-1], r)).astype(np.float32) if self._compressed(a.shape)
                          else None for a in leaves]}
        return {}

    def describe(self) -> str:
        return {
            CompressionMethod.NONE: "lax.pmean of the gradient tree (XLA all-reduce)",
            CompressionMethod.FP16: "lax.psum of the float16 gradients / ranks, cast back to float32",
            CompressionMethod.BF16: "lax.psum of the bfloat16 gradients / ranks, cast back to float32",
            CompressionMethod.POWERSGD: "PowerSGD: lax.psum of the P factors, then of the Q factors; other "
                                        "gradients lax.pmean",
            CompressionMethod.TOPK: "one lax.all_gather of every rank's (value, index) pairs, summed / ranks",
            CompressionMethod.GTOPK: "gTop-k: lax.ppermute up and down a binomial tree of (value, index) pairs",
        }[self.method]

    def settings(self) -> dict:
        out: dict = {"method": str(self.compression)}
        if self.method is CompressionMethod.POWERSGD:
            out.update(rank=self.compression.rank, error_feedback=True, warm_start=True,
                       compressed_when="n m > (n + m) rank, the matrix viewed as (size / last dim, last dim)",
                       orthogonalisation="jnp.linalg.qr")
        elif self.method in (CompressionMethod.TOPK, CompressionMethod.GTOPK):
            out.update(density=self.compression.density, error_feedback=True, selection="per gradient tensor")
            if self.method is CompressionMethod.GTOPK:
                out["rounds"] = 2 * len(gtopk_tree(self.world_size)[0])
        return out

    # -- the exchange, traced inside the shard_map

    def exchange(self, grads, kept):
        jax = load_jax()
        import jax.numpy as jnp

        lax, n = jax.lax, self.world_size
        if self.method is CompressionMethod.NONE:
            return lax.pmean(grads, AXIS), kept
        if self.method in (CompressionMethod.FP16, CompressionMethod.BF16):
            dtype = jnp.float16 if self.method is CompressionMethod.FP16 else jnp.bfloat16
            return jax.tree.map(lambda g: lax.psum((g / n).astype(dtype), AXIS).astype(g.dtype), grads), kept
        leaves, tree = jax.tree.flatten(grads)
        if self.method is CompressionMethod.POWERSGD:
            out, kept = self._powersgd(leaves, kept)
        else:
            out, kept = self._sparse(leaves, kept)
        return jax.tree.unflatten(tree, out), kept

    def _powersgd(self, leaves, kept):
        jax = load_jax()
        import jax.numpy as jnp

        lax, n = jax.lax, self.world_size
        out, errors, qs = list(leaves), list(kept["error"]), list(kept["q"])
        matrices = [i for i, q in enumerate(qs) if q is not None]
        dense = [i for i in range(len(leaves)) if qs[i] is None]
        if dense:
            for i, g in zip(dense, lax.pmean([leaves[i] for i in dense], AXIS)):
                out[i] = g
        if not matrices:
            return out, kept
        m = {i: (leaves[i] + errors[i]).reshape(-1, leaves[i].shape[-1]) for i in matrices}
        ps = lax.psum([m[i] @ qs[i] for i in matrices], AXIS)  # every P in one all-reduce
        ps = [jnp.linalg.qr(p / n)[0] for p in ps]
        new_qs = lax.psum([m[i].T @ p for i, p in zip(matrices, ps)], AXIS)
        for i, p, q in zip(matrices, ps, new_qs):
            q = q / n
            approx = p @ q.T
            errors[i] = (m[i] - approx).reshape(leaves[i].shape)
            out[i] = approx.reshape(leaves[i].shape)
            qs[i] = q
        return out, {"error": errors, "q": qs}

    def _sparse(self, leaves, kept):
        jax = load_jax()
        import jax.numpy as jnp

        lax, n = jax.lax, self.world_size
        sizes = [int(g.size) for g in leaves]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        ks = [topk_count(size, self.compression.density) for size in sizes]
        total = sum(sizes)
        flat = jnp.concatenate([(g + r).reshape(-1) for g, r in zip(leaves, kept["residual"])])

        def select(vector):
            """Each gradient's k largest magnitudes of `vector`: (values, flat indices)."""
            picked = [lax.top_k(jnp.abs(vector[o:o + s]), k)[1] + o for o, s, k in zip(offsets, sizes, ks)]
            indices = jnp.concatenate(picked).astype(jnp.int32)
            return vector[indices], indices

        def pack(values, indices):
            return jnp.concatenate([values, lax.bitcast_convert_type(indices, jnp.float32)])

        def unpack(packet):
            k = packet.shape[-1] // 2
            return packet[..., :k], lax.bitcast_convert_type(packet[..., k:], jnp.int32)

        values, indices = select(flat)
        mine = indices
        if self.method is CompressionMethod.TOPK:
            gathered = lax.all_gather(pack(values, indices), AXIS)  # (ranks, 2K)
            all_values, all_indices = unpack(gathered)
            summed = jnp.zeros(total, flat.dtype).at[all_indices.reshape(-1)].add(all_values.reshape(-1))
            residual = flat.at[mine].set(0.0)
        else:
            me = lax.axis_index(AXIS)
            reduce_rounds, broadcast_rounds = gtopk_tree(n)
            for edges in reduce_rounds:
                their_values, their_indices = unpack(lax.ppermute(pack(values, indices), AXIS, edges))
                merged = jnp.zeros(total, flat.dtype).at[indices].add(values).at[their_indices].add(their_values)
                merged_values, merged_indices = select(merged)
                receives = jnp.isin(me, jnp.asarray([dst for _, dst in edges]))
                values = jnp.where(receives, merged_values, values)
                indices = jnp.where(receives, merged_indices, indices)
            for edges in broadcast_rounds:
                their_values, their_indices = unpack(lax.ppermute(pack(values, indices), AXIS, edges))
                receives = jnp.isin(me, jnp.asarray([dst for _, dst in edges]))
                values = jnp.where(receives, their_values, values)
                indices = jnp.where(receives, their_indices, indices)
            summed = jnp.zeros(total, flat.dtype).at[indices].add(values)
            sent = jnp.zeros(total, bool).at[mine].set(True) & jnp.zeros(total, bool).at[indices].set(True)
            residual = jnp.where(sent, 0.0, flat)
        averaged = summed / n
        out = [averaged[o:o + s].reshape(g.shape) for o, s, g in zip(offsets, sizes, leaves)]
        residuals = [residual[o:o + s].reshape(g.shape) for o, s, g in zip(offsets, sizes, leaves)]
        return out, {"residual": residuals}


def np_prod(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


# ------------------------------------------------------------------ expert parallelism
# JAX expert parallelism (runners/common/contract.py Parallelism.EXPERT): one `jax.jit` of a
# `jax.shard_map` over the "data" mesh (distributed.py), in which the experts' weights are sharded
# along their expert axis (rank r holds experts r*E/W ... (r+1)*E/W - 1 of every block) and every
# other weight is replicated, its gradients averaged by `lax.pmean`.
#
# A block's forward on a rank's own tokens (transformer.py's MixtureOfExperts routes them, then calls
# dispatch_and_combine): the (token, choice) pairs sorted by expert, each pair's row written into the
# slot of a send buffer of W blocks, block j for rank j, each block C = N x min(k, E/W) rows (the most
# one rank's N tokens can send another: every token choosing up to k distinct experts among its
# E/W), so the dispatch is dropless with static shapes, padded to that worst case; `lax.all_to_all`
# (tiled) sends block j to rank j, with the local expert id of every row (E/W marking padding) beside
# it; the rows are grouped by local expert and multiplied by `lax.ragged_dot` (the padding a group of
# its own, against zero weights); the outputs go back by the reverse all-to-all and are added to
# their tokens, weighted. Autodiff transposes each all-to-all (the backward sends the gradients
# back the same way), so an expert's gradient sums every rank's tokens; it is divided by the ranks,
# as data parallelism's pmean averages, so both train the network alike.
#
# What the record can say: the all-to-alls run inside one XLA executable, so the host clock cannot
# time them apart. The rank reports the bytes it sends to the others per step from the buffers'
# static shapes, the all-to-alls the compiled step holds (counted in its HLO), and the time as the
# difference of two programs: `step_without_sync` is the same program with every all-to-all
# replaced by the identity (each rank's rows stay with it and meet its own experts: the same
# products, the wrong tokens) and without the pmean; the controller's exposed communication is then
# the all-to-alls' and the all-reduce's together, and the all-to-alls' seconds are not given apart.

EXPERT_LEAVES = ("expert_gate", "expert_up", "expert_down")
DISPATCH = ("dropless, padded: each rank sends every other rank a block of N x min(k, E/W) rows (its worst case) "
            "by lax.all_to_all, the unused rows zero, with each row's local expert id beside them")
_ALL_TO_ALL = re.compile(r"=\s*[^=\n]*?\ball-to-all(?:-start)?\(")


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
