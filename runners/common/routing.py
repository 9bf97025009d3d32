"""The Mixture-of-Experts routing rule every runner implements (src/dlbench/definitions/schema.py,
`moe`), in numpy: the slots per expert a capacity factor gives, and the rule itself, which the
integration tests compare every framework's routing with.

numpy only, imported where used (runners.common stays standard library at import); the controller
never imports this module.
"""

from __future__ import annotations

import math


def capacity(capacity_factor: float | None, tokens: int, top_k: int, experts: int) -> int | None:
    """Slots per expert for a batch of `tokens` tokens: ceil(c * N * k / E); None when dropless."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / experts)


def route(probabilities: np.ndarray, top_k: int, slots: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(experts (N, k), weights (N, k)) for router probabilities (N, E): the k largest per token,
    ties to the lower index, weights renormalised over the k; a choice past its expert's `slots`
    (first choices of every token in token order, then the second ...) gets weight 0."""
    import numpy as np  # not at import: runners.common is standard library until used

    order = np.lexsort((np.broadcast_to(np.arange(probabilities.shape[1]), probabilities.shape), -probabilities),
                       axis=1)
    chosen = order[:, :top_k]
    picked = np.take_along_axis(probabilities, chosen, axis=1)
    weights = picked / picked.sum(axis=1, keepdims=True)
    if slots is not None:
        used = np.zeros(probabilities.shape[1], dtype=np.int64)
        for rank in range(top_k):
            for n in range(probabilities.shape[0]):
                e = chosen[n, rank]
                if used[e] >= slots:
                    weights[n, rank] = 0.0
                used[e] += 1
    return chosen, weights


def load_balancing_loss(probabilities: np.ndarray, chosen: np.ndarray) -> float:
    """E * sum_e f_e P_e: f_e the fraction of tokens whose choices include e, P_e the mean p_e."""
    import numpy as np  # not at import: runners.common is standard library until used

    tokens, experts = probabilities.shape
    counts = np.zeros(experts)
    np.add.at(counts, chosen.reshape(-1), 1.0)
    return float(experts * np.sum(counts / tokens * probabilities.mean(axis=0)))
