"""An independent numpy implementation of the canonical semantics (forward pass, train mode).

It reads the canonical weight format directly, so comparing a framework's logits against it pins
that framework's weight mapping (layouts, LSTM gate order and single bias, flatten order, option-A
padding side) to the definition in src/dlbench/definitions/schema.py, not merely to another
framework. Written for clarity, not speed: use tiny networks.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _windows(x, size, stride, padding, fill):
    ph, pw = padding
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    w = sliding_window_view(x, tuple(size), axis=(2, 3))
    return w[:, :, ::stride[0], ::stride[1]]


def conv2d(x, weight, bias, stride, padding):
    win = _windows(x, weight.shape[2:], stride, padding, 0.0)
    out = np.einsum("nchwij,ocij->nohw", win, weight, optimize=True)
    return out if bias is None else out + bias[None, :, None, None]


def batch_norm_train(x, gamma, beta, eps):
    axes = (0,) if x.ndim == 2 else (0, 2, 3)
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)  # biased, as every framework normalises with
    shape = (1, -1) if x.ndim == 2 else (1, -1, 1, 1)
    return (x - mean) / np.sqrt(var + eps) * gamma.reshape(shape) + beta.reshape(shape)


def lstm(x, w, prefix, layers):
    for k in range(layers):
        w_ih, w_hh, b = w[f"{prefix}.l{k}.w_ih"], w[f"{prefix}.l{k}.w_hh"], w[f"{prefix}.l{k}.bias"]
        hidden = w_hh.shape[1]
        n, steps, _ = x.shape
        h = np.zeros((n, hidden))
        c = np.zeros((n, hidden))
        outs = []
        for t in range(steps):
            z = x[:, t] @ w_ih.T + h @ w_hh.T + b
            i, f, g, o = np.split(z, 4, axis=1)  # canonical gate order: input, forget, cell, output
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
            h = _sigmoid(o) * np.tanh(c)
            outs.append(h)
        x = np.stack(outs, axis=1)
    return x


def residual(x, w, p, layer, eps=1e-5):
    s = layer["stride"]
    if layer["block"] == "basic":
        convs = [(1, s, 1), (2, 1, 1)]
    else:
        convs = [(1, 1, 0), (2, s, 1), (3, 1, 0)]
    y = x
    for n, (j, stride, pad) in enumerate(convs):
        y = conv2d(y, w[f"{p}.conv{j}.weight"], None, (stride, stride), (pad, pad))
        y = batch_norm_train(y, w[f"{p}.bn{j}.gamma"], w[f"{p}.bn{j}.beta"], eps)
        if n < len(convs) - 1:
            y = np.maximum(y, 0)
    if layer["shortcut"] == "projection":
        sc = conv2d(x, w[f"{p}.proj.weight"], None, (s, s), (0, 0))
        sc = batch_norm_train(sc, w[f"{p}.proj_bn.gamma"], w[f"{p}.proj_bn.beta"], eps)
    elif layer["shortcut"] == "option_a":
        sc = x[:, :, ::s, ::s]
        sc = np.pad(sc, ((0, 0), (0, y.shape[1] - sc.shape[1]), (0, 0), (0, 0)))  # zeros after
    else:
        sc = x
    return np.maximum(y + sc, 0)


def forward(network: dict, weights: dict, x: np.ndarray) -> np.ndarray:
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    x = x if x.dtype.kind == "i" else x.astype(np.float64)
    for i, layer in enumerate(network["layers"]):
        p, t = f"{i:03d}", layer["type"]
        if t == "dense":
            x = x @ w[f"{p}.weight"].T + (w[f"{p}.bias"] if layer["bias"] else 0.0)
        elif t == "conv2d":
            x = conv2d(x, w[f"{p}.weight"], w.get(f"{p}.bias"), layer["stride"], layer["padding"])
        elif t == "max_pool":
            x = _windows(x, layer["size"], layer["stride"], layer["padding"], -np.inf).max(axis=(4, 5))
        elif t == "avg_pool":
            x = _windows(x, layer["size"], layer["stride"], (0, 0), 0.0).mean(axis=(4, 5))
        elif t == "global_avg_pool":
            x = x.mean(axis=(2, 3))
        elif t == "batch_norm":
            x = batch_norm_train(x, w[f"{p}.gamma"], w[f"{p}.beta"], layer["eps"])
        elif t == "relu":
            x = np.maximum(x, 0)
        elif t == "sigmoid":
            x = _sigmoid(x)
        elif t == "tanh":
            x = np.tanh(x)
        elif t == "flatten":
            x = x.reshape(x.shape[0], -1)  # C, H, W order
        elif t == "dropout":
            pass  # the check runs deterministically
        elif t == "embedding":
            x = w[f"{p}.weight"][x]
        elif t == "lstm":
            x = lstm(x, w, p, layer["layers"])
        elif t == "residual":
            x = residual(x, w, p, layer)
        else:
            raise ValueError(t)
    return x


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits.reshape(-1, logits.shape[-1])
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(z.shape[0]), y.reshape(-1)].mean())
