"""Which networks can generate (mode `generate`) and whether a prompt and its new tokens fit them.

Generation is greedy decoding with a key/value cache, built by every runner from the same layers it
builds for train and infer. The runners drive a decoder of one shape (runners/common/contract.py's
DecoderLayout says the same, on the worker's side): a token embedding, a learned position table, an
optional dropout, causal transformer blocks, an optional final layer norm and a language-model
head. A suite that lists `generate` for any other network is refused when it is loaded, naming the
suite file and field, rather than run and skipped: the description, not the framework, is what
cannot generate.
"""

from __future__ import annotations

SHAPE = "embedding, position_embedding, [dropout], transformer_block (causal)..., [layer_norm], lm_head"


def decoder_problem(resolved: dict) -> str | None:
    """Why the resolved network cannot generate, or None."""
    name = resolved.get("name", "the network")
    if resolved["input"]["kind"] != "tokens":
        return f"network {name} takes {resolved['input']['kind']} input, not tokens: only a decoder generates"
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
        return f"network {name} is not a decoder ({SHAPE}); its layers are {', '.join(dict.fromkeys(kinds))}"
    if not all(layer["causal"] for layer in resolved["layers"] if layer["type"] == "transformer_block"):
        return f"network {name} has non-causal transformer blocks: it cannot generate token by token"
    return None


def context_problem(resolved: dict, prompt_length: int, new_tokens: int) -> str | None:
    """Why `prompt_length` + `new_tokens` do not fit the decoder's position table, or None."""
    if new_tokens < 2:
        return f"new_tokens {new_tokens}: at least 2 (the first token is the prefill's, the others time decoding)"
    rows = resolved["layers"][1]["max_length"]
    if prompt_length + new_tokens > rows:
        return (f"a prompt of {prompt_length} and {new_tokens} new tokens need {prompt_length + new_tokens} "
                f"positions; network {resolved.get('name')}'s position table has {rows}")
    return None
