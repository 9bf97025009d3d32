"""PyTorch as a multi-worker runner: DistributedDataParallel and torch.distributed collectives.

Each rank is started by torchrun (runner.toml: [distributed] launch = "torchrun"), which sets
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; the process group is gloo on CPU and nccl on CUDA
(one GPU per local rank). The contract is in runners/common/distributed_harness.py.

Exposed communication: DDP all-reduces gradient buckets while backward is still running, so only
the part of the exchange that backward does not hide costs time. `step_without_sync` runs the same
step under DDP's `no_sync()` (gradients stay local, no all-reduce); the controller reports the
difference of the medians of the two as the communication time not hidden behind backward.
"""

from __future__ import annotations

import contextlib
import datetime

from torch_runner import TorchRunner, _torch, build_network

# A collective that waits this long has lost a peer: fail instead of waiting gloo's 30 minutes.
# dlbench's job timeout stops a hung job anyway; this makes the rank's own error the record's.
PROCESS_GROUP_TIMEOUT_S = 300


class DataParallel:
    def __init__(self, step, step_without_sync, synchronize, params, output_shape, settings, grad_bytes):
        self.step = step
        self.step_without_sync = step_without_sync
        self.synchronize = synchronize
        self.params = params
        self.output_shape = output_shape
        self.settings = settings
        self.grad_bytes = grad_bytes


class Collective:
    """One collective over preallocated tensors; send and receive are one tensor where in place."""

    def __init__(self, op: str, send, recv, synchronize):
        self.op, self.send, self.recv, self._sync = op, send, recv, synchronize

    def load(self, array) -> None:
        torch = _torch()
        self.send.copy_(torch.from_numpy(array))

    def run(self) -> None:
        dist = _torch().distributed
        if self.op == "all_reduce":
            dist.all_reduce(self.send)
        elif self.op == "broadcast":
            dist.broadcast(self.send, src=0)
        elif self.op == "all_gather":
            dist.all_gather_single(self.recv, self.send)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_single(self.recv, self.send)
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
        torch = _torch()
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
        dist = _torch().distributed
        if self.device is not None and self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def leave(self) -> None:
        _torch().distributed.destroy_process_group()

    def _synchronize(self):
        torch = _torch()
        return torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)

    def prepare_data_parallel(self, request: dict, cluster) -> DataParallel:
        torch = _torch()
        network = request["network"]
        device = self.device
        cuda = device.type == "cuda"
        torch.manual_seed(request.get("seed", 0))  # every rank builds the same model (DDP broadcasts rank 0's anyway)
        ddp_options = {"bucket_cap_mb": 25, "gradient_as_bucket_view": False}  # DDP's defaults, stated
        settings: dict = {"ddp": dict(ddp_options),
                          "exposed_communication": "median step time minus median step time under DDP no_sync()"}
        if cuda:
            torch.backends.cudnn.benchmark = True
            settings["cudnn_benchmark"] = True
        model = build_network(network).to(device)
        images = network["input"]["kind"] == "tensor" and len(network["input"]["shape"]) == 3
        memory_format = torch.channels_last if (cuda and images) else torch.contiguous_format
        model = model.to(memory_format=memory_format)
        settings["memory_format"] = "channels_last" if memory_format is torch.channels_last else "contiguous"
        params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        with torch.inference_mode():
            model.eval()
            probe = self._inputs(network, 1, device, memory_format, images, seed=0)[0]
            out_shape = list(model(probe).shape[1:])
        model.train()
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if cuda else None, **ddp_options)
        settings["ddp"]["broadcast_buffers"] = bool(getattr(ddp, "broadcast_buffers", True))

        # each rank trains on its own synthetic batch (as a sharded data set would give it)
        x, y = self._inputs(network, request["batch_size"], device, memory_format, images,
                            seed=request.get("seed", 0) * 1000 + cluster.rank + 1)
        precision = request.get("precision", "float32")
        amp_dtype = {"amp_fp16": torch.float16, "amp_bf16": torch.bfloat16}.get(precision)
        settings["precision"] = precision
        scaler = torch.amp.GradScaler(device.type) if (amp_dtype is torch.float16 and cuda) else None
        opt = torch.optim.SGD([p for p in ddp.parameters() if p.requires_grad],
                              lr=request["learning_rate"], momentum=request["momentum"])
        loss_fn = torch.nn.functional.cross_entropy

        def autocast():
            if amp_dtype is None:
                return contextlib.nullcontext()
            return torch.autocast(device_type=device.type, dtype=amp_dtype)

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast():
                out = ddp(x)
                loss = loss_fn(out.reshape(-1, out.shape[-1]), y.reshape(-1))
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()

        def step_without_sync():
            with ddp.no_sync():
                step()

        return DataParallel(step, step_without_sync, self._synchronize(), params, out_shape, settings, grad_bytes)

    @staticmethod
    def _inputs(network: dict, batch: int, device, memory_format, images: bool, seed: int):
        torch = _torch()
        gen = torch.Generator(device="cpu").manual_seed(seed)
        inp = network["input"]
        if inp["kind"] == "tokens":
            x = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), generator=gen)
            y = torch.randint(0, inp["vocabulary"], (batch, inp["sequence_length"]), generator=gen)
        else:
            x = torch.randn(batch, *inp["shape"], generator=gen)
            y = torch.randint(0, inp["classes"], (batch,), generator=gen)
        x, y = x.to(device), y.to(device)
        if images:
            x = x.contiguous(memory_format=memory_format)
        return x, y

    def collective(self, op: str, send_count: int, recv_count: int) -> Collective:
        torch = _torch()
        send = torch.zeros(send_count, dtype=torch.float32, device=self.device)
        recv = send if op in ("all_reduce", "broadcast") else torch.zeros(recv_count, dtype=torch.float32,
                                                                          device=self.device)
        return Collective(op, send, recv, self._synchronize())
