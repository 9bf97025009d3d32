"""The kernels networks are made of: their shapes, work (FLOPs) and traffic (bytes), and one key each.

A `KernelSpec` is plain data (kind, shape parameters, dtype). The same spec is what the `kernels`
suite sends to a runner to time, what a machine profile stores the measured time under (`key`), and
what the performance model looks up when it meets that shape in a network, so a layer is
"measured" exactly when its kernel of that shape and dtype was timed on that framework.

Kinds, and what is counted (a multiply-add is 2 FLOPs, as in definitions/analysis.py):
- matmul (m, n, k): C[m, n] = A[m, k] B[k, n]: 2mnk FLOPs; A, B and C each moved once.
- dense_fwd (batch, positions, inputs, units, bias): the runner's own dense layer (nn.Linear,
  keras.layers.Dense, flax nn.Dense, gluon nn.Dense) on a (batch, inputs) input, or on a
  (batch, positions, inputs) sequence when `positions` > 1, its bias added when `bias` is 1: the
  matmul of M = batch x positions rows (2MKN FLOPs) and the bias (MN); x, W and y moved once. The
  forward that a dense_bwd timed with it (TensorFlow's tape, MXNet's autograd) is taken off by.
- dense_bwd (batch, positions, inputs, units, bias, input_grad): that layer's backward as the
  framework's autodiff runs it: the weight gradient (2MKN), the bias gradient (MN, when `bias`)
  and, when `input_grad`, the input gradient (2MKN); x, dy and W read, dW (db, dx) written. The
  same work as the separate GEMMs a dense layer's backward is made of (the workload's parts), but
  not always the same time: a framework lays the step's tensors out for the step, and XLA's CPU
  step runs a classifier's weight gradient over a (batch, steps, units) gradient as a transposed
  copy and a generic dot, 2x the time of the same product timed alone as a matmul (jax, LSTM-32's
  1024 x 256 x 10000: 212 ms for the layer's two gradients against 106 ms on a flat input).
- transpose (rows, cols): out-of-place, materialised: no FLOPs; the matrix read once and written once.
- copy (elements): out-of-place copy: read once, written once (the memory-bandwidth ceiling).
- relu (elements): out-of-place max(x, 0), the framework's activation: 1 FLOP, read once, written
  once (what the framework's element-wise operations reach, against the copy's ceiling).
- conv2d_fwd (batch, channels, height, width, filters, kh, kw, sh, sw, ph, pw): no bias, no groups:
  2·kh·kw·C·F·Ho·Wo FLOPs per sample; input, weights and output moved once.
- conv2d_bwd (same, input_grad): the weight gradient, and the input gradient when `input_grad`
  (a network's first layer has no input gradient to compute): 2x or 1x the forward FLOPs.
- lstm_step_fwd (batch, input, hidden): one step of the canonical cell (schema.py): the gate
  products 2·4h·(in + h), bias 4h, activations 5h and state updates 4h per sample (as analysis.py).
- lstm_step_bwd (batch, input, hidden): the step's gradients for x, h, c and the weights: twice the
  gate products and about twice the element-wise work.
- lstm_layer_fwd / lstm_layer_bwd (batch, steps, input, hidden): one whole LSTM layer over `steps`
  steps as the runner builds it (a fused layer: PyTorch's nn.LSTM, MXNet's RNN operator, the jax
  runner's hoisted input projection and scan, Keras' LSTM), `steps` times a step's counts; the
  model prefers it to `steps` separately timed steps, which miss what fusing saves.
- softmax_xent_fwd (rows, classes): the mean softmax cross-entropy of `rows` logit vectors against
  integer labels: max, sum of exponentials and log-probabilities, 5 FLOPs per logit; the logits
  read twice and the log-probabilities written once.
- softmax_xent_bwd (rows, classes): its gradient with respect to the logits: softmax minus the one-hot
  label, 2 FLOPs per logit; logits (or log-probabilities) read, gradient written.
- batched_matmul (batch, m, n, k): `batch` independent products C[m, n] = A[m, k] B[k, n] (either
  operand may be transposed: the same work): 2·batch·mnk FLOPs; A, B and C each moved once. What
  attention's products are when a framework does not fuse them (torch.bmm, tf.linalg.matmul,
  jnp.matmul, mx.nd.batch_dot on (batch, m, k) by (batch, k, n)).
- attention_fwd (batch, heads, steps, head_size, causal, dropout): the core of multi-head
  self-attention on q, k, v of (batch, heads, steps, head_size) each, as the framework's fused
  attention call computes it (torch's F.scaled_dot_product_attention, Keras' MultiHeadAttention
  core, jax.nn.dot_product_attention or flax.linen's with dropout, MXNet's
  interleaved_matmul_selfatt_qk / valatt): the scores q k^T / sqrt(S) (2·T·T·S per head), the
  softmax (5 FLOPs per score: scale, max, exponential, sum, division; a causal mask is a select,
  not counted: the whole T x T product is computed and masked), and the weighted sum p v (2·T·T·S
  per head). `causal` is 0 or 1; `dropout` is the rate of dropout on the probabilities in
  thousandths (100 for 0.1; 0 for none, as in inference), which changes the path frameworks take
  (torch's CPU flash kernel has none, Keras and flax compute the products themselves then) but
  adds no FLOPs (as the dropout layer's). Bytes at the least: q, k, v read and the output written
  once (a fused kernel keeps the scores to itself; an unfused one also moves them, which the
  workload's `batched_matmul` parts count).
- attention_bwd (same): its gradients of q, k and v from the output's: dp = do v^T, dv = p^T do,
  the softmax gradient (5 per score), dq = ds k, dk = ds^T q: twice the forward's products (a
  flash kernel's recomputation of the scores is not counted); q, k, v, o and do read, dq, dk, dv
  written.
- layer_norm_fwd (rows, dim): layer normalisation of `rows` vectors of `dim` over the last axis,
  with gamma and beta (the framework's layer: nn.LayerNorm, keras LayerNormalization, flax
  nn.LayerNorm, gluon nn.LayerNorm): 5 FLOPs per element (definitions/layers/layer_norm.py); x
  read twice (statistics, then normalised), y written, gamma and beta read.
- layer_norm_bwd (rows, dim, input_grad): the gradients of gamma and beta, and of x when
  `input_grad`: 8 FLOPs per element, x and dy read twice and dx written; without dx 4 FLOPs per
  element, x and dy read and x again (the row statistics recomputed); gamma read, its and beta's
  gradients written.
- batch_norm_fwd (batch, channels, height, width): batch normalisation as a training step runs it
  on an NCHW input (or NHWC: the framework's layout; a flat (N, C) input is height = width = 1):
  each channel's mean and biased variance over the batch and the map, the input normalised, scaled
  and shifted, the running statistics updated (the framework's layer in training mode:
  F.batch_norm, TensorFlow's FusedBatchNormV3 as the runner's Keras layer calls it, flax
  nn.BatchNorm, gluon nn.BatchNorm): 5 FLOPs per element, as a layer norm's; x read twice, y
  written, gamma, beta and the running statistics read (and those written): 3 passes. At
  inference the statistics are constants: a scale and shift on the convolution's output, costed
  as element-wise work that a graph optimiser fuses into it, no kernel (performance/workload.py).
- batch_norm_bwd (batch, channels, height, width, input_grad): the gradients of gamma and beta
  (two per-channel reductions of dy and dy x-hat) and of x when `input_grad`: 8 FLOPs per element,
  x and dy read twice and dx written (5 passes); without dx 4 FLOPs, x and dy read once (3).
- gelu_fwd (elements, approximate): GELU, the exact erf form (`approximate` 0) or the tanh
  approximation (1), the framework's own (nn.GELU, keras.activations.gelu, jax.nn.gelu, gluon
  nn.GELU or the mxnet runner's tanh form from operators): 8 FLOPs per element whichever the form
  (definitions/layers/gelu.py), read once and written once.
- gelu_bwd (elements, approximate): its input gradient, the derivative recomputed from x: 16 FLOPs
  per element; x and dy read, dx written.
- pool2d_fwd (batch, channels, height, width, kh, kw, sh, sw, ph, pw, op): 2-D pooling of an NCHW
  (or NHWC) input, `op` 0 max (padding pads with -inf), 1 average (no padding), 2 global average
  (the mean over the whole map: written kh = height, kw = width, stride 1, no padding, so its one
  output cell is the formula's; frameworks run it as a reduction, not a window); output size
  floor((in + 2p - k) / s) + 1: kh·kw FLOPs per output element (so one per input element for the
  global mean), as definitions/network.py counts pooling; input read once, output written once.
  The framework's own pooling op (F.max_pool2d / avg_pool2d / adaptive_avg_pool2d, Keras' pooling
  layers, flax.linen's max_pool / avg_pool or a mean, MXNet's Pooling) in the layout its networks
  use.
- pool2d_bwd (same): the input gradient (max: dy routed to each window's maximum; average: dy
  spread evenly over the window): one FLOP per input element; dy read, dx cleared then written
  (dx counted twice), as definitions/layers/pooling.py counts it.
- rms_norm_fwd (rows, dim): RMS normalisation of `rows` vectors of `dim` with gamma, no shift (the
  framework's own: F.rms_norm, keras' RMSNormalization, flax nn.RMSNorm, MXNet composed from its
  operators): 4 FLOPs per element (definitions/layers/rms_norm.py: square, sum, normalise, scale);
  x read twice (the mean square, then the scaling), y written, gamma read.
- rms_norm_bwd (rows, dim, input_grad): the gradient of gamma and, when `input_grad`, of x: with
  dx 9 FLOPs per element (x-hat, dgamma's product and sum; dy times gamma, its dot with x, and
  dx = r (g - x-hat mean(g x-hat))), x and dy read twice and dx written; without dx 3 FLOPs (x-hat,
  dgamma's product and sum), x twice (the row statistic recomputed) and dy once; gamma read, its
  gradient written.
- rotary_fwd (batch, steps, heads, kv_heads, head_size): the rotary position embedding of the
  queries (B, T, H, S) and keys (B, T, KV, S) of a grouped attention, as the runner's attention
  applies it (x cos + rotate_half(x) sin, Llama's half-split pairs): 3 FLOPs per element
  (definitions/layers/rotary.py); q and k read and written, the cos and sin tables (T x S/2 each)
  read. rotary_bwd (same): the rotation by the negated angle on dq' and dk': the same counts.
- swiglu_fwd (rows, dim, hidden): a SwiGLU MLP, down(silu(gate x) * up x), no biases, on `rows`
  token vectors, as the runner's layer runs it: the three products (2·dim·hidden each per row) and
  the gate (5 FLOPs per hidden element: definitions/layers/swiglu.py); x and the three weights read,
  y written (the hidden activations are the kernel's own, as attention's scores are).
- swiglu_bwd (rows, dim, hidden, input_grad): its gradients: the three weight gradients, the down
  product's input gradient (the hidden one), the gate's gradient (10 FLOPs per hidden element) and,
  when `input_grad`, the gate's and up's input gradients (2·dim·hidden per row each); x, dy and the
  weights read, their gradients (and dx) written.
- grouped_attention_fwd (batch, heads, kv_heads, steps, head_size, causal): grouped-query
  attention's core, H query heads sharing KV key/value heads (H / KV queries read each), on
  q (B, H, T, S) and k, v (B, KV, T, S), as the framework's attention call computes it (torch's
  F.scaled_dot_product_attention with enable_gqa, jax.nn.dot_product_attention, Keras' and
  MXNet's repeating the key/value heads first where their call has no groups): attention_fwd's
  counts over the H query heads (the whole T x T, a causal mask not counted); q, k, v read and the
  output written once. grouped_attention_bwd (same): attention_bwd's counts; q, k, v, o, do read,
  dq, dk, dv written.
- moe_router_fwd (rows, dim, experts, top_k): an MoE layer's router on `rows` tokens: the logits of
  a linear layer without bias (2·dim·E per row), their softmax (5 FLOPs per logit), the top-k and
  the chosen weights renormalised to sum to 1 (1 FLOP per choice); x and the router's weight read,
  the k weights and expert indices written (the indices counted at the element size).
- moe_router_bwd (rows, dim, experts, top_k): its backward from the chosen weights' gradient: through
  the renormalisation and the softmax to the logits (5 FLOPs per logit), the router's weight
  gradient and the input gradient (2·dim·E per row each); x, the weights' gradient and the router's
  weight read, its gradient and dx written.
- moe_experts_fwd (tokens, dim, hidden, experts, top_k): the experts' products of an MoE layer: each
  token's k choices (fixed, balanced: token t goes to experts (t·k + j) mod E, j < k, so each expert
  holds tokens·k/E rows, with weights that sum to 1), the tokens gathered into their experts'
  groups, every expert's SwiGLU over its group (a grouped matrix product per weight; as the runner
  does it: a loop over the experts, one grouped product, or MXNet's dense dispatch of every token
  to every expert, E/k times this work), and each token's k outputs weighted and
  summed back: swiglu_fwd's counts over tokens·k rows and 2 FLOPs per chosen output element; x,
  the E experts' weights and the choices read, y written.
- moe_experts_bwd (tokens, dim, hidden, experts, top_k): its backward: swiglu_bwd's counts over
  tokens·k rows with the input gradient, and the choices' weight gradients (a dot of dy with each
  chosen output, 2 FLOPs per element); x, dy, the weights and choices read, the weights' gradients,
  dx and the choices' gradients written.
- sgd_momentum (elements): one SGD-with-momentum update of a parameter of `elements` values, the
  framework's optimiser as the runners use it: m = momentum m + g, w = w - lr m: 4 FLOPs; w, g, m
  read and w, m written.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# Each kind's shape parameters, in the order they are written in a key.
PARAMS: dict[str, tuple[str, ...]] = {
    "matmul": ("m", "n", "k"),
    "dense_fwd": ("batch", "positions", "inputs", "units", "bias"),
    "dense_bwd": ("batch", "positions", "inputs", "units", "bias", "input_grad"),
    "transpose": ("rows", "cols"),
    "copy": ("elements",),
    "relu": ("elements",),
    "conv2d_fwd": ("batch", "channels", "height", "width", "filters", "kh", "kw", "sh", "sw", "ph", "pw"),
    "conv2d_bwd": ("batch", "channels", "height", "width", "filters", "kh", "kw", "sh", "sw", "ph", "pw",
                   "input_grad"),
    "lstm_step_fwd": ("batch", "input", "hidden"),
    "lstm_step_bwd": ("batch", "input", "hidden"),
    "lstm_layer_fwd": ("batch", "steps", "input", "hidden"),
    "lstm_layer_bwd": ("batch", "steps", "input", "hidden"),
    "softmax_xent_fwd": ("rows", "classes"),
    "softmax_xent_bwd": ("rows", "classes"),
    "sgd_momentum": ("elements",),
    "batched_matmul": ("batch", "m", "n", "k"),
    "attention_fwd": ("batch", "heads", "steps", "head_size", "causal", "dropout"),
    "attention_bwd": ("batch", "heads", "steps", "head_size", "causal", "dropout"),
    "layer_norm_fwd": ("rows", "dim"),
    "layer_norm_bwd": ("rows", "dim", "input_grad"),
    "batch_norm_fwd": ("batch", "channels", "height", "width"),
    "batch_norm_bwd": ("batch", "channels", "height", "width", "input_grad"),
    "gelu_fwd": ("elements", "approximate"),
    "gelu_bwd": ("elements", "approximate"),
    "pool2d_fwd": ("batch", "channels", "height", "width", "kh", "kw", "sh", "sw", "ph", "pw", "op"),
    "pool2d_bwd": ("batch", "channels", "height", "width", "kh", "kw", "sh", "sw", "ph", "pw", "op"),
    "rms_norm_fwd": ("rows", "dim"),
    "rms_norm_bwd": ("rows", "dim", "input_grad"),
    "rotary_fwd": ("batch", "steps", "heads", "kv_heads", "head_size"),
    "rotary_bwd": ("batch", "steps", "heads", "kv_heads", "head_size"),
    "swiglu_fwd": ("rows", "dim", "hidden"),
    "swiglu_bwd": ("rows", "dim", "hidden", "input_grad"),
    "grouped_attention_fwd": ("batch", "heads", "kv_heads", "steps", "head_size", "causal"),
    "grouped_attention_bwd": ("batch", "heads", "kv_heads", "steps", "head_size", "causal"),
    "moe_router_fwd": ("rows", "dim", "experts", "top_k"),
    "moe_router_bwd": ("rows", "dim", "experts", "top_k"),
    "moe_experts_fwd": ("tokens", "dim", "hidden", "experts", "top_k"),
    "moe_experts_bwd": ("tokens", "dim", "hidden", "experts", "top_k"),
}
SOFTMAX_FLOPS = 5  # per attention score (definitions/layers/attention.py)
LAYER_NORM_FLOPS = {"layer_norm_fwd": 5, "layer_norm_bwd": 8}  # per element (definitions/layers/layer_norm.py)
BATCH_NORM_FLOPS = {"batch_norm_fwd": 5, "batch_norm_bwd": 8}  # per element, as a layer norm's
GELU_FLOPS = {"gelu_fwd": 8, "gelu_bwd": 16}  # per element (definitions/layers/gelu.py)
RMS_NORM_FLOPS = {"rms_norm_fwd": 4, "rms_norm_bwd": 9}  # per element (definitions/layers/rms_norm.py)
ROTARY_FLOPS = 3  # per rotated element of q and k (definitions/layers/rotary.py)
SWIGLU_GATE_FLOPS = {"swiglu_fwd": 5, "swiglu_bwd": 10}  # per hidden element (definitions/layers/swiglu.py)
POOL_OPS = ("max", "avg", "global")  # a pool2d kernel's `op`, by its value (definitions/layers/pooling.py)
# Kinds whose ceiling is memory bandwidth (achieved bytes/s); the others are compared in FLOP/s.
MEMORY_KINDS = ("transpose", "copy", "relu", "softmax_xent_fwd", "softmax_xent_bwd", "sgd_momentum",
                "layer_norm_fwd", "layer_norm_bwd", "batch_norm_fwd", "batch_norm_bwd", "gelu_fwd", "gelu_bwd",
                "pool2d_fwd", "pool2d_bwd", "rms_norm_fwd", "rms_norm_bwd", "rotary_fwd", "rotary_bwd")
# The operation class of each kind whose work runs on the matrix units (definitions/machines.py
# OP_CLASSES): a datasheet profile divides its FLOPs by the peak times that class's efficiency. Every
# other kind, and work that is no kernel, is "elementwise" (memory-bound).
OP_CLASS = {"matmul": "matmul", "dense_fwd": "matmul", "dense_bwd": "matmul", "batched_matmul": "matmul",
            "lstm_step_fwd": "matmul", "lstm_step_bwd": "matmul", "lstm_layer_fwd": "matmul", "lstm_layer_bwd": "matmul",
            "conv2d_fwd": "convolution", "conv2d_bwd": "convolution", "attention_fwd": "attention", "attention_bwd": "attention",
            "swiglu_fwd": "matmul", "swiglu_bwd": "matmul", "moe_router_fwd": "matmul", "moe_router_bwd": "matmul",
            "moe_experts_fwd": "matmul", "moe_experts_bwd": "matmul",
            "grouped_attention_fwd": "attention", "grouped_attention_bwd": "attention"}


@dataclass(frozen=True)
class KernelSpec:
    kind: str
    shape: tuple[tuple[str, int], ...]  # (name, value) in PARAMS order
    dtype: str = "float32"

    @classmethod
    def of(cls, kind: str, dtype: str = "float32", **shape: int) -> KernelSpec:
        if kind not in PARAMS:
            raise ValueError(f"unknown kernel kind {kind!r}; expected one of {', '.join(PARAMS)}")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
        names = PARAMS[kind]
        if set(shape) != set(names):
            raise ValueError(f"{kind} takes {', '.join(names)}; got {', '.join(sorted(shape))}")
        return cls(kind, tuple((n, int(shape[n])) for n in names), dtype)

    @classmethod
    def from_dict(cls, data: dict) -> KernelSpec:
        """The inverse of to_dict (a request's or a record's kernel)."""
        return cls.of(data["kind"], data.get("dtype", "float32"), **data["shape"])

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dtype": self.dtype, "shape": dict(self.shape)}

    @property
    def key(self) -> str:
        """`matmul m=64 n=2048 k=784 float32`: stable, readable, the same wherever it is made."""
        return " ".join([self.kind, *(f"{n}={v}" for n, v in self.shape), self.dtype])

    def __getitem__(self, name: str) -> int:
        return dict(self.shape)[name]

    @property
    def memory_bound(self) -> bool:
        return self.kind in MEMORY_KINDS

    # --------------------------------------------------------------- work and traffic

    def _conv_out(self) -> tuple[int, int]:
        ho = (self["height"] + 2 * self["ph"] - self["kh"]) // self["sh"] + 1
        wo = (self["width"] + 2 * self["pw"] - self["kw"]) // self["sw"] + 1
        return ho, wo

    def _input_elements(self) -> int:
        """A convolution's, pooling's or batch norm's input: batch x channels x height x width."""
        return self["batch"] * self["channels"] * self["height"] * self["width"]

    def dense_products(self) -> list[tuple[int, int, int]]:
        """A dense kernel's matrix products as (m, n, k) of C[m, n] = A[m, k] B[k, n], M = batch x
        positions rows: forward (M, units, inputs); backward the weight gradient (inputs, units, M)
        and, with `input_grad`, the input gradient (M, inputs, units), as the workload's parts."""
        m, k, n = self["batch"] * self["positions"], self["inputs"], self["units"]
        if self.kind == "dense_fwd":
            return [(m, n, k)]
        return [(k, n, m)] + ([(m, k, n)] if self["input_grad"] else [])

    @property
    def pool_op(self) -> str:
        """A pool2d kernel's operation: max, avg or global (POOL_OPS)."""
        return POOL_OPS[self["op"]]

    @property
    def flops(self) -> int:
        k = self.kind
        if k == "matmul":
            return 2 * self["m"] * self["n"] * self["k"]
        if k.startswith("dense"):
            bias = self["batch"] * self["positions"] * self["units"] if self["bias"] else 0
            return sum(2 * m * n * kk for m, n, kk in self.dense_products()) + bias
        if k in ("transpose", "copy"):
            return 0
        if k == "relu":
            return self["elements"]
        if k.startswith("softmax_xent"):
            return (5 if k == "softmax_xent_fwd" else 2) * self["rows"] * self["classes"]
        if k == "sgd_momentum":
            return 4 * self["elements"]
        if k == "batched_matmul":
            return 2 * self["batch"] * self["m"] * self["n"] * self["k"]
        if k.startswith("attention") or k.startswith("grouped_attention"):
            scores = self["batch"] * self["heads"] * self["steps"] * self["steps"]
            products = 2 * 2 * scores * self["head_size"]  # two products of 2·T·T·S per (query) head
            return (products if k.endswith("_fwd") else 2 * products) + SOFTMAX_FLOPS * scores
        if k.startswith("rms_norm"):
            per_element = 3 if k == "rms_norm_bwd" and not self["input_grad"] else RMS_NORM_FLOPS[k]
            return per_element * self["rows"] * self["dim"]
        if k.startswith("rotary"):
            return ROTARY_FLOPS * self._rotated()
        if k.startswith("swiglu"):
            return self._swiglu_flops(k, self["rows"], bool(k == "swiglu_fwd" or self["input_grad"]))
        if k.startswith("moe_router"):
            rows, logits = self["rows"], self["rows"] * self["experts"]
            products = 2 * rows * self["dim"] * self["experts"]
            if k == "moe_router_fwd":
                return products + SOFTMAX_FLOPS * logits + rows * self["top_k"]
            return 2 * products + SOFTMAX_FLOPS * logits
        if k.startswith("moe_experts"):
            routed = self["tokens"] * self["top_k"]
            kind = "swiglu_fwd" if k == "moe_experts_fwd" else "swiglu_bwd"
            return self._swiglu_flops(kind, routed, True) + 2 * routed * self["dim"]
        if k.startswith("layer_norm"):
            if k == "layer_norm_bwd" and not self["input_grad"]:
                return 4 * self["rows"] * self["dim"]
            return LAYER_NORM_FLOPS[k] * self["rows"] * self["dim"]
        if k.startswith("batch_norm"):
            if k == "batch_norm_bwd" and not self["input_grad"]:
                return 4 * self._input_elements()
            return BATCH_NORM_FLOPS[k] * self._input_elements()
        if k.startswith("gelu"):
            return GELU_FLOPS[k] * self["elements"]
        if k == "pool2d_bwd":
            return self._input_elements()
        if k == "pool2d_fwd":
            ho, wo = self._conv_out()
            return self["kh"] * self["kw"] * self["batch"] * self["channels"] * ho * wo
        if k.startswith("conv2d"):
            ho, wo = self._conv_out()
            fwd = 2 * self["batch"] * self["kh"] * self["kw"] * self["channels"] * self["filters"] * ho * wo
            if k == "conv2d_fwd":
                return fwd
            return fwd * (2 if self["input_grad"] else 1)
        if k.startswith("lstm_layer"):
            step = KernelSpec.of(k.replace("layer", "step"), self.dtype, batch=self["batch"], input=self["input"],
                                 hidden=self["hidden"])
            return self["steps"] * step.flops
        b, i, h = self["batch"], self["input"], self["hidden"]
        gates = 2 * 4 * h * (i + h)
        if k == "lstm_step_fwd":
            return b * (gates + 4 * h + 5 * h + 4 * h)
        return b * (2 * gates + 2 * (4 * h + 5 * h + 4 * h))

    @property
    def bytes(self) -> int:
        """Bytes a kernel must move at the least: each operand and result once."""
        s = DTYPE_BYTES[self.dtype]
        k = self.kind
        if k == "matmul":
            m, n, kk = self["m"], self["n"], self["k"]
            return s * (m * kk + kk * n + m * n)
        if k.startswith("dense"):
            rows, fin, units = self["batch"] * self["positions"], self["inputs"], self["units"]
            bias = units if self["bias"] else 0
            if k == "dense_fwd":  # x, W, b read; y written
                return s * (rows * fin + fin * units + bias + rows * units)
            # x, dy, W read; dW, db (, dx) written
            return s * (rows * fin + rows * units + 2 * fin * units + bias + (rows * fin if self["input_grad"] else 0))
        if k == "transpose":
            return 2 * s * self["rows"] * self["cols"]
        if k in ("copy", "relu"):
            return 2 * s * self["elements"]
        if k.startswith("softmax_xent"):
            return (3 if k == "softmax_xent_fwd" else 2) * s * self["rows"] * self["classes"]
        if k == "sgd_momentum":
            return 5 * s * self["elements"]
        if k == "batched_matmul":
            m, n, kk = self["m"], self["n"], self["k"]
            return s * self["batch"] * (m * kk + kk * n + m * n)
        if k.startswith("attention"):
            tensor = self["batch"] * self["heads"] * self["steps"] * self["head_size"]
            return s * tensor * (4 if k == "attention_fwd" else 8)  # q, k, v, o (, do; dq, dk, dv)
        if k.startswith("grouped_attention"):
            per_head = self["batch"] * self["steps"] * self["head_size"]
            queries, keys = per_head * self["heads"], per_head * self["kv_heads"]
            if k == "grouped_attention_fwd":
                return s * (2 * queries + 2 * keys)  # q, o; k, v
            return s * (4 * queries + 4 * keys)  # q, o, do, dq; k, v, dk, dv
        if k.startswith("rms_norm"):
            n, d = self["rows"] * self["dim"], self["dim"]
            if k == "rms_norm_fwd":
                return s * (3 * n + d)
            return s * ((5 if self["input_grad"] else 3) * n + 2 * d)  # gamma read, its gradient written
        if k.startswith("rotary"):
            return s * (2 * self._rotated() + self["steps"] * self["head_size"])  # q, k in and out; cos, sin
        if k.startswith("swiglu"):
            rows, d, h = self["rows"], self["dim"], self["hidden"]
            if k == "swiglu_fwd":
                return s * (2 * rows * d + 3 * d * h)  # x, y; gate, up, down
            return s * (2 * rows * d + 6 * d * h + (rows * d if self["input_grad"] else 0))  # x, dy; W, dW (, dx)
        if k.startswith("moe_router"):
            rows, d, e, top = self["rows"], self["dim"], self["experts"], self["top_k"]
            if k == "moe_router_fwd":
                return s * (rows * d + e * d + 2 * rows * top)  # x, W; weights and indices
            return s * (2 * rows * d + rows * top + 2 * e * d)  # x, dx; the weights' gradient; W, dW
        if k.startswith("moe_experts"):
            t, d, h, e, top = self["tokens"], self["dim"], self["hidden"], self["experts"], self["top_k"]
            if k == "moe_experts_fwd":
                return s * (2 * t * d + 3 * e * d * h + 2 * t * top)  # x, y; the experts; the choices
            return s * (3 * t * d + 6 * e * d * h + 3 * t * top)  # x, dy, dx; W, dW; choices, their gradient
        if k.startswith("layer_norm"):
            n, d = self["rows"] * self["dim"], self["dim"]
            if k == "layer_norm_fwd":
                return s * (3 * n + 2 * d)
            return s * ((5 if self["input_grad"] else 3) * n + 3 * d)
        if k.startswith("batch_norm"):
            n, c = self._input_elements(), self["channels"]
            if k == "batch_norm_fwd":
                return s * (3 * n + 6 * c)  # gamma, beta read; the running mean and variance read and written
            return s * ((5 if self["input_grad"] else 3) * n + 3 * c)  # gamma read, its and beta's gradients written
        if k.startswith("gelu"):
            return s * (2 if k == "gelu_fwd" else 3) * self["elements"]
        if k.startswith("pool2d"):
            ho, wo = self._conv_out()
            x, y = self._input_elements(), self["batch"] * self["channels"] * ho * wo
            return s * (x + y if k == "pool2d_fwd" else y + 2 * x)  # x, y; or dy, dx cleared and written
        if k.startswith("conv2d"):
            ho, wo = self._conv_out()
            x = self._input_elements()
            w = self["filters"] * self["channels"] * self["kh"] * self["kw"]
            y = self["batch"] * self["filters"] * ho * wo
            if k == "conv2d_fwd":
                return s * (x + w + y)
            return s * (y + x + 2 * w + (x if self["input_grad"] else 0))  # dy, x, w, dw (, dx)
        if k.startswith("lstm_layer"):  # the weights once, the states every step
            b, t, i, h = self["batch"], self["steps"], self["input"], self["hidden"]
            weights = 4 * h * (i + h) + 4 * h
            return s * (weights + t * b * (i + 2 * h + 4 * h + 2 * h)) * (1 if k == "lstm_layer_fwd" else 2)
        b, i, h = self["batch"], self["input"], self["hidden"]
        weights = 4 * h * (i + h) + 4 * h
        states = b * (i + 2 * h + 4 * h + 2 * h)  # x, h and c in; gates; h' and c' out
        return s * (weights + states) * (1 if k == "lstm_step_fwd" else 2)

    def _rotated(self) -> int:
        """A rotary kernel's rotated elements: every query and key head's T x S."""
        return self["batch"] * self["steps"] * (self["heads"] + self["kv_heads"]) * self["head_size"]

    def _swiglu_flops(self, kind: str, rows: int, input_grad: bool) -> int:
        """A SwiGLU MLP's FLOPs over `rows` token vectors (swiglu_fwd / swiglu_bwd's counts)."""
        product = 2 * rows * self["dim"] * self["hidden"]
        gate = SWIGLU_GATE_FLOPS[kind] * rows * self["hidden"]
        if kind == "swiglu_fwd":
            return 3 * product + gate
        # three weight gradients, the down product's input gradient (to the hidden), the gate's and up's
        # input gradients (to x) when asked
        return (4 + (2 if input_grad else 0)) * product + gate

    def achieved(self, seconds: float) -> float:
        """FLOP/s, or bytes/s for the memory-bound kinds."""
        return (self.bytes if self.memory_bound else self.flops) / seconds

    @property
    def unit(self) -> str:
        return "B/s" if self.memory_bound else "FLOP/s"
