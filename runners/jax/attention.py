"""The attention report of the JAX runner (settings["attention"]): per attention of the network,
the function it calls and the `implementation` asked (step.py's TrainingModel.plan_attention,
with transformer.py's choice), and the kernel jax actually traced for it, read back from the
step's jaxpr: cuDNN's fused attention or XLA's own products and softmax.
"""

from __future__ import annotations

from runners.jax.framework import load_jax

CUDNN_PRIMITIVE = "dot_product_attention"  # jax/_src/cudnn/fused_attention_stablehlo.py's primitives' prefix


def traced_primitives(closed) -> list[tuple[str, str]]:
    """(primitive, name stack) of every equation of a traced jaxpr, nested jaxprs (jit, custom_vjp,
    scan...) included, each nested stack prefixed with its caller's (flax names the stack by module)."""
    out: list[tuple[str, str]] = []

    def walk(jaxpr, prefix: str) -> None:
        for eqn in jaxpr.eqns:
            stack = prefix + str(eqn.source_info.name_stack)
            out.append((eqn.primitive.name, stack))
            for value in eqn.params.values():
                for sub in (value if isinstance(value, (tuple, list)) else (value,)):
                    if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):  # a ClosedJaxpr
                        walk(sub.jaxpr, stack + "/")
                    elif hasattr(sub, "eqns"):  # a Jaxpr
                        walk(sub, stack + "/")

    walk(closed.jaxpr, "")
    return out


def attention_report(tm, p, stats, x) -> dict | None:
    """settings["attention"]: per attention, the function called and the `implementation` asked
    (plan_attention), and the kernel jax traced for it, read from the step's jaxpr (the forward,
    and the backward in training, traced as the jitted step traces it; nothing compiled): cuDNN's
    fused attention where its dot_product_attention_* primitives are in the layer's scope, else
    XLA's own dot_general, softmax (exp) and dot_general. None when the network has no attention.
    `tm` is the run's TrainingModel (step.py): its flax model, mode, network and attention plan."""
    import json

    import numpy as np

    if not tm.attention:
        return None
    jax = load_jax()
    variables = {"params": p, "batch_stats": stats} if stats else {"params": p}
    key = jax.ShapeDtypeStruct((2,), np.uint32)

    def step(variables, x, key):
        rngs = {"dropout": key} if (tm.has_dropout and tm.train) else None
        mutable = ["batch_stats"] if (tm.train and stats) else False

        def forward(variables):
            out = tm.model.apply(variables, x, train=tm.train, mutable=mutable, rngs=rngs)
            out = out[0] if mutable else out
            return sum(o.astype(np.float32).sum() for o in jax.tree.leaves(out))  # both heads' logits

        return jax.grad(forward)(variables) if tm.train else forward(variables)

    traced = traced_primitives(jax.make_jaxpr(step)(variables, x, key))
    kernels = {}
    for index in tm.attention:
        layer = tm.network["layers"][int(index)]
        scope = f"layer{index}/" + ("attn/" if layer["type"] in ("transformer_block", "llama_block") else "")
        seen = {name for name, stack in traced if f"{stack}/".find(scope) >= 0}
        if any(name.startswith(CUDNN_PRIMITIVE) for name in seen):
            kernels[index] = "cudnn"
        elif {"dot_general", "exp"} <= seen:  # the products and the softmax (no other exp in an attention)
            kernels[index] = "xla"
        else:
            kernels[index] = "unknown: " + ", ".join(sorted(seen))

    def one_or_each(field: str, by_layer: dict | None = None):
        """One value where every attention has the field and the same value, else layer -> value
        for the attentions that have it."""
        if by_layer is None:
            by_layer = {i: e[field] for i, e in tm.attention.items() if field in e}
        distinct = {json.dumps(v, sort_keys=True) for v in by_layer.values()}
        return next(iter(by_layer.values())) if len(by_layer) == len(tm.attention) and len(distinct) == 1 \
            else by_layer

    out = {"function": one_or_each("function"), "kernel": one_or_each("kernel", kernels)}
    for field in ("implementation_asked", "why", "cudnn_refused"):
        if any(field in e for e in tm.attention.values()):
            out[field] = one_or_each(field)
    out["probe"] = ("the kernel: primitives of each attention's flax scope in the step's jaxpr (jax.make_jaxpr of "
                    f"the {'forward and backward' if tm.train else 'forward'} the jitted step runs): "
                    f"{CUDNN_PRIMITIVE}* is cuDNN's fused attention (a custom call), dot_general and the "
                    "softmax's exp XLA's own; implementation_asked None: jax chooses, and `kernel` is what it "
                    "chose")
    return out
