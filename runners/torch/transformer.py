"""The torch runner's transformer layers (src/dlbench/definitions/schema.py's semantics): their
builders and canonical weights, each referenced from layers.py's LAYERS table.

The layers are torch.nn modules of transformer_modules(): attention through
F.scaled_dot_product_attention (torch picks its flash, memory-efficient, cuDNN or math kernel;
attention.py reads back which one ran), a tied head on the token embedding's own Parameter, and
BERT's segment_embedding (F.embedding of a fixed segment-id buffer) and pretraining_heads (pooler,
next-sentence classifier, and the masked-LM head on the masked rows gathered by index_select), on
a masked_tokens input whose batch is x (B, T) ids and y (B, M + 1): the masked tokens, then the
next-sentence label. Pretraining heads make the model's output the pair (masked-LM logits,
next-sentence logits): its logits (step.logits_of) are the first, the loss
(masked_lm_and_next_sentence, step.loss) takes both.
"""

from __future__ import annotations

import collections
import functools
import types

from runners.common import rotary
from runners.common import routing as routing_rule
from runners.torch.framework import load_torch

@functools.cache
def transformer_modules():
    """The transformer layers' module classes, defined once torch is loaded (torch is imported on
    first use, so they cannot be module-level classes; cached, so every network shares them)."""
    torch = load_torch()
    nn, F = torch.nn, torch.nn.functional

    class PositionEmbedding(nn.Module):
        """x + P[0:T]: a learned (max_length, dim) table, its first T rows added (GPT-2's wpe and
        ViT's pos_embed, added rather than looked up: position t is row t)."""

        def __init__(self, max_length: int, dim: int):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(max_length, dim))
            nn.init.normal_(self.weight, std=0.02)  # GPT-2's and ViT's initialisation of the table

        def forward(self, x):
            return x + self.weight[: x.shape[1]]

    class PatchEmbedding(nn.Module):
        """A strided convolution (kernel = stride = patch) to (dim, H/p, W/p), its positions as tokens
        in row-major order, the class token prepended (timm's PatchEmbed and cls_token)."""

        def __init__(self, channels: int, patch: int, dim: int, class_token: bool):
            super().__init__()
            self.proj = nn.Conv2d(channels, dim, patch, patch, bias=True)
            self.class_token = nn.Parameter(torch.empty(dim)) if class_token else None
            if class_token:
                nn.init.normal_(self.class_token, std=0.02)

        def forward(self, x):
            tokens = self.proj(x).flatten(2).transpose(1, 2)  # (B, dim, h, w) -> (B, h*w, dim)
            if self.class_token is None:
                return tokens
            # in the convolution's dtype: under autocast the token sequence stays in the AMP dtype
            cls = self.class_token.to(tokens.dtype).expand(tokens.shape[0], 1, -1)
            return torch.cat([cls, tokens], dim=1)

    class SelfAttention(nn.Module):
        """Multi-head self-attention: q, k, v and out as nn.Linear, the heads' products in
        F.scaled_dot_product_attention (torch picks its flash, memory-efficient, cuDNN or math
        kernel); head h is columns h*S .. (h+1)*S - 1 of q, k and v, the canonical head-major order."""

        def __init__(self, dim: int, heads: int, head_size: int, causal: bool, bias: bool, dropout: float):
            super().__init__()
            inner = heads * head_size
            self.heads, self.head_size, self.causal, self.dropout = heads, head_size, causal, dropout
            self.q = nn.Linear(dim, inner, bias=bias)
            self.k = nn.Linear(dim, inner, bias=bias)
            self.v = nn.Linear(dim, inner, bias=bias)
            self.out = nn.Linear(inner, dim, bias=bias)

        def forward(self, x):
            b, t, _ = x.shape

            def split(proj):  # (B, T, H*S) -> (B, H, T, S)
                return proj(x).view(b, t, self.heads, self.head_size).transpose(1, 2)

            # dropout on the probabilities in training only (the functional form does not look at
            # self.training); its default scale is 1/sqrt(S), the canonical one
            a = F.scaled_dot_product_attention(split(self.q), split(self.k), split(self.v),
                                               dropout_p=self.dropout if self.training else 0.0,
                                               is_causal=self.causal)
            return self.out(a.transpose(1, 2).reshape(b, t, self.heads * self.head_size))

    class TransformerBlock(nn.Module):
        """Layer norms, self-attention and a GELU MLP with two residual joins, pre- or post-norm."""

        def __init__(self, spec: dict):
            super().__init__()
            dim = spec["in_shape"][-1]
            hidden = spec["mlp_ratio"] * dim
            self.pre = spec["norm"] == "pre"
            self.ln1 = nn.LayerNorm(dim, eps=spec["eps"])
            self.attn = SelfAttention(dim, spec["heads"], spec["head_size"], spec["causal"], spec["bias"],
                                      spec["dropout"])
            self.ln2 = nn.LayerNorm(dim, eps=spec["eps"])
            self.mlp = nn.Sequential(collections.OrderedDict(
                fc1=nn.Linear(dim, hidden, bias=spec["bias"]), gelu=nn.GELU(approximate=GELU_FORMS[spec["gelu"]]),
                fc2=nn.Linear(hidden, dim, bias=spec["bias"])))
            self.drop1 = nn.Dropout(spec["dropout"])  # on each branch before its join
            self.drop2 = nn.Dropout(spec["dropout"])

        def forward(self, x):
            if self.pre:
                x = x + self.drop1(self.attn(self.ln1(x)))
                return x + self.drop2(self.mlp(self.ln2(x)))
            x = self.ln1(x + self.drop1(self.attn(x)))
            return self.ln2(x + self.drop2(self.mlp(x)))

    class TokenPool(nn.Module):
        def __init__(self, mode: str):
            super().__init__()
            self.mode = mode

        def forward(self, x):
            return x[:, 0] if self.mode == "class" else x.mean(dim=1)

    class TiedLMHead(nn.Module):
        """Logits x E^T (+ b) with E the token embedding's own Parameter (HuggingFace's tie_weights
        idiom): one tensor, so its gradient is the sum of both uses and it is updated once."""

        def __init__(self, embedding, vocabulary: int, bias: bool):
            super().__init__()
            self.weight = embedding.weight
            self.bias = nn.Parameter(torch.zeros(vocabulary)) if bias else None

        def forward(self, x):
            return F.linear(x, self.weight, self.bias)

    class SegmentEmbedding(nn.Module):
        """x + S[s]: each position's row of a learned (segments, dim) table, looked up with
        F.embedding from a fixed (T,) segment-id buffer (0 before `boundary`, 1 from it), broadcast
        over the batch: HuggingFace BERT's token_type_embeddings of its token_type_ids."""

        def __init__(self, segments: int, dim: int, steps: int, boundary: int):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(segments, dim))
            nn.init.normal_(self.weight, std=0.02)  # BERT's initialisation of its embedding tables
            self.register_buffer("ids", (torch.arange(steps) >= boundary).long(), persistent=False)

        def forward(self, x):
            return x + F.embedding(self.ids[: x.shape[1]], self.weight)

    class PretrainingHeads(nn.Module):
        """BERT's pooler, next-sentence and masked-LM heads (HuggingFace's BertPooler and
        BertPreTrainingHeads) on h (B, T, D): returns (masked-LM logits (B, M, V), next-sentence
        logits (B, 2)). The M masked rows are gathered with index_select from a fixed positions
        buffer; the decoder is a TiedLMHead on the token embedding's Parameter when tied."""

        def __init__(self, dim: int, vocabulary: int, positions: list[int], gelu: str, eps: float, embedding=None):
            super().__init__()
            self.pooler = nn.Linear(dim, dim)
            self.next_sentence = nn.Linear(dim, 2)
            self.transform = nn.Linear(dim, dim)
            self.gelu = nn.GELU(approximate=GELU_FORMS[gelu])
            self.transform_ln = nn.LayerNorm(dim, eps=eps)
            self.decoder = (TiedLMHead(embedding, vocabulary, True) if embedding is not None
                            else nn.Linear(dim, vocabulary, bias=True))
            self.register_buffer("positions", torch.tensor(positions, dtype=torch.long), persistent=False)

        def forward(self, h):
            next_sentence = self.next_sentence(torch.tanh(self.pooler(h[:, 0])))
            masked = h.index_select(1, self.positions)  # (B, M, D)
            return self.decoder(self.transform_ln(self.gelu(self.transform(masked)))), next_sentence

    class GroupedAttention(nn.Module):
        """Grouped-query attention with rotary position embedding, HuggingFace's LlamaAttention's
        design: q, k, v and out as nn.Linear without bias, q and k rotated (rotate_half) by the
        position's cos and sin rows (buffers from runners/common/rotary.py's tables), and the heads
        in F.scaled_dot_product_attention with enable_gqa=True (each key/value head serving H / KV
        consecutive query heads, without repeating k and v in memory)."""

        def __init__(self, spec: dict, positions: int):
            super().__init__()
            dim = spec["in_shape"][-1]
            self.heads, self.kv_heads, self.head_size = spec["heads"], spec["kv_heads"], spec["head_size"]
            self.causal = spec["causal"]
            self.q = nn.Linear(dim, self.heads * self.head_size, bias=False)
            self.k = nn.Linear(dim, self.kv_heads * self.head_size, bias=False)
            self.v = nn.Linear(dim, self.kv_heads * self.head_size, bias=False)
            self.out = nn.Linear(self.heads * self.head_size, dim, bias=False)
            cos, sin = rotary.layer_tables(spec, positions)
            # float64, cast to the computation's dtype where used: a float64 check rotates exactly
            self.register_buffer("cos", torch.from_numpy(cos), persistent=False)
            self.register_buffer("sin", torch.from_numpy(sin), persistent=False)

        def rotate(self, t, start: int):
            """t (B, heads, T, S) rotated by positions start .. start + T - 1."""
            steps, half = t.shape[2], self.head_size // 2
            cos = self.cos[start:start + steps].to(t.dtype)
            sin = self.sin[start:start + steps].to(t.dtype)
            rotated = torch.cat([-t[..., half:], t[..., :half]], dim=-1)
            return t * cos + rotated * sin

        def project(self, x, start: int = 0):
            """(q, k, v), each (B, heads, T, S), q and k rotated from position `start`."""
            b, t, _ = x.shape
            q = self.q(x).view(b, t, self.heads, self.head_size).transpose(1, 2)
            k = self.k(x).view(b, t, self.kv_heads, self.head_size).transpose(1, 2)
            v = self.v(x).view(b, t, self.kv_heads, self.head_size).transpose(1, 2)
            return self.rotate(q, start), self.rotate(k, start), v

        def attend(self, q, k, v, causal: bool):
            b, _, t, _ = q.shape
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=self.kv_heads != self.heads)
            return self.out(a.transpose(1, 2).reshape(b, t, self.heads * self.head_size))

        def forward(self, x):
            return self.attend(*self.project(x), self.causal)

    class SwiGLU(nn.Module):
        """down(silu(gate(x)) * up(x)), nn.Linear without bias (LlamaMLP's design)."""

        def __init__(self, dim: int, hidden: int):
            super().__init__()
            self.gate = nn.Linear(dim, hidden, bias=False)
            self.up = nn.Linear(dim, hidden, bias=False)
            self.down = nn.Linear(hidden, dim, bias=False)

        def forward(self, x):
            return self.down(F.silu(self.gate(x)) * self.up(x))

    class AddAuxiliaryLoss(torch.autograd.Function):
        """x unchanged forward; backward, x's gradient and a gradient of 1 for the auxiliary loss
        (DeepSeek's AddAuxiliaryLoss): the loss is minimised with the step's without being added to
        the value the step reports."""

        @staticmethod
        def forward(ctx, x, aux):
            ctx.aux_dtype, ctx.aux_device = aux.dtype, aux.device
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad, torch.ones((), dtype=ctx.aux_dtype, device=ctx.aux_device)

    class MixtureOfExperts(nn.Module):
        """E SwiGLU experts (their weights stacked, (E, hidden, D) and (E, D, hidden)) and a linear
        router, MixtralSparseMoeBlock's design: the router's product and softmax in float32 (autocast
        off), the top-k by a stable descending sort (ties to the lower expert index, which torch.topk
        does not promise), the weights renormalised, then a loop over the experts, each computing
        the tokens routed to it (gathered by index) and adding its weighted output back with
        index_add_. A capacity factor drops the choices past each expert's slots in priority order
        (every token's first choice before any second). In training the load-balancing loss enters
        the backward pass through AddAuxiliaryLoss, times its weight."""

        def __init__(self, dim: int, hidden: int, routing: dict):
            super().__init__()
            experts = routing["experts"]
            self.top_k, self.capacity_factor = routing["top_k"], routing["capacity_factor"]
            self.aux_weight = routing["aux_loss_weight"]
            self.router = nn.Linear(dim, experts, bias=False)
            self.gate = nn.Parameter(torch.empty(experts, hidden, dim))
            self.up = nn.Parameter(torch.empty(experts, hidden, dim))
            self.down = nn.Parameter(torch.empty(experts, dim, hidden))
            for weight in (self.gate, self.up, self.down):  # each expert as nn.Linear initialises its weight
                for e in range(experts):
                    nn.init.kaiming_uniform_(weight[e], a=5 ** 0.5)

        def route(self, x):
            """(probabilities (N, E) float32, experts (N, k), weights (N, k) float32) of tokens x (N, D)."""
            wide = torch.float64 if x.dtype == torch.float64 else torch.float32
            with torch.autocast(x.device.type, enabled=False):
                logits = F.linear(x.to(wide), self.router.weight.to(wide))
            p = torch.softmax(logits, dim=-1)
            chosen = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :self.top_k]
            picked = p.gather(1, chosen)
            weights = picked / picked.sum(dim=-1, keepdim=True)
            if self.capacity_factor is not None:
                weights = weights * self.kept(chosen, p.shape[1])
            return p, chosen, weights

        def kept(self, chosen, experts: int):
            """1 for the choices within their expert's slots, 0 for those dropped (N, k)."""
            tokens = chosen.shape[0]
            slots = routing_rule.capacity(self.capacity_factor, tokens, self.top_k, experts)
            onehot = F.one_hot(chosen.t().reshape(-1), experts)  # (k*N, E): rank-major priority order
            position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # each choice's place in its expert's queue
            return (position < slots).view(self.top_k, tokens).t().to(torch.float32)

        def forward(self, x):
            b, t, d = x.shape
            tokens = x.reshape(-1, d)
            p, chosen, weights = self.route(tokens)
            out = torch.zeros_like(tokens)
            for e in range(self.gate.shape[0]):
                token, rank = torch.where(chosen == e)
                if token.numel() == 0:
                    continue
                h = tokens.index_select(0, token)
                y = F.linear(F.silu(F.linear(h, self.gate[e])) * F.linear(h, self.up[e]), self.down[e])
                out.index_add_(0, token, (y * weights[token, rank, None].to(y.dtype)).to(out.dtype))
            out = out.view(b, t, d)
            if self.training and self.aux_weight and torch.is_grad_enabled():
                experts = p.shape[1]
                fraction = F.one_hot(chosen, experts).sum(1).to(p.dtype).mean(0)  # f_e
                aux = experts * (fraction * p.mean(0)).sum()
                out = AddAuxiliaryLoss.apply(out, aux * self.aux_weight)
            return out

    class LlamaBlock(nn.Module):
        """LlamaDecoderLayer's design: x + attn(norm1(x)), then + mlp(norm2(x)) (or moe), nn.RMSNorm."""

        def __init__(self, spec: dict, positions: int):
            super().__init__()
            dim = spec["in_shape"][-1]
            self.norm1 = nn.RMSNorm(dim, eps=spec["eps"])
            self.attn = GroupedAttention({**spec, "causal": True}, positions)
            self.norm2 = nn.RMSNorm(dim, eps=spec["eps"])
            if spec["moe"] is None:
                self.mlp = SwiGLU(dim, spec["hidden"])
            else:
                self.moe = MixtureOfExperts(dim, spec["hidden"], spec["moe"])

        def ffn(self, x):
            return self.mlp(x) if hasattr(self, "mlp") else self.moe(x)

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.ffn(self.norm2(x))

    return types.SimpleNamespace(PositionEmbedding=PositionEmbedding, PatchEmbedding=PatchEmbedding,
                                 SelfAttention=SelfAttention, TransformerBlock=TransformerBlock, TokenPool=TokenPool,
                                 TiedLMHead=TiedLMHead, SegmentEmbedding=SegmentEmbedding,
                                 PretrainingHeads=PretrainingHeads, GroupedAttention=GroupedAttention, SwiGLU=SwiGLU,
                                 MixtureOfExperts=MixtureOfExperts, AddAuxiliaryLoss=AddAuxiliaryLoss, LlamaBlock=LlamaBlock)


GELU_FORMS = {"erf": "none", "tanh": "tanh"}  # the schema's form -> nn.GELU's `approximate`


# ------------------------------------------------------------------ builders: resolved layer -> module


def build_position_embedding(spec: dict):
    return transformer_modules().PositionEmbedding(spec["max_length"], spec["in_shape"][-1])


def build_patch_embedding(spec: dict):
    return transformer_modules().PatchEmbedding(spec["in_shape"][0], spec["patch"], spec["dim"], spec["class_token"])


def build_layer_norm(spec: dict):
    return load_torch().nn.LayerNorm(spec["in_shape"][-1], eps=spec["eps"])


def build_gelu(spec: dict):
    return load_torch().nn.GELU(approximate=GELU_FORMS[spec["form"]])


def build_attention(spec: dict):
    return transformer_modules().SelfAttention(spec["in_shape"][-1], spec["heads"], spec["head_size"], spec["causal"],
                                               spec["bias"], spec["dropout"])


def build_transformer_block(spec: dict):
    return transformer_modules().TransformerBlock(spec)


def build_rms_norm(spec: dict):
    return load_torch().nn.RMSNorm(spec["in_shape"][-1], eps=spec["eps"])


def build_grouped_attention(spec: dict):
    return transformer_modules().GroupedAttention(spec, spec["in_shape"][0])


def build_swiglu(spec: dict):
    return transformer_modules().SwiGLU(spec["in_shape"][-1], spec["hidden"])


def build_moe(spec: dict):
    return transformer_modules().MixtureOfExperts(spec["in_shape"][-1], spec["hidden"], spec)


def build_llama_block(spec: dict):
    return transformer_modules().LlamaBlock(spec, spec["in_shape"][0])


def build_token_pool(spec: dict):
    return transformer_modules().TokenPool(spec["mode"])


def _token_embedding(built: list, layer: str):
    """The network's first module, the token embedding a tied head shares its Parameter with."""
    embedding = built[0]  # the schema ties a head to the network's first layer, the token embedding
    if not isinstance(embedding, load_torch().nn.Embedding):
        raise TypeError(f"a tied {layer} needs the token embedding as layer 0, found {type(embedding).__name__}")
    return embedding


def build_lm_head(spec: dict, built: list):
    dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
    if not spec["tied"]:
        return load_torch().nn.Linear(dim, vocabulary, bias=spec["bias"])
    return transformer_modules().TiedLMHead(_token_embedding(built, "lm_head"), vocabulary, spec["bias"])


def build_segment_embedding(spec: dict, inp: dict):
    steps, dim = spec["in_shape"]
    return transformer_modules().SegmentEmbedding(spec["segments"], dim, steps, inp["segment_boundary"])


def build_pretraining_heads(spec: dict, built: list, inp: dict):
    dim, vocabulary = spec["in_shape"][-1], spec["out_shape"][-1]
    embedding = _token_embedding(built, "pretraining_heads") if spec["tied"] else None
    return transformer_modules().PretrainingHeads(dim, vocabulary, inp["masked_positions"], spec["gelu"], spec["eps"],
                                                  embedding)


# ------------------------------------------------------------------ canonical weights: layer -> its tensors
# Each function names a layer's canonical tensors (src/dlbench/definitions/weights.py) and hands the
# torch tensor that holds each one: (prefix "NNN", the resolved layer, its module) -> name -> tensor
# (weights.py exports and imports them). torch's own layouts are the canonical ones (nn.Linear's
# (out, in) for q/k/v/out with the heads' rows in order). A tied lm_head's weight, and a tied
# pretraining_heads' decoder weight, is the embedding's Parameter: it is exported once, as the
# embedding's (000.weight).


def _weight_bias(prefix: str, module) -> dict:
    out = {f"{prefix}.weight": module.weight}
    if module.bias is not None:
        out[f"{prefix}.bias"] = module.bias
    return out


def _ln_tensors(prefix: str, ln) -> dict:
    return {f"{prefix}.gamma": ln.weight, f"{prefix}.beta": ln.bias}


def _attention_tensors(prefix: str, attn) -> dict:
    out = {}
    for part in ("q", "k", "v", "out"):
        out.update(_weight_bias(f"{prefix}.{part}", getattr(attn, part)))
    return out


def table_weights(prefix: str, layer: dict, module) -> dict:
    """A position or segment embedding's learned table."""
    return {f"{prefix}.weight": module.weight}


def patch_embedding_weights(prefix: str, layer: dict, module) -> dict:
    out = _weight_bias(prefix, module.proj)
    if module.class_token is not None:
        out[f"{prefix}.class_token"] = module.class_token
    return out


def layer_norm_weights(prefix: str, layer: dict, module) -> dict:
    return _ln_tensors(prefix, module)


def attention_weights(prefix: str, layer: dict, module) -> dict:
    return _attention_tensors(prefix, module)


def transformer_block_weights(prefix: str, layer: dict, module) -> dict:
    out = {}
    out.update(_ln_tensors(f"{prefix}.ln1", module.ln1))
    out.update(_attention_tensors(f"{prefix}.attn", module.attn))
    out.update(_ln_tensors(f"{prefix}.ln2", module.ln2))
    out.update(_weight_bias(f"{prefix}.mlp.fc1", module.mlp.fc1))
    out.update(_weight_bias(f"{prefix}.mlp.fc2", module.mlp.fc2))
    return out


def lm_head_weights(prefix: str, layer: dict, module) -> dict:
    if not layer["tied"]:
        return _weight_bias(prefix, module)
    # tied: the weight is 000.weight; only a bias of its own
    return {f"{prefix}.bias": module.bias} if module.bias is not None else {}


def pretraining_heads_weights(prefix: str, layer: dict, module) -> dict:
    out = {}
    for part in ("pooler", "next_sentence", "transform"):
        out.update(_weight_bias(f"{prefix}.{part}", getattr(module, part)))
    out.update(_ln_tensors(f"{prefix}.transform_ln", module.transform_ln))
    if not layer["tied"]:  # tied: the decoder's weight is 000.weight
        out[f"{prefix}.decoder.weight"] = module.decoder.weight
    out[f"{prefix}.decoder.bias"] = module.decoder.bias
    return out


def rms_norm_weights(prefix: str, layer: dict, module) -> dict:
    return {f"{prefix}.gamma": module.weight}


def _grouped_attention_tensors(prefix: str, attn) -> dict:
    return {f"{prefix}.{part}.weight": getattr(attn, part).weight for part in ("q", "k", "v", "out")}


def grouped_attention_weights(prefix: str, layer: dict, module) -> dict:
    return _grouped_attention_tensors(prefix, module)


def _swiglu_tensors(prefix: str, mlp) -> dict:
    return {f"{prefix}.{part}.weight": getattr(mlp, part).weight for part in ("gate", "up", "down")}


def swiglu_weights(prefix: str, layer: dict, module) -> dict:
    return _swiglu_tensors(prefix, module)


def _moe_tensors(prefix: str, moe) -> dict:
    return {f"{prefix}.router.weight": moe.router.weight, f"{prefix}.experts.gate": moe.gate,
            f"{prefix}.experts.up": moe.up, f"{prefix}.experts.down": moe.down}


def moe_weights(prefix: str, layer: dict, module) -> dict:
    return _moe_tensors(prefix, module)


def llama_block_weights(prefix: str, layer: dict, module) -> dict:
    out = {f"{prefix}.norm1.gamma": module.norm1.weight}
    out.update(_grouped_attention_tensors(f"{prefix}.attn", module.attn))
    out[f"{prefix}.norm2.gamma"] = module.norm2.weight
    if layer["moe"] is None:
        out.update(_swiglu_tensors(f"{prefix}.mlp", module.mlp))
    else:
        out.update(_moe_tensors(f"{prefix}.moe", module.moe))
    return out
