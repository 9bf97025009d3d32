"""PyTorch expert parallelism (runners/common/contract.py Parallelism.EXPERT): the experts of every
Mixture-of-Experts block sharded over the workers, tokens dispatched and combined by
torch.distributed's `all_to_all_single` (gloo on CPU, NCCL on CUDA), every other weight held by
every worker and its gradients averaged by one all-reduce after the backward.

Every rank builds the whole network from the same seed, as data parallelism does (so the two start
from the same weights), then keeps experts rank*E/W ... (rank+1)*E/W - 1 of each block. A block's
forward on a rank's own tokens:

1. route them as the single-worker block does (MixtureOfExperts.route: float32 router, stable
   top-k, ties to the lower index, renormalised weights; a capacity factor's dropped choices get
   weight 0 and are sent all the same, as the single-worker block computes them);
2. sort the (token, choice) pairs by expert (stable), and tell every rank how many rows it will get
   for each of its experts (an all-to-all of E counts);
3. dispatch: each pair's token row to the rank holding its expert (all_to_all_single with uneven
   splits: dropless, exactly the rows chosen, no padding);
4. every local expert runs on the rows sent to it, from every rank;
5. combine: the outputs back to the ranks the rows came from (the reverse all-to-all), weighted
   and added per token (index_add_), as the single-worker block adds them.

Backward runs the two all-to-alls in reverse (AllToAll.backward). An expert's gradient so sums
every rank's tokens; data parallelism averages its gradients over the ranks, so the experts'
gradients are divided by the ranks and the rest all-reduced and divided likewise: both train the
network alike (the integration test compares their losses step by step). The auxiliary
load-balancing loss is each rank's own, as under data parallelism.

The all-to-alls are timed with the host clock around each call (on CUDA between two device
synchronisations) and their bytes counted: what a rank sends to the others (its own block stays
on the rank). `step_without_sync` leaves out the all-reduce of the non-expert gradients only: the
all-to-alls are part of the computation.
"""

from __future__ import annotations

import functools
import time

from runners.common.contract import PRECISIONS, DataParallel, Precision
from runners.common.protocol import Skip
from runners.torch import step as st
from runners.torch.framework import load_torch, synchronizer
from runners.torch.precision import float32_math, request_precision
from runners.torch.transformer import transformer_modules

DISPATCH = ("dropless: every chosen (token, expert) pair's row sent to its expert's rank by all_to_all_single "
            "with uneven splits (no capacity padding), the outputs combined back by the reverse all-to-all")


class AllToAllCounter:
    """Running totals of one rank's all-to-alls (DataParallel.all_to_all)."""

    def __init__(self, synchronize):
        self.seconds, self.bytes, self.calls = 0.0, 0, 0
        self._sync = synchronize

    def exchange(self, send, send_splits: list[int], recv_splits: list[int], rank: int):
        """send's rows split by `send_splits` (one block per rank, in rank order) to the ranks; the
        rows received, block j from rank j, `recv_splits` of them."""
        torch = load_torch()
        send = send.contiguous()
        received = send.new_empty((sum(recv_splits), *send.shape[1:]))
        self._sync()
        t0 = time.perf_counter()
        torch.distributed.all_to_all_single(received, send, recv_splits, send_splits)
        self._sync()
        self.seconds += time.perf_counter() - t0
        row = send[0].numel() * send.element_size() if send.shape[0] else 0
        self.bytes += (sum(send_splits) - send_splits[rank]) * row
        self.calls += 1
        return received

    def totals(self) -> dict:
        return {"seconds": self.seconds, "bytes": self.bytes, "calls": self.calls}


@functools.cache
def expert_parallel_modules():
    """The autograd all-to-all and the sharded block, defined once torch is loaded."""
    torch = load_torch()
    nn, F = torch.nn, torch.nn.functional
    blocks = transformer_modules()

    class AllToAll(torch.autograd.Function):
        """Rows to the ranks (forward); their gradients back the same way reversed (backward)."""

        @staticmethod
        def forward(ctx, x, send_splits, recv_splits, counter, rank):
            ctx.splits, ctx.counter, ctx.rank = (send_splits, recv_splits), counter, rank
            return counter.exchange(x, send_splits, recv_splits, rank)

        @staticmethod
        def backward(ctx, grad):
            send_splits, recv_splits = ctx.splits
            return ctx.counter.exchange(grad, recv_splits, send_splits, ctx.rank), None, None, None, None

    class ShardedExperts(blocks.MixtureOfExperts):
        """A MixtureOfExperts block holding experts [first, first + local) of its E, the router
        whole (its `route` and `kept` are the single-worker block's)."""

        def __init__(self, whole, rank: int, world: int, counter: AllToAllCounter):
            nn.Module.__init__(self)
            experts = whole.gate.shape[0]
            self.local = experts // world
            self.first = rank * self.local
            self.rank, self.world, self.counter = rank, world, counter
            self.top_k, self.capacity_factor, self.aux_weight = whole.top_k, whole.capacity_factor, whole.aux_weight
            self.experts = experts
            self.router = whole.router
            shard = slice(self.first, self.first + self.local)
            self.gate = nn.Parameter(whole.gate.detach()[shard].clone())
            self.up = nn.Parameter(whole.up.detach()[shard].clone())
            self.down = nn.Parameter(whole.down.detach()[shard].clone())

        def forward(self, x):
            b, t, d = x.shape
            tokens = x.reshape(-1, d)
            p, chosen, weights = self.route(tokens)
            flat = chosen.reshape(-1)  # pair i = (token i // k, choice i % k)
            order = torch.sort(flat, stable=True).indices  # the pairs grouped by expert, token order within
            token = order // self.top_k
            per_expert = torch.bincount(flat, minlength=self.experts)  # (E,) rows this rank sends each expert
            arriving = self.counter.exchange(per_expert, [self.local] * self.world, [self.local] * self.world,
                                             self.rank)  # (W * local,): from rank s, for my expert j
            send_splits = per_expert.view(self.world, self.local).sum(1).tolist()
            recv_splits = arriving.view(self.world, self.local).sum(1).tolist()
            rows = AllToAll.apply(tokens.index_select(0, token), send_splits, recv_splits, self.counter, self.rank)
            expert_of_row = torch.repeat_interleave(
                torch.arange(self.local, device=x.device).repeat(self.world), arriving)
            outputs = torch.zeros_like(rows)
            for j in range(self.local):
                where = torch.nonzero(expert_of_row == j).squeeze(1)
                if where.numel() == 0:
                    continue
                h = rows.index_select(0, where)
                y = F.linear(F.silu(F.linear(h, self.gate[j])) * F.linear(h, self.up[j]), self.down[j])
                outputs = outputs.index_copy(0, where, y)
            back = AllToAll.apply(outputs, recv_splits, send_splits, self.counter, self.rank)
            weight = weights.reshape(-1).index_select(0, order)
            out = torch.zeros_like(tokens).index_add_(0, token, (back * weight[:, None].to(back.dtype)).to(tokens.dtype))
            out = out.view(b, t, d)
            if self.training and self.aux_weight and torch.is_grad_enabled():  # each rank's own, as whole
                fraction = F.one_hot(chosen, self.experts).sum(1).to(p.dtype).mean(0)  # f_e
                aux = self.experts * (fraction * p.mean(0)).sum()
                out = blocks.AddAuxiliaryLoss.apply(out, aux * self.aux_weight)
            return out

    return AllToAll, ShardedExperts


def shard_experts(model, rank: int, world: int, counter: AllToAllCounter) -> list:
    """Every MixtureOfExperts block of the model replaced by its shard on this rank; the shards."""
    whole_type = transformer_modules().MixtureOfExperts
    _, ShardedExperts = expert_parallel_modules()
    shards = []
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is whole_type:
                shard = ShardedExperts(child, rank, world, counter)
                setattr(parent, name, shard)
                shards.append(shard)
    return shards


def prepare_expert_parallel(device, request: dict, cluster) -> DataParallel:
    """The rank's expert-parallel training step (the module docstring says how)."""
    torch = load_torch()
    dist = torch.distributed
    network = request["network"]
    world, rank = cluster.world_size, cluster.rank
    if request.get("compile") not in (None, "default", "eager"):  # never a silent eager run
        raise Skip(f"compile {request.get('compile')!r}: the torch expert-parallel step trains eagerly")
    precision = request_precision(request, PRECISIONS)
    if precision is not Precision.FP32:
        raise Skip(f"precision {precision}: the torch expert-parallel step trains in fp32 only (its all-to-alls "
                   "move float32 rows; mixed precision is not written yet)")
    compression = request.get("compression")
    if compression is not None and str(compression) != "none":
        raise Skip(f"compression {compression}: the torch expert-parallel step all-reduces dense float32 gradients")
    settings: dict = {"compile": {"mode": "eager", "requested": request.get("compile")}, "precision": precision.value,
                      "precision_effective": float32_math(precision, device), "parallelism": "expert"}
    torch.manual_seed(request.get("seed", 0))  # the weights data parallelism starts from
    model, memory_format = st.place(st.build_network(network), network, device, settings)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    probe, _ = st.synthetic_batch(network, 1, device, memory_format, torch.Generator(device="cpu").manual_seed(0))
    out_shape = st.output_shape(model, probe, train=True)
    sync = synchronizer(device)
    counter = AllToAllCounter(sync)
    shards = shard_experts(model, rank, world, counter)
    if not shards:
        raise ValueError(f"{network['name']} has no Mixture-of-Experts block to shard over the workers")
    expert_params = {id(p) for s in shards for p in (s.gate, s.up, s.down)}
    trainable = st.trainable_params(model)
    experts = [p for p in trainable if id(p) in expert_params]
    dense = [p for p in trainable if id(p) not in expert_params]
    grad_bytes = sum(p.numel() * p.element_size() for p in dense)
    settings["expert_parallel"] = {
        "dispatch": DISPATCH, "experts_per_worker": [s.local for s in shards],
        "experts_held": [[s.first, s.first + s.local - 1] for s in shards],
        "gradients": "the experts' divided by the workers; every other weight's all-reduced (one flat buffer after "
                     "the backward) and divided by the workers: data parallelism's average",
        "all_to_all_timing": "host clock around each call" + (", between device synchronisations"
                                                              if device.type == "cuda" else "")}

    seed = request.get("seed", 0) * 1000 + rank + 1  # the batch data parallelism gives this rank
    x, y = st.synthetic_batch(network, request["batch_size"], device, memory_format,
                              torch.Generator(device="cpu").manual_seed(seed))
    optimizer = st.sgd(trainable, request)
    seen: dict = {}

    def average_gradients(all_reduce: bool) -> None:
        for p in experts:
            if p.grad is not None:
                p.grad.div_(world)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in dense]
        flat = torch.cat([g.reshape(-1) for g in grads])
        if all_reduce:
            dist.all_reduce(flat)
        flat.div_(world)
        offset = 0
        for p, g in zip(dense, grads):
            p.grad = flat[offset:offset + g.numel()].view_as(p).clone()
            offset += g.numel()

    def train(all_reduce: bool) -> None:
        optimizer.zero_grad(set_to_none=True)
        value = st.loss(model(x), y)
        value.backward()
        average_gradients(all_reduce)
        optimizer.step()
        seen["loss"] = value.detach()

    return DataParallel(lambda: train(True), lambda: train(False), sync, params, out_shape, settings, grad_bytes,
                        loss=lambda: float(seen["loss"]), all_to_all=counter.totals)
