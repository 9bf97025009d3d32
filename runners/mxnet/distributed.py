"""Apache MXNet as a multi-worker runner: the kvstore `dist_sync` over ps-lite.

Why dist_sync and not Horovod: dist_sync is MXNet's own engine, in the PyPI wheel (DIST_KVSTORE
is enabled in 1.9.1's build), started with nothing but environment variables. Horovod would have
to be compiled here against this wheel's headers and a C++ toolchain (it ships no MXNet wheel),
for a framework that is retired; its gloo/MPI all-reduce would also no longer be MXNet's engine.

The job (launch style "ps-lite", src/dlbench/execution/launch_styles.py): a scheduler, one server
per host and one worker per rank, all running distributed_worker.py with DMLC_ROLE set; the
scheduler and the servers only `import mxnet`, which serves their role until the workers leave.
ps-lite numbers the workers itself; the launcher numbers RANK the same way and join() checks it.
One worker (the scaling baseline) runs without servers and trains without a kvstore, as Gluon
does on one device.

Training: Gluon's Trainer on the job's kvstore with update_on_kvstore=False, so each step
push-pulls every gradient (the servers sum them; every worker pulls the sum) and every worker
applies the same SGD-momentum update: the same exchange as DDP's all-reduce, the optimiser run
where DDP runs it. (update_on_kvstore=True, Gluon's default for dist, would push gradients and pull
weights, the same bytes, with the optimiser on the servers.) trainer.step(world) divides the summed
gradient by the number of workers: the mean over the global batch, as DDP. Gradient bytes per
iteration: the float32 gradients of every trainable parameter, pushed once (and as many pulled).

Gradient compression (the request's `compression`): MXNet's own 2-bit quantisation
(kv.set_gradient_compression: the worker pushes 2-bit codes and keeps the residual, the servers
decode and sum, the worker pulls the float32 sum; the dist kvstore refuses it with pushpull, so
KVStoreExchange pushes and then pulls), fp16 (float16 casts push-pulled) and PowerSGD (its P and
Q factors push-pulled, with error feedback) and top-k (each worker's (value, index) pairs
all-gathered through the servers, see KVStoreExchange). They run before trainer.update, under keys
of their own. The other methods are skipped (COMPRESSION_UNAVAILABLE).

What MXNet 1.9.1's dist_sync servers do with row_sparse pushes (src/kvstore/kvstore_dist_server.h,
checked on 2 workers by benchmarks/compression_topk_mxnet.py): a key initialised with a row_sparse
array is stored row_sparse, every row present. The servers sum each step's pushes row_sparse
(only the rows sent, ps-lite carrying an 8-byte key and a 4-byte length beside each row) and,
with no optimizer of their own (update_on_kvstore=False), the sum replaces the stored array: it
then holds only the union of the rows pushed, packed, and a row_sparse_pull of row r answers with
the r-th stored row (the server indexes the data by row id, as if every row were present): wrong
values wherever a step's pushes do not cover every row. A key initialised dense is stored flat
(one dimension); a row_sparse push to it is summed as rows of that flat array, so it works for an
(n, 1) array only (larger rows fail the server's copy). The top-k exchange therefore has every
worker push one whole row of a key of `workers` rows each step: the pushes cover every row, and
the stored sum stays whole.

Exposed communication: MXNet's dependency engine issues each gradient's push as soon as backward
has written it, so the exchange overlaps backward. `step_without_sync` is the same step with
trainer.update() in place of trainer.step(): Gluon's own split of step() into allreduce_grads()
and update(), without the former; the controller reports the difference of the medians.

Collectives, all through the job's kvstore (string keys, one per collective and size):
- all_reduce: kv.pushpull in place (push to the servers, which sum over every worker; pull).
- broadcast (root 0): kv.broadcast, MXNet's own: rank 0's init of a key (a push and a barrier of
  every worker) and a pull by every worker. A key can be initialised once only, so each call takes
  a fresh key, which the servers and workers keep until the job ends: sizes whose calls would pass
  BROADCAST_KEY_BUDGET_BYTES in one job are skipped, saying so (every rank decides alike).
- reduce_scatter: the buffer as a row-sparse array of n rows (one per rank), pushed whole (the
  servers sum it), then kv.row_sparse_pull of this rank's row only.
- all_gather: each rank pushes a row-sparse array holding only its own row; the servers' sum of
  rows that no two ranks share is their union, which every rank pulls (row_sparse_pull of every
  row). MXNet has no all-gather operator; these are its sparse push/pull, carrying exactly
  all-gather's bytes through ps-lite (count/n out, count in per rank), never a transport of ours.
"""

from __future__ import annotations

import gc
import os

from runners.common.contract import Compression, CompressionMethod, DataParallel, topk_count
from runners.common.protocol import Skip
from runners.mxnet.framework import load_mxnet
from runners.mxnet.precision import float32_math, request_precision
from runners.mxnet.runner import MXNetRunner, compile_choice
from runners.mxnet.step import (HYBRIDIZE, build_model, count_params, output_shape, synthetic_batch, to_device,
                                trainable_params)

# The servers and workers keep every broadcast key (and its buffers) until the job ends.
BROADCAST_KEY_BUDGET_BYTES = 2 * 1024 ** 3


class Collective:
    """One collective over buffers made once; `run` issues it on the engine, `synchronize` waits."""

    def __init__(self, runner, op: str, send_count: int, recv_count: int):
        mx = load_mxnet()
        import numpy as np

        self.runner, self.op, self.kv = runner, op, runner.kv
        world, rank = runner.world_size, runner.rank
        self.key = f"{op}:{send_count}:{recv_count}"
        if op in ("all_reduce", "broadcast"):
            self.buf = mx.nd.zeros(send_count)
            if op == "all_reduce":
                self.kv.init(self.key, mx.nd.zeros(send_count))
            self.calls = 0
            return
        block = recv_count if op == "reduce_scatter" else send_count
        self.shape = (world, block)
        every_row = mx.nd.array(np.arange(world), dtype="int64")
        # a row-sparse key is initialised with every row present (ps-lite refuses an empty init)
        self.kv.init(self.key, mx.nd.sparse.row_sparse_array((mx.nd.zeros(self.shape), every_row), shape=self.shape))
        if op == "reduce_scatter":
            self.send_rows = every_row
            self.pull_rows = mx.nd.array([rank], dtype="int64")
        elif op == "all_gather":
            self.send_rows = mx.nd.array([rank], dtype="int64")
            self.pull_rows = every_row
        else:
            raise ValueError(f"unknown collective {op!r}")
        self.send = None
        self.recv = mx.nd.sparse.zeros("row_sparse", self.shape)

    def load(self, array) -> None:
        mx = load_mxnet()
        if self.op in ("all_reduce", "broadcast"):
            self.buf[:] = mx.nd.array(array)
            return
        data = mx.nd.array(array).reshape((-1, self.shape[1]))  # reduce_scatter: n rows; all_gather: 1
        self.send = mx.nd.sparse.row_sparse_array((data, self.send_rows), shape=self.shape)

    def run(self) -> None:
        if self.op == "all_reduce":
            self.kv.pushpull(self.key, self.buf, out=self.buf)
        elif self.op == "broadcast":
            self.calls += 1
            self.kv.broadcast(f"{self.key}:{self.calls}", self.buf, out=self.buf)
        else:
            self.kv.push(self.key, self.send)
            self.kv.row_sparse_pull(self.key, out=self.recv, row_ids=self.pull_rows)

    def synchronize(self) -> None:
        load_mxnet().nd.waitall()

    def result(self):
        if self.op in ("all_reduce", "broadcast"):
            return self.buf.asnumpy()
        if self.op == "reduce_scatter":
            return self.recv.data.asnumpy().reshape(-1)  # the one row pulled: this rank's block
        return self.recv.tostype("default").asnumpy().reshape(-1)


# Why the runner has no exchange for these methods (runner.toml's compression_refused says the same).
COMPRESSION_UNAVAILABLE = {
    CompressionMethod.BF16: "MXNet 1.9's NDArray has no bfloat16 dtype ('bfloat16' is not understood), so the "
                            "kvstore cannot carry bfloat16 gradients",
    CompressionMethod.GTOPK: "gTop-k merges pairs between workers up a tree, and ps-lite workers send only to the "
                             "servers, which sum what they receive: no worker-to-worker message, no merge",
}

# int keys of the runner's own exchange, clear of the Trainer's (0 .. parameters - 1): a kvstore
# takes int or str keys, not both; PowerSGD's Q factors have keys of their own above
EXCHANGE_KEY_BASE = 1 << 20
Q_KEY_BASE = 1 << 21

# top-k's indices travel as float32 words the servers add zeros to (the sum of rows no two workers
# share): exact integers up to 2^24 (float32's 24-bit significand), so a tensor may have at most
# this many elements
TOPK_MAX_TENSOR_ELEMENTS = 1 << 24


def topk_unavailable(sizes: list[int]) -> str | None:
    """Why the top-k exchange cannot carry gradients of these sizes exactly, or None."""
    largest = max(sizes, default=0)
    if largest > TOPK_MAX_TENSOR_ELEMENTS:
        return (f"a gradient tensor of {largest} elements: top-k's indices travel through the kvstore as "
                f"float32 (its servers sum float types only), exact up to {TOPK_MAX_TENSOR_ELEMENTS} elements")
    return None


class KVStoreExchange:
    """A compressed exchange through the kvstore, run before trainer.update (which then applies the
    summed gradients without an exchange of its own), one key per gradient, in the Trainer's order
    and priorities:
      fp16  each gradient cast to float16, kv.pushpull of the cast (the servers sum float16), cast
            back into the gradient;
      2bit  kv.set_gradient_compression({'type': '2bit', 'threshold': t}) before the keys are made;
            kv.push of each gradient (the kvstore quantises it to 2-bit codes and keeps the residual
            on the worker; the servers decode and sum), then kv.pull of the float32 sum into it
            (MXNet 1.9's dist kvstore refuses pushpull with compression: two calls);
      powersgd  per weight viewed as (shape[0], the rest) whose factors are smaller (n m > (n + m) r):
            M = gradient + error, P = M Q push-pulled (summed), orthonormalised (an LQ
            factorisation of P^T, mx.nd.linalg.gelqf), Q = M^T P push-pulled, the gradient P Q^T,
            error M - P Q^T / workers, Q / workers kept (warm start); other gradients push-pulled
            whole. Every worker starts from the same Q (the request's seed);
      topk  per gradient, k = ceil(density size) largest |gradient + residual| (mx.nd.topk) as k
            values and their k indices (float32, exact: topk_unavailable), one row of 2k words of a
            (workers, 2k) key: kv.push of a row_sparse array holding only this worker's row (the
            servers' sum of rows no two workers share is every worker's row), kv.row_sparse_pull
            of the other workers' rows: an all-gather of the pairs through the servers, each
            worker sending its 8k bytes and receiving the others' (n-1) 8k, as torch's and
            TensorFlow's all_gather; every worker scatters the pairs into zeros in rank order (the
            same sum on every worker); the residual keeps what this worker did not send. Each
            step's pushes cover every row of the key, which keeps the servers' stored sum whole
            (the module's docstring says why that matters).
            Why not the servers' sum of the sparse gradients themselves (each worker's k entries
            pushed as k rows of the gradient seen as (size, 1), the union of the rows pulled): a
            worker cannot name the union without the others' indices, which would need this
            all-gather first, and ps-lite sends an 8-byte key and a 4-byte length beside every
            row's 4-byte value (16 bytes a pushed entry, 24 a pulled one, against 8 here)."""

    def __init__(self, kv, trainable, compression: Compression, world: int = 1, seed: int = 0,
                 key_base: int = EXCHANGE_KEY_BASE):
        """`key_base`: the first of the exchange's kvstore keys (a second exchange in one job, as a
        check makes, takes keys of its own: a key is initialised once)."""
        mx = load_mxnet()
        import numpy as np

        self.kv, self.method, self.compression, self.world = kv, compression.method, compression, world
        self.grads = [p.list_grad()[0] for p in trainable]
        self.keys = [key_base + i for i in range(len(self.grads))]
        if self.method is CompressionMethod.POWERSGD:
            r = compression.rank
            rng = np.random.default_rng(seed)
            self.views, self.errors, self.qs, self.ps = [], [], [], []
            for i, g in enumerate(self.grads):
                n = g.shape[0] if len(g.shape) >= 2 else None
                m = g.size // n if n else None
                factored = n is not None and n * m > (n + m) * r
                self.views.append((n, m) if factored else None)
                self.errors.append(mx.nd.zeros((n, m)) if factored else None)
                self.qs.append(mx.nd.array(rng.standard_normal((m, r)).astype(np.float32)) if factored else None)
                self.ps.append(mx.nd.zeros((n, r)) if factored else None)
                kv.init(self.keys[i], mx.nd.zeros((n, r)) if factored else mx.nd.zeros(g.shape))
                if factored:
                    kv.init(Q_KEY_BASE + i, mx.nd.zeros((m, r)))
            return
        if self.method is CompressionMethod.TOPK:
            self.rank = kv.rank
            self.sizes = [g.size for g in self.grads]
            self.ks = [topk_count(size, compression.density) for size in self.sizes]
            self.residuals = [mx.nd.zeros(size) for size in self.sizes]
            self.own_row = mx.nd.array([self.rank], dtype="int64")
            self.other_rows = mx.nd.array([r for r in range(world) if r != self.rank], dtype="int64")
            self.received = []
            every_row = mx.nd.array(np.arange(world), dtype="int64")
            for key, k in zip(self.keys, self.ks):
                shape = (world, 2 * k)
                # row_sparse, every row present (ps-lite refuses an empty init); each step's pushes
                # cover every row again, which keeps the stored sum whole (module docstring)
                kv.init(key, mx.nd.sparse.row_sparse_array((mx.nd.zeros(shape), every_row), shape=shape))
                self.received.append(mx.nd.sparse.zeros("row_sparse", shape))
            return
        if self.method is CompressionMethod.FP16:
            self.buffers = [mx.nd.zeros(g.shape, dtype="float16") for g in self.grads]
        elif self.method is CompressionMethod.TWO_BIT:
            kv.set_gradient_compression({"type": "2bit", "threshold": compression.threshold})
            self.buffers = self.grads
        else:
            raise ValueError(f"compression {compression} has no kvstore exchange in this runner")
        for key, buffer in zip(self.keys, self.buffers):
            kv.init(key, mx.nd.zeros(buffer.shape, dtype=buffer.dtype))

    def _powersgd(self) -> None:
        nd = load_mxnet().nd
        ms = {}
        for i, (key, g, view) in enumerate(zip(self.keys, self.grads, self.views)):
            if view is None:  # a vector, or a matrix its factors would not shrink: summed whole
                self.kv.pushpull(key, g, out=g, priority=-i)
                continue
            ms[i] = g.reshape(view) + self.errors[i]
            nd.dot(ms[i], self.qs[i], out=self.ps[i])
            self.kv.pushpull(key, self.ps[i], out=self.ps[i], priority=-i)
        for i, m in ms.items():
            lq, _ = nd.linalg.gelqf(self.ps[i].T)  # P^T = L Q: Q^T spans P's columns, orthonormal
            p = lq.T
            q = nd.dot(m, p, transpose_a=True)
            self.kv.pushpull(Q_KEY_BASE + i, q, out=q, priority=-i)
            approx = nd.dot(p, q, transpose_b=True)  # the sum over the workers of their M's projection
            self.errors[i][:] = m - approx / self.world
            self.qs[i][:] = q / self.world
            self.grads[i][:] = approx.reshape(self.grads[i].shape)

    def _topk(self) -> None:
        nd = load_mxnet().nd
        sent = []
        for i, (key, g, k) in enumerate(zip(self.keys, self.grads, self.ks)):
            accumulated = g.reshape(-1) + self.residuals[i]
            indices = nd.topk(nd.abs(accumulated), k=k, ret_typ="indices")  # float32
            values = nd.take(accumulated, indices)
            mine = nd.scatter_nd(values, indices.reshape((1, k)), shape=(self.sizes[i],))
            self.residuals[i][:] = accumulated - mine  # exactly 0 where sent, the rest kept
            row = nd.concat(values, indices, dim=0).reshape((1, 2 * k))
            send = nd.sparse.row_sparse_array((row, self.own_row), shape=(self.world, 2 * k))
            self.kv.push(key, send, priority=-i)
            if self.world > 1:
                self.kv.row_sparse_pull(key, out=self.received[i], row_ids=self.other_rows, priority=-i)
            sent.append(mine)
        for i, (g, k) in enumerate(zip(self.grads, self.ks)):
            rows = self.received[i].tostype("default")  # (workers, 2k), this worker's row zeros
            summed = None
            for r in range(self.world):  # in rank order: every worker adds the same terms alike
                part = sent[i] if r == self.rank else nd.scatter_nd(rows[r][:k], rows[r][k:].reshape((1, k)),
                                                                   shape=(self.sizes[i],))
                summed = part if summed is None else summed + part
            g[:] = summed.reshape(g.shape)

    def push_pull(self) -> None:
        if self.method is CompressionMethod.POWERSGD:
            self._powersgd()
            return
        if self.method is CompressionMethod.TOPK:
            self._topk()
            return
        nd = load_mxnet().nd
        for i, (key, g, buffer) in enumerate(zip(self.keys, self.grads, self.buffers)):
            if self.method is CompressionMethod.FP16:
                nd.cast(g, dtype="float16", out=buffer)
                self.kv.pushpull(key, buffer, out=buffer, priority=-i)
                nd.cast(buffer, dtype="float32", out=g)
            else:
                self.kv.push(key, g, priority=-i)
                self.kv.pull(key, out=g, priority=-i)

    def describe(self) -> str:
        if self.method is CompressionMethod.TOPK:
            return ("top-k per gradient (mx.nd.topk), each worker's (value, index) pairs as its row of a (workers, 2k) "
                    "float32 key: kv.push of a row_sparse array of that row (the servers sum rows no two workers "
                    "share), kv.row_sparse_pull of the other workers' rows (an all-gather through the servers), "
                    "scattered into zeros and summed in rank order, then trainer.update")
        if self.method is CompressionMethod.POWERSGD:
            return ("PowerSGD: kv.pushpull of each compressed weight's P factor (and of every other gradient whole), "
                    "then of its Q factor; orthonormalised by mx.nd.linalg.gelqf; then trainer.update")
        if self.method is CompressionMethod.FP16:
            return ("each gradient cast to float16, kv.pushpull of the casts (the servers sum float16), cast back "
                    "into the gradient, then trainer.update (no exchange of the Trainer's own)")
        return ("kvstore dist_sync with set_gradient_compression 2bit: kv.push of each gradient (quantised by the "
                "kvstore to 2-bit codes, 16 values to a float32 word, the residual kept on the worker; the "
                "servers decode and sum), kv.pull of the float32 sum, then trainer.update")


class MXNetDistributedRunner(MXNetRunner):
    def __init__(self):
        self.kv = None
        self.rank, self.world_size = 0, 1
        self.distributed = False
        self._broadcast_bytes = 0

    def device_available(self, device: str) -> str | None:
        if device != "cpu":
            # the GPU variant (dist_device_sync: gradients summed on the GPUs before they go to the
            # servers) is not wired in; every rank skips, saying so
            if os.environ.get("DMLC_ROLE") == "worker":
                # the scheduler and the servers end once every worker has registered and left
                kv = load_mxnet().kv.create("dist_sync")
                del kv
                gc.collect()
            return f"the mxnet multi-worker runner runs on cpu only (kvstore dist_sync), not {device!r}"
        return super().device_available(device)

    def join(self, cluster) -> dict:
        mx = load_mxnet()
        role = os.environ.get("DMLC_ROLE")
        if role is None:
            if cluster.world_size != 1:
                raise RuntimeError(f"{cluster.world_size} workers but DMLC_ROLE is not set: the job must be "
                                   "started by the ps-lite launch style (scheduler, servers, workers)")
            self.kv = None  # one worker: nothing to exchange, no servers (Gluon on one device: no kvstore)
            return {"backend": "one worker, no servers (training: no kvstore; collectives: kvstore local)",
                    "rank": 0, "world_size": 1}
        if role != "worker":
            raise RuntimeError(f"DMLC_ROLE={role!r} reached the rank's code; only workers run it")
        self.kv = mx.kv.create("dist_sync")  # registers with the scheduler; returns once every node has
        self.distributed = True
        self.rank, self.world_size = self.kv.rank, self.kv.num_workers
        if (self.rank, self.world_size) != (cluster.rank, cluster.world_size):
            raise RuntimeError(f"ps-lite made this worker rank {self.rank} of {self.world_size}, the launcher "
                               f"numbered it {cluster.rank} of {cluster.world_size} (a worker's PORT was taken?)")
        return {"backend": "kvstore dist_sync (ps-lite, zmq)", "kvstore": self.kv.type, "rank": self.rank,
                "world_size": self.world_size, "servers": int(os.environ["DMLC_NUM_SERVER"]),
                "server_omp_threads": os.environ.get("OMP_NUM_THREADS"),
                "scheduler": f"{os.environ['DMLC_PS_ROOT_URI']}:{os.environ['DMLC_PS_ROOT_PORT']}",
                "node_host": os.environ.get("DMLC_NODE_HOST"),
                "bigarray_bound": int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", "1000000"))}

    def barrier(self) -> None:
        if self.distributed:
            self.kv._barrier()  # ps-lite's barrier of every worker (MXKVStoreBarrier)

    def leave(self) -> None:
        """Free the kvstore: its destructor waits for every worker, then rank 0 stops the servers
        and the scheduler, which end their processes. Nothing else may still hold it."""
        load_mxnet().nd.waitall()
        self.kv = None
        gc.collect()

    # ------------------------------------------------------------------ training

    def prepare_data_parallel(self, request: dict, cluster) -> DataParallel:
        mx = load_mxnet()
        import numpy as np

        compression = request.get("compression") or Compression(CompressionMethod.NONE)
        why = COMPRESSION_UNAVAILABLE.get(compression.method)
        if why:  # runner.toml refuses them first; this guards a hand-made request
            raise Skip(f"mxnet data-parallel runner: compression {compression}: {why}")
        precision = request_precision(request)  # ValueError: a name no runner accepts
        if precision != "fp32":
            raise Skip(f"precision {precision}: the mxnet data-parallel runner trains in fp32 only "
                       "(mxnet.contrib.amp is not wired into the dist_sync job)")
        network = request["network"]
        seed = request.get("seed", 0)
        mx.random.seed(seed)  # every worker builds the same weights (the Trainer broadcasts rank 0's anyway)
        np.random.seed(seed)
        ctx = mx.cpu()
        effective = float32_math(precision, ctx)  # the same pins as in one process
        compiled, compile_settings = compile_choice(request)
        net, _, model = build_model(network, ctx, hybridize=compiled)

        # each rank trains on its own synthetic batch (as a sharded data set would give it)
        x_np, y_np = synthetic_batch(network, request["batch_size"],
                                     np.random.default_rng(seed * 1000 + cluster.rank + 1))
        x, y = to_device(x_np, y_np, ctx)  # token ids as float32, as the single-process runner

        trainable = trainable_params(net)
        params = count_params(trainable)
        grad_bytes = params * 4
        world = cluster.world_size
        if compression.method is CompressionMethod.TOPK:
            why = topk_unavailable([int(np.prod(p.shape)) for p in trainable])
            if why:  # every rank builds the same network: all skip alike
                raise Skip(f"mxnet data-parallel runner: compression {compression}: {why}")
        trainer = mx.gluon.Trainer(trainable, "sgd", {"learning_rate": request["learning_rate"],
                                                      "momentum": request["momentum"], "wd": 0.0},
                                   kvstore=self.kv, update_on_kvstore=False if self.kv is not None else None)

        seen = {}

        def forward_backward():
            with mx.autograd.record(train_mode=True):
                _, loss = model(x, y)
            loss.backward()
            seen["loss"] = loss  # read by loss() between steps (the harness's losses), never inside one

        # one worker: nothing is exchanged (no kvstore), its baseline is dense
        exchange = KVStoreExchange(self.kv, trainable, compression, world, seed + 2) \
            if self.kv is not None and not compression.dense else None
        if exchange is not None:
            def step():
                forward_backward()
                exchange.push_pull()  # the compressed exchange: the summed gradients in place
                trainer.update(world)
        else:
            def step():
                forward_backward()
                trainer.step(world)  # push-pull every gradient (summed over the workers), then / world

        def step_without_sync():
            forward_backward()
            trainer.update(world)  # the same update on this worker's own gradient: no exchange

        settings = {"layout": "NCHW", "hybridize": dict(HYBRIDIZE) if compiled else None,
                    "compile": compile_settings, "precision": precision, "precision_effective": effective,
                    "onednn": mx.runtime.Features().is_enabled("MKLDNN"),
                    "kvstore": self.kv.type if self.kv is not None else None,
                    "update_on_kvstore": False if self.kv is not None else None,
                    "optimizer": "gluon.Trainer sgd(momentum) on every worker, step(workers) on the summed "
                                 "gradients of the per-worker mean losses",
                    "engine_cpu_worker_threads": int(os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")),
                    "exposed_communication": "median step time minus median step time with trainer.update() "
                                             "in place of trainer.step() (no allreduce_grads)",
                    "compression": {"method": str(compression)}}
        if exchange is not None:
            settings["compression"]["exchange"] = exchange.describe()
            if compression.method is CompressionMethod.TWO_BIT:
                settings["compression"].update(threshold=compression.threshold, error_feedback=True,
                                               residual="kept by the kvstore on each worker (MXNet's own)")
            elif compression.method is CompressionMethod.TOPK:
                pairs = sum(exchange.ks)
                settings["compression"].update(
                    density=compression.density, error_feedback=True, selection="per gradient tensor",
                    selection_op="mx.nd.topk", pairs=pairs, index_dtype="float32",
                    pushed_bytes_per_step=8 * pairs, pulled_bytes_per_step=8 * pairs * (world - 1),
                    server_storage="a (workers, 2k) float32 key per gradient, initialised row_sparse with every "
                                   "row present; every worker pushes its whole row each step, so the servers' "
                                   "row_sparse sum, which replaces the stored array, keeps every row. (MXNet 1.9.1's "
                                   "servers keep only the rows a step pushed, packed, and answer a row_sparse_pull "
                                   "of row r with the r-th of them: pushes of scattered rows would come back wrong.)")
            elif compression.method is CompressionMethod.POWERSGD:
                settings["compression"].update(
                    rank=compression.rank, error_feedback=True, warm_start=True,
                    compressed_tensors=sum(v is not None for v in exchange.views),
                    compressed_when="n m > (n + m) rank, the weight viewed as (shape[0], the rest)",
                    orthogonalisation="mx.nd.linalg.gelqf of P^T")
        return DataParallel(step, step_without_sync, mx.nd.waitall, params, output_shape(net, x), settings,
                            grad_bytes, loss=lambda: float(seen["loss"].mean().asscalar()))

    # ------------------------------------------------------------------ collectives

    def collective_size_unavailable(self, op: str, size_bytes: int, runs: int) -> str | None:
        if op != "broadcast":
            return None
        need = size_bytes * runs
        if self._broadcast_bytes + need > BROADCAST_KEY_BUDGET_BYTES:
            return (f"kv.broadcast takes a fresh kvstore key per call, kept until the job ends: {runs} calls of "
                    f"{size_bytes} B would take the job's broadcast keys past "
                    f"{BROADCAST_KEY_BUDGET_BYTES // 1024 ** 2} MiB")
        self._broadcast_bytes += need
        return None

    def collective(self, op: str, send_count: int, recv_count: int) -> Collective:
        if self.kv is None:
            # one worker: a local kvstore does the same calls within this process
            self.kv = load_mxnet().kv.create("local")
        return Collective(self, op, send_count, recv_count)
