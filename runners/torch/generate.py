"""Mode `generate` for the torch runner: greedy decoding of a decoder network with a static key/value
cache, the way transformers' StaticCache does it.

The network is the one step.build_network builds for train and infer (the same modules,
the same Parameters, the same canonical weights in and out); this module only calls its modules in
the order a cached decoder needs. Each transformer block gets two preallocated cache tensors
(batch, heads, prompt + new tokens, head size). Prefill runs the prompt through every block with
F.scaled_dot_product_attention's causal kernel and writes its keys and values into cache rows
0..P-1 (index_copy_); each decode step embeds one token at position t, writes its key and value
into row t and attends over the whole cache with a boolean mask of the rows <= t, so every decode
step has the same shapes. With `compile: compiled` the decode step is torch.compile'd once (the
position is a device tensor updated in place, so no step recompiles); prefill stays eager, as it
runs once per request.
"""

from __future__ import annotations

from runners.common.contract import DecoderLayout, Generator
from runners.common.protocol import Skip
from runners.torch.framework import host_array, load_torch, synchronizer
from runners.torch.step import build_network
from runners.torch.weights import load_weights


class CachedDecoder:
    """The built nn.Sequential driven as a cached decoder for one batch, prompt and token count."""

    def __init__(self, model, layout: DecoderLayout, batch: int, prompt, new_tokens: int, device, dtype):
        torch = load_torch()
        self.torch = torch
        modules = list(model)
        self.embedding = modules[layout.embedding]
        self.position = modules[layout.position] if layout.position is not None else None  # None: rotary
        self.llama = layout.llama
        self.blocks = [modules[i] for i in layout.blocks]
        self.final_norm = modules[layout.norm] if layout.norm is not None else None
        self.head = modules[layout.head]
        self.prompt = prompt  # (B, P) int64 on the device
        self.batch, self.prompt_length, self.new_tokens = batch, prompt.shape[1], new_tokens
        self.length = self.prompt_length + new_tokens  # cache rows: every position a request reaches
        if self.llama:  # the rotary tables for every position a request reaches (float64, cast where used)
            from runners.common import rotary

            for block, spec in zip(self.blocks, layout.block_specs):
                cos, sin = rotary.layer_tables(spec, self.length)
                block.attn.cos, block.attn.sin = torch.from_numpy(cos).to(device), torch.from_numpy(sin).to(device)
        # grouped heads: a cache per key/value head (transformers' StaticCache of a Llama), not per query head
        self.caches = [(torch.zeros(batch, self._kv_heads(b), self.length, b.attn.head_size, device=device, dtype=dtype),
                        torch.zeros(batch, self._kv_heads(b), self.length, b.attn.head_size, device=device, dtype=dtype))
                       for b in self.blocks]
        self.rows = torch.arange(self.length, device=device)
        self.prompt_rows = torch.arange(self.prompt_length, device=device)
        self.position_now = torch.zeros((), dtype=torch.int64, device=device)  # the decode step's position
        self.token = torch.zeros(batch, dtype=torch.int64, device=device)
        self.generated: list = []
        self.first = None

    def _kv_heads(self, block) -> int:
        return block.attn.kv_heads if self.llama else block.attn.heads

    def _grouped_attention(self, block, h, cache, rows, mask):
        """A llama block's grouped attention of h (B, T, D) at positions `rows`: q and k rotated by
        those rows' angles, k and v written into the key/value heads' cache, attention with
        enable_gqa over the prompt (causal) or over the cache (masked)."""
        F = self.torch.nn.functional
        attn = block.attn
        b, t, _ = h.shape
        q = attn.q(h).view(b, t, attn.heads, attn.head_size).transpose(1, 2)
        k = attn.k(h).view(b, t, attn.kv_heads, attn.head_size).transpose(1, 2)
        v = attn.v(h).view(b, t, attn.kv_heads, attn.head_size).transpose(1, 2)
        cos, sin = attn.cos.index_select(0, rows).to(q.dtype), attn.sin.index_select(0, rows).to(q.dtype)
        half = attn.head_size // 2

        def rotate(x):
            return x * cos + self.torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

        q, k = rotate(q), rotate(k)
        keys, values = cache
        keys.index_copy_(2, rows, k)
        values.index_copy_(2, rows, v)
        grouped = attn.kv_heads != attn.heads
        if mask is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
        else:
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=grouped)
        return attn.out(a.transpose(1, 2).reshape(b, t, attn.heads * attn.head_size))

    def _attention(self, block, h, cache, rows, mask):
        """Block `block`'s attention of h (B, T, D) with its keys and values written into the cache at
        `rows`: over the prompt alone with the causal kernel (mask None), else over the cache."""
        F = self.torch.nn.functional
        attn = block.attn
        b, t, _ = h.shape

        def split(proj):  # (B, T, H*S) -> (B, H, T, S), head-major as the canonical layout
            return proj(h).view(b, t, attn.heads, attn.head_size).transpose(1, 2)

        q, k, v = split(attn.q), split(attn.k), split(attn.v)
        keys, values = cache
        keys.index_copy_(2, rows, k)
        values.index_copy_(2, rows, v)
        if mask is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return attn.out(a.transpose(1, 2).reshape(b, t, attn.heads * attn.head_size))

    def _blocks(self, x, rows, mask):
        for block, cache in zip(self.blocks, self.caches):
            if self.llama:
                x = x + self._grouped_attention(block, block.norm1(x), cache, rows, mask)
                x = x + block.ffn(block.norm2(x))
            elif block.pre:
                x = x + self._attention(block, block.ln1(x), cache, rows, mask)
                x = x + block.mlp(block.ln2(x))
            else:
                x = block.ln1(x + self._attention(block, x, cache, rows, mask))
                x = block.ln2(x + block.mlp(x))
        return x

    def _logits(self, h):  # (B, D) of the last position -> (B, V)
        return self.head(self.final_norm(h) if self.final_norm is not None else h)

    def prefill_logits(self):
        x = self.embedding(self.prompt)
        if self.position is not None:
            x = self.position(x)  # x + P[0:T]: the network's own position layer
        h = self._blocks(x, self.prompt_rows, None)
        return self._logits(h[:, -1])

    def decode_step(self, token, position):
        """One token (B,) at `position` (a 0-d device tensor) -> the next token (B,)."""
        x = self.embedding(token.unsqueeze(1))
        if self.position is not None:
            x = x + self.position.weight.index_select(0, position.view(1))
        mask = (self.rows <= position).view(1, 1, 1, self.length)
        h = self._blocks(x, position.view(1), mask)
        return self._logits(h[:, -1]).argmax(dim=-1)


def prepare_generation(request: dict, device, compiled: bool, compile_settings: dict, settings: dict):
    """(Generator parts) for runner.py: the built network, its cache and the two callables."""
    torch = load_torch()
    network = request["network"]
    layout = DecoderLayout(network)
    layout.block_specs = [network["layers"][i] for i in layout.blocks]
    batch = request["batch_size"]
    prompt_length, new_tokens = layout.request_lengths(request)
    precision = request.get("precision") or "fp32"
    if precision not in ("fp32", "tf32", "float64"):
        raise Skip(f"generate: the torch runner generates in fp32, tf32 and the check's float64, not {precision}")
    torch.manual_seed(request.get("seed", 0))
    model = build_network(network, deterministic=True).to(device)
    dtype = torch.float64 if precision == "float64" else torch.float32
    model = model.to(dtype).eval()
    if request.get("inputs"):
        import numpy as np

        with np.load(request["inputs"]) as data:
            prompt = torch.from_numpy(np.ascontiguousarray(data["x"][:, :prompt_length])).to(device)
        batch = prompt.shape[0]
    else:
        prompt = torch.randint(0, network["input"]["vocabulary"], (batch, prompt_length), device=device)
    with torch.no_grad():
        decoder = CachedDecoder(model, layout, batch, prompt, new_tokens, device, dtype)
    step = torch.compile(decoder.decode_step, mode=compile_settings["compile_mode"]) if compiled else decoder.decode_step
    last = {}

    def prefill():
        with torch.no_grad():
            logits = decoder.prefill_logits()
            decoder.first = logits
            decoder.token = logits.argmax(dim=-1)
            decoder.position_now.fill_(prompt_length)
            decoder.generated = [decoder.token]
            last["position"] = prompt_length

    def decode():
        with torch.no_grad():
            decoder.token = step(decoder.token, decoder.position_now)
            decoder.generated.append(decoder.token)
            last["position"] += 1
            decoder.position_now.fill_(last["position"])

    settings.update(
        precision=precision, compile=compile_settings,
        generation={"prompt_length": prompt_length, "new_tokens": new_tokens, "batch_size": batch,
                    "decoding": "greedy (argmax)",
                    "cache": ("static: per block two preallocated (batch, key/value heads, prompt + new tokens, "
                              "head size) tensors written with index_copy_ after rotating k by its position, "
                              "decode attends over all rows with a mask of those written and enable_gqa "
                              "(transformers' StaticCache layout of a Llama)" if layout.llama else
                              "static: per block two preallocated (batch, heads, prompt + new tokens, head size) "
                              "tensors written with index_copy_, decode attends over all rows with a mask of "
                              "those written (transformers' StaticCache layout)"),
                    "prefill": "eager: the prompt through F.scaled_dot_product_attention(is_causal=True)",
                    "decode": ("torch.compile'd decode step (position a device tensor updated in place: no "
                               "recompilation per token)" if compiled else
                               "eager decode step, F.scaled_dot_product_attention with a boolean mask")})
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Generator(prefill, decode, synchronizer(device), params, settings,
                     load_weights=lambda arrays: load_weights(model, network, arrays),
                     tokens=lambda: torch.stack(decoder.generated, dim=1).cpu().numpy(),
                     first_logits=lambda: host_array(decoder.first))
