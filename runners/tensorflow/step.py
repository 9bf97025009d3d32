"""The TensorFlow runner's network, built from the layer table (layers.py), and its step: the batch
(the request's inputs or synthetic data), the loss, Keras' SGD, and the train or infer step as one
tf.function; and what the single-process, the multi-worker, the convergence and the generation steps
share: the input's kind, the synthetic batch's shape, the logits of the model's output.

With `deterministic`, every dropout rate is 0: dropout layers are left out, and the dropout of
attention and transformer blocks (on the probabilities and the branches) is built at rate 0.
"""

from __future__ import annotations

from runners.tensorflow.framework import load_keras, load_tf
from runners.tensorflow.layers import LayerPlan, build_layer, flatten_plan
from runners.tensorflow.precision import MIXED, precision_scope, storage_dtype, with_loss_scaling
from runners.tensorflow.transformer import TIED_HEADS

TOKEN_INPUTS = ("tokens", "masked_tokens")  # the input kinds of int64 token ids


def build_network(network: dict, deterministic: bool = False, precision: str = "fp32"):
    """A keras.Sequential for the resolved network and, per resolved layer, its Keras layers, in
    `precision` (see `precision_scope`). `deterministic`: dropout layers are left out, and the
    dropout of attention and transformer blocks (on the probabilities and the branches) is built at
    rate 0."""
    with precision_scope(precision):
        return _build_network(network, deterministic, precision)


def _build_network(network: dict, deterministic: bool, precision: str):
    keras = load_keras()
    layers = network["layers"]
    flatten_modes, permuted = flatten_plan(layers)
    tied = any(spec["type"] in TIED_HEADS and spec["tied"] for spec in layers)
    per_layer: list[list] = []
    for i, spec in enumerate(layers):
        in_shape = spec["in_shape"]
        hw = tuple(in_shape[1:]) if len(in_shape) == 3 else None
        if deterministic and spec.get("dropout"):  # attention, transformer_block: their own dropout rate
            spec = {**spec, "dropout": 0.0}
        per_layer.append(build_layer(spec, LayerPlan(hw, flatten_modes.get(i), deterministic, per_layer,
                                                     tied_embedding=tied and i == 0, inp=network["input"])))

    inp = network["input"]
    dtype = storage_dtype(precision)
    if inp["kind"] in TOKEN_INPUTS:
        first = keras.Input(shape=(inp["sequence_length"],), dtype="int64")
    elif len(inp["shape"]) == 3:
        c, h, w = inp["shape"]
        first = keras.Input(shape=(h, w, c), dtype=dtype)
    else:
        first = keras.Input(shape=tuple(inp["shape"]), dtype=dtype)
    # mixed precision: the output in float32, as Keras recommends (a weightless float32 last layer;
    # pretraining_heads' two outputs, the masked-LM and next-sentence logits, each cast by it)
    tail = [keras.layers.Activation("linear", dtype="float32", name="logits_float32")] if precision in MIXED else []
    model = keras.Sequential([first] + [layer for made in per_layer for layer in made] + tail, name=network["name"])
    return model, per_layer, flatten_modes, permuted


def describe_flatten(layers, modes, permuted):
    out = {}
    for i, mode in modes.items():
        if mode == "channels_first":
            out[str(i)] = "transpose to C,H,W then reshape (no dense layer to absorb the order)"
        elif any(j > i and permuted[j] == tuple(layers[i]["in_shape"]) for j in permuted):
            out[str(i)] = "reshape in H,W,C order; consumer rows permuted at load/export"
        else:
            out[str(i)] = "reshape"
    return out or None


def input_kind(network: dict) -> tuple[bool, bool, bool]:
    """(tokens, images, has_lstm) of a resolved network; tokens: int64 token ids (a tokens or a
    masked_tokens input)."""
    inp = network["input"]
    tokens = inp["kind"] in TOKEN_INPUTS
    images = not tokens and len(inp["shape"]) == 3
    return tokens, images, any(layer["type"] == "lstm" for layer in network["layers"])


def masked_count(network: dict) -> int | None:
    """M, the masked positions of a masked_tokens input (its labels: M tokens, then the
    next-sentence label), else None."""
    inp = network["input"]
    return len(inp["masked_positions"]) if inp["kind"] == "masked_tokens" else None


def logits_of(outputs):
    """The logits of the model's output: pretraining_heads' masked-LM logits (B, M, vocabulary) of
    its (masked-LM, next-sentence) pair, else the output itself."""
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def output_shape(model) -> list[int]:
    """The per-sample shape of the logits (the masked-LM logits' (M, vocabulary) for BERT's heads)."""
    shape = model.output_shape
    if isinstance(shape, list) or (shape and isinstance(shape[0], (tuple, list))):
        shape = shape[0]  # (masked-LM logits, next-sentence logits)
    return [int(d) for d in shape[1:]]


def loss_function(network: dict):
    """(labels, model output) -> the network's mean loss (schema.LOSS_OF_INPUT), and its description.
    softmax_cross_entropy: tf.nn.sparse_softmax_cross_entropy_with_logits averaged over every label
    (the samples, or every token's next token); masked_lm_and_next_sentence: its mean over the B * M
    masked positions (labels[:, :M] against the masked-LM logits) plus its mean over the B samples'
    next-sentence labels (labels[:, M])."""
    tf = load_tf()

    def cross_entropy(labels, logits):
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(labels, [-1]), logits=tf.reshape(logits, [-1, logits.shape[-1]])))

    masked = masked_count(network)
    if masked is None:
        return cross_entropy, "sparse_softmax_cross_entropy_with_logits, mean"

    def masked_lm_and_next_sentence(labels, outputs):
        mlm, next_sentence = outputs
        return cross_entropy(labels[:, :masked], mlm) + cross_entropy(labels[:, masked], next_sentence)

    return masked_lm_and_next_sentence, ("masked_lm_and_next_sentence: sparse_softmax_cross_entropy_with_logits, "
                                         "mean over the batch's masked positions + mean over its next-sentence labels")


def sample_shape(network: dict, batch: int) -> tuple:
    """The shape of a synthetic batch of tensors: channels-last for images."""
    shape = network["input"]["shape"]
    return (batch, *shape[1:], shape[0]) if len(shape) == 3 else (batch, *shape)


def count_params(variables) -> int:
    import numpy as np

    return int(sum(int(np.prod(v.shape)) for v in variables))


def lstm_setting(has_lstm: bool, cuda: bool) -> str | None:
    return ("keras.layers.LSTM, " + ("cuDNN kernel" if cuda else "while-loop kernel")) if has_lstm else None



def step_batch(request: dict, network: dict, storage: str):
    """(x, y), made on the current device: the request's `inputs` (the check's canonical arrays:
    images NCHW -> NHWC once, here, outside the timed step; float inputs in the variables' dtype
    `storage`), else a synthetic batch of the request's batch size (the seed set before)."""
    import numpy as np

    tf = load_tf()
    inp = network["input"]
    tokens, images, _ = input_kind(network)
    masked = masked_count(network)  # masked_tokens: M, the masked-LM labels before the next-sentence one
    batch = request["batch_size"]
    if request.get("inputs"):
        with np.load(request["inputs"]) as data:
            x_np, y_np = data["x"], data["y"]
        if images:  # canonical NCHW -> NHWC, once, outside the timed step
            x_np = np.ascontiguousarray(x_np.transpose(0, 2, 3, 1))
        if not tokens and storage != "float32":  # float32 -> float64 is exact
            x_np = x_np.astype(storage)
        return tf.identity(tf.constant(x_np)), tf.identity(tf.constant(y_np))
    if masked is not None:  # y: the M masked positions' tokens, then the next-sentence label
        x = tf.random.uniform((batch, inp["sequence_length"]), 0, inp["vocabulary"], dtype=tf.int64)
        y = tf.concat([tf.random.uniform((batch, masked), 0, inp["vocabulary"], dtype=tf.int64),
                       tf.random.uniform((batch, 1), 0, 2, dtype=tf.int64)], axis=1)
    elif tokens:
        shape = (batch, inp["sequence_length"])
        x = tf.random.uniform(shape, 0, inp["vocabulary"], dtype=tf.int64)
        y = tf.random.uniform(shape, 0, inp["vocabulary"], dtype=tf.int64)
    else:
        x = tf.random.normal(sample_shape(network, batch), dtype=tf.as_dtype(storage))
        y = tf.random.uniform((batch,), 0, inp["classes"], dtype=tf.int64)
    return x, y


def sgd_with_loss_scaling(learning_rate, momentum, precision: str):
    """(keras.optimizers.SGD with momentum, the optimiser the step applies, whether its loss is
    scaled): under amp_fp16 the SGD inside Keras' dynamic loss scaling (precision.with_loss_scaling),
    else the SGD itself. Built under the precision's scope, its state follows the variables' dtype."""
    sgd = load_keras().optimizers.SGD(learning_rate=learning_rate, momentum=momentum)
    optimizer, scaled = with_loss_scaling(sgd, precision)
    return sgd, optimizer, scaled


def compiled_step(model, loss_of, optimizer, trainable, scaled: bool, train: bool, jit: bool):
    """The step as one tf.function (jit: XLA-compiled whole), called as step(x, y). Train: forward,
    loss, the gradient (of the scaled loss under loss scaling: the optimiser unscales and checks it
    in apply_gradients), the optimiser's update; returns the loss. Infer: the forward pass."""
    tf = load_tf()
    if train:
        @tf.function(jit_compile=jit)
        def compiled(x, y):
            with tf.GradientTape() as tape:
                loss = loss_of(y, model(x, training=True))
                target = optimizer.scale_loss(loss) if scaled else loss
            grads = tape.gradient(target, trainable)
            optimizer.apply_gradients(zip(grads, trainable))
            return loss
    else:
        @tf.function(jit_compile=jit)
        def compiled(x, y):
            return model(x, training=False)
    return compiled
