"""An independent numpy implementation of the canonical semantics (forward pass, train mode).

It reads the canonical weight format directly, so comparing a framework's logits against it pins
that framework's weight mapping (layouts, LSTM gate order and single bias, flatten order, option-A
padding side, attention's head order, the patch tokens' order, a tied head's table) to the
definition in src/dlbench/definitions/schema.py, not merely to another framework. Written for
clarity, not speed: use tiny networks.
"""

from __future__ import annotations

import math

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


# ------------------------------------------------------------------ transformers (x is (N, T, D))

_erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; the networks here are tiny


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased: divided by D
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def gelu(x, form):
    if form == "erf":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def _affine(x, w, name):
    """x W^T + b, b only where the weight set has one (`bias: false` has none)."""
    return x @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0.0)


def attention(x, w, p, heads, size, causal):
    """Per head h (columns h*S .. (h+1)*S - 1): softmax(q k^T / sqrt(S)) v, causal masking j > i."""
    n, steps, _ = x.shape
    q, k, v = (_affine(x, w, f"{p}.{part}").reshape(n, steps, heads, size).transpose(0, 2, 1, 3)
               for part in ("q", "k", "v"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size)  # (N, H, T, T)
    if causal:
        scores = np.where(np.tril(np.ones((steps, steps), dtype=bool)), scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    a = (probs @ v).transpose(0, 2, 1, 3).reshape(n, steps, heads * size)  # the heads in order
    return _affine(a, w, f"{p}.out")


def transformer_block(x, w, p, layer):
    eps = layer["eps"]

    def attn(h):
        return attention(h, w, f"{p}.attn", layer["heads"], layer["head_size"], layer["causal"])

    def mlp(h):
        return _affine(gelu(_affine(h, w, f"{p}.mlp.fc1"), layer["gelu"]), w, f"{p}.mlp.fc2")

    def ln(h, which):
        return layer_norm(h, w[f"{p}.{which}.gamma"], w[f"{p}.{which}.beta"], eps)

    if layer["norm"] == "pre":
        x = x + attn(ln(x, "ln1"))
        return x + mlp(ln(x, "ln2"))
    x = ln(x + attn(x), "ln1")
    return ln(x + mlp(x), "ln2")


def rms_norm(x, gamma, eps):
    return gamma * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rotate(t, layer):
    """t (N, heads, T, S) rotated by position: the halves (i, i + S/2) by angle t * f_i."""
    steps, size = t.shape[2], t.shape[3]
    f = layer["rope_theta"] ** (-np.arange(0, size, 2) / size)
    scaling = layer.get("rope_scaling")
    if scaling is not None:  # Llama 3's: long wavelengths / factor, short kept, smooth between
        wavelength = 2 * np.pi / f
        context, low, high = scaling["original_context"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        smooth = (context / wavelength - low) / (high - low)
        f = np.where(wavelength > context / low, f / scaling["factor"],
                     np.where(wavelength < context / high, f, (1 - smooth) * f / scaling["factor"] + smooth * f))
    angle = np.arange(steps)[:, None] * f[None, :]  # (T, S/2)
    first, second = t[..., : size // 2], t[..., size // 2:]
    cos, sin = np.cos(angle), np.sin(angle)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def grouped_attention(x, w, p, layer):
    """Query head h reads key/value head h // (H / KV); q and k rotated; no biases."""
    n, steps, _ = x.shape
    heads, kv, size = layer["heads"], layer["kv_heads"], layer["head_size"]

    def project(part, count):
        return (x @ w[f"{p}.{part}.weight"].T).reshape(n, steps, count, size).transpose(0, 2, 1, 3)

    q, k, v = rotate(project("q", heads), layer), rotate(project("k", kv), layer), project("v", kv)
    group = np.arange(heads) // (heads // kv)
    scores = q @ k[:, group].transpose(0, 1, 3, 2) / np.sqrt(size)
    if layer.get("causal", True):
        scores = np.where(np.tril(np.ones((steps, steps), dtype=bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)
    a = (probs @ v[:, group]).transpose(0, 2, 1, 3).reshape(n, steps, heads * size)
    return a @ w[f"{p}.out.weight"].T


def swiglu(x, gate, up, down):
    g = x @ gate.T
    return (g * _sigmoid(g) * (x @ up.T)) @ down.T


def moe(x, w, p, routing):
    """runners/common/routing.py's rule (the top-k, ties to the lower expert, capacity) on float64
    router probabilities, then every chosen expert's SwiGLU weighted."""
    from runners.common import routing as rule

    n, steps, dim = x.shape
    tokens = x.reshape(-1, dim)
    logits = tokens @ w[f"{p}.router.weight"].T
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)
    slots = rule.capacity(routing["capacity_factor"], tokens.shape[0], routing["top_k"], routing["experts"])
    chosen, weights = rule.route(probs, routing["top_k"], slots)
    out = np.zeros_like(tokens)
    for i in range(tokens.shape[0]):
        for e, weight in zip(chosen[i], weights[i]):
            out[i] += weight * swiglu(tokens[i], w[f"{p}.experts.gate"][e], w[f"{p}.experts.up"][e],
                                      w[f"{p}.experts.down"][e])
    return out.reshape(n, steps, dim)


def llama_block(x, w, p, layer):
    x = x + grouped_attention(rms_norm(x, w[f"{p}.norm1.gamma"], layer["eps"]), w, f"{p}.attn", layer)
    h = rms_norm(x, w[f"{p}.norm2.gamma"], layer["eps"])
    if layer["moe"] is None:
        return x + swiglu(h, w[f"{p}.mlp.gate.weight"], w[f"{p}.mlp.up.weight"], w[f"{p}.mlp.down.weight"])
    return x + moe(h, w, f"{p}.moe", layer["moe"])


def patch_embedding(x, w, p, layer):
    patch = layer["patch"]
    grid = conv2d(x, w[f"{p}.weight"], w[f"{p}.bias"], (patch, patch), (0, 0))  # (N, dim, h, w)
    n, dim = grid.shape[:2]
    tokens = grid.reshape(n, dim, -1).transpose(0, 2, 1)  # positions in row-major (h, w) order
    if layer["class_token"]:
        tokens = np.concatenate([np.broadcast_to(w[f"{p}.class_token"], (n, 1, dim)), tokens], axis=1)
    return tokens


def pretraining_heads(x, w, p, layer, inp):
    """(masked-LM logits (N, M, V), next-sentence logits (N, 2)): schema.PretrainingHeads."""
    pooled = np.tanh(_affine(x[:, 0], w, f"{p}.pooler"))
    next_sentence = _affine(pooled, w, f"{p}.next_sentence")
    h = x[:, inp["masked_positions"]]
    h = gelu(_affine(h, w, f"{p}.transform"), layer["gelu"])
    h = layer_norm(h, w[f"{p}.transform_ln.gamma"], w[f"{p}.transform_ln.beta"], layer["eps"])
    table = w["000.weight"] if layer["tied"] else w[f"{p}.decoder.weight"]
    return h @ table.T + w[f"{p}.decoder.bias"], next_sentence


def forward(network: dict, weights: dict, x: np.ndarray, side: dict | None = None) -> np.ndarray:
    """The logits; `side`, when given, receives the outputs beside them (`next_sentence`)."""
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
        elif t == "position_embedding":
            x = x + w[f"{p}.weight"][: x.shape[1]]
        elif t == "patch_embedding":
            x = patch_embedding(x, w, p, layer)
        elif t == "layer_norm":
            x = layer_norm(x, w[f"{p}.gamma"], w[f"{p}.beta"], layer["eps"])
        elif t == "gelu":
            x = gelu(x, layer["form"])
        elif t == "attention":
            x = attention(x, w, p, layer["heads"], layer["head_size"], layer["causal"])
        elif t == "transformer_block":
            x = transformer_block(x, w, p, layer)
        elif t == "token_pool":
            x = x[:, 0] if layer["mode"] == "class" else x.mean(axis=1)
        elif t == "lm_head":
            table = w["000.weight"] if layer["tied"] else w[f"{p}.weight"]  # tied: the token embedding's
            x = x @ table.T + w.get(f"{p}.bias", 0.0)
        elif t == "segment_embedding":
            boundary = network["input"]["segment_boundary"]  # sentence A, then sentence B
            segments = (np.arange(x.shape[1]) >= boundary).astype(np.int64)
            x = x + w[f"{p}.weight"][segments]
        elif t == "pretraining_heads":
            x, next_sentence = pretraining_heads(x, w, p, layer, network["input"])
            if side is not None:
                side["next_sentence"] = next_sentence
        elif t == "rms_norm":
            x = rms_norm(x, w[f"{p}.gamma"], layer["eps"])
        elif t == "grouped_attention":
            x = grouped_attention(x, w, p, layer)
        elif t == "swiglu":
            x = swiglu(x, w[f"{p}.gate.weight"], w[f"{p}.up.weight"], w[f"{p}.down.weight"])
        elif t == "moe":
            x = moe(x, w, p, layer)
        elif t == "llama_block":
            x = llama_block(x, w, p, layer)
        else:
            raise ValueError(t)
    return x


def cross_entropy(logits: np.ndarray, y: np.ndarray) -> float:
    z = logits.reshape(-1, logits.shape[-1])
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(z.shape[0]), y.reshape(-1)].mean())


def network_loss(network: dict, weights: dict, x: np.ndarray, y: np.ndarray) -> float:
    """The network's loss (schema.LOSS_OF_INPUT): masked_lm_and_next_sentence is the masked-LM
    cross-entropy over the N x M masked positions plus the next-sentence one over the N samples."""
    side: dict = {}
    logits = forward(network, weights, x, side)
    if network["loss"] == "masked_lm_and_next_sentence":
        masked = logits.shape[1]
        return cross_entropy(logits, y[:, :masked]) + cross_entropy(side["next_sentence"], y[:, masked])
    return cross_entropy(logits, y)
