"""PyTorch as a multi-worker runner: DistributedDataParallel and torch.distributed collectives.

Each rank is started by torchrun (runner.toml: [distributed] launch = "torchrun"), which sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the process group is gloo on CPU and nccl on CUDA
(one GPU per local rank). The contract is in runners/common/distributed_harness.py. Collectives:
`all_reduce`, `broadcast`, `all_gather_single`, `reduce_scatter_single` and `all_to_all_single`
(equal blocks), which gloo implements on the CPU (torch 2.13: checked at every smoke size).

Exposed communication: DDP all-reduces gradient buckets while backward is still running, so only
the part of the exchange that backward does not hide costs time. `step_without_sync` runs the same
step under DDP's `no_sync()` (gradients stay local, no all-reduce); the controller reports the
difference of the medians of the two as the communication time not hidden behind backward.
"""

from __future__ import annotations

import datetime

from runners.common.contract import (
    CHECK_PRECISION,
    PRECISIONS,
    Compression,
    CompressionMethod,
    DataParallel,
    gtopk_tree,
    topk_count,
)
from runners.common.protocol import Skip
from runners.torch import step as st
from runners.torch.framework import load_torch, synchronizer
from runners.torch.precision import float32_math, mixed_precision, request_precision
from runners.torch.runner import TorchRunner

# PowerSGD's first steps all-reduce densely (DDP rebuilds its buckets after the first iteration);
# torch needs at least 2 when error feedback or warm start is on. The harness's warm-up covers them.
POWERSGD_START_ITER = 2

# A collective that waits this long has lost a peer: fail instead of waiting gloo's 30 minutes.
# dlbench's job timeout stops a hung job anyway; this makes the rank's own error the record's.
PROCESS_GROUP_TIMEOUT_S = 300


class Collective:
    """One collective over preallocated tensors; send and receive are one tensor where in place."""

    def __init__(self, op: str, send, recv, synchronize):
        self.op, self.send, self.recv, self._sync = op, send, recv, synchronize

    def load(self, array) -> None:
        torch = load_torch()
        self.send.copy_(torch.from_numpy(array))

    def run(self) -> None:
        dist = load_torch().distributed
        if self.op == "all_reduce":
            dist.all_reduce(self.send)
        elif self.op == "broadcast":
            dist.broadcast(self.send, src=0)
        elif self.op == "all_gather":
            dist.all_gather_single(self.recv, self.send)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_single(self.recv, self.send)
        elif self.op == "all_to_all":  # equal blocks: no split sizes given
            dist.all_to_all_single(self.recv, self.send)
        else:
            raise ValueError(f"unknown collective {self.op!r}")

    def synchronize(self) -> None:
        self._sync()

    def result(self):
        return self.recv.cpu().numpy()


class TorchDistributedRunner(TorchRunner):
    def __init__(self):
        self.device = None

    def join(self, cluster) -> dict:
        torch = load_torch()
        dist = torch.distributed
        cuda = cluster.device == "cuda"
        if cuda:
            torch.cuda.set_device(cluster.local_rank)
            self.device = torch.device("cuda", cluster.local_rank)
        else:
            self.device = torch.device("cpu")
        backend = "nccl" if cuda else "gloo"
        # torchrun's variables (env://): MASTER_ADDR/PORT, RANK, WORLD_SIZE
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S),
                                **({"device_id": self.device} if cuda else {}))
        return {"backend": dist.get_backend(), "rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "device": str(self.device)}

    def barrier(self) -> None:
        dist = load_torch().distributed
        if self.device is not None and self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def leave(self) -> None:
        load_torch().distributed.destroy_process_group()

    def prepare_data_parallel(self, request: dict, cluster) -> DataParallel:
        torch = load_torch()
        network = request["network"]
        device = self.device
        cuda = device.type == "cuda"
        torch.manual_seed(request.get("seed", 0))  # every rank builds the same model (DDP broadcasts rank 0's anyway)
        ddp_options = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False}  # DDP's defaults, stated
        settings: dict = {"ddp": dict(ddp_options),
                          "exposed_communication": "median step time minus median step time under DDP no_sync()"}
        if request.get("compile") not in (None, "default", "eager"):  # never a silent eager run
            raise Skip(f"compile {request.get('compile')!r}: the torch distributed runner trains eagerly "
                       "(DistributedDataParallel without torch.compile)")
        settings["compile"] = {"mode": "eager", "requested": request.get("compile")}
        if request.get("precision") == CHECK_PRECISION:  # the equivalence check's precision, single-process only
            raise ValueError(f"the torch distributed runner does not train in {CHECK_PRECISION} "
                             f"({', '.join(PRECISIONS)} only)")
        precision = request_precision(request, PRECISIONS)
        settings["precision"] = precision.value
        settings["precision_effective"] = float32_math(precision, device)  # as in one process (Skip: tf32 off a GPU)
        model, memory_format = st.place(st.build_network(network), network, device, settings)
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        probe, _ = st.synthetic_batch(network, 1, device, memory_format, torch.Generator(device="cpu").manual_seed(0))
        out_shape = st.output_shape(model, probe, train=True)
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None, **ddp_options)
        settings["ddp"]["broadcast_buffers"] = bool(getattr(ddp, "broadcast_buffers", True))

        # each rank trains on its own synthetic batch (as a sharded data set would give it)
        seed = request.get("seed", 0) * 1000 + cluster.rank + 1
        x, y = st.synthetic_batch(network, request["batch_size"], device, memory_format,
                                  torch.Generator(device="cpu").manual_seed(seed))
        autocast, scaler, amp = mixed_precision(precision, device, train=True)
        settings["precision_effective"].update(amp)
        settings["compression"] = register_compression(ddp, request.get("compression"), cluster.world_size,
                                                       request.get("seed", 0))
        step, _ = st.train_step(ddp, x, y, lambda: st.sgd(st.trainable_params(ddp), request), autocast, scaler)

        def step_without_sync():
            with ddp.no_sync():
                step()

        return DataParallel(step, step_without_sync, synchronizer(device), params, out_shape, settings, grad_bytes)

    def collective(self, op: str, send_count: int, recv_count: int) -> Collective:
        torch = load_torch()
        send = torch.zeros(send_count, dtype=torch.float32, device=self.device)
        recv = send if op in ("all_reduce", "broadcast") else torch.zeros(recv_count, dtype=torch.float32,
                                                                          device=self.device)
        return Collective(op, send, recv, synchronizer(self.device))


# ------------------------------------------------------------------ gradient compression (DDP hooks)


def register_compression(ddp, compression: Compression | None, world_size: int, seed: int) -> dict:
    """The request's compression as DDP's communication hook (none: DDP's own all-reduce, no hook);
    what was registered, for the record's settings."""
    compression = compression or Compression(CompressionMethod.NONE)
    method = compression.method
    torch = load_torch()
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if method is CompressionMethod.NONE:
        return {"method": "none", "hook": None}
    if method is CompressionMethod.FP16:
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return {"method": str(compression), "hook": "torch default_hooks.fp16_compress_hook"}
    if method is CompressionMethod.BF16:
        if torch.distributed.get_backend() == "gloo":  # torch's hook refuses any backend but NCCL's and XCCL's
            ddp.register_comm_hook(None, bf16_gloo_hook)
            return {"method": str(compression), "hook": "runner bf16_gloo_hook (torch's bf16_compress_hook, which "
                    "accepts only NCCL and XCCL, done on gloo's bfloat16 all-reduce)"}
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
        return {"method": str(compression), "hook": "torch default_hooks.bf16_compress_hook"}
    if method is CompressionMethod.POWERSGD:
        # min_compression_rate 1: every matrix the factors make smaller is compressed (the
        # published method); vectors are all-reduced as they are
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=compression.rank, start_powerSGD_iter=POWERSGD_START_ITER,
            min_compression_rate=1, use_error_feedback=True, warm_start=True, random_seed=seed)
        if torch.distributed.get_backend() == "gloo":
            ddp.register_comm_hook(state, powersgd_waited)
            hook = ("torch powerSGD_hook.powerSGD_hook, waited for in the hook (gloo: a bucket's Q all-reduce, "
                    "started when its P all-reduce ends, could start before the next bucket's P on one rank and after "
                    "it on another)")
        else:
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            hook = "torch powerSGD_hook.powerSGD_hook"
        return {"method": str(compression), "hook": hook,
                "rank": compression.rank, "start_iter": POWERSGD_START_ITER, "min_compression_rate": 1,
                "error_feedback": True, "warm_start": True}
    state = SparseState(compression.density, world_size, torch.distributed.get_rank())
    if method is CompressionMethod.TOPK:
        ddp.register_comm_hook(state, topk_hook)
        return {"method": str(compression), "hook": "runner topk_hook: per-tensor top-k, one all_gather of "
                "(value, index) pairs per bucket", "density": compression.density, "error_feedback": True}
    if method is CompressionMethod.GTOPK:
        ddp.register_comm_hook(state, gtopk_hook)
        reduce_rounds, _ = gtopk_tree(world_size)
        return {"method": str(compression), "hook": "runner gtopk_hook: per-tensor top-k merged up and sent down a "
                "binomial tree by send/recv (blocking inside the hook: no overlap with the backward)",
                "density": compression.density, "error_feedback": True, "rounds": 2 * len(reduce_rounds)}
    raise ValueError(f"compression {compression} has no torch hook")  # every method is handled above


def bf16_gloo_hook(process_group, bucket):
    """The bucket cast to bfloat16 and divided by the ranks, all-reduced (gloo sums bfloat16), cast
    back into the bucket: what torch's bf16_compress_hook does on NCCL."""
    torch = load_torch()
    dist = torch.distributed
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(process_group))
    future = dist.all_reduce(compressed, group=process_group, async_op=True).get_future()

    def decompress(_):
        return buffer.copy_(compressed)

    return future.then(decompress)


def powersgd_waited(state, bucket):
    """torch's PowerSGD hook, its bucket's collectives finished before the hook returns: gloo runs
    collectives in the order each rank issues them, and the hook issues its Q all-reduce from the
    P all-reduce's callback, whose timing differs between ranks."""
    torch = load_torch()
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    result = powerSGD_hook.powerSGD_hook(state, bucket).wait()
    future = torch.futures.Future()
    future.set_result(result)
    return future


class SparseState:
    """What the top-k and gTop-k hooks keep between steps: each bucket's residual (error feedback)."""

    def __init__(self, density: float, world_size: int, rank: int):
        self.density, self.world_size, self.rank = density, world_size, rank
        self.residuals: dict[int, object] = {}

    def accumulated(self, bucket):
        """This step's gradient plus what earlier steps left unsent (a fresh residual when DDP has
        rebuilt its buckets after the first iteration and the bucket's size changed)."""
        buffer = bucket.buffer()
        residual = self.residuals.get(bucket.index())
        if residual is None or residual.numel() != buffer.numel():
            return buffer.clone()
        return buffer + residual

    def select(self, flat, sizes: list[int]):
        """Indices (into the flat bucket) of each tensor's k largest magnitudes, concatenated."""
        torch = load_torch()
        picked, offset = [], 0
        for size in sizes:
            k = topk_count(size, self.density)
            picked.append(torch.topk(flat[offset:offset + size].abs(), k, sorted=False).indices + offset)
            offset += size
        return torch.cat(picked)


def _exchange(rank: int, edges, values, indices):
    """One round of a gTop-k tree: the round's senders send their (values, indices) pairs to their
    receivers (a rank is in one edge of a round at most). A receiver gets its sender's pairs (as
    many as its own), every other rank None."""
    torch = load_torch()
    for sender, receiver in edges:
        if rank == sender:
            torch.distributed.send(_pack(values, indices), receiver)
        elif rank == receiver:
            packet = torch.empty(2 * indices.numel(), dtype=torch.float32)
            torch.distributed.recv(packet, sender)
            return _unpack(packet)
    return None


def _sizes(bucket) -> list[int]:
    return [g.numel() for g in bucket.gradients()]


def _pack(values, indices):
    """(values, indices) as one float32 message: the int32 indices' bits travel as float32 words
    (a gather moves bits, adds nothing), so one collective carries both."""
    torch = load_torch()
    return torch.cat([values, indices.to(torch.int32).view(torch.float32)])


def _unpack(packet):
    torch = load_torch()
    k = packet.numel() // 2
    return packet[:k], packet[k:].contiguous().view(torch.int32).long()


def topk_hook(state: SparseState, bucket):
    """Top-k with error feedback: every rank's k pairs per tensor all-gathered, summed, / ranks."""
    torch = load_torch()
    dist = torch.distributed
    accumulated = state.accumulated(bucket)
    indices = state.select(accumulated, _sizes(bucket))
    packet = _pack(accumulated[indices], indices)
    residual = accumulated
    residual[indices] = 0.0  # what is sent leaves the residual
    state.residuals[bucket.index()] = residual
    gathered = [torch.empty_like(packet) for _ in range(state.world_size)]
    future = dist.all_gather(gathered, packet, async_op=True).get_future()
    buffer = bucket.buffer()

    def decompress(_):
        buffer.zero_()
        for part in gathered:
            values, where = _unpack(part)
            buffer.index_add_(0, where, values)
        return buffer.div_(state.world_size)

    return future.then(decompress)


def gtopk_hook(state: SparseState, bucket):
    """gTop-k with error feedback: the local pairs merged up the binomial tree (each merge keeps
    every tensor's k largest of the summed pairs), rank 0's global pairs sent back down; a rank's
    residual keeps what it selected but the global set left out. Point-to-point, in the hook."""
    torch = load_torch()
    sizes = _sizes(bucket)
    accumulated = state.accumulated(bucket)
    mine = state.select(accumulated, sizes)
    indices, values = mine, accumulated[mine]
    reduce_rounds, broadcast_rounds = gtopk_tree(state.world_size)
    for edges in reduce_rounds:
        received = _exchange(state.rank, edges, values, indices)
        if received is not None:  # this rank merges: every tensor's k largest of the summed pairs
            their_values, their_indices = received
            merged = torch.zeros_like(accumulated)
            merged.index_add_(0, indices, values)
            merged.index_add_(0, their_indices, their_values)
            indices = state.select(merged, sizes)
            values = merged[indices]
    for edges in broadcast_rounds:
        received = _exchange(state.rank, edges, values, indices)
        if received is not None:
            values, indices = received
    sent = torch.zeros(accumulated.numel(), dtype=torch.bool)
    sent[mine] = True
    chosen = torch.zeros_like(sent)
    chosen[indices] = True
    residual = accumulated
    residual[sent & chosen] = 0.0  # a rank's pair in the global set was sent; the rest stays
    state.residuals[bucket.index()] = residual
    buffer = bucket.buffer()
    buffer.zero_()
    buffer.index_add_(0, indices, values)
    buffer.div_(state.world_size)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future
