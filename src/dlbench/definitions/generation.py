"""Which networks can generate (mode `generate`) and whether a prompt and its new tokens fit them.

Generation is greedy decoding with a key/value cache, built by every runner from the same layers it
builds for train and infer. The runners drive a decoder of one shape (runners/common/contract.py's
DecoderLayout says the same, on the worker's side): a token embedding, a learned position table, an
optional dropout, causal transformer blocks, an optional final layer norm and a language-model
head; or a Llama-style one (a token embedding, llama blocks with rotary positions, a final RMSNorm
and a head), which the runners whose generate.py builds it generate and the others skip, saying so. A suite that lists `generate` for any other network is refused when it is loaded, naming the
suite file and field, rather than run and skipped: the description, not the framework, is what
cannot generate.
"""

from __future__ import annotations

SHAPE = "embedding, position_embedding, [dropout], transformer_block (causal)..., [layer_norm], lm_head"
# A Llama-style decoder (issue 45): rotary positions inside its blocks, no position table
LLAMA_SHAPE = "embedding, llama_block..., rms_norm, lm_head"


def is_llama_decoder(resolved: dict) -> bool:
    kinds = [layer["type"] for layer in resolved["layers"]]
    return (len(kinds) >= 4 and kinds[0] == "embedding" and kinds[-2:] == ["rms_norm", "lm_head"]
            and all(k == "llama_block" for k in kinds[1:-2]))


def decoder_problem(resolved: dict) -> str | None:
    """Why the resolved network cannot generate, or None."""
    name = resolved.get("name", "the network")
    if resolved["input"]["kind"] != "tokens":
        return f"network {name} takes {resolved['input']['kind']} input, not tokens: only a decoder generates"
    if is_llama_decoder(resolved):
        return None  # llama blocks are causal by definition
    kinds = [layer["type"] for layer in resolved["layers"]]
    i = 2 if kinds[:2] == ["embedding", "position_embedding"] else None
    if i is not None and i < len(kinds) and kinds[i] == "dropout":
        i += 1
    blocks = 0
    while i is not None and i < len(kinds) and kinds[i] == "transformer_block":
        blocks, i = blocks + 1, i + 1
    if i is not None and i < len(kinds) and kinds[i] == "layer_norm":
        i += 1
    if i is None or not blocks or i != len(kinds) - 1 or kinds[i] != "lm_head":
        return (f"network {name} is not a decoder ({SHAPE}; or {LLAMA_SHAPE}); its layers are "
                f"{', '.join(dict.fromkeys(kinds))}")
    if not all(layer["causal"] for layer in resolved["layers"] if layer["type"] == "transformer_block"):
        return f"network {name} has non-causal transformer blocks: it cannot generate token by token"
    return None


def context_problem(resolved: dict, prompt_length: int, new_tokens: int) -> str | None:
    """Why `prompt_length` + `new_tokens` do not fit the decoder's position table, or None."""
    if new_tokens < 2:
        return f"new_tokens {new_tokens}: at least 2 (the first token is the prefill's, the others time decoding)"
    if is_llama_decoder(resolved):
        return None  # rotary positions: no table to overrun (the runners compute the angles for the length)
    rows = resolved["layers"][1]["max_length"]
    if prompt_length + new_tokens > rows:
        return (f"a prompt of {prompt_length} and {new_tokens} new tokens need {prompt_length + new_tokens} "
                f"positions; network {resolved.get('name')}'s position table has {rows}")
    return None
