"""The TensorFlow runner's transformer layers (schema.py's canonical semantics), Keras 3 layers
where Keras has them: the builders of the position, patch and segment embeddings, layer_norm, gelu,
attention, transformer_block, token_pool, lm_head and pretraining_heads, and beside each the
function that names its canonical weights (layers.py puts both in LAYERS; each weight is given with
its layout, which weights.py converts).

- transformers (`transformer_classes`): keras.layers.LayerNormalization(epsilon), GELU as
  keras.activations.gelu(approximate=) in the network's form (Dense(activation=) in the MLP),
  attention as keras.layers.MultiHeadAttention (separate q/k/v/out EinsumDense kernels, mapped to
  the canonical matrices by a transpose and a reshape; use_causal_mask), which hands its products to
  keras.ops.dot_product_attention unless the layer has dropout. Keras' TensorFlow backend offers no
  flash attention (flash_attention=True raises there), so the default None is kept; what ran is
  read from a trace into settings["attention"] (attention.py). The position table and class
  token are weights of small layers; patches are a strided Conv2D on the NHWC image, its grid
  reshaped to tokens (row-major, the canonical order); a tied lm_head is the token embedding's
  reverse projection, keras.layers.ReversibleEmbedding(tie_weights=True): one variable.
- BERT (a masked_tokens input): segment_embedding is a keras.layers.Embedding (token types) looked up
  at the fixed segment vector (sentence A, then B) and added, broadcast over the batch;
  pretraining_heads (`PretrainingHeads`) is Keras' Dense(tanh) pooler on position 0 with a Dense(2)
  next-sentence classifier, tf.gather of the input's fixed masked positions on the sequence axis,
  Dense(GELU) + LayerNormalization, and the decoder: the tied lm_head's reverse projection of the
  token embedding plus its bias (one table variable) or a Dense(vocabulary) untied. Its output is
  the pair (masked-LM logits (B, M, vocabulary), next-sentence logits (B, 2)), both cast to float32
  by the mixed-precision tail; step.py's `loss_function` sums the two mean cross-entropies (labels:
  the M masked tokens, then the next-sentence label), and the logits the check and output_shape
  report are the masked-LM ones (`logits_of`).
- In float64 two Keras/TensorFlow constants are made exact (tf.nn.gelu's and MultiHeadAttention's
  scale go through float32 tensors otherwise).
"""

from __future__ import annotations

import functools
import types

from runners.common import rotary
from runners.common import routing as routing_rule
from runners.tensorflow.framework import load_keras, load_tf


def expert_output(h, gate, up, down):
    """One expert's SwiGLU on its rows h (n, D): down(silu(h gate^T) * (h up^T)), its weights (H, D),
    (H, D) and (D, H); the single-process MoE block and distributed.py's expert shard both call it."""
    tf = load_tf()
    return tf.matmul(tf.nn.silu(tf.matmul(h, gate, transpose_b=True)) * tf.matmul(h, up, transpose_b=True),
                     down, transpose_b=True)


@functools.lru_cache(maxsize=None)
def transformer_classes():
    """The transformer layers that Keras 3 has no layer for as such (a position table added, patches
    with a class token, a block, the class token's pooling, a tied head), defined once TensorFlow is
    imported. Inside, everything Keras does have: LayerNormalization, Dense with GELU,
    MultiHeadAttention, Dropout, Conv2D, ReversibleEmbedding's reverse projection."""
    import numpy

    tf, keras = load_tf(), load_keras()

    class PositionEmbedding(keras.layers.Layer):
        """x + P[0:T]: a learned (max_length, dim) table whose first T rows are added (keras_hub's
        PositionEmbedding; GPT-2's wpe, ViT's pos_embed)."""

        def __init__(self, max_length: int, **kwargs):
            super().__init__(**kwargs)
            self.max_length = max_length

        def build(self, input_shape):
            self.table = self.add_weight(name="table", shape=(self.max_length, input_shape[-1]),
                                         initializer=keras.initializers.RandomNormal(stddev=0.02))

        def call(self, x):
            # the variable is float32 under a mixed policy: cast to the activations' dtype, as
            # Keras' autocast would, explicitly (a slice of a variable is not always autocast)
            return x + tf.cast(tf.convert_to_tensor(self.table)[: x.shape[1]], x.dtype)

        def compute_output_shape(self, s):
            return s

    class PatchEmbedding(keras.layers.Layer):
        """keras.layers.Conv2D with kernel = stride = patch on the NHWC image, its (h, w) grid
        reshaped to tokens (row-major: the canonical order, NHWC needs no transpose for it), the
        class token prepended as token 0."""

        def __init__(self, patch: int, dim: int, class_token: bool, **kwargs):
            super().__init__(**kwargs)
            self.dim, self.has_class_token = dim, class_token
            self.proj = keras.layers.Conv2D(dim, patch, strides=patch, padding="valid", use_bias=True, name="proj")

        def build(self, input_shape):
            self.proj.build(tuple(input_shape))
            self.class_token = (self.add_weight(name="class_token", shape=(self.dim,),
                                                initializer=keras.initializers.RandomNormal(stddev=0.02))
                                if self.has_class_token else None)

        def call(self, x):
            grid = self.proj(x)  # (B, h, w, dim)
            tokens = tf.reshape(grid, [-1, grid.shape[1] * grid.shape[2], self.dim])
            if self.class_token is None:
                return tokens
            cls = tf.cast(tf.convert_to_tensor(self.class_token), tokens.dtype)
            cls = tf.broadcast_to(cls[None, None, :], [tf.shape(tokens)[0], 1, self.dim])
            return tf.concat([cls, tokens], axis=1)

        def compute_output_shape(self, s):
            n = (s[1] // self.proj.kernel_size[0]) * (s[2] // self.proj.kernel_size[1])
            return (s[0], n + (1 if self.has_class_token else 0), self.dim)

    def multi_head_attention(spec: dict):
        """keras.layers.MultiHeadAttention with q, k, v and out as separate EinsumDense kernels
        (D, heads, head_size) and (heads, head_size, D); key_dim = value_dim = the head size, its
        scale 1/sqrt(head_size), the canonical one."""
        mha = keras.layers.MultiHeadAttention(spec["heads"], spec["head_size"], dropout=spec["dropout"],
                                              use_bias=spec["bias"], name="attn")
        if mha.compute_dtype == "float64":
            # Keras' TensorFlow backend applies the scale (a Python float) as tf.cast(scale, dtype),
            # which makes a float32 tensor of it first: 1/sqrt(3) or 1/sqrt(8) rounded to float32,
            # a 3e-8 error in every score in float64. A numpy float64 (still a float) converts exactly.
            mha._inverse_sqrt_key_dim = numpy.float64(mha._inverse_sqrt_key_dim)
        return mha

    class SelfAttention(keras.layers.Layer):
        """The attention type on its own: MultiHeadAttention called with query = value = x."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            self.causal = spec["causal"]
            self.mha = multi_head_attention(spec)

        def build(self, input_shape):
            self.mha.build(tuple(input_shape), tuple(input_shape))

        def call(self, x, training=None):
            return self.mha(x, x, use_causal_mask=self.causal, training=training)

        def compute_output_shape(self, s):
            return s

    class TransformerBlock(keras.layers.Layer):
        """Layer norms, MultiHeadAttention and a GELU MLP (Dense, Dense) with two residual joins,
        pre- or post-norm (keras_hub's TransformerEncoder/Decoder arrangement), dropout on each
        branch before its join."""

        def __init__(self, spec: dict, **kwargs):
            super().__init__(**kwargs)
            dim = spec["in_shape"][-1]
            self.hidden = spec["mlp_ratio"] * dim
            self.pre, self.causal = spec["norm"] == "pre", spec["causal"]
            self.ln1 = keras.layers.LayerNormalization(epsilon=spec["eps"], name="ln1")
            self.attn = multi_head_attention(spec)
            self.ln2 = keras.layers.LayerNormalization(epsilon=spec["eps"], name="ln2")
            self.fc1 = keras.layers.Dense(self.hidden, activation=gelu(spec["gelu"]), use_bias=spec["bias"],
                                          name="fc1")
            self.fc2 = keras.layers.Dense(dim, use_bias=spec["bias"], name="fc2")
            self.drop1 = keras.layers.Dropout(spec["dropout"], name="drop1")
            self.drop2 = keras.layers.Dropout(spec["dropout"], name="drop2")

        def build(self, input_shape):
            s = tuple(input_shape)
            self.ln1.build(s)
            self.attn.build(s, s)
            self.ln2.build(s)
            self.fc1.build(s)
            self.fc2.build((*s[:-1], self.hidden))

        def call(self, x, training=None):
            def attn(h):
                return self.drop1(self.attn(h, h, use_causal_mask=self.causal, training=training), training=training)

            def mlp(h):
                return self.drop2(self.fc2(self.fc1(h)), training=training)

            if self.pre:
                x = x + attn(self.ln1(x))
                return x + mlp(self.ln2(x))
            x = self.ln1(x + attn(x))
            return self.ln2(x + mlp(x))

        def compute_output_shape(self, s):
            return s

    class ClassTokenPool(keras.layers.Layer):
        """Row 0 of the tokens, the class token (the mean is keras.layers.GlobalAveragePooling1D)."""

        def call(self, x):
            return x[:, 0]

        def compute_output_shape(self, s):
            return (s[0], s[2])

    class TiedLMHead(keras.layers.Layer):
        """Logits x E^T (+ b) through the token embedding's own reverse projection
        (keras.layers.ReversibleEmbedding(tie_weights=True), keras_hub's GPT-2 head): E is the one
        embeddings variable of layer 0, so its gradient is the sum of both uses, it is updated once
        and counted once (Keras deduplicates a sublayer's variables in trainable_variables)."""

        def __init__(self, embedding, use_bias: bool, **kwargs):
            super().__init__(**kwargs)
            self.embedding, self.use_bias = embedding, use_bias

        def build(self, input_shape):
            self.bias = (self.add_weight(name="bias", shape=(self.embedding.input_dim,), initializer="zeros")
                         if self.use_bias else None)

        def call(self, x):
            logits = self.embedding(x, reverse=True)
            return logits if self.bias is None else logits + tf.cast(tf.convert_to_tensor(self.bias), logits.dtype)

        def compute_output_shape(self, s):
            return (*s[:-1], self.embedding.input_dim)

    def gelu(form: str):
        """keras.activations.gelu in the network's form (Keras' default is erf, approximate=False;
        tanh is approximate=True: tf.nn.gelu's formula is GPT-2's), except in float64 (below)."""
        approximate = GELU_APPROXIMATE[form]

        def activation(x):
            if x.dtype == tf.float64:
                return gelu_float64(x, approximate)
            return keras.activations.gelu(x, approximate=approximate)

        activation.__name__ = f"gelu_{form}"
        return activation

    def gelu_float64(x, approximate: bool):
        """tf.nn.gelu's own formulas with float64 constants. tf.nn.gelu (TensorFlow 2.21) makes its
        constants 1/sqrt(2) and 0.044715 with math_ops.cast(<Python float>, dtype), which goes
        through a float32 tensor: in float64 the erf form is then off by ~5e-9 and the tanh form by
        ~3e-10 (relative), which float64's check (1e-9) sees."""
        if approximate:
            cubic = tf.constant(0.044715, x.dtype) * tf.math.pow(x, 3)
            inner = tf.constant(0.7978845608028654, x.dtype) * (x + cubic)
            return 0.5 * x * (1.0 + tf.math.tanh(inner))
        return 0.5 * x * tf.math.erfc(-x * tf.constant(0.7071067811865476, x.dtype))

    class SegmentEmbedding(keras.layers.Layer):
        """x + S[s]: BERT's token-type embedding, a keras.layers.Embedding (segments, dim) looked up
        at each position's fixed segment (positions before the input's segment_boundary in 0, the
        rest in 1: the same for every sample), the (T, dim) rows broadcast over the batch."""

        def __init__(self, segments: int, dim: int, segment_ids, **kwargs):
            super().__init__(**kwargs)
            self.segment_ids = numpy.asarray(segment_ids, dtype=numpy.int32)
            self.table = keras.layers.Embedding(segments, dim, name="token_type",
                                                embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02))

        def build(self, input_shape):
            self.table.build(self.segment_ids.shape)

        def call(self, x):
            # the lookup (tf.gather) gives the rows in the embedding's compute dtype
            return x + tf.cast(self.table(tf.constant(self.segment_ids)), x.dtype)

        def compute_output_shape(self, s):
            return s

    class PretrainingHeads(keras.layers.Layer):
        """BERT's heads (HuggingFace's BertPooler + BertPreTrainingHeads) on the encoder's (B, T, D):
        the pooler keras.layers.Dense(D, tanh) on position 0 and the next-sentence Dense(2) on it;
        the masked positions gathered (tf.gather on the sequence axis, a fixed index vector), the
        transform Dense(D, GELU in the network's form), LayerNormalization(eps), and the decoder: the
        token embedding's reverse projection plus a bias (TiedLMHead, tied) or a Dense(vocabulary) of
        its own. Returns (masked-LM logits (B, M, vocabulary), next-sentence logits (B, 2))."""

        def __init__(self, spec: dict, masked_positions, embedding=None, **kwargs):
            super().__init__(**kwargs)
            dim, (masked, vocabulary) = spec["in_shape"][-1], spec["out_shape"]
            self.positions = numpy.asarray(masked_positions, dtype=numpy.int32)
            if self.positions.shape != (masked,):
                raise ValueError(f"pretraining_heads: {self.positions.size} masked positions, the layer gives {masked}")
            self.vocabulary = vocabulary
            self.pooler = keras.layers.Dense(dim, activation="tanh", name="pooler")
            self.next_sentence = keras.layers.Dense(NEXT_SENTENCE_CLASSES, name="next_sentence")
            self.transform = keras.layers.Dense(dim, activation=gelu(spec["gelu"]), name="transform")
            self.transform_ln = keras.layers.LayerNormalization(epsilon=spec["eps"], name="transform_ln")
            self.decoder = (TiedLMHead(embedding, True, name="decoder") if embedding is not None else
                            keras.layers.Dense(vocabulary, name="decoder"))

        def build(self, input_shape):
            batch, _, dim = tuple(input_shape)
            gathered = (batch, int(self.positions.size), dim)
            self.pooler.build((batch, dim))
            self.next_sentence.build((batch, dim))
            self.transform.build(gathered)
            self.transform_ln.build(gathered)
            self.decoder.build(gathered)

        def call(self, h):
            next_sentence = self.next_sentence(self.pooler(h[:, 0]))
            masked = tf.gather(h, tf.constant(self.positions), axis=1)  # (B, M, D)
            return self.decoder(self.transform_ln(self.transform(masked))), next_sentence

        def compute_output_shape(self, s):
            return (s[0], int(self.positions.size), self.vocabulary), (s[0], NEXT_SENTENCE_CLASSES)

    class GroupedAttention(keras.layers.Layer):
        """Grouped-query attention with rotary position embedding, keras_hub's LlamaAttention's design:
        q, k and v as EinsumDense kernels (D, heads, S) and (D, KV, S), out (heads, S, D), no bias;
        q and k rotated (rotate_half) by constant cos and sin tables (runners/common/rotary.py's), the
        key/value heads repeated per query group (keras.ops.repeat, as keras_hub's Llama does) and the
        heads in keras.ops.dot_product_attention. In float64 its scale is given as a float64 (its
        default makes it in float32)."""

        def __init__(self, spec: dict, positions: int, **kwargs):
            super().__init__(**kwargs)
            self.spec = spec
            heads, kv, size, dim = spec["heads"], spec["kv_heads"], spec["head_size"], spec["in_shape"][-1]
            self.cos, self.sin = rotary.layer_tables(spec, positions)
            self.q = keras.layers.EinsumDense("btd,dnh->btnh", (None, heads, size), name="q")
            self.k = keras.layers.EinsumDense("btd,dnh->btnh", (None, kv, size), name="k")
            self.v = keras.layers.EinsumDense("btd,dnh->btnh", (None, kv, size), name="v")
            self.out = keras.layers.EinsumDense("btnh,nhd->btd", (None, dim), name="out")

        def build(self, input_shape):
            s = tuple(input_shape)
            for dense in (self.q, self.k, self.v):
                dense.build(s)
            self.out.build((*s[:-1], self.spec["heads"], self.spec["head_size"]))

        def rotate(self, t, start=0):
            """t (B, T, heads, S) rotated by positions start .. start + T - 1."""
            steps, half = tf.shape(t)[1], self.spec["head_size"] // 2
            cos = tf.constant(self.cos, t.dtype)[start:start + steps][None, :, None, :]
            sin = tf.constant(self.sin, t.dtype)[start:start + steps][None, :, None, :]
            return t * cos + tf.concat([-t[..., half:], t[..., :half]], axis=-1) * sin

        def project(self, x, start=0):
            return self.rotate(self.q(x), start), self.rotate(self.k(x), start), self.v(x)

        def attend(self, q, k, v, causal: bool, mask=None):
            groups = self.spec["heads"] // self.spec["kv_heads"]
            if groups > 1:  # keras_hub's repeat of the key/value heads per query group (its backend's own
                # repeat skips a single key/value head, whose broadcast TensorFlow's einsum refuses)
                k, v = keras.ops.repeat(k, groups, axis=2), keras.ops.repeat(v, groups, axis=2)
            scale = numpy.float64(1 / numpy.sqrt(self.spec["head_size"])) if q.dtype == tf.float64 else None
            a = keras.ops.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=causal)
            return self.out(a)

        def call(self, x):
            return self.attend(*self.project(x), self.spec["causal"])

        def compute_output_shape(self, s):
            return s

    class SwiGLU(keras.layers.Layer):
        """keras_hub's Llama feed-forward: a Dense gate with silu, a Dense up (intermediate), their
        product through a Dense down, no bias."""

        def __init__(self, dim: int, hidden: int, **kwargs):
            super().__init__(**kwargs)
            self.hidden = hidden
            self.gate = keras.layers.Dense(hidden, activation="silu", use_bias=False, name="gate")
            self.up = keras.layers.Dense(hidden, use_bias=False, name="up")
            self.down = keras.layers.Dense(dim, use_bias=False, name="down")

        def build(self, input_shape):
            s = tuple(input_shape)
            self.gate.build(s)
            self.up.build(s)
            self.down.build((*s[:-1], self.hidden))

        def call(self, x):
            return self.down(self.gate(x) * self.up(x))

        def compute_output_shape(self, s):
            return s

    @tf.custom_gradient
    def add_auxiliary_loss(x, aux):
        """x unchanged; backward, a gradient of 1 for `aux` (DeepSeek's AddAuxiliaryLoss): the loss
        is minimised with the step's without being added to the value the step reports."""
        def grad(g):
            return g, tf.ones_like(aux)

        return tf.identity(x), grad

    class MixtureOfExperts(keras.layers.Layer):
        """E SwiGLU experts, their weights stacked ((E, hidden, D), (E, D, hidden): the canonical
        layout) and a linear router (Keras has no MoE layer; keras_hub's Mixtral's design): the
        router's product and softmax in float32 (its variable not autocast), tf.math.top_k (ties to
        the lower index, as TensorFlow documents it), the weights renormalised, then a loop over the
        experts, each computing the tokens routed to it (tf.where, tf.gather) and adding its weighted
        output back (tf.tensor_scatter_nd_add). A capacity factor drops the choices past each
        expert's slots (every token's first choice before any second). In training the
        load-balancing loss enters the gradient through add_auxiliary_loss, times its weight.

        `expert_parallel`: None, or what computes the routed tokens' expert outputs in place of the
        loop over the experts (distributed.py's ExpertShard: this rank's experts, the tokens
        dispatched and combined by all-to-all); the routing and the auxiliary loss stay here."""

        def __init__(self, dim: int, hidden: int, routing: dict, **kwargs):
            super().__init__(**kwargs)
            self.dim, self.hidden, self.routing = dim, hidden, routing
            self.expert_parallel = None

        def build(self, input_shape):
            e, h, d = self.routing["experts"], self.hidden, self.dim
            init = keras.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")
            self.router = self.add_weight(name="router", shape=(e, d), initializer=init, autocast=False)
            self.gate = self.add_weight(name="expert_gate", shape=(e, h, d), initializer=init)
            self.up = self.add_weight(name="expert_up", shape=(e, h, d), initializer=init)
            self.down = self.add_weight(name="expert_down", shape=(e, d, h), initializer=init)

        def route(self, tokens):
            """(router probabilities (N, E), chosen experts (N, k), their weights (N, k)) of the
            tokens (N, D): a dropped choice (past its expert's slots) weighs 0."""
            experts, top_k = self.routing["experts"], self.routing["top_k"]
            wide = tf.float64 if tokens.dtype == tf.float64 else tf.float32
            router = tf.cast(tf.convert_to_tensor(self.router), wide)
            p = tf.nn.softmax(tf.matmul(tf.cast(tokens, wide), router, transpose_b=True), axis=-1)
            picked, chosen = tf.math.top_k(p, top_k)
            weights = picked / tf.reduce_sum(picked, axis=-1, keepdims=True)
            slots = routing_rule.capacity(self.routing["capacity_factor"], tokens.shape[0], top_k, experts)
            if slots is not None:
                onehot = tf.one_hot(tf.reshape(tf.transpose(chosen), [-1]), experts, dtype=tf.int32)
                position = tf.reduce_sum(tf.cumsum(onehot, axis=0) * onehot, axis=-1) - 1
                kept = tf.transpose(tf.reshape(position < slots, [top_k, -1]))
                weights = weights * tf.cast(kept, weights.dtype)
            return p, chosen, weights

        def call(self, x, training=None):
            experts = self.routing["experts"]
            tokens = tf.reshape(x, [-1, self.dim])
            p, chosen, weights = self.route(tokens)
            if self.expert_parallel is not None:
                out = self.expert_parallel(tokens, chosen, weights)
            else:
                out = self.experts_here(tokens, chosen, weights)
            out = tf.reshape(out, tf.shape(x))
            if training and self.routing["aux_loss_weight"]:
                fraction = tf.reduce_mean(tf.reduce_sum(tf.one_hot(chosen, experts, dtype=p.dtype), axis=1), axis=0)
                aux = experts * tf.reduce_sum(fraction * tf.reduce_mean(p, axis=0))
                out = add_auxiliary_loss(out, aux * self.routing["aux_loss_weight"])
            return out

        def experts_here(self, tokens, chosen, weights):
            """Every expert on the tokens that chose it, their weighted outputs added per token."""
            gate = tf.convert_to_tensor(self.gate)
            up = tf.convert_to_tensor(self.up)
            down = tf.convert_to_tensor(self.down)
            out = tf.zeros_like(tokens)
            for e in range(self.routing["experts"]):
                where = tf.where(tf.equal(chosen, e))  # (n_e, 2): token, rank
                token = where[:, 0]
                h = tf.gather(tokens, token)
                y = expert_output(h, gate[e], up[e], down[e])
                y = y * tf.cast(tf.gather_nd(weights, where), y.dtype)[:, None]
                out = tf.tensor_scatter_nd_add(out, token[:, None], y)
            return out

        def compute_output_shape(self, s):
            return s

    class LlamaBlock(keras.layers.Layer):
        """keras_hub's LlamaTransformerDecoder: x + attn(norm1(x)), then + ffn(norm2(x)), Keras 3's
        RMSNormalization; the ffn a SwiGLU or the MixtureOfExperts."""

        def __init__(self, spec: dict, positions: int, **kwargs):
            super().__init__(**kwargs)
            dim = spec["in_shape"][-1]
            self.norm1 = keras.layers.RMSNormalization(epsilon=spec["eps"], name="norm1")
            self.attn = GroupedAttention({**spec, "causal": True}, positions, name="attn")
            self.norm2 = keras.layers.RMSNormalization(epsilon=spec["eps"], name="norm2")
            self.ffn = (SwiGLU(dim, spec["hidden"], name="mlp") if spec["moe"] is None
                        else MixtureOfExperts(dim, spec["hidden"], spec["moe"], name="moe"))

        def build(self, input_shape):
            s = tuple(input_shape)
            for layer in (self.norm1, self.attn, self.norm2, self.ffn):
                layer.build(s)

        def call(self, x, training=None):
            x = x + self.attn(self.norm1(x))
            h = self.norm2(x)
            return x + (self.ffn(h, training=training) if isinstance(self.ffn, MixtureOfExperts) else self.ffn(h))

        def compute_output_shape(self, s):
            return s

    return types.SimpleNamespace(PositionEmbedding=PositionEmbedding, PatchEmbedding=PatchEmbedding,
                                 SelfAttention=SelfAttention, TransformerBlock=TransformerBlock,
                                 ClassTokenPool=ClassTokenPool, TiedLMHead=TiedLMHead,
                                 SegmentEmbedding=SegmentEmbedding, PretrainingHeads=PretrainingHeads, gelu=gelu,
                                 GroupedAttention=GroupedAttention, SwiGLU=SwiGLU, MixtureOfExperts=MixtureOfExperts,
                                 LlamaBlock=LlamaBlock)


GELU_APPROXIMATE = {"erf": False, "tanh": True}  # the schema's form -> keras.activations.gelu's `approximate`
NEXT_SENTENCE_CLASSES = 2  # pretraining_heads' next-sentence classifier (definitions/layers/pretraining_heads.py)
TIED_HEADS = ("lm_head", "pretraining_heads")  # the layer types that may reuse the token embedding's table


# --------------------------------------------------------------------------------------------------
# builders (spec, plan) -> the Keras layers of one resolved layer (layers.py's LayerPlan)


def build_position_embedding(spec, plan):
    return [transformer_classes().PositionEmbedding(spec["max_length"])]


def build_patch_embedding(spec, plan):
    return [transformer_classes().PatchEmbedding(spec["patch"], spec["dim"], spec["class_token"])]


def build_layer_norm(spec, plan):
    return [load_keras().layers.LayerNormalization(epsilon=spec["eps"])]  # Keras' default eps is 1e-3


def build_gelu(spec, plan):
    return [load_keras().layers.Activation(transformer_classes().gelu(spec["form"]))]


def build_attention(spec, plan):
    return [transformer_classes().SelfAttention(spec)]


def build_transformer_block(spec, plan):
    return [transformer_classes().TransformerBlock(spec)]


def build_rms_norm(spec, plan):
    return [load_keras().layers.RMSNormalization(epsilon=spec["eps"])]  # Keras 3.9's; its default eps is 1e-6


def build_grouped_attention(spec, plan):
    return [transformer_classes().GroupedAttention(spec, spec["in_shape"][0])]


def build_swiglu(spec, plan):
    return [transformer_classes().SwiGLU(spec["in_shape"][-1], spec["hidden"])]


def build_moe(spec, plan):
    return [transformer_classes().MixtureOfExperts(spec["in_shape"][-1], spec["hidden"], spec)]


def build_llama_block(spec, plan):
    return [transformer_classes().LlamaBlock(spec, spec["in_shape"][0])]


def build_token_pool(spec, plan):
    if spec["mode"] == "mean":
        return [load_keras().layers.GlobalAveragePooling1D()]  # (B, T, D) -> (B, D), the mean over T
    return [transformer_classes().ClassTokenPool()]


def build_lm_head(spec, plan):
    if not spec["tied"]:
        return [load_keras().layers.Dense(spec["out_shape"][-1], use_bias=spec["bias"])]
    return [transformer_classes().TiedLMHead(_tied_embedding(plan, "lm_head"), spec["bias"])]


def _tied_embedding(plan, what: str):
    """The token embedding (layer 0, a ReversibleEmbedding) whose table a tied head projects onto."""
    (embedding,) = plan.built[0]  # the schema ties the head to the network's first layer, the token embedding
    if not isinstance(embedding, load_keras().layers.ReversibleEmbedding):
        raise TypeError(f"a tied {what} needs the token embedding as layer 0, found {type(embedding).__name__}")
    return embedding


def build_segment_embedding(spec, plan):
    steps, dim = spec["in_shape"]
    boundary = plan.inp["segment_boundary"]  # sentence A (segment 0), then sentence B (segment 1)
    return [transformer_classes().SegmentEmbedding(spec["segments"], dim, [int(t >= boundary) for t in range(steps)])]


def build_pretraining_heads(spec, plan):
    embedding = _tied_embedding(plan, "pretraining_heads") if spec["tied"] else None
    return [transformer_classes().PretrainingHeads(spec, plan.inp["masked_positions"], embedding)]


# --------------------------------------------------------------------------------------------------
# canonical weights (src/dlbench/definitions/weights.py): (prefix, spec, the layer's Keras layers,
# features_chw) -> {canonical name: (keras variable, layout)}, the layouts weights.py converts


def dense_entries(prefix: str, layer, layout) -> dict:
    """weight (in the layout given: "transposed" for a Dense, "conv" for a Conv2D) and bias, where
    the layer has one, of a Dense or Conv2D."""
    out = {f"{prefix}.weight": (layer.kernel, layout)}
    if layer.bias is not None:
        out[f"{prefix}.bias"] = (layer.bias, "same")
    return out


def ln_entries(prefix: str, ln) -> dict:
    return {f"{prefix}.gamma": (ln.gamma, "same"), f"{prefix}.beta": (ln.beta, "same")}


def attention_entries(prefix: str, mha) -> dict:
    """MultiHeadAttention's four EinsumDense kernels <-> the canonical q/k/v/out. Keras keeps q, k
    and v as (D, heads, head_size) with biases (heads, head_size), and out as (heads, head_size, D):
    row-major, the (heads, head_size) axes are the canonical head-major H*S axis, so each is a
    transpose and a reshape of the canonical (H*S, D) and (D, H*S) matrices."""
    heads, size = mha.num_heads, mha.key_dim
    out = {}
    for part, layer in (("q", mha.query_dense), ("k", mha.key_dense), ("v", mha.value_dense)):
        out[f"{prefix}.{part}.weight"] = (layer.kernel, ("heads_in", layer.kernel.shape[0], heads, size))
        if layer.bias is not None:
            out[f"{prefix}.{part}.bias"] = (layer.bias, ("heads_bias", heads, size))
    layer = mha.output_dense
    out[f"{prefix}.out.weight"] = (layer.kernel, ("heads_out", layer.kernel.shape[-1], heads, size))
    if layer.bias is not None:
        out[f"{prefix}.out.bias"] = (layer.bias, "same")
    return out


def position_embedding_weights(prefix, spec, made, features_chw) -> dict:
    return {f"{prefix}.weight": (made[0].table, "same")}


def patch_embedding_weights(prefix, spec, made, features_chw) -> dict:
    layer = made[0]
    out = dense_entries(prefix, layer.proj, "conv")
    if layer.class_token is not None:
        out[f"{prefix}.class_token"] = (layer.class_token, "same")
    return out


def layer_norm_weights(prefix, spec, made, features_chw) -> dict:
    return ln_entries(prefix, made[0])


def attention_weights(prefix, spec, made, features_chw) -> dict:
    return attention_entries(prefix, made[0].mha)


def transformer_block_weights(prefix, spec, made, features_chw) -> dict:
    block = made[0]
    return {**ln_entries(f"{prefix}.ln1", block.ln1), **attention_entries(f"{prefix}.attn", block.attn),
            **ln_entries(f"{prefix}.ln2", block.ln2), **dense_entries(f"{prefix}.mlp.fc1", block.fc1, "transposed"),
            **dense_entries(f"{prefix}.mlp.fc2", block.fc2, "transposed")}


def lm_head_weights(prefix, spec, made, features_chw) -> dict:
    if spec["tied"]:  # the weight is 000.weight, the embedding's own variable: only a bias of its own
        return {} if made[0].bias is None else {f"{prefix}.bias": (made[0].bias, "same")}
    return dense_entries(prefix, made[0], "transposed")


def segment_embedding_weights(prefix, spec, made, features_chw) -> dict:
    return {f"{prefix}.weight": (made[0].table.embeddings, "same")}


def pretraining_heads_weights(prefix, spec, made, features_chw) -> dict:
    heads = made[0]
    out = {**dense_entries(f"{prefix}.pooler", heads.pooler, "transposed"),
           **dense_entries(f"{prefix}.next_sentence", heads.next_sentence, "transposed"),
           **dense_entries(f"{prefix}.transform", heads.transform, "transposed"),
           **ln_entries(f"{prefix}.transform_ln", heads.transform_ln)}
    if spec["tied"]:  # the decoder's weight is 000.weight, the embedding's own variable
        out[f"{prefix}.decoder.bias"] = (heads.decoder.bias, "same")
    else:
        out.update(dense_entries(f"{prefix}.decoder", heads.decoder, "transposed"))
    return out


def rms_norm_weights(prefix, spec, made, features_chw) -> dict:
    return {f"{prefix}.gamma": (made[0].scale, "same")}


def grouped_attention_entries(prefix: str, attn) -> dict:
    """The EinsumDense kernels (D, heads, S) of q and (D, KV, S) of k and v, and (heads, S, D) of
    out, <-> the canonical (H*S, D), (KV*S, D) and (D, H*S) matrices (a transpose and a reshape)."""
    s = attn.spec
    dim = s["in_shape"][-1]
    out = {f"{prefix}.q.weight": (attn.q.kernel, ("heads_in", dim, s["heads"], s["head_size"]))}
    for part, dense in (("k", attn.k), ("v", attn.v)):
        out[f"{prefix}.{part}.weight"] = (dense.kernel, ("heads_in", dim, s["kv_heads"], s["head_size"]))
    out[f"{prefix}.out.weight"] = (attn.out.kernel, ("heads_out", dim, s["heads"], s["head_size"]))
    return out


def grouped_attention_weights(prefix, spec, made, features_chw) -> dict:
    return grouped_attention_entries(prefix, made[0])


def swiglu_entries(prefix: str, mlp) -> dict:
    return {f"{prefix}.{part}.weight": (getattr(mlp, part).kernel, "transposed") for part in ("gate", "up", "down")}


def swiglu_weights(prefix, spec, made, features_chw) -> dict:
    return swiglu_entries(prefix, made[0])


def moe_entries(prefix: str, moe) -> dict:
    # the router and the stacked experts are kept in the canonical (out, in) layouts
    return {f"{prefix}.router.weight": (moe.router, "same"), f"{prefix}.experts.gate": (moe.gate, "same"),
            f"{prefix}.experts.up": (moe.up, "same"), f"{prefix}.experts.down": (moe.down, "same")}


def moe_weights(prefix, spec, made, features_chw) -> dict:
    return moe_entries(prefix, made[0])


def llama_block_weights(prefix, spec, made, features_chw) -> dict:
    block = made[0]
    out = {f"{prefix}.norm1.gamma": (block.norm1.scale, "same")}
    out.update(grouped_attention_entries(f"{prefix}.attn", block.attn))
    out[f"{prefix}.norm2.gamma"] = (block.norm2.scale, "same")
    if spec["moe"] is None:
        out.update(swiglu_entries(f"{prefix}.mlp", block.ffn))
    else:
        out.update(moe_entries(f"{prefix}.moe", block.ffn))
    return out
