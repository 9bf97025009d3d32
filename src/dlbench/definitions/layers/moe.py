"""moe: a Mixture-of-Experts layer of E SwiGLU experts and a linear router choosing top-k of them
per token (schema.py: the routing rule, its tie-break, capacity and load-balancing loss). Its
counts, tensors and operations are functions of plain numbers, which llama_block reuses."""

from __future__ import annotations

import types

from .. import schema
from . import dense, swiglu
from .base import Inferred, LayerType, Site, resolved_entry

ROUTER_SOFTMAX_FLOPS = 5  # per router logit, as attention's softmax
COMBINE_FLOPS = 2  # per chosen expert's output element: times its weight, added


def counts(positions: int, dim: int, hidden: int, experts: int, top_k: int) -> tuple[int, int]:
    """(params, forward FLOPs per sample): every expert's weights and the router's count; the FLOPs
    are those of the work done, top_k experts per token (dropless: a capacity that drops choices
    does less), the router's product and softmax, and the weighted sum of the chosen outputs."""
    expert_params, expert_flops = swiglu.counts(positions, dim, hidden)
    router_params, router_flops = dense.counts(positions, dim, experts, False)
    flops = (router_flops + ROUTER_SOFTMAX_FLOPS * positions * experts + top_k * expert_flops
             + COMBINE_FLOPS * positions * top_k * dim)
    return experts * expert_params + router_params, flops


def is_expert_tensor(name: str) -> bool:
    """Whether a canonical tensor name (tensors() below) is an expert's weight, the part expert
    parallelism shards over the workers rather than all-reducing."""
    return ".experts." in name


def tensors(prefix: str, dim: int, hidden: int, experts: int) -> dict[str, tuple[int, ...]]:
    """router (E, D); the experts' weights stacked on a leading expert axis: gate and up (E, hidden,
    D), down (E, D, hidden), each expert's in the dense layout (out x in)."""
    return {f"{prefix}.router.weight": (experts, dim), f"{prefix}.experts.gate": (experts, hidden, dim),
            f"{prefix}.experts.up": (experts, hidden, dim), f"{prefix}.experts.down": (experts, dim, hidden)}


def infer(layer: schema.MixtureOfExperts, site: Site) -> Inferred:
    if len(site.shape) != 2:
        raise site.error(f"moe needs a sequence (T, D) input, got {list(site.shape)}")
    steps, dim = site.shape
    params, flops = counts(steps, dim, layer.hidden, layer.experts, layer.top_k)
    entry = resolved_entry(layer, site.shape, site.shape)
    entry["aux_loss_weight"] = layer.aux_loss_coefficient  # one layer: its own coefficient
    return Inferred(site.shape, params, flops, [entry])


def weights(prefix: str, entry: dict) -> dict[str, tuple[int, ...]]:
    return tensors(prefix, entry["in_shape"][-1], entry["hidden"], entry["experts"])


def products(b, layer, name: str, steps: int, dim: int, hidden: int, experts: int, top_k: int,
             input_grad: bool) -> None:
    """The router as the `moe_router_fwd` / `moe_router_bwd` kernels and the experts as
    `moe_experts_fwd` / `moe_experts_bwd` (performance/kernels.py), each made of, where not measured:
    the router a dense layer without bias and its softmax and top-k over E per token (element-wise
    passes); the experts the tokens gathered to their experts (read and written: 2 passes over T*k
    rows), their products as SwiGLU products over the T*k token rows (one product per kind standing
    for the E experts' grouped ones: the same FLOPs, each expert's share of the rows) and the
    weighted sum of the k outputs per token (3 passes); backward their mirrors."""
    label = f"{name} " if name else ""
    rows = b.batch * steps
    router = types.SimpleNamespace(forward=[], backward=[])
    dense.products(b, router, f"{label}router".strip(), steps, dim, experts, False, input_grad)
    router.forward.append(b.passes(f"{label}router softmax top-k".strip(), rows * experts, 3, ROUTER_SOFTMAX_FLOPS))
    expert = types.SimpleNamespace(forward=[], backward=[])
    expert.forward.append(b.passes(f"{label}dispatch".strip(), rows * top_k * dim, 2, 0))
    swiglu.unfused(b, expert, f"{label}experts".strip(), steps * top_k, dim, hidden, input_grad=True)
    expert.forward.append(b.passes(f"{label}combine".strip(), rows * top_k * dim, 3, COMBINE_FLOPS))
    if b.train:
        expert.backward.append(b.passes(f"{label}combine gradient".strip(), rows * top_k * dim, 4, COMBINE_FLOPS))
        expert.backward.append(b.passes(f"{label}dispatch gradient".strip(), rows * top_k * dim, 2, 1))
        router.backward.append(b.passes(f"{label}router softmax gradient".strip(), rows * experts, 3,
                                        ROUTER_SOFTMAX_FLOPS))
    routing = dict(dim=dim, experts=experts, top_k=top_k)
    layer.forward.append(b.kernel(f"{label}router".strip(), "moe_router_fwd", parts=tuple(router.forward), rows=rows,
                                  **routing))
    layer.forward.append(b.kernel(f"{label}experts".strip(), "moe_experts_fwd", parts=tuple(expert.forward),
                                  tokens=rows, hidden=hidden, **routing))
    if b.train:
        layer.backward.append(b.kernel(f"{label}experts gradient".strip(), "moe_experts_bwd",
                                       parts=tuple(expert.backward), tokens=rows, hidden=hidden, **routing))
        layer.backward.append(b.kernel(f"{label}router gradient".strip(), "moe_router_bwd",
                                       parts=tuple(router.backward), rows=rows, **routing))


def work(b, layer, entry: dict, input_grad: bool) -> None:
    steps, dim = entry["in_shape"]
    products(b, layer, "", steps, dim, entry["hidden"], entry["experts"], entry["top_k"], input_grad)


# an expert's two products in sequence (the router's are float32); the top-k choice is one decision rounding can flip per layer (a near tie between the k-th and the
# (k+1)-th expert's probability)
LAYER = LayerType(schema.MixtureOfExperts, infer, work, weights, rounding_depth=2, decisions=1)
