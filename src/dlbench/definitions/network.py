"""Shapes, parameter counts and FLOPs computed from a description alone, and the resolved form
sent to runners.

FLOP convention (forward pass, per sample, batch axis excluded): a multiply-add is 2 FLOPs.
- dense: 2*in*out per position, + out for the bias; conv2d: 2*kh*kw*Cin*Cout*Ho*Wo, + Cout*Ho*Wo
  for the bias.
- max/avg pool: kh*kw per output element; global average pool: one per input element.
- batch norm: 2 per element (the folded scale and shift); relu/sigmoid/tanh: 1 per element;
  residual addition: 1 per element; dropout, flatten, embedding lookups and option-A shortcuts: 0.
- lstm, per step and layer: 2*4h*(in+h) for the gate products, 4h for the bias, 5h for the gate
  and cell activations, 4h for the cell and hidden updates.
- position_embedding: 1 per element (the addition); patch_embedding: its convolution's (the class
  token's concatenation 0).
- layer_norm: 5 per element (one each for the mean, the variance, normalising, the scale, the shift).
- gelu: 8 per element, either form (the tanh form's x^3, two multiply-adds, tanh, 1 + and 0.5 x *).
- attention on (T, D), H heads of size S: the q, k, v (D -> H*S) and out (H*S -> D) projections as
  dense layers; per head 2*T*T*S for the scores q k^T and 2*T*T*S for the weighted sum p v (a causal
  layer counted in full: frameworks compute the whole T x T product and mask it); 5 per score
  element for the scale, the max subtracted, the exponential, the sum and the division (the mask
  is a select: 0).
- transformer_block: its two layer norms, attention and MLP (fc1, fc2 as dense layers, gelu on the
  T x mlp_ratio*D hidden) as above, and 1 per element for each of the two residual additions;
  dropout 0, as the dropout layer.
- token_pool: mean 1 per input element, class 0; lm_head: a dense layer (D -> vocabulary at every
  position, + vocabulary for a bias), tied or not.
- segment_embedding: 1 per element (the addition); pretraining_heads: the pooler's and the
  next-sentence classifier's dense layers on position 0 (+ 1 per element for the tanh), and at the
  M masked positions the transform's dense layer, gelu and layer norm and the decoder's dense layer
  (D -> vocabulary, + vocabulary for its bias); the gathers 0.
- the loss is not counted.
These are the usual analytical counts (as in most papers' "GFLOPs per image"), not what a given
kernel executes. Each layer type counts its own, in its `infer` function in definitions/layers/
(one module per type, found through the layer table there); this module chains them.

The *resolved* network is plain JSON: every layer with its defaults filled in, its input and output
shape, a masked_tokens input's `masked_positions` and `segment_boundary` drawn (schema.MaskedTokenInput), residual and transformer_block `repeat` expanded into one entry per block (with the shortcut
each residual block actually uses; each transformer block with its head size filled in), attention's
head size filled in, and the totals. Runners build from it and need no validation or shape logic of their own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from . import layers
from . import schema as s
from .layers import ShapeError, Site

__all__ = ["LayerSummary", "NetworkSummary", "ShapeError", "analyse", "check_size", "definition_hash"]


@dataclass
class LayerSummary:
    index: int
    type: str
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    params: int
    flops: int
    resolved: list[dict] = field(default_factory=list)
    head_params: int = 0


@dataclass
class NetworkSummary:
    name: str
    params: int
    flops_per_sample: int
    output_shape: tuple[int, ...]
    layers: list[LayerSummary]
    resolved: dict

    @property
    def head_params(self) -> int:
        """Of `params`, a pre-training task's heads (BERT's), which a published model size leaves out."""
        return sum(x.head_params for x in self.layers)

    @property
    def definition_hash(self) -> str:
        return definition_hash(self.resolved)


def definition_hash(resolved: dict) -> str:
    canonical = json.dumps(resolved, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _expanded(layer) -> int:
    """How many entries (or, for an lstm, stacked layers) one layer becomes when it is resolved."""
    return getattr(layer, "repeat", None) or getattr(layer, "layers", None) or 1


def check_size(network: s.Strict) -> None:
    """The estimate of the resolved network's size made before anything is expanded: the entries
    its layers become (residual and transformer_block repeats, lstm layers) within MAX_LAYERS; the
    parameters, activations and FLOPs are checked layer by layer as `analyse` goes. ShapeError
    naming the layer where the network outgrows what a machine (and a record) can hold."""
    entries = 0
    for i, layer in enumerate(network.layers):
        entries += _expanded(layer)
        if entries > s.MAX_LAYERS:
            raise ShapeError(i, f"the network resolves to more than {s.MAX_LAYERS} layers by here "
                                f"(repeats and lstm layers expanded); dlbench runs nothing that large")


def _check_totals(i: int, shape: tuple[int, ...], params: int, flops: int) -> None:
    elements = 1
    for d in shape:
        elements *= d
    for what, value, most in (("elements in one sample's output of this layer", elements, s.MAX_ACTIVATIONS),
                              ("parameters up to this layer", params, s.MAX_PARAMS),
                              ("forward FLOPs per sample up to this layer", flops, s.MAX_FLOPS)):
        if value > most:
            raise ShapeError(i, f"{value:.3g} {what}: more than the {most:.3g} dlbench allows "
                                "(no machine holds or runs a network that large)")


def analyse(network: s.Strict) -> NetworkSummary:
    """Infer every shape and count parameters and forward FLOPs, each layer by the `infer` of its
    type in the layer table (definitions/layers/); raise ShapeError on a mismatch, or on a network
    larger than the bounds of schema.py (`check_size`, then the totals after every layer)."""
    check_size(network)
    inp = network.input
    params_so_far = flops_so_far = 0
    tokens = isinstance(inp, (s.TokenInput, s.MaskedTokenInput))
    shape: tuple[int, ...] = (inp.sequence_length,) if tokens else tuple(inp.shape)
    summaries: list[LayerSummary] = []
    for i, layer in enumerate(network.layers):
        in_shape = shape
        t = layer.type
        if tokens and t != "embedding" and len(shape) == 1 and i == 0:
            raise ShapeError(i, "a token input must go through an embedding first")
        try:
            entry = layers.lookup(t)
        except ValueError as e:  # pragma: no cover - the schema admits only the table's types
            raise ShapeError(i, str(e)) from None
        found = entry.infer(layer, Site(i, in_shape, inp, network.layers[0]))
        shape = tuple(found.shape)
        resolved = found.resolved
        if resolved is None:
            resolved = [layers.resolved_entry(layer, in_shape, shape)]
        params_so_far += found.params
        flops_so_far += found.flops
        _check_totals(i, shape, params_so_far, flops_so_far)
        summaries.append(LayerSummary(i, t, in_shape, shape, found.params, found.flops, resolved, found.head_params))

    resolved_input = network.input.model_dump(mode="json")
    if isinstance(inp, s.MaskedTokenInput):
        positions = inp.masked_positions()
        resolved_input.update(masked_positions=positions, segment_boundary=inp.segment_boundary())
        expected = (len(positions), inp.vocabulary)
        if shape != expected:
            raise ShapeError(len(network.layers) - 1, "a masked_tokens network must end in its pretraining_heads' "
                                                      f"(masked positions, vocabulary) = {list(expected)}, got {list(shape)}")
    elif tokens:
        expected = (inp.sequence_length, inp.vocabulary)
        if shape != expected:
            raise ShapeError(len(network.layers) - 1,
                             f"a language model must end in (steps, vocabulary) = {list(expected)}, got {list(shape)}")
    elif shape != (inp.classes,):
        raise ShapeError(len(network.layers) - 1, f"the network must end in ({inp.classes},) logits, got {list(shape)}")

    total_params = sum(x.params for x in summaries)
    total_flops = sum(x.flops for x in summaries)
    resolved = {
        "name": network.name,
        "input": resolved_input,
        "loss": network.loss,
        "layers": [entry for x in summaries for entry in x.resolved],
        "params": total_params,
        "flops_per_sample": total_flops,
    }
    return NetworkSummary(network.name, total_params, total_flops, shape, summaries, resolved)
