"""TensorFlow reference: keras.applications.ResNet50, for LSTM-32 Keras' own Embedding + LSTM + Dense,
and for GPT-2 small keras_hub's GPT2CausalLM around a GPT2Backbone built from the gpt2 (small)
configuration (random initialisation, no preset downloaded, no preprocessor: token ids and a padding
mask of ones in, the backbone's output through the token embedding's reverse projection, the tied
head, out), all trained by the custom-loop idiom of the Keras guides (GradientTape in a tf.function)
with SparseCategoricalCrossentropy(from_logits=True), the mean over every position. keras_hub is not
in the runner's environment: fairness.py installs benchmarks/references/requirements-tensorflow.txt
into a folder of its own and puts it on PYTHONPATH for this process only.

The llm suite (llama_tiny, smollm2_135m; moe_tiny): keras_hub's LlamaCausalLM on a LlamaBackbone and
MixtralCausalLM on a MixtralBackbone, built from the configuration fairness.py passes (--llm: the
suite's description; no dropout, preprocessor=None, token ids and a padding mask of ones in). The
MoE's load-balancing loss is keras_hub's own: MixtralSparseMoeBlock add_loss()es it, times
router_aux_loss_coef, in training; the step adds model.losses to the cross-entropy, as Keras' fit does.

keras.applications' ResNet-50 is the original v1: the stride sits on the first 1x1 convolution of a
block and every convolution has a bias (25.6 M parameters against the suite's 25.56 M); the JSON line
carries its parameter count so the difference stays visible.
"""

from __future__ import annotations

from reference_loop import (CLASSES, EMBEDDING, GPT2, HIDDEN, IMAGE, LLM_NETWORKS, SEQUENCE, VOCABULARY,
                            canonical_inputs, parse_args, sequence, time_steps)


def gpt2_small(keras):
    """keras_hub's GPT-2 causal LM on a backbone of the gpt2 (small) preset's configuration: dropout 0.1
    on the embeddings, the attention probabilities and both branches of each TransformerDecoder."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=GPT2["vocabulary"], num_layers=GPT2["layers"], num_heads=GPT2["heads"],
        hidden_dim=GPT2["width"], intermediate_dim=4 * GPT2["width"], dropout=GPT2["dropout"],
        max_sequence_length=GPT2["context"])
    model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    return model, f"keras_hub {keras_hub.__version__} GPT2CausalLM(GPT2Backbone(gpt2 small), preprocessor=None)"


def llm(config: dict):
    """keras_hub's Llama (or, with experts, Mixtral) causal LM from the suite's configuration."""
    import keras_hub

    common = dict(vocabulary_size=config["vocabulary"], num_layers=config["layers"],
                  num_query_heads=config["heads"], hidden_dim=config["width"], intermediate_dim=config["hidden"],
                  num_key_value_heads=config["kv_heads"], rope_max_wavelength=config["rope_theta"],
                  layer_norm_epsilon=config["eps"], dropout=0)
    if config["experts"]:
        if config["tied"]:
            raise SystemExit("keras_hub's MixtralBackbone has no tied head; the suite's MoE decoder is tied")
        backbone = keras_hub.models.MixtralBackbone(**common, num_experts=config["experts"], top_k=config["top_k"],
                                                    router_aux_loss_coef=config["aux_loss_coefficient"],
                                                    sliding_window=config["context"])
        model = keras_hub.models.MixtralCausalLM(backbone=backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.LlamaBackbone(**common, tie_word_embeddings=config["tied"])
        model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    return model, (f"keras_hub {keras_hub.__version__} {type(model).__name__}({type(backbone).__name__}"
                   f"(the suite's {config['name']}), preprocessor=None)")


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
    elif args.network == "gpt2_small" or args.network in LLM_NETWORKS:
        model, source = llm(args.llm) if args.llm else gpt2_small(keras)
        vocabulary = args.llm["vocabulary"] if args.llm else GPT2["vocabulary"]
        x = tf.random.uniform((args.batch, sequence(args)), 0, vocabulary, dtype=tf.int32)
        y = tf.random.uniform((args.batch, sequence(args)), 0, vocabulary, dtype=tf.int32)
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
        ids = given[0].dtype.kind in "iu"  # token ids as int32, as Keras' embeddings take them
        x, y = tf.constant(given[0].astype("int32") if ids else given[0]), tf.constant(given[1].astype("int32"))
    if args.network == "gpt2_small" or args.llm:  # keras_hub's causal LMs' inputs: the ids and a padding mask (no padding)
        x = {"token_ids": x, "padding_mask": tf.ones_like(x)}
    opt = keras.optimizers.SGD(learning_rate=args.learning_rate, momentum=args.momentum)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
            if model.losses:  # what the layers add_loss()ed this call: the MoE's load-balancing loss
                loss = loss + tf.add_n(model.losses)
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
