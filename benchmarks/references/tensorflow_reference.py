"""TensorFlow reference: keras.applications.ResNet50 and, for LSTM-32, Keras' own Embedding + LSTM +
Dense, trained by the custom-loop idiom of the Keras guides (GradientTape in a tf.function).

keras.applications' ResNet-50 is the original v1: the stride sits on the first 1x1 convolution of a
block and every convolution has a bias (25.6 M parameters against the suite's 25.56 M); the JSON line
carries its parameter count so the difference stays visible.
"""

from __future__ import annotations

from reference_loop import (CLASSES, EMBEDDING, HIDDEN, IMAGE, SEQUENCE, VOCABULARY, canonical_inputs, parse_args,
                            time_steps)


def main() -> None:
    args = parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(min(args.threads, 2))
    import keras

    if args.device == "cpu":
        tf.config.set_visible_devices([], "GPU")
    keras.utils.set_random_seed(0)
    if args.network == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=IMAGE, classes=CLASSES,
                                            classifier_activation=None)
        source = "keras.applications.ResNet50"
        x = tf.random.normal((args.batch, *IMAGE))
        y = tf.random.uniform((args.batch,), 0, CLASSES, dtype=tf.int32)
    else:
        model = keras.Sequential([keras.Input((SEQUENCE,), dtype="int32"),
                                  keras.layers.Embedding(VOCABULARY, EMBEDDING),
                                  keras.layers.LSTM(HIDDEN, return_sequences=True),
                                  keras.layers.LSTM(HIDDEN, return_sequences=True),
                                  keras.layers.Dense(VOCABULARY)])
        source = "keras Embedding + LSTM + LSTM + Dense"
        x = tf.random.uniform((args.batch, SEQUENCE), 0, VOCABULARY, dtype=tf.int32)
        y = tf.random.uniform((args.batch, SEQUENCE), 0, VOCABULARY, dtype=tf.int32)
    given = canonical_inputs(args, channels_last=True)
    if given is not None:  # the runner's batch, NHWC as keras' ResNet50 takes it
        x, y = tf.constant(given[0]), tf.constant(given[1].astype("int32"))
    opt = keras.optimizers.SGD(learning_rate=args.learning_rate, momentum=args.momentum)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    last = []

    def step():
        last[:] = [train_step(x, y)]

    time_steps(step, lambda: last[0].numpy(), args, model=source, params=int(sum(v.shape.num_elements() for v in model.trainable_variables)),
               framework=f"tensorflow {tf.__version__} keras {keras.__version__}",
               threads=tf.config.threading.get_intra_op_parallelism_threads())


if __name__ == "__main__":
    main()
