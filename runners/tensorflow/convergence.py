"""The TensorFlow side of the convergence suite (runners/common/convergence.py drives it): the
Keras model of step.py, keras.optimizers.SGD with momentum (Keras' rule: v = m v -
lr g, w += v; the task's weight decay added to each gradient first, g + wd w, as torch's SGD adds
it), a tf.function step compiled at initialisation, and the data through tf.data as a TensorFlow
user feeds a model: from_tensor_slices over the split read from disk, a seeded shuffle reshuffled
each epoch, the task's augmentation with tf.image (zero padding, random_crop, random_flip_left_right:
the same crop and flip as datasets.crop_flip) and the normalisation in a parallel map, batching with
the last partial batch dropped, prefetch (AUTOTUNE)."""

from __future__ import annotations

from runners.common.contract import PRECISIONS
from runners.tensorflow.framework import device_of, load_keras, load_tf, thread_settings
from runners.tensorflow.precision import float32_math, precision_scope, request_precision
from runners.tensorflow.layers import set_batch_norm_floor
from runners.tensorflow.step import (build_network, count_params, input_kind, logits_of, loss_function,
                                     sample_shape, sgd_with_loss_scaling)

EVAL_BATCH = 500


def prepare_convergence(request: dict):
    import numpy as np

    from runners.common.contract import Trainer

    tf, keras = load_tf(), load_keras()
    network = request["network"]
    cuda = request["device"] == "cuda"
    precision = request_precision(request, PRECISIONS)
    keras.utils.set_random_seed(request["seed"])
    tokens, images, _ = input_kind(network)
    settings: dict = {"precision": precision, "precision_effective": float32_math(precision),
                      "data_format": "channels_last" if images else None}
    set_batch_norm_floor(cuda)
    device = device_of(cuda)
    opt = request["optimizer"]
    batch = request["batch_size"]
    in_shape = sample_shape(network, batch)[1:]
    with tf.device(device), precision_scope(precision):
        model, _, _, _ = build_network(network, False, precision)
        loss_of, loss_setting = loss_function(network)
        trainable = model.trainable_variables
        sgd, optimizer, scaled = sgd_with_loss_scaling(opt["learning_rate"], opt["momentum"], precision)
        optimizer.build(trainable)
    wd = float(opt["weight_decay"])

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_of(y, model(x, training=True))
            target = optimizer.scale_loss(loss) if scaled else loss
        grads = tape.gradient(target, trainable)
        if wd:
            grads = [g + tf.cast(wd, g.dtype) * tf.cast(v, g.dtype) for g, v in zip(grads, trainable)]
        optimizer.apply_gradients(zip(grads, trainable))
        return loss

    @tf.function
    def eval_step(x, y):
        predicted = tf.argmax(logits_of(model(x, training=False)), axis=-1, output_type=tf.int64)
        return tf.reduce_sum(tf.cast(tf.equal(predicted, y), tf.int64))

    with tf.device(device):  # traced now, at initialisation: the clock does not pay for it
        train_step.get_concrete_function(tf.TensorSpec((batch, *in_shape), tf.float32), tf.TensorSpec((batch,), tf.int64))
        eval_step.get_concrete_function(tf.TensorSpec((None, *in_shape), tf.float32), tf.TensorSpec((None,), tf.int64))
    ds, aug = request["dataset"], request["augmentation"]
    mean = tf.constant(ds["mean"], tf.float32)
    std = tf.constant(ds["std"], tf.float32)
    state: dict = {}

    def to_input(x):
        """uint8 HWC -> the model's input: normalised, channels-last images or the flat vector in
        the canonical (C, H, W) order."""
        x = (tf.cast(x, tf.float32) / 255.0 - mean) / std
        if images:
            return x
        return tf.reshape(tf.transpose(x, (2, 0, 1)), in_shape)

    def augment(x):
        h, w, c = ds["shape"][1], ds["shape"][2], ds["shape"][0]
        p = aug["crop_padding"]
        if p:
            x = tf.image.random_crop(tf.pad(x, [[p, p], [p, p], [0, 0]]), (h, w, c))
        if aug["horizontal_flip"]:
            x = tf.image.random_flip_left_right(x)
        return x

    def attach(train, evaluation, seed):
        autotune = tf.data.AUTOTUNE
        x_train = np.ascontiguousarray(train[0].transpose(0, 2, 3, 1))  # NCHW -> NHWC, the layout of tf.image
        augmenting = bool(aug["crop_padding"] or aug["horizontal_flip"])
        t = tf.data.Dataset.from_tensor_slices((x_train, train[1]))
        t = t.shuffle(len(train[1]), seed=seed, reshuffle_each_iteration=True)
        t = t.map(lambda x, y: (to_input(augment(x) if augmenting else x), y), num_parallel_calls=autotune)
        state["train"] = t.batch(batch, drop_remainder=True).prefetch(autotune)
        e = tf.data.Dataset.from_tensor_slices((np.ascontiguousarray(evaluation[0].transpose(0, 2, 3, 1)),
                                                evaluation[1]))
        state["eval"] = e.map(lambda x, y: (to_input(x), y), num_parallel_calls=autotune).batch(EVAL_BATCH).prefetch(autotune)
        return {"pipeline": "tf.data", "from": "Dataset.from_tensor_slices", "shuffle": f"buffer {len(train[1])} "
                "(the whole split), seeded, reshuffled each epoch", "map": "num_parallel_calls=AUTOTUNE",
                "prefetch": "AUTOTUNE", "augmentation": aug, "augmentation_ops":
                "tf.pad + tf.image.random_crop, tf.image.random_flip_left_right" if augmenting else None,
                "eval_batch": EVAL_BATCH}

    def train_batches(epoch):
        return iter(state["train"])

    def step(b, lr):
        sgd.learning_rate = lr  # the schedule's rate for this step (assigned to Keras' variable)
        with tf.device(device):
            train_step(*b)

    def eval_batches():
        return iter(state["eval"])

    def evaluate(b):
        with tf.device(device):
            correct = eval_step(*b)
        return int(correct.numpy()), int(b[1].shape[0])

    settings.update({"loss": loss_setting, "step": "tf.function (traced at initialisation)",
                     "optimizer": "keras.optimizers.SGD(momentum), gradients + weight_decay * w"
                                  + (" in LossScaleOptimizer" if scaled else ""), **thread_settings()})
    return Trainer(attach, train_batches, step, eval_batches, evaluate, tf.test.experimental.sync_devices,
                   count_params(trainable), settings)
