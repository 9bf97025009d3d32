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

from runners.common.contract import CHECK_PRECISION, PRECISIONS, DataParallel
from runners.common.protocol import Skip
from runners.torch import step as st
from runners.torch.framework import load_torch, synchronizer
from runners.torch.precision import float32_math, mixed_precision, request_precision
from runners.torch.runner import TorchRunner

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
