"""The torch runner's compression hooks against DDP's own all-reduce on a small network, 3 steps
(run in the torch environment, under torchrun: no dlbench controller needed):
    ~/.cache/dlbench/envs/torch-cpu-*/bin/torchrun --nproc-per-node 4 benchmarks/compression_arithmetic_torch.py
Prints, per method, the largest relative difference of its averaged gradients from dense's: at
density 1 top-k and gTop-k must give dense's (to float32 rounding), fp16 and bf16 their rounding.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: the `runners` package

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from runners.common.contract import Compression  # noqa: E402
from runners.torch.distributed import register_compression  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
def grads(method):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(20, 30), torch.nn.Sigmoid(), torch.nn.Linear(30, 5))
    ddp = torch.nn.parallel.DistributedDataParallel(m, bucket_cap_mb=0.001)
    register_compression(ddp, Compression.parse(method, "x"), dist.get_world_size(), 0)
    g = torch.Generator().manual_seed(rank + 1)
    out = []
    for it in range(3):
        ddp.zero_grad()
        x = torch.randn(8, 20, generator=g)
        ddp(x).square().sum().backward()
        out.append(torch.cat([p.grad.reshape(-1) for p in ddp.parameters()]).clone())
    return out
dense = grads("none")
for method in ["fp16", "bf16", "topk:1", "gtopk:1", "powersgd:5"]:
    got = grads(method)
    err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, dense))
    if rank == 0: print(method, "max rel err vs dense over 3 steps:", f"{err:.2e}")
# sparse at 0.2: the sum over ranks of what is applied + residuals equals the sum of the gradients (error feedback conserves)
