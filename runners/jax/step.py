"""The JAX runner's training step: the flax network built from the layer table (layers.py's LAYERS,
in order), numpy-drawn initial values, synthetic data, the loss, the optimiser (optax SGD with
momentum, amp_fp16's dynamic loss scale) and one training or inference iteration, in TrainingModel;
DeviceState holds a state on the device between dispatched steps. runner.py, distributed.py,
generate.py and convergence.py all train or infer through TrainingModel.

Nothing that starts threads (jax, flax, numpy) is imported at module level: the runner restricts
the CPU affinity first, and XLA:CPU sizes its thread pools from it when jax is first imported.
"""

from __future__ import annotations

import functools

from runners.jax.attention import attention_report
from runners.jax.framework import load_jax
from runners.jax.layers import FLATTEN_SETTING, LAYERS, LayerCall, build_plan, dropout_rate
from runners.jax.precision import (COMPUTE_DTYPE, LOSS_SCALE_FACTOR, LOSS_SCALE_GROWTH_INTERVAL, LOSS_SCALE_INITIAL,
                                   LOSS_SCALING, compute_dtype, pin_precision, precision_flags, request_precision)
from runners.jax.transformer import (ATTENTION_FUNCTION, SEGMENT_TABLE_STD, TRANSFORMER_TYPES, attention_asked,
                                     attention_function, cudnn_refusal)


@functools.lru_cache(maxsize=None)
def network_class():
    """The flax module of a resolved network (defined once, lazily)."""
    import flax.linen as nn
    import jax.numpy as jnp

    class Network(nn.Module):
        """A resolved dlbench network; images NHWC, sequences (batch, steps, features)."""

        layers: tuple
        plan: tuple
        deterministic: bool = False
        lstm_unroll: int = 1
        dtype: object = jnp.float32

        @nn.compact
        def __call__(self, x, train: bool):
            modules: dict = {}
            for i, (spec, how) in enumerate(zip(self.layers, self.plan)):
                x = LAYERS.builder(spec["type"])(x, spec, LayerCall(self, f"layer{i:03d}", train, how, modules))
                if i == 0:  # kept only where "intermediates" is mutable (TrainingModel.forward_dtypes)
                    self.sow("intermediates", "first_layer_output", x)
            return x

    return Network


def host_init(abstract: dict, rng, embedding_std: dict | None = None, dense_init: dict | None = None) -> dict:
    """Initial values for flax's variable shapes, drawn with numpy (the same schemes as flax's
    defaults: LeCun-normal kernels, zero biases, N(0, 1/dim) embeddings, unit BN and layer-norm
    scales, unit BN variance, U(-1/sqrt(h), 1/sqrt(h)) LSTM weights; N(0, 0.02^2) position tables
    and class tokens, as transformer_modules draws them). `embedding_std`: module name -> the
    described N(0, std^2) of that embedding's table (its `init_std`), in place of flax's default;
    `dense_init`: module name -> a dense layer's described `init` (variance scale / fan, normal or
    uniform; definitions/schema.py), in place of LeCun-normal."""
    import numpy as np

    embedding_std = embedding_std or {}
    dense_init = dense_init or {}

    def one(path, s):
        leaf = path[-1].key
        shape = tuple(s.shape)
        if leaf == "kernel":
            fan_in, fan_out = int(np.prod(shape[:-1])), shape[-1]
            init = dense_init.get(getattr(path[-2], "key", None)) if len(path) > 1 else None
            if init is None:
                return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
            fan = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2}[init["mode"]]
            std = np.sqrt(init["scale"] / fan)
            if init["distribution"] == "normal":
                return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
            return rng.uniform(-np.sqrt(3) * std, np.sqrt(3) * std, shape).astype(np.float32)
        if leaf == "embedding":
            std = embedding_std.get(getattr(path[-2], "key", None)) or 1 / np.sqrt(shape[-1])
            return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
        if leaf in ("router", "expert_gate", "expert_up", "expert_down"):  # (E, out, in): LeCun-normal per expert
            return (rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[-1])).astype(np.float32)
        if leaf in ("pos_embedding", "class_token"):  # transformer_modules' table_init
            return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
        if leaf in ("w_ih", "w_hh"):
            bound = 1.0 / np.sqrt(shape[-1] // 4)
            return rng.uniform(-bound, bound, shape).astype(np.float32)
        if leaf in ("scale", "var"):
            return np.ones(shape, np.float32)
        return np.zeros(shape, np.float32)  # bias, beta, running mean

    import jax

    return jax.tree_util.tree_map_with_path(one, abstract)


def logits_of(out):
    """The logits of a network's output: pretraining heads' output is (masked-LM logits,
    next-sentence logits), whose logits are the first; any other network's output is its logits."""
    return out[0] if isinstance(out, tuple) else out


class TrainingModel:
    """What a training run of one resolved network needs, independent of where it runs: the flax
    module, host (numpy) data and initial variables, the loss, the optimiser and one iteration's
    function (shared by the single-process runner and distributed.py). `compile_mode` is the
    runner's choice (runner.py's check_compile): every step here is a jax.jit executable."""

    def __init__(self, request: dict, compile_mode: str = "compiled"):
        import numpy as np
        import optax

        network = request["network"]
        precision = request_precision(request)
        self.compile = compile_mode
        pin_precision(precision, request.get("device", "cpu"))
        dtype = compute_dtype(precision)
        self.storage = np.float64 if precision == "float64" else np.float32
        self.network = network
        self.precision = precision
        self.compute_dtype = COMPUTE_DTYPE[precision]
        self.loss_scaling = precision == "amp_fp16"
        self.train = request.get("mode", "train") == "train"
        self.deterministic = bool(request.get("deterministic", False))
        self.plan = build_plan(network)
        inp = network["input"]
        self.images = inp["kind"] == "tensor" and len(inp["shape"]) == 3
        self.tokens = inp["kind"] in ("tokens", "masked_tokens")  # int32 token ids
        self.masked = inp["kind"] == "masked_tokens"
        self.has_lstm = any(layer["type"] == "lstm" for layer in network["layers"])
        self.lstm_unroll = 1  # the recurrence is small next to the vocabulary dense; unrolling only slows compilation
        for layer in network["layers"]:
            LAYERS.builder(layer["type"])  # an unknown type fails here, naming it, before anything is traced
        self.has_dropout = not self.deterministic and any(dropout_rate(layer) > 0 for layer in network["layers"])
        self.device = request.get("device", "cpu")
        self.attention = self.plan_attention()  # writes each attention's `implementation` into the plan
        self.model = network_class()(layers=tuple(network["layers"]), plan=tuple(self.plan),
                                deterministic=self.deterministic, lstm_unroll=self.lstm_unroll, dtype=dtype)
        self.tx = optax.sgd(request["learning_rate"], momentum=request["momentum"])

    def plan_attention(self) -> dict:
        """Per attention (an attention layer's or a block's, by layer index): the function it calls
        in the step's mode and why (attention_function), the `implementation` asked of
        jax.nn.dot_product_attention, and, where cuDNN's was asked but jax refuses it for this layer's
        shape or this GPU, None asked instead and jax's reason. The asked implementation goes into
        the layer's plan, which the builder reads."""
        out = {}
        for i, layer in enumerate(self.network["layers"]):
            if layer["type"] not in ("attention", "transformer_block", "grouped_attention", "llama_block"):
                continue
            dropout_on = self.train and not self.deterministic and layer.get("dropout", 0.0) > 0
            function, why = attention_function(self.compute_dtype, dropout_on, self.device)
            entry = {"function": function, **({"why": why} if why else {})}
            self.plan[i]["attention_function"] = function
            if function == ATTENTION_FUNCTION:
                asked = attention_asked(self.compute_dtype, self.device)
                refused = cudnn_refusal(layer, self.compute_dtype, self.train) if asked == "cudnn" else None
                if refused:  # the step then passes None and jax chooses
                    entry["cudnn_refused"] = f"jax refused implementation='cudnn' for this layer: {refused}"
                    asked = None
                entry["implementation_asked"] = asked
                self.plan[i]["attention_implementation"] = asked
            out[f"{i:03d}"] = entry
        return out

    def host_batch(self, batch: int, rng, inputs: str | None = None):
        """(x, y) as contiguous numpy arrays: images NHWC, tokens int32; masked tokens' y is (B, M + 1),
        the M masked positions' tokens then the next-sentence label (equivalence.make_inputs' draw)."""
        import numpy as np

        inp = self.network["input"]
        if inputs:
            with np.load(inputs) as data:
                x_np, y_np = data["x"], data["y"]
            if self.images:
                x_np = x_np.transpose(0, 2, 3, 1)  # canonical NCHW -> NHWC, once
        elif self.masked:
            masked = len(inp["masked_positions"])
            x_np = rng.integers(0, inp["vocabulary"], (batch, inp["sequence_length"]))
            y_np = rng.integers(0, inp["vocabulary"], (batch, masked + 1))
            y_np[:, masked] = rng.integers(0, 2, batch)
        elif self.tokens:
            shape = (batch, inp["sequence_length"])
            x_np = rng.integers(0, inp["vocabulary"], shape)
            y_np = rng.integers(0, inp["vocabulary"], shape)
        else:
            shape = (batch, *inp["shape"][1:], inp["shape"][0]) if self.images else (batch, *inp["shape"])
            x_np = rng.standard_normal(shape, dtype=np.float32)
            y_np = rng.integers(0, inp["classes"], (batch,))
        return (np.ascontiguousarray(x_np, dtype=np.int32 if self.tokens else self.storage),
                np.ascontiguousarray(y_np, dtype=np.int32))

    def host_variables(self, sample_shape, dtype, rng) -> dict:
        """Numpy variables: shapes from flax (traced, not compiled), values drawn by `host_init`."""
        jax = load_jax()
        abstract = jax.eval_shape(functools.partial(self.model.init, train=False), {"params": jax.random.PRNGKey(0)},
                                  jax.ShapeDtypeStruct((1, *sample_shape), dtype))
        described = {f"layer{i:03d}": layer["init_std"] if layer["type"] == "embedding" else SEGMENT_TABLE_STD
                     for i, layer in enumerate(self.network["layers"])
                     if layer.get("init_std") or layer["type"] == "segment_embedding"}
        dense = {f"layer{i:03d}": layer["init"] for i, layer in enumerate(self.network["layers"])
                 if layer["type"] == "dense" and layer.get("init")}
        return jax.tree.map(lambda v: v.astype(self.storage), host_init(abstract, rng, described, dense))

    def host_opt_state(self, params):
        """optax.sgd's state is the momentum trace (zeros) and empty states: built on the host.
        With dynamic loss scaling: {"sgd": that, "loss_scale": {"scale", "finite_steps"}}."""
        import numpy as np

        jax = load_jax()
        sgd = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(self.tx.init, params))
        if not self.loss_scaling:
            return sgd
        return {"sgd": sgd, "loss_scale": {"scale": np.asarray(LOSS_SCALE_INITIAL, np.float32),
                                           "finite_steps": np.asarray(0, np.int32)}}

    @staticmethod
    def host_key(seed: int):
        import numpy as np

        jax = load_jax()
        return np.asarray(jax.random.key_data(jax.random.PRNGKey(seed)))

    @staticmethod
    def count_params(params) -> int:
        import numpy as np

        return int(sum(int(np.prod(p.shape)) for p in load_jax().tree.leaves(params)))

    def output_shape(self, params, stats, x) -> list[int]:
        """Per-sample output shape (traced, not compiled); `x` may be a ShapeDtypeStruct."""
        out = load_jax().eval_shape(lambda p, s, x: logits_of(self.apply(p, s, None, x, False)[0]), params, stats, x)
        return list(out.shape[1:])

    def apply(self, p, stats, key, x, train: bool):
        """(logits, batch statistics): updated ones in training mode where the network has any."""
        variables = {"params": p, "batch_stats": stats} if stats else {"params": p}
        rngs = {"dropout": key} if (self.has_dropout and train) else None
        if train and stats:
            out, upd = self.model.apply(variables, x, train=True, mutable=["batch_stats"], rngs=rngs)
            return out, upd["batch_stats"]
        return self.model.apply(variables, x, train=train, rngs=rngs), stats

    @staticmethod
    def loss_of(out, y):
        """The network's loss on its output: softmax cross-entropy, mean over the samples (or every
        position's token); for pretraining heads' (masked-LM, next-sentence) logits
        masked_lm_and_next_sentence, the mean over the B x M masked positions against y[:, :M] plus
        the mean over the B samples against y[:, M]."""
        import jax.numpy as jnp
        import optax

        def cross_entropy(logits, labels):
            logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))  # bfloat16 up, float64 kept
            return optax.softmax_cross_entropy_with_integer_labels(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).mean()

        if isinstance(out, tuple):
            masked_lm, next_sentence = out
            masked = masked_lm.shape[1]
            return cross_entropy(masked_lm, y[:, :masked]) + cross_entropy(next_sentence, y[:, masked])
        return cross_entropy(out, y)

    def gradients(self, p, stats, key, x, y, loss_scale=None):
        """(loss, new batch statistics, gradients) of one batch; `key` is this step's dropout key.
        With dynamic loss scaling (amp_fp16), `loss_scale` is the scale in use: the backward pass
        runs on loss x scale and the float32 gradients come back divided by it (inf/NaN stay so)."""
        jax = load_jax()
        if self.loss_scaling and loss_scale is None:
            raise ValueError("amp_fp16: the gradients need the dynamic loss scale (opt_state['loss_scale'])")

        def objective(p):
            logits, new_stats = self.apply(p, stats, key, x, True)
            loss = self.loss_of(logits, y)
            return (loss if loss_scale is None else loss * loss_scale), (loss, new_stats)

        (_, (loss, new_stats)), grads = jax.value_and_grad(objective, has_aux=True)(p)
        if loss_scale is not None:
            grads = jax.tree.map(lambda g: g / loss_scale.astype(g.dtype), grads)
        return loss, new_stats, grads

    def update(self, p, grads, opt_state):
        """The SGD-momentum update; with dynamic loss scaling also the scale's: a non-finite gradient
        keeps weights and momentum and halves the scale, LOSS_SCALE_GROWTH_INTERVAL finite steps in
        a row double it."""
        import jax.numpy as jnp
        import optax

        if not self.loss_scaling:
            updates, opt_state = self.tx.update(grads, opt_state, p)
            return optax.apply_updates(p, updates), opt_state
        jax = load_jax()
        finite = jax.tree.reduce(lambda ok, g: ok & jnp.all(jnp.isfinite(g)), grads, jnp.asarray(True))
        updates, sgd = self.tx.update(grads, opt_state["sgd"], p)
        keep = functools.partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
        p, sgd = keep(optax.apply_updates(p, updates), p), keep(sgd, opt_state["sgd"])
        scale, steps = opt_state["loss_scale"]["scale"], opt_state["loss_scale"]["finite_steps"]
        steps = jnp.where(finite, steps + 1, 0)
        grow = steps >= LOSS_SCALE_GROWTH_INTERVAL
        grown = jnp.where(grow, scale * LOSS_SCALE_FACTOR, scale)
        scale = jnp.where(finite, jnp.where(jnp.isfinite(grown), grown, scale),
                          jnp.maximum(scale / LOSS_SCALE_FACTOR, 1.0))
        steps = jnp.where(grow, 0, steps).astype(jnp.int32)
        return p, {"sgd": sgd, "loss_scale": {"scale": scale.astype(jnp.float32), "finite_steps": steps}}

    def train_step(self, p, stats, opt_state, key, x, y):
        """One iteration: forward, loss, backward, SGD-momentum update, batch statistics, key split
        (and the dynamic loss scale's update under amp_fp16)."""
        key, sub = load_jax().random.split(key)
        scale = opt_state["loss_scale"]["scale"] if self.loss_scaling else None
        loss, new_stats, grads = self.gradients(p, stats, sub, x, y, scale)
        p, opt_state = self.update(p, grads, opt_state)
        return p, new_stats, opt_state, key, loss

    def forward_dtypes(self, p, stats, x) -> dict:
        """The dtypes of the first layer's output and of the logits in the step's forward pass.
        Abstractly evaluated (jax.eval_shape traces the same module apply the step runs: in JAX
        every dtype is fixed when the function is traced, before anything executes)."""
        import numpy as np

        jax = load_jax()
        variables = {"params": p, "batch_stats": stats} if stats else {"params": p}

        def forward(variables, x, key):
            rngs = {"dropout": key} if (self.has_dropout and self.train) else None
            mutable = ["intermediates", "batch_stats"] if self.train else ["intermediates"]
            out, state = self.model.apply(variables, x, train=self.train, mutable=mutable, rngs=rngs)
            return out, state["intermediates"]["first_layer_output"][0]

        key = jax.ShapeDtypeStruct((2,), np.uint32)
        out, first = jax.eval_shape(forward, variables, x, key)
        logits = logits_of(out)
        return {"first_layer_output_dtype": str(first.dtype), "logits_dtype": str(logits.dtype)}

    def attention_settings(self, p, stats, x) -> dict | None:
        """settings["attention"]: what each attention called and the kernel jax traced for it
        (attention.py's attention_report of this model's step)."""
        return attention_report(self, p, stats, x)

    def precision_settings(self, p=None, stats=None, x=None) -> dict:
        """settings["precision_effective"]: the flags read back from jax, the dtypes in use, the loss scale."""
        jax = load_jax()
        out = {**precision_flags(), "compute_dtype": self.compute_dtype}
        if p is not None:
            dtypes = sorted({str(a.dtype) for a in jax.tree.leaves(p)})
            out["param_dtype"] = dtypes[0] if len(dtypes) == 1 else dtypes
        if p is not None and x is not None:
            out.update(self.forward_dtypes(p, stats, x))
        out["loss_scale"] = LOSS_SCALE_INITIAL if self.loss_scaling else None
        if self.loss_scaling:
            out["loss_scaling"] = LOSS_SCALING
        return out

    def settings(self, platform: str, request: dict, params=None, stats=None, x=None) -> dict:
        """What was built; with the parameters and a batch (or their shapes), the forward's dtypes too."""
        network = self.network
        plan = self.plan
        settings = {
            "api": "flax.linen + optax.sgd",
            "platform": platform,
            "layout": "NHWC" if self.images else ("batch-major tokens, time-major LSTM scan" if self.has_lstm else "NC"),
            "input_transpose": "NCHW->NHWC once at prepare" if (self.images and request.get("inputs")) else None,
            "flatten": sorted({FLATTEN_SETTING[p["flatten"]] for p in plan if "flatten" in p}) or None,
            "lstm": (f"fused gates (in,4h)/(h,4h), input projection hoisted out of lax.scan, unroll={self.lstm_unroll}"
                     if self.has_lstm else None),
            "batch_norm": "flax BatchNorm (biased batch variance in running_var)"
            if any(layer["type"] in ("batch_norm", "residual") for layer in network["layers"]) else None,
            "dropout": ("identity (deterministic; attention and transformer blocks at rate 0)" if self.deterministic
                        else "per-step key split inside the step")
            if any(layer["type"] == "dropout" or dropout_rate(layer) > 0 for layer in network["layers"]) else None,
            "transformer": ("sequences (B, T, D); q, k, v as nn.Dense reshaped to (B, T, heads, head_size), heads "
                            "head-major; flax nn.LayerNorm, jax.nn.gelu in the network's form; a tied head is the "
                            "token embedding's Embed.attend"
                            if any(layer["type"] in TRANSFORMER_TYPES for layer in network["layers"]) else None),
            "pretraining_heads": ("segments: nn.Embed lookup of the fixed (T,) segment ids, broadcast over the batch; "
                                  "masked positions gathered by jnp.take (static, sorted, unique: one XLA gather); "
                                  "loss masked_lm_and_next_sentence (optax cross-entropy over B*M masked tokens + "
                                  "over B next-sentence labels)"
                                  if any(layer["type"] == "pretraining_heads" for layer in network["layers"]) else None),
            "precision": self.precision,
            "precision_effective": self.precision_settings(params, stats, x),
            "attention": self.attention_settings(params, stats, x) if params is not None and x is not None else None,
            "matmul_precision": load_jax().config.jax_default_matmul_precision or "default",
            "mixed_precision": (f"flax modules with dtype={self.compute_dtype}, float32 parameters (param_dtype)"
                                if self.precision.startswith("amp_") else None),
            "compile": self.compile,
        }
        return {k: v for k, v in settings.items() if v is not None}


class DeviceState:
    """A training state on the device (params, batch_stats, opt_state, key, x, y) and what the last
    dispatched step returned, which synchronize() waits for. step functions dispatch a compiled
    iteration and keep its outputs as the new state: nothing goes back to the host."""

    def __init__(self, state: dict):
        self.state = state
        self.last: list = []
        self._block = load_jax().block_until_ready

    def train_step(self, compiled):
        """step(): one compiled train_step (p, stats, opt_state, key, x, y) -> (p, stats, opt_state, key, loss)."""
        state, last = self.state, self.last

        def step():
            s = state
            p, st, opt, key, loss = compiled(s["params"], s["batch_stats"], s["opt_state"], s["key"], s["x"], s["y"])
            s.update(params=p, batch_stats=st, opt_state=opt, key=key)
            last[:] = [p, st, opt, key, loss]

        return step

    def infer_step(self, compiled):
        """step(): one compiled inference (p, stats, x) -> logits."""
        state, last = self.state, self.last

        def step():
            last[:] = [compiled(state["params"], state["batch_stats"], state["x"])]

        return step

    def synchronize(self) -> None:
        if self.last:
            self._block(self.last)


class MeshArrays:
    """This rank's host (numpy) values as global arrays over a 1-D mesh of every rank's device:
    replicated (every rank holds the same) or sharded along `axis` (each rank its slice)."""

    def __init__(self, mesh, axis: str):
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        self.replicated, self.sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P(axis))

    @staticmethod
    def global_array(sharding, local):
        return load_jax().make_array_from_process_local_data(sharding, local)

    def replicate(self, tree):
        return load_jax().tree.map(lambda a: self.global_array(self.replicated, a), tree)

    def per_rank(self, tree):
        """Each leaf with a leading axis of one entry per rank (this rank's value its entry)."""
        import numpy as np

        return load_jax().tree.map(lambda a: self.global_array(self.sharded, np.expand_dims(a, 0)), tree)
